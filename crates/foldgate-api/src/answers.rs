//! What the folding tools answer: one type per tool, whose JSON schema is the
//! tool's `outputSchema`, so that what a client is promised and what it gets
//! are the same declaration.

use chrono::{DateTime, Utc};
use foldgate_domain::{Branch, BranchId, Tokens};
use foldgate_engine::{CallSummary, Created, Returned, SessionEnded};
use foldgate_runner::{RunOutcome, Usage};
use foldgate_store::{Run, RunStep, StepKind};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::{
    args::{FoldingTool, schema_object},
    memory::{InjectedView, MemoryFeedbackAnswer, MemoryRecorded, MemorySearchAnswer},
};

/// `branch_create`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BranchCreated {
    #[schemars(with = "String")]
    pub branch_id: BranchId,
    pub session_id: String,
    /// `null` for a branch at depth 1.
    #[schemars(with = "Option<String>")]
    pub parent_branch_id: Option<BranchId>,
    pub depth: u32,
    /// The budget granted, which the parent's remaining tokens may cap.
    pub budget_allocated: Tokens,
    pub budget_requested: Tokens,
    pub budget_used: Tokens,
    pub deadline_at: DateTime<Utc>,
    pub status: &'static str,
    pub return_tier: &'static str,
    /// Lessons from your team's memory the branch starts with (when `inject_memories`), best
    /// match first; their text is in your context now only through this answer.
    pub injected_context: Vec<InjectedView>,
    /// Tokens of the injected lessons, charged to the branch.
    pub injected_tokens: Tokens,
}

impl From<&Created> for BranchCreated {
    fn from(created: &Created) -> Self {
        let b = &created.branch;
        Self {
            branch_id: b.id,
            session_id: b.session_id.as_str().to_owned(),
            parent_branch_id: b.parent,
            depth: b.depth,
            budget_allocated: b.ledger.budget,
            budget_requested: created.budget_requested,
            budget_used: b.ledger.used,
            deadline_at: b.deadline_at,
            status: b.status.as_str(),
            return_tier: b.return_tier.as_str(),
            injected_context: InjectedView::list(&created.injection),
            injected_tokens: created.injection.tokens,
        }
    }
}

/// `branch_return`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BranchReturned {
    pub success: bool,
    #[schemars(with = "String")]
    pub branch_id: BranchId,
    pub status: &'static str,
    pub tokens_used: Tokens,
    /// Tokens of `message`: what the branch adds to the parent's context.
    pub tokens_returned: Tokens,
    /// `1 - tokens_returned / tokens_used`.
    pub compression_ratio: f64,
    /// The message as the parent receives it, secrets redacted.
    pub message: String,
    pub redactions: u64,
    /// Active child branches ended first, deepest first.
    #[schemars(with = "Vec<String>")]
    pub children_force_returned: Vec<BranchId>,
    pub return_tier: &'static str,
    /// The message is longer than the tier asks for.
    pub tier_exceeded: bool,
    /// The message was queued, with the return, to be kept in the team's memory as a lesson
    /// (`extract_memory`); it is written in the background. False when not asked for, when the
    /// message makes no lesson (it is empty), or when the gateway's memory is off.
    pub memory_extracted: bool,
}

impl From<&Returned> for BranchReturned {
    fn from(returned: &Returned) -> Self {
        let b = &returned.branch;
        Self {
            success: true,
            branch_id: b.id,
            status: b.status.as_str(),
            tokens_used: b.ledger.used,
            tokens_returned: returned.tokens_returned,
            compression_ratio: (returned.compression_ratio() * 1000.0).round() / 1000.0,
            message: returned.message.clone(),
            redactions: returned.redactions,
            children_force_returned: returned.children_ended.clone(),
            return_tier: b.return_tier.as_str(),
            tier_exceeded: returned.tokens_returned > b.return_tier.max_tokens(),
            memory_extracted: returned.memory_queued,
        }
    }
}

/// `branch_status`'s answer: a branch, or none; for a session, what its
/// returns have added to the caller's context.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BranchStatusAnswer {
    #[serde(flatten)]
    pub found: Found,
    /// For a query by session: the tokens of every return message handed to
    /// the caller in the session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_tokens_returned: Option<Tokens>,
}

/// A branch, or none.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Found {
    Branch(Box<BranchView>),
    Nothing(NoBranch),
}

/// The session has no active branch.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NoBranch {
    /// Always `null`.
    pub branch_id: (),
    /// `No active branch found`.
    pub status: &'static str,
}

impl Default for NoBranch {
    fn default() -> Self {
        Self { branch_id: (), status: "No active branch found" }
    }
}

