//! What operators read and record through the admin API: tenants at a
//! glance, a tenant's sessions, a session's branch tree with each branch's
//! calls and model bill, a branch's own calls and its run's steps, and the
//! audit log of changes.
//!
//! None of this is on the folding path: these reads serve an operator's
//! screen, one statement each, and never lock a row that folding takes.

mod types;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use foldgate_domain::{
    Branch, BranchId, Principal, Session, SessionId, Subject, TenantId, TenantSettings,
};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

pub use self::types::{
    AuditEntry, AuditPage, BranchTrace, MAX_PAGE, SessionListing, SessionPage, StoredSettings,
    TenantOverview, TenantSpend, TracePage, TracedCall, TreeBranch, UsageKind, UsageLine,
};
use self::types::{
    AuditRow, CallRow, SessionListingRow, SettingsRow, SpendRow, TenantRow, TreeRow, UsageRow,
    corrupt, count, day, settings_of,
};
use crate::{
    ModelUsage, Run, RunStep, StoreError,
    dialect::{Dialect, Param, Value},
    record::{SessionRow, branch_columns, db_tokens as db_count, session_columns, tokens},
    runs::{RunRow, StepRow, run_columns},
    store::SqlStore,
    ts::Ts,
};

/// The admin API's reads and its audit log.
#[async_trait]
pub trait AdminStore {
    /// Every tenant that ever had a branch (or only `only`), with its open
    /// sessions, active branches, and the tokens it spent on `today`, as
    /// written to the daily usage.
    async fn tenants(
        &self,
        only: Option<&TenantId>,
        today: NaiveDate,
    ) -> Result<Vec<TenantOverview>, StoreError>;

    /// A page of a tenant's sessions, newest first.
    async fn sessions(
        &self,
        tenant: &TenantId,
        page: &SessionPage,
    ) -> Result<Vec<SessionListing>, StoreError>;

