//! Retention: what has ended long enough ago is deleted, a bounded batch
//! per statement, so that the tables stop growing and no deletion holds
//! locks long enough to stall folding.
//!
//! A branch goes with its whole tree (every branch under a depth-1 branch
//! ends before it), its call traces, and its run and steps; a session only
//! once it has ended and has no branch left. The daily usage is written
//! apart from all of this, so usage reports outlive the detail.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{ColumnIndex, Database, Executor};

use crate::{
    StoreError,
    dialect::{Dialect, Param, RowsAffected, Value},
    store::SqlStore,
    ts::Ts,
};

/// What one batch of branch trees took with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedTrees {
    /// Depth-1 branches whose trees went: the batch's size.
    pub trees: u64,
    pub branches: u64,
    pub calls: u64,
    pub runs: u64,
    pub steps: u64,
}

/// Deletions in bounded batches, oldest first.
#[async_trait]
pub trait Prune {
    /// Deletes up to `batch` depth-1 branches that ended before `before`
    /// (those whose return still waits to become a lesson excepted), with
    /// their descendants, call traces, runs and steps, in one transaction.
    async fn prune_trees(
        &self,
        before: DateTime<Utc>,
        batch: u32,
    ) -> Result<PrunedTrees, StoreError>;

    /// Deletes up to `batch` sessions that ended before `before` and have no
    /// branch left, up to `batch` rows of the tools of sessions no longer
    /// kept, and up to `batch` rows of usage outside branches not added to
    /// since then. Returns the sessions deleted.
    async fn prune_sessions(&self, before: DateTime<Utc>, batch: u32) -> Result<u64, StoreError>;

    /// Deletes up to `batch` audit entries older than `before`.
    async fn prune_audit(&self, before: DateTime<Utc>, batch: u32) -> Result<u64, StoreError>;

    /// Deletes up to `batch` lines of daily usage of days before `before`.
    async fn prune_usage(&self, before: NaiveDate, batch: u32) -> Result<u64, StoreError>;
}

/// The trees of the depth-1 branches that ended at or before `$1`: each
/// branch with the tenant and session its descendants share (so that
/// finding them uses the session's index).
macro_rules! doomed_trees {
    () => {
        "WITH RECURSIVE doomed (tenant_id, session_id, id) AS ( \
         SELECT tenant_id, session_id, id FROM branches WHERE parent_id IS NULL \
         AND completed_at <= $1 AND (extract IS NULL OR extract <> 'pending') \
         UNION ALL SELECT b.tenant_id, b.session_id, b.id FROM branches AS b JOIN doomed AS d \
         ON b.tenant_id = d.tenant_id AND b.session_id = d.session_id AND b.parent_id = d.id) "
    };
}

