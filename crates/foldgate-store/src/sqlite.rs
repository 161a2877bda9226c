//! The SQLite store: the zero-configuration default for a single process
//! (`sqlite://foldgate.db`). Every writing transaction is `BEGIN IMMEDIATE`,
//! which takes SQLite's one write lock at its start, so operations are
//! serialised and the limits hold; WAL mode lets readers run alongside.

use std::{future::Future, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, BranchStatus, Consumption, EndReason, LimitKind, Limits, Session, SessionId,
    Subject, TenantId, Tokens,
};
use sqlx::{
    Sqlite, SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous},
};
use uuid::Uuid;

use crate::{
    BatchFinish, CallRecord, CallSummary, ConnectOptions, CreateRefusal, DueBranch, Finish,
    Finished, IdleSession, ModelUsage, NewBranch, NewRun, NewStep, OutsideUsage, Run, RunState,
    RunStep, StepKind, StepWritten, Store, StoreError, ToolCalls, check_migrated, due_branch,
    idle_session,
    ops::{self, SessionLoad, Tx},
    record::{BranchRow, SessionRow, branch_columns, db_tokens, ledger, session_columns},
    runs::{RunRow, StepRow, run_columns},
    ts::Ts,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// How often a transaction that found the database locked (by another
/// process, beyond the busy timeout) is retried.
const CONFLICT_RETRIES: usize = 5;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    pub async fn connect(options: &ConnectOptions) -> Result<Self, StoreError> {
        let connect: SqliteConnectOptions = options.url.parse()?;
        let in_memory = options.url.contains(":memory:") || options.url.contains("mode=memory");
        let connect = connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(options.acquire_timeout);
        let pool = crate::pool_options::<Sqlite>(options)
            // Each connection to an in-memory database is its own database.
            .max_connections(if in_memory { 1 } else { options.max_connections })
            .connect_with(connect)
            .await?;
        Ok(Self { pool })
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Opens a `BEGIN IMMEDIATE` transaction, which takes the write lock at
    /// once (for the shared `in_tx`).
    async fn begin(&self) -> Result<sqlx::Transaction<'static, Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    /// Charges an upstream call in a transaction of single statements (see
    /// [`Store::meter_call`]): they run in this process, so there are no
    /// round trips to save. Metering commits like every other transaction:
    /// the setting that could relax it (`PRAGMA synchronous`) belongs to the
    /// connection.
    async fn meter(
        &self,
        tenant: &TenantId,
        id: BranchId,
        call: &CallRecord,
    ) -> Result<Option<Consumption>, StoreError> {
        self.in_tx(
            |_| true,
            |mut tx| async move {
                let result = ops::meter_call(&mut tx, tenant, id, call).await;
                (tx, result)
            },
        )
        .await
    }
}

/// Another process held the database past the busy timeout.
fn is_retryable(e: &sqlx::Error) -> bool {
    // SQLITE_BUSY (5) and its extended codes.
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

crate::sql::sql_backend!(
    store = SqliteStore,
    tx = SqliteTx,
    db = Sqlite,
    lock = "",
    skip_locked = "",
);
