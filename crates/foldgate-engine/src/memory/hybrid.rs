//! Ranking by full text and, when an embeddings model serves the tenant,
//! by embeddings too; and the writing of items' vectors.
//!
//! The hybrid rank fuses two lists of the tenant's items that pass the same
//! filters (tenant, kind, confidence, not flagged): full text's, and the
//! items nearest the query by cosine similarity of their vectors (at least
//! `embeddings_min_similarity`), by reciprocal rank fusion ([`RRF_K`]).
//! The query's vector and the tenant's vectors are had within
//! `embeddings_timeout`; past it, or when either fails, the query is
//! ranked by full text alone (logged, and counted), never failed.
//!
//! An item is embedded after it is stored, off the request's path, by the
//! replica that stored it; one that was not (the model failed, was busy or
//! configured later) is embedded by the `memory_embed` background task.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use foldgate_domain::{MemoryId, MemoryItem, MemoryKind, Principal, TenantId};
use foldgate_store::{MemoryQuery, Store, StoreError};
use tokio::sync::Semaphore;

#[cfg(doc)]
use super::embed::RRF_K;
use super::{
    MemoryBank, MemoryMetrics,
    embed::{EmbedError, Embedder, QUERY_CACHE_ENTRIES, QueryCache, reciprocal_rank_fusion},
    vector_cache::VectorCache,
};
use crate::{Clock, FoldError};

/// How many items each list brings to the fusion, for `limit` wanted.
fn fusion_depth(limit: u32) -> u32 {
    limit.saturating_mul(2).clamp(20, 100)
}

/// How many of the nearest items are looked at for each one the fusion
/// takes (some fail the filters: flagged, below the confidence floor, of
/// another kind).
const NEAREST_OVERSAMPLE: u32 = 3;

/// Above this many floats, the similarities are computed off the async
/// threads.
const BLOCKING_FLOATS: usize = 1 << 20;

/// How many items this replica embeds at once right after storing them;
/// beyond that they are left to the backfill.
const RECORD_EMBEDDERS: usize = 4;

/// The most items one pass of the backfill embeds, per model.
pub const BACKFILL_BATCH: u32 = 64;
/// The most texts in one call of the embeddings model.
const EMBED_CHUNK: usize = 16;

/// What ranking by embeddings needs, when a model is configured.
#[derive(Debug)]
pub(super) struct Embedding {
    embedder: Arc<dyn Embedder>,
    vectors: Arc<VectorCache>,
    queries: QueryCache,
    writers: Arc<Semaphore>,
}

impl Embedding {
    pub(super) fn new(embedder: Arc<dyn Embedder>, config: &super::MemoryConfig) -> Self {
        let bytes = config.embeddings_cache_mib.saturating_mul(1 << 20);
        Self {
            embedder,
            vectors: Arc::new(VectorCache::new(
                config.embeddings_cache_ttl,
                usize::try_from(bytes).unwrap_or(usize::MAX),
            )),
            queries: QueryCache::new(QUERY_CACHE_ENTRIES),
            writers: Arc::new(Semaphore::new(RECORD_EMBEDDERS)),
        }
    }
}