#[async_trait]
impl<D: Dialect> Prune for SqlStore<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    usize: ColumnIndex<<D::DB as Database>::Row>,
    Ts: Param<D::DB>,
    (Option<DateTime<Utc>>,): for<'r> sqlx::FromRow<'r, <D::DB as Database>::Row>,
    String: Value<D::DB>,
    i64: Value<D::DB>,
{
    async fn prune_trees(
        &self,
        before: DateTime<Utc>,
        batch: u32,
    ) -> Result<PrunedTrees, StoreError> {
        self.timed("prune_trees", async {
            // As the dialect begins a writing transaction (SQLite: IMMEDIATE,
            // waiting for the write lock rather than failing to upgrade).
            let mut tx = D::begin(&self.pool).await?;
            // The batch ends at the `batch`th oldest tree (ties come along).
            let last: Option<(Option<DateTime<Utc>>,)> = sqlx::query_as(
                "SELECT completed_at FROM branches WHERE parent_id IS NULL \
                 AND completed_at < $1 ORDER BY completed_at LIMIT 1 OFFSET $2",
            )
            .bind(Ts(before))
            .bind(i64::from(batch.max(1)) - 1)
            .fetch_optional(&mut *tx)
            .await?;
            // The trees take `completed_at <= due`; the cut-off is exclusive.
            let last_due = before - chrono::Duration::milliseconds(1);
            let due = Ts(last.and_then(|(at,)| at).map_or(last_due, |at| at.min(last_due)));
            // Children of the batch's trees go before their parents' rows:
            // steps, runs and calls first, then the branches in one
            // statement (a self-reference checked at its end).
            let mut pruned = PrunedTrees::default();
            for (count, statement) in [
                (
                    &mut pruned.steps,
                    concat!(
                        doomed_trees!(),
                        "DELETE FROM run_steps WHERE branch_id IN (SELECT id FROM doomed)"
                    ),
                ),
                (
                    &mut pruned.runs,
                    concat!(
                        doomed_trees!(),
                        "DELETE FROM branch_runs WHERE branch_id IN (SELECT id FROM doomed)"
                    ),
                ),
                (
                    &mut pruned.calls,
                    concat!(
                        doomed_trees!(),
                        "DELETE FROM branch_calls WHERE branch_id IN (SELECT id FROM doomed)"
                    ),
                ),
                (
                    &mut pruned.branches,
                    concat!(
                        doomed_trees!(),
                        "DELETE FROM branches WHERE id IN (SELECT id FROM doomed)"
                    ),
                ),
            ] {
                *count = sqlx::query(statement).bind(due).execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
            pruned.trees = pruned.branches.min(u64::from(batch));
            Ok(pruned)
        })
        .await
    }

    async fn prune_sessions(&self, before: DateTime<Utc>, batch: u32) -> Result<u64, StoreError> {
        self.timed("prune_sessions", async {
            let sessions = sqlx::query(
                "DELETE FROM sessions WHERE (tenant_id, session_id) IN ( \
                 SELECT s.tenant_id, s.session_id FROM sessions AS s \
                 WHERE s.status = 'ended' AND s.ended_at < $1 AND NOT EXISTS ( \
                 SELECT 1 FROM branches AS b \
                 WHERE b.tenant_id = s.tenant_id AND b.session_id = s.session_id) \
                 ORDER BY s.ended_at LIMIT $2)",
            )
            .bind(Ts(before))
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?
            .rows_affected();
            sqlx::query(
                "DELETE FROM session_tools WHERE (tenant_id, session_id, tool) IN ( \
                 SELECT t.tenant_id, t.session_id, t.tool FROM session_tools AS t \
                 WHERE NOT EXISTS (SELECT 1 FROM sessions AS s \
                 WHERE s.tenant_id = t.tenant_id AND s.session_id = t.session_id) LIMIT $1)",
            )
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?;
            sqlx::query(
                "DELETE FROM usage_outside_branches WHERE (tenant_id, session_id) IN ( \
                 SELECT tenant_id, session_id FROM usage_outside_branches \
                 WHERE updated_at < $1 LIMIT $2)",
            )
            .bind(Ts(before))
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?;
            Ok(sessions)
        })
        .await
    }

    async fn prune_audit(&self, before: DateTime<Utc>, batch: u32) -> Result<u64, StoreError> {
        self.timed("prune_audit", async {
            let deleted = sqlx::query(
                "DELETE FROM audit_log WHERE id IN ( \
                 SELECT id FROM audit_log WHERE at < $1 ORDER BY at LIMIT $2)",
            )
            .bind(Ts(before))
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?;
            Ok(deleted.rows_affected())
        })
        .await
    }

    async fn prune_usage(&self, before: NaiveDate, batch: u32) -> Result<u64, StoreError> {
        self.timed("prune_usage", async {
            let deleted = sqlx::query(
                "DELETE FROM usage_daily WHERE (tenant_id, day, kind, name) IN ( \
                 SELECT tenant_id, day, kind, name FROM usage_daily WHERE day < $1 LIMIT $2)",
            )
            .bind(before.to_string())
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?;
            Ok(deleted.rows_affected())
        })
        .await
    }
}
