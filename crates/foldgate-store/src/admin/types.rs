//! The admin API's types: what the store answers and takes, and the rows
//! it reads them from.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use foldgate_domain::{Branch, Principal, Session, SessionId, TenantId, TenantSettings, Tokens};
use uuid::Uuid;

use crate::{
    CallOutcome, ModelUsage, Run, RunStep, StoreError,
    record::{BranchRow, SessionRow, tokens},
};

/// The most rows one admin read returns.
pub const MAX_PAGE: u32 = 500;

/// A tenant at a glance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantOverview {
    pub tenant: TenantId,
    pub open_sessions: u64,
    pub active_branches: u64,
    /// Tokens the tenant spent on the day asked for, as its quotas count
    /// them: upstream calls inside and outside branches (arguments and
    /// results) and what model providers billed for gateway-run branches.
    pub tokens_today: Tokens,
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

/// Which of a branch's calls and steps to read: each newest first, a page
/// at a time.
#[derive(Debug, Clone, Default)]
pub struct TracePage {
    /// At most this many calls ([`MAX_PAGE`] at most; 0 reads none).
    pub calls: u32,
    /// Calls older than this one (its time and id), the last one of the
    /// previous page.
    pub calls_before: Option<(DateTime<Utc>, Uuid)>,
    /// At most this many steps ([`MAX_PAGE`] at most; 0 reads none).
    pub steps: u32,
    /// Steps numbered below this one, the last one of the previous page.
    pub steps_before: Option<u32>,
}

/// One upstream call of a branch: a line of its trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedCall {
    /// UUIDv7.
    pub id: Uuid,
    pub upstream: String,
    pub tool: String,
    /// Tokens of the arguments, and of the result as the caller received
    /// it.
    pub tokens_in: Tokens,
    pub tokens_out: Tokens,
    /// What the branch was charged: less than in and out only when it ran
    /// out, or had already ended when the call finished.
    pub tokens_charged: Tokens,
    pub duration: Duration,
    pub outcome: CallOutcome,
    pub called_at: DateTime<Utc>,
}

/// A branch with what it did: its own calls, and for a gateway-run branch
/// its run and steps.
#[derive(Debug, Clone)]
pub struct BranchTrace {
    /// The branch, with its calls and model bill added up.
    pub branch: TreeBranch,
    /// Its children (not their descendants), oldest first, each with its
    /// calls and model bill added up.
    pub children: Vec<TreeBranch>,
    /// A page of its calls, newest first.
    pub calls: Vec<TracedCall>,
    /// A gateway-run branch's run.
    pub run: Option<Run>,
    /// A page of the run's steps, newest first.
    pub steps: Vec<RunStep>,
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

/// A tenant's overrides as stored, with who set them last and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSettings {
    pub settings: TenantSettings,
    pub updated_at: DateTime<Utc>,
    pub updated_by: Principal,
}

/// What a line of the daily usage counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageKind {
    /// Upstream calls inside branches, by upstream: calls, the tokens of
    /// their arguments (`tokens_in`) and results (`tokens_out`).
    BranchCall,
    /// The same outside branches.
    OutsideCall,
    /// Model calls of gateway-run branches, by model: calls, the input and
    /// output tokens the provider billed.
    Model,
    /// Branches of depth 1 that returned (`name` is empty): how many, the
    /// tokens they spent (`tokens_in`), and the tokens of their findings
    /// that entered the caller's context (`tokens_out`).
    Return,
}

impl UsageKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BranchCall => "branch_call",
            Self::OutsideCall => "outside_call",
            Self::Model => "model",
            Self::Return => "return",
        }
    }

    pub(super) fn parse(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "branch_call" => Self::BranchCall,
            "outside_call" => Self::OutsideCall,
            "model" => Self::Model,
            "return" => Self::Return,
            other => return Err(corrupt(format!("unknown usage kind {other:?}"))),
        })
    }
}

/// One line of a tenant's daily usage (UTC days), or what to add to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageLine {
    pub tenant: TenantId,
    pub day: NaiveDate,
    pub kind: UsageKind,
    /// The upstream or model; empty for returns.
    pub name: String,
    pub calls: u64,
    pub tokens_in: Tokens,
    pub tokens_out: Tokens,
}

/// What a tenant spent towards its quotas: upstream calls (inside and
/// outside branches) and model calls, in and out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpend {
    pub tenant: TenantId,
    pub today: Tokens,
    pub this_month: Tokens,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct TenantRow {
    pub tenant_id: String,
    pub active_branches: i64,
    pub open_sessions: i64,
    pub tokens_today: i64,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct SessionListingRow {
    #[sqlx(flatten)]
    pub session: SessionRow,
    pub branches: i64,
    pub active_branches: i64,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct TreeRow {
    #[sqlx(flatten)]
    pub branch: BranchRow,
    pub calls: Option<i64>,
    pub call_tokens: Option<i64>,
    pub model: Option<String>,
    pub model_calls: Option<i64>,
    pub model_input: Option<i64>,
    pub model_output: Option<i64>,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct CallRow {
    pub id: Uuid,
    pub upstream: String,
    pub tool: String,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub tokens_charged: i64,
    pub duration_ms: i64,
    pub outcome: String,
    pub called_at: DateTime<Utc>,
}

impl TryFrom<CallRow> for TracedCall {
    type Error = StoreError;

    fn try_from(r: CallRow) -> Result<Self, StoreError> {
        Ok(Self {
            id: r.id,
            upstream: r.upstream,
            tool: r.tool,
            tokens_in: tokens(r.tokens_in)?,
            tokens_out: tokens(r.tokens_out)?,
            tokens_charged: tokens(r.tokens_charged)?,
            duration: Duration::from_millis(count(r.duration_ms)),
            outcome: r.outcome.parse().map_err(corrupt)?,
            called_at: r.called_at,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct AuditRow {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    pub actor_tenant: String,
    pub actor_sub: String,
    pub tenant_id: Option<String>,
    pub action: String,
    pub target: String,
    pub detail: String,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct SettingsRow {
    pub settings: String,
    pub updated_at: DateTime<Utc>,
    pub updated_by_tenant: String,
    pub updated_by_sub: String,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct UsageRow {
    pub tenant_id: String,
    pub day: String,
    pub kind: String,
    pub name: String,
    pub calls: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct SpendRow {
    pub tenant_id: String,
    pub today: i64,
    pub this_month: i64,
}

pub(super) fn settings_of(json: &str) -> Result<TenantSettings, StoreError> {
    serde_json::from_str(json).map_err(|e| corrupt(format!("tenant settings: {e}")))
}

pub(super) fn day(text: &str) -> Result<NaiveDate, StoreError> {
    text.parse().map_err(|_| corrupt(format!("usage day {text:?}")))
}

pub(super) fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}
