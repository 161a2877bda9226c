//! Test support: a fresh database per test on either backend, a folding
//! service wired to it, and principals; [`on_both_backends!`] to run a test
//! on each backend; an MCP server to put behind the gateway ([`upstream`]);
//! a scripted model provider ([`model_server`]); and, with the `gateway`
//! feature, the real gateway started for a test ([`gateway`]).
//!
//! Postgres tests need a server; the URL comes from
//! `FOLDGATE_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`).
//! A test that cannot reach it fails: it never skips.
//!
//! # Where this crate sits
//!
//! It depends on the crates below the binary (domain, store, engine) for
//! everything, and on the `foldgate` crate itself only for the gateway
//! harness, behind the `gateway` feature. `foldgate` names this crate as a
//! dev-dependency (with that feature), never as a normal one, so the
//! normal dependency graph has no cycle: Cargo builds `foldgate`'s library
//! first, then this crate on top of it, then `foldgate`'s tests on both.
//! A dependency of this crate on `foldgate` without the feature would
//! also be no cycle, but it would make every crate whose tests use this
//! one (the engine, the runner, the upstream client) build the whole
//! gateway for `cargo test -p` of it; with the feature they do not (a
//! `--workspace` build unifies features and builds this crate once, with
//! it).
//!
//! The bench depends on this crate normally, without the feature: its
//! baseline echo server is [`upstream`]'s server and its model server is
//! [`model_server`]. Its tests, like `foldgate`'s, add the feature as a
//! dev-dependency.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, reason = "test support")]

pub mod catalog;
pub mod child;
#[cfg(feature = "gateway")]
pub mod gateway;
pub mod model_server;
pub mod upstream;

