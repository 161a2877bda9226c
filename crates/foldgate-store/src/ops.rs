//! The multi-step operations, written once for both backends.
//!
//! Each is a method of [`Tx`], runs inside that one transaction (`SELECT …
//! FOR UPDATE` row locks on Postgres, `BEGIN IMMEDIATE` on SQLite) and
//! reaches the database only through `Tx`'s statements, in `tx.rs`. Rows
//! are always locked in the same order — branch rows deepest first, then the
//! session, then the tenant's and the deployment's counters — so concurrent
//! operations never deadlock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, BranchKind, BranchStatus, Consumption, EndReason, Ledger, LimitKind,
    SessionId, SessionStatus, TenantId, Tokens,
};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use crate::{
    BatchFinish, CallRecord, CreateRefusal, Finish, Finished, NewBranch, ParentChoice, StoreError,
    TreeEnd,
    dialect::{Dialect, Param, Value},
    record::{BranchRow, db_tokens, ledger},
    retry_after,
    ts::Ts,
    tx::Tx,
};

/// How often an implicit parent may end under us before we give up.
const PARENT_RESOLUTION_ATTEMPTS: usize = 8;
/// The sliding window of the per-session creation rate.
pub(crate) const RATE_WINDOW: chrono::Duration = chrono::Duration::seconds(60);
/// What we tell a client refused by a tenant or deployment concurrency limit:
/// we cannot know when another branch ends, so ask it to try again soon.
pub(crate) const SLOT_RETRY_AFTER: Duration = Duration::from_secs(1);

