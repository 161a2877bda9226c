//! The reasoning memory as the store keeps it: items per tenant, ranked by
//! full text (Postgres `tsvector` with a GIN index, SQLite FTS5 with bm25),
//! and their vectors for ranking by embeddings ([`MemoryVectors`]).
//!
//! Text reaches this module scrubbed and screened; the store only keeps it,
//! ranks it, and moves its counts and confidence in single statements.

use std::fmt::Debug;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    BranchId, Confidence, MemoryId, MemoryItem, MemoryKind, Provenance, Subject, TenantId,
};
use rust_stemmers::{Algorithm, Stemmer};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

mod queue;
mod rows;
mod terms;

pub use self::queue::{DistillOutcome, Distillation, DistillationEnd, Extraction};

use self::terms::query_terms;
use self::{
    rows::{MemoryRow, RankedRow, corrupt},
    terms::{CANDIDATES_PER_ITEM, MIN_CANDIDATES, matched_terms, stems},
};
use crate::{
    StoreError,
    dialect::{Dialect, Param, Sql, Value},
    store::SqlStore,
    ts::Ts,
};

/// The reasoning memory's store. Every method takes the tenant first and
/// every statement filters by it.
#[async_trait]
pub trait MemoryStore: Send + Sync + Debug {
    /// Writes a new item (its text already scrubbed and screened).
    async fn insert_memory(&self, new: &NewMemory) -> Result<MemoryItem, StoreError>;

    async fn memory(
        &self,
        tenant: &TenantId,
        id: MemoryId,
    ) -> Result<Option<MemoryItem>, StoreError>;

    /// The items that match `query.text`, best first.
    async fn search_memories(
        &self,
        tenant: &TenantId,
        query: &MemoryQuery,
    ) -> Result<Vec<Ranked>, StoreError>;

    /// Records `subject`'s vote on an item (one per subject: a later vote
    /// replaces an earlier one), then counts the votes and moves the
    /// confidence from the prior ([`foldgate_domain::confidence_after`]).
    /// `None`: no such item.
    async fn memory_feedback(
        &self,
        tenant: &TenantId,
        id: MemoryId,
        subject: &Subject,
        helpful: bool,
        at: DateTime<Utc>,
    ) -> Result<Option<MemoryItem>, StoreError>;

    /// Adds injections to items' use counts (`(item, injections)`), and
    /// records `at` as their last use.
    async fn memories_used(
        &self,
        tenant: &TenantId,
        uses: &[(MemoryId, u64)],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// A page of the tenant's items, newest first, after `before` (an id
    /// of the previous page).
    async fn list_memories(
        &self,
        tenant: &TenantId,
        before: Option<MemoryId>,
        limit: u32,
    ) -> Result<Vec<MemoryItem>, StoreError>;

    /// Deletes one item; `false`: there was none.
    async fn delete_memory(&self, tenant: &TenantId, id: MemoryId) -> Result<bool, StoreError>;

    /// Deletes every item of the tenant (a data-deletion request), the
    /// lessons kept with its gateway-run branches, and its queued
    /// extractions and distillations (no lesson appears after it); how many
    /// items.
    async fn delete_memories(&self, tenant: &TenantId) -> Result<u64, StoreError>;

    /// Takes up to `limit` gateway-run branches whose distillation is
    /// pending and not held by another replica (or held past its time):
    /// this one holds them until `until`, and each counts an attempt. On
    /// Postgres with `FOR UPDATE SKIP LOCKED`. Oldest ended first.
    async fn claim_distillations(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Distillation>, StoreError>;

    /// Ends an attempt at a branch's distillation, in one transaction: books
    /// what its model calls were billed (whatever the outcome), then, done,
    /// stores its lessons, only if the distillation was still pending (a
    /// replica that finished it first stored them; this one stores none),
    /// or, failed for good, gives it up, only if no replica claimed it
    /// since. The lessons this call stored.
    async fn end_distillation(
        &self,
        tenant: &TenantId,
        id: BranchId,
        end: DistillationEnd<'_>,
    ) -> Result<Vec<MemoryItem>, StoreError>;

    /// Takes up to `limit` returns whose message is queued to be kept as a
    /// lesson (`extract_memory`) and not held by another replica (or held
    /// past its time), with what the lesson is made of: this one holds them
    /// until `until`, and each counts an attempt. On Postgres with `FOR
    /// UPDATE SKIP LOCKED`. Oldest return first.
    async fn claim_extractions(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Extraction>, StoreError>;

    /// Ends an extraction, in one transaction: with its lesson (scrubbed and
    /// screened), stored only if the extraction was still pending, so a
    /// return is kept once whichever replica finishes first; or, with
    /// `None`, given up, only if no replica claimed it since `attempts`.
    /// The lesson, if this call stored it.
    async fn end_extraction(
        &self,
        tenant: &TenantId,
        id: BranchId,
        attempts: u32,
        lesson: Option<&NewMemory>,
    ) -> Result<Option<MemoryItem>, StoreError>;

    /// Retention, for every tenant: deletes items created before
    /// `older_than`, then each tenant's oldest beyond `max_per_tenant`.
    /// How many went.
    async fn prune_memories(
        &self,
        older_than: DateTime<Utc>,
        max_per_tenant: u64,
    ) -> Result<u64, StoreError>;
}

/// An item to write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMemory {
    pub id: MemoryId,
    pub kind: MemoryKind,
    pub title: String,
    pub description: String,
    pub content: String,
    pub prior: Confidence,
    pub provenance: Provenance,
    /// The injection-screen rules its text set off.
    pub flagged: Vec<String>,
    pub at: DateTime<Utc>,
}

/// What to look for.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryQuery {
    /// Free text: a branch's description and prompt, or a search.
    pub text: String,
    pub kind: Option<MemoryKind>,
    /// Items below it are left out.
    pub min_confidence: f64,
    /// Whether items the injection screen flagged are included.
    pub include_flagged: bool,
    /// How many of the query's terms an item must contain to count as
    /// related (fewer when the query has fewer): one shared word is not a
    /// relation.
    pub min_matched_terms: u32,
    pub limit: u32,
}

/// An item and how well it matched (higher is better; comparable only
/// within one answer).
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub item: MemoryItem,
    pub score: f64,
}

