//! A branch with what it did: `GET /tenants/{tenant}/branches/{branch_id}`
//! answers the branch (as a node of its session's tree, with its direct
//! children), its upstream calls newest first, and for a gateway-run
//! branch its run and the run's steps newest first, each a page at a time.
//!
//! A step's body is shown as an operator debugging a run needs it: a
//! model step's text and the tool calls it asked for, a tool step's tool
//! and what the model got back. Every text is scrubbed again as it is read
//! (a model's own text is stored as the provider gave it) and cut at
//! [`TEXT_LIMIT`] bytes, saying so.
#![expect(
    unused_qualifications,
    reason = "utoipa's path macro spells out the query types it is given in full"
)]

use std::sync::Arc;

use axum::{Json, extract::State};
use chrono::{DateTime, Utc};
use foldgate_engine::Scrubber;
use foldgate_store::{BranchTrace, MAX_PAGE, Run, RunStep, StepKind, TracePage, TracedCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::{
    AdminState,
    access::Operator,
    error::{AdminError, ErrorBody},
    extract::{Params, QueryOf},
    routes::{BranchPath, branch_id},
    views::BranchNode,
};

/// How many calls, and how many steps, a page has when the request does
/// not say.
const DEFAULT_PAGE: u32 = 100;

/// The longest text of a step shown (a model's text, a tool's result), in
/// bytes; longer text is cut at a character boundary below it.
pub const TEXT_LIMIT: usize = 4096;

/// The longest arguments of a tool call shown, as compact JSON, in bytes.
pub const ARGUMENTS_LIMIT: usize = 1024;

/// What is shown instead of a text that could not be scrubbed.
const WITHHELD: &str = "[foldgate: withheld: this text could not be scrubbed of secrets]";

/// Which calls and steps to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TraceQuery {
    /// Calls per page, 0 to 500 (default 100; 0 reads none).
    calls_limit: Option<u32>,
    /// The `calls_next` of the previous page.
    calls_before: Option<String>,
    /// Steps per page, 0 to 500 (default 100; 0 reads none).
    steps_limit: Option<u32>,
    /// The `steps_next` of the previous page.
    steps_before: Option<u32>,
}

fn limit(value: Option<u32>, name: &str) -> Result<u32, AdminError> {
    match value.unwrap_or(DEFAULT_PAGE) {
        n @ 0..=MAX_PAGE => Ok(n),
        _ => Err(AdminError::BadRequest(format!("`{name}` must be between 0 and {MAX_PAGE}"))),
    }
}

/// The cursor of a page of calls: the last one's time (µs since the epoch)
/// and id.
fn call_cursor(call: &TracedCall) -> String {
    format!("{}:{}", call.called_at.timestamp_micros(), call.id)
}

fn parse_call_cursor(raw: &str) -> Result<(DateTime<Utc>, Uuid), AdminError> {
    let bad = || AdminError::BadRequest("`calls_before` is not a cursor this API gave".to_owned());
    let (micros, id) = raw.split_once(':').ok_or_else(bad)?;
    let at = micros.parse().ok().and_then(DateTime::from_timestamp_micros).ok_or_else(bad)?;
    Ok((at, Uuid::parse_str(id).map_err(|_| bad())?))
}

/// One upstream call of the branch.
#[derive(Debug, Serialize, ToSchema)]
pub struct CallView {
    /// UUIDv7.
    pub id: Uuid,
    pub upstream: String,
    pub tool: String,
    /// Tokens of the arguments.
    pub tokens_in: u64,
    /// Tokens of the result as the caller received it.
    pub tokens_out: u64,
    /// What the branch was charged: less than in and out only when it ran
    /// out, or had already ended when the call finished.
    pub tokens_charged: u64,
    pub duration_ms: u64,
    /// `ok`, `tool_error`, `upstream_error`, `truncated` (cut at the
    /// branch's budget) or `refused` (not forwarded).
    pub outcome: String,
    pub called_at: DateTime<Utc>,
}

