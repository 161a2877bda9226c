//! [`Store`] for [`SqlStore`]: the reads and single statements here, the
//! operations of several statements as methods of [`Tx`] (in
//! [`crate::ops`], over the statements in [`crate::tx`]).
//!
//! [`Tx`]: crate::tx::Tx

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, Consumption, EndReason, Session, SessionId, Subject, TenantId, Tokens,
};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use crate::{
    BatchFinish, CallRecord, CallSummary, CreateRefusal, DueBranch, Finish, Finished, IdleSession,
    ModelBill, NewBranch, NewStep, OutsideUsage, PoolUsage, Run, RunEnd, RunStep, StepWritten,
    Store, StoreError, TreeEnd, check_migrated,
    dialect::{Dialect, Param, RowsAffected, Sql, Value, locking},
    due_branch, idle_session,
    record::{
        BranchCallsRow, BranchRow, CallGroupRow, SessionRow, branch_columns, call_groups,
        call_summary, db_tokens, session_columns,
    },
    store::SqlStore,
    ts::Ts,
    tx::{ACTIVE_DESCENDANTS, touch_session},
};

/// Claims due branches for a lease; a replica skips the rows another one holds.
const CLAIM_DUE: Sql = locking!(
    ["UPDATE branches SET claimed_until = $2 WHERE id IN ( \
                    SELECT id FROM branches WHERE status = 'active' \
                    AND (deadline_at <= $1 OR exhausted_at IS NOT NULL) \
                    AND (claimed_until IS NULL OR claimed_until <= $1) \
                    ORDER BY depth DESC, deadline_at LIMIT $3"]
    " FOR UPDATE SKIP LOCKED" [") RETURNING tenant_id, id, depth, exhausted_at IS NOT NULL"]
);

/// Claims idle sessions for a lease; a replica skips the rows another one holds.
const CLAIM_IDLE: Sql = locking!(
    ["UPDATE sessions SET claimed_until = $3 WHERE (tenant_id, session_id) IN ( \
                    SELECT tenant_id, session_id FROM sessions WHERE status = 'open' \
                    AND reserved = 0 AND last_activity_at <= $1 AND (claimed_until IS NULL OR claimed_until <= $2) \
                    ORDER BY last_activity_at LIMIT $4"]
    " FOR UPDATE SKIP LOCKED" [") RETURNING tenant_id, session_id"]
);

