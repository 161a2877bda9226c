//! The lessons a new branch starts with, from the tenant's memory.

use foldgate_domain::{Branch, BranchKind, Principal, Tokens};

use super::FoldingService;
use crate::{Injection, MemoryBank};

impl FoldingService {
    /// The lessons for a new agent-run branch that got less than the
    /// budget it asked for (its parent could not lend it all), so those
    /// chosen before it existed may not fit: chosen again against the
    /// budget it got, never more than it has left (they cannot end it),
    /// and charged to it. A memory or a charge that fails leaves the
    /// branch without lessons, not the create failed.
    pub(super) async fn inject(
        &self,
        who: &Principal,
        memory: &MemoryBank,
        branch: &mut Branch,
        task: &str,
    ) -> Injection {
        let left = branch.ledger.budget.saturating_sub(branch.ledger.used).saturating_sub(1);
        let injection = lessons(who, memory, task, branch.ledger.budget, left).await;
        if injection.is_empty() {
            return injection;
        }
        let now = self.clock.now();
        match self.store.consume(&who.tenant, branch.id, injection.tokens, now).await {
            Ok(Some(consumption)) => {
                self.metrics.consumed(&who.tenant, consumption.granted);
                branch.ledger = consumption.ledger;
                memory.used(who, &injection, BranchKind::Agent);
                injection
            }
            // Ended meanwhile (its deadline or its session): nothing to inject into.
            Ok(None) => Injection::default(),
            Err(e) => {
                tracing::warn!(tenant = %who.tenant, branch_id = %branch.id, error = %e,
                    "no lessons were injected: charging them failed");
                Injection::default()
            }
        }
    }
}

/// The lessons for a branch about `task` with `budget` tokens. A memory
/// that fails leaves the branch without lessons, not without a branch.
pub(super) async fn lessons(
    who: &Principal,
    memory: &MemoryBank,
    task: &str,
    budget: Tokens,
    at_most: Tokens,
) -> Injection {
    memory.for_branch(who, task, budget, at_most).await.unwrap_or_else(|e| {
        tracing::warn!(tenant = %who.tenant, error = %e,
            "no lessons were injected: the memory failed");
        Injection::default()
    })
}