impl From<&TracedCall> for CallView {
    fn from(c: &TracedCall) -> Self {
        Self {
            id: c.id,
            upstream: c.upstream.clone(),
            tool: c.tool.clone(),
            tokens_in: c.tokens_in,
            tokens_out: c.tokens_out,
            tokens_charged: c.tokens_charged,
            duration_ms: millis(c.duration),
            outcome: c.outcome.as_str().to_owned(),
            called_at: c.called_at,
        }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A gateway-run branch's run.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    /// The `[[models]]` entry it runs on.
    pub model: String,
    /// `running` or `done`.
    pub state: String,
    /// The `<upstream>__<tool>` names the model may call.
    pub tools: Vec<String>,
    /// Steps written: model calls and tool calls.
    pub steps: u32,
    /// What the provider billed, summed over the run's model calls.
    pub model_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// How often another replica (or a restarted one) took the run over.
    pub resumes: u32,
    /// The replica working on it, and until when it holds the run; another
    /// replica takes over a running run whose lease lapsed.
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<&Run> for RunView {
    fn from(r: &Run) -> Self {
        Self {
            model: r.model.clone(),
            state: r.state.as_str().to_owned(),
            tools: r.tools.clone(),
            steps: r.steps,
            model_calls: r.usage.calls,
            input_tokens: r.usage.input_tokens,
            output_tokens: r.usage.output_tokens,
            resumes: r.resumes,
            lease_owner: r.lease_owner.clone(),
            lease_until: r.lease_until,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// A tool call a model step asked for.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolCallView {
    /// The id the tool step that answers it names.
    pub id: String,
    /// `<upstream>__<tool>`.
    pub name: String,
    /// The arguments as compact JSON, scrubbed, cut at 1 KiB.
    pub arguments: String,
}

/// One step of a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepView {
    /// Its number in the run, from 0.
    pub seq: u32,
    /// `model` (a call of the model) or `tool` (a call of a tool the model
    /// asked for).
    pub kind: String,
    /// A model step: what the provider billed for the call.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub duration_ms: u64,
    /// Made again after another replica took the run over: it was in
    /// flight when the replica working on it stopped.
    pub repeated: bool,
    /// When it completed.
    pub at: DateTime<Utc>,
    /// A model step: the text it answered with (its finding, when it asked
    /// for no tool). A step whose body is not what the runner writes: the
    /// body as it is.
    pub text: Option<String>,
    /// A model step: the tool calls it asked for, in order.
    pub tool_calls: Vec<ToolCallView>,
    /// A tool step: the call it answers, the tool, what the model got back
    /// and whether that was an error.
    pub call_id: Option<String>,
    pub tool: Option<String>,
    pub result: Option<String>,
    pub error: Option<bool>,
    /// Some of its text was cut (`text` or `result` at 4 KiB, arguments at
    /// 1 KiB).
    pub truncated: bool,
}

/// A model step as the runner writes it.
#[derive(Debug, Deserialize)]
struct ModelBody {
    #[serde(default)]
    text: String,
    #[serde(default)]
    calls: Vec<CallBody>,
}

#[derive(Debug, Deserialize)]
struct CallBody {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// A tool step as the runner writes it.
#[derive(Debug, Deserialize)]
struct ToolBody {
    #[serde(default)]
    call_id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    error: bool,
}

/// `text` scrubbed, then cut at `limit` bytes: the text, and whether it was
/// cut. A text that cannot be scrubbed is withheld.
fn shown(scrubber: &dyn Scrubber, text: &str, limit: usize) -> (String, bool) {
    let scrubbed = match scrubber.scrub(text) {
        Ok(scrubbed) => scrubbed.text,
        Err(e) => {
            tracing::warn!(error = %e, "scrubbing a step's text failed; it was withheld");
            return (WITHHELD.to_owned(), false);
        }
    };
    cut(scrubbed, limit)
}

/// `text` cut at a character boundary at most `limit` bytes in, with `…`.
fn cut(mut text: String, limit: usize) -> (String, bool) {
    if text.len() <= limit {
        return (text, false);
    }
    text.truncate(text.floor_char_boundary(limit));
    text.push('…');
    (text, true)
}

impl StepView {
    fn of(step: &RunStep, scrubber: &dyn Scrubber) -> Self {
        let mut view = Self {
            seq: step.seq,
            kind: step.kind.as_str().to_owned(),
            input_tokens: step.input_tokens,
            output_tokens: step.output_tokens,
            duration_ms: millis(step.duration),
            repeated: step.repeated,
            at: step.at,
            text: None,
            tool_calls: Vec::new(),
            call_id: None,
            tool: None,
            result: None,
            error: None,
            truncated: false,
        };
        match step.kind {
            StepKind::Model => match serde_json::from_str::<ModelBody>(&step.body) {
                Ok(body) => {
                    let (text, cut_text) = shown(scrubber, &body.text, TEXT_LIMIT);
                    view.text = Some(text);
                    view.truncated = cut_text;
                    for call in body.calls {
                        let arguments = match &call.arguments {
                            Value::Null => String::new(),
                            value => value.to_string(),
                        };
                        let (arguments, cut_arguments) =
                            shown(scrubber, &arguments, ARGUMENTS_LIMIT);
                        view.truncated |= cut_arguments;
                        view.tool_calls.push(ToolCallView {
                            id: call.id,
                            name: call.name,
                            arguments,
                        });
                    }
                }
                Err(_) => view.raw(step, scrubber),
            },
            StepKind::Tool => match serde_json::from_str::<ToolBody>(&step.body) {
                Ok(body) => {
                    let (result, cut_result) = shown(scrubber, &body.content, TEXT_LIMIT);
                    view.call_id = Some(body.call_id);
                    view.tool = Some(body.name);
                    view.result = Some(result);
                    view.error = Some(body.error);
                    view.truncated = cut_result;
                }
                Err(_) => view.raw(step, scrubber),
            },
        }
        view
    }

    /// A body that is not what the runner writes: shown as it is.
    fn raw(&mut self, step: &RunStep, scrubber: &dyn Scrubber) {
        let (text, cut_text) = shown(scrubber, &step.body, TEXT_LIMIT);
        self.text = Some(text);
        self.truncated = cut_text;
    }
}

/// A branch with its children, its calls, and its run with its steps.
#[derive(Debug, Serialize, ToSchema)]
pub struct BranchDetail {
    pub session_id: String,
    /// Its parent; absent for a branch of the session itself (depth 1).
    pub parent_id: Option<String>,
    /// The branch as a node of its session's tree. Its `children` are its
    /// direct children, oldest first, each without its own (the session's
    /// tree nests them all).
    pub branch: BranchNode,
    /// Its upstream calls, newest first: at most `calls_limit`.
    pub calls: Vec<CallView>,
    /// Pass as `calls_before` for older calls; absent on the last page.
    pub calls_next: Option<String>,
    /// A gateway-run branch's run; absent for an agent-run branch.
    pub run: Option<RunView>,
    /// The run's steps, newest first: at most `steps_limit`.
    pub steps: Vec<StepView>,
    /// Pass as `steps_before` for older steps; absent on the last page.
    pub steps_next: Option<u32>,
}

/// A branch with what it did: its children, its upstream calls, and for a
/// gateway-run branch its run and steps, newest first. Never its prompt.
#[utoipa::path(
    get, path = "/tenants/{tenant}/branches/{branch_id}", tag = "branches",
    params(("tenant" = String, Path), ("branch_id" = String, Path), TraceQuery),
    responses(
        (status = 200, body = BranchDetail),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
    ),
)]
pub async fn branch(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<BranchPath>,
    QueryOf(query): QueryOf<TraceQuery>,
) -> Result<Json<BranchDetail>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    let id = branch_id(&path.branch_id)?;
    let page = TracePage {
        calls: limit(query.calls_limit, "calls_limit")?,
        calls_before: query.calls_before.as_deref().map(parse_call_cursor).transpose()?,
        steps: limit(query.steps_limit, "steps_limit")?,
        steps_before: query.steps_before,
    };
    let trace = state
        .service
        .store()
        .branch_trace(&tenant, id, &page)
        .await?
        .ok_or(AdminError::NotFound("branch"))?;
    // Scrubbing takes milliseconds on long texts: off the async workers.
    let scrubber = Arc::clone(state.service.scrubber());
    let detail = tokio::task::spawn_blocking(move || detail(&trace, &page, scrubber.as_ref()))
        .await
        .map_err(|e| AdminError::Internal(format!("shaping a branch's steps: {e}")))?;
    Ok(Json(detail))
}

fn detail(trace: &BranchTrace, page: &TracePage, scrubber: &dyn Scrubber) -> BranchDetail {
    let full = |len: usize, limit: u32| limit > 0 && len == limit as usize;
    let branch = &trace.branch.branch;
    BranchDetail {
        session_id: branch.session_id.to_string(),
        parent_id: branch.parent.map(|p| p.to_string()),
        branch: BranchNode {
            children: trace.children.iter().map(BranchNode::from_tree).collect(),
            ..BranchNode::from_tree(&trace.branch)
        },
        calls: trace.calls.iter().map(CallView::from).collect(),
        calls_next: full(trace.calls.len(), page.calls)
            .then(|| trace.calls.last().map(call_cursor))
            .flatten(),
        run: trace.run.as_ref().map(RunView::from),
        steps: trace.steps.iter().map(|s| StepView::of(s, scrubber)).collect(),
        steps_next: full(trace.steps.len(), page.steps)
            .then(|| trace.steps.last().map(|s| s.seq))
            .flatten(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::time::Duration;

    use foldgate_engine::default_scrubber;
    use serde_json::json;

    use super::*;

    fn step(kind: StepKind, body: &str) -> RunStep {
        RunStep {
            seq: 3,
            kind,
            body: body.to_owned(),
            input_tokens: 10,
            output_tokens: 2,
            duration: Duration::from_millis(7),
            repeated: false,
            at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn steps_show_their_text_and_calls_scrubbed_and_cut() {
        let scrubber = default_scrubber().unwrap();
        let secret = "ghp_R7kP2mX9qL4vN8wZ3tY6bH1cJ5dF0gS2aE7u";
        let body = json!({
            "text": format!("Reading with {secret}"),
            "calls": [
                {"id": "c1", "name": "files__read", "arguments": {"path": "a.rs", "token": secret}},
                {"id": "c2", "name": "files__list", "arguments": {}},
            ],
        });
        let view = StepView::of(&step(StepKind::Model, &body.to_string()), scrubber.as_ref());
        let text = view.text.unwrap();
        assert!(text.starts_with("Reading with ") && !text.contains(secret), "{text}");
        assert_eq!(view.tool_calls.len(), 2);
        assert_eq!(
            (view.tool_calls[0].id.as_str(), view.tool_calls[0].name.as_str()),
            ("c1", "files__read")
        );
        assert!(view.tool_calls[0].arguments.contains("a.rs"));
        assert!(!view.tool_calls[0].arguments.contains(secret));
        assert_eq!(view.tool_calls[1].arguments, "{}");
        assert!(!view.truncated && view.tool.is_none() && view.result.is_none());

        let long = "é".repeat(TEXT_LIMIT);
        let body = json!({"call_id": "c1", "name": "files__read", "content": long, "error": true});
        let view = StepView::of(&step(StepKind::Tool, &body.to_string()), scrubber.as_ref());
        let result = view.result.unwrap();
        assert!(view.truncated && result.ends_with('…'), "cut, and says so");
        assert!(result.len() <= TEXT_LIMIT + '…'.len_utf8());
        assert_eq!((view.tool.as_deref(), view.error), (Some("files__read"), Some(true)));
        assert_eq!(view.call_id.as_deref(), Some("c1"));
        assert!(view.text.is_none() && view.tool_calls.is_empty());

        // Not what the runner writes: the body as it is.
        let view = StepView::of(&step(StepKind::Tool, "not json"), scrubber.as_ref());
        assert_eq!(view.text.as_deref(), Some("not json"));
    }

    #[test]
    fn call_cursors_read_back() {
        let call = TracedCall {
            id: Uuid::now_v7(),
            upstream: "files".into(),
            tool: "read".into(),
            tokens_in: 1,
            tokens_out: 2,
            tokens_charged: 3,
            duration: Duration::from_millis(4),
            outcome: foldgate_store::CallOutcome::Ok,
            called_at: DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap(),
        };
        let (at, id) = parse_call_cursor(&call_cursor(&call)).unwrap();
        assert_eq!((at, id), (call.called_at, call.id));
        for bad in ["", "12", "x:y", "12:not-a-uuid", "-99999999999999999999:0"] {
            assert!(parse_call_cursor(bad).is_err(), "{bad}");
        }
    }
}
