//! What operators read and record through the admin API: tenants at a
//! glance, a tenant's sessions, a session's branch tree with each branch's
//! calls and model bill, and the audit log of changes.
//!
//! None of this is on the folding path: these reads serve an operator's
//! screen, one statement each, and never lock a row that folding takes.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{Branch, Principal, Session, SessionId, Subject, TenantId, Tokens};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use crate::{
    ModelUsage, StoreError,
    dialect::{Dialect, Param, Value},
    record::{BranchRow, SessionRow, branch_columns, session_columns, tokens},
    store::SqlStore,
    ts::Ts,
};

/// The most rows one admin read returns.
pub const MAX_PAGE: u32 = 500;

/// A tenant at a glance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantOverview {
    pub tenant: TenantId,
    pub open_sessions: u64,
    pub active_branches: u64,
    /// Tokens that went through the gateway for the tenant since the
    /// instant asked for: upstream calls inside branches (arguments and
    /// results) and what model providers billed for gateway-run branches.
    pub tokens_since: Tokens,
}

/// Which of a tenant's sessions to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct SessionPage {
    /// Only sessions still open.
    pub open_only: bool,
    /// At most this many ([`MAX_PAGE`] at most).
    pub limit: u32,
    /// Those created before this session (its creation time and id), the
    /// last one of the previous page.
    pub after: Option<(DateTime<Utc>, SessionId)>,
}

/// A session in a list, with how many branches it had.
#[derive(Debug, Clone)]
pub struct SessionListing {
    pub session: Session,
    pub branches: u64,
    pub active_branches: u64,
}

/// One branch of a session's tree, with what it did.
#[derive(Debug, Clone)]
pub struct TreeBranch {
    pub branch: Branch,
    /// Upstream calls it made, and the tokens charged for them.
    pub calls: u64,
    pub call_tokens: Tokens,
    /// A gateway-run branch: its model and what the provider billed.
    pub model: Option<(String, ModelUsage)>,
}

/// One change made through the admin API.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    /// UUIDv7: entries sort by time.
    pub id: Uuid,
    pub at: DateTime<Utc>,
    /// Who made it: the token's tenant and subject.
    pub actor: Principal,
    /// The tenant whose resource changed; `None` for the whole deployment.
    pub tenant: Option<TenantId>,
    /// `<resource>.<verb>`, such as `branch.end`.
    pub action: String,
    /// What it was done to: an id or a name.
    pub target: String,
    /// The request's details.
    pub detail: serde_json::Value,
}

/// Which audit entries to read, newest first.
#[derive(Debug, Clone, Default)]
pub struct AuditPage {
    /// Only those about this tenant's resources.
    pub tenant: Option<TenantId>,
    /// At most this many ([`MAX_PAGE`] at most).
    pub limit: u32,
    /// Those older than this entry, the last one of the previous page.
    pub before: Option<Uuid>,
}

/// The admin API's reads and its audit log.
#[async_trait]
pub trait AdminStore {
    /// Every tenant that ever had a branch (or only `only`), with its open
    /// sessions, active branches, and the tokens it spent since `since`.
    async fn tenants(
        &self,
        only: Option<&TenantId>,
        since: DateTime<Utc>,
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

    async fn record_audit(&self, entry: &AuditEntry) -> Result<(), StoreError>;

    async fn audit(&self, page: &AuditPage) -> Result<Vec<AuditEntry>, StoreError>;
}

#[derive(Debug, sqlx::FromRow)]
struct TenantRow {
    tenant_id: String,
    active_branches: i64,
    open_sessions: i64,
    call_tokens: i64,
    model_tokens: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct SessionListingRow {
    #[sqlx(flatten)]
    session: SessionRow,
    branches: i64,
    active_branches: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct TreeRow {
    #[sqlx(flatten)]
    branch: BranchRow,
    calls: Option<i64>,
    call_tokens: Option<i64>,
    model: Option<String>,
    model_calls: Option<i64>,
    model_input: Option<i64>,
    model_output: Option<i64>,
}

#[derive(Debug, sqlx::FromRow)]
struct AuditRow {
    id: Uuid,
    at: DateTime<Utc>,
    actor_tenant: String,
    actor_sub: String,
    tenant_id: Option<String>,
    action: String,
    target: String,
    detail: String,
}

fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

#[async_trait]
impl<D: Dialect> AdminStore for SqlStore<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    for<'a> &'a str: Encode<'a, D::DB> + Type<D::DB> + ColumnIndex<<D::DB as Database>::Row>,
    Ts: Param<D::DB>,
    Option<Ts>: Param<D::DB>,
    for<'a> Option<&'a str>: Encode<'a, D::DB> + Type<D::DB>,
    Option<Uuid>: Param<D::DB>,
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
        since: DateTime<Utc>,
    ) -> Result<Vec<TenantOverview>, StoreError> {
        self.timed("admin_tenants", async {
            // The active-branch counters hold a row for every tenant that
            // ever created a branch: the list of tenants, a few rows each.
            let rows: Vec<TenantRow> = sqlx::query_as(
                "SELECT u.tenant_id, CAST(sum(u.active_branches) AS BIGINT) AS active_branches, \
                 (SELECT count(*) FROM sessions AS s \
                  WHERE s.tenant_id = u.tenant_id AND s.status = 'open') AS open_sessions, \
                 (SELECT CAST(coalesce(sum(c.tokens_in + c.tokens_out), 0) AS BIGINT) \
                  FROM branch_calls AS c \
                  WHERE c.tenant_id = u.tenant_id AND c.called_at >= $2) AS call_tokens, \
                 (SELECT CAST(coalesce(sum(r.input_tokens + r.output_tokens), 0) AS BIGINT) \
                  FROM run_steps AS r WHERE r.tenant_id = u.tenant_id AND r.at >= $2) \
                  AS model_tokens \
                 FROM tenant_usage AS u WHERE ($1 IS NULL OR u.tenant_id = $1) \
                 GROUP BY u.tenant_id ORDER BY u.tenant_id",
            )
            .bind(only.map(TenantId::as_str))
            .bind(Ts(since))
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|r| {
                    Ok(TenantOverview {
                        tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
                        open_sessions: count(r.open_sessions),
                        active_branches: count(r.active_branches),
                        tokens_since: tokens(r.call_tokens)?
                            .saturating_add(tokens(r.model_tokens)?),
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
            let branches = rows
                .into_iter()
                .map(|r| {
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
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            Ok(Some((Session::try_from(found)?, branches)))
        })
        .await
    }

    async fn record_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.timed("admin_record_audit", async {
            sqlx::query(
                "INSERT INTO audit_log (id, at, actor_tenant, actor_sub, tenant_id, action, \
                 target, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(entry.id)
            .bind(Ts(entry.at))
            .bind(entry.actor.tenant.as_str())
            .bind(entry.actor.subject.as_str())
            .bind(entry.tenant.as_ref().map(TenantId::as_str))
            .bind(entry.action.as_str())
            .bind(entry.target.as_str())
            .bind(entry.detail.to_string())
            .execute(&self.pool)
            .await?;
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
}
