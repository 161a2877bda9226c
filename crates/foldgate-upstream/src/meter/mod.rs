//! Upstream tool calls, metered: the one path every call of an upstream
//! tool takes, whether an agent made it or the gateway's runner made it for
//! a gateway-run branch.
//!
//! A call is forwarded with the upstream's own credentials; its arguments and
//! its result are counted with the gateway's tokenizer and charged to the
//! branch the call belongs to, in one transaction with a line in the
//! branch's trace. A result that would overrun the branch's budget is cut at
//! it, marked, and the branch is force-returned. Results pass the secret
//! scrubber first (fail closed) unless the upstream is configured not to.
//!
//! What is counted is what a model reads of the call, once: the arguments
//! as compact JSON; of the result, the text of its content items (text, or
//! an embedded resource's text; any other item as compact JSON), or, for a
//! result with no content item, its `structuredContent` as compact JSON. A
//! result that carries both gives the same value twice (the MCP
//! specification asks servers to serialize structured content into a text
//! item for clients that read only content, which is what clients hand
//! their models): it is charged once, as its content.

use std::{collections::BTreeSet, sync::Arc, time::Instant};

use foldgate_domain::{BranchId, ErrorCode, Principal, Tokens};
use foldgate_engine::{
    CallOutcome, CallRecord, CallTarget, FoldError, FoldingService, INLINE_TEXT_BYTES,
    OutsideUsage, ScrubFailure, Scrubber, TokenCounter, UsageKind,
};
use http::HeaderMap;
use rmcp::model::{CallToolResult, ErrorCode as RpcCode, ErrorData};
use serde_json::{Map, Value, json};
use tracing::{Instrument as _, Span, field::Empty};

use crate::{
    CallError, Upstream, UpstreamTool,
    identity::OnBehalf,
    notice::{Listener, Relay},
};

/// The `_meta` key (in `tools/call` params) naming the branch a call
/// belongs to.
pub const BRANCH_META_KEY: &str = "foldgate/branch_id";
/// The `_meta` key of a result that reports what was metered.
pub const METERING_META_KEY: &str = "foldgate/metering";

/// One call of an upstream tool.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamCall<'a> {
    pub upstream: &'a Upstream,
    pub tool: &'a UpstreamTool,
    pub arguments: Option<&'a Map<String, Value>>,
    /// The scopes of the caller's token (or of a gateway-run branch's
    /// grant), told to upstreams that want to know who calls.
    pub scopes: &'a BTreeSet<String>,
    /// The request's `_meta`, if any; what belongs to foldgate and to the
    /// caller's own connection is not forwarded.
    pub meta: Option<&'a Map<String, Value>>,
    /// Where the upstream's progress and log messages for the call go, if
    /// the caller wants them.
    pub relay: Option<Relay<'a>>,
}

/// What the caller gets back from a call that was made (or refused with a
/// result a model can read).
#[derive(Debug)]
pub enum Answer {
    /// A tool result: the upstream's (scrubbed, perhaps cut), or a refusal
    /// with `isError` (over budget, upstream unavailable, not scrubbable).
    /// Its `_meta` reports what was metered, when the upstream answered.
    Result(CallToolResult),
    /// The upstream's JSON-RPC error, passed on scrubbed (and cut, as a
    /// result would be).
    Error(ErrorData),
}

