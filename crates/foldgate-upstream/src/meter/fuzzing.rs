//! An upstream's answer as the metered call path treats it, for the fuzz
//! targets in `fuzz/`: compiled only with `--cfg fuzzing`, which
//! `cargo fuzz` sets.

use foldgate_domain::{BranchId, Tokens};
use foldgate_engine::{Scrubber, TokenCounter};
use rmcp::model::CallToolResult;
use serde_json::Value;

use super::{Cut, result_tokens, scrub_and_count_now, truncate_result};

/// What became of one answer.
#[derive(Debug)]
pub struct Delivered {
    /// The answer scrubbed, or `None` when it was withheld.
    pub scrubbed: Option<Value>,
    /// Its tokens as charged.
    pub total: Tokens,
    /// The answer cut to `room` when it was over it, as the agent receives
    /// it, with the tokens shown of it.
    pub cut: Option<(Value, Tokens)>,
    /// The agent's result read as a tool result, as it is before it is
    /// sent (`Err` becomes the gateway's internal error).
    pub result: Option<Result<CallToolResult, serde_json::Error>>,
}

/// Scrubs and counts an upstream's result, cuts it to `room` tokens when it
/// is over them (as a charge granting `room` would), and reads it as a tool
/// result, exactly as a metered call does.
pub fn deliver(
    scrubber: &dyn Scrubber,
    tokens: &TokenCounter,
    raw: Value,
    room: Tokens,
    force_returned: bool,
    has_output_schema: bool,
) -> Delivered {
    let Ok((mut result, total)) = scrub_and_count_now(scrubber, tokens, raw, true) else {
        return Delivered { scrubbed: None, total: 0, cut: None, result: None };
    };
    let scrubbed = Some(result.clone());
    let mut cut = None;
    if total > room {
        let branch = BranchId::generate();
        let why = Cut::Budget { force_returned: force_returned.then_some(branch) };
        let shown = truncate_result(tokens, &mut result, room, total, why, has_output_schema);
        cut = Some((result.clone(), shown));
    }
    let read = serde_json::from_value::<CallToolResult>(result);
    Delivered { scrubbed, total, cut, result: Some(read) }
}

/// The tokens of a result as the metered path counts them.
pub fn tokens_of(tokens: &TokenCounter, result: &Value) -> Tokens {
    result_tokens(tokens, result)
}
