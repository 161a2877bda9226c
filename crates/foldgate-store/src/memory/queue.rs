//! The memory's two queues, each kept in rows that exist anyway:
//!
//! - the lessons to keep from agents' returns (`extract_memory`), on the
//!   branch (`branches.extract`). The statement that ends the branch queues
//!   it: written with the return or not at all, with no round trip more,
//!   only by the return that ended the branch (a second return changes no
//!   row), and deleted with the branch;
//! - the gateway-run branches to distil, on their run
//!   (`branch_runs.distill`), queued by the transaction that ends the run.
//!
//! Either is claimed with a hold (on Postgres with `FOR UPDATE SKIP
//! LOCKED`, so two replicas never take the same entry at once; a replica
//! that dies holding some leaves them to another once the hold lapses). An
//! entry is ended in the transaction that stores its lessons, and only if
//! it is still pending: whichever replica finishes first stores them, and a
//! replica that finishes later, or a retry, stores nothing. So a branch's
//! lessons are kept once.

use chrono::{DateTime, Utc};
use foldgate_domain::{BranchId, BranchStatus, MemoryItem, SessionId, Subject, TenantId};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use super::{NewMemory, memory_columns, rows::MemoryRow, rows::corrupt};
use crate::{
    ModelUsage, StoreError,
    dialect::{Dialect, Param, RowsAffected, Sql, Value, locking},
    record::db_tokens,
    store::SqlStore,
    ts::Ts,
};

/// A gateway-run branch to distil, as claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distillation {
    pub tenant: TenantId,
    pub branch: BranchId,
    /// Attempts so far, this one included.
    pub attempts: u32,
}

/// How an attempt at a distillation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistillOutcome {
    /// Its lessons (perhaps none) are to be stored, and the entry ended.
    Done,
    /// It failed; another attempt follows once the hold lapses.
    Retry,
    /// It failed for the last time: given up.
    Failed,
}

/// What an attempt at a distillation leaves.
#[derive(Debug, Clone, Copy)]
pub struct DistillationEnd<'a> {
    pub outcome: DistillOutcome,
    /// The lessons, scrubbed and screened (stored only when `Done`).
    pub lessons: &'a [NewMemory],
    /// What the attempt's model calls were billed: booked whatever the
    /// outcome, to the run's distillation usage.
    pub usage: ModelUsage,
    /// The attempt, as claimed: giving up holds only if no replica has
    /// claimed the entry since.
    pub attempts: u32,
}

/// An agent's return whose message is to be kept as a lesson, as claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extraction {
    pub tenant: TenantId,
    pub branch: BranchId,
    /// The branch's owner: the lesson's subject.
    pub owner: Subject,
    pub session: SessionId,
    pub description: String,
    /// The return message, as stored when the branch returned (scrubbed).
    pub message: String,
    pub status: BranchStatus,
    /// Attempts so far, this one included.
    pub attempts: u32,
}

/// Takes pending distillations; a replica skips the rows another holds.
const CLAIM_DISTILLATIONS: Sql = locking!(
    ["UPDATE branch_runs SET distill_until = $2, distill_attempts = distill_attempts + 1 \
      WHERE branch_id IN (SELECT branch_id FROM branch_runs WHERE distill = 'pending' \
      AND (distill_until IS NULL OR distill_until <= $1) ORDER BY updated_at LIMIT $3"]
    " FOR UPDATE SKIP LOCKED" [") RETURNING tenant_id, branch_id, distill_attempts"]
);

/// Takes pending extractions, oldest return first, with what the lesson is
/// made of; a replica skips the rows another holds.
const CLAIM_EXTRACTIONS: Sql = locking!(
    ["UPDATE branches SET extract_until = $2, extract_attempts = extract_attempts + 1 \
      WHERE id IN (SELECT id FROM branches WHERE extract = 'pending' \
      AND (extract_until IS NULL OR extract_until <= $1) ORDER BY completed_at LIMIT $3"]
    " FOR UPDATE SKIP LOCKED"
    [") RETURNING tenant_id, id, owner_sub, session_id, description, result, status, \
       extract_attempts"]
);