/// What `branch_status` shows of a branch.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BranchView {
    #[schemars(with = "String")]
    pub branch_id: BranchId,
    pub session_id: String,
    #[schemars(with = "Option<String>")]
    pub parent_branch_id: Option<BranchId>,
    pub status: &'static str,
    /// Why it ended, when it did not complete.
    pub reason: Option<&'static str>,
    pub depth: u32,
    pub description: String,
    pub budget_total: Tokens,
    pub budget_used: Tokens,
    pub budget_lent_to_children: Tokens,
    /// Spending has crossed 80% of the budget.
    pub budget_warning: bool,
    pub created_at: DateTime<Utc>,
    pub deadline_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    /// `agent` (branch_create) or `gateway` (branch_run).
    pub kind: &'static str,
    pub return_tier: &'static str,
    pub tokens_returned: Option<Tokens>,
    /// The upstream calls made inside the branch.
    pub calls: CallsView,
    /// A gateway-run branch's run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunView>,
}

impl BranchView {
    pub fn new(b: &Branch, calls: &CallSummary, run: Option<RunView>) -> Self {
        Self {
            branch_id: b.id,
            session_id: b.session_id.as_str().to_owned(),
            parent_branch_id: b.parent,
            status: b.status.as_str(),
            reason: b.reason.map(|r| r.as_str()),
            depth: b.depth,
            description: b.description.clone(),
            budget_total: b.ledger.budget,
            budget_used: b.ledger.used,
            budget_lent_to_children: b.ledger.reserved,
            budget_warning: b.warned_at.is_some(),
            created_at: b.created_at,
            deadline_at: b.deadline_at,
            completed_at: b.completed_at,
            kind: b.kind.as_str(),
            return_tier: b.return_tier.as_str(),
            tokens_returned: b.returned_tokens,
            calls: CallsView::from(calls),
            run,
        }
    }
}

/// The upstream calls of a branch.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CallsView {
    pub count: u64,
    pub tokens_in: Tokens,
    pub tokens_out: Tokens,
    pub tokens_charged: Tokens,
    pub errors: u64,
    pub truncated: u64,
    pub last_call_at: Option<DateTime<Utc>>,
    pub by_tool: Vec<ToolCallsView>,
}

/// The calls of one upstream tool.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ToolCallsView {
    /// `<upstream>__<tool>`.
    pub tool: String,
    pub calls: u64,
    pub tokens: Tokens,
}

impl From<&CallSummary> for CallsView {
    fn from(c: &CallSummary) -> Self {
        Self {
            count: c.calls,
            tokens_in: c.tokens_in,
            tokens_out: c.tokens_out,
            tokens_charged: c.tokens_charged,
            errors: c.errors,
            truncated: c.truncated,
            last_call_at: c.last_call_at,
            by_tool: c
                .by_tool
                .iter()
                .map(|t| ToolCallsView {
                    tool: format!(
                        "{}{}{}",
                        t.upstream,
                        foldgate_upstream::NAMESPACE_SEPARATOR,
                        t.tool
                    ),
                    calls: t.calls,
                    tokens: t.tokens,
                })
                .collect(),
        }
    }
}

/// A gateway-run branch's run, step by step.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunView {
    /// `running` or `done`.
    pub state: &'static str,
    pub model: String,
    pub model_usage: Usage,
    /// How often another replica took the run over.
    pub resumes: u32,
    pub steps: Vec<StepView>,
    /// The result, once done.
    pub outcome: Option<RunOutcome>,
}

impl RunView {
    pub fn new(run: &Run, steps: &[RunStep]) -> Self {
        Self {
            state: run.state.as_str(),
            model: run.model.clone(),
            model_usage: Usage {
                input_tokens: run.usage.input_tokens,
                output_tokens: run.usage.output_tokens,
                calls: run.usage.calls,
            },
            resumes: run.resumes,
            steps: steps.iter().map(StepView::from).collect(),
            outcome: run.outcome.as_deref().and_then(|o| serde_json::from_str(o).ok()),
        }
    }
}

/// One step of a run.
#[derive(Debug, Serialize, JsonSchema)]
pub struct StepView {
    pub seq: u32,
    /// `model` or `tool`.
    pub kind: &'static str,
    pub input_tokens: Tokens,
    pub output_tokens: Tokens,
    pub duration_ms: u64,
    /// The step repeats an earlier one.
    pub repeated: bool,
    pub at: DateTime<Utc>,
    /// For a tool step: the tool called.
    pub tool: Option<String>,
}

impl From<&RunStep> for StepView {
    fn from(s: &RunStep) -> Self {
        let tool = (s.kind == StepKind::Tool)
            .then(|| serde_json::from_str::<Value>(&s.body).ok())
            .flatten()
            .and_then(|b| b.get("name").and_then(Value::as_str).map(str::to_owned));
        Self {
            seq: s.seq,
            kind: s.kind.as_str(),
            input_tokens: s.input_tokens,
            output_tokens: s.output_tokens,
            duration_ms: u64::try_from(s.duration.as_millis()).unwrap_or(u64::MAX),
            repeated: s.repeated,
            at: s.at,
            tool,
        }
    }
}

/// `session_end`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionEndAnswer {
    pub session_id: String,
    pub branches_ended: u64,
    pub session_ended: bool,
}

impl SessionEndAnswer {
    pub fn new(session_id: &str, ended: &SessionEnded) -> Self {
        Self {
            session_id: session_id.to_owned(),
            branches_ended: ended.branches_ended,
            session_ended: ended.session_ended,
        }
    }
}

