//! The reasoning memory as the store keeps it: items per tenant, ranked by
//! full text (Postgres `tsvector` with a GIN index, SQLite FTS5 with bm25).
//!
//! Text reaches this module scrubbed and screened; the store only keeps it,
//! ranks it, and moves its counts and confidence in single statements.

use std::{collections::HashSet, fmt::Debug};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{
    BranchId, Confidence, MemoryId, MemoryItem, MemoryKind, MemorySource, Provenance, SessionId,
    Subject, TenantId,
};
use rust_stemmers::{Algorithm, Stemmer};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

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

    /// Counts a use that helped or did not, and moves the confidence from
    /// the prior ([`foldgate_domain::confidence_after`]). `None`: no such item.
    async fn memory_feedback(
        &self,
        tenant: &TenantId,
        id: MemoryId,
        helpful: bool,
    ) -> Result<Option<MemoryItem>, StoreError>;

    /// Counts an injection of each item.
    async fn memories_used(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
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

    /// Deletes every item of the tenant (a data-deletion request); how many.
    async fn delete_memories(&self, tenant: &TenantId) -> Result<u64, StoreError>;

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

/// The terms of a free-text query, as both backends' queries take them:
/// lowercased words of letters and digits, English stop words left out,
/// each once, at most [`MAX_TERMS`].
pub fn query_terms(text: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in query_terms_unbounded(text) {
        if !terms.contains(&word) {
            terms.push(word);
        }
        if terms.len() == MAX_TERMS {
            break;
        }
    }
    terms
}

/// Every term of a text, lowercased, stop words left out.
fn query_terms_unbounded(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 2 && STOP_WORDS.binary_search(&w.as_str()).is_err())
}

/// The most terms a query is ranked by.
pub const MAX_TERMS: usize = 64;

/// How many candidates the database ranks for each item asked for, before
/// those sharing too few terms are left out.
const CANDIDATES_PER_ITEM: u32 = 4;
/// The fewest candidates the database ranks.
const MIN_CANDIDATES: u32 = 40;

/// The stems of a text's terms (Snowball English, as Postgres' `english`
/// configuration stems).
fn stems(stemmer: &Stemmer, text: &str) -> HashSet<String> {
    query_terms_unbounded(text).map(|t| stemmer.stem(&t).into_owned()).collect()
}

/// How many of `query`'s stems `item` contains.
fn matched_terms(stemmer: &Stemmer, query: &HashSet<String>, item: &MemoryItem) -> usize {
    let text = format!("{} {} {}", item.title, item.description, item.content);
    stems(stemmer, &text).intersection(query).count()
}

/// Words too common to say what a text is about (sorted, for the binary
/// search). Postgres' `english` configuration drops its own list; this one
/// serves SQLite, whose FTS5 keeps every word.
const STOP_WORDS: &[&str] = &[
    "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could",
    "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had",
    "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "if", "in", "into",
    "is", "it", "its", "itself", "just", "me", "more", "most", "my", "no", "nor", "not", "now",
    "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own", "same",
    "she", "should", "so", "some", "such", "than", "that", "the", "their", "them", "then", "there",
    "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very",
    "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will",
    "with", "would", "you", "your", "yours",
];

/// The columns of an item.
macro_rules! memory_columns {
    () => {
        "tenant_id, id, kind, source, title, description, content, prior, confidence, subject, \
         session_id, branch_id, flagged, uses, helpful, unhelpful, created_at, last_used_at"
    };
}

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

/// A `memories` row.
#[derive(Debug, sqlx::FromRow)]
struct MemoryRow {
    tenant_id: String,
    id: Uuid,
    kind: String,
    source: String,
    title: String,
    description: String,
    content: String,
    prior: f64,
    confidence: f64,
    subject: String,
    session_id: Option<String>,
    branch_id: Option<Uuid>,
    flagged: String,
    uses: i64,
    helpful: i64,
    unhelpful: i64,
    created_at: DateTime<Utc>,
    last_used_at: Option<DateTime<Utc>>,
}

