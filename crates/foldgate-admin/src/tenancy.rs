//! A tenant's limits and quotas, and what it used: `GET`/`PUT
//! /tenants/{tenant}/limits` and `GET /tenants/{tenant}/usage`.
#![expect(
    unused_qualifications,
    reason = "utoipa's path macro spells out the query types it is given in full"
)]

use std::collections::BTreeMap;

use axum::{Json, extract::State};
use chrono::{DateTime, Datelike, NaiveDate, Utc};
use foldgate_domain::{TenantId, TenantSettings, Tokens, ToolListing};
use foldgate_engine::Rules;
use foldgate_store::{UsageKind, UsageLine};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::{
    AdminState,
    access::Operator,
    error::{AdminError, ErrorBody},
    extract::{BodyOf, Params, QueryOf},
    routes::{TenantPath, audit_entry, log_change},
    views::ActorView,
};

/// The longest span one usage report covers.
const MAX_USAGE_DAYS: i64 = 366;

/// The limits a tenant's branches are held to: the deployment's, with the
/// tenant's overrides.
#[derive(Debug, Serialize, ToSchema)]
pub struct EffectiveLimits {
    pub max_active_per_session: u32,
    pub max_active_per_tenant: u32,
    pub creations_per_minute: u32,
    pub max_depth: u32,
    pub default_budget: Tokens,
    pub max_budget: Tokens,
    pub session_budget: Tokens,
    /// Absent: every model configured for the tenant.
    pub models: Option<Vec<String>>,
    /// Absent: every upstream configured for the tenant.
    pub upstreams: Option<Vec<String>>,
    /// Absent: no quota.
    pub tokens_per_day: Option<Tokens>,
    pub tokens_per_month: Option<Tokens>,
    /// How `tools/list` shows upstream tools to its agents.
    pub tool_listing: ToolListing,
}

impl EffectiveLimits {
    fn of(rules: &Rules) -> Self {
        Self {
            max_active_per_session: rules.limits.max_active_per_session,
            max_active_per_tenant: rules.limits.max_active_per_tenant,
            creations_per_minute: rules.limits.creations_per_minute,
            max_depth: rules.max_depth,
            default_budget: rules.budget.default_budget,
            max_budget: rules.budget.max_budget,
            session_budget: rules.budget.session_budget,
            models: rules.settings.models.clone(),
            upstreams: rules.settings.upstreams.clone(),
            tokens_per_day: rules.settings.tokens_per_day,
            tokens_per_month: rules.settings.tokens_per_month,
            tool_listing: rules.tool_listing,
        }
    }
}

/// A tenant's limits: its overrides, what they come to, and what it spent
/// towards its quotas.
#[derive(Debug, Serialize, ToSchema)]
pub struct LimitsView {
    pub tenant: String,
    /// What an operator set for the tenant (empty: nothing).
    pub overrides: TenantSettings,
    pub effective: EffectiveLimits,
    /// The deployment's own settings, which a field left out keeps.
    pub deployment: EffectiveLimits,
    /// Tokens counted towards the quotas today and this month (UTC), as
    /// written by every replica (each writes what it counted every second
    /// or so).
    pub spent_today: Tokens,
    pub spent_this_month: Tokens,
    /// When the overrides were last set, and by whom.
    pub updated_at: Option<DateTime<Utc>>,
    pub updated_by: Option<ActorView>,
}

async fn limits_view(state: &AdminState, tenant: &TenantId) -> Result<LimitsView, AdminError> {
    let store = state.service.store();
    let stored = store.tenant_settings(tenant).await?;
    let overrides = stored.as_ref().map(|s| s.settings.clone()).unwrap_or_default();
    let rules = state.service.tenant_rules().rules_for(overrides.clone());
    let base = state.service.tenant_rules().rules_for(TenantSettings::default());
    let today = state.service.clock().now().date_naive();
    let month_start = today.with_day(1).unwrap_or(today);
    let lines = store.usage(tenant, month_start, today).await?;
    let spend = |line: &&UsageLine| line.kind != UsageKind::Return;
    let tokens = |line: &UsageLine| line.tokens_in.saturating_add(line.tokens_out);
    let spent_this_month = lines.iter().filter(spend).map(tokens).sum();
    let spent_today = lines.iter().filter(spend).filter(|l| l.day == today).map(tokens).sum();
    Ok(LimitsView {
        tenant: tenant.to_string(),
        effective: EffectiveLimits::of(&rules),
        deployment: EffectiveLimits::of(&base),
        overrides,
        spent_today,
        spent_this_month,
        updated_at: stored.as_ref().map(|s| s.updated_at),
        updated_by: stored.map(|s| ActorView {
            tenant: s.updated_by.tenant.to_string(),
            subject: s.updated_by.subject.to_string(),
        }),
    })
}

/// A tenant's limits and quotas, and what it spent towards them.
#[utoipa::path(
    get, path = "/tenants/{tenant}/limits", tag = "limits",
    params(("tenant" = String, Path)),
    responses((status = 200, body = LimitsView), (status = 404, body = ErrorBody)),
)]
pub async fn limits(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<TenantPath>,
) -> Result<Json<LimitsView>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    Ok(Json(limits_view(&state, &tenant).await?))
}

