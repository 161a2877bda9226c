//! What a gateway-run branch hands back: the one thing of the run that
//! enters the caller's context.

use foldgate_domain::{Branch, ReturnTier, Tokens};
use foldgate_store::Run;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `branch_run`'s result, also kept with the run (so that any replica can
/// answer for it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunOutcome {
    pub branch_id: String,
    /// The branch's final status: `completed`, `timeout` or `failed`.
    pub status: String,
    /// Why it did not complete: the branch's end reason (`deadline_exceeded`,
    /// `budget_exhausted`, `session_ended`, `parent_returning`), or
    /// `model_failed`, `scrubbing_failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `model_failed`: what the provider did, without its key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The finding, scrubbed of secrets. When the run was cut, what the
    /// model had produced by then, marked as cut.
    pub message: String,
    /// The run was stopped before the model gave its final answer.
    pub cut: bool,
    /// The branch's context as the provider counted it: the last model
    /// call's input plus its output (never more than the budget).
    pub tokens_used: Tokens,
    /// Tokens of `message`: what the fold adds to the caller's context.
    pub tokens_returned: Tokens,
    /// `1 - tokens_returned / tokens_used`.
    pub compression_ratio: f64,
    /// What the provider billed, summed over the run's calls.
    pub model_usage: Usage,
    /// Model calls and tool calls made.
    pub steps: u32,
    pub model: String,
    pub return_tier: String,
    /// The message is within the tier.
    pub tier_met: bool,
    /// How often another replica took the run over.
    pub resumes: u32,
}

/// What a provider billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    pub input_tokens: Tokens,
    pub output_tokens: Tokens,
    pub calls: u64,
}

impl RunOutcome {
    /// The outcome of a run whose branch ended as `branch` is now.
    pub(crate) fn of(
        branch: &Branch,
        run: &Run,
        message: String,
        message_tokens: Tokens,
        cut: bool,
        failure: Option<(&str, String)>,
    ) -> Self {
        let used = branch.ledger.used;
        let returned = branch.returned_tokens.unwrap_or(message_tokens);
        #[expect(clippy::cast_precision_loss, reason = "token counts are far below 2^52")]
        let ratio = if used == 0 { 0.0 } else { (1.0 - returned as f64 / used as f64).max(0.0) };
        let (reason, error) = match failure {
            Some((reason, error)) => (Some(reason.to_owned()), Some(error)),
            None => (branch.reason.map(|r| r.as_str().to_owned()), None),
        };
        Self {
            branch_id: branch.id.to_string(),
            status: branch.status.as_str().to_owned(),
            reason,
            error,
            message,
            cut,
            tokens_used: used,
            tokens_returned: returned,
            compression_ratio: (ratio * 1000.0).round() / 1000.0,
            model_usage: Usage {
                input_tokens: run.usage.input_tokens,
                output_tokens: run.usage.output_tokens,
                calls: run.usage.calls,
            },
            steps: run.steps,
            model: run.model.clone(),
            return_tier: branch.return_tier.as_str().to_owned(),
            tier_met: returned <= tier_tokens(branch.return_tier),
            resumes: run.resumes,
        }
    }
}

fn tier_tokens(tier: ReturnTier) -> Tokens {
    tier.max_tokens()
}