/// Items could not be embedded.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddingFailed {
    #[error("the embeddings model failed: {0}")]
    Model(#[from] EmbedError),
    #[error("storing vectors failed: {0}")]
    Store(#[from] StoreError),
}

/// The text of an item that is embedded.
fn item_text(item: &MemoryItem) -> String {
    format!("{}\n{}\n{}", item.title, item.description, item.content)
}

/// Embeds `items` (all of `tenant`) with `model` and stores their vectors.
async fn embed_items(
    store: &Arc<dyn Store>,
    embedding: &Embedding,
    clock: &Arc<dyn Clock>,
    metrics: &MemoryMetrics,
    (tenant, model): (&TenantId, &str),
    items: &[MemoryItem],
    via: &'static str,
) -> Result<usize, EmbeddingFailed> {
    let texts: Vec<String> = items.iter().map(item_text).collect();
    let vectors = match embedding.embedder.embed(tenant, &texts).await {
        Ok(vectors) if vectors.len() == items.len() => vectors,
        Ok(vectors) => {
            metrics.embedded(via, "failed", items.len());
            return Err(EmbedError::new(
                "malformed_answer",
                format!("{} vectors for {} texts", vectors.len(), items.len()),
            )
            .into());
        }
        Err(e) => {
            metrics.embedded(via, "failed", items.len());
            return Err(e.into());
        }
    };
    let at = clock.now();
    let mut written = 0;
    for (item, vector) in items.iter().zip(&vectors) {
        if store.put_memory_vector(tenant, item.id, model, vector, at).await? {
            written += 1;
        }
    }
    embedding.vectors.touched(tenant, model);
    metrics.embedded(via, "embedded", written);
    Ok(written)
}

impl MemoryBank {
    /// Ranks by embeddings as well as full text, with `embedder`'s models.
    pub fn with_embedder(mut self, embedder: Arc<dyn Embedder>) -> Self {
        self.embedding = Some(Arc::new(Embedding::new(embedder, &self.config)));
        self
    }

    /// Whether an embeddings model is configured (for any tenant).
    pub fn embeds(&self) -> bool {
        self.embedding.is_some()
    }

    /// Embeds a stored item off the caller's path, if a model serves its
    /// tenant and this replica is not already embedding as many as it
    /// may (then the backfill will).
    pub(super) fn embed_later(&self, item: &MemoryItem) {
        let Some(embedding) = &self.embedding else { return };
        let tenant = item.provenance.tenant.clone();
        let Some(model) = embedding.embedder.model_for(&tenant).map(str::to_owned) else { return };
        let Ok(permit) = Arc::clone(&embedding.writers).try_acquire_owned() else {
            self.metrics.embedded("record", "deferred", 1);
            return;
        };
        let (store, embedding) = (Arc::clone(&self.store), Arc::clone(embedding));
        let (clock, metrics, item) = (Arc::clone(&self.clock), self.metrics.clone(), item.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let done = embed_items(
                &store,
                &embedding,
                &clock,
                &metrics,
                (&tenant, &model),
                std::slice::from_ref(&item),
                "record",
            )
            .await;
            if let Err(e) = done {
                tracing::warn!(tenant = %tenant, memory_id = %item.id, model, error = %e,
                    "a memory item was not embedded; the backfill will try again");
            }
        });
    }

    /// One pass of the backfill: embeds up to [`BACKFILL_BATCH`] items per
    /// model that have no vector from it, continuing after where the last
    /// pass got to (`cursors`, per model; from the start once it reached
    /// the end). The first failure ends the pass: the items it was on are
    /// tried again when the pass comes round to them.
    pub async fn backfill(
        &self,
        cursors: &mut HashMap<String, (TenantId, MemoryId)>,
    ) -> Result<usize, EmbeddingFailed> {
        let Some(embedding) = &self.embedding else { return Ok(0) };
        let mut embedded = 0;
        for (model, scope) in embedding.embedder.scopes() {
            let after = cursors.remove(&model);
            let items = self
                .store
                .memories_without_vector(&model, &scope, after.as_ref(), BACKFILL_BATCH)
                .await?;
            let full = items.len() == BACKFILL_BATCH as usize;
            let chunks = items
                .chunk_by(|a, b| a.provenance.tenant == b.provenance.tenant)
                .flat_map(|same| same.chunks(EMBED_CHUNK));
            for chunk in chunks {
                let Some(last) = chunk.last() else { continue };
                let tenant = &last.provenance.tenant;
                if full {
                    cursors.insert(model.clone(), (tenant.clone(), last.id));
                }
                if embedding.embedder.model_for(tenant) != Some(model.as_str()) {
                    continue;
                }
                let at = (tenant, model.as_str());
                embedded += embed_items(
                    &self.store,
                    embedding,
                    &self.clock,
                    &self.metrics,
                    at,
                    chunk,
                    "backfill",
                )
                .await?;
            }
        }
        Ok(embedded)
    }

    /// The tenant's items related to `text`, best first, as the settings
    /// say what is related and whether flagged items count: by full text,
    /// fused with the nearest by embeddings when a model serves the tenant.
    pub(super) async fn ranked(
        &self,
        who: &Principal,
        text: &str,
        kind: Option<MemoryKind>,
        min_confidence: f64,
        limit: u32,
    ) -> Result<Vec<MemoryItem>, FoldError> {
        let query = MemoryQuery {
            text: text.to_owned(),
            kind,
            min_confidence,
            include_flagged: self.config.inject_flagged,
            min_matched_terms: self.config.memory_min_matched_terms,
            limit,
        };
        let tenant = &who.tenant;
        let hybrid = self
            .embedding
            .as_ref()
            .and_then(|e| Some((e, e.embedder.model_for(tenant)?)))
            .filter(|_| !text.trim().is_empty() && limit > 0);
        let Some((embedding, model)) = hybrid else {
            let found = self.store.search_memories(tenant, &query).await?;
            return Ok(found.into_iter().map(|r| r.item).collect());
        };
        let depth = fusion_depth(limit);
        let full_text_query = MemoryQuery { limit: depth, ..query.clone() };
        let (full_text, nearest) = tokio::join!(
            self.store.search_memories(tenant, &full_text_query),
            self.nearest(embedding, tenant, model, text, depth.saturating_mul(NEAREST_OVERSAMPLE)),
        );
        let full_text: Vec<MemoryItem> = full_text?.into_iter().map(|r| r.item).collect();
        let Some(nearest) = nearest else {
            return Ok(full_text.into_iter().take(limit as usize).collect());
        };
        // The nearest items full text did not bring, if they pass the filters.
        let by_text: Vec<MemoryId> = full_text.iter().map(|i| i.id).collect();
        let seen: HashSet<MemoryId> = by_text.iter().copied().collect();
        let others: Vec<MemoryId> =
            nearest.iter().map(|(id, _)| *id).filter(|id| !seen.contains(id)).collect();
        let fetched = match self.store.memories_among(tenant, &others, &query).await {
            Ok(fetched) => fetched,
            Err(e) => {
                self.fell_back(tenant, model, "store", &e);
                return Ok(full_text.into_iter().take(limit as usize).collect());
            }
        };
        let mut items: HashMap<MemoryId, MemoryItem> =
            full_text.into_iter().chain(fetched).map(|i| (i.id, i)).collect();
        let by_vector: Vec<MemoryId> = nearest
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| items.contains_key(id))
            .take(depth as usize)
            .collect();
        Ok(reciprocal_rank_fusion(&[&by_text, &by_vector])
            .into_iter()
            .filter_map(|id| items.remove(&id))
            .take(limit as usize)
            .collect())
    }

    /// The tenant's items nearest `text`, best first, at least
    /// `embeddings_min_similarity`; `None` (logged and counted) when the
    /// query's vector or the tenant's vectors could not be had in time.
    async fn nearest(
        &self,
        embedding: &Embedding,
        tenant: &TenantId,
        model: &str,
        text: &str,
        n: u32,
    ) -> Option<Vec<(MemoryId, f32)>> {
        #[expect(clippy::cast_possible_truncation, reason = "a similarity from -1 to 1")]
        let floor = self.config.embeddings_min_similarity as f32;
        let work = async {
            let (query, vectors) =
                tokio::try_join!(self.query_vector(embedding, tenant, model, text), async {
                    embedding
                        .vectors
                        .get(&self.store, tenant, model)
                        .await
                        .map_err(|e| ("store", e.to_string()))
                },)?;
            let n = n as usize;
            if vectors.data.len() > BLOCKING_FLOATS {
                tokio::task::spawn_blocking(move || vectors.nearest(&query, n, floor))
                    .await
                    .map_err(|e| ("error", e.to_string()))
            } else {
                Ok(vectors.nearest(&query, n, floor))
            }
        };
        match tokio::time::timeout(self.config.embeddings_timeout, work).await {
            Ok(Ok(nearest)) => Some(nearest),
            Ok(Err((reason, error))) => {
                self.fell_back(tenant, model, reason, &error);
                None
            }
            Err(_elapsed) => {
                let waited = format!(
                    "no vectors within {}",
                    foldgate_domain::duration::show(self.config.embeddings_timeout)
                );
                self.fell_back(tenant, model, "timeout", &waited);
                None
            }
        }
    }

    fn fell_back(
        &self,
        tenant: &TenantId,
        model: &str,
        reason: &'static str,
        error: &dyn std::fmt::Display,
    ) {
        tracing::warn!(tenant = %tenant, model, reason, error = %error,
            "memory ranked by full text alone: ranking by embeddings failed");
        self.metrics.embedding_fallback(tenant, reason);
    }

    /// The query's vector: from this replica's cache, or one call of the
    /// model.
    async fn query_vector(
        &self,
        embedding: &Embedding,
        tenant: &TenantId,
        model: &str,
        text: &str,
    ) -> Result<Arc<Vec<f32>>, (&'static str, String)> {
        let key = embedding.queries.key(tenant, model, text);
        if let Some(vector) = embedding.queries.get(key) {
            self.metrics.query_vector(true);
            return Ok(vector);
        }
        // The same text asked at once: one call, the others wait for it.
        let gate = embedding.queries.gate(key);
        let _one_call = gate.lock().await;
        if let Some(vector) = embedding.queries.get(key) {
            self.metrics.query_vector(true);
            return Ok(vector);
        }
        self.metrics.query_vector(false);
        let mut vectors = embedding
            .embedder
            .embed(tenant, &[text.to_owned()])
            .await
            .map_err(|e| ("model", e.to_string()))?;
        let vector = vectors
            .pop()
            .filter(|_| vectors.is_empty())
            .ok_or(("model", "not one vector for one text".to_owned()))?;
        let vector = Arc::new(vector);
        embedding.queries.put(key, Arc::clone(&vector));
        Ok(vector)
    }
}
