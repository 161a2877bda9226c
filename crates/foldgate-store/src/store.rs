//! [`SqlStore`], the store over either backend, and its transaction runner.

use std::{fmt, future::Future, marker::PhantomData, time::Instant};

use opentelemetry::metrics::Meter;
use sqlx::Pool;

use crate::{StoreError, dialect::Dialect, metrics::StoreMetrics, tx::Tx};

/// How often a transaction that the database aborted for a retryable reason
/// (see [`Dialect::is_retryable`]) is run before the error is returned.
const CONFLICT_RETRIES: usize = 5;

/// The store over the database of dialect `D`: [`crate::PgStore`] or
/// [`crate::SqliteStore`].
pub struct SqlStore<D: Dialect> {
    pub(crate) pool: Pool<D::DB>,
    /// Postgres: whether metering waits for the disk (see
    /// [`crate::ConnectOptions::synchronous_metering`]).
    pub(crate) synchronous_metering: bool,
    metrics: Option<StoreMetrics>,
    dialect: PhantomData<D>,
}

impl<D: Dialect> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("system", &D::SYSTEM)
            .field("pool", &self.pool)
            .field("synchronous_metering", &self.synchronous_metering)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            synchronous_metering: self.synchronous_metering,
            metrics: self.metrics.clone(),
            dialect: PhantomData,
        }
    }
}

impl<D: Dialect> SqlStore<D> {
    pub(crate) fn new(pool: Pool<D::DB>, synchronous_metering: bool) -> Self {
        Self { pool, synchronous_metering, metrics: None, dialect: PhantomData }
    }

    /// Records the duration of every store call into `meter` (see
    /// [`StoreMetrics`]); without it, nothing is recorded.
    #[must_use]
    pub fn with_metrics(mut self, meter: &Meter) -> Self {
        self.metrics = Some(StoreMetrics::new(meter, D::SYSTEM));
        self
    }

    pub fn pool(&self) -> &Pool<D::DB> {
        &self.pool
    }

    /// Runs `work`, the store call `operation`, and records how long it took.
    pub(crate) async fn timed<R>(
        &self,
        operation: &'static str,
        work: impl Future<Output = Result<R, StoreError>>,
    ) -> Result<R, StoreError> {
        let started = Instant::now();
        let result = work.await;
        if let Some(metrics) = &self.metrics {
            metrics.record(operation, started.elapsed(), result.as_ref().err());
        }
        result
    }

    /// Runs `op`, the store call `operation`, in a transaction and commits
    /// it if `op` succeeded and `keep` approves of the result (a refusal
    /// rolls back, writing nothing). A transaction the database aborted for
    /// a retryable reason is run again, up to [`CONFLICT_RETRIES`] times. The
    /// whole, retries included, is timed as `operation`.
    pub(crate) async fn in_tx<R, F, Fut>(
        &self,
        operation: &'static str,
        keep: fn(&R) -> bool,
        mut op: F,
    ) -> Result<R, StoreError>
    where
        F: FnMut(Tx<D>) -> Fut + Send,
        Fut: Future<Output = (Tx<D>, Result<R, StoreError>)> + Send,
        R: Send,
    {
        let run = async {
            let mut attempt = 0;
            loop {
                attempt += 1;
                let result = match D::begin(&self.pool).await {
                    Ok(tx) => {
                        let (tx, result) = op(Tx(tx)).await;
                        match result {
                            Ok(value) if keep(&value) => {
                                tx.0.commit().await.map(|()| value).map_err(StoreError::from)
                            }
                            Ok(value) => {
                                tx.0.rollback().await.map(|()| value).map_err(StoreError::from)
                            }
                            // Dropping the transaction rolls it back.
                            Err(e) => Err(e),
                        }
                    }
                    Err(e) => Err(StoreError::from(e)),
                };
                if !retry_after_conflict::<D, R>(attempt, &result) {
                    return result;
                }
            }
        };
        self.timed(operation, run).await
    }
}

/// Whether the `attempt`th run of a transaction (or of a statement that is
/// one) should be followed by another: the database aborted it for a
/// retryable reason, and it has run fewer than [`CONFLICT_RETRIES`] times.
pub(crate) fn retry_after_conflict<D: Dialect, R>(
    attempt: usize,
    result: &Result<R, StoreError>,
) -> bool {
    let retry = attempt < CONFLICT_RETRIES && result.as_ref().is_err_and(D::is_retryable);
    if retry {
        tracing::debug!(attempt, "retrying after a conflict");
    }
    retry
}