/// A test on each backend (`postgres::name`, `sqlite::name`) for each
/// `async fn name(backend: Backend)` named; by default a `#[tokio::test]`,
/// or the test attribute given first:
///
/// ```text
/// on_both_backends!(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] a, b);
/// ```
#[macro_export]
macro_rules! on_both_backends {
    (#[$test:meta] $($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[$test]
                async fn $name() {
                    super::$name($crate::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[$test]
                async fn $name() {
                    super::$name($crate::Backend::Sqlite).await;
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        $crate::on_both_backends!(#[tokio::test] $($name),*);
    };
}

use std::{
    sync::{Arc, OnceLock},
    time::{SystemTime, UNIX_EPOCH},
};

use foldgate_domain::{Principal, Subject, TenantId};
use foldgate_engine::{
    Clock, FoldingConfig, FoldingService, ScrubFailure, Scrubbed, Scrubber, SystemClock,
    TokenCounter,
};
use foldgate_store::{ConnectOptions, PgStore, SqliteStore, Store};
use sqlx::{Connection, Executor, postgres::PgConnectOptions};

/// The Postgres server tests use.
pub fn postgres_url() -> String {
    std::env::var("FOLDGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A fresh, migrated database: a new schema on the test Postgres server, or
/// a new SQLite file in a temporary directory.
#[derive(Debug)]
pub struct TestDb {
    pub backend: Backend,
    /// A URL other processes can use to reach the same database.
    pub url: String,
    /// Postgres: the schema holding this test's tables.
    schema: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

/// Schemas of earlier runs older than this are dropped when a new test
/// database is made, so that aborted runs do not pile up.
const STALE_SCHEMA_SECS: u64 = 3600;

fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => Self::postgres().await,
            Backend::Sqlite => Self::sqlite().await,
        }
    }

    pub async fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("foldgate.db").display());
        let db = Self { backend: Backend::Sqlite, url, schema: None, _dir: Some(dir) };
        db.connect().await.close().await;
        db
    }

    pub async fn postgres() -> Self {
        let url = postgres_url();
        let mut admin = sqlx::PgConnection::connect(&url).await.unwrap_or_else(|e| {
            panic!(
                "the Postgres test suite cannot reach its database at {url} ({e}); \
                 start Postgres or set FOLDGATE_TEST_DATABASE_URL"
            )
        });
        drop_stale_schemas(&mut admin).await;
        let schema = format!("foldgate_test_{}_{}", unix_secs(), uuid::Uuid::new_v4().simple());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .await
            .expect("create test schema");
        admin.close().await.ok();
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}options=-c%20search_path%3D{schema}");
        let db = Self { backend: Backend::Postgres, url, schema: Some(schema), _dir: None };
        db.connect().await.close().await;
        db
    }

    /// A new store with its own connection pool (a "replica"), migrated.
    pub async fn connect(&self) -> Arc<dyn Store> {
        let options = ConnectOptions::new(self.url.clone());
        match self.backend {
            Backend::Sqlite => {
                let store = SqliteStore::connect(&options).await.expect("open SQLite");
                store.migrate().await.expect("migrate SQLite");
                Arc::new(store)
            }
            Backend::Postgres => {
                let connect: PgConnectOptions = self.url.parse().expect("Postgres URL");
                let store = PgStore::connect_with(connect, &options).await.expect("connect");
                store.migrate().await.expect("migrate Postgres");
                Arc::new(store)
            }
        }
    }

    /// Drops the Postgres schema (SQLite files go with their directory).
    pub async fn cleanup(self) {
        if let Some(schema) = &self.schema
            && let Ok(mut admin) = sqlx::PgConnection::connect(&postgres_url()).await
        {
            let _ =
                admin.execute(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).await;
        }
    }
}

async fn drop_stale_schemas(admin: &mut sqlx::PgConnection) {
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'foldgate\\_test\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    let cutoff = unix_secs().saturating_sub(STALE_SCHEMA_SECS);
    for schema in schemas {
        let created = schema.split('_').nth(2).and_then(|s| s.parse::<u64>().ok());
        if created.is_some_and(|t| t < cutoff) {
            let _ = admin
                .execute(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")))
                .await;
        }
    }
}

/// One tokenizer for the whole test process (loading it takes a moment).
pub fn token_counter() -> TokenCounter {
    static COUNTER: OnceLock<TokenCounter> = OnceLock::new();
    COUNTER
        .get_or_init(|| TokenCounter::new(foldgate_engine::Encoding::default()).expect("tokenizer"))
        .clone()
}

/// A principal from plain strings.
pub fn principal(tenant: &str, sub: &str) -> Principal {
    Principal::new(TenantId::parse(tenant).unwrap(), Subject::parse(sub).unwrap())
}

/// A scrubber that always fails, to prove the return path fails closed.
#[derive(Debug, Clone, Copy)]
pub struct FailingScrubber;

impl Scrubber for FailingScrubber {
    fn scrub(&self, _text: &str) -> Result<Scrubbed, ScrubFailure> {
        Err(ScrubFailure("rule engine unavailable".into()))
    }

    fn scrub_json(
        &self,
        _value: &serde_json::Value,
    ) -> Result<foldgate_engine::ScrubbedValue, ScrubFailure> {
        Err(ScrubFailure("rule engine unavailable".into()))
    }
}

/// Builds a folding service over a store.
#[derive(Debug)]
pub struct ServiceBuilder {
    store: Arc<dyn Store>,
    config: FoldingConfig,
    clock: Arc<dyn Clock>,
    scrubber: Arc<dyn Scrubber>,
    metrics: Option<foldgate_engine::EngineMetrics>,
    memory: Option<foldgate_engine::MemoryConfig>,
}

impl ServiceBuilder {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            config: FoldingConfig::default(),
            clock: Arc::new(SystemClock),
            scrubber: foldgate_engine::default_scrubber().expect("built-in scrubber"),
            metrics: None,
            memory: None,
        }
    }

    /// With a reasoning memory (the built-in injection screen unless the
    /// config names a file).
    pub fn memory(mut self, memory: foldgate_engine::MemoryConfig) -> Self {
        self.memory = Some(memory);
        self
    }

    pub fn metrics(mut self, metrics: foldgate_engine::EngineMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn config(mut self, config: FoldingConfig) -> Self {
        self.config = config;
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn scrubber(mut self, scrubber: Arc<dyn Scrubber>) -> Self {
        self.scrubber = scrubber;
        self
    }

    pub fn build(self) -> Arc<FoldingService> {
        let mut service = FoldingService::new(
            Arc::clone(&self.store),
            token_counter(),
            Arc::clone(&self.scrubber),
            Arc::clone(&self.clock),
            self.config,
        );
        if let Some(metrics) = self.metrics {
            service = service.with_metrics(metrics);
        }
        if let Some(memory) = self.memory {
            let screen = memory.screen().expect("the injection screen");
            let bank = foldgate_engine::MemoryBank::new(
                self.store,
                self.scrubber,
                screen,
                token_counter(),
                self.clock,
                memory,
            );
            service = service.with_memory(Arc::new(bank));
        }
        Arc::new(service)
    }
}

/// Active-branch counters as stored: (the tenant's, the deployment's).
/// They must always equal the number of active branches. Each is the sum of
/// its stripes.
pub async fn active_counters(db: &TestDb, tenant: &str) -> (i64, i64) {
    use sqlx::Row;
    let q_tenant = "SELECT CAST(COALESCE(SUM(active_branches), 0) AS BIGINT) FROM tenant_usage \
                    WHERE tenant_id = $1";
    let q_total = "SELECT CAST(COALESCE(SUM(active_branches), 0) AS BIGINT) FROM deployment_usage";
    match db.backend {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let t: i64 = sqlx::query(q_tenant).bind(tenant).fetch_one(&mut c).await.unwrap().get(0);
            let d: i64 = sqlx::query(q_total).fetch_one(&mut c).await.unwrap().get(0);
            (t, d)
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            let t: i64 = sqlx::query(q_tenant).bind(tenant).fetch_one(&mut c).await.unwrap().get(0);
            let d: i64 = sqlx::query(q_total).fetch_one(&mut c).await.unwrap().get(0);
            (t, d)
        }
    }
}

/// Moves the end of a session and of its branches `days` back, each
/// instant as its backend writes it: old work, for retention.
pub async fn age_session(db: &TestDb, session: &str, days: u32) {
    let ago = match db.backend {
        Backend::Postgres => format!("now() - interval '{days} days'"),
        Backend::Sqlite => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{days} days')"),
    };
    for statement in [
        format!("UPDATE branches SET completed_at = {ago} WHERE session_id = $1"),
        format!("UPDATE sessions SET ended_at = {ago} WHERE session_id = $1"),
    ] {
        let statement = sqlx::AssertSqlSafe(statement);
        match db.backend {
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
                sqlx::query(statement).bind(session).execute(&mut c).await.unwrap();
            }
            Backend::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
                sqlx::query(statement).bind(session).execute(&mut c).await.unwrap();
            }
        }
    }
}

/// Another client's transaction that has spent tokens of a branch and
/// holds its write lock (the branch's row lock on Postgres, the database's
/// write lock on SQLite) until [`HeldWrite::commit`].
#[derive(Debug)]
pub enum HeldWrite {
    Postgres(sqlx::PgConnection),
    Sqlite(sqlx::SqliteConnection),
}

impl HeldWrite {
    pub async fn spend(db: &TestDb, branch: uuid::Uuid, tokens: i64) -> Self {
        let spend = "UPDATE branches SET used = used + $1 WHERE id = $2";
        match db.backend {
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
                c.execute("BEGIN").await.unwrap();
                sqlx::query(spend).bind(tokens).bind(branch).execute(&mut c).await.unwrap();
                Self::Postgres(c)
            }
            Backend::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
                c.execute("BEGIN IMMEDIATE").await.unwrap();
                sqlx::query(spend).bind(tokens).bind(branch).execute(&mut c).await.unwrap();
                Self::Sqlite(c)
            }
        }
    }

    pub async fn commit(self) {
        match self {
            Self::Postgres(mut c) => c.execute("COMMIT").await.map(drop).unwrap(),
            Self::Sqlite(mut c) => c.execute("COMMIT").await.map(drop).unwrap(),
        }
    }
}
