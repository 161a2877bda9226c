//! Errors that belong to the domain: invalid input, and the stable codes the
//! engine reports to clients.

use std::fmt;

/// A value from a client that cannot be turned into a domain type.
///
/// `field` is the argument's name as the client spelled it, so that the HTTP
/// layer can answer `400` with `data.field` and the model can fix the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
pub struct InvalidInput {
    pub field: &'static str,
    pub reason: String,
}

impl InvalidInput {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self { field, reason: reason.into() }
    }
}

/// A setting that is missing, malformed or out of range, as `validate`
/// and configuration loading report it: the message names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }

    /// The same error with every URL it quotes redacted
    /// ([`crate::redact_urls_in`]): a value an operator gave may be, or
    /// hold, a URL with a password.
    #[must_use]
    pub fn redacted(self) -> Self {
        Self(crate::redact_urls_in(&self.0))
    }

    /// The same error, placed in a section of the configuration
    /// (`[api]`, `[[upstreams]] "docs"`).
    #[must_use]
    pub fn within(self, section: &str) -> Self {
        Self(format!("{section} {}", self.0))
    }
}

impl From<String> for ConfigError {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl From<&str> for ConfigError {
    fn from(message: &str) -> Self {
        Self(message.to_owned())
    }
}

/// The stable, machine-readable error codes of the folding contract.
///
/// These strings are part of the public interface (tool results carry them as
/// `error.code`); never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidArgument,
    SessionNotFound,
    BranchNotFound,
    BranchNotActive,
    MaxDepthExceeded,
    BudgetExhausted,
    RateLimited,
    ScrubbingFailed,
    /// Concurrent changes to the same session kept winning; retry shortly.
    Busy,
    /// An upstream MCP server could not be reached or did not answer.
    UpstreamUnavailable,
    /// The `model` named is not configured for the caller's tenant.
    ModelNotFound,
    /// The branch is run by the gateway: only the gateway returns it or
    /// charges calls to it, and nothing nests under it.
    GatewayRunBranch,
    /// The model provider failed (after retries) or answered garbage.
    ModelFailed,
    /// No memory item of that id in the caller's tenant.
    MemoryNotFound,
    /// The tenant spent its token quota for the day or the month.
    QuotaExceeded,
    Internal,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::SessionNotFound => "session_not_found",
            Self::BranchNotFound => "branch_not_found",
            Self::BranchNotActive => "branch_not_active",
            Self::MaxDepthExceeded => "max_depth_exceeded",
            Self::BudgetExhausted => "budget_exhausted",
            Self::RateLimited => "rate_limited",
            Self::ScrubbingFailed => "scrubbing_failed",
            Self::Busy => "busy",
            Self::UpstreamUnavailable => "upstream_unavailable",
            Self::ModelNotFound => "model_not_found",
            Self::GatewayRunBranch => "gateway_run_branch",
            Self::ModelFailed => "model_failed",
            Self::MemoryNotFound => "memory_not_found",
            Self::QuotaExceeded => "quota_exceeded",
            Self::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
