//! The engine's one error type.

use std::time::Duration;

use foldgate_domain::{BranchStatus, ErrorCode, InvalidInput, LimitKind, Tokens};
use foldgate_store::{CreateRefusal, StoreError};

/// Why a folding operation did not happen. Every variant but `Store` is a
/// refusal the client can act on; `Store` is an internal failure whose
/// details must not reach the client.
#[derive(Debug, thiserror::Error)]
pub enum FoldError {
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("session not found")]
    SessionNotFound,
    #[error("branch not found")]
    BranchNotFound,
    #[error("branch is not active (it is {status})")]
    BranchNotActive { status: BranchStatus },
    #[error("maximum branch depth {max_depth} exceeded")]
    MaxDepthExceeded { max_depth: u32 },
    #[error("the parent has only {available} tokens left, below the minimum branch budget")]
    BudgetExhausted { available: Tokens },
    #[error("the prompt needs {prompt_tokens} tokens but the branch budget is {budget}")]
    PromptOverBudget { prompt_tokens: Tokens, budget: Tokens },
    #[error("limit reached ({}): retry after {} s", limit.as_str(), retry_after.as_secs())]
    RateLimited { limit: LimitKind, retry_after: Duration },
    #[error("the message could not be scrubbed of secrets; nothing was returned")]
    ScrubbingFailed,
    /// Concurrent changes to the same session kept winning; retrying
    /// shortly succeeds.
    #[error("the session is changing concurrently; retry")]
    Busy,
    /// The branch is run by the gateway (`branch_run`): only the gateway
    /// returns it or charges calls to it, and nothing nests under it.
    #[error("the branch is run by the gateway; its result comes from branch_run")]
    GatewayRunBranch,
    /// No `[[models]]` entry of that name serves the caller's tenant.
    #[error("no model {name:?} is configured for this tenant")]
    ModelNotFound { name: String },
    /// The tenant spent its token quota for the period; another period
    /// begins after `retry_after`.
    #[error("the tenant's token quota for the {period} is spent: retry after {} s", retry_after.as_secs())]
    QuotaExceeded { period: &'static str, retry_after: Duration },
    /// No memory item of that id in the caller's tenant.
    #[error("memory item not found")]
    MemoryNotFound,
    /// The operator turned the reasoning memory off.
    #[error("the memory is off on this gateway")]
    MemoryDisabled,
    #[error("storage failure")]
    Store(StoreError),
}

impl From<StoreError> for FoldError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Contended => Self::Busy,
            other => Self::Store(other),
        }
    }
}

impl From<CreateRefusal> for FoldError {
    fn from(refusal: CreateRefusal) -> Self {
        match refusal {
            CreateRefusal::SessionNotFound => Self::SessionNotFound,
            CreateRefusal::ParentNotFound => Self::BranchNotFound,
            CreateRefusal::ParentIsGatewayRun => Self::GatewayRunBranch,
            CreateRefusal::ParentNotActive { status } => Self::BranchNotActive { status },
            CreateRefusal::MaxDepthExceeded { max_depth } => Self::MaxDepthExceeded { max_depth },
            CreateRefusal::BudgetExhausted { available } => Self::BudgetExhausted { available },
            CreateRefusal::PromptOverBudget { prompt_tokens, budget } => {
                Self::PromptOverBudget { prompt_tokens, budget }
            }
            CreateRefusal::Limited { limit, retry_after } => {
                Self::RateLimited { limit, retry_after }
            }
        }
    }
}

impl FoldError {
    /// The stable code clients see.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Invalid(_) => ErrorCode::InvalidArgument,
            Self::SessionNotFound => ErrorCode::SessionNotFound,
            Self::BranchNotFound => ErrorCode::BranchNotFound,
            Self::BranchNotActive { .. } => ErrorCode::BranchNotActive,
            Self::MaxDepthExceeded { .. } => ErrorCode::MaxDepthExceeded,
            Self::BudgetExhausted { .. } | Self::PromptOverBudget { .. } => {
                ErrorCode::BudgetExhausted
            }
            Self::RateLimited { .. } => ErrorCode::RateLimited,
            Self::ScrubbingFailed => ErrorCode::ScrubbingFailed,
            Self::Busy => ErrorCode::Busy,
            Self::GatewayRunBranch => ErrorCode::GatewayRunBranch,
            Self::ModelNotFound { .. } => ErrorCode::ModelNotFound,
            Self::MemoryNotFound => ErrorCode::MemoryNotFound,
            Self::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            Self::MemoryDisabled => ErrorCode::InvalidArgument,
            Self::Store(_) => ErrorCode::Internal,
        }
    }
}
