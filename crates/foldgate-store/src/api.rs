//! [`Store`], the one interface to the database.

use std::{fmt::Debug, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, Consumption, EndReason, Session, SessionId, Subject, TenantId, Tokens,
};

#[cfg(doc)]
use crate::ACTIVITY_RESOLUTION;
use crate::{
    AdminStore, BatchFinish, CallRecord, CallSummary, CreateRefusal, DueBranch, Finish, Finished,
    IdleSession, MemoryStore, MemoryVectors, ModelBill, NewBranch, NewStep, OutsideUsage, Prune,
    Registrations, Run, RunEnd, RunStep, StepWritten, StoreError, TreeEnd,
};

/// The folding store. See the crate documentation for its guarantees.
#[async_trait]
pub trait Store:
    MemoryStore + MemoryVectors + AdminStore + Registrations + Prune + Send + Sync + Debug
{
    /// Creates a branch: resolves its parent, checks ownership, depth, the
    /// limits and the parent's pool, lends the budget and inserts the branch
    /// as `active`, all in one transaction. Opens (or reopens) the session.
    async fn create_branch(
        &self,
        tenant: &TenantId,
        new: NewBranch,
    ) -> Result<Result<Branch, CreateRefusal>, StoreError>;

    async fn branch(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Branch>, StoreError>;

    async fn session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
    ) -> Result<Option<Session>, StoreError>;

    /// The session's active branch: the most recently created active branch
    /// that has no active child.
    async fn active_branch(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<Branch>, StoreError>;

    /// Active descendants of a branch, deepest first.
    async fn active_descendants(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Vec<BranchId>, StoreError>;

    /// Active branches of a session, deepest first.
    async fn active_in_session(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Vec<BranchId>, StoreError>;

    /// Charges tokens to an active branch, capped at what remains; records
    /// the 80% warning and exhaustion. `None` if the branch is not active.
    async fn consume(
        &self,
        tenant: &TenantId,
        id: BranchId,
        tokens: Tokens,
        at: DateTime<Utc>,
    ) -> Result<Option<Consumption>, StoreError>;

    /// Charges an upstream call's tokens (in + out) to a branch as
    /// [`Store::consume`] does, and records the call in the branch's trace,
    /// in one transaction. The call is recorded even if the branch is no
    /// longer active (then it is charged nothing and `None` is returned).
    async fn meter_call(
        &self,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<Option<Consumption>, StoreError>;

    /// What a branch's upstream calls add up to.
    async fn call_summary(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<CallSummary, StoreError>;

    /// A branch with what its upstream calls add up to, read in one
    /// statement (what [`Store::branch`] and [`Store::call_summary`] read).
    async fn branch_report(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Option<(Branch, CallSummary)>, StoreError>;

    /// Up to `limit` open sessions of a principal.
    async fn open_sessions_of(
        &self,
        tenant: &TenantId,
        owner: &Subject,
        limit: u32,
    ) -> Result<Vec<SessionId>, StoreError>;

    /// Adds to the usage outside branches of a tenant's session (`None`:
    /// calls that could not be tied to one session).
    async fn add_outside_usage(
        &self,
        tenant: &TenantId,
        session: Option<&SessionId>,
        usage: OutsideUsage,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Records that a tenant's session called these upstream tools (by the
    /// names agents see); one already recorded keeps its first use.
    async fn add_session_tools(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        tools: &[String],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// The upstream tools a principal's open sessions have called, by name,
    /// at most `limit` of them (the first used first).
    async fn session_tools_of(
        &self,
        tenant: &TenantId,
        owner: &Subject,
        limit: u32,
    ) -> Result<Vec<String>, StoreError>;

    /// The usage outside branches recorded for a tenant's session.
    async fn outside_usage(
        &self,
        tenant: &TenantId,
        session: Option<&SessionId>,
    ) -> Result<OutsideUsage, StoreError>;

    /// Ends an active branch that has no active children, and settles its
    /// pool with its parent's (the unspent part is refunded).
    async fn finish(
        &self,
        tenant: &TenantId,
        id: BranchId,
        finish: Finish,
    ) -> Result<Finished, StoreError>;

    /// Ends a branch as [`Store::finish`] does, after ending its active
    /// descendants, deepest first, with `child_reason`; all in one
    /// transaction (on Postgres, one statement). A child created under the
    /// tree meanwhile is ended too, up to a bound, after which the answer is
    /// [`Finished::HasActiveChildren`].
    async fn end_tree(
        &self,
        tenant: &TenantId,
        id: BranchId,
        finish: Finish,
        child_reason: EndReason,
    ) -> Result<TreeEnd, StoreError>;

    /// Ends, in one transaction, each branch of `batch` that is active and
    /// has no active child, and settles it with its parent, as
    /// [`Store::finish`] does. `batch` must list children before their
    /// parents (deepest first): a child's end releases its parent's loan, so
    /// a parent in the same batch ends after it. Returns the branches it
    /// ended; the others are left as they are.
    async fn finish_batch(&self, batch: &[BatchFinish]) -> Result<Vec<Branch>, StoreError>;

    /// Marks an open session ended, if none of its branches is active and,
    /// with `idle_since`, if it has had no activity since then (so that a
    /// session used again after the supervisor found it idle stays open).
    /// Activity is recorded to [`ACTIVITY_RESOLUTION`], which this allows
    /// for: a session is never taken for idle early. Returns whether it did.
    async fn end_session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
        idle_since: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError>;

    /// Fails every active branch of a session at once (`session_ended`), with
    /// the same pool and limit bookkeeping as [`Store::finish`]. The last
    /// resort when ending a session branch by branch ran out of time.
    async fn fail_session_branches(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
    ) -> Result<u64, StoreError>;

    /// Records activity on a session (it is not idle), to
    /// [`ACTIVITY_RESOLUTION`].
    async fn touch_session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Claims up to `limit` active branches whose deadline passed or whose
    /// budget ran out, deepest first, for `lease`: other replicas skip them
    /// until it expires.
    async fn claim_due_branches(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<DueBranch>, StoreError>;

    /// Claims up to `limit` open sessions with no active branch and no
    /// activity since `idle_since` (allowing for [`ACTIVITY_RESOLUTION`], as
    /// [`Store::end_session`] does), for `lease`.
    async fn claim_idle_sessions(
        &self,
        idle_since: DateTime<Utc>,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<IdleSession>, StoreError>;

    /// The earliest deadline of any active branch not claimed by a replica,
    /// to know when to wake up.
    async fn next_deadline(&self, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// A gateway-run branch's run, without its steps.
    async fn run(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Run>, StoreError>;

    /// A run's steps, in order.
    async fn run_steps(&self, tenant: &TenantId, id: BranchId) -> Result<Vec<RunStep>, StoreError>;

    /// Writes a run's next step, in one transaction, if `owner` still holds
    /// the run's lease and the step's number is the next one: a model step
    /// adds its usage to the run's and the tenant's model usage and sets the
    /// branch's spending to its context size ([`Ledger::measure`]), while
    /// the branch is active. Writes nothing and says so when the lease was
    /// lost or the step was already written.
    ///
    /// [`Ledger::measure`]: foldgate_domain::Ledger::measure
    async fn record_step(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        step: &NewStep,
    ) -> Result<StepWritten, StoreError>;

    /// Extends the lease `owner` holds on a running run until `until`.
    /// `false` if it no longer holds it (another replica took the run over,
    /// or the run is done).
    async fn renew_run_lease(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Marks a run done with the result its caller gets (JSON), if `owner`
    /// holds its lease, and records the tokens of its message as returned by
    /// the branch unless its end recorded them already (a branch ended from
    /// outside returned nothing itself); with `distill`, queues its
    /// distillation into lessons. `false` if `owner` does not hold it.
    async fn finish_run(
        &self,
        tenant: &TenantId,
        id: BranchId,
        end: &RunEnd<'_>,
    ) -> Result<bool, StoreError>;

    /// Takes over up to `limit` running runs whose lease lapsed before
    /// `now`: `owner` holds them until `until`, and each counts a resume.
    /// On Postgres with `FOR UPDATE SKIP LOCKED`, so two replicas never take
    /// the same run.
    async fn claim_lapsed_runs(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<(TenantId, BranchId)>, StoreError>;

    /// The runs `owner` holds whose branch is no longer active (ended from
    /// outside while the run worked), across tenants.
    async fn ended_runs(&self, owner: &str) -> Result<Vec<BranchId>, StoreError>;

    /// What a tenant was billed per model, by model name: over every run,
    /// and over the distillations of their lessons.
    async fn model_usage(&self, tenant: &TenantId) -> Result<Vec<ModelBill>, StoreError>;

    /// Tokens the depth-1 branches of a session handed back to the caller's
    /// own context when they returned.
    async fn session_returned_tokens(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Tokens, StoreError>;

    /// Active branches per tenant, from the counters the limits keep (one
    /// row read per tenant that ever had a branch), for gauges.
    async fn active_branches(&self) -> Result<Vec<(TenantId, u64)>, StoreError>;

    /// The connection pool's current state, for gauges. Reads no database.
    fn pool_usage(&self) -> PoolUsage;

    /// Whether the database answers and the schema is migrated.
    async fn ready(&self) -> Result<(), StoreError>;

    /// Closes the connection pool.
    async fn close(&self);
}

/// How busy a store's connection pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Open connections, idle or in use.
    pub size: u32,
    /// Open connections not in use.
    pub idle: u32,
    /// The most connections the pool opens.
    pub max: u32,
}