#[derive(Debug, sqlx::FromRow)]
struct RankedRow {
    #[sqlx(flatten)]
    row: MemoryRow,
    score: f64,
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn count(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(format!("negative count {v}")))
}

impl TryFrom<MemoryRow> for MemoryItem {
    type Error = StoreError;

    fn try_from(r: MemoryRow) -> Result<Self, Self::Error> {
        Ok(MemoryItem {
            id: MemoryId::from_uuid(r.id),
            kind: r.kind.parse().map_err(corrupt)?,
            title: r.title,
            description: r.description,
            content: r.content,
            prior: Confidence::new(r.prior).map_err(corrupt)?,
            confidence: Confidence::new(r.confidence).map_err(corrupt)?,
            provenance: Provenance {
                tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
                subject: Subject::parse(&r.subject).map_err(corrupt)?,
                session: r
                    .session_id
                    .as_deref()
                    .map(SessionId::parse)
                    .transpose()
                    .map_err(corrupt)?,
                branch: r.branch_id.map(BranchId::from_uuid),
                source: r.source.parse::<MemorySource>().map_err(corrupt)?,
            },
            flagged: r.flagged.split_whitespace().map(str::to_owned).collect(),
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            uses: count(r.uses)?,
            helpful: count(r.helpful)?,
            unhelpful: count(r.unhelpful)?,
        })
    }
}

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
            .fetch_one(&self.pool)
            .await?;
            MemoryItem::try_from(row)
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
        helpful: bool,
    ) -> Result<Option<MemoryItem>, StoreError> {
        self.timed("memory_feedback", async {
            // The confidence of `confidence_after` (whose prior weight is
            // the 4.0 here), from the counts after this use, in the same
            // statement. It never exceeds 1: the numerator is at most the
            // denominator.
            let row: Option<MemoryRow> = sqlx::query_as(concat!(
                "UPDATE memories SET helpful = helpful + $3, unhelpful = unhelpful + 1 - $3, \
                 confidence = (prior * 4.0 + helpful + $3) / (4.0 + helpful + unhelpful + 1) \
                 WHERE tenant_id = $1 AND id = $2 RETURNING ",
                memory_columns!()
            ))
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .bind(i64::from(helpful))
            .fetch_optional(&self.pool)
            .await?;
            row.map(MemoryItem::try_from).transpose()
        })
        .await
    }

    async fn memories_used(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.timed("memories_used", async {
            // One statement for the lot: the ids as a JSON array.
            let ids = serde_json::to_string(
                &ids.iter().map(|id| id.as_uuid().to_string()).collect::<Vec<_>>(),
            )
            .map_err(corrupt)?;
            sqlx::query(D::pick(&Sql {
                postgres: "UPDATE memories SET uses = uses + 1, last_used_at = $3 \
                           WHERE tenant_id = $1 AND id IN \
                           (SELECT value::uuid FROM jsonb_array_elements_text($2::jsonb))",
                sqlite: "UPDATE memories SET uses = uses + 1, last_used_at = $3 \
                         WHERE tenant_id = $1 AND lower(hex(id)) IN \
                         (SELECT replace(value, '-', '') FROM json_each($2))",
            }))
            .bind(tenant.as_str())
            .bind(ids)
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
            Ok(crate::dialect::RowsAffected::rows_affected(&done))
        })
        .await
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
            Ok(crate::dialect::RowsAffected::rows_affected(&aged)
                + crate::dialect::RowsAffected::rows_affected(&over))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_are_sorted_for_the_binary_search() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn query_terms_are_the_words_that_say_something() {
        assert_eq!(
            query_terms("Fix the flaky test in CI: it's *timing*-dependent, the test!"),
            ["fix", "flaky", "test", "ci", "timing", "dependent"]
        );
        assert!(query_terms("a the of ' \" ) OR AND").is_empty());
        assert_eq!(query_terms(&"word ".repeat(500)).len(), 1);
        let many: String = (0..200).map(|i| format!("w{i} ")).collect();
        assert_eq!(query_terms(&many).len(), MAX_TERMS);
    }
}
