//! Rows as both backends return them, and their conversion to domain types.
//!
//! Both schemas use the same column names and compatible types (timestamps
//! are `timestamptz` in Postgres and fixed-width RFC 3339 text in SQLite), so
//! one row type serves both.

use chrono::{DateTime, Utc};
use foldgate_domain::{Branch, BranchId, Ledger, Session, SessionId, Subject, TenantId, Tokens};
use uuid::Uuid;

use crate::{CallSummary, StoreError, ToolCalls};

/// The columns of `branches`, in the order of [`BRANCH_COLUMNS`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct BranchRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub session_id: String,
    pub owner_sub: String,
    pub parent_id: Option<Uuid>,
    pub depth: i32,
    pub description: String,
    pub prompt: String,
    pub budget: i64,
    pub used: i64,
    pub reserved: i64,
    pub status: String,
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub deadline_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub warned_at: Option<DateTime<Utc>>,
    /// When spending reached the budget; the branch is due for a forced
    /// return.
    pub exhausted_at: Option<DateTime<Utc>>,
    pub result: Option<String>,
    pub kind: String,
    pub return_tier: String,
    pub returned_tokens: Option<i64>,
}

/// The columns of [`BranchRow`], as a literal for `concat!`.
macro_rules! branch_columns {
    () => {
        "id, tenant_id, session_id, owner_sub, parent_id, depth, description, prompt, budget, \
         used, reserved, status, reason, created_at, deadline_at, completed_at, warned_at, \
         exhausted_at, result, kind, return_tier, returned_tokens"
    };
}
pub(crate) use branch_columns;

/// One upstream tool's calls in a branch, added up, from the statement that
/// [`call_groups`] starts; every column is empty in a branch's row that
/// found no calls (a left join).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CallGroupRow {
    pub upstream: Option<String>,
    pub tool: Option<String>,
    pub calls: Option<i64>,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub charged: Option<i64>,
    pub errors: Option<i64>,
    pub truncated: Option<i64>,
    pub last_call_at: Option<DateTime<Utc>>,
}

/// A branch with one tool's calls: the rows of `Store::branch_report`.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct BranchCallsRow {
    #[sqlx(flatten)]
    pub branch: BranchRow,
    #[sqlx(flatten)]
    pub calls: CallGroupRow,
}

/// A branch's calls grouped by tool, as the columns of [`CallGroupRow`]:
/// the tail of a `SELECT` whose tenant and branch are `$1` and `$2`.
macro_rules! call_groups {
    () => {
        "upstream, tool, count(*) AS calls, CAST(sum(tokens_in) AS BIGINT) AS tokens_in, \
         CAST(sum(tokens_out) AS BIGINT) AS tokens_out, \
         CAST(sum(tokens_charged) AS BIGINT) AS charged, \
         count(*) FILTER (WHERE outcome IN ('tool_error', 'upstream_error', 'refused')) AS errors, \
         count(*) FILTER (WHERE outcome = 'truncated') AS truncated, max(called_at) AS last_call_at \
         FROM branch_calls WHERE tenant_id = $1 AND branch_id = $2 GROUP BY branch_id, upstream, tool"
    };
}
pub(crate) use call_groups;

/// Adds up a branch's calls from their groups, in the groups' order; a
/// group with no tool (a branch without calls) counts nothing.
pub(crate) fn call_summary(groups: impl IntoIterator<Item = CallGroupRow>) -> CallSummary {
    let n = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0);
    let mut summary = CallSummary::default();
    for group in groups {
        let (Some(upstream), Some(tool)) = (group.upstream, group.tool) else { continue };
        summary.calls += n(group.calls);
        summary.tokens_in += n(group.tokens_in);
        summary.tokens_out += n(group.tokens_out);
        summary.tokens_charged += n(group.charged);
        summary.errors += n(group.errors);
        summary.truncated += n(group.truncated);
        summary.last_call_at = summary.last_call_at.max(group.last_call_at);
        summary.by_tool.push(ToolCalls {
            upstream,
            tool,
            calls: n(group.calls),
            tokens: n(group.charged),
        });
    }
    summary
}

/// The columns of `sessions`.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SessionRow {
    pub tenant_id: String,
    pub session_id: String,
    pub owner_sub: String,
    pub status: String,
    pub budget: i64,
    pub used: i64,
    pub reserved: i64,
    pub created_at: DateTime<Utc>,
    pub last_activity_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// The columns of [`SessionRow`], as a literal for `concat!`.
macro_rules! session_columns {
    () => {
        "tenant_id, session_id, owner_sub, status, budget, used, reserved, created_at, \
         last_activity_at, ended_at"
    };
}
pub(crate) use session_columns;

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

pub(crate) fn tokens(v: i64) -> Result<Tokens, StoreError> {
    Tokens::try_from(v).map_err(|_| corrupt(format!("negative token count {v}")))
}

/// Token counts are validated to fit in `i64` by the policies; saturate
/// rather than wrap if one ever does not.
pub(crate) fn db_tokens(v: Tokens) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn ledger(budget: i64, used: i64, reserved: i64) -> Result<Ledger, StoreError> {
    Ok(Ledger { budget: tokens(budget)?, used: tokens(used)?, reserved: tokens(reserved)? })
}

impl TryFrom<BranchRow> for Branch {
    type Error = StoreError;

    fn try_from(r: BranchRow) -> Result<Self, Self::Error> {
        Ok(Branch {
            id: BranchId::from_uuid(r.id),
            tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
            session_id: SessionId::parse(&r.session_id).map_err(corrupt)?,
            owner: Subject::parse(&r.owner_sub).map_err(corrupt)?,
            parent: r.parent_id.map(BranchId::from_uuid),
            depth: u32::try_from(r.depth).map_err(|_| corrupt(format!("depth {}", r.depth)))?,
            description: r.description,
            prompt: r.prompt,
            ledger: ledger(r.budget, r.used, r.reserved)?,
            status: r.status.parse().map_err(corrupt)?,
            reason: r.reason.map(|s| s.parse()).transpose().map_err(corrupt)?,
            created_at: r.created_at,
            deadline_at: r.deadline_at,
            completed_at: r.completed_at,
            warned_at: r.warned_at,
            result: r.result,
            kind: r.kind.parse().map_err(corrupt)?,
            return_tier: r.return_tier.parse().map_err(corrupt)?,
            returned_tokens: r.returned_tokens.map(tokens).transpose()?,
        })
    }
}

impl TryFrom<SessionRow> for Session {
    type Error = StoreError;

    fn try_from(r: SessionRow) -> Result<Self, Self::Error> {
        Ok(Session {
            tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
            id: SessionId::parse(&r.session_id).map_err(corrupt)?,
            owner: Subject::parse(&r.owner_sub).map_err(corrupt)?,
            status: r.status.parse().map_err(corrupt)?,
            ledger: ledger(r.budget, r.used, r.reserved)?,
            created_at: r.created_at,
            last_activity_at: r.last_activity_at,
            ended_at: r.ended_at,
        })
    }
}
