//! Persistence for context folding.
//!
//! The database is the source of truth: branch trees, token pools, limits and
//! deadlines all live here, so a crashed or restarted process loses nothing
//! and several replicas can share one Postgres. [`Store`] is the one
//! interface; [`PgStore`] (production, several replicas) and [`SqliteStore`]
//! (the zero-configuration default, one process) implement it.
//!
//! Every method takes the tenant first and every query filters by it, so one
//! tenant's ids are simply not found from another tenant. Every state change
//! is a single transaction whose transition is conditional on the branch
//! still being `active`: when a return, a deadline and a budget exhaustion
//! race, exactly one of them changes the row.

mod counters;
pub mod dialect;
mod error;
mod metrics;
mod ops;
mod postgres;
mod record;
mod run_queries;
mod runs;
mod sql_store;
mod sqlite;
mod store;
mod ts;
mod tx;

use std::{fmt::Debug, sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, BranchKind, BranchStatus, BudgetPolicy, BudgetRequest, Consumption,
    EndReason, LimitKind, Limits, ReturnTier, Session, SessionId, Subject, TenantId, Tokens,
};

pub use error::{ErrorKind, StoreError};
pub use postgres::{PgStore, Postgres};
pub use runs::{ModelUsage, NewRun, NewStep, Run, RunState, RunStep, StepKind, StepWritten};
pub use sqlite::{Sqlite, SqliteStore};
pub use store::SqlStore;

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
    pub created_at: DateTime<Utc>,
    pub deadline_at: DateTime<Utc>,
    pub rules: CreateRules,
    pub kind: BranchKind,
    pub return_tier: ReturnTier,
    /// For a gateway-run branch: the run, inserted with the branch.
    pub run: Option<NewRun>,
}

/// Why a create was refused. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub at: DateTime<Utc>,
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
            at,
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
}

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

/// How an upstream tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// The upstream answered with a result.
    Ok,
    /// The upstream answered with a tool error (`isError`) or a JSON-RPC error.
    ToolError,
    /// The upstream could not be reached, timed out or answered garbage.
    UpstreamError,
    /// The result overran the branch's budget and was cut at it.
    Truncated,
    /// The call was not forwarded: its arguments alone used up the budget,
    /// or its result could not be scrubbed.
    Refused,
}

impl CallOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ToolError => "tool_error",
            Self::UpstreamError => "upstream_error",
            Self::Truncated => "truncated",
            Self::Refused => "refused",
        }
    }
}

/// An upstream tool call made inside a branch: one line of its trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub upstream: String,
    pub tool: String,
    /// Tokens of the arguments.
    pub tokens_in: Tokens,
    /// Tokens of the result as the agent received it.
    pub tokens_out: Tokens,
    pub duration: Duration,
    pub outcome: CallOutcome,
    pub at: DateTime<Utc>,
}

impl CallRecord {
    /// What the call costs a branch: its arguments and its result.
    pub fn tokens(&self) -> Tokens {
        self.tokens_in.saturating_add(self.tokens_out)
    }

    /// What the agent receives of the result when the branch grants
    /// `granted` of [`CallRecord::tokens`] (nothing, if the branch is no
    /// longer active): a result that the grant does not cover is cut at what
    /// it covers after the arguments (`Truncated`). A call that produced no
    /// result (refused, or the upstream failed) is left as it is. The trace
    /// records the call this way.
    pub fn received(&self, granted: Tokens) -> (Tokens, CallOutcome) {
        match self.outcome {
            CallOutcome::Ok | CallOutcome::ToolError | CallOutcome::Truncated
                if granted < self.tokens() =>
            {
                (granted.saturating_sub(self.tokens_in), CallOutcome::Truncated)
            }
            _ => (self.tokens_out, self.outcome),
        }
    }
}

/// Calls of one upstream tool within a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCalls {
    pub upstream: String,
    pub tool: String,
    pub calls: u64,
    /// Tokens charged for them.
    pub tokens: Tokens,
}

