//! [`Tx`], a transaction that [`SqlStore::in_tx`](crate::store::SqlStore::in_tx)
//! opened, and its statements: each method runs one.

use chrono::{DateTime, Utc};
use foldgate_domain::{
    BranchId, EndReason, LimitKind, Limits, SessionId, Subject, TenantId, Tokens,
};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type, query::Query};
use uuid::Uuid;

use crate::{
    CallRecord, Finish, NewRun, StoreError,
    counters::{DEPLOYMENT_COUNTER, TENANT_COUNTER},
    dialect::{Dialect, Param, Sql, Value, locking},
    record::{BranchRow, SessionRow, branch_columns, db_tokens, session_columns},
    ts::Ts,
};

/// A transaction of [`SqlStore`](crate::store::SqlStore). The operations
/// of several statements over it are in [`crate::ops`].
pub(crate) struct Tx<D: Dialect>(pub(crate) sqlx::Transaction<'static, D::DB>);

/// How busy a session is, read under its lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionLoad {
    pub active: i64,
    pub earliest_deadline: Option<DateTime<Utc>>,
    /// Branches created since the start of the rate window.
    pub recent: i64,
    pub oldest_recent: Option<DateTime<Utc>>,
}

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
    pub(crate) async fn insert_session_if_absent(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
        owner: &Subject,
        budget: Tokens,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sessions (tenant_id, session_id, owner_sub, status, budget, created_at, \
             last_activity_at) VALUES ($1, $2, $3, 'open', $4, $5, $5) ON CONFLICT DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(session.as_str())
        .bind(owner.as_str())
        .bind(db_tokens(budget))
        .bind(Ts(at))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    /// A session row, locked.
    const LOCK_SESSION: Sql = locking!(
        ["SELECT ", session_columns!(), " FROM sessions WHERE tenant_id = $1 AND session_id = $2"]
        " FOR UPDATE" []
    );

    pub(crate) async fn lock_session(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<SessionRow>, StoreError> {
        Ok(sqlx::query_as(D::pick(&Self::LOCK_SESSION))
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_optional(&mut *self.0)
            .await?)
    }

    /// Opens an ended session again with a fresh pool and records activity.
    pub(crate) async fn open_session(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
        budget: Tokens,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE sessions SET status = 'open', budget = $3, used = 0, reserved = 0, \
             ended_at = NULL, claimed_until = NULL, last_activity_at = $4 \
             WHERE tenant_id = $1 AND session_id = $2",
        )
        .bind(tenant.as_str())
        .bind(session.as_str())
        .bind(db_tokens(budget))
        .bind(Ts(at))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    /// A branch row, locked.
    const LOCK_BRANCH: Sql = locking!(
        ["SELECT ", branch_columns!(), " FROM branches WHERE tenant_id = $1 AND id = $2"]
        " FOR UPDATE" []
    );

    pub(crate) async fn lock_branch(
        &mut self,
        tenant: &TenantId,
        id: Uuid,
    ) -> Result<Option<BranchRow>, StoreError> {
        Ok(sqlx::query_as(D::pick(&Self::LOCK_BRANCH))
            .bind(tenant.as_str())
            .bind(id)
            .fetch_optional(&mut *self.0)
            .await?)
    }

    pub(crate) async fn active_branch_id(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM branches WHERE tenant_id = $1 AND session_id = $2 \
             AND status = 'active' AND kind = 'agent' AND NOT EXISTS (SELECT 1 FROM branches c \
             WHERE c.parent_id = branches.id AND c.status = 'active' AND c.kind = 'agent') ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .bind(tenant.as_str())
        .bind(session.as_str())
        .fetch_optional(&mut *self.0)
        .await?)
    }

    pub(crate) async fn session_load(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
        window_start: DateTime<Utc>,
    ) -> Result<SessionLoad, StoreError> {
        let (active, earliest_deadline, recent, oldest_recent): (
            i64,
            Option<DateTime<Utc>>,
            i64,
            Option<DateTime<Utc>>,
        ) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'active'), \
                    min(deadline_at) FILTER (WHERE status = 'active'), \
                    count(*) FILTER (WHERE created_at > $3), \
                    min(created_at) FILTER (WHERE created_at > $3) \
             FROM branches WHERE tenant_id = $1 AND session_id = $2 \
             AND (status = 'active' OR created_at > $3)",
        )
        .bind(tenant.as_str())
        .bind(session.as_str())
        .bind(Ts(window_start))
        .fetch_one(&mut *self.0)
        .await?;
        Ok(SessionLoad { active, earliest_deadline, recent, oldest_recent })
    }

    /// Counts one more active branch for the tenant and the deployment if
    /// both are under their limits; otherwise names the limit reached.
    pub(crate) async fn take_slot(
        &mut self,
        tenant: &TenantId,
        limits: &Limits,
    ) -> Result<Option<LimitKind>, StoreError> {
        let tenant_limit = i64::from(limits.max_active_per_tenant);
        if !self.take_stripe(&TENANT_COUNTER, Some(tenant.as_str()), tenant_limit).await? {
            return Ok(Some(LimitKind::TenantActive));
        }
        let total_limit = i64::from(limits.max_active_total);
        if !self.take_stripe(&DEPLOYMENT_COUNTER, None, total_limit).await? {
            return Ok(Some(LimitKind::DeploymentActive));
        }
        Ok(None)
    }

    /// Gives back one slot per entry of `tenants` in the tenants' counters,
    /// then as many in the deployment's.
    pub(crate) async fn release_slots(&mut self, tenants: &[&TenantId]) -> Result<(), StoreError> {
        for tenant in tenants {
            self.give_stripe(&TENANT_COUNTER, Some(tenant.as_str())).await?;
        }
        for _ in tenants {
            self.give_stripe(&DEPLOYMENT_COUNTER, None).await?;
        }
        Ok(())
    }

    /// Lends `amount` from a parent branch, or from the session's root pool
    /// when `parent` is `None`.
    pub(crate) async fn lend(
        &mut self,
        tenant: &TenantId,
        session: &str,
        parent: Option<Uuid>,
        amount: i64,
    ) -> Result<(), StoreError> {
        let query = match parent {
            Some(id) => sqlx::query(
                "UPDATE branches SET reserved = reserved + $2 WHERE tenant_id = $1 AND id = $3",
            )
            .bind(tenant.as_str())
            .bind(amount)
            .bind(id),
            None => sqlx::query(
                "UPDATE sessions SET reserved = reserved + $2 \
                 WHERE tenant_id = $1 AND session_id = $3",
            )
            .bind(tenant.as_str())
            .bind(amount)
            .bind(session),
        };
        query.execute(&mut *self.0).await?;
        Ok(())
    }

    /// Gives a parent back a child's loan, keeping what the child spent, and
    /// records the parent's 80% warning or exhaustion if that spending
    /// crossed them.
    pub(crate) async fn settle(
        &mut self,
        tenant: &TenantId,
        session: &str,
        parent: Option<Uuid>,
        child_budget: i64,
        child_used: i64,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // What the child spent may carry the parent past 80% or to
        // its whole budget: record it as a charge would.
        let query = match parent {
            Some(id) => sqlx::query(
                "UPDATE branches SET reserved = reserved - $2, used = used + $3, \
                 warned_at = CASE WHEN warned_at IS NULL AND (used + $3) * 5 >= budget * 4 \
                     THEN $5 ELSE warned_at END, \
                 exhausted_at = CASE WHEN exhausted_at IS NULL AND used + $3 >= budget \
                     THEN $5 ELSE exhausted_at END \
                 WHERE tenant_id = $1 AND id = $4",
            )
            .bind(tenant.as_str())
            .bind(child_budget)
            .bind(child_used)
            .bind(id)
            .bind(Ts(at)),
            None => sqlx::query(
                "UPDATE sessions SET reserved = reserved - $2, used = used + $3 \
                 WHERE tenant_id = $1 AND session_id = $4",
            )
            .bind(tenant.as_str())
            .bind(child_budget)
            .bind(child_used)
            .bind(session),
        };
        query.execute(&mut *self.0).await?;
        Ok(())
    }

    pub(crate) async fn insert_branch(&mut self, r: &BranchRow) -> Result<(), StoreError> {
        sqlx::query(concat!(
            "INSERT INTO branches (",
            branch_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17, $18, $19, $20, $21, $22)"
        ))
        .bind(r.id)
        .bind(&r.tenant_id)
        .bind(&r.session_id)
        .bind(&r.owner_sub)
        .bind(r.parent_id)
        .bind(r.depth)
        .bind(&r.description)
        .bind(&r.prompt)
        .bind(r.budget)
        .bind(r.used)
        .bind(r.reserved)
        .bind(&r.status)
        .bind(&r.reason)
        .bind(Ts(r.created_at))
        .bind(Ts(r.deadline_at))
        .bind(Ts::opt(r.completed_at))
        .bind(Ts::opt(r.warned_at))
        .bind(Ts::opt(r.exhausted_at))
        .bind(&r.result)
        .bind(&r.kind)
        .bind(&r.return_tier)
        .bind(r.returned_tokens)
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    /// Inserts a gateway-run branch's run, its lease held by the creator.
    pub(crate) async fn insert_run(
        &mut self,
        tenant: &TenantId,
        branch: Uuid,
        run: &NewRun,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO branch_runs (branch_id, tenant_id, model, tools, scopes, state, \
             lease_owner, lease_until, created_at, updated_at, lessons) \
             VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8, $8, $9)",
        )
        .bind(branch)
        .bind(tenant.as_str())
        .bind(&run.model)
        .bind(crate::runs::tools_json(&run.tools))
        .bind(run.scopes.join(" "))
        .bind(&run.lease_owner)
        .bind(Ts(run.lease_until))
        .bind(Ts(at))
        .bind(run.lessons.as_deref())
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    /// The conditional transition: only an `active` branch with no active
    /// child changes. Returns the branch as it now is. A return that asks
    /// for its message to be kept as a lesson queues it here (`extract`):
    /// in the one statement that ends the branch, so no round trip more.
    pub(crate) async fn end_branch(
        &mut self,
        tenant: &TenantId,
        id: Uuid,
        f: &Finish,
    ) -> Result<Option<BranchRow>, StoreError> {
        Ok(sqlx::query_as(concat!(
            "UPDATE branches SET status = $3, reason = $4, completed_at = $5, result = $6, \
             used = CASE WHEN used + $7 < budget THEN used + $7 ELSE budget END, claimed_until = NULL, \
             returned_tokens = $8, extract = CASE WHEN $9 THEN 'pending' END \
             WHERE tenant_id = $1 AND id = $2 AND status = 'active' AND reserved = 0 RETURNING ",
            branch_columns!()
        ))
        .bind(tenant.as_str())
        .bind(id)
        .bind(f.status.as_str())
        .bind(f.reason.map(EndReason::as_str))
        .bind(Ts(f.at))
        .bind(&f.result)
        .bind(db_tokens(f.result_tokens))
        .bind(f.returned_tokens.map(db_tokens))
        .bind(f.extract)
        .fetch_optional(&mut *self.0)
        .await?)
    }

    pub(crate) async fn record_consumption(
        &mut self,
        tenant: &TenantId,
        id: Uuid,
        used: i64,
        warned_at: Option<DateTime<Utc>>,
        exhausted_at: Option<DateTime<Utc>>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE branches SET used = $3, warned_at = COALESCE(warned_at, $4), \
             exhausted_at = COALESCE(exhausted_at, $5) WHERE tenant_id = $1 AND id = $2",
        )
        .bind(tenant.as_str())
        .bind(id)
        .bind(used)
        .bind(Ts::opt(warned_at))
        .bind(Ts::opt(exhausted_at))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    /// Appends an upstream call to a branch's trace.
    pub(crate) async fn insert_call(
        &mut self,
        tenant: &TenantId,
        branch: Uuid,
        call: &CallRecord,
        charged: Tokens,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(
            "INSERT INTO branch_calls (id, tenant_id, branch_id, tokens_charged, upstream, \
             tool, tokens_in, tokens_out, duration_ms, outcome, called_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(Uuid::now_v7())
        .bind(tenant.as_str())
        .bind(branch)
        .bind(db_tokens(charged));
        bind_call(query, call).execute(&mut *self.0).await?;
        Ok(())
    }

    pub(crate) async fn touch_session(
        &mut self,
        tenant: &TenantId,
        session: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        touch_session(&mut *self.0, tenant, session, at).await
    }

    /// The active branches of a session, deepest first, locked.
    const LOCK_ACTIVE_IN_SESSION: Sql = locking!(
        ["SELECT id FROM branches WHERE tenant_id = $1 AND session_id = $2 \
          AND status = 'active' ORDER BY depth DESC, id DESC"]
        " FOR UPDATE" []
    );

    /// Locks the active branches of a session, deepest first.
    pub(crate) async fn lock_active_in_session(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Vec<Uuid>, StoreError> {
        Ok(sqlx::query_scalar(D::pick(&Self::LOCK_ACTIVE_IN_SESSION))
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_all(&mut *self.0)
            .await?)
    }

    pub(crate) async fn active_descendants(
        &mut self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Vec<Uuid>, StoreError> {
        Ok(sqlx::query_scalar(ACTIVE_DESCENDANTS)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_all(&mut *self.0)
            .await?)
    }

    pub(crate) async fn session_exists(
        &mut self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<bool, StoreError> {
        let found: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM sessions WHERE tenant_id = $1 AND session_id = $2")
                .bind(tenant.as_str())
                .bind(session.as_str())
                .fetch_optional(&mut *self.0)
                .await?;
        Ok(found.is_some())
    }
}

/// The active descendants of a branch (`$2`), deepest first.
pub(crate) const ACTIVE_DESCENDANTS: &str = "WITH RECURSIVE tree (id, depth) AS ( \
        SELECT id, depth FROM branches \
        WHERE tenant_id = $1 AND parent_id = $2 AND status = 'active' \
        UNION ALL \
        SELECT b.id, b.depth FROM branches b JOIN tree t ON b.parent_id = t.id \
        WHERE b.tenant_id = $1 AND b.status = 'active' \
     ) SELECT id FROM tree ORDER BY depth DESC, id DESC";

/// Binds a trace line's columns from `upstream` to `called_at` (all
/// but its id, tenant, branch and charge), in the order of the
/// `branch_calls` inserts.
pub(crate) fn bind_call<'q, DB: Database>(
    query: Query<'q, DB, DB::Arguments>,
    call: &'q CallRecord,
) -> Query<'q, DB, DB::Arguments>
where
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    String: Param<DB>,
    i64: Param<DB>,
    Ts: Param<DB>,
{
    query
        .bind(&call.upstream)
        .bind(&call.tool)
        .bind(db_tokens(call.tokens_in))
        .bind(db_tokens(call.tokens_out))
        .bind(i64::try_from(call.duration.as_millis()).unwrap_or(i64::MAX))
        .bind(call.outcome.as_str())
        .bind(Ts(call.at))
}

/// Records activity in a session, to [`crate::ACTIVITY_RESOLUTION`].
pub(crate) async fn touch_session<'c, DB: Database<Arguments: sqlx::IntoArguments<DB>>>(
    ex: impl Executor<'c, Database = DB>,
    tenant: &TenantId,
    session: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError>
where
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    Ts: Param<DB>,
{
    sqlx::query(
        "UPDATE sessions SET last_activity_at = $3 \
         WHERE tenant_id = $1 AND session_id = $2 AND last_activity_at < $4",
    )
    .bind(tenant.as_str())
    .bind(session)
    .bind(Ts(at))
    .bind(Ts(crate::activity_stale_before(at)))
    .execute(ex)
    .await?;
    Ok(())
}
