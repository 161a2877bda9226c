//! What the operations on branches take and give back: a branch to
//! create and why one is refused, how a branch ends and what ending it did,
//! and the work the supervisor claims.

use std::time::Duration;

use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, BranchKind, BranchStatus, BudgetPolicy, BudgetRequest, EndReason, LimitKind,
    Limits, ReturnTier, SessionId, Subject, TenantId, Tokens,
};

#[cfg(doc)]
use crate::Store;
use crate::{NewRun, StoreError};

/// Where a new branch attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentChoice {
    /// The session's active branch (the most recent active branch with no
    /// active child), or the session root if there is none.
    Active,
    /// A branch the client named, to fan out siblings.
    Explicit(BranchId),
}

/// The rules a create is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateRules {
    pub budget: BudgetPolicy,
    pub max_depth: u32,
    pub limits: Limits,
}

/// A branch to create, already validated by the domain types.
#[derive(Debug, Clone)]
pub struct NewBranch {
    pub id: BranchId,
    pub session_id: SessionId,
    pub owner: Subject,
    pub parent: ParentChoice,
    pub description: String,
    pub prompt: String,
    pub budget: BudgetRequest,
    /// Tokens of the prompt, charged to the branch at creation.
    pub prompt_tokens: Tokens,
    /// Tokens of the lessons chosen for an agent-run branch against the
    /// budget it asked for: charged with the prompt when they fit what it
    /// was granted ([`BudgetRequest::fits_lessons`]); 0 for none.
    pub lessons_tokens: Tokens,
    pub created_at: DateTime<Utc>,
    pub deadline_at: DateTime<Utc>,
    pub rules: CreateRules,
    pub kind: BranchKind,
    pub return_tier: ReturnTier,
    /// For a gateway-run branch: the run, inserted with the branch.
    pub run: Option<NewRun>,
}

/// Why a create was refused. Nothing was written.
///
/// [`CreateRefusalKind`] is the variant alone; its `VARIANTS` lists every
/// kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumDiscriminants)]
#[strum_discriminants(name(CreateRefusalKind), derive(strum::VariantArray))]
pub enum CreateRefusal {
    /// The session belongs to another subject of the tenant.
    SessionNotFound,
    /// The named parent does not exist for this principal and session.
    ParentNotFound,
    /// The named parent is run by the gateway: nothing nests under it.
    ParentIsGatewayRun,
    /// The named parent has already ended.
    ParentNotActive {
        status: BranchStatus,
    },
    MaxDepthExceeded {
        max_depth: u32,
    },
    /// The parent cannot give `min_branch_budget`.
    BudgetExhausted {
        available: Tokens,
    },
    /// The prompt alone would use up the branch's budget.
    PromptOverBudget {
        prompt_tokens: Tokens,
        budget: Tokens,
    },
    Limited {
        limit: LimitKind,
        retry_after: Duration,
    },
}

/// How a branch is being ended.
#[derive(Debug, Clone)]
pub struct Finish {
    pub status: BranchStatus,
    pub reason: Option<EndReason>,
    /// The scrubbed return message, for returns by the agent.
    pub result: Option<String>,
    /// Tokens of the return message, charged (up to what remains) with the
    /// transition.
    pub result_tokens: Tokens,
    /// Tokens of the return message handed to the parent, recorded with
    /// the branch. A gateway-run branch's finding is already in its context
    /// as its model counted it, so it is recorded here and not charged.
    pub returned_tokens: Option<Tokens>,
    /// Queue the message to be kept as a lesson (`extract_memory`): written
    /// by the statement that ends the branch, so with the return or not at
    /// all, and only by the return that ended it.
    pub extract: bool,
    pub at: DateTime<Utc>,
    /// The agent returning the branch, checked by [`Store::end_tree`]
    /// before anything changes: another owner's branch is not found, and a
    /// gateway-run branch is refused ([`Finished::GatewayRun`]). `None` for
    /// the ends the gateway makes itself.
    pub by: Option<Subject>,
}

impl Finish {
    /// A forced end (deadline, budget, parent returning, session ended):
    /// no message.
    pub fn forced(reason: EndReason, at: DateTime<Utc>) -> Self {
        Self {
            status: reason.status(),
            reason: Some(reason),
            result: None,
            result_tokens: 0,
            returned_tokens: None,
            extract: false,
            at,
            by: None,
        }
    }
}

/// One branch of [`Store::finish_batch`].
#[derive(Debug, Clone)]
pub struct BatchFinish {
    pub tenant: TenantId,
    pub id: BranchId,
    pub finish: Finish,
}

/// What [`Store::finish`] did.
#[derive(Debug, Clone)]
pub enum Finished {
    /// The transition happened; the branch as it now is.
    Done(Box<Branch>),
    /// No such branch for this tenant.
    NotFound,
    /// The branch had already ended: another transition won.
    NotActive(BranchStatus),
    /// A child became active after the caller cleaned up; clean up again.
    HasActiveChildren,
    /// An agent tried to return a gateway-run branch (see [`Finish::by`]).
    GatewayRun,
}

/// What [`Store::end_tree`] did: the branch's own end, and the active
/// descendants it ended first (deepest first).
#[derive(Debug, Clone)]
pub struct TreeEnd {
    pub outcome: Finished,
    pub children: Vec<Branch>,
}

/// How often [`Store::end_tree`] looks again for descendants when children
/// keep being created under the branch it is ending, before it answers
/// [`Finished::HasActiveChildren`].
pub(crate) const CLEANUP_ROUNDS: u8 = 16;

/// A branch that the supervisor must force-return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueBranch {
    pub tenant: TenantId,
    pub id: BranchId,
    pub depth: u32,
    /// Budget exhaustion was recorded but the forced return did not happen
    /// (the process stopped in between); otherwise the deadline passed.
    pub reason: EndReason,
}

/// A session the supervisor must end for being idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleSession {
    pub tenant: TenantId,
    pub id: SessionId,
}

pub(crate) fn due_branch(
    tenant: String,
    id: uuid::Uuid,
    depth: i32,
    exhausted: bool,
) -> Result<DueBranch, StoreError> {
    Ok(DueBranch {
        tenant: TenantId::parse(&tenant).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        id: BranchId::from_uuid(id),
        depth: u32::try_from(depth).map_err(|_| StoreError::Corrupt(format!("depth {depth}")))?,
        reason: if exhausted { EndReason::BudgetExhausted } else { EndReason::DeadlineExceeded },
    })
}

pub(crate) fn idle_session(tenant: &str, id: &str) -> Result<IdleSession, StoreError> {
    let corrupt = |e: foldgate_domain::InvalidInput| StoreError::Corrupt(e.to_string());
    Ok(IdleSession {
        tenant: TenantId::parse(tenant).map_err(corrupt)?,
        id: SessionId::parse(id).map_err(corrupt)?,
    })
}

/// Seconds to wait, rounded up, at least one.
pub(crate) fn retry_after(from: DateTime<Utc>, until: DateTime<Utc>) -> Duration {
    let ms = (until - from).num_milliseconds().max(0);
    let secs = u64::try_from(ms).unwrap_or(0).div_ceil(1000).max(1);
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up() {
        let t = DateTime::<Utc>::UNIX_EPOCH;
        assert_eq!(retry_after(t, t + chrono::Duration::milliseconds(1)), Duration::from_secs(1));
        assert_eq!(
            retry_after(t, t + chrono::Duration::milliseconds(1001)),
            Duration::from_secs(2)
        );
        assert_eq!(retry_after(t, t - chrono::Duration::seconds(3)), Duration::from_secs(1));
    }
}
