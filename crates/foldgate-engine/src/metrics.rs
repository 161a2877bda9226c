//! The engine's metric instruments, built from an injected meter so that
//! the process decides where metrics go (OTLP, Prometheus, or nowhere).
//!
//! Most instruments carry a `tenant` attribute. Tenants are configured
//! identities (the claim of a token the gateway's issuer signed), so their
//! number is bounded by the deployment; a deployment that mints tenants
//! freely (one per end user, say) multiplies every series by their number
//! and should drop the attribute in its collector.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use foldgate_background::{Activation, BackgroundTask, BoxFuture};
use foldgate_domain::{Branch, BranchStatus, EndReason, TenantId, Tokens};
use foldgate_store::Store;
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
        Self {
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
        }
    }

    /// Instruments that record nothing.
    pub fn noop() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }

    pub(crate) fn redacted(&self, by_rule: &[(String, u64)]) {
        for (rule, count) in by_rule {
            self.secrets_redacted.add(*count, &[KeyValue::new("rule", rule.clone())]);
        }
    }

    pub(crate) fn created(&self, branch: &Branch) {
        let tenant = tenant(&branch.tenant);
        self.created.add(1, std::slice::from_ref(&tenant));
        // The prompt, charged at creation.
        self.tokens_consumed.add(branch.ledger.used, &[tenant]);
    }

    pub(crate) fn refused(&self, who: &TenantId, error: &FoldError) {
        let reason = match error {
            FoldError::RateLimited { limit, .. } => limit.as_str(),
            other => other.code().as_str(),
        };
        self.refused.add(1, &[tenant(who), KeyValue::new("reason", reason)]);
    }

    pub(crate) fn consumed(&self, who: &TenantId, tokens: Tokens) {
        if tokens > 0 {
            self.tokens_consumed.add(tokens, &[tenant(who)]);
        }
    }

    /// A branch that ended (by the agent or by the gateway).
    pub(crate) fn ended(&self, branch: &Branch) {
        let status = KeyValue::new("status", branch.status.as_str());
        let reason = branch.reason.map_or("returned", EndReason::as_str);
        self.completed
            .add(1, &[tenant(&branch.tenant), status.clone(), KeyValue::new("reason", reason)]);
        if let Some(reason) = branch.reason.filter(|r| *r != EndReason::ReportedFailure) {
            self.forced_returns
                .add(1, &[tenant(&branch.tenant), KeyValue::new("reason", reason.as_str())]);
        }
        let attributes = [tenant(&branch.tenant), status];
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
        let reason = KeyValue::new("reason", EndReason::SessionEnded.as_str());
        self.completed.add(
            count,
            &[tenant(who), KeyValue::new("status", BranchStatus::Failed.as_str()), reason.clone()],
        );
        self.forced_returns.add(count, &[tenant(who), reason]);
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
                tenant(&branch.tenant),
                KeyValue::new("kind", branch.kind.as_str()),
                KeyValue::new("to", to),
            ],
        );
        if branch.ledger.used > 0 {
            let returned = message_tokens.min(branch.ledger.used);
            let compression = 1.0 - fraction(returned, branch.ledger.used);
            self.compression.record(compression.max(0.0), &[tenant(&branch.tenant)]);
        }
    }

    pub(crate) fn deadline_fired(&self, late: Duration) {
        self.supervisor_lag.record(late.as_secs_f64(), &[]);
    }
}

fn tenant(tenant: &TenantId) -> KeyValue {
    KeyValue::new("tenant", tenant.to_string())
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
/// `sum`. `foldgate.db.pool.connections{state}` and
/// `foldgate.db.pool.connections.max` are per process.
///
/// The refresh is a task of the background driver (`store_gauges`), run
/// every `telemetry.store_poll_interval`.
#[derive(Debug)]
pub struct StoreGauges {
    store: Arc<dyn Store>,
    active: Arc<Mutex<Vec<(TenantId, u64)>>>,
}

impl StoreGauges {
    /// Registers the gauges on `meter`; the active branch counts are read
    /// at each activation.
    pub fn new(meter: &Meter, store: Arc<dyn Store>) -> Self {
        let active: Arc<Mutex<Vec<(TenantId, u64)>>> = Arc::default();
        {
            let active = Arc::clone(&active);
            meter
                .u64_observable_gauge("foldgate.branches.active")
                .with_description(
                    "Active branches per tenant, deployment-wide (as of the last database reading)",
                )
                .with_unit("{branch}")
                .with_callback(move |observer| {
                    let active = active.lock().unwrap_or_else(PoisonError::into_inner);
                    for (who, count) in active.iter() {
                        observer.observe(*count, &[tenant(who)]);
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
        Self { store, active }
    }

    /// Reads the active branch counts. On failure the last reading stays;
    /// the database being down is reported by readiness and by the requests
    /// that fail.
    async fn refresh(&self) -> Activation {
        match self.store.active_branches().await {
            Ok(counts) => {
                let status = json!({"tenants": counts.len()});
                *self.active.lock().unwrap_or_else(PoisonError::into_inner) = counts;
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
