//! Upstream calls: where each is metered, the charge, the calls made
//! outside branches, and the tools each session has called.

use std::collections::{BTreeSet, HashSet};

use foldgate_domain::Subject;

use super::*;

/// The most upstream tools `tools/list` shows as a principal's sessions'
/// own.
pub const MAX_SESSION_TOOLS: u32 = 256;
/// How many written (tenant, session, tool) triples a replica remembers, so
/// that a tool called again is not written again; past this it forgets
/// them all (and writes each once more, which changes nothing).
const REMEMBERED_SESSION_TOOLS: usize = 100_000;

/// The upstream tools sessions called since the last flush, and those
/// already written.
#[derive(Debug, Default)]
pub(super) struct SessionTools {
    pending: HashMap<(TenantId, Subject, SessionId), BTreeSet<String>>,
    written: HashSet<(TenantId, SessionId, String)>,
}

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

    /// Notes that a principal's session called an upstream tool (by the
    /// name agents see), for the tenant's `tools/list` when it lists tools
    /// by search. Kept in memory and written by
    /// [`FoldingService::flush_outside_usage`].
    pub fn note_session_tool(&self, who: &Principal, session: &SessionId, tool: &str) {
        let mut book = lock(&self.session_tools);
        let written = (who.tenant.clone(), session.clone(), tool.to_owned());
        if book.written.contains(&written) {
            return;
        }
        let key = (who.tenant.clone(), who.subject.clone(), session.clone());
        book.pending.entry(key).or_default().insert(tool.to_owned());
    }

    /// The upstream tools a principal's open sessions have called, the first
    /// used first: as written by every replica, then those this one noted and
    /// has not written yet. At most [`MAX_SESSION_TOOLS`].
    pub async fn session_tools(&self, who: &Principal) -> Result<Vec<String>, FoldError> {
        let mut tools =
            self.store.session_tools_of(&who.tenant, &who.subject, MAX_SESSION_TOOLS).await?;
        let book = lock(&self.session_tools);
        for ((tenant, subject, _), pending) in &book.pending {
            if tenant != &who.tenant || subject != &who.subject {
                continue;
            }
            for tool in pending {
                if !tools.contains(tool) {
                    tools.push(tool.clone());
                }
            }
        }
        tools.truncate(MAX_SESSION_TOOLS as usize);
        Ok(tools)
    }

    /// Writes the tools sessions called since the last flush. What cannot
    /// be written is kept for the next flush.
    async fn flush_session_tools(&self) -> Result<(), FoldError> {
        let pending: Vec<_> = lock(&self.session_tools).pending.drain().collect();
        let now = self.clock.now();
        let mut failed = None;
        for ((tenant, subject, session), tools) in pending {
            let list: Vec<String> = tools.iter().cloned().collect();
            if failed.is_none() {
                match self.store.add_session_tools(&tenant, &session, &list, now).await {
                    Ok(()) => {
                        let mut book = lock(&self.session_tools);
                        if book.written.len() + list.len() > REMEMBERED_SESSION_TOOLS {
                            book.written.clear();
                        }
                        for tool in list {
                            book.written.insert((tenant.clone(), session.clone(), tool));
                        }
                        continue;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            lock(&self.session_tools)
                .pending
                .entry((tenant, subject, session))
                .or_default()
                .extend(tools);
        }
        failed.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Writes the usage outside branches counted since the last flush, and
    /// the tools sessions called. What cannot be written is kept for the
    /// next flush.
    pub async fn flush_outside_usage(&self) -> Result<(), FoldError> {
        let tools = self.flush_session_tools().await;
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
        failed.map_or(tools, |e| Err(e.into()))
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
