//! The handlers: each reads its path and query (a bad value is a 400 in
//! the API's shape), checks the operator's reach, and calls the store or
//! the folding service. Changes are written to the audit log first.
#![expect(
    unused_qualifications,
    reason = "utoipa's path macro spells out the query types it is given in full"
)]

use axum::{Json, extract::State};
use chrono::{DateTime, Utc};
use foldgate_domain::{BranchId, BranchStatus, EndReason, SessionId, SessionStatus, TenantId};
use foldgate_store::{AuditEntry, AuditPage, MAX_PAGE, SessionPage};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use crate::{
    AdminState,
    access::Operator,
    error::{AdminError, ErrorBody},
    extract::{Params, QueryOf},
    views::{
        AuditList, AuditView, BranchEnded, BranchNode, SessionDetail, SessionEndedView,
        SessionList, SessionSummary, TenantList, TenantView,
    },
};

/// How many rows a page has when the request does not say.
const DEFAULT_PAGE: u32 = 50;

fn page_size(limit: Option<u32>) -> Result<u32, AdminError> {
    match limit.unwrap_or(DEFAULT_PAGE) {
        n @ 1..=MAX_PAGE => Ok(n),
        _ => Err(AdminError::BadRequest(format!("`limit` must be between 1 and {MAX_PAGE}"))),
    }
}

/// Tenants with their open sessions, active branches and tokens today. A
/// tenant admin sees its own tenant only.
#[utoipa::path(
    get, path = "/tenants", tag = "tenants",
    responses(
        (status = 200, body = TenantList),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
    ),
)]
pub async fn tenants(
    State(state): State<AdminState>,
    operator: Operator,
) -> Result<Json<TenantList>, AdminError> {
    let today = state.service.clock().now().date_naive();
    let tenants = state.service.store().tenants(operator.only_tenant(), today).await?;
    Ok(Json(TenantList { tenants: tenants.into_iter().map(TenantView::from).collect() }))
}

#[derive(Debug, Deserialize)]
pub struct TenantPath {
    pub(crate) tenant: String,
}

#[derive(Debug, Deserialize)]
pub struct SessionPath {
    tenant: String,
    session_id: String,
}

#[derive(Debug, Deserialize)]
pub struct BranchPath {
    pub(crate) tenant: String,
    pub(crate) branch_id: String,
}

/// Which sessions to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SessionsQuery {
    /// `open` (the default) or `all`.
    status: Option<String>,
    /// Sessions per page, 1 to 500 (default 50).
    limit: Option<u32>,
    /// The `next` of the previous page.
    after: Option<String>,
}

/// The cursor of a page of sessions: the last one's creation time (ms
/// since the epoch) and id.
fn session_cursor(at: DateTime<Utc>, id: &SessionId) -> String {
    format!("{}:{id}", at.timestamp_millis())
}

fn parse_session_cursor(raw: &str) -> Result<(DateTime<Utc>, SessionId), AdminError> {
    let bad = || AdminError::BadRequest("`after` is not a cursor this API gave".to_owned());
    let (millis, id) = raw.split_once(':').ok_or_else(bad)?;
    let at = millis.parse().ok().and_then(DateTime::from_timestamp_millis).ok_or_else(bad)?;
    Ok((at, SessionId::parse(id).map_err(|_| bad())?))
}

/// A tenant's sessions, newest first.
#[utoipa::path(
    get, path = "/tenants/{tenant}/sessions", tag = "sessions",
    params(("tenant" = String, Path), SessionsQuery),
    responses(
        (status = 200, body = SessionList),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
    ),
)]
pub async fn sessions(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<TenantPath>,
    QueryOf(query): QueryOf<SessionsQuery>,
) -> Result<Json<SessionList>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    let open_only = match query.status.as_deref() {
        None | Some("open") => true,
        Some("all") => false,
        Some(_) => return Err(AdminError::BadRequest("`status` must be `open` or `all`".into())),
    };
    let limit = page_size(query.limit)?;
    let after = query.after.as_deref().map(parse_session_cursor).transpose()?;
    let page = SessionPage { open_only, limit, after };
    let listed = state.service.store().sessions(&tenant, &page).await?;
    let next = (listed.len() == limit as usize)
        .then(|| listed.last().map(|l| session_cursor(l.session.created_at, &l.session.id)))
        .flatten();
    Ok(Json(SessionList { sessions: listed.into_iter().map(SessionSummary::from).collect(), next }))
}

fn session_id(raw: &str) -> Result<SessionId, AdminError> {
    // An id no session can have names no session.
    SessionId::parse(raw).map_err(|_| AdminError::NotFound("session"))
}

pub(crate) fn branch_id(raw: &str) -> Result<BranchId, AdminError> {
    BranchId::parse(raw).map_err(|e| AdminError::BadRequest(format!("`branch_id` {}", e.reason)))
}

/// A session with its branch tree: each branch's state, depth, budget,
/// deadline, calls and model bill.
#[utoipa::path(
    get, path = "/tenants/{tenant}/sessions/{session_id}", tag = "sessions",
    params(("tenant" = String, Path), ("session_id" = String, Path)),
    responses((status = 200, body = SessionDetail), (status = 404, body = ErrorBody)),
)]
pub async fn session(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<SessionPath>,
) -> Result<Json<SessionDetail>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    let id = session_id(&path.session_id)?;
    let (session, branches) = state
        .service
        .store()
        .session_tree(&tenant, &id)
        .await?
        .ok_or(AdminError::NotFound("session"))?;
    Ok(Json(SessionDetail::new(&session, &branches)))
}

