//! The SQLite store: the zero-configuration default for a single process
//! (`sqlite://foldgate.db`). Every writing transaction is `BEGIN IMMEDIATE`,
//! which takes SQLite's one write lock at its start, so operations are
//! serialised and the limits hold; WAL mode lets readers run alongside.

use foldgate_domain::{Branch, BranchId, Consumption, EndReason, TenantId};
use sqlx::{
    SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous},
};

use crate::{
    BatchFinish, CallRecord, ConnectOptions, CreateRefusal, Finish, NewBranch, StoreError, TreeEnd,
    dialect::{Dialect, Sql},
    store::SqlStore,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// The SQLite dialect.
#[derive(Debug, Clone, Copy)]
pub struct Sqlite;

/// The SQLite store.
pub type SqliteStore = SqlStore<Sqlite>;

impl SqlStore<Sqlite> {
    pub async fn connect(options: &ConnectOptions) -> Result<Self, StoreError> {
        let connect: SqliteConnectOptions = options.url.expose().parse()?;
        let in_memory = options.url.expose().contains(":memory:")
            || options.url.expose().contains("mode=memory");
        let connect = connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(options.acquire_timeout);
        let pool = crate::pool_options::<sqlx::Sqlite>(options)
            // Each connection to an in-memory database is its own database.
            .max_connections(if in_memory { 1 } else { options.max_connections })
            .connect_with(connect)
            .await?;
        Ok(Self::new(pool, true))
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }
}

impl Dialect for Sqlite {
    type DB = sqlx::Sqlite;

    const SYSTEM: &'static str = "sqlite";

    fn migrator() -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    fn pick(statement: &Sql) -> &'static str {
        statement.sqlite
    }

    /// `BEGIN IMMEDIATE` takes the write lock at once.
    async fn begin(
        pool: &SqlitePool,
    ) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        pool.begin_with("BEGIN IMMEDIATE").await
    }

    /// Another process held the database past the busy timeout.
    fn is_retryable(error: &StoreError) -> bool {
        // SQLITE_BUSY (5) and its extended codes.
        error
            .database_code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| code & 0xff == 5)
    }

    /// Creates a branch in a transaction of single statements (see
    /// [`Tx::create`](crate::tx::Tx::create)). A refusal rolls back.
    async fn create_branch(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        new: &NewBranch,
    ) -> Result<Result<Branch, CreateRefusal>, StoreError> {
        store
            .in_tx("create_branch", Result::is_ok, |mut tx| async move {
                let result = tx.create(tenant, new).await;
                (tx, result)
            })
            .await
    }

    /// Ends a branch and its descendants in a transaction of single
    /// statements (see [`Tx::end_tree`](crate::tx::Tx::end_tree)).
    async fn end_tree(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        id: BranchId,
        finish: &Finish,
        child_reason: EndReason,
    ) -> Result<TreeEnd, StoreError> {
        store
            .in_tx(
                "end_tree",
                |_| true,
                |mut tx| async move {
                    let result = tx.end_tree(tenant, id, finish, child_reason).await;
                    (tx, result)
                },
            )
            .await
    }

    /// Ends the batch in a transaction of single statements (see
    /// [`Tx::finish_batch`](crate::tx::Tx::finish_batch)).
    async fn finish_batch(
        store: &SqlStore<Self>,
        batch: &[BatchFinish],
    ) -> Result<Vec<Branch>, StoreError> {
        store
            .in_tx(
                "finish_batch",
                |_| true,
                |mut tx| async move {
                    let result = tx.finish_batch(batch).await;
                    (tx, result)
                },
            )
            .await
    }

    /// Charges an upstream call in a transaction of single statements (see
    /// [`Tx::meter_call`](crate::tx::Tx::meter_call)): they run in this process, so there are no
    /// round trips to save. Metering commits like every other transaction:
    /// the setting that could relax it (`PRAGMA synchronous`) belongs to the
    /// connection.
    async fn meter_call(
        store: &SqlStore<Self>,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<Option<Consumption>, StoreError> {
        store
            .in_tx(
                "meter_call",
                |_| true,
                |mut tx| async move {
                    let result = tx.meter_call(tenant, id, call).await;
                    (tx, result)
                },
            )
            .await
    }
}