/// What a branch's upstream calls add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallSummary {
    pub calls: u64,
    pub tokens_in: Tokens,
    pub tokens_out: Tokens,
    pub tokens_charged: Tokens,
    /// Calls that ended in a tool error, an upstream error or a refusal.
    pub errors: u64,
    pub truncated: u64,
    pub last_call_at: Option<DateTime<Utc>>,
    /// Per tool, most charged first.
    pub by_tool: Vec<ToolCalls>,
}

/// Upstream calls that belonged to no branch, added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutsideUsage {
    pub calls: u64,
    pub tokens_in: Tokens,
    pub tokens_out: Tokens,
}

impl OutsideUsage {
    pub fn add(&mut self, other: Self) {
        self.calls = self.calls.saturating_add(other.calls);
        self.tokens_in = self.tokens_in.saturating_add(other.tokens_in);
        self.tokens_out = self.tokens_out.saturating_add(other.tokens_out);
    }
}

/// The folding store. See the crate documentation for its guarantees.
#[async_trait]
pub trait Store: Send + Sync + Debug {
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
    /// outside returned nothing itself). `false` if `owner` does not hold it.
    async fn finish_run(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        outcome: &str,
        returned_tokens: Tokens,
        at: DateTime<Utc>,
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

    /// What a tenant was billed per model over every run, by model name.
    async fn model_usage(&self, tenant: &TenantId)
    -> Result<Vec<(String, ModelUsage)>, StoreError>;

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

/// Connection settings shared by both backends.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `postgres://…`, `postgresql://…`, or `sqlite:PATH` / `sqlite://PATH`.
    pub url: String,
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before failing.
    pub acquire_timeout: Duration,
    /// Postgres: whether the transaction that charges an upstream call to
    /// a branch waits for its commit to reach the disk. When `false`
    /// (`synchronous_commit = off` for that transaction alone) the charge
    /// survives a crash of the gateway, and only a crash of Postgres itself
    /// within its WAL writer's delay (≤ 3 × `wal_writer_delay`) can lose it.
    /// Branch creations and ends always wait for the disk.
    pub synchronous_metering: bool,
}

impl ConnectOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            synchronous_metering: false,
        }
    }
}

/// How fresh a session's recorded activity is kept. Activity is written only
/// over a record at least this old, so that a busy session is written about
/// once a second rather than on every metered call: each such write is a
/// new row version with new index entries. The queries for idle sessions
/// allow for it, so that no session is taken for idle early.
pub const ACTIVITY_RESOLUTION: Duration = Duration::from_secs(1);

/// The latest recorded activity that activity at `at` replaces (and so
/// the latest record of a session idle since `at`): [`ACTIVITY_RESOLUTION`]
/// before it.
pub(crate) fn activity_stale_before(at: DateTime<Utc>) -> DateTime<Utc> {
    let resolution = chrono::TimeDelta::from_std(ACTIVITY_RESOLUTION).unwrap_or_default();
    at.checked_sub_signed(resolution).unwrap_or(at)
}

/// A pooled connection idle for less than this is handed out without a
/// liveness check. sqlx checks every connection as it goes back to the pool,
/// so a check on the way out again only matters once the connection has sat
/// long enough for the server or the network to have dropped it; on a busy
/// gateway it would cost every query a second round trip.
const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// The pool settings both backends share.
pub(crate) fn pool_options<DB: sqlx::Database>(
    options: &ConnectOptions,
) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= CHECK_IDLE_AFTER {
                    // A failed check closes the connection; the pool hands
                    // out another one.
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else {
            Err(StoreError::UnsupportedUrl(redact_url(url)))
        }
    }
}

/// Connects to the database a URL names. With `migrate`, applies pending
/// migrations first. Records no metrics (see [`connect_with_meter`]).
pub async fn connect(
    options: &ConnectOptions,
    migrate: bool,
) -> Result<Arc<dyn Store>, StoreError> {
    connect_metered(options, migrate, None).await
}

