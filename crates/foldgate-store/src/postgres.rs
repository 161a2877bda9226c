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
use sqlx::{
    PgPool, Postgres,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use uuid::Uuid;

use crate::{
    ConnectOptions, CreateRefusal, DueBranch, Finish, Finished, IdleSession, NewBranch, Store,
    StoreError, check_migrated, due_branch, idle_session,
    ops::{self, SessionLoad, Tx},
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
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.application_name("foldgate"))
            .await?;
        Ok(Self { pool })
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs `op` in a transaction and commits it if `op` succeeded and
    /// `keep` approves of the result (a refusal rolls back, writing
    /// nothing). Postgres aborts a transaction to break a deadlock or a
    /// serialisation conflict; then the whole transaction is run again.
    async fn in_tx<R, F, Fut>(&self, keep: fn(&R) -> bool, mut op: F) -> Result<R, StoreError>
    where
        F: FnMut(PgTx) -> Fut + Send,
        Fut: Future<Output = (PgTx, Result<R, StoreError>)> + Send,
        R: Send,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (tx, result) = op(PgTx(self.pool.begin().await?)).await;
            let result = match result {
                Ok(value) if keep(&value) => {
                    tx.0.commit().await.map(|()| value).map_err(StoreError::from)
                }
                Ok(value) => tx.0.rollback().await.map(|()| value).map_err(StoreError::from),
                // Dropping the transaction rolls it back.
                Err(e) => Err(e),
            };
            match result {
                Err(StoreError::Database(e)) if attempt < CONFLICT_RETRIES && is_conflict(&e) => {
                    tracing::debug!(attempt, "retrying a transaction after a conflict");
                }
                other => return other,
            }
        }
    }
}

fn is_conflict(e: &sqlx::Error) -> bool {
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
);
