//! The admin API's types: what the store answers and takes, and the rows
//! it reads them from.

use chrono::{DateTime, NaiveDate, Utc};
use foldgate_domain::{Branch, Principal, Session, SessionId, TenantId, TenantSettings, Tokens};
use uuid::Uuid;

use crate::{
    ModelUsage, StoreError,
    record::{BranchRow, SessionRow},
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
