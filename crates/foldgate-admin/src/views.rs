//! What the admin API answers, as types: each is serialized as it is and
//! described in the OpenAPI document by its schema.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use foldgate_domain::{Branch, BranchId, Ledger, Session};
use foldgate_store::{AuditEntry, SessionListing, TenantOverview, TreeBranch};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

/// A tenant at a glance.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantView {
    pub tenant: String,
    pub open_sessions: u64,
    pub active_branches: u64,
    /// Tokens spent today (UTC), as quotas count them: upstream calls inside
    /// and outside branches (arguments and results) and what model providers
    /// billed for gateway-run branches; as written by every replica, each
    /// every second or so.
    pub tokens_today: u64,
}

impl From<TenantOverview> for TenantView {
    fn from(t: TenantOverview) -> Self {
        Self {
            tenant: t.tenant.to_string(),
            open_sessions: t.open_sessions,
            active_branches: t.active_branches,
            tokens_today: t.tokens_today,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantView>,
}

/// A token pool: what it holds, what was spent, and what is lent to active
/// children.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetView {
    pub total: u64,
    pub used: u64,
    pub reserved: u64,
}

impl From<&Ledger> for BudgetView {
    fn from(l: &Ledger) -> Self {
        Self { total: l.budget, used: l.used, reserved: l.reserved }
    }
}

/// A session, without its branches.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    pub session_id: String,
    /// The subject whose first `branch_create` opened it.
    pub owner: String,
    /// `open` or `ended`.
    pub status: String,
    /// The root pool that its depth-1 branches draw from.
    pub budget: BudgetView,
    pub created_at: DateTime<Utc>,
    pub last_activity_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

impl From<&Session> for SessionView {
    fn from(s: &Session) -> Self {
        Self {
            session_id: s.id.to_string(),
            owner: s.owner.to_string(),
            status: s.status.to_string(),
            budget: BudgetView::from(&s.ledger),
            created_at: s.created_at,
            last_activity_at: s.last_activity_at,
            ended_at: s.ended_at,
        }
    }
}

/// A session in a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionSummary {
    #[serde(flatten)]
    pub session: SessionView,
    /// Branches it ever had, and those active now.
    pub branches: u64,
    pub active_branches: u64,
}

impl From<SessionListing> for SessionSummary {
    fn from(l: SessionListing) -> Self {
        Self {
            session: SessionView::from(&l.session),
            branches: l.branches,
            active_branches: l.active_branches,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionSummary>,
    /// Pass as `after` for the next page; absent on the last.
    pub next: Option<String>,
}

/// What a provider billed for a gateway-run branch.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelUsageView {
    /// The `[[models]]` entry it ran on.
    pub model: String,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// A branch in a session's tree, with its children.
#[derive(Debug, Serialize, ToSchema)]
pub struct BranchNode {
    /// `br_<uuid>`.
    pub branch_id: String,
    /// `agent` (`branch_create`) or `gateway` (`branch_run`).
    pub kind: String,
    /// `active`, `completed`, `timeout` or `failed`.
    pub status: String,
    /// Why it ended other than by a successful return.
    pub reason: Option<String>,
    /// 1 for a branch of the session itself.
    pub depth: u32,
    pub description: String,
    pub budget: BudgetView,
    pub created_at: DateTime<Utc>,
    pub deadline_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    /// Upstream calls it made, and the tokens charged for them.
    pub calls: u64,
    pub call_tokens: u64,
    /// Tokens its finding added to its parent's context, once returned.
    pub returned_tokens: Option<u64>,
    /// Its finding, scrubbed, once returned.
    pub result: Option<String>,
    /// A gateway-run branch's model bill.
    pub model_usage: Option<ModelUsageView>,
    #[schema(no_recursion)]
    pub children: Vec<BranchNode>,
}

impl BranchNode {
    /// A branch without what the tree adds (its calls, bill and children).
    pub fn of(branch: &Branch) -> Self {
        Self {
            branch_id: branch.id.to_string(),
            kind: branch.kind.to_string(),
            status: branch.status.to_string(),
            reason: branch.reason.map(|r| r.as_str().to_owned()),
            depth: branch.depth,
            description: branch.description.clone(),
            budget: BudgetView::from(&branch.ledger),
            created_at: branch.created_at,
            deadline_at: branch.deadline_at,
            completed_at: branch.completed_at,
            calls: 0,
            call_tokens: 0,
            returned_tokens: branch.returned_tokens,
            result: branch.result.clone(),
            model_usage: None,
            children: Vec::new(),
        }
    }

    /// A branch of a tree, with its calls and bill (without its children).
    pub(crate) fn from_tree(t: &TreeBranch) -> Self {
        Self {
            calls: t.calls,
            call_tokens: t.call_tokens,
            model_usage: t.model.as_ref().map(|(model, usage)| ModelUsageView {
                model: model.clone(),
                calls: usage.calls,
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
            }),
            ..Self::of(&t.branch)
        }
    }
}

/// A session with its branch tree.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub session: SessionView,
    /// Its depth-1 branches, oldest first, each with its children.
    pub branches: Vec<BranchNode>,
}

impl SessionDetail {
    /// Nests the branches (listed parents before children) under their
    /// parents.
    pub fn new(session: &Session, branches: &[TreeBranch]) -> Self {
        let mut children: HashMap<Option<BranchId>, Vec<&TreeBranch>> = HashMap::new();
        for branch in branches {
            children.entry(branch.branch.parent).or_default().push(branch);
        }
        fn build(
            parent: Option<BranchId>,
            children: &HashMap<Option<BranchId>, Vec<&TreeBranch>>,
        ) -> Vec<BranchNode> {
            children.get(&parent).map_or_else(Vec::new, |list| {
                list.iter()
                    .map(|t| BranchNode {
                        children: build(Some(t.branch.id), children),
                        ..BranchNode::from_tree(t)
                    })
                    .collect()
            })
        }
        Self { session: SessionView::from(session), branches: build(None, &children) }
    }
}

/// What ending a branch did.
#[derive(Debug, Serialize, ToSchema)]
pub struct BranchEnded {
    /// The branch as it ended (`failed`, `ended_by_operator`).
    pub branch: BranchNode,
}

/// What ending a session did.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionEndedView {
    pub session_id: String,
    /// Active branches force-returned (`session_ended`).
    pub branches_ended: u64,
    /// Whether the session is now ended: `false` if it was used again
    /// meanwhile and so stays open.
    pub session_ended: bool,
}

/// Who made a change.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActorView {
    pub tenant: String,
    pub subject: String,
}

/// One change made through the admin API.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditView {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    pub actor: ActorView,
    /// The tenant whose resource changed; absent for the whole deployment.
    pub tenant: Option<String>,
    /// `<resource>.<verb>`: `branch.end`, `session.end`.
    pub action: String,
    /// The id or name of what changed.
    pub target: String,
    /// The request's details.
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

impl From<AuditEntry> for AuditView {
    fn from(e: AuditEntry) -> Self {
        Self {
            id: e.id,
            at: e.at,
            actor: ActorView {
                tenant: e.actor.tenant.to_string(),
                subject: e.actor.subject.to_string(),
            },
            tenant: e.tenant.map(|t| t.to_string()),
            action: e.action,
            target: e.target,
            detail: e.detail,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditList {
    pub entries: Vec<AuditView>,
    /// Pass as `before` for the next page; absent on the last.
    pub next: Option<Uuid>,
}
