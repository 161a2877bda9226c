//! The engine's metric instruments, built from an injected meter so that
//! the process decides where metrics go (OTLP, Prometheus, or nowhere).
//!
//! Most instruments carry a `tenant` attribute. Tenants are configured
//! identities (the claim of a token the gateway's issuer signed), so their
//! number is bounded by the deployment; a deployment that mints tenants
//! freely (one per end user, say) multiplies every series by their number
//! and should drop the attribute in its collector.
//!
//! The counters a dashboard charts and alerts divide start at zero, so that
//! a quiet deployment reports zeros rather than nothing: each tenant's as
//! soon as the process knows the tenant ([`TenantSeries`]: it read it from
//! the database, or the tenant created a branch or had one refused), with
//! every value of their closed labels (statuses, end reasons, refusal
//! reasons), and the redaction count of every scrubbing rule. Histograms
//! appear with their first observation.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use foldgate_background::{Activation, BackgroundTask, BoxFuture};
use foldgate_domain::{
    Branch, BranchStatus, EndReason, LimitKind, TenantId, Tokens, VariantArray as _,
};
use foldgate_store::{CreateRefusal, CreateRefusalKind, Store};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, Meter, MeterProvider, noop::NoopMeterProvider},
};
use serde_json::json;

use crate::FoldError;

/// Bucket boundaries (seconds) for branch lifetimes: timeouts are capped at
/// 10 minutes by default, sessions run for up to hours.
const DURATION_BUCKETS: [f64; 12] =
    [0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

/// Bucket boundaries for fractions (budget used, compression).
const RATIO_BUCKETS: [f64; 12] = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];

/// Bucket boundaries (seconds) for how late the supervisor fires a
/// deadline: its poll interval is 500 ms by default.
const LAG_BUCKETS: [f64; 12] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Instruments the engine records into.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    /// The tenants whose series exist (at zero or more).
    tenants: Arc<TenantSeries>,
    /// `foldgate.secrets.redacted{rule}`: values redacted from returned
    /// messages, by the rule that found them.
    secrets_redacted: Counter<u64>,
    /// `foldgate.branches.created{tenant}`.
    created: Counter<u64>,
    /// `foldgate.branches.refused{tenant, reason}`: creates refused, by
    /// error code (limits: by the limit that was hit).
    refused: Counter<u64>,
    /// `foldgate.branches.completed{tenant, status, reason}`: branches that
    /// ended, however they ended (`reason="returned"` for a successful
    /// return by the agent).
    completed: Counter<u64>,
    /// `foldgate.branches.forced_returns{tenant, reason}`: branches the
    /// gateway ended (deadline, budget, parent returning, session ended).
    forced_returns: Counter<u64>,
    /// `foldgate.branch.duration{tenant, status}`: creation to end.
    duration: Histogram<f64>,
    /// `foldgate.branch.budget.utilization{tenant, status}`: the share of
    /// its budget a branch (with its children) had used when it ended.
    budget_utilization: Histogram<f64>,
    /// `foldgate.branch.compression{tenant}`: `1 - tokens returned / tokens
    /// consumed`, at each return by the agent (as `branch_return` reports it).
    compression: Histogram<f64>,
    /// `foldgate.tokens.consumed{tenant}`: tokens charged to branches.
    tokens_consumed: Counter<u64>,
    /// `foldgate.tokens.returned{tenant, kind, to}`: tokens of return
    /// messages handed to the parent (`to="caller"` for depth-1 branches,
    /// whose parent is the caller's own context; `to="branch"` otherwise),
    /// by the kind of branch (`agent`, `gateway`): what folding adds to
    /// contexts. Per session, `branch_status` reports it.
    tokens_returned: Counter<u64>,
    /// `foldgate.supervisor.lag`: how long after its deadline a branch was
    /// force-returned.
    supervisor_lag: Histogram<f64>,
}

