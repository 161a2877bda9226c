//! Database latency: a [`Store`] that times every call of the store it
//! wraps into `foldgate.db.operation.duration`.
//!
//! A decorator rather than timers inside each backend, so that both
//! backends are measured the same way and the SQL code stays about SQL. A
//! store call is one operation as the engine sees it — usually one
//! transaction — so its duration includes waiting for a pooled connection
//! and any retries of a contended transaction: what a request actually
//! waits for.

use std::{
    fmt,
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, Consumption, Session, SessionId, Subject, TenantId, Tokens,
};
use foldgate_store::{
    Backend, BatchFinish, CallRecord, CallSummary, CreateRefusal, DueBranch, Finish, Finished,
    IdleSession, ModelUsage, NewBranch, NewStep, OutsideUsage, PoolUsage, Run, RunStep,
    StepWritten, Store, StoreError,
};
use opentelemetry::{
    KeyValue,
    metrics::{Histogram, Meter},
};

/// Bucket boundaries (seconds) for database operations: a millisecond for a
/// primary-key read on a local database, up to the connection acquire
/// timeout (5 s by default) and beyond.
const DB_BUCKETS: [f64; 14] =
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// A [`Store`] recording `foldgate.db.operation.duration` (histogram,
/// seconds) for every call: `db.operation.name` is the [`Store`] method
/// (`create_branch`, `meter_call`, …), `db.system.name` the backend
/// (`postgresql`, `sqlite`), and `error.type` is set on failure
/// ([`error_type`]). `pool_usage` and `close` are not timed.
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
    duration: Histogram<f64>,
    system: &'static str,
}

impl fmt::Debug for InstrumentedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstrumentedStore")
            .field("inner", &self.inner)
            .field("system", &self.system)
            .finish_non_exhaustive()
    }
}

impl InstrumentedStore {
    /// Wraps `inner`, a store of `backend`, recording into `meter`.
    pub fn new(inner: Arc<dyn Store>, backend: Backend, meter: &Meter) -> Self {
        let duration = meter
            .f64_histogram("foldgate.db.operation.duration")
            .with_description(
                "Duration of database operations (one store call each), including waiting for a \
                 connection",
            )
            .with_unit("s")
            .with_boundaries(DB_BUCKETS.to_vec())
            .build();
        let system = match backend {
            Backend::Postgres => "postgresql",
            Backend::Sqlite => "sqlite",
        };
        Self { inner, duration, system }
    }

    async fn timed<T>(
        &self,
        operation: &'static str,
        work: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = work.await;
        self.record(operation, started.elapsed(), result.as_ref().err());
        result
    }

    fn record(&self, operation: &'static str, took: Duration, error: Option<&StoreError>) {
        let mut attributes = vec![
            KeyValue::new("db.operation.name", operation),
            KeyValue::new("db.system.name", self.system),
        ];
        if let Some(error) = error {
            attributes.push(KeyValue::new("error.type", error_type(error)));
        }
        self.duration.record(took.as_secs_f64(), &attributes);
    }
}

/// `error.type` of a failed store call: a short, fixed name of what went
/// wrong (the database's own messages would make unbounded series).
pub fn error_type(error: &StoreError) -> &'static str {
    error.error_type()
}

#[async_trait]
impl Store for InstrumentedStore {
    async fn create_branch(
        &self,
        tenant: &TenantId,
        new: NewBranch,
    ) -> Result<Result<Branch, CreateRefusal>, StoreError> {
        self.timed("create_branch", self.inner.create_branch(tenant, new)).await
    }

    async fn branch(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Branch>, StoreError> {
        self.timed("branch", self.inner.branch(tenant, id)).await
    }

    async fn session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
    ) -> Result<Option<Session>, StoreError> {
        self.timed("session", self.inner.session(tenant, id)).await
    }