    /// A session and all its branches, in creation order (parents before
    /// their children).
    async fn session_tree(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<(Session, Vec<TreeBranch>)>, StoreError>;

    /// A branch with its children, a page of its upstream calls and, for a
    /// gateway-run branch, its run and a page of the run's steps.
    async fn branch_trace(
        &self,
        tenant: &TenantId,
        id: BranchId,
        page: &TracePage,
    ) -> Result<Option<BranchTrace>, StoreError>;

    async fn record_audit(&self, entry: &AuditEntry) -> Result<(), StoreError>;

    async fn audit(&self, page: &AuditPage) -> Result<Vec<AuditEntry>, StoreError>;

    /// Every tenant's overrides.
    async fn all_tenant_settings(&self) -> Result<Vec<(TenantId, TenantSettings)>, StoreError>;

    async fn tenant_settings(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<StoredSettings>, StoreError>;

    /// Replaces a tenant's overrides and writes `audit`, in one
    /// transaction.
    async fn put_tenant_settings(
        &self,
        tenant: &TenantId,
        settings: &TenantSettings,
        audit: &AuditEntry,
    ) -> Result<(), StoreError>;

    /// Adds to the daily usage, in one transaction.
    async fn add_usage(&self, lines: &[UsageLine]) -> Result<(), StoreError>;

    /// A tenant's daily usage from `from` to `to`, both included.
    async fn usage(
        &self,
        tenant: &TenantId,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Vec<UsageLine>, StoreError>;

    /// What each tenant with overrides spent on `today` and in the month
    /// that began on `month_start`.
    async fn spending(
        &self,
        today: NaiveDate,
        month_start: NaiveDate,
    ) -> Result<Vec<TenantSpend>, StoreError>;
}

#[async_trait]
impl<D: Dialect> AdminStore for SqlStore<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    for<'a> &'a str: Encode<'a, D::DB> + Type<D::DB> + ColumnIndex<<D::DB as Database>::Row>,
    usize: ColumnIndex<<D::DB as Database>::Row>,
    Ts: Param<D::DB>,
    Option<Ts>: Param<D::DB>,
    for<'a> Option<&'a str>: Encode<'a, D::DB> + Type<D::DB>,
    Option<Uuid>: Param<D::DB>,
    Option<i64>: Param<D::DB>,
    String: Value<D::DB>,
    i64: Value<D::DB>,
    i32: Value<D::DB>,
    bool: Value<D::DB>,
    Uuid: Value<D::DB>,
    DateTime<Utc>: Value<D::DB>,
{
    async fn tenants(
        &self,
        only: Option<&TenantId>,
        today: NaiveDate,
    ) -> Result<Vec<TenantOverview>, StoreError> {
        self.timed("admin_tenants", async {
            // The active-branch counters hold a row for every tenant that
            // ever created a branch: the list of tenants, a few rows each.
            let rows: Vec<TenantRow> = sqlx::query_as(
                "SELECT u.tenant_id, CAST(sum(u.active_branches) AS BIGINT) AS active_branches, \
                 (SELECT count(*) FROM sessions AS s \
                  WHERE s.tenant_id = u.tenant_id AND s.status = 'open') AS open_sessions, \
                 (SELECT CAST(coalesce(sum(d.tokens_in + d.tokens_out), 0) AS BIGINT) \
                  FROM usage_daily AS d WHERE d.tenant_id = u.tenant_id AND d.day = $2 \
                  AND d.kind <> 'return') AS tokens_today \
                 FROM tenant_usage AS u WHERE ($1 IS NULL OR u.tenant_id = $1) \
                 GROUP BY u.tenant_id ORDER BY u.tenant_id",
            )
            .bind(only.map(TenantId::as_str))
            .bind(today.to_string())
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|r| {
                    Ok(TenantOverview {
                        tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
                        open_sessions: count(r.open_sessions),
                        active_branches: count(r.active_branches),
                        tokens_today: tokens(r.tokens_today)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn sessions(
        &self,
        tenant: &TenantId,
        page: &SessionPage,
    ) -> Result<Vec<SessionListing>, StoreError> {
        self.timed("admin_sessions", async {
            let (after_at, after_id) =
                page.after.as_ref().map(|(at, id)| (*at, id.as_str())).unzip();
            let rows: Vec<SessionListingRow> = sqlx::query_as(concat!(
                "SELECT ",
                session_columns!(),
                ", (SELECT count(*) FROM branches AS b \
                  WHERE b.tenant_id = s.tenant_id AND b.session_id = s.session_id) AS branches, \
                 (SELECT count(*) FROM branches AS b WHERE b.tenant_id = s.tenant_id \
                  AND b.session_id = s.session_id AND b.status = 'active') AS active_branches \
                 FROM sessions AS s WHERE tenant_id = $1 AND (NOT $2 OR status = 'open') \
                 AND ($3 IS NULL OR created_at < $3 OR (created_at = $3 AND session_id > $4)) \
                 ORDER BY created_at DESC, session_id LIMIT $5"
            ))
            .bind(tenant.as_str())
            .bind(page.open_only)
            .bind(Ts::opt(after_at))
            .bind(after_id)
            .bind(i64::from(page.limit.min(MAX_PAGE)))
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|r| {
                    Ok(SessionListing {
                        session: Session::try_from(r.session)?,
                        branches: count(r.branches),
                        active_branches: count(r.active_branches),
                    })
                })
                .collect()
        })
        .await
    }

    async fn session_tree(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<(Session, Vec<TreeBranch>)>, StoreError> {
        self.timed("admin_session_tree", async {
            let found: Option<SessionRow> = sqlx::query_as(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE tenant_id = $1 AND session_id = $2"
            ))
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_optional(&self.pool)
            .await?;
            let Some(found) = found else { return Ok(None) };
            // The joined tables' columns are renamed so that the branch's
            // own stay unambiguous.
            let rows: Vec<TreeRow> = sqlx::query_as(concat!(
                "SELECT ",
                branch_columns!(),
                ", c.calls, c.call_tokens, r.model, r.model_calls, r.model_input, r.model_output \
                 FROM branches \
                 LEFT JOIN (SELECT branch_id AS call_branch, count(*) AS calls, \
                  CAST(sum(tokens_charged) AS BIGINT) AS call_tokens FROM branch_calls \
                  WHERE tenant_id = $1 AND branch_id IN (SELECT id FROM branches \
                  WHERE tenant_id = $1 AND session_id = $2) GROUP BY branch_id) AS c \
                  ON c.call_branch = branches.id \
                 LEFT JOIN (SELECT branch_id AS run_branch, model, \
                  CAST(model_calls AS BIGINT) AS model_calls, input_tokens AS model_input, \
                  output_tokens AS model_output FROM branch_runs WHERE tenant_id = $1) AS r \
                  ON r.run_branch = branches.id \
                 WHERE tenant_id = $1 AND session_id = $2 ORDER BY created_at, id"
            ))
            .bind(tenant.as_str())
            .bind(session.as_str())
            .fetch_all(&self.pool)
            .await?;
            let branches = rows.into_iter().map(tree_branch).collect::<Result<Vec<_>, _>>()?;
            Ok(Some((Session::try_from(found)?, branches)))
        })
        .await
    }

    async fn branch_trace(
        &self,
        tenant: &TenantId,
        id: BranchId,
        page: &TracePage,
    ) -> Result<Option<BranchTrace>, StoreError> {
        self.timed("admin_branch_trace", async {
            // The branch and its children, each with its calls and bill
            // added up as in a session's tree.
            let rows: Vec<TreeRow> = sqlx::query_as(concat!(
                "SELECT ",
                branch_columns!(),
                ", c.calls, c.call_tokens, r.model, r.model_calls, r.model_input, r.model_output \
                 FROM branches \
                 LEFT JOIN (SELECT branch_id AS call_branch, count(*) AS calls, \
                  CAST(sum(tokens_charged) AS BIGINT) AS call_tokens FROM branch_calls \
                  WHERE tenant_id = $1 AND branch_id IN (SELECT id FROM branches \
                  WHERE tenant_id = $1 AND (id = $2 OR parent_id = $2)) GROUP BY branch_id) AS c \
                  ON c.call_branch = branches.id \
                 LEFT JOIN (SELECT branch_id AS run_branch, model, \
                  CAST(model_calls AS BIGINT) AS model_calls, input_tokens AS model_input, \
                  output_tokens AS model_output FROM branch_runs WHERE tenant_id = $1) AS r \
                  ON r.run_branch = branches.id \
                 WHERE tenant_id = $1 AND (id = $2 OR parent_id = $2) ORDER BY created_at, id"
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_all(&self.pool)
            .await?;
            let mut found = None;
            let mut children = Vec::new();
            for row in rows {
                let branch = tree_branch(row)?;
                if branch.branch.id == id {
                    found = Some(branch);
                } else {
                    children.push(branch);
                }
            }
            let Some(branch) = found else { return Ok(None) };

            // Newest first, by the index of a branch's calls by time.
            let calls = if page.calls == 0 {
                Vec::new()
            } else {
                let (before_at, before_id) = page.calls_before.unzip();
                let rows: Vec<CallRow> = sqlx::query_as(
                    "SELECT id, upstream, tool, tokens_in, tokens_out, tokens_charged, duration_ms, \
                     outcome, called_at FROM branch_calls WHERE tenant_id = $1 AND branch_id = $2 \
                     AND ($3 IS NULL OR called_at < $3 OR (called_at = $3 AND id < $4)) \
                     ORDER BY called_at DESC, id DESC LIMIT $5",
                )
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .bind(Ts::opt(before_at))
                .bind(before_id)
                .bind(i64::from(page.calls.min(MAX_PAGE)))
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter().map(TracedCall::try_from).collect::<Result<Vec<_>, _>>()?
            };

            let run: Option<RunRow> = sqlx::query_as(concat!(
                "SELECT ",
                run_columns!(),
                " FROM branch_runs WHERE tenant_id = $1 AND branch_id = $2"
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
            let run = run.map(Run::try_from).transpose()?;
            let steps = if run.is_none() || page.steps == 0 {
                Vec::new()
            } else {
                let rows: Vec<StepRow> = sqlx::query_as(
                    "SELECT seq, kind, body, input_tokens, output_tokens, duration_ms, repeated, \
                     at FROM run_steps WHERE tenant_id = $1 AND branch_id = $2 \
                     AND ($3 IS NULL OR seq < $3) ORDER BY seq DESC LIMIT $4",
                )
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .bind(page.steps_before.map(i64::from))
                .bind(i64::from(page.steps.min(MAX_PAGE)))
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter().map(RunStep::try_from).collect::<Result<Vec<_>, _>>()?
            };
            Ok(Some(BranchTrace { branch, children, calls, run, steps }))
        })
        .await
    }

    async fn record_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.timed("admin_record_audit", async {
            insert_audit(entry).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn audit(&self, page: &AuditPage) -> Result<Vec<AuditEntry>, StoreError> {
        self.timed("admin_audit", async {
            let rows: Vec<AuditRow> = sqlx::query_as(
                "SELECT id, at, actor_tenant, actor_sub, tenant_id, action, target, detail \
                 FROM audit_log WHERE ($1 IS NULL OR tenant_id = $1) \
                 AND ($2 IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
            )
            .bind(page.tenant.as_ref().map(TenantId::as_str))
            .bind(page.before)
            .bind(i64::from(page.limit.min(MAX_PAGE)))
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|r| {
                    Ok(AuditEntry {
                        id: r.id,
                        at: r.at,
                        actor: Principal::new(
                            TenantId::parse(&r.actor_tenant).map_err(corrupt)?,
                            Subject::parse(&r.actor_sub).map_err(corrupt)?,
                        ),
                        tenant: r
                            .tenant_id
                            .as_deref()
                            .map(TenantId::parse)
                            .transpose()
                            .map_err(corrupt)?,
                        action: r.action,
                        target: r.target,
                        detail: serde_json::from_str(&r.detail).map_err(corrupt)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn all_tenant_settings(&self) -> Result<Vec<(TenantId, TenantSettings)>, StoreError> {
        self.timed("admin_all_tenant_settings", async {
            let rows: Vec<(String, String)> =
                sqlx::query_as("SELECT tenant_id, settings FROM tenant_settings")
                    .fetch_all(&self.pool)
                    .await?;
            rows.into_iter()
                .map(|(tenant, json)| {
                    Ok((TenantId::parse(&tenant).map_err(corrupt)?, settings_of(&json)?))
                })
                .collect()
        })
        .await
    }

    async fn tenant_settings(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<StoredSettings>, StoreError> {
        self.timed("admin_tenant_settings", async {
            let row: Option<SettingsRow> = sqlx::query_as(
                "SELECT settings, updated_at, updated_by_tenant, updated_by_sub \
                 FROM tenant_settings WHERE tenant_id = $1",
            )
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
            row.map(|r| {
                Ok(StoredSettings {
                    settings: settings_of(&r.settings)?,
                    updated_at: r.updated_at,
                    updated_by: Principal::new(
                        TenantId::parse(&r.updated_by_tenant).map_err(corrupt)?,
                        Subject::parse(&r.updated_by_sub).map_err(corrupt)?,
                    ),
                })
            })
            .transpose()
        })
        .await
    }

    async fn put_tenant_settings(
        &self,
        tenant: &TenantId,
        settings: &TenantSettings,
        audit: &AuditEntry,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(settings).map_err(|e| corrupt(e.to_string()))?;
        self.timed("admin_put_tenant_settings", async {
            // As the dialect begins a writing transaction (SQLite: IMMEDIATE,
            // waiting for the write lock rather than failing to upgrade).
            let mut tx = D::begin(&self.pool).await?;
            sqlx::query(
                "INSERT INTO tenant_settings (tenant_id, settings, updated_at, updated_by_tenant, \
                 updated_by_sub) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id) DO UPDATE \
                 SET settings = excluded.settings, updated_at = excluded.updated_at, \
                 updated_by_tenant = excluded.updated_by_tenant, \
                 updated_by_sub = excluded.updated_by_sub",
            )
            .bind(tenant.as_str())
            .bind(json.as_str())
            .bind(Ts(audit.at))
            .bind(audit.actor.tenant.as_str())
            .bind(audit.actor.subject.as_str())
            .execute(&mut *tx)
            .await?;
            insert_audit(audit).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn add_usage(&self, lines: &[UsageLine]) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        self.timed("admin_add_usage", async {
            // As the dialect begins a writing transaction (SQLite: IMMEDIATE,
            // waiting for the write lock rather than failing to upgrade).
            let mut tx = D::begin(&self.pool).await?;
            for line in lines {
                sqlx::query(
                    "INSERT INTO usage_daily (tenant_id, day, kind, name, calls, tokens_in, \
                     tokens_out) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                     ON CONFLICT (tenant_id, day, kind, name) DO UPDATE \
                     SET calls = usage_daily.calls + excluded.calls, \
                     tokens_in = usage_daily.tokens_in + excluded.tokens_in, \
                     tokens_out = usage_daily.tokens_out + excluded.tokens_out",
                )
                .bind(line.tenant.as_str())
                .bind(line.day.to_string())
                .bind(line.kind.as_str())
                .bind(line.name.as_str())
                .bind(db_count(line.calls))
                .bind(db_count(line.tokens_in))
                .bind(db_count(line.tokens_out))
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn usage(
        &self,
        tenant: &TenantId,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Vec<UsageLine>, StoreError> {
        self.timed("admin_usage", async {
            let rows: Vec<UsageRow> = sqlx::query_as(
                "SELECT tenant_id, day, kind, name, calls, tokens_in, tokens_out FROM usage_daily \
                 WHERE tenant_id = $1 AND day >= $2 AND day <= $3 ORDER BY day, kind, name",
            )
            .bind(tenant.as_str())
            .bind(from.to_string())
            .bind(to.to_string())
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|r| {
                    Ok(UsageLine {
                        tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
                        day: day(&r.day)?,
                        kind: UsageKind::parse(&r.kind)?,
                        name: r.name,
                        calls: count(r.calls),
                        tokens_in: tokens(r.tokens_in)?,
                        tokens_out: tokens(r.tokens_out)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn spending(
        &self,
        today: NaiveDate,
        month_start: NaiveDate,
    ) -> Result<Vec<TenantSpend>, StoreError> {
        self.timed("admin_spending", async {
            let rows: Vec<SpendRow> = sqlx::query_as(
                "SELECT tenant_id, \
                 CAST(coalesce(sum(CASE WHEN day = $1 THEN tokens_in + tokens_out ELSE 0 END), 0) \
                 AS BIGINT) AS today, \
                 CAST(coalesce(sum(tokens_in + tokens_out), 0) AS BIGINT) AS this_month \
                 FROM usage_daily WHERE day >= $2 \
                 AND kind IN ('branch_call', 'outside_call', 'model') \
                 AND tenant_id IN (SELECT tenant_id FROM tenant_settings) GROUP BY tenant_id",
            )
            .bind(today.to_string())
            .bind(month_start.to_string())
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|r| {
                    Ok(TenantSpend {
                        tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
                        today: tokens(r.today)?,
                        this_month: tokens(r.this_month)?,
                    })
                })
                .collect()
        })
        .await
    }
}

/// A branch of a tree, with its calls and model bill added up.
fn tree_branch(r: TreeRow) -> Result<TreeBranch, StoreError> {
    let model = match r.model {
        Some(model) => Some((
            model,
            ModelUsage {
                calls: count(r.model_calls.unwrap_or(0)),
                input_tokens: tokens(r.model_input.unwrap_or(0))?,
                output_tokens: tokens(r.model_output.unwrap_or(0))?,
            },
        )),
        None => None,
    };
    Ok(TreeBranch {
        branch: Branch::try_from(r.branch)?,
        calls: count(r.calls.unwrap_or(0)),
        call_tokens: tokens(r.call_tokens.unwrap_or(0))?,
        model,
    })
}

/// The statement that writes an audit entry.
pub(crate) fn insert_audit<DB: Database>(
    entry: &AuditEntry,
) -> sqlx::query::Query<'_, DB, <DB as Database>::Arguments>
where
    Uuid: Param<DB>,
    Ts: Param<DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    String: Param<DB>,
{
    sqlx::query(
        "INSERT INTO audit_log (id, at, actor_tenant, actor_sub, tenant_id, action, target, \
         detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(entry.id)
    .bind(Ts(entry.at))
    .bind(entry.actor.tenant.as_str())
    .bind(entry.actor.subject.as_str())
    .bind(entry.tenant.as_ref().map(TenantId::as_str))
    .bind(entry.action.as_str())
    .bind(entry.target.as_str())
    .bind(entry.detail.to_string())
}