impl EngineMetrics {
    pub fn new(meter: &Meter) -> Self {
        let branches = "{branch}";
        let metrics = Self {
            tenants: Arc::default(),
            secrets_redacted: meter
                .u64_counter("foldgate.secrets.redacted")
                .with_description("Secret values redacted from branch results, by rule")
                .with_unit("{secret}")
                .build(),
            created: meter
                .u64_counter("foldgate.branches.created")
                .with_description("Branches created")
                .with_unit(branches)
                .build(),
            refused: meter
                .u64_counter("foldgate.branches.refused")
                .with_description("Branch creations refused, by reason (error code or limit)")
                .with_unit(branches)
                .build(),
            completed: meter
                .u64_counter("foldgate.branches.completed")
                .with_description("Branches that ended, by final status and reason")
                .with_unit(branches)
                .build(),
            forced_returns: meter
                .u64_counter("foldgate.branches.forced_returns")
                .with_description("Branches ended by the gateway rather than the agent, by reason")
                .with_unit(branches)
                .build(),
            duration: meter
                .f64_histogram("foldgate.branch.duration")
                .with_description("Branch lifetime, from creation to its end")
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
            budget_utilization: meter
                .f64_histogram("foldgate.branch.budget.utilization")
                .with_description("Share of its token budget a branch had used when it ended")
                .with_unit("1")
                .with_boundaries(RATIO_BUCKETS.to_vec())
                .build(),
            compression: meter
                .f64_histogram("foldgate.branch.compression")
                .with_description(
                    "1 - tokens returned to the parent / tokens consumed by the branch (higher \
                     is more compression)",
                )
                .with_unit("1")
                .with_boundaries(RATIO_BUCKETS.to_vec())
                .build(),
            tokens_consumed: meter
                .u64_counter("foldgate.tokens.consumed")
                .with_description("Tokens charged to branches, as counted by the gateway")
                .with_unit("{token}")
                .build(),
            tokens_returned: meter
                .u64_counter("foldgate.tokens.returned")
                .with_description(
                    "Tokens of return messages handed to the parent: what folding adds to \
                     contexts",
                )
                .with_unit("{token}")
                .build(),
            supervisor_lag: meter
                .f64_histogram("foldgate.supervisor.lag")
                .with_description("Delay between a branch's deadline and its forced return")
                .with_unit("s")
                .with_boundaries(LAG_BUCKETS.to_vec())
                .build(),
        };
        let counters = TenantCounters {
            created: metrics.created.clone(),
            refused: metrics.refused.clone(),
            completed: metrics.completed.clone(),
            forced_returns: metrics.forced_returns.clone(),
            tokens_consumed: metrics.tokens_consumed.clone(),
        };
        metrics.tenants.on_new_tenant(move |who| counters.start(who));
        metrics
    }

    /// Instruments that record nothing.
    pub fn noop() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }

    /// The tenants whose series exist: what else keeps per-tenant series
    /// adds itself here ([`TenantSeries::on_new_tenant`]).
    pub fn tenants(&self) -> &Arc<TenantSeries> {
        &self.tenants
    }

    /// Starts the redaction count of each of `rules` at zero.
    pub(crate) fn start_rules(&self, rules: &[String]) {
        for rule in rules {
            self.secrets_redacted.add(0, &[rule_label(rule)]);
        }
    }

    pub(crate) fn redacted(&self, by_rule: &[(String, u64)]) {
        for (rule, count) in by_rule {
            self.secrets_redacted.add(*count, &[rule_label(rule)]);
        }
    }

    /// The tenant's attribute, its series started if it is new here.
    fn tenant(&self, who: &TenantId) -> KeyValue {
        self.tenants.saw(who);
        tenant(who)
    }

    pub(crate) fn created(&self, branch: &Branch) {
        let tenant = self.tenant(&branch.tenant);
        self.created.add(1, std::slice::from_ref(&tenant));
        // The prompt, charged at creation.
        self.tokens_consumed.add(branch.ledger.used, &[tenant]);
    }

    pub(crate) fn refused(&self, who: &TenantId, refusal: CreateRefusal) {
        self.refused.add(1, &refused_labels(self.tenant(who), refusal_reason(refusal)));
    }

    pub(crate) fn consumed(&self, who: &TenantId, tokens: Tokens) {
        if tokens > 0 {
            self.tokens_consumed.add(tokens, &[self.tenant(who)]);
        }
    }

    /// A branch that ended (by the agent or by the gateway).
    pub(crate) fn ended(&self, branch: &Branch) {
        let who = self.tenant(&branch.tenant);
        self.completed.add(1, &completed_labels(who.clone(), branch.status, branch.reason));
        if let Some(reason) = branch.reason.filter(|r| is_forced(*r)) {
            self.forced_returns.add(1, &forced_labels(who.clone(), reason));
        }
        let attributes = [who, KeyValue::new("status", branch.status.as_str())];
        if let Some(completed_at) = branch.completed_at {
            let lived = (completed_at - branch.created_at).to_std().unwrap_or_default();
            self.duration.record(lived.as_secs_f64(), &attributes);
        }
        if branch.ledger.budget > 0 {
            self.budget_utilization
                .record(fraction(branch.ledger.used, branch.ledger.budget), &attributes);
        }
    }

    /// Branches of a session failed all at once (`session_ended`), whose
    /// rows were not read back: counted, without durations.
    pub(crate) fn bulk_failed(&self, who: &TenantId, count: u64) {
        let who = self.tenant(who);
        let reason = EndReason::SessionEnded;
        self.completed.add(count, &completed_labels(who.clone(), reason.status(), Some(reason)));
        self.forced_returns.add(count, &forced_labels(who, reason));
    }

    /// A return: the message handed to the parent (`charged` of it was
    /// charged to the branch), and how much smaller it is than what the
    /// branch consumed.
    pub(crate) fn returned(&self, branch: &Branch, message_tokens: Tokens, charged: Tokens) {
        self.consumed(&branch.tenant, charged);
        let to = if branch.depth == 1 { "caller" } else { "branch" };
        self.tokens_returned.add(
            message_tokens,
            &[
                self.tenant(&branch.tenant),
                KeyValue::new("kind", branch.kind.as_str()),
                KeyValue::new("to", to),
            ],
        );
        if branch.ledger.used > 0 {
            let returned = message_tokens.min(branch.ledger.used);
            let compression = 1.0 - fraction(returned, branch.ledger.used);
            self.compression.record(compression.max(0.0), &[self.tenant(&branch.tenant)]);
        }
    }

    pub(crate) fn deadline_fired(&self, late: Duration) {
        self.supervisor_lag.record(late.as_secs_f64(), &[]);
    }
}