    async fn active_branch(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Option<Branch>, StoreError> {
        self.timed("active_branch", self.inner.active_branch(tenant, session)).await
    }

    async fn active_descendants(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<Vec<BranchId>, StoreError> {
        self.timed("active_descendants", self.inner.active_descendants(tenant, id)).await
    }

    async fn active_in_session(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Vec<BranchId>, StoreError> {
        self.timed("active_in_session", self.inner.active_in_session(tenant, session)).await
    }

    async fn consume(
        &self,
        tenant: &TenantId,
        id: BranchId,
        tokens: Tokens,
        at: DateTime<Utc>,
    ) -> Result<Option<Consumption>, StoreError> {
        self.timed("consume", self.inner.consume(tenant, id, tokens, at)).await
    }

    async fn meter_call(
        &self,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<Option<Consumption>, StoreError> {
        self.timed("meter_call", self.inner.meter_call(tenant, id, call)).await
    }

    async fn call_summary(
        &self,
        tenant: &TenantId,
        id: BranchId,
    ) -> Result<CallSummary, StoreError> {
        self.timed("call_summary", self.inner.call_summary(tenant, id)).await
    }

    async fn open_sessions_of(
        &self,
        tenant: &TenantId,
        owner: &Subject,
        limit: u32,
    ) -> Result<Vec<SessionId>, StoreError> {
        self.timed("open_sessions_of", self.inner.open_sessions_of(tenant, owner, limit)).await
    }

    async fn add_outside_usage(
        &self,
        tenant: &TenantId,
        session: Option<&SessionId>,
        usage: OutsideUsage,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.timed("add_outside_usage", self.inner.add_outside_usage(tenant, session, usage, at))
            .await
    }

    async fn outside_usage(
        &self,
        tenant: &TenantId,
        session: Option<&SessionId>,
    ) -> Result<OutsideUsage, StoreError> {
        self.timed("outside_usage", self.inner.outside_usage(tenant, session)).await
    }

    async fn finish(
        &self,
        tenant: &TenantId,
        id: BranchId,
        finish: Finish,
    ) -> Result<Finished, StoreError> {
        self.timed("finish", self.inner.finish(tenant, id, finish)).await
    }

    async fn finish_batch(&self, batch: &[BatchFinish]) -> Result<Vec<Branch>, StoreError> {
        self.timed("finish_batch", self.inner.finish_batch(batch)).await
    }

    async fn end_session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
        idle_since: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        self.timed("end_session", self.inner.end_session(tenant, id, at, idle_since)).await
    }

    async fn fail_session_branches(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        self.timed("fail_session_branches", self.inner.fail_session_branches(tenant, id, at)).await
    }

    async fn touch_session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.timed("touch_session", self.inner.touch_session(tenant, id, at)).await
    }

    async fn claim_due_branches(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<DueBranch>, StoreError> {
        self.timed("claim_due_branches", self.inner.claim_due_branches(now, lease, limit)).await
    }

    async fn claim_idle_sessions(
        &self,
        idle_since: DateTime<Utc>,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<IdleSession>, StoreError> {
        let claim = self.inner.claim_idle_sessions(idle_since, now, lease, limit);
        self.timed("claim_idle_sessions", claim).await
    }

    async fn next_deadline(&self, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.timed("next_deadline", self.inner.next_deadline(now)).await
    }

    async fn run(&self, tenant: &TenantId, id: BranchId) -> Result<Option<Run>, StoreError> {
        self.timed("run", self.inner.run(tenant, id)).await
    }

    async fn run_steps(&self, tenant: &TenantId, id: BranchId) -> Result<Vec<RunStep>, StoreError> {
        self.timed("run_steps", self.inner.run_steps(tenant, id)).await
    }

    async fn record_step(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        step: &NewStep,
    ) -> Result<StepWritten, StoreError> {
        self.timed("record_step", self.inner.record_step(tenant, id, owner, step)).await
    }

    async fn renew_run_lease(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.timed("renew_run_lease", self.inner.renew_run_lease(tenant, id, owner, until)).await
    }

    async fn finish_run(
        &self,
        tenant: &TenantId,
        id: BranchId,
        owner: &str,
        outcome: &str,
        returned_tokens: Tokens,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.timed(
            "finish_run",
            self.inner.finish_run(tenant, id, owner, outcome, returned_tokens, at),
        )
        .await
    }

    async fn claim_lapsed_runs(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<(TenantId, BranchId)>, StoreError> {
        self.timed("claim_lapsed_runs", self.inner.claim_lapsed_runs(owner, now, until, limit))
            .await
    }

    async fn ended_runs(&self, owner: &str) -> Result<Vec<BranchId>, StoreError> {
        self.timed("ended_runs", self.inner.ended_runs(owner)).await
    }

    async fn model_usage(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<(String, ModelUsage)>, StoreError> {
        self.timed("model_usage", self.inner.model_usage(tenant)).await
    }

    async fn session_returned_tokens(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Tokens, StoreError> {
        self.timed("session_returned_tokens", self.inner.session_returned_tokens(tenant, session))
            .await
    }

    async fn active_branches(&self) -> Result<Vec<(TenantId, u64)>, StoreError> {
        self.timed("active_branches", self.inner.active_branches()).await
    }

    fn pool_usage(&self) -> PoolUsage {
        self.inner.pool_usage()
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.timed("ready", self.inner.ready()).await
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use std::collections::BTreeMap;

    use foldgate_testkit::TestDb;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::{
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
        data::{AggregatedMetrics, MetricData},
    };

    use super::*;

    #[tokio::test]
    async fn every_call_is_timed_by_operation() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let db = TestDb::new(foldgate_testkit::Backend::Sqlite).await;
        let options = foldgate_store::ConnectOptions::new(db.url.clone());
        let inner = foldgate_store::connect(&options, true).await.unwrap();
        let store = InstrumentedStore::new(inner, Backend::Sqlite, &provider.meter("foldgate"));
        let tenant = TenantId::parse("acme").unwrap();
        let session = SessionId::parse("s").unwrap();

        store.ready().await.unwrap();
        assert!(store.session(&tenant, &session).await.unwrap().is_none());
        assert!(store.session(&tenant, &session).await.unwrap().is_none());
        assert_eq!(store.active_branches().await.unwrap(), vec![]);
        assert_eq!(store.pool_usage(), store.inner.pool_usage());
        store.close().await;
        // A closed pool fails every call: recorded with its error type.
        assert!(store.ready().await.is_err());
        provider.force_flush().unwrap();

        let mut counts: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
        for resource in exporter.get_finished_metrics().unwrap() {
            for scope in resource.scope_metrics() {
                for metric in scope.metrics() {
                    assert_eq!(metric.name(), "foldgate.db.operation.duration");
                    let AggregatedMetrics::F64(MetricData::Histogram(h)) = metric.data() else {
                        panic!("a histogram");
                    };
                    for point in h.data_points() {
                        let attr = |key: &str| {
                            point
                                .attributes()
                                .find(|kv| kv.key.as_str() == key)
                                .map(|kv| kv.value.to_string())
                        };
                        assert_eq!(attr("db.system.name").as_deref(), Some("sqlite"));
                        let key = (attr("db.operation.name").unwrap(), attr("error.type"));
                        *counts.entry(key).or_default() = point.count();
                    }
                }
            }
        }
        let expected: BTreeMap<(String, Option<String>), u64> = [
            (("ready".to_owned(), None), 1),
            (("ready".to_owned(), Some("pool_closed".to_owned())), 1),
            (("session".to_owned(), None), 2),
            (("active_branches".to_owned(), None), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(counts, expected);
        db.cleanup().await;
    }
}
