//! Upstream calls: where each is metered, the charge, and the calls made outside branches.

use super::*;

impl FoldingService {
    /// Where an upstream call is metered: the branch the caller named
    /// (which must be theirs and active), or else the active branch of the
    /// caller's only open session; with no such branch, outside branches.
    pub async fn call_target(
        &self,
        who: &Principal,
        named: Option<BranchId>,
    ) -> Result<CallTarget, FoldError> {
        if let Some(id) = named {
            let branch = self.owned_branch(who, id).await?;
            if branch.kind == BranchKind::Gateway {
                return Err(FoldError::GatewayRunBranch);
            }
            if branch.status != BranchStatus::Active {
                return Err(FoldError::BranchNotActive { status: branch.status });
            }
            return Ok(CallTarget::Branch(Box::new(branch)));
        }
        let mut open = self.store.open_sessions_of(&who.tenant, &who.subject, 2).await?;
        if open.len() != 1 {
            return Ok(CallTarget::Outside(None));
        }
        let Some(session) = open.pop() else {
            return Ok(CallTarget::Outside(None));
        };
        Ok(match self.store.active_branch(&who.tenant, &session).await? {
            Some(branch) => CallTarget::Branch(Box::new(branch)),
            None => CallTarget::Outside(Some(session)),
        })
    }

    /// Charges an upstream call (its arguments and its result, as counted by
    /// the gateway) to a branch and records it in the branch's trace. A
    /// charge that uses up the budget force-returns the branch (`timeout`,
    /// `budget_exhausted`).
    pub async fn meter_call(
        &self,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<MeteredCall, FoldError> {
        let consumption = self.store.meter_call(tenant, id, call).await?;
        let Some(consumption) = consumption else {
            return Ok(MeteredCall { consumption: None, forced_return: false });
        };
        self.metrics.consumed(tenant, consumption.granted);
        if consumption.warning {
            tracing::warn!(
                %tenant, branch_id = %id, used = consumption.ledger.used,
                budget = consumption.ledger.budget, "branch has used 80% of its budget"
            );
        }
        let forced_return = consumption.exhausted
            && self.force_return(tenant, id, EndReason::BudgetExhausted).await?.is_some();
        Ok(MeteredCall { consumption: Some(consumption), forced_return })
    }

    /// Counts an upstream call that belonged to no branch. Kept in memory
    /// and written by [`FoldingService::flush_outside_usage`].
    pub fn record_outside(
        &self,
        tenant: &TenantId,
        session: Option<SessionId>,
        usage: OutsideUsage,
    ) {
        let mut book = self.outside.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        book.entry((tenant.clone(), session)).or_default().add(usage);
    }

    /// Writes the usage outside branches counted since the last flush.
    /// What cannot be written is kept for the next flush.
    pub async fn flush_outside_usage(&self) -> Result<(), FoldError> {
        let pending: Vec<_> = {
            let mut book = self.outside.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            book.drain().collect()
        };
        let now = self.clock.now();
        let mut failed = None;
        for ((tenant, session), usage) in pending {
            if failed.is_none() {
                match self.store.add_outside_usage(&tenant, session.as_ref(), usage, now).await {
                    Ok(()) => continue,
                    Err(e) => failed = Some(e),
                }
            }
            self.record_outside(&tenant, session, usage);
        }
        failed.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Usage outside branches for a principal's session, as last flushed
    /// plus what is still pending in this process.
    pub async fn outside_usage(
        &self,
        who: &Principal,
        session: &SessionId,
    ) -> Result<OutsideUsage, FoldError> {
        let mut usage = self.store.outside_usage(&who.tenant, Some(session)).await?;
        let book = self.outside.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pending) = book.get(&(who.tenant.clone(), Some(session.clone()))) {
            usage.add(*pending);
        }
        Ok(usage)
    }

    /// What a branch's upstream calls add up to.
    pub async fn call_summary(
        &self,
        who: &Principal,
        id: BranchId,
    ) -> Result<CallSummary, FoldError> {
        Ok(self.store.call_summary(&who.tenant, id).await?)
    }
}
