//! Database latency: `foldgate.db.operation.duration`.

use std::time::Duration;

use opentelemetry::{
    KeyValue,
    metrics::{Histogram, Meter},
};

use crate::StoreError;

/// Bucket boundaries (seconds) for database operations: a millisecond for a
/// primary-key read on a local database, up to the connection acquire
/// timeout (5 s by default) and beyond.
const DB_BUCKETS: [f64; 14] =
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// Records `foldgate.db.operation.duration` (histogram, seconds) for every
/// store call: `db.operation.name` is the [`crate::Store`] method
/// (`create_branch`, `meter_call`, …), `db.system.name` the backend
/// (`postgresql`, `sqlite`), and `error.type` is set on failure
/// ([`StoreError::error_type`]). A call is one operation as the engine sees
/// it — usually one transaction — so its duration includes waiting for a
/// pooled connection and any retries of a contended transaction.
/// `pool_usage` and `close` are not timed.
#[derive(Debug, Clone)]
pub(crate) struct StoreMetrics {
    duration: Histogram<f64>,
    system: &'static str,
}

impl StoreMetrics {
    pub fn new(meter: &Meter, system: &'static str) -> Self {
        let duration = meter
            .f64_histogram("foldgate.db.operation.duration")
            .with_description(
                "Duration of database operations (one store call each), including waiting for a \
                 connection",
            )
            .with_unit("s")
            .with_boundaries(DB_BUCKETS.to_vec())
            .build();
        Self { duration, system }
    }

    pub fn record(&self, operation: &'static str, took: Duration, error: Option<&StoreError>) {
        let mut attributes = vec![
            KeyValue::new("db.operation.name", operation),
            KeyValue::new("db.system.name", self.system),
        ];
        if let Some(error) = error {
            attributes.push(KeyValue::new("error.type", error.error_type()));
        }
        self.duration.record(took.as_secs_f64(), &attributes);
    }
}