/// Why no answer could be given.
#[derive(Debug, thiserror::Error)]
pub enum CallFailure {
    /// The folding engine refused before anything was forwarded.
    #[error(transparent)]
    Refused(#[from] FoldError),
    /// The gateway failed; what it says is for the log, never for the
    /// client.
    #[error(transparent)]
    Internal(#[from] Fault),
}

/// A failure of the gateway's own while it made or metered a call.
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// The call could not be booked to its branch (the database failed).
    #[error("metering an upstream call: {0}")]
    Metering(#[source] FoldError),
    /// The upstream's answer, once scrubbed and counted, is not a tool result.
    #[error("upstream {upstream:?} returned an unreadable result: {source}")]
    UnreadableResult {
        upstream: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Why an upstream's answer was withheld instead of scrubbed.
#[derive(Debug, thiserror::Error)]
enum Withheld {
    #[error(transparent)]
    Scrub(#[from] ScrubFailure),
    #[error("the scrubbing task did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Forwards a call to an upstream and meters it where `target` says, in an
/// `upstream.call` span that records where the call was charged, its tokens
/// and its outcome (the request to the upstream is a client span inside
/// it).
pub async fn call(
    service: &FoldingService,
    who: &Principal,
    target: &CallTarget,
    call: UpstreamCall<'_>,
) -> Result<Answer, CallFailure> {
    let span = tracing::info_span!(
        "upstream.call",
        tenant = %who.tenant,
        upstream = %call.upstream.name(),
        gen_ai.tool.name = %call.tool.tool.name,
        session.id = Empty,
        branch.id = Empty,
        tokens_in = Empty,
        tokens_out = Empty,
        outcome = Empty,
    );
    forward(service, who, target, call, span.clone()).instrument(span).await
}

async fn forward(
    service: &FoldingService,
    who: &Principal,
    target: &CallTarget,
    call: UpstreamCall<'_>,
    span: Span,
) -> Result<Answer, CallFailure> {
    let UpstreamCall { upstream, tool, arguments, scopes, meta, relay } = call;
    // A tenant that spent its token quota calls nothing more.
    service.tenant_rules().check_quota(&who.tenant, service.clock().now())?;
    let scrubber = service.scrubber();
    let name = tool.tool.name.as_ref();
    let tokens = service.tokens().clone();
    let tokens_in =
        tokens.count(&compact(&arguments.map_or(Value::Null, |a| Value::Object(a.clone()))));
    // As read before the call: enough to refuse arguments that alone use
    // it up; the charge after the call is what counts.
    let remaining = match target {
        CallTarget::Branch(branch) => Some(branch.ledger.remaining()),
        CallTarget::Outside(_) => None,
    };
    let started = Instant::now();
    let meter = Meter { service, who, upstream, tool, target, started, span };

    if let Some(remaining) = remaining.filter(|r| tokens_in >= *r) {
        // The arguments alone use up the budget: the call is not made.
        let metered = meter.record(tokens_in, 0, CallOutcome::Refused).await?;
        tracing::info!(upstream = %upstream.name(), tool = name, tokens_in, remaining,
            forced_return = metered.forced_return, "upstream call refused: over budget");
        return Err(FoldError::BudgetExhausted { available: remaining }.into());
    }

    let listener = relay.map(|relay| {
        let scrubber = upstream.config.scrub_results.then(|| Arc::clone(scrubber));
        Listener::new(relay.sink.clone(), relay.progress, relay.min_log, scrubber)
    });
    let forwarded_meta = forwarded_meta(meta, listener.as_ref());
    let caller = OnBehalf {
        principal: who,
        scopes,
        branch: match target {
            CallTarget::Branch(branch) => Some(branch.id),
            CallTarget::Outside(_) => None,
        },
    };
    let answer = upstream
        .call(
            &caller,
            tool,
            arguments,
            forwarded_meta.as_ref(),
            &HeaderMap::new(),
            listener.as_ref(),
        )
        .await;
    let raw = match answer {
        Ok(raw) => raw,
        Err(CallError::Unavailable(why)) => {
            meter.record(tokens_in, 0, CallOutcome::UpstreamError).await?;
            let message = format!("upstream {:?} is unavailable: {why}", upstream.name());
            tracing::warn!(upstream = %upstream.name(), tool = name, error = %why, "upstream call failed");
            return Ok(refusal(ErrorCode::UpstreamUnavailable, &message));
        }
        Err(CallError::Rpc { code, message, data }) => {
            // Passed through as the same JSON-RPC error, scrubbed.
            let error = json!({"message": message, "data": data});
            let scrubbed =
                scrub_and_count(scrubber, &tokens, error, upstream.config.scrub_results).await;
            let (error, tokens_out) = match scrubbed {
                Ok(scrubbed) => scrubbed,
                Err(e) => {
                    meter.record(tokens_in, 0, CallOutcome::Refused).await?;
                    tracing::error!(upstream = %upstream.name(), tool = name, error = %e,
                        "an upstream error could not be scrubbed; it was withheld");
                    return Ok(refusal(
                        ErrorCode::ScrubbingFailed,
                        "the upstream's error could not be scrubbed of secrets",
                    ));
                }
            };
            let metered = meter.record(tokens_in, tokens_out, CallOutcome::ToolError).await?;
            let mut message = error["message"].as_str().unwrap_or_default().to_owned();
            let mut data = error.get("data").filter(|d| !d.is_null()).cloned();
            if let Some((room, why)) = metered.cut() {
                // Cut like a result: the message, marked, to what the grant
                // covers, without its data.
                message = cut_text(&tokens, &message, room, tokens_out, why);
                data = None;
            }
            let code = i32::try_from(code).unwrap_or(-32603);
            return Ok(Answer::Error(ErrorData::new(RpcCode(code), message, data)));
        }
    };

    let (mut result, mut tokens_out) =
        match scrub_and_count(scrubber, &tokens, raw, upstream.config.scrub_results).await {
            Ok(scrubbed) => scrubbed,
            Err(e) => {
                meter.record(tokens_in, 0, CallOutcome::Refused).await?;
                tracing::error!(upstream = %upstream.name(), tool = name, error = %e,
                    "an upstream result could not be scrubbed; it was withheld");
                return Ok(refusal(
                    ErrorCode::ScrubbingFailed,
                    "the result could not be scrubbed of secrets; nothing was returned",
                ));
            }
        };
    let mut outcome = if result.get("isError").and_then(Value::as_bool) == Some(true) {
        CallOutcome::ToolError
    } else {
        CallOutcome::Ok
    };
    // The charge decides what the agent receives: the branch grants what
    // remains of its budget when the charge takes its lock, which a
    // concurrent call may have spent since the read before this one.
    let metered = meter.record(tokens_in, tokens_out, outcome).await?;
    if let Some((room, why)) = metered.cut() {
        let has_schema = tool.tool.output_schema.is_some();
        let shown = truncate_result(&tokens, &mut result, room, tokens_out, why, has_schema);
        tracing::info!(upstream = %upstream.name(), tool = name, tokens_out, shown, ?why,
            "upstream result cut to what its branch granted");
        tokens_out = room;
        outcome = CallOutcome::Truncated;
    }
    let mut result: CallToolResult = serde_json::from_value(result).map_err(|e| {
        CallFailure::Internal(Fault::UnreadableResult {
            upstream: upstream.name().to_owned(),
            source: e,
        })
    })?;
    // Upstreams speak an older protocol version, whose results carry no
    // `resultType`; this one is complete (rmcp drops the field again for
    // clients of older versions).
    result.result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
    let report = json!({
        "branch_id": metered.branch,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "truncated": outcome == CallOutcome::Truncated,
        "budget_used": metered.used,
        "budget_total": metered.budget,
        "branch_force_returned": metered.forced_return,
        "branch_ended": metered.ended(),
    });
    result.meta.get_or_insert_with(Default::default).0.insert(METERING_META_KEY.into(), report);
    Ok(Answer::Result(result))
}

/// What metering did, for the result's `_meta`.
struct Metered {
    branch: Option<BranchId>,
    used: Option<Tokens>,
    budget: Option<Tokens>,
    forced_return: bool,
    /// What the agent receives of the result, when a branch was charged
    /// ([`CallRecord::received`]).
    received: Option<(Tokens, CallOutcome)>,
}

impl Metered {
    /// The branch was no longer active when the call was charged: it was
    /// charged, and nothing was used.
    fn ended(&self) -> bool {
        self.branch.is_some() && self.used.is_none()
    }

    /// Why a result is cut, if it is.
    fn cut(&self) -> Option<(Tokens, Cut)> {
        let (Some((room, CallOutcome::Truncated)), Some(branch)) = (self.received, self.branch)
        else {
            return None;
        };
        let why = if self.ended() {
            Cut::Ended(branch)
        } else {
            Cut::Budget { force_returned: self.forced_return.then_some(branch) }
        };
        Some((room, why))
    }
}

/// Why a result was cut.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// At the branch's budget; the branch, if the charge force-returned it
    /// (it does not when what is left is lent to children).
    Budget { force_returned: Option<BranchId> },
    /// The branch had ended when the call was charged.
    Ended(BranchId),
}

impl Cut {
    /// The text that tells the agent, in full, and short for when the
    /// full text does not fit what is left of a budget (a result withheld
    /// had nothing left, and is told in full).
    fn marker(self, total: Tokens, room: Tokens) -> (String, Option<&'static str>) {
        match self {
            Self::Budget { force_returned } => {
                let ended = force_returned.map_or_else(String::new, |branch| {
                    format!("; branch {branch} was force-returned (budget_exhausted)")
                });
                (
                    format!(
                        "\n[foldgate: result truncated at the branch's token budget ({total} \
                         tokens, {room} remained){ended}]"
                    ),
                    Some("\n[foldgate: result truncated at the branch's token budget]"),
                )
            }
            Self::Ended(branch) => (
                format!(
                    "\n[foldgate: result withheld ({total} tokens): branch {branch} had ended \
                     when the call was charged]"
                ),
                None,
            ),
        }
    }
}

/// Records a call where it belongs.
struct Meter<'a> {
    service: &'a FoldingService,
    who: &'a Principal,
    upstream: &'a Upstream,
    tool: &'a UpstreamTool,
    target: &'a CallTarget,
    started: Instant,
    /// The call's `upstream.call` span.
    span: Span,
}

impl Meter<'_> {
    /// Counts the call in the tenant's daily usage, with the tokens of the
    /// result as the agent received it.
    fn count(&self, kind: UsageKind, tokens_in: Tokens, tokens_out: Tokens) {
        let at = self.service.clock().now();
        let usage = self.service.tenant_rules().usage();
        usage.add(&self.who.tenant, at, kind, self.upstream.name(), 1, (tokens_in, tokens_out));
    }

    /// Charges the call where it belongs. Metrics and the span record the
    /// call as the agent receives it.
    async fn record(
        &self,
        tokens_in: Tokens,
        tokens_out: Tokens,
        outcome: CallOutcome,
    ) -> Result<Metered, CallFailure> {
        let tenant = self.who.tenant.as_str();
        let metrics = &self.upstream.metrics;
        let noted = |tokens_out: Tokens, outcome: CallOutcome| {
            metrics.record_tokens(tenant, self.upstream.name(), tokens_in, tokens_out);
            self.span.record("tokens_in", tokens_in);
            self.span.record("tokens_out", tokens_out);
            self.span.record("outcome", outcome.as_str());
        };
        match self.target {
            CallTarget::Outside(session) => {
                noted(tokens_out, outcome);
                metrics.record_outside_branches(tenant, self.upstream.name());
                if let Some(session) = session {
                    self.span.record("session.id", session.as_str());
                }
                let usage = OutsideUsage { calls: 1, tokens_in, tokens_out };
                self.service.record_outside(&self.who.tenant, session.clone(), usage);
                self.count(UsageKind::OutsideCall, tokens_in, tokens_out);
                Ok(Metered {
                    branch: None,
                    used: None,
                    budget: None,
                    forced_return: false,
                    received: None,
                })
            }
            CallTarget::Branch(branch) => {
                self.span.record("branch.id", tracing::field::display(branch.id));
                self.span.record("session.id", branch.session_id.as_str());
                let call = CallRecord {
                    upstream: self.upstream.name().to_owned(),
                    tool: self.tool.upstream_name.clone(),
                    tokens_in,
                    tokens_out,
                    duration: self.started.elapsed(),
                    outcome,
                    at: self.service.clock().now(),
                };
                let metered =
                    self.service.meter_call(&self.who.tenant, branch.id, &call).await.map_err(
                        |e| {
                            noted(tokens_out, outcome);
                            CallFailure::Internal(Fault::Metering(e))
                        },
                    )?;
                // A branch that ended meanwhile grants nothing.
                let granted = metered.consumption.map_or(0, |c| c.granted);
                let received = call.received(granted);
                noted(received.0, received.1);
                self.count(UsageKind::BranchCall, tokens_in, received.0);
                Ok(Metered {
                    branch: Some(branch.id),
                    used: metered.consumption.map(|c| c.ledger.used),
                    budget: Some(branch.ledger.budget),
                    forced_return: metered.forced_return,
                    received: Some(received),
                })
            }
        }
    }
}

/// A tool result with `isError` that a model can read.
fn refusal(code: ErrorCode, message: &str) -> Answer {
    Answer::Result(CallToolResult::structured_error(
        json!({"error": {"code": code.as_str(), "message": message}}),
    ))
}

/// The request's `_meta` as the upstream gets it: without foldgate's keys
/// and without the keys that belong to the agent's own connection; with the
/// listener's own progress token and the log level it hands on, if any.
fn forwarded_meta(
    meta: Option<&Map<String, Value>>,
    listener: Option<&Listener>,
) -> Option<Map<String, Value>> {
    let mut kept: Map<String, Value> = meta
        .into_iter()
        .flatten()
        .filter(|(k, _)| {
            !(k.starts_with("foldgate/")
                || k.starts_with("io.modelcontextprotocol/")
                || k.as_str() == "progressToken")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(token) = listener.and_then(Listener::token) {
        kept.insert("progressToken".into(), Value::String(token.to_owned()));
    }
    if let Some(level) = listener.and_then(Listener::min_log) {
        kept.insert(LOG_LEVEL_META_KEY.into(), Value::String(level.to_owned()));
    }
    (!kept.is_empty()).then_some(kept)
}

/// The `_meta` key of a request's least log level (SEP-2575).
pub const LOG_LEVEL_META_KEY: &str = "io.modelcontextprotocol/logLevel";

fn compact(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Scrubs a value (unless scrubbing is off for the upstream) and counts its
/// tokens: off the async workers unless the value's text (keys and string
/// values) is within [`INLINE_TEXT_BYTES`], since both take milliseconds on
/// large results.
async fn scrub_and_count(
    scrubber: &Arc<dyn Scrubber>,
    tokens: &TokenCounter,
    value: Value,
    scrub: bool,
) -> Result<(Value, Tokens), Withheld> {
    if text_within(&value, &mut { INLINE_TEXT_BYTES }) {
        return scrub_and_count_now(scrubber.as_ref(), tokens, value, scrub);
    }
    let scrubber = Arc::clone(scrubber);
    let tokens = tokens.clone();
    tokio::task::spawn_blocking(move || {
        scrub_and_count_now(scrubber.as_ref(), &tokens, value, scrub)
    })
    .await?
}

fn scrub_and_count_now(
    scrubber: &dyn Scrubber,
    tokens: &TokenCounter,
    value: Value,
    scrub: bool,
) -> Result<(Value, Tokens), Withheld> {
    let value = if scrub { scrubber.scrub_json(&value)?.value } else { value };
    let count = result_tokens(tokens, &value);
    Ok((value, count))
}

/// Whether the text of a value (its strings and keys) fits in `room`
/// bytes, which it uses up; stops looking as soon as it does not fit.
fn text_within(value: &Value, room: &mut usize) -> bool {
    let own = match value {
        Value::String(s) => s.len(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::Array(_) | Value::Object(_) => 0,
    };
    let Some(left) = room.checked_sub(own) else { return false };
    *room = left;
    match value {
        Value::Array(items) => items.iter().all(|item| text_within(item, room)),
        Value::Object(map) => map.iter().all(|(key, item)| {
            room.checked_sub(key.len()).is_some_and(|left| {
                *room = left;
                text_within(item, room)
            })
        }),
        _ => true,
    }
}

/// The tokens of a result (or of an error), as documented at the top.
pub fn result_tokens(tokens: &TokenCounter, result: &Value) -> Tokens {
    let content = result.get("content").and_then(Value::as_array);
    let structured = result.get("structuredContent");
    if content.is_none() && structured.is_none() {
        // Not a tool result: an error's message and data.
        return tokens.count(&compact(result));
    }
    match (content, structured) {
        (Some(items), _) if !items.is_empty() => {
            items.iter().map(|item| tokens.count(&item_text(item))).sum()
        }
        (_, Some(structured)) => tokens.count(&compact(structured)),
        _ => 0,
    }
}

/// The text of a content item as a model reads it.
fn item_text(item: &Value) -> String {
    match item.get("type").and_then(Value::as_str) {
        Some("text") => item.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
        Some("resource") => {
            match item.get("resource").and_then(|r| r.get("text")).and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => compact(item),
            }
        }
        _ => compact(item),
    }
}

/// Cuts a result of `total` tokens to at most `room`, marker included:
/// content items are kept in order while they fit, the one that does not fit
/// is cut (if it is text), the rest are dropped, and so is
/// `structuredContent` (it cannot be cut without breaking its schema), and
/// the upstream's `_meta` with it. A result that had structured content, or
/// whose tool declares an output schema, becomes an error result
/// (`isError`): clients check a successful result of such a tool against
/// its schema, and a cut one cannot pass; the marker says why it is an
/// error. The marker says why; a short one is used when the full one does
/// not fit, and it is shown even when it alone is more than the room (a
/// result cut to nothing must still say so). Returns the tokens shown.
fn truncate_result(
    tokens: &TokenCounter,
    result: &mut Value,
    room: Tokens,
    total: Tokens,
    why: Cut,
    has_output_schema: bool,
) -> Tokens {
    let (marker, marker_tokens) = marker_within(tokens, why, total, room);
    let content_room = room.saturating_sub(marker_tokens);
    let mut left = content_room;
    let mut kept = Vec::new();
    let items = result.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
    for mut item in items {
        let n = tokens.count(&item_text(&item));
        if n <= left {
            left -= n;
            kept.push(item);
            continue;
        }
        if item.get("type").and_then(Value::as_str) == Some("text")
            && let Some(text) = item.get("text").and_then(Value::as_str)
        {
            let (cut, n) = tokens.truncate(text, left);
            if !cut.is_empty() {
                left -= n;
                item["text"] = Value::String(cut);
                kept.push(item);
            }
        }
        break;
    }
    let shown = content_room - left + marker_tokens;
    kept.push(json!({"type": "text", "text": marker}));
    if let Value::Object(obj) = result {
        obj.insert("content".into(), Value::Array(kept));
        if obj.remove("structuredContent").is_some() || has_output_schema {
            obj.insert("isError".into(), Value::Bool(true));
        }
        // Nor is the upstream's own `_meta` what the grant covered.
        obj.remove("_meta");
    }
    shown
}

/// The marker for a cut (the full one if it fits the room, else the short
/// one) and its tokens.
fn marker_within(tokens: &TokenCounter, why: Cut, total: Tokens, room: Tokens) -> (String, Tokens) {
    let (full, short) = why.marker(total, room);
    let n = tokens.count(&full);
    match short {
        Some(short) if n > room => (short.to_owned(), tokens.count(short)),
        _ => (full, n),
    }
}

/// A text cut to at most `room` tokens with its marker (or to the marker
/// alone, if that is more than the room).
fn cut_text(tokens: &TokenCounter, text: &str, room: Tokens, total: Tokens, why: Cut) -> String {
    let (marker, marker_tokens) = marker_within(tokens, why, total, room);
    let (mut cut, _) = tokens.truncate(text, room.saturating_sub(marker_tokens));
    if cut.is_empty() {
        return marker.trim_start().to_owned();
    }
    cut.push_str(&marker);
    cut
}

#[cfg(fuzzing)]
pub mod fuzzing;

#[cfg(test)]
mod tests;