#[async_trait]
impl<D: Dialect> Store for SqlStore<D>
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
    f64: Value<D::DB>,
    bool: Value<D::DB>,
    Uuid: Value<D::DB>,
    Vec<u8>: Value<D::DB>,
    Option<String>: Value<D::DB>,
    DateTime<Utc>: Value<D::DB>,
{
    async fn create_branch(
        &self,
        tenant: &TenantId,
        new: NewBranch,
    ) -> Result<Result<Branch, CreateRefusal>, StoreError> {
        // A refusal writes nothing: even the session insert is rolled back.
        D::create_branch(self, tenant, &new).await
    }

    async fn branch(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Branch>, StoreError> {
        self.timed("branch", async {
            let row: Option<BranchRow> = sqlx::query_as(concat!(
                "SELECT ",
                branch_columns!(),
                " FROM branches WHERE tenant_id = $1 AND id = $2"
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
            row.map(Branch::try_from).transpose()
        })
        .await
    }

    async fn session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
    ) -> Result<Option<Session>, StoreError> {
        self.timed("session", async {
            let row: Option<SessionRow> = sqlx::query_as(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE tenant_id = $1 AND session_id = $2"
            ))
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
            row.map(Session::try_from).transpose()
        })
        .await
    }

    async fn active_branch(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<Branch>, StoreError> {
        self.timed("active_branch", async {
            let row: Option<BranchRow> = sqlx::query_as(concat!(
                "SELECT ",
                branch_columns!(),
                " FROM branches WHERE tenant_id = $1 AND session_id = $2 \
                  AND status = 'active' AND kind = 'agent' AND NOT EXISTS (SELECT 1 FROM branches c \
                 WHERE c.parent_id = branches.id AND c.status = 'active' AND c.kind = 'agent') ORDER BY created_at DESC, id DESC LIMIT 1"
            ))
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_optional(&self.pool)
            .await?;
            row.map(Branch::try_from).transpose()
        })
        .await
    }

    async fn active_descendants(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Vec<BranchId>, StoreError> {
        self.timed("active_descendants", async {
            let ids: Vec<Uuid> = sqlx::query_scalar(ACTIVE_DESCENDANTS)
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .fetch_all(&self.pool)
                .await?;
            Ok(ids.into_iter().map(BranchId::from_uuid).collect())
        })
        .await
    }

    async fn active_in_session(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Vec<BranchId>, StoreError> {
        self.timed("active_in_session", async {
            let ids: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM branches WHERE tenant_id = $1 AND session_id = $2 \
                 AND status = 'active' ORDER BY depth DESC, id DESC",
            )
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_all(&self.pool)
            .await?;
            Ok(ids.into_iter().map(BranchId::from_uuid).collect())
        })
        .await
    }

    async fn consume(
        &self,
        tenant: &TenantId,
        id: BranchId,
        tokens: Tokens,
        at: DateTime<Utc>,
    ) -> Result<Option<Consumption>, StoreError> {
        self.in_tx(
            "consume",
            |_| true,
            |mut tx| async move {
                let result = tx.consume(tenant, id, tokens, at).await;
                (tx, result)
            },
        )
        .await
    }

    async fn meter_call(
        &self,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<Option<Consumption>, StoreError> {
        // Each dialect times its own metering (retries included).
        D::meter_call(self, tenant, id, call).await
    }

    async fn call_summary(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<CallSummary, StoreError> {
        self.timed("call_summary", async {
            let groups: Vec<CallGroupRow> = sqlx::query_as(concat!(
                "SELECT ",
                call_groups!(),
                " ORDER BY charged DESC, upstream, tool"
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_all(&self.pool)
            .await?;
            Ok(call_summary(groups))
        })
        .await
    }

    async fn branch_report(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Option<(Branch, CallSummary)>, StoreError> {
        self.timed("branch_report", async {
            // The branch's row once per tool it called (once if none): one
            // statement where a branch and then its calls took two.
            let rows: Vec<BranchCallsRow> = sqlx::query_as(concat!(
                "SELECT ",
                branch_columns!(),
                ", c.upstream, c.tool, c.calls, c.tokens_in, c.tokens_out, c.charged, c.errors, \
                 c.truncated, c.last_call_at FROM branches AS b LEFT JOIN (SELECT branch_id, ",
                call_groups!(),
                ") AS c ON c.branch_id = b.id WHERE b.tenant_id = $1 AND b.id = $2 \
                 ORDER BY c.charged DESC, c.upstream, c.tool"
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_all(&self.pool)
            .await?;
            let mut rows = rows.into_iter();
            let Some(first) = rows.next() else { return Ok(None) };
            let groups = std::iter::once(first.calls).chain(rows.map(|row| row.calls));
            let summary = call_summary(groups);
            Ok(Some((Branch::try_from(first.branch)?, summary)))
        })
        .await
    }

    async fn open_sessions_of(
        &self,
        tenant: &TenantId,
        owner: &Subject,
        limit: u32,
    ) -> Result<Vec<SessionId>, StoreError> {
        self.timed("open_sessions_of", async {
            let ids: Vec<String> = sqlx::query_scalar(
                "SELECT session_id FROM sessions \
                 WHERE tenant_id = $1 AND owner_sub = $2 AND status = 'open' \
                 ORDER BY last_activity_at DESC LIMIT $3",
            )
            .bind(tenant.as_str())
            .bind(owner.as_str())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            ids.iter()
                .map(|id| SessionId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string())))
                .collect()
        })
        .await
    }

    async fn add_outside_usage(
        &self,
        tenant: &TenantId,
        session: Option<&SessionId>,
        usage: OutsideUsage,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.timed("add_outside_usage", async {
            sqlx::query(
                "INSERT INTO usage_outside_branches \
                 (tenant_id, session_id, calls, tokens_in, tokens_out, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (tenant_id, session_id) DO UPDATE SET \
                 calls = usage_outside_branches.calls + excluded.calls, \
                 tokens_in = usage_outside_branches.tokens_in + excluded.tokens_in, \
                 tokens_out = usage_outside_branches.tokens_out + excluded.tokens_out, \
                 updated_at = excluded.updated_at",
            )
            .bind(tenant.as_str())
            .bind(session.map_or("", SessionId::as_str))
            .bind(db_tokens(usage.calls))
            .bind(db_tokens(usage.tokens_in))
            .bind(db_tokens(usage.tokens_out))
            .bind(Ts(at))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
        .await
    }

    async fn add_session_tools(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        tools: &[String],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.timed("add_session_tools", async {
            // Few at a time (a session's new tools since the last flush):
            // one statement each, in one transaction.
            let mut tx = D::begin(&self.pool).await?;
            for tool in tools {
                sqlx::query(
                    "INSERT INTO session_tools (tenant_id, session_id, tool, first_used_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, session_id, tool) DO NOTHING",
                )
                .bind(tenant.as_str())
                .bind(session.as_str())
                .bind(tool.as_str())
                .bind(Ts(at))
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn session_tools_of(
        &self,
        tenant: &TenantId,
        owner: &Subject,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        self.timed("session_tools_of", async {
            let tools: Vec<String> = sqlx::query_scalar(
                "SELECT t.tool FROM session_tools AS t \
                 JOIN sessions AS s ON s.tenant_id = t.tenant_id AND s.session_id = t.session_id \
                 WHERE s.tenant_id = $1 AND s.owner_sub = $2 AND s.status = 'open' \
                 GROUP BY t.tool ORDER BY MIN(t.first_used_at), t.tool LIMIT $3",
            )
            .bind(tenant.as_str())
            .bind(owner.as_str())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            Ok(tools)
        })
        .await
    }

    async fn outside_usage(
        &self,
        tenant: &TenantId,
        session: Option<&SessionId>,
    ) -> Result<OutsideUsage, StoreError> {
        self.timed("outside_usage", async {
            let row: Option<(i64, i64, i64)> = sqlx::query_as(
                "SELECT calls, tokens_in, tokens_out FROM usage_outside_branches \
                 WHERE tenant_id = $1 AND session_id = $2",
            )
            .bind(tenant.as_str())
            .bind(session.map_or("", SessionId::as_str))
            .fetch_optional(&self.pool)
            .await?;
            let n = |v: i64| u64::try_from(v).unwrap_or(0);
            Ok(row.map_or_else(OutsideUsage::default, |(calls, tin, tout)| OutsideUsage {
                calls: n(calls),
                tokens_in: n(tin),
                tokens_out: n(tout),
            }))
        })
        .await
    }

    async fn finish(
        &self,
        tenant: &TenantId,
        id: BranchId,
        finish: Finish,
    ) -> Result<Finished, StoreError> {
        self.in_tx(
            "finish",
            |_| true,
            |mut tx| {
                let finish = &finish;
                async move {
                    let result = tx.finish(tenant, id, finish).await;
                    (tx, result)
                }
            },
        )
        .await
    }

    async fn end_tree(
        &self,
        tenant: &TenantId,
        id: BranchId,
        finish: Finish,
        child_reason: EndReason,
    ) -> Result<TreeEnd, StoreError> {
        D::end_tree(self, tenant, id, &finish, child_reason).await
    }

    async fn finish_batch(&self, batch: &[BatchFinish]) -> Result<Vec<Branch>, StoreError> {
        D::finish_batch(self, batch).await
    }

    async fn end_session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
        idle_since: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        self.timed("end_session", async {
            let done = sqlx::query(
                "UPDATE sessions SET status = 'ended', ended_at = $3, claimed_until = NULL \
                 WHERE tenant_id = $1 AND session_id = $2 AND status = 'open' AND reserved = 0 \
                 AND ($4 IS NULL OR last_activity_at <= $4)",
            )
            .bind(tenant.as_str())
            .bind(id.as_str())
            .bind(Ts(at))
            .bind(Ts::opt(idle_since.map(crate::activity_stale_before)))
            .execute(&self.pool)
            .await?
            .rows_affected();
            Ok(done == 1)
        })
        .await
    }

    async fn fail_session_branches(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        self.in_tx(
            "fail_session_branches",
            |_| true,
            |mut tx| async move {
                let result = tx.fail_session_branches(tenant, id, at).await;
                (tx, result)
            },
        )
        .await
    }

    async fn touch_session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.timed("touch_session", async {
            touch_session(&self.pool, tenant, id.as_str(), at).await
        })
        .await
    }

    async fn claim_due_branches(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<DueBranch>, StoreError> {
        self.timed("claim_due_branches", async {
            let rows: Vec<(String, Uuid, i32, bool)> = sqlx::query_as(D::pick(&CLAIM_DUE))
                .bind(Ts(now))
                .bind(Ts(lease_end(now, lease)))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter()
                .map(|(t, id, depth, exhausted)| due_branch(t, id, depth, exhausted))
                .collect()
        })
        .await
    }

    async fn claim_idle_sessions(
        &self,
        idle_since: DateTime<Utc>,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<IdleSession>, StoreError> {
        self.timed("claim_idle_sessions", async {
            let rows: Vec<(String, String)> = sqlx::query_as(D::pick(&CLAIM_IDLE))
                .bind(Ts(crate::activity_stale_before(idle_since)))
                .bind(Ts(now))
                .bind(Ts(lease_end(now, lease)))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter().map(|(t, id)| idle_session(&t, &id)).collect()
        })
        .await
    }

    async fn next_deadline(&self, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.timed("next_deadline", async {
            // Branches claimed by a replica are its business until the
            // lease runs out.
            Ok(sqlx::query_scalar(
                "SELECT min(deadline_at) FROM branches WHERE status = 'active' \
                 AND (claimed_until IS NULL OR claimed_until <= $1)",
            )
            .bind(Ts(now))
            .fetch_one(&self.pool)
            .await?)
        })
        .await
    }

    async fn run(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Run>, StoreError> {
        self.load_run(tenant, id).await
    }

    async fn run_steps(&self, tenant: &TenantId, id: BranchId) -> Result<Vec<RunStep>, StoreError> {
        self.load_steps(tenant, id).await
    }

    async fn record_step(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        step: &NewStep,
    ) -> Result<StepWritten, StoreError> {
        self.write_step(tenant, id, owner, step).await
    }

    async fn renew_run_lease(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.renew_lease(tenant, id, owner, until).await
    }

    async fn finish_run(
        &self,
        tenant: &TenantId,
        id: BranchId,
        end: &RunEnd<'_>,
    ) -> Result<bool, StoreError> {
        self.complete_run(tenant, id, end).await
    }

    async fn claim_lapsed_runs(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<(TenantId, BranchId)>, StoreError> {
        self.take_lapsed_runs(owner, now, until, limit).await
    }

    async fn ended_runs(&self, owner: &str) -> Result<Vec<BranchId>, StoreError> {
        self.runs_ended(owner).await
    }

    async fn model_usage(&self, tenant: &TenantId) -> Result<Vec<ModelBill>, StoreError> {
        self.sum_model_usage(tenant).await
    }

    async fn session_returned_tokens(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Tokens, StoreError> {
        self.timed("session_returned_tokens", async {
            let total: Option<i64> = sqlx::query_scalar(
                "SELECT CAST(SUM(returned_tokens) AS BIGINT) FROM branches \
                 WHERE tenant_id = $1 AND session_id = $2 AND depth = 1",
            )
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_one(&self.pool)
            .await?;
            crate::record::tokens(total.unwrap_or(0))
        })
        .await
    }

    async fn active_branches(&self) -> Result<Vec<(TenantId, u64)>, StoreError> {
        self.timed("active_branches", async {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT tenant_id, CAST(SUM(active_branches) AS BIGINT) FROM tenant_usage \
                 GROUP BY tenant_id ORDER BY tenant_id",
            )
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|(tenant, active)| {
                    let tenant =
                        TenantId::parse(&tenant).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    Ok((tenant, u64::try_from(active).unwrap_or(0)))
                })
                .collect()
        })
        .await
    }

    fn pool_usage(&self) -> PoolUsage {
        PoolUsage {
            size: self.pool.size(),
            idle: u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX),
            max: self.pool.options().get_max_connections(),
        }
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.timed("ready", async {
            let applied: Option<i64> =
                sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
                    .fetch_one(&self.pool)
                    .await?;
            check_migrated(D::migrator(), applied)
        })
        .await
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

fn lease_end(now: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now.checked_add_signed(lease))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}
