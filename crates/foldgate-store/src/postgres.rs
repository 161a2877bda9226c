//! The Postgres store: production, and the only backend for more than one
//! replica. Row locks (`FOR UPDATE`) serialise the operations on one tree;
//! the supervisor claims work with `FOR UPDATE SKIP LOCKED`, so replicas never
//! fire the same deadline twice.

use foldgate_domain::{Branch, BranchId, Consumption, EndReason, TenantId};
use sqlx::{PgPool, Row, postgres::PgConnectOptions};
use uuid::Uuid;

use crate::{
    BatchFinish, CallRecord, ConnectOptions, CreateRefusal, Finish, NewBranch, StoreError, TreeEnd,
    dialect::{Dialect, Sql},
    record::{db_tokens, ledger},
    store::SqlStore,
    ts::Ts,
    tx::bind_call,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// The Postgres dialect.
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

/// The Postgres store.
pub type PgStore = SqlStore<Postgres>;

impl SqlStore<Postgres> {
    pub async fn connect(options: &ConnectOptions) -> Result<Self, StoreError> {
        let connect: PgConnectOptions = options.url.expose().parse()?;
        Self::connect_with(connect, options).await
    }

    /// Connects with prepared options (tests use this to pick a schema).
    pub async fn connect_with(
        connect: PgConnectOptions,
        options: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        let pool: PgPool = crate::pool_options::<sqlx::Postgres>(options)
            .connect_with(connect.application_name("foldgate"))
            .await?;
        Ok(Self::new(pool, options.synchronous_metering))
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }
}

impl Dialect for Postgres {
    type DB = sqlx::Postgres;

    const SYSTEM: &'static str = "postgresql";

    fn migrator() -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    fn pick(statement: &Sql) -> &'static str {
        statement.postgres
    }

    async fn begin(
        pool: &PgPool,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        pool.begin().await
    }

    /// Postgres aborted the transaction to break a deadlock or a
    /// serialisation conflict.
    fn is_retryable(error: &StoreError) -> bool {
        // 40001 serialization_failure, 40P01 deadlock_detected.
        error.database_code().is_some_and(|code| code == "40001" || code == "40P01")
    }

    /// Creates a branch in one statement (see [`crate::pg_fold`]).
    async fn create_branch(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        new: &NewBranch,
    ) -> Result<Result<Branch, CreateRefusal>, StoreError> {
        crate::pg_fold::create_branch(store, tenant, new).await
    }

    /// Ends a branch and its descendants in one statement (see
    /// [`crate::pg_fold`]).
    async fn end_tree(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        id: BranchId,
        finish: &Finish,
        child_reason: EndReason,
    ) -> Result<TreeEnd, StoreError> {
        crate::pg_fold::end_tree(store, tenant, id, finish, child_reason).await
    }

    /// Ends the batch in one statement (see [`crate::pg_fold`]).
    async fn finish_batch(
        store: &SqlStore<Self>,
        batch: &[BatchFinish],
    ) -> Result<Vec<Branch>, StoreError> {
        crate::pg_fold::finish_batch(store, batch).await
    }

    /// Charges an upstream call in one statement, and so in one round trip
    /// (see [`METER_CALL`]). The consumption reported is computed here from
    /// the ledger the statement locked, by the same rule the statement
    /// wrote ([`foldgate_domain::Ledger::consume`]).
    async fn meter_call(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<Option<Consumption>, StoreError> {
        store
            .timed("meter_call", async {
                let tokens = call.tokens();
                let trace_line = Uuid::now_v7();
                let row = crate::pg_fold::run(|| {
                    let query = sqlx::query(METER_CALL)
                        .bind(tenant.as_str())
                        .bind(id.as_uuid())
                        .bind(db_tokens(tokens))
                        .bind(Ts(call.at))
                        .bind(!store.synchronous_metering)
                        .bind(trace_line);
                    bind_call(query, call)
                        .bind(Ts(crate::activity_stale_before(call.at)))
                        .fetch_optional(&store.pool)
                })
                .await?;
                let Some(row) = row else {
                    return Ok(None);
                };
                let locked = ledger(row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)?;
                Ok(Some(locked.consume(tokens, row.try_get(3)?)))
            })
            .await
    }
}

/// Charges an upstream call to a branch and appends it to the branch's
/// trace, as [`Tx::meter_call`](crate::tx::Tx::meter_call) does in a transaction of
/// several statements; here the statement is the transaction.
///
/// - `prior` locks the branch if it is active, and computes what
///   [`foldgate_domain::Ledger::consume`] grants: the tokens, capped at what
///   remains. A concurrent charge makes it wait for the lock and then read
///   the row as that charge left it.
/// - `charged` writes the ledger as `consume` does (the 80% warning and
///   exhaustion recorded once), only when something was granted or ran out.
/// - `touched` records activity in the session, to
///   [`crate::ACTIVITY_RESOLUTION`] (its row is locked after the
///   branch's, in the order of [`crate::ops`]).
/// - The writes find their rows by key (`$2`, the session id as a scalar)
///   rather than by matching `plan`'s columns, so that they are index
///   lookups whatever the planner estimates.
/// - `cut` and `logged` write the trace line as the agent receives the
///   call ([`CallRecord::received`]: a result the grant does not cover is
///   recorded cut); a branch that was not active granted nothing
///   (`given`).
/// - `relaxed` lets the commit skip waiting for the disk unless metering is
///   configured synchronous: the setting lasts until the end of this
///   statement's transaction. It is one row either way, and `logged`
///   inserts from it, so it runs whatever else does.
///
/// Returns the ledger as locked, before the charge; no row if the branch is
/// not active.
const METER_CALL: &str = "\
WITH prior AS (\
    SELECT id, session_id, budget, used, reserved, warned_at IS NOT NULL AS warned, \
    LEAST($3, GREATEST(budget - used - reserved, 0)) AS granted \
    FROM branches WHERE tenant_id = $1 AND id = $2 AND status = 'active' FOR UPDATE\
), plan AS (\
    SELECT *, used + granted AS used_after, $3 > 0 AND used + granted >= budget AS exhausted \
    FROM prior\
), charged AS (\
    UPDATE branches b SET used = plan.used_after, \
    warned_at = CASE WHEN NOT plan.warned AND plan.used_after * 5 >= plan.budget * 4 \
        THEN $4 ELSE b.warned_at END, \
    exhausted_at = CASE WHEN plan.exhausted THEN COALESCE(b.exhausted_at, $4) \
        ELSE b.exhausted_at END \
    FROM plan WHERE b.tenant_id = $1 AND b.id = $2 AND (plan.granted > 0 OR plan.exhausted)\
), touched AS (\
    UPDATE sessions SET last_activity_at = $4 \
    WHERE tenant_id = $1 AND session_id = (SELECT session_id FROM plan) AND last_activity_at < $14\
), relaxed AS (\
    SELECT CASE WHEN $5 THEN set_config('synchronous_commit', 'off', true) END\
), given AS (\
    SELECT COALESCE((SELECT granted FROM plan), 0) AS granted\
), cut AS (\
    SELECT granted, granted < $3 AND $12 IN ('ok', 'tool_error', 'truncated') AS cut FROM given\
), logged AS (\
    INSERT INTO branch_calls (id, tenant_id, branch_id, tokens_charged, upstream, tool, \
    tokens_in, tokens_out, duration_ms, outcome, called_at) \
    SELECT $6, $1, $2, cut.granted, $7, $8, $9, \
    CASE WHEN cut.cut THEN GREATEST(cut.granted - $9, 0) ELSE $10 END, $11, \
    CASE WHEN cut.cut THEN 'truncated' ELSE $12 END, $13 \
    FROM relaxed, cut\
) \
SELECT budget, used, reserved, warned FROM plan";
