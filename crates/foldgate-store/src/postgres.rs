//! The Postgres store: production, and the only backend for more than one
//! replica. Row locks (`FOR UPDATE`) serialise the operations on one tree;
//! the supervisor claims work with `FOR UPDATE SKIP LOCKED`, so replicas never
//! fire the same deadline twice.

use std::{future::Future, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, Consumption, EndReason, LimitKind, Limits, Session, SessionId, Subject,
    TenantId, Tokens,
};
use sqlx::{PgPool, Postgres, postgres::PgConnectOptions};
use uuid::Uuid;

use crate::{
    BatchFinish, CallRecord, CallSummary, ConnectOptions, CreateRefusal, DueBranch, Finish,
    Finished, IdleSession, NewBranch, OutsideUsage, Store, StoreError, ToolCalls, TxKind,
    check_migrated, due_branch, idle_session,
    ops::{self, LedgerUpdate, SessionLoad, Tx},
    record::{BranchRow, SessionRow, branch_columns, db_tokens, session_columns},
    ts::Ts,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// How often a transaction that lost a deadlock or serialisation race is
/// retried before the error is returned.
const CONFLICT_RETRIES: usize = 5;

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    synchronous_metering: bool,
}

impl PgStore {
    pub async fn connect(options: &ConnectOptions) -> Result<Self, StoreError> {
        let connect: PgConnectOptions = options.url.parse()?;
        Self::connect_with(connect, options).await
    }

    /// Connects with prepared options (tests use this to pick a schema).
    pub async fn connect_with(
        connect: PgConnectOptions,
        options: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        let pool = crate::pool_options::<Postgres>(options)
            .connect_with(connect.application_name("foldgate"))
            .await?;
        Ok(Self { pool, synchronous_metering: options.synchronous_metering })
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Opens a transaction (for the shared `in_tx`). A metering transaction
    /// commits without waiting for the disk unless synchronous metering is
    /// configured; the setting goes with `BEGIN`, in the same round trip.
    async fn begin(
        &self,
        kind: TxKind,
    ) -> Result<sqlx::Transaction<'static, Postgres>, sqlx::Error> {
        match kind {
            TxKind::Metering if !self.synchronous_metering => {
                self.pool.begin_with("BEGIN; SET LOCAL synchronous_commit = off").await
            }
            TxKind::Metering | TxKind::Durable => self.pool.begin().await,
        }
    }
}

/// Postgres aborted the transaction to break a deadlock or a serialisation
/// conflict: running it again succeeds.
fn is_retryable(e: &sqlx::Error) -> bool {
    // 40001 serialization_failure, 40P01 deadlock_detected.
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "40001" || code == "40P01")
}

crate::sql::sql_backend!(
    store = PgStore,
    tx = PgTx,
    db = Postgres,
    lock = " FOR UPDATE",
    skip_locked = " FOR UPDATE SKIP LOCKED",
    writing_ctes = true,
);