fn tenant(tenant: &TenantId) -> KeyValue {
    KeyValue::new("tenant", tenant.to_string())
}

fn rule_label(rule: &str) -> KeyValue {
    KeyValue::new("rule", rule.to_owned())
}

/// `foldgate.branches.completed`'s attributes: a branch the agent returned
/// successfully has no reason (`returned`).
fn completed_labels(
    who: KeyValue,
    status: BranchStatus,
    reason: Option<EndReason>,
) -> [KeyValue; 3] {
    [
        who,
        KeyValue::new("status", status.as_str()),
        KeyValue::new("reason", reason.map_or("returned", EndReason::as_str)),
    ]
}

/// Whether a branch ending for `reason` was ended by the gateway (rather
/// than returned by the agent, with a failure).
fn is_forced(reason: EndReason) -> bool {
    reason != EndReason::ReportedFailure
}

fn forced_labels(who: KeyValue, reason: EndReason) -> [KeyValue; 2] {
    [who, KeyValue::new("reason", reason.as_str())]
}

/// A refusal's `reason`: the limit that was hit, or the error code the
/// client gets.
fn refusal_reason(refusal: CreateRefusal) -> &'static str {
    match refusal {
        CreateRefusal::Limited { limit, .. } => limit.as_str(),
        other => FoldError::from(other).code().as_str(),
    }
}

fn refused_labels(who: KeyValue, reason: &'static str) -> [KeyValue; 2] {
    [who, KeyValue::new("reason", reason)]
}

/// Every `reason` a refusal can have: one refusal of each kind (of each
/// limit), through [`refusal_reason`]. The values inside a refusal do not
/// change its reason.
fn every_refusal_reason() -> BTreeSet<&'static str> {
    let mut reasons = BTreeSet::new();
    for kind in CreateRefusalKind::VARIANTS {
        let refusal = match kind {
            CreateRefusalKind::SessionNotFound => CreateRefusal::SessionNotFound,
            CreateRefusalKind::ParentNotFound => CreateRefusal::ParentNotFound,
            CreateRefusalKind::ParentIsGatewayRun => CreateRefusal::ParentIsGatewayRun,
            CreateRefusalKind::ParentNotActive => {
                CreateRefusal::ParentNotActive { status: BranchStatus::Completed }
            }
            CreateRefusalKind::MaxDepthExceeded => CreateRefusal::MaxDepthExceeded { max_depth: 0 },
            CreateRefusalKind::BudgetExhausted => CreateRefusal::BudgetExhausted { available: 0 },
            CreateRefusalKind::PromptOverBudget => {
                CreateRefusal::PromptOverBudget { prompt_tokens: 0, budget: 0 }
            }
            CreateRefusalKind::Limited => {
                for &limit in LimitKind::VARIANTS {
                    let limited = CreateRefusal::Limited { limit, retry_after: Duration::ZERO };
                    reasons.insert(refusal_reason(limited));
                }
                continue;
            }
        };
        reasons.insert(refusal_reason(refusal));
    }
    reasons
}