/// `branch_run`'s answer: the outcome, or where to find it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RunAnswer {
    Done(Box<RunOutcome>),
    Running(StillRunning),
}

/// The answer to a call that could not wait for its run.
#[derive(Debug, Serialize, JsonSchema)]
pub struct StillRunning {
    #[schemars(with = "String")]
    pub branch_id: BranchId,
    /// `running`.
    pub status: &'static str,
    pub message: String,
}

impl StillRunning {
    pub fn new(branch: &Branch) -> Self {
        Self {
            branch_id: branch.id,
            status: "running",
            message: format!(
                "The run is still working. Its result will be in branch_status(branch_id: \"{}\") \
                 under run.outcome; ask for progress or use the tasks extension to wait for it.",
                branch.id
            ),
        }
    }
}

/// `tool_search`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ToolSearchAnswer {
    /// The best matches, best first: call any of them by `name`, with arguments that follow its
    /// `inputSchema`.
    pub tools: Vec<FoundTool>,
    /// How many upstream tools you may call, all of which were searched.
    pub tools_searched: usize,
}

/// A tool `tool_search` found, as `tools/list` would show it, with its score.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FoundTool {
    /// `<upstream>__<tool>`: the name to call it by.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema its arguments must follow.
    #[serde(rename = "inputSchema")]
    pub input_schema: Map<String, Value>,
    /// The JSON schema of its structured result, when it declares one.
    #[serde(rename = "outputSchema", skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Map<String, Value>>,
    /// How well it matches the query (BM25; higher is better, comparable only within one
    /// answer).
    pub score: f64,
}

impl FoundTool {
    pub fn new(tool: &rmcp::model::Tool, score: f32) -> Self {
        Self {
            name: tool.name.to_string(),
            title: tool.title.clone(),
            description: tool.description.as_ref().map(ToString::to_string),
            input_schema: (*tool.input_schema).clone(),
            output_schema: tool.output_schema.as_ref().map(|s| (**s).clone()),
            score: (f64::from(score) * 1000.0).round() / 1000.0,
        }
    }
}

/// The `outputSchema` of a folding tool: the JSON schema of its answer, an
/// object at the root as MCP requires.
pub fn output_schema(tool: FoldingTool) -> Map<String, Value> {
    schema_object(match tool {
        FoldingTool::BranchCreate => schemars::schema_for!(BranchCreated),
        FoldingTool::BranchReturn => schemars::schema_for!(BranchReturned),
        FoldingTool::BranchRun => schemars::schema_for!(RunAnswer),
        FoldingTool::BranchStatus => schemars::schema_for!(BranchStatusAnswer),
        FoldingTool::SessionEnd => schemars::schema_for!(SessionEndAnswer),
        FoldingTool::MemorySearch => schemars::schema_for!(MemorySearchAnswer),
        FoldingTool::MemoryRecord => schemars::schema_for!(MemoryRecorded),
        FoldingTool::MemoryFeedback => schemars::schema_for!(MemoryFeedbackAnswer),
        FoldingTool::ToolSearch => schemars::schema_for!(ToolSearchAnswer),
    })
}

/// A value as a tool's structured result.
pub fn to_value(answer: &impl Serialize) -> Value {
    serde_json::to_value(answer).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every folding tool's schemas compile, are object schemas, and use
    /// only the formats JSON Schema defines (clients' validators warn of
    /// others on every call).
    #[test]
    fn output_schemas_are_objects() {
        for tool in FoldingTool::ALL {
            let schema = Value::Object(output_schema(tool));
            assert_eq!(schema["type"], "object", "{}", tool.name());
            assert!(jsonschema::validator_for(&schema).is_ok(), "{}", tool.name());
            for schema in [schema, Value::Object(crate::args::input_schema(tool))] {
                let text = schema.to_string();
                for foreign in ["\"uint", "\"int32\"", "\"int64\"", "\"double\""] {
                    assert!(
                        !text.contains(&format!("\"format\":{foreign}")),
                        "{}: {text}",
                        tool.name()
                    );
                }
            }
        }
    }

    /// The answers the end-to-end tests meet least often fit their schemas:
    /// a session with no active branch, and a run that could not be waited
    /// for; and a mistyped answer does not.
    #[test]
    fn the_rarer_answers_fit_their_schemas() {
        let fits = |tool: FoldingTool, answer: &Value| {
            let schema = Value::Object(output_schema(tool));
            jsonschema::validator_for(&schema).unwrap().is_valid(answer)
        };
        let nothing = BranchStatusAnswer {
            found: Found::Nothing(NoBranch::default()),
            session_tokens_returned: Some(0),
        };
        assert!(fits(FoldingTool::BranchStatus, &to_value(&nothing)));
        let running = RunAnswer::Running(StillRunning {
            branch_id: BranchId::generate(),
            status: "running",
            message: "still working".to_owned(),
        });
        assert!(fits(FoldingTool::BranchRun, &to_value(&running)));
        let mistyped = serde_json::json!({"branch_id": 7, "status": "running", "message": "m"});
        assert!(!fits(FoldingTool::BranchRun, &mistyped));
    }
}
