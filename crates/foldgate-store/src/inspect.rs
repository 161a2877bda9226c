//! Reads of a Postgres database from outside the gateway, to check a load
//! run against it: the branches of the run's tenants (named by a common
//! prefix), whether its pools and concurrency counters balance, and the
//! server's connections. Nothing here writes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, postgres::PgPoolOptions};
use uuid::Uuid;

use crate::StoreError;

/// One connection to a Postgres database, for [`inspect`](self) reads.
#[derive(Debug, Clone)]
pub struct Inspector {
    pool: PgPool,
}

/// How a branch ended, or that it has not.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BranchEnd {
    pub id: Uuid,
    pub status: String,
    pub reason: Option<String>,
    pub deadline_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

/// A pool whose loans to its active children differ from what they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoanMismatch {
    Branch { id: Uuid, reserved: i64, lent: i64 },
    Session { tenant: String, session: String, reserved: i64, lent: i64 },
}

/// How many loan mismatches of each kind [`Inspector::loan_mismatches`]
/// lists.
const MISMATCH_EXAMPLES: i64 = 5;

/// A `LIKE` pattern for the tenants whose id starts with `prefix` and a
/// dash.
fn tenants_of(prefix: &str) -> String {
    let escaped = prefix.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
    format!("{escaped}-%")
}

impl Inspector {
    /// Connects to the database at `url`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
        Ok(Self { pool })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Active branches of the tenants `{prefix}-…`.
    pub async fn active(&self, prefix: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM branches WHERE tenant_id LIKE $1 AND status = 'active'",
        )
        .bind(tenants_of(prefix))
        .fetch_one(&self.pool)
        .await?)
    }

    /// Active branches of the tenants `{prefix}-…` due by `by`.
    pub async fn active_due(&self, prefix: &str, by: DateTime<Utc>) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM branches WHERE tenant_id LIKE $1 \
             AND status = 'active' AND deadline_at <= $2",
        )
        .bind(tenants_of(prefix))
        .bind(by)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Active branches of the tenants `{prefix}-…` more than `late` past
    /// their deadline by the database's clock.
    pub async fn active_overdue(&self, prefix: &str, late: Duration) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM branches WHERE tenant_id LIKE $1 \
             AND status = 'active' AND deadline_at < now() - make_interval(secs => $2)",
        )
        .bind(tenants_of(prefix))
        .bind(late.as_secs_f64())
        .fetch_one(&self.pool)
        .await?)
    }

    /// The latest deadline of any branch of the tenants `{prefix}-…`.
    pub async fn last_deadline(&self, prefix: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(sqlx::query_scalar("SELECT max(deadline_at) FROM branches WHERE tenant_id LIKE $1")
            .bind(tenants_of(prefix))
            .fetch_one(&self.pool)
            .await?)
    }

    /// Every branch of the tenants `{prefix}-…`, and how it ended.
    pub async fn branch_ends(&self, prefix: &str) -> Result<Vec<BranchEnd>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, status, reason, deadline_at, completed_at FROM branches \
             WHERE tenant_id LIKE $1",
        )
        .bind(tenants_of(prefix))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Per tenant `{prefix}-…` that has a counter: (tenant, its active-branch
    /// counter, its active branches).
    pub async fn tenant_counters(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, i64, i64)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT u.tenant_id, CAST(SUM(u.active_branches) AS BIGINT), \
                    (SELECT count(*) FROM branches b WHERE b.tenant_id = u.tenant_id AND b.status = 'active') \
             FROM tenant_usage u WHERE u.tenant_id LIKE $1 GROUP BY u.tenant_id",
        )
        .bind(tenants_of(prefix))
        .fetch_all(&self.pool)
        .await?)
    }

    /// The deployment's active-branch counter and its active branches.
    pub async fn deployment_counter(&self) -> Result<(i64, i64), StoreError> {
        let counter = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(active_branches), 0) AS BIGINT) FROM deployment_usage",
        )
        .fetch_one(&self.pool)
        .await?;
        let active = sqlx::query_scalar("SELECT count(*) FROM branches WHERE status = 'active'")
            .fetch_one(&self.pool)
            .await?;
        Ok((counter, active))
    }

    /// Up to five branches and five sessions of the tenants `{prefix}-…`
    /// whose `reserved` differs from the budgets of their active children.
    pub async fn loan_mismatches(&self, prefix: &str) -> Result<Vec<LoanMismatch>, StoreError> {
        let pattern = tenants_of(prefix);
        let branches: Vec<(Uuid, i64, i64)> = sqlx::query_as(
            "SELECT b.id, b.reserved, COALESCE((SELECT sum(c.budget) FROM branches c \
                    WHERE c.parent_id = b.id AND c.status = 'active'), 0)::BIGINT \
             FROM branches b WHERE b.tenant_id LIKE $1 AND b.reserved <> COALESCE((SELECT sum(c.budget) \
                    FROM branches c WHERE c.parent_id = b.id AND c.status = 'active'), 0) LIMIT $2",
        )
        .bind(&pattern)
        .bind(MISMATCH_EXAMPLES)
        .fetch_all(&self.pool)
        .await?;
        let sessions: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT s.tenant_id, s.session_id, s.reserved, COALESCE((SELECT sum(b.budget) FROM branches b \
                    WHERE b.tenant_id = s.tenant_id AND b.session_id = s.session_id \
                    AND b.parent_id IS NULL AND b.status = 'active'), 0)::BIGINT \
             FROM sessions s WHERE s.tenant_id LIKE $1 AND s.reserved <> COALESCE((SELECT sum(b.budget) \
                    FROM branches b WHERE b.tenant_id = s.tenant_id AND b.session_id = s.session_id \
                    AND b.parent_id IS NULL AND b.status = 'active'), 0) LIMIT $2",
        )
        .bind(&pattern)
        .bind(MISMATCH_EXAMPLES)
        .fetch_all(&self.pool)
        .await?;
        let branches = branches.into_iter().map(|(id, reserved, lent)| LoanMismatch::Branch {
            id,
            reserved,
            lent,
        });
        let sessions = sessions.into_iter().map(|(tenant, session, reserved, lent)| {
            LoanMismatch::Session { tenant, session, reserved, lent }
        });
        Ok(branches.chain(sessions).collect())
    }

    /// The server's other connections to this database: (all, active).
    pub async fn connections(&self) -> Result<(i64, i64), StoreError> {
        Ok(sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state = 'active') \
             FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// The server's other connections to this database, counted by state
    /// and what they wait on (`state wait_event_type wait_event`).
    pub async fn connection_states(&self) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT concat_ws(' ', coalesce(state, '?'), wait_event_type, wait_event), \
             count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1",
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_patterns_match_the_prefix_literally() {
        assert_eq!(tenants_of("run_1"), "run\\_1-%");
        assert_eq!(tenants_of("a%b\\c"), "a\\%b\\\\c-%");
    }
}