/// The audit entry of a change an operator makes now.
pub(crate) fn audit_entry(
    state: &AdminState,
    operator: &Operator,
    tenant: Option<&TenantId>,
    action: &str,
    target: String,
    detail: serde_json::Value,
) -> AuditEntry {
    AuditEntry {
        id: Uuid::now_v7(),
        at: state.service.clock().now(),
        actor: operator.principal.clone(),
        tenant: tenant.cloned(),
        action: action.to_owned(),
        target,
        detail,
    }
}

/// Logs a change once its audit entry is written.
pub(crate) fn log_change(entry: &AuditEntry) {
    tracing::info!(actor = %entry.actor.subject, actor_tenant = %entry.actor.tenant,
        tenant = ?entry.tenant.as_ref().map(TenantId::as_str), action = %entry.action,
        target = %entry.target, "admin change");
}

/// Writes what an operator is about to change to the audit log.
async fn audit(
    state: &AdminState,
    operator: &Operator,
    tenant: Option<&TenantId>,
    action: &str,
    target: String,
    detail: serde_json::Value,
) -> Result<(), AdminError> {
    let entry = audit_entry(state, operator, tenant, action, target, detail);
    state.service.store().record_audit(&entry).await?;
    log_change(&entry);
    Ok(())
}

/// Ends an active branch: its active descendants first (deepest first,
/// `parent_returning`), then the branch (`failed`, `ended_by_operator`).
#[utoipa::path(
    post, path = "/tenants/{tenant}/branches/{branch_id}/end", tag = "branches",
    params(("tenant" = String, Path), ("branch_id" = String, Path)),
    responses(
        (status = 200, body = BranchEnded),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "the branch had already ended", body = ErrorBody),
    ),
)]
pub async fn end_branch(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<BranchPath>,
) -> Result<Json<BranchEnded>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    let id = branch_id(&path.branch_id)?;
    let store = state.service.store();
    let branch = store.branch(&tenant, id).await?.ok_or(AdminError::NotFound("branch"))?;
    let not_active = |status: BranchStatus| AdminError::Conflict {
        code: "branch_not_active",
        message: format!("the branch is {status}, not active"),
    };
    if branch.status != BranchStatus::Active {
        return Err(not_active(branch.status));
    }
    let detail = serde_json::json!({
        "session_id": branch.session_id.as_str(),
        "reason": EndReason::EndedByOperator.as_str(),
    });
    audit(&state, &operator, Some(&tenant), "branch.end", id.to_string(), detail).await?;
    match state.service.force_return(&tenant, id, EndReason::EndedByOperator).await? {
        Some(ended) => Ok(Json(BranchEnded { branch: BranchNode::of(&ended) })),
        // It ended meanwhile, by its agent or the supervisor.
        None => {
            let now = store.branch(&tenant, id).await?.ok_or(AdminError::NotFound("branch"))?;
            Err(not_active(now.status))
        }
    }
}

/// Ends a session: force-returns its active branches deepest first
/// (`session_ended`), then ends the session.
#[utoipa::path(
    post, path = "/tenants/{tenant}/sessions/{session_id}/end", tag = "sessions",
    params(("tenant" = String, Path), ("session_id" = String, Path)),
    responses(
        (status = 200, body = SessionEndedView),
        (status = 404, body = ErrorBody),
        (status = 409, description = "the session had already ended", body = ErrorBody),
    ),
)]
pub async fn end_session(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<SessionPath>,
) -> Result<Json<SessionEndedView>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    let id = session_id(&path.session_id)?;
    let session = state
        .service
        .store()
        .session(&tenant, &id)
        .await?
        .ok_or(AdminError::NotFound("session"))?;
    if session.status != SessionStatus::Open {
        return Err(AdminError::Conflict {
            code: "session_not_open",
            message: "the session has already ended".to_owned(),
        });
    }
    let detail = serde_json::json!({ "owner": session.owner.as_str() });
    audit(&state, &operator, Some(&tenant), "session.end", id.to_string(), detail).await?;
    let ended = state.service.end_session_of(&tenant, &id, None).await?;
    Ok(Json(SessionEndedView {
        session_id: id.to_string(),
        branches_ended: ended.branches_ended,
        session_ended: ended.session_ended,
    }))
}

/// Which audit entries to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only changes to this tenant's resources (a tenant admin gets only
    /// its own tenant's, and another tenant is not found).
    tenant: Option<String>,
    /// Entries per page, 1 to 500 (default 50).
    limit: Option<u32>,
    /// The `next` of the previous page.
    before: Option<Uuid>,
}

/// Changes made through the admin API, newest first.
#[utoipa::path(
    get, path = "/audit", tag = "audit",
    params(AuditQuery),
    responses((status = 200, body = AuditList), (status = 400, body = ErrorBody)),
)]
pub async fn audit_log(
    State(state): State<AdminState>,
    operator: Operator,
    QueryOf(query): QueryOf<AuditQuery>,
) -> Result<Json<AuditList>, AdminError> {
    let tenant = match query.tenant.as_deref() {
        Some(raw) => Some(operator.tenant(raw)?),
        None => operator.only_tenant().cloned(),
    };
    let limit = page_size(query.limit)?;
    let page = AuditPage { tenant, limit, before: query.before };
    let entries = state.service.store().audit(&page).await?;
    let next = (entries.len() == limit as usize).then(|| entries.last().map(|e| e.id)).flatten();
    Ok(Json(AuditList { entries: entries.into_iter().map(AuditView::from).collect(), next }))
}