/// The per-tenant counters, for starting a tenant's series.
#[derive(Debug)]
struct TenantCounters {
    created: Counter<u64>,
    refused: Counter<u64>,
    completed: Counter<u64>,
    forced_returns: Counter<u64>,
    tokens_consumed: Counter<u64>,
}

impl TenantCounters {
    /// Adds zero to each series the tenant's events add to: every way a
    /// branch ends (with its status), every forced return, every refusal.
    fn start(&self, who: &TenantId) {
        let who = tenant(who);
        self.created.add(0, std::slice::from_ref(&who));
        self.tokens_consumed.add(0, std::slice::from_ref(&who));
        self.completed.add(0, &completed_labels(who.clone(), BranchStatus::Completed, None));
        for &reason in EndReason::VARIANTS {
            self.completed.add(0, &completed_labels(who.clone(), reason.status(), Some(reason)));
            if is_forced(reason) {
                self.forced_returns.add(0, &forced_labels(who.clone(), reason));
            }
        }
        for reason in every_refusal_reason() {
            self.refused.add(0, &refused_labels(who.clone(), reason));
        }
    }
}

/// A function that starts one tenant's series.
type Starter = Arc<dyn Fn(&TenantId) + Send + Sync>;

/// The tenants this process keeps series for, and what starts a tenant's
/// series at zero the first time it is seen: the engine's counters, and
/// whatever else adds itself (the upstreams' token counts). Tenants are
/// seen when the database is read for the active-branch gauge (every tenant
/// that ever had a branch) and when the engine records anything for one.
/// A tenant stays known for the life of the process.
#[derive(Default)]
pub struct TenantSeries {
    known: RwLock<Known>,
}

#[derive(Default)]
struct Known {
    tenants: HashSet<TenantId>,
    starters: Vec<Starter>,
}

impl std::fmt::Debug for TenantSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("TenantSeries")
            .field("tenants", &known.tenants.len())
            .field("starters", &known.starters.len())
            .finish()
    }
}

impl TenantSeries {
    /// Runs `start` for every tenant known now and for each one seen later
    /// (once per tenant). It runs outside any lock of this registry.
    pub fn on_new_tenant(&self, start: impl Fn(&TenantId) + Send + Sync + 'static) {
        let start: Starter = Arc::new(start);
        let tenants: Vec<TenantId> = {
            let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
            known.starters.push(Arc::clone(&start));
            known.tenants.iter().cloned().collect()
        };
        for who in &tenants {
            start(who);
        }
    }

    /// Notes that `who` has series; the first time, starts them.
    pub fn saw(&self, who: &TenantId) {
        if self.known.read().unwrap_or_else(PoisonError::into_inner).tenants.contains(who) {
            return;
        }
        let starters = {
            let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
            if !known.tenants.insert(who.clone()) {
                return;
            }
            known.starters.clone()
        };
        for start in &starters {
            start(who);
        }
    }

    /// Every tenant seen so far.
    pub fn tenants(&self) -> Vec<TenantId> {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        known.tenants.iter().cloned().collect()
    }
}

#[expect(clippy::cast_precision_loss, reason = "token counts are far below 2^52")]
fn fraction(part: Tokens, whole: Tokens) -> f64 {
    (part as f64 / whole as f64).clamp(0.0, 1.0)
}

/// Gauges read from the store: active branches per tenant (refreshed in the
/// background, since reading the database cannot happen inside a metric
/// callback) and the connection pool (read at each collection).
///
/// `foldgate.branches.active{tenant}` is the deployment-wide count every
/// replica reads from the database: aggregate replicas with `max`, not
/// `sum`. Every tenant of `tenants` has a value: one the last reading did
/// not include (first seen since, by this process) reports 0, as it had no
/// branch then. `foldgate.db.pool.connections{state}` and
/// `foldgate.db.pool.connections.max` are per process.
///
/// The refresh is a task of the background driver (`store_gauges`), run
/// every `telemetry.store_poll_interval`. Each reading also makes every
/// tenant it names known to `tenants`, whose series then start at zero.
#[derive(Debug)]
pub struct StoreGauges {
    store: Arc<dyn Store>,
    tenants: Arc<TenantSeries>,
    active: Arc<Mutex<HashMap<TenantId, u64>>>,
}