/// Replaces a tenant's overrides (fields left out keep the deployment's
/// setting; `{}` removes every override). Every replica applies them
/// within seconds. Only a deployment admin may: a tenant admin raising its
/// own quota would make quotas pointless.
#[utoipa::path(
    put, path = "/tenants/{tenant}/limits", tag = "limits",
    params(("tenant" = String, Path)),
    request_body = TenantSettings,
    responses(
        (status = 200, body = LimitsView),
        (status = 400, body = ErrorBody),
        (status = 403, description = "not a deployment admin", body = ErrorBody),
    ),
)]
pub async fn put_limits(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<TenantPath>,
    BodyOf(settings): BodyOf<TenantSettings>,
) -> Result<Json<LimitsView>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    if !operator.is_deployment_admin() {
        return Err(AdminError::Forbidden);
    }
    let base = state.service.tenant_rules().base_budget();
    settings
        .validate(base)
        .map_err(|e| AdminError::BadRequest(format!("`{}` {}", e.field, e.reason)))?;
    let detail = serde_json::to_value(&settings).unwrap_or_default();
    let entry =
        audit_entry(&state, &operator, Some(&tenant), "limits.update", tenant.to_string(), detail);
    // The change and its entry are written in one transaction.
    state.service.store().put_tenant_settings(&tenant, &settings, &entry).await?;
    log_change(&entry);
    Ok(Json(limits_view(&state, &tenant).await?))
}

/// How to group a usage report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// One row per UTC day.
    #[default]
    Day,
    /// One row per upstream: its calls inside and outside branches.
    Upstream,
    /// One row per model: gateway-run branches' model calls.
    Model,
}

/// Which usage to report.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// First day (UTC, `YYYY-MM-DD`); default: six days before `to`.
    from: Option<NaiveDate>,
    /// Last day, included; default: today.
    to: Option<NaiveDate>,
    /// `day` (the default), `upstream` or `model`.
    group_by: Option<GroupBy>,
}

/// One row of a usage report.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct UsageRow {
    /// The day, upstream or model; `total` in the report's total.
    pub key: String,
    /// Upstream calls inside branches, and their tokens (arguments in,
    /// results as the agent received them out).
    pub branch_calls: u64,
    pub branch_tokens_in: Tokens,
    pub branch_tokens_out: Tokens,
    /// The same outside branches.
    pub outside_calls: u64,
    pub outside_tokens_in: Tokens,
    pub outside_tokens_out: Tokens,
    /// Model calls of gateway-run branches, and what the provider billed.
    pub model_calls: u64,
    pub model_input_tokens: Tokens,
    pub model_output_tokens: Tokens,
    /// Branches of depth 1 that returned; what they spent, which stayed out
    /// of the caller's context; the tokens of their findings, which went
    /// into it; and the difference: what folding saved.
    pub returns: u64,
    pub tokens_folded: Tokens,
    pub tokens_returned: Tokens,
    pub tokens_saved: Tokens,
}

impl UsageRow {
    fn add(&mut self, line: &UsageLine) {
        let (calls, tin, tout) = match line.kind {
            UsageKind::BranchCall => {
                (&mut self.branch_calls, &mut self.branch_tokens_in, &mut self.branch_tokens_out)
            }
            UsageKind::OutsideCall => {
                (&mut self.outside_calls, &mut self.outside_tokens_in, &mut self.outside_tokens_out)
            }
            UsageKind::Model => {
                (&mut self.model_calls, &mut self.model_input_tokens, &mut self.model_output_tokens)
            }
            UsageKind::Return => {
                (&mut self.returns, &mut self.tokens_folded, &mut self.tokens_returned)
            }
        };
        *calls = calls.saturating_add(line.calls);
        *tin = tin.saturating_add(line.tokens_in);
        *tout = tout.saturating_add(line.tokens_out);
        self.tokens_saved = self.tokens_folded.saturating_sub(self.tokens_returned);
    }
}

/// A tenant's usage over a span of days.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageReport {
    pub tenant: String,
    pub from: NaiveDate,
    pub to: NaiveDate,
    pub group_by: GroupBy,
    /// In order of their key.
    pub rows: Vec<UsageRow>,
    pub total: UsageRow,
}

/// What a tenant used, per day, upstream or model: tokens through branches
/// and outside them, model calls, returned tokens and what folding saved.
/// Kept per day apart from the detail, so reports outlive its retention;
/// each replica writes what it counted every second or so.
#[utoipa::path(
    get, path = "/tenants/{tenant}/usage", tag = "limits",
    params(("tenant" = String, Path), UsageQuery),
    responses(
        (status = 200, body = UsageReport),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
    ),
)]
pub async fn usage(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<TenantPath>,
    QueryOf(query): QueryOf<UsageQuery>,
) -> Result<Json<UsageReport>, AdminError> {
    let tenant = operator.tenant(&path.tenant)?;
    let to = query.to.unwrap_or_else(|| state.service.clock().now().date_naive());
    let from = query.from.unwrap_or_else(|| to - chrono::Days::new(6));
    if from > to || (to - from).num_days() >= MAX_USAGE_DAYS {
        return Err(AdminError::BadRequest(format!(
            "`from` must be on or before `to`, at most {MAX_USAGE_DAYS} days apart"
        )));
    }
    let group_by = query.group_by.unwrap_or_default();
    let lines = state.service.store().usage(&tenant, from, to).await?;
    let mut rows: BTreeMap<String, UsageRow> = BTreeMap::new();
    let mut total = UsageRow { key: "total".to_owned(), ..UsageRow::default() };
    for line in &lines {
        let key = match (group_by, line.kind) {
            (GroupBy::Day, _) => line.day.to_string(),
            (GroupBy::Upstream, UsageKind::BranchCall | UsageKind::OutsideCall)
            | (GroupBy::Model, UsageKind::Model) => line.name.clone(),
            (GroupBy::Upstream | GroupBy::Model, _) => continue,
        };
        rows.entry(key.clone())
            .or_insert_with(|| UsageRow { key, ..UsageRow::default() })
            .add(line);
        total.add(line);
    }
    Ok(Json(UsageReport {
        tenant: tenant.to_string(),
        from,
        to,
        group_by,
        rows: rows.into_values().collect(),
        total,
    }))
}
