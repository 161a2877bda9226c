//! The lessons a new branch starts with, from the tenant's memory.

use foldgate_domain::{Branch, BranchKind, EndReason, Principal, Tokens};

use super::FoldingService;
use crate::{FoldError, Injection, MemoryBank};

impl FoldingService {
    /// The lessons for a new agent-run branch, chosen against the budget
    /// it got and charged to it.
    pub(super) async fn inject(
        &self,
        who: &Principal,
        memory: &MemoryBank,
        branch: &mut Branch,
        task: &str,
    ) -> Result<Injection, FoldError> {
        let injection = lessons(who, memory, task, branch.ledger.budget).await;
        if injection.is_empty() {
            return Ok(injection);
        }
        let now = self.clock.now();
        let Some(consumption) =
            self.store.consume(&who.tenant, branch.id, injection.tokens, now).await?
        else {
            // Ended meanwhile (its deadline or its session): nothing to inject into.
            return Ok(Injection::default());
        };
        self.metrics.consumed(&who.tenant, consumption.granted);
        branch.ledger = consumption.ledger;
        if consumption.exhausted {
            self.force_return(&who.tenant, branch.id, EndReason::BudgetExhausted).await?;
        }
        memory.used(who, &injection, BranchKind::Agent);
        Ok(injection)
    }
}

/// The lessons for a branch about `task` with `budget` tokens. A memory
/// that fails leaves the branch without lessons, not without a branch.
pub(super) async fn lessons(
    who: &Principal,
    memory: &MemoryBank,
    task: &str,
    budget: Tokens,
) -> Injection {
    memory.for_branch(who, task, budget).await.unwrap_or_else(|e| {
        tracing::warn!(tenant = %who.tenant, error = %e,
            "no lessons were injected: the memory failed");
        Injection::default()
    })
}