impl StoreGauges {
    /// Registers the gauges on `meter`; the active branch counts are read
    /// at each activation.
    pub fn new(meter: &Meter, store: Arc<dyn Store>, tenants: Arc<TenantSeries>) -> Self {
        let active: Arc<Mutex<HashMap<TenantId, u64>>> = Arc::default();
        {
            let active = Arc::clone(&active);
            let tenants = Arc::clone(&tenants);
            meter
                .u64_observable_gauge("foldgate.branches.active")
                .with_description(
                    "Active branches per tenant, deployment-wide (as of the last database reading)",
                )
                .with_unit("{branch}")
                .with_callback(move |observer| {
                    let known = tenants.tenants();
                    let active = active.lock().unwrap_or_else(PoisonError::into_inner);
                    for who in &known {
                        observer.observe(active.get(who).copied().unwrap_or(0), &[tenant(who)]);
                    }
                })
                .build();
        }
        {
            let store = Arc::clone(&store);
            meter
                .u64_observable_gauge("foldgate.db.pool.connections")
                .with_description("Database connections of this process, by state (used, idle)")
                .with_unit("{connection}")
                .with_callback(move |observer| {
                    let usage = store.pool_usage();
                    let used = usage.size.saturating_sub(usage.idle);
                    observer.observe(u64::from(used), &[KeyValue::new("state", "used")]);
                    observer.observe(u64::from(usage.idle), &[KeyValue::new("state", "idle")]);
                })
                .build();
        }
        {
            let store = Arc::clone(&store);
            meter
                .u64_observable_gauge("foldgate.db.pool.connections.max")
                .with_description("The most database connections this process opens")
                .with_unit("{connection}")
                .with_callback(move |observer| {
                    observer.observe(u64::from(store.pool_usage().max), &[]);
                })
                .build();
        }
        Self { store, tenants, active }
    }

    /// Reads the active branch counts. On failure the last reading stays;
    /// the database being down is reported by readiness and by the requests
    /// that fail.
    async fn refresh(&self) -> Activation {
        match self.store.active_branches().await {
            Ok(counts) => {
                let status = json!({"tenants": counts.len()});
                for (who, _) in &counts {
                    self.tenants.saw(who);
                }
                *self.active.lock().unwrap_or_else(PoisonError::into_inner) =
                    counts.into_iter().collect();
                Activation::ok(status)
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not read active branch counts");
                Activation::failed(e, json!({}))
            }
        }
    }
}

impl BackgroundTask for StoreGauges {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.refresh())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn tenant_id(name: &str) -> TenantId {
        TenantId::parse(name).unwrap()
    }

    #[test]
    fn each_starter_runs_once_for_each_tenant_whenever_either_came() {
        let series = TenantSeries::default();
        let started: Arc<Mutex<Vec<(&str, String)>>> = Arc::default();
        let starter = |label: &'static str| {
            let started = Arc::clone(&started);
            move |who: &TenantId| started.lock().unwrap().push((label, who.to_string()))
        };
        series.saw(&tenant_id("acme"));
        series.on_new_tenant(starter("first"));
        series.saw(&tenant_id("globex"));
        series.saw(&tenant_id("acme"));
        series.on_new_tenant(starter("second"));
        series.saw(&tenant_id("globex"));

        let mut started = started.lock().unwrap().clone();
        started.sort();
        let expected =
            [("first", "acme"), ("first", "globex"), ("second", "acme"), ("second", "globex")]
                .map(|(l, t)| (l, t.to_owned()));
        assert_eq!(started, expected);
        let mut tenants = series.tenants();
        tenants.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        assert_eq!(tenants, [tenant_id("acme"), tenant_id("globex")]);
    }

    #[test]
    fn refusal_reasons_are_the_error_codes_and_the_limits() {
        let reasons: Vec<&str> = every_refusal_reason().into_iter().collect();
        assert_eq!(
            reasons,
            [
                "branch_not_active",
                "branch_not_found",
                "budget_exhausted",
                "deployment_active_branches",
                "gateway_run_branch",
                "max_depth_exceeded",
                "session_active_branches",
                "session_creation_rate",
                "session_not_found",
                "tenant_active_branches",
            ]
        );
    }
}