/// [`connect`], and the store records the duration of every call into
/// `meter` (`foldgate.db.operation.duration`).
pub async fn connect_with_meter(
    options: &ConnectOptions,
    migrate: bool,
    meter: &opentelemetry::metrics::Meter,
) -> Result<Arc<dyn Store>, StoreError> {
    connect_metered(options, migrate, Some(meter)).await
}

async fn connect_metered(
    options: &ConnectOptions,
    migrate: bool,
    meter: Option<&opentelemetry::metrics::Meter>,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match Backend::of_url(&options.url)? {
        Backend::Postgres => {
            let mut store = PgStore::connect(options).await?;
            if migrate {
                store.migrate().await?;
            }
            if let Some(meter) = meter {
                store = store.with_metrics(meter);
            }
            Arc::new(store)
        }
        Backend::Sqlite => {
            let mut store = SqliteStore::connect(options).await?;
            if migrate {
                store.migrate().await?;
            }
            if let Some(meter) = meter {
                store = store.with_metrics(meter);
            }
            Arc::new(store)
        }
    })
}

/// Applies pending migrations to the database a URL names.
pub async fn migrate(options: &ConnectOptions) -> Result<(), StoreError> {
    let store = connect(options, true).await?;
    store.close().await;
    Ok(())
}

/// A URL with any password replaced, safe to print.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

/// Fails unless every migration this build knows is applied.
pub(crate) fn check_migrated(
    migrator: &sqlx::migrate::Migrator,
    applied: Option<i64>,
) -> Result<(), StoreError> {
    let latest = migrator.iter().map(|m| m.version).max();
    if latest.is_some() && applied < latest {
        return Err(StoreError::NotMigrated { applied, latest });
    }
    Ok(())
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
    fn a_call_is_received_as_far_as_its_grant_goes() {
        let call = |outcome| CallRecord {
            upstream: "files".into(),
            tool: "read".into(),
            tokens_in: 30,
            tokens_out: 70,
            duration: Duration::from_millis(1),
            outcome,
            at: DateTime::<Utc>::UNIX_EPOCH,
        };
        let ok = call(CallOutcome::Ok);
        assert_eq!(ok.received(100), (70, CallOutcome::Ok), "granted in full");
        assert_eq!(ok.received(1_000), (70, CallOutcome::Ok));
        assert_eq!(ok.received(99), (69, CallOutcome::Truncated));
        assert_eq!(ok.received(30), (0, CallOutcome::Truncated), "the arguments only");
        assert_eq!(ok.received(10), (0, CallOutcome::Truncated), "not even those");
        assert_eq!(call(CallOutcome::ToolError).received(50), (20, CallOutcome::Truncated));
        assert_eq!(call(CallOutcome::Truncated).received(50), (20, CallOutcome::Truncated));
        assert_eq!(call(CallOutcome::ToolError).received(100), (70, CallOutcome::ToolError));
        // No result to cut.
        let refused = CallRecord { tokens_out: 0, ..call(CallOutcome::Refused) };
        assert_eq!(refused.received(10), (0, CallOutcome::Refused));
        let failed = CallRecord { tokens_out: 0, ..call(CallOutcome::UpstreamError) };
        assert_eq!(failed.received(0), (0, CallOutcome::UpstreamError));
    }

    #[test]
    fn backends_by_url() {
        assert_eq!(Backend::of_url("postgres://h/db").unwrap(), Backend::Postgres);
        assert_eq!(Backend::of_url("postgresql://h/db").unwrap(), Backend::Postgres);
        assert_eq!(Backend::of_url("sqlite://foldgate.db").unwrap(), Backend::Sqlite);
        assert_eq!(Backend::of_url("sqlite::memory:").unwrap(), Backend::Sqlite);
        let err = Backend::of_url("mysql://u:pw@h/db").unwrap_err().to_string();
        assert!(!err.contains("pw"), "{err}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact_url("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }

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