impl<D: Dialect> Tx<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    for<'a> &'a str: Encode<'a, D::DB> + Type<D::DB> + ColumnIndex<<D::DB as Database>::Row>,
    usize: ColumnIndex<<D::DB as Database>::Row>,
    Ts: Param<D::DB>,
    Option<Ts>: Param<D::DB>,
    for<'a> Option<&'a str>: Encode<'a, D::DB> + Type<D::DB>,
    Option<String>: Param<D::DB>,
    Option<i64>: Param<D::DB>,
    Option<Uuid>: Param<D::DB>,
    String: Value<D::DB>,
    i64: Value<D::DB>,
    i32: Value<D::DB>,
    bool: Value<D::DB>,
    Uuid: Value<D::DB>,
    DateTime<Utc>: Value<D::DB>,
{
    pub(crate) async fn create(
        &mut self,
        tenant: &TenantId,
        new: &NewBranch,
    ) -> Result<Result<Branch, CreateRefusal>, StoreError> {
        let rules = &new.rules;
        let at = new.created_at;
        // Checked without a lock first: inserting into an existing, busy session
        // would wait on its row before the parent is locked.
        if !self.session_exists(tenant, &new.session_id).await? {
            let budget = rules.budget.session_budget;
            self.insert_session_if_absent(tenant, &new.session_id, &new.owner, budget, at).await?;
        }

        // The parent branch is locked before the session (see the module docs).
        let parent = match new.parent {
            ParentChoice::Explicit(id) => {
                let Some(row) = self.lock_branch(tenant, id.as_uuid()).await? else {
                    return Ok(Err(CreateRefusal::ParentNotFound));
                };
                if row.session_id != new.session_id.as_str() || row.owner_sub != new.owner.as_str()
                {
                    return Ok(Err(CreateRefusal::ParentNotFound));
                }
                if row.kind != BranchKind::Agent.as_str() {
                    return Ok(Err(CreateRefusal::ParentIsGatewayRun));
                }
                Some(row)
            }
            ParentChoice::Active => self.lock_active_branch(tenant, &new.session_id).await?,
        };
        if let Some(row) = &parent {
            if row.status != BranchStatus::Active.as_str() {
                let status = row.status.parse().map_err(StoreError::Corrupt)?;
                return Ok(Err(CreateRefusal::ParentNotActive { status }));
            }
            // A parent past its deadline or out of budget is about to be
            // force-returned; a child would die with it.
            if row.deadline_at <= at || row.exhausted_at.is_some() {
                return Ok(Err(CreateRefusal::ParentNotActive { status: BranchStatus::Timeout }));
            }
        }

        let session = self
            .lock_session(tenant, &new.session_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt("session row missing after insert".into()))?;
        if session.owner_sub != new.owner.as_str() {
            return Ok(Err(CreateRefusal::SessionNotFound));
        }
        let mut root = ledger(session.budget, session.used, session.reserved)?;
        if session.status == SessionStatus::Ended.as_str() {
            self.open_session(tenant, &new.session_id, rules.budget.session_budget, at).await?;
            root = Ledger::new(rules.budget.session_budget);
        } else {
            self.touch_session(tenant, new.session_id.as_str(), at).await?;
        }

        let depth = parent.as_ref().map_or(1, |p| p.depth.saturating_add(1));
        if u32::try_from(depth).unwrap_or(u32::MAX) > rules.max_depth {
            return Ok(Err(CreateRefusal::MaxDepthExceeded { max_depth: rules.max_depth }));
        }

        let load = self.session_load(tenant, &new.session_id, at - RATE_WINDOW).await?;
        if load.active >= i64::from(rules.limits.max_active_per_session) {
            let until = load.earliest_deadline.unwrap_or(at);
            return Ok(Err(CreateRefusal::Limited {
                limit: LimitKind::SessionActive,
                retry_after: retry_after(at, until),
            }));
        }
        if load.recent >= i64::from(rules.limits.creations_per_minute) {
            let until = load.oldest_recent.unwrap_or(at) + RATE_WINDOW;
            return Ok(Err(CreateRefusal::Limited {
                limit: LimitKind::SessionCreationRate,
                retry_after: retry_after(at, until),
            }));
        }

        let pool = match &parent {
            Some(p) => ledger(p.budget, p.used, p.reserved)?,
            None => root,
        };
        let granted = match pool.allocate(new.budget, rules.budget.min_branch_budget) {
            Ok(allocation) => allocation.granted,
            Err(available) => return Ok(Err(CreateRefusal::BudgetExhausted { available })),
        };
        if new.prompt_tokens >= granted {
            return Ok(Err(CreateRefusal::PromptOverBudget {
                prompt_tokens: new.prompt_tokens,
                budget: granted,
            }));
        }

        let parent_id = parent.as_ref().map(|p| p.id);
        self.lend(tenant, new.session_id.as_str(), parent_id, db_tokens(granted)).await?;
        let lessons = if new.budget.fits_lessons(granted, new.prompt_tokens, new.lessons_tokens) {
            new.lessons_tokens
        } else {
            0
        };
        let charge = Ledger::new(granted).consume(new.prompt_tokens + lessons, false);
        let row = BranchRow {
            id: new.id.as_uuid(),
            tenant_id: tenant.as_str().to_owned(),
            session_id: new.session_id.as_str().to_owned(),
            owner_sub: new.owner.as_str().to_owned(),
            parent_id,
            depth,
            description: new.description.clone(),
            prompt: new.prompt.clone(),
            budget: db_tokens(granted),
            used: db_tokens(charge.ledger.used),
            reserved: 0,
            status: BranchStatus::Active.as_str().to_owned(),
            reason: None,
            created_at: at,
            // A child never outlives its parent.
            deadline_at: parent
                .as_ref()
                .map_or(new.deadline_at, |p| new.deadline_at.min(p.deadline_at)),
            completed_at: None,
            warned_at: charge.warning.then_some(at),
            exhausted_at: None,
            result: None,
            kind: new.kind.as_str().to_owned(),
            return_tier: new.return_tier.as_str().to_owned(),
            returned_tokens: None,
        };
        self.insert_branch(&row).await?;
        if let Some(run) = &new.run {
            self.insert_run(tenant, row.id, run, at).await?;
        }

        // The counters are hot rows shared by a tenant and by the whole
        // deployment: they are locked last, for the shortest time.
        if let Some(limit) = self.take_slot(tenant, &rules.limits).await? {
            return Ok(Err(CreateRefusal::Limited { limit, retry_after: SLOT_RETRY_AFTER }));
        }
        Ok(Ok(row.try_into()?))
    }

    /// Finds and locks the session's active branch (the most recent active
    /// agent-run branch with no active agent-run child: a gateway-run child runs
    /// beside its parent's agent, which goes on working in the parent). Between
    /// finding it and locking it, it may end or gain a child (another create
    /// got there first); then look again.
    async fn lock_active_branch(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<BranchRow>, StoreError> {
        for _ in 0..PARENT_RESOLUTION_ATTEMPTS {
            let Some(id) = self.active_branch_id(tenant, session).await? else {
                return Ok(None);
            };
            if let Some(row) = self.lock_branch(tenant, id).await?
                && row.status == BranchStatus::Active.as_str()
                && self.active_branch_id(tenant, session).await? == Some(id)
            {
                return Ok(Some(row));
            }
        }
        Err(StoreError::Contended)
    }

    pub(crate) async fn finish(
        &mut self,
        tenant: &TenantId,
        id: BranchId,
        finish: &Finish,
    ) -> Result<Finished, StoreError> {
        let Some(row) = self.end_branch(tenant, id.as_uuid(), finish).await? else {
            return Ok(match self.lock_branch(tenant, id.as_uuid()).await? {
                None => Finished::NotFound,
                Some(row) if row.status == BranchStatus::Active.as_str() => {
                    Finished::HasActiveChildren
                }
                Some(row) => Finished::NotActive(row.status.parse().map_err(StoreError::Corrupt)?),
            });
        };
        self.settle(tenant, &row.session_id, row.parent_id, row.budget, row.used, finish.at)
            .await?;
        self.touch_session(tenant, &row.session_id, finish.at).await?;
        self.release_slots(&[tenant]).await?;
        Ok(Finished::Done(Box::new(row.try_into()?)))
    }

    /// Ends a branch after its active descendants, deepest first (see
    /// [`crate::Store::end_tree`]). The transaction holds the database's
    /// write lock (SQLite), so no child appears meanwhile: one round.
    pub(crate) async fn end_tree(
        &mut self,
        tenant: &TenantId,
        id: BranchId,
        finish: &Finish,
        child_reason: EndReason,
    ) -> Result<TreeEnd, StoreError> {
        if let Some(owner) = &finish.by {
            // Owner and kind never change: read before anything is locked.
            let refused = match self.lock_branch(tenant, id.as_uuid()).await? {
                Some(row) if row.owner_sub != owner.as_str() => Some(Finished::NotFound),
                None => Some(Finished::NotFound),
                Some(row) if row.kind == BranchKind::Gateway.as_str() => Some(Finished::GatewayRun),
                Some(_) => None,
            };
            if let Some(outcome) = refused {
                return Ok(TreeEnd { outcome, children: Vec::new() });
            }
        }
        let mut children = Vec::new();
        let child_finish = Finish::forced(child_reason, finish.at);
        for child in self.active_descendants(tenant, id).await? {
            if let Finished::Done(ended) =
                self.finish(tenant, BranchId::from_uuid(child), &child_finish).await?
            {
                children.push(*ended);
            }
        }
        let outcome = self.finish(tenant, id, finish).await?;
        Ok(TreeEnd { outcome, children })
    }

    /// Ends a batch of branches in one transaction (see
    /// [`crate::Store::finish_batch`]). Each kind of row is locked in a block,
    /// in the module's order: the branches and their parent branches first (in
    /// the batch's order, deepest first), then the sessions (sorted), then the
    /// counters.
    pub(crate) async fn finish_batch(
        &mut self,
        batch: &[BatchFinish],
    ) -> Result<Vec<Branch>, StoreError> {
        let mut ended = Vec::with_capacity(batch.len());
        for item in batch {
            let Some(row) = self.end_branch(&item.tenant, item.id.as_uuid(), &item.finish).await?
            else {
                continue;
            };
            if row.parent_id.is_some() {
                let at = item.finish.at;
                self.settle(&item.tenant, &row.session_id, row.parent_id, row.budget, row.used, at)
                    .await?;
            }
            ended.push((item, row));
        }
        let mut by_session: Vec<&(&BatchFinish, BranchRow)> = ended.iter().collect();
        by_session.sort_by(|(a, ra), (b, rb)| {
            (a.tenant.as_str(), &ra.session_id).cmp(&(b.tenant.as_str(), &rb.session_id))
        });
        for (item, row) in by_session {
            let at = item.finish.at;
            if row.parent_id.is_none() {
                self.settle(&item.tenant, &row.session_id, None, row.budget, row.used, at).await?;
            }
            self.touch_session(&item.tenant, &row.session_id, at).await?;
        }
        let mut tenants: Vec<&TenantId> = ended.iter().map(|(item, _)| &item.tenant).collect();
        tenants.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        self.release_slots(&tenants).await?;
        ended.into_iter().map(|(_, row)| Branch::try_from(row)).collect()
    }

    pub(crate) async fn consume(
        &mut self,
        tenant: &TenantId,
        id: BranchId,
        tokens: Tokens,
        at: DateTime<Utc>,
    ) -> Result<Option<Consumption>, StoreError> {
        let Some(row) = self.lock_active(tenant, id).await? else {
            return Ok(None);
        };
        self.charge(tenant, &row, tokens, at).await.map(Some)
    }

    /// Charges an upstream call to a branch and records it in the branch's
    /// trace as the agent receives it ([`CallRecord::received`]). A branch that
    /// is not active (anymore) is charged nothing, and its result is received
    /// as nothing, but the call is still recorded.
    pub(crate) async fn meter_call(
        &mut self,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<Option<Consumption>, StoreError> {
        let row = self.lock_active(tenant, id).await?;
        let charge = match &row {
            Some(row) => Some(self.charge(tenant, row, call.tokens(), call.at).await?),
            None => None,
        };
        let granted = charge.map_or(0, |c| c.granted);
        let (tokens_out, outcome) = call.received(granted);
        let received = CallRecord { tokens_out, outcome, ..call.clone() };
        self.insert_call(tenant, id.as_uuid(), &received, granted).await?;
        Ok(charge)
    }

    /// Charges a locked, active branch: its ledger, and its session's activity.
    async fn charge(
        &mut self,
        tenant: &TenantId,
        row: &BranchRow,
        tokens: Tokens,
        at: DateTime<Utc>,
    ) -> Result<Consumption, StoreError> {
        let charge =
            ledger(row.budget, row.used, row.reserved)?.consume(tokens, row.warned_at.is_some());
        // Nothing to write when nothing was granted and nothing ran out.
        if charge.granted > 0 || charge.exhausted {
            let warned_at = charge.warning.then_some(at);
            let exhausted_at = charge.exhausted.then_some(at);
            let used = db_tokens(charge.ledger.used);
            self.record_consumption(tenant, row.id, used, warned_at, exhausted_at).await?;
        }
        // Tool traffic in a branch is activity in its session (branch rows are
        // locked before the session's, so this keeps the lock order).
        self.touch_session(tenant, &row.session_id, at).await?;
        Ok(charge)
    }

    /// A branch, locked, if it exists and is active.
    async fn lock_active(
        &mut self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Option<BranchRow>, StoreError> {
        let row = self.lock_branch(tenant, id.as_uuid()).await?;
        Ok(row.filter(|row| row.status == BranchStatus::Active.as_str()))
    }

    /// Fails every active branch of a session, deepest first, in one
    /// transaction. Returns how many it ended.
    pub(crate) async fn fail_session_branches(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
        at: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let finish = Finish::forced(EndReason::SessionEnded, at);
        let mut ended = 0;
        // Lock every branch first: ending them takes the session and counter
        // rows, which must come after all branch rows (see the module docs).
        for id in self.lock_active_in_session(tenant, session).await? {
            if let Finished::Done(_) = self.finish(tenant, BranchId::from_uuid(id), &finish).await?
            {
                ended += 1;
            }
        }
        Ok(ended)
    }
}