/// A claimed extraction's row.
type ExtractionRow = (String, Uuid, String, String, String, Option<String>, String, i32);

impl<D: Dialect> SqlStore<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    for<'a> &'a str: Encode<'a, D::DB> + Type<D::DB> + ColumnIndex<<D::DB as Database>::Row>,
    usize: ColumnIndex<<D::DB as Database>::Row>,
    Ts: Param<D::DB>,
    Option<Ts>: Param<D::DB>,
    for<'a> Option<&'a str>: Encode<'a, D::DB> + Type<D::DB>,
    Option<String>: Param<D::DB>,
    Option<i64>: Param<D::DB>,
    Option<Uuid>: Param<D::DB>,
    String: Value<D::DB>,
    i64: Value<D::DB>,
    i32: Value<D::DB>,
    f64: Value<D::DB>,
    bool: Value<D::DB>,
    Uuid: Value<D::DB>,
    DateTime<Utc>: Value<D::DB>,
{
    /// Writes an item on `conn` (the pool's or a transaction's).
    pub(super) async fn insert_memory_on(
        conn: &mut <D::DB as Database>::Connection,
        new: &NewMemory,
    ) -> Result<MemoryItem, StoreError> {
        let p = &new.provenance;
        let row: MemoryRow = sqlx::query_as(concat!(
            "INSERT INTO memories (tenant_id, id, kind, source, title, description, \
             content, prior, confidence, subject, session_id, branch_id, flagged, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10, $11, $12, $13) RETURNING ",
            memory_columns!()
        ))
        .bind(p.tenant.as_str())
        .bind(new.id.as_uuid())
        .bind(new.kind.as_str())
        .bind(p.source.as_str())
        .bind(new.title.as_str())
        .bind(new.description.as_str())
        .bind(new.content.as_str())
        .bind(new.prior.get())
        .bind(p.subject.as_str())
        .bind(p.session.as_ref().map(SessionId::as_str))
        .bind(p.branch.map(|b| b.as_uuid()))
        .bind(new.flagged.join(" "))
        .bind(Ts(new.at))
        .fetch_one(&mut *conn)
        .await?;
        MemoryItem::try_from(row)
    }

    pub(super) async fn claim_distillation_rows(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Distillation>, StoreError> {
        self.timed("claim_distillations", async {
            let rows: Vec<(String, Uuid, i32)> = sqlx::query_as(D::pick(&CLAIM_DISTILLATIONS))
                .bind(Ts(now))
                .bind(Ts(until))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter()
                .map(|(tenant, branch, attempts)| {
                    Ok(Distillation {
                        tenant: TenantId::parse(&tenant).map_err(corrupt)?,
                        branch: BranchId::from_uuid(branch),
                        attempts: u32::try_from(attempts).map_err(corrupt)?,
                    })
                })
                .collect()
        })
        .await
    }

    pub(super) async fn end_distillation_row(
        &self,
        tenant: &TenantId,
        id: BranchId,
        end: DistillationEnd<'_>,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        self.in_tx(
            "end_distillation",
            |_| true,
            |mut tx| async move {
                let result = async {
                    let usage = end.usage;
                    if usage.calls > 0 {
                        sqlx::query(
                            "UPDATE branch_runs SET distill_calls = distill_calls + $3, \
                             distill_input_tokens = distill_input_tokens + $4, \
                             distill_output_tokens = distill_output_tokens + $5 \
                             WHERE tenant_id = $1 AND branch_id = $2",
                        )
                        .bind(tenant.as_str())
                        .bind(id.as_uuid())
                        .bind(i64::try_from(usage.calls).unwrap_or(i64::MAX))
                        .bind(db_tokens(usage.input_tokens))
                        .bind(db_tokens(usage.output_tokens))
                        .execute(&mut *tx.0)
                        .await?;
                    }
                    let state = match end.outcome {
                        DistillOutcome::Retry => return Ok(Vec::new()),
                        DistillOutcome::Done => "done",
                        DistillOutcome::Failed => "failed",
                    };
                    // Done by whoever gets here first; given up only by the
                    // last claim's holder.
                    let ended = sqlx::query(
                        "UPDATE branch_runs SET distill = $3, distill_until = NULL \
                         WHERE tenant_id = $1 AND branch_id = $2 AND distill = 'pending' \
                         AND ($3 = 'done' OR distill_attempts = $4)",
                    )
                    .bind(tenant.as_str())
                    .bind(id.as_uuid())
                    .bind(state)
                    .bind(i64::from(end.attempts))
                    .execute(&mut *tx.0)
                    .await?;
                    let mut stored = Vec::new();
                    if end.outcome == DistillOutcome::Done && ended.rows_affected() == 1 {
                        for lesson in end.lessons {
                            stored.push(Self::insert_memory_on(&mut *tx.0, lesson).await?);
                        }
                    }
                    Ok(stored)
                }
                .await;
                (tx, result)
            },
        )
        .await
    }

    pub(super) async fn claim_extraction_rows(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Extraction>, StoreError> {
        self.timed("claim_extractions", async {
            let rows: Vec<ExtractionRow> = sqlx::query_as(D::pick(&CLAIM_EXTRACTIONS))
                .bind(Ts(now))
                .bind(Ts(until))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter()
                .map(|(tenant, branch, owner, session, description, message, status, attempts)| {
                    Ok(Extraction {
                        tenant: TenantId::parse(&tenant).map_err(corrupt)?,
                        branch: BranchId::from_uuid(branch),
                        owner: Subject::parse(&owner).map_err(corrupt)?,
                        session: SessionId::parse(&session).map_err(corrupt)?,
                        description,
                        message: message.unwrap_or_default(),
                        status: status.parse().map_err(corrupt)?,
                        attempts: u32::try_from(attempts).map_err(corrupt)?,
                    })
                })
                .collect()
        })
        .await
    }

    pub(super) async fn end_extraction_row(
        &self,
        tenant: &TenantId,
        id: BranchId,
        attempts: u32,
        lesson: Option<&NewMemory>,
    ) -> Result<Option<MemoryItem>, StoreError> {
        self.in_tx(
            "end_extraction",
            |_| true,
            |mut tx| async move {
                let result = async {
                    // Done by whoever gets here first; given up only by the
                    // last claim's holder.
                    let ended = sqlx::query(
                        "UPDATE branches SET extract = $3, extract_until = NULL \
                         WHERE tenant_id = $1 AND id = $2 AND extract = 'pending' \
                         AND ($3 = 'done' OR extract_attempts = $4)",
                    )
                    .bind(tenant.as_str())
                    .bind(id.as_uuid())
                    .bind(if lesson.is_some() { "done" } else { "failed" })
                    .bind(i64::from(attempts))
                    .execute(&mut *tx.0)
                    .await?;
                    match lesson {
                        Some(lesson) if ended.rows_affected() == 1 => {
                            Self::insert_memory_on(&mut *tx.0, lesson).await.map(Some)
                        }
                        _ => Ok(None),
                    }
                }
                .await;
                (tx, result)
            },
        )
        .await
    }

    /// Drops the tenant's queued extractions and distillations (a
    /// data-deletion request: no lesson may appear after it).
    pub(super) async fn drop_queued(&self, tenant: &TenantId) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE branches SET extract = NULL, extract_until = NULL \
             WHERE tenant_id = $1 AND extract = 'pending'",
        )
        .bind(tenant.as_str())
        .execute(&self.pool)
        .await?;
        sqlx::query(
            "UPDATE branch_runs SET distill = NULL, distill_until = NULL \
             WHERE tenant_id = $1 AND distill = 'pending'",
        )
        .bind(tenant.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
