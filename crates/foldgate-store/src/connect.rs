//! Connecting to a database by URL, and the settings both backends share.

pub use foldgate_domain::redact_url;
use std::{fmt, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};

use crate::{PgStore, SqliteStore, Store, StoreError};

/// A database URL. It may hold a password, so its `Debug` and `Display`
/// forms are [redacted](redact_url); [`DatabaseUrl::expose`] gives the URL
/// itself, for the one place that connects with it.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL as configured, password included.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for DatabaseUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl From<&str> for DatabaseUrl {
    fn from(url: &str) -> Self {
        Self(url.to_owned())
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(&self.0), f)
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// Connection settings shared by both backends.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `postgres://…`, `postgresql://…`, or `sqlite:PATH` / `sqlite://PATH`.
    pub url: DatabaseUrl,
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before failing.
    pub acquire_timeout: Duration,
    /// Postgres: whether the transaction that charges an upstream call to
    /// a branch waits for its commit to reach the disk. When `false`
    /// (`synchronous_commit = off` for that transaction alone) the charge
    /// survives a crash of the gateway, and only a crash of Postgres itself
    /// within its WAL writer's delay (≤ 3 × `wal_writer_delay`) can lose it.
    /// Branch creations and ends always wait for the disk.
    pub synchronous_metering: bool,
}

impl ConnectOptions {
    pub fn new(url: impl Into<DatabaseUrl>) -> Self {
        Self {
            url: url.into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            synchronous_metering: false,
        }
    }
}

/// How fresh a session's recorded activity is kept. Activity is written only
/// over a record at least this old, so that a busy session is written about
/// once a second rather than on every metered call: each such write is a
/// new row version with new index entries. The queries for idle sessions
/// allow for it, so that no session is taken for idle early.
pub const ACTIVITY_RESOLUTION: Duration = Duration::from_secs(1);

/// The latest recorded activity that activity at `at` replaces (and so
/// the latest record of a session idle since `at`): [`ACTIVITY_RESOLUTION`]
/// before it.
pub(crate) fn activity_stale_before(at: DateTime<Utc>) -> DateTime<Utc> {
    let resolution = chrono::TimeDelta::from_std(ACTIVITY_RESOLUTION).unwrap_or_default();
    at.checked_sub_signed(resolution).unwrap_or(at)
}

/// A pooled connection idle for less than this is handed out without a
/// liveness check. sqlx checks every connection as it goes back to the pool,
/// so a check on the way out again only matters once the connection has sat
/// long enough for the server or the network to have dropped it; on a busy
/// gateway it would cost every query a second round trip.
const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// The pool settings both backends share.
pub(crate) fn pool_options<DB: sqlx::Database>(
    options: &ConnectOptions,
) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= CHECK_IDLE_AFTER {
                    // A failed check closes the connection; the pool hands
                    // out another one.
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else {
            Err(StoreError::UnsupportedUrl(redact_url(url)))
        }
    }
}

/// Connects to the database a URL names. With `migrate`, applies pending
/// migrations first. Records no metrics (see [`connect_with_meter`]).
pub async fn connect(
    options: &ConnectOptions,
    migrate: bool,
) -> Result<Arc<dyn Store>, StoreError> {
    connect_metered(options, migrate, None).await
}

/// [`connect`], and the store records the duration of every call into
/// `meter` (`foldgate.db.operation.duration`).
pub async fn connect_with_meter(
    options: &ConnectOptions,
    migrate: bool,
    meter: &opentelemetry::metrics::Meter,
) -> Result<Arc<dyn Store>, StoreError> {
    connect_metered(options, migrate, Some(meter)).await
}

async fn connect_metered(
    options: &ConnectOptions,
    migrate: bool,
    meter: Option<&opentelemetry::metrics::Meter>,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match Backend::of_url(options.url.expose())? {
        Backend::Postgres => {
            let mut store = PgStore::connect(options).await?;
            if migrate {
                store.migrate().await?;
            }
            if let Some(meter) = meter {
                store = store.with_metrics(meter);
            }
            Arc::new(store)
        }
        Backend::Sqlite => {
            let mut store = SqliteStore::connect(options).await?;
            if migrate {
                store.migrate().await?;
            }
            if let Some(meter) = meter {
                store = store.with_metrics(meter);
            }
            Arc::new(store)
        }
    })
}

/// Applies pending migrations to the database a URL names.
pub async fn migrate(options: &ConnectOptions) -> Result<(), StoreError> {
    let store = connect(options, true).await?;
    store.close().await;
    Ok(())
}

/// Fails unless every migration this build knows is applied.
pub(crate) fn check_migrated(
    migrator: &sqlx::migrate::Migrator,
    applied: Option<i64>,
) -> Result<(), StoreError> {
    let latest = migrator.iter().map(|m| m.version).max();
    if latest.is_some() && applied < latest {
        return Err(StoreError::NotMigrated { applied, latest });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_by_url() {
        assert_eq!(Backend::of_url("postgres://h/db").unwrap(), Backend::Postgres);
        assert_eq!(Backend::of_url("postgresql://h/db").unwrap(), Backend::Postgres);
        assert_eq!(Backend::of_url("sqlite://foldgate.db").unwrap(), Backend::Sqlite);
        assert_eq!(Backend::of_url("sqlite::memory:").unwrap(), Backend::Sqlite);
        let err = Backend::of_url("mysql://u:pw@h/db").unwrap_err().to_string();
        assert!(!err.contains("pw"), "{err}");
    }
}