/// The columns of an item.
macro_rules! memory_columns {
    () => {
        "tenant_id, id, kind, source, title, description, content, prior, confidence, subject, \
         session_id, branch_id, flagged, uses, helpful, unhelpful, created_at, last_used_at"
    };
}
pub(crate) use memory_columns;

// After the macro, which it uses.
mod vectors;
pub use self::vectors::{MemoryVectors, TenantScope, VectorsVersion};

/// How a backend's full-text query says "any of these terms" (each term
/// quoted with the separator's first character).
const ANY_TERM: Sql = Sql { postgres: "' | '", sqlite: "\" OR \"" };

/// Ranks a tenant's items by a query: `$2` is the backend's full-text
/// query ([`ANY_TERM`]), `$3` the confidence floor, `$4` a kind or NULL,
/// `$5` whether flagged items count, `$6` the limit. A larger score is
/// better.
const SEARCH: Sql = Sql {
    // The title weighs most (`setweight` in the migration); normalisation
    // 32 maps the rank into 0..1.
    postgres: concat!(
        "SELECT ",
        memory_columns!(),
        ", CAST(ts_rank_cd(search, q, 32) AS DOUBLE PRECISION) AS score \
         FROM memories, to_tsquery('english', $2) AS q \
         WHERE tenant_id = $1 AND numnode(q) > 0 AND search @@ q \
         AND confidence >= $3 AND ($4::text IS NULL OR kind = $4) AND ($5 OR flagged = '') \
         ORDER BY score DESC, id LIMIT $6"
    ),
    // bm25 is lower for a better match; its weights favour the title as
    // Postgres' do.
    sqlite: concat!(
        "SELECT ",
        memory_columns!(),
        ", score FROM memories JOIN (SELECT rowid AS fts_row, \
         -bm25(memories_fts, 4.0, 2.0, 1.0) AS score FROM memories_fts \
         WHERE memories_fts MATCH $2) ON seq = fts_row \
         WHERE tenant_id = $1 AND confidence >= $3 AND ($4 IS NULL OR kind = $4) \
         AND ($5 OR flagged = '') \
         ORDER BY score DESC, id LIMIT $6"
    ),
};

