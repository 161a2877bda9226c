//! Upstream tool calls: one line of a branch's trace, and what they add up to.

use std::{str::FromStr, time::Duration};

use chrono::{DateTime, Utc};
use foldgate_domain::Tokens;

/// How an upstream tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// The upstream answered with a result.
    Ok,
    /// The upstream answered with a tool error (`isError`) or a JSON-RPC error.
    ToolError,
    /// The upstream could not be reached, timed out or answered garbage.
    UpstreamError,
    /// The result overran the branch's budget and was cut at it.
    Truncated,
    /// The call was not forwarded: its arguments alone used up the budget,
    /// or its result could not be scrubbed.
    Refused,
}

impl CallOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ToolError => "tool_error",
            Self::UpstreamError => "upstream_error",
            Self::Truncated => "truncated",
            Self::Refused => "refused",
        }
    }
}

impl FromStr for CallOutcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "ok" => Self::Ok,
            "tool_error" => Self::ToolError,
            "upstream_error" => Self::UpstreamError,
            "truncated" => Self::Truncated,
            "refused" => Self::Refused,
            other => return Err(format!("unknown call outcome {other:?}")),
        })
    }
}

/// An upstream tool call made inside a branch: one line of its trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub upstream: String,
    pub tool: String,
    /// Tokens of the arguments.
    pub tokens_in: Tokens,
    /// Tokens of the result as the agent received it.
    pub tokens_out: Tokens,
    pub duration: Duration,
    pub outcome: CallOutcome,
    pub at: DateTime<Utc>,
}

impl CallRecord {
    /// What the call costs a branch: its arguments and its result.
    pub fn tokens(&self) -> Tokens {
        self.tokens_in.saturating_add(self.tokens_out)
    }

    /// What the agent receives of the result when the branch grants
    /// `granted` of [`CallRecord::tokens`] (nothing, if the branch is no
    /// longer active): a result that the grant does not cover is cut at what
    /// it covers after the arguments (`Truncated`). A call that produced no
    /// result (refused, or the upstream failed) is left as it is. The trace
    /// records the call this way.
    pub fn received(&self, granted: Tokens) -> (Tokens, CallOutcome) {
        match self.outcome {
            CallOutcome::Ok | CallOutcome::ToolError | CallOutcome::Truncated
                if granted < self.tokens() =>
            {
                (granted.saturating_sub(self.tokens_in), CallOutcome::Truncated)
            }
            _ => (self.tokens_out, self.outcome),
        }
    }
}

/// Calls of one upstream tool within a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCalls {
    pub upstream: String,
    pub tool: String,
    pub calls: u64,
    /// Tokens charged for them.
    pub tokens: Tokens,
}

/// What a branch's upstream calls add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallSummary {
    pub calls: u64,
    pub tokens_in: Tokens,
    pub tokens_out: Tokens,
    pub tokens_charged: Tokens,
    /// Calls that ended in a tool error, an upstream error or a refusal.
    pub errors: u64,
    pub truncated: u64,
    pub last_call_at: Option<DateTime<Utc>>,
    /// Per tool, most charged first.
    pub by_tool: Vec<ToolCalls>,
}

/// Upstream calls that belonged to no branch, added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutsideUsage {
    pub calls: u64,
    pub tokens_in: Tokens,
    pub tokens_out: Tokens,
}

impl OutsideUsage {
    pub fn add(&mut self, other: Self) {
        self.calls = self.calls.saturating_add(other.calls);
        self.tokens_in = self.tokens_in.saturating_add(other.tokens_in);
        self.tokens_out = self.tokens_out.saturating_add(other.tokens_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_received_as_far_as_its_grant_goes() {
        let call = |outcome| CallRecord {
            upstream: "files".into(),
            tool: "read".into(),
            tokens_in: 30,
            tokens_out: 70,
            duration: Duration::from_millis(1),
            outcome,
            at: DateTime::<Utc>::UNIX_EPOCH,
        };
        let ok = call(CallOutcome::Ok);
        assert_eq!(ok.received(100), (70, CallOutcome::Ok), "granted in full");
        assert_eq!(ok.received(1_000), (70, CallOutcome::Ok));
        assert_eq!(ok.received(99), (69, CallOutcome::Truncated));
        assert_eq!(ok.received(30), (0, CallOutcome::Truncated), "the arguments only");
        assert_eq!(ok.received(10), (0, CallOutcome::Truncated), "not even those");
        assert_eq!(call(CallOutcome::ToolError).received(50), (20, CallOutcome::Truncated));
        assert_eq!(call(CallOutcome::Truncated).received(50), (20, CallOutcome::Truncated));
        assert_eq!(call(CallOutcome::ToolError).received(100), (70, CallOutcome::ToolError));
        // No result to cut.
        let refused = CallRecord { tokens_out: 0, ..call(CallOutcome::Refused) };
        assert_eq!(refused.received(10), (0, CallOutcome::Refused));
        let failed = CallRecord { tokens_out: 0, ..call(CallOutcome::UpstreamError) };
        assert_eq!(failed.received(0), (0, CallOutcome::UpstreamError));
    }
}
