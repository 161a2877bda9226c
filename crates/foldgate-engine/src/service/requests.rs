//! What the use cases take and give back.

use super::*;

/// A validated `branch_create`.
#[derive(Debug, Clone)]
pub struct CreateBranch {
    pub session_id: SessionId,
    pub description: Description,
    pub prompt: Prompt,
    pub budget: BudgetRequest,
    pub timeout: TimeoutRequest,
    pub parent: Option<BranchId>,
    pub return_tier: ReturnTier,
    /// Whether lessons from the tenant's memory are injected; `None`: as
    /// the memory's `inject_by_default` says.
    pub inject_memories: Option<bool>,
}

impl CreateBranch {
    /// Parses raw tool arguments; the error names the offending field.
    #[expect(clippy::too_many_arguments, reason = "one per tool argument, each named")]
    pub fn parse(
        config: &FoldingConfig,
        session_id: &str,
        description: &str,
        prompt: Option<&str>,
        budget: Option<i64>,
        timeout_seconds: Option<i64>,
        parent_branch_id: Option<&str>,
        return_tier: Option<&str>,
    ) -> Result<Self, foldgate_domain::InvalidInput> {
        Ok(Self {
            return_tier: ReturnTier::parse(return_tier)?,
            session_id: SessionId::parse(session_id)?,
            description: Description::parse(description)?,
            prompt: Prompt::parse(prompt.unwrap_or_default())?,
            budget: BudgetRequest::parse(budget, &config.budget)?,
            timeout: TimeoutRequest::parse(timeout_seconds, &config.timeout)?,
            parent: parent_branch_id
                .map(|id| {
                    BranchId::parse(id).map_err(|mut e| {
                        e.field = "parent_branch_id";
                        e
                    })
                })
                .transpose()?,
            inject_memories: None,
        })
    }
}

/// A validated `branch_return`.
#[derive(Debug, Clone)]
pub struct ReturnBranch {
    pub branch_id: BranchId,
    pub message: Message,
    pub outcome: Outcome,
    /// Keep the (scrubbed) message as a lesson (`extract_memory`): queued
    /// with the return when the memory is on, ignored when it is off.
    pub extract_memory: bool,
}

/// What `branch_status` asks about.
#[derive(Debug, Clone)]
pub enum StatusQuery {
    Branch(BranchId),
    /// The session's active branch.
    Session(SessionId),
}

/// A branch that was created.
#[derive(Debug, Clone)]
pub struct Created {
    pub branch: Branch,
    /// The lessons injected into the branch (charged to it, unless the
    /// gateway runs it: then the model's own count covers them).
    pub injection: Injection,
    /// The request asked for more than it got (cap or parent's remainder).
    pub budget_requested: Tokens,
}

/// A branch that was returned.
#[derive(Debug, Clone)]
pub struct Returned {
    pub branch: Branch,
    /// The scrubbed message, as stored and as given to the parent.
    pub message: String,
    pub redactions: u64,
    /// Active descendants that were force-returned first, deepest first.
    pub children_ended: Vec<BranchId>,
    /// Tokens of the message handed to the parent.
    pub tokens_returned: Tokens,
    /// The message was queued, with the return, to be kept as a lesson.
    pub memory_queued: bool,
}

impl Returned {
    /// How much smaller the parent's share is than what the branch consumed:
    /// `1 - tokens_returned / tokens_used` (0 when nothing was consumed).
    pub fn compression_ratio(&self) -> f64 {
        let used = self.branch.ledger.used;
        if used == 0 {
            return 0.0;
        }
        #[allow(clippy::cast_precision_loss)] // token counts are far below 2^52
        let ratio = 1.0 - self.tokens_returned as f64 / used as f64;
        ratio.max(0.0)
    }
}

/// Where an upstream tool call is metered.
#[derive(Debug, Clone)]
pub enum CallTarget {
    /// Inside this active branch.
    Branch(Box<Branch>),
    /// Outside any branch; counted for the session when there is one.
    Outside(Option<SessionId>),
}

/// An upstream call charged to a branch.
#[derive(Debug, Clone, Copy)]
pub struct MeteredCall {
    /// `None` if the branch had ended before the call finished (it was
    /// recorded, but charged nothing).
    pub consumption: Option<Consumption>,
    /// The call used up the budget and the branch was force-returned.
    pub forced_return: bool,
}

/// Tokens charged to a branch.
#[derive(Debug, Clone, Copy)]
pub struct Consumed {
    pub consumption: Consumption,
    /// The charge used up the budget and the branch was force-returned.
    pub forced_return: bool,
}

/// A session that was ended.
#[derive(Debug, Clone, Copy)]
pub struct SessionEnded {
    /// Branches force-returned.
    pub branches_ended: u64,
    /// Ending branch by branch ran out of time and the rest were failed in
    /// one transaction.
    pub bulk_failed: bool,
    /// The session is now ended. `false` if it was used again meanwhile (a
    /// new branch, or activity after it was found idle): it stays open.
    pub session_ended: bool,
}