#[async_trait]
impl<D: Dialect> MemoryStore for SqlStore<D>
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
    async fn insert_memory(&self, new: &NewMemory) -> Result<MemoryItem, StoreError> {
        self.timed("insert_memory", async {
            let mut conn = self.pool.acquire().await?;
            Self::insert_memory_on(&mut *conn, new).await
        })
        .await
    }

    async fn memory(
        &self,
        tenant: &TenantId,
        id: MemoryId,
    ) -> Result<Option<MemoryItem>, StoreError> {
        self.timed("memory", async {
            let row: Option<MemoryRow> = sqlx::query_as(concat!(
                "SELECT ",
                memory_columns!(),
                " FROM memories WHERE tenant_id = $1 AND id = $2"
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
            row.map(MemoryItem::try_from).transpose()
        })
        .await
    }

    async fn search_memories(
        &self,
        tenant: &TenantId,
        query: &MemoryQuery,
    ) -> Result<Vec<Ranked>, StoreError> {
        let terms = query_terms(&query.text);
        if terms.is_empty() || query.limit == 0 {
            return Ok(Vec::new());
        }
        self.timed("search_memories", async {
            let any = D::pick(&ANY_TERM);
            let quote = &any[..1];
            let candidates = query.limit.saturating_mul(CANDIDATES_PER_ITEM).max(MIN_CANDIDATES);
            let rows: Vec<RankedRow> = sqlx::query_as(D::pick(&SEARCH))
                .bind(tenant.as_str())
                .bind(format!("{quote}{}{quote}", terms.join(any)))
                .bind(query.min_confidence)
                .bind(query.kind.map(MemoryKind::as_str))
                .bind(query.include_flagged)
                .bind(i64::from(candidates))
                .fetch_all(&self.pool)
                .await?;
            let stemmer = Stemmer::create(Algorithm::English);
            let wanted = stems(&stemmer, &terms.join(" "));
            let floor =
                usize::try_from(query.min_matched_terms).unwrap_or(usize::MAX).min(wanted.len());
            let mut ranked = Vec::new();
            for row in rows {
                let item = MemoryItem::try_from(row.row)?;
                if matched_terms(&stemmer, &wanted, &item) >= floor {
                    ranked.push(Ranked { score: row.score, item });
                }
                if ranked.len() == query.limit as usize {
                    break;
                }
            }
            Ok(ranked)
        })
        .await
    }

    async fn memory_feedback(
        &self,
        tenant: &TenantId,
        id: MemoryId,
        subject: &Subject,
        helpful: bool,
        at: DateTime<Utc>,
    ) -> Result<Option<MemoryItem>, StoreError> {
        self.in_tx(
            "memory_feedback",
            |_| true,
            |mut tx| async move {
                let result = async {
                    // The vote, only for an item that exists.
                    sqlx::query(
                        "INSERT INTO memory_votes (tenant_id, memory_id, subject, helpful, at) \
                     SELECT tenant_id, id, $3, $4, $5 FROM memories \
                     WHERE tenant_id = $1 AND id = $2 \
                     ON CONFLICT (tenant_id, memory_id, subject) \
                     DO UPDATE SET helpful = excluded.helpful, at = excluded.at",
                    )
                    .bind(tenant.as_str())
                    .bind(id.as_uuid())
                    .bind(subject.as_str())
                    .bind(helpful)
                    .bind(Ts(at))
                    .execute(&mut *tx.0)
                    .await?;
                    // The counts, and the confidence of `confidence_after`
                    // (whose prior weight is the 4.0 here); never above 1: the
                    // numerator is at most the denominator.
                    let row: Option<MemoryRow> = sqlx::query_as(concat!(
                        "UPDATE memories SET helpful = v.h, unhelpful = v.u, \
                     confidence = (prior * 4.0 + v.h) / (4.0 + v.h + v.u) \
                     FROM (SELECT count(*) FILTER (WHERE helpful) AS h, \
                     count(*) FILTER (WHERE NOT helpful) AS u FROM memory_votes \
                     WHERE tenant_id = $1 AND memory_id = $2) AS v \
                     WHERE tenant_id = $1 AND id = $2 RETURNING ",
                        memory_columns!()
                    ))
                    .bind(tenant.as_str())
                    .bind(id.as_uuid())
                    .fetch_optional(&mut *tx.0)
                    .await?;
                    row.map(MemoryItem::try_from).transpose()
                }
                .await;
                (tx, result)
            },
        )
        .await
    }

    async fn memories_used(
        &self,
        tenant: &TenantId,
        uses: &[(MemoryId, u64)],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if uses.is_empty() {
            return Ok(());
        }
        self.timed("memories_used", async {
            // One statement for the lot: `[[id, count], …]` as JSON, the id
            // as 32 hex digits (as SQLite's `hex` spells a blob).
            let uses = serde_json::to_string(
                &uses
                    .iter()
                    .map(|(id, n)| (id.as_uuid().simple().to_string(), *n))
                    .collect::<Vec<_>>(),
            )
            .map_err(corrupt)?;
            sqlx::query(D::pick(&Sql {
                postgres: "UPDATE memories AS m SET uses = m.uses + u.n, \
                           last_used_at = GREATEST(m.last_used_at, $3) \
                           FROM (SELECT (e->>0)::uuid AS id, (e->>1)::bigint AS n \
                           FROM jsonb_array_elements($2::jsonb) AS e) AS u \
                           WHERE m.tenant_id = $1 AND m.id = u.id",
                sqlite: "UPDATE memories SET uses = uses + (SELECT json_extract(value, '$[1]') \
                         FROM json_each($2) WHERE json_extract(value, '$[0]') = lower(hex(memories.id))), \
                         last_used_at = max(coalesce(last_used_at, $3), $3) \
                         WHERE tenant_id = $1 AND lower(hex(id)) IN \
                         (SELECT json_extract(value, '$[0]') FROM json_each($2))",
            }))
            .bind(tenant.as_str())
            .bind(uses)
            .bind(Ts(at))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
        .await
    }

    async fn list_memories(
        &self,
        tenant: &TenantId,
        before: Option<MemoryId>,
        limit: u32,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        self.timed("list_memories", async {
            // Ids are time-ordered (UUIDv7): newest first is by id.
            let rows: Vec<MemoryRow> = sqlx::query_as(concat!(
                "SELECT ",
                memory_columns!(),
                " FROM memories WHERE tenant_id = $1 AND ($2 IS NULL OR id < $2) \
                 ORDER BY id DESC LIMIT $3"
            ))
            .bind(tenant.as_str())
            .bind(before.map(|id| id.as_uuid()))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter().map(MemoryItem::try_from).collect()
        })
        .await
    }

    async fn delete_memory(&self, tenant: &TenantId, id: MemoryId) -> Result<bool, StoreError> {
        self.timed("delete_memory", async {
            let done = sqlx::query("DELETE FROM memories WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .execute(&self.pool)
                .await?;
            sqlx::query("DELETE FROM memory_votes WHERE tenant_id = $1 AND memory_id = $2")
                .bind(tenant.as_str())
                .bind(id.as_uuid())
                .execute(&self.pool)
                .await?;
            Ok(crate::dialect::RowsAffected::rows_affected(&done) > 0)
        })
        .await
    }

    async fn delete_memories(&self, tenant: &TenantId) -> Result<u64, StoreError> {
        self.timed("delete_memories", async {
            let done = sqlx::query("DELETE FROM memories WHERE tenant_id = $1")
                .bind(tenant.as_str())
                .execute(&self.pool)
                .await?;
            sqlx::query("DELETE FROM memory_votes WHERE tenant_id = $1")
                .bind(tenant.as_str())
                .execute(&self.pool)
                .await?;
            // The copies given to gateway-run branches go too.
            sqlx::query("UPDATE branch_runs SET lessons = NULL WHERE tenant_id = $1")
                .bind(tenant.as_str())
                .execute(&self.pool)
                .await?;
            // And what was queued to become lessons.
            self.drop_queued(tenant).await?;
            Ok(crate::dialect::RowsAffected::rows_affected(&done))
        })
        .await
    }

    async fn claim_distillations(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Distillation>, StoreError> {
        self.claim_distillation_rows(now, until, limit).await
    }

    async fn end_distillation(
        &self,
        tenant: &TenantId,
        id: BranchId,
        end: DistillationEnd<'_>,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        self.end_distillation_row(tenant, id, end).await
    }

    async fn claim_extractions(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Extraction>, StoreError> {
        self.claim_extraction_rows(now, until, limit).await
    }

    async fn end_extraction(
        &self,
        tenant: &TenantId,
        id: BranchId,
        attempts: u32,
        lesson: Option<&NewMemory>,
    ) -> Result<Option<MemoryItem>, StoreError> {
        self.end_extraction_row(tenant, id, attempts, lesson).await
    }

    async fn prune_memories(
        &self,
        older_than: DateTime<Utc>,
        max_per_tenant: u64,
    ) -> Result<u64, StoreError> {
        self.timed("prune_memories", async {
            let aged = sqlx::query("DELETE FROM memories WHERE created_at < $1")
                .bind(Ts(older_than))
                .execute(&self.pool)
                .await?;
            let keep = i64::try_from(max_per_tenant).unwrap_or(i64::MAX);
            let over = sqlx::query(
                "DELETE FROM memories WHERE (tenant_id, id) IN (SELECT tenant_id, id FROM \
                 (SELECT tenant_id, id, row_number() OVER (PARTITION BY tenant_id \
                 ORDER BY created_at DESC, id DESC) AS n FROM memories) AS ranked WHERE n > $1)",
            )
            .bind(keep)
            .execute(&self.pool)
            .await?;
            // The votes on what went.
            sqlx::query(
                "DELETE FROM memory_votes WHERE NOT EXISTS (SELECT 1 FROM memories AS m \
                 WHERE m.tenant_id = memory_votes.tenant_id AND m.id = memory_votes.memory_id)",
            )
            .execute(&self.pool)
            .await?;
            Ok(crate::dialect::RowsAffected::rows_affected(&aged)
                + crate::dialect::RowsAffected::rows_affected(&over))
        })
        .await
    }
}
