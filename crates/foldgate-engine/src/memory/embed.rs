//! Ranking by embeddings as well as full text: what turns text into
//! vectors ([`Embedder`], implemented where the model clients live), the
//! per-replica cache of query vectors, nearest items by cosine similarity,
//! and reciprocal rank fusion.

use std::{
    collections::HashMap,
    fmt::Debug,
    hash::BuildHasher,
    sync::{Arc, Mutex, PoisonError},
};

use async_trait::async_trait;
use foldgate_domain::{MemoryId, TenantId};
use foldgate_store::TenantScope;
use hashlink::LruCache;

/// Turns texts into vectors with the embeddings model that serves a tenant.
#[async_trait]
pub trait Embedder: Send + Sync + Debug {
    /// The model that serves `tenant`, by the name its vectors are stored
    /// under; `None`: the tenant's lessons are ranked by full text alone.
    fn model_for(&self, tenant: &TenantId) -> Option<&str>;

    /// Every model, by that name, with the tenants it serves (a tenant is
    /// in one scope at most).
    fn scopes(&self) -> Vec<(String, TenantScope)>;

    /// One vector per text, in order, from the model that serves `tenant`.
    async fn embed(&self, tenant: &TenantId, texts: &[String])
    -> Result<Vec<Vec<f32>>, EmbedError>;
}

/// Why texts could not be embedded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct EmbedError {
    /// A short, stable name for metrics and logs (`timeout`, `refused`, …).
    pub kind: &'static str,
    /// For people; never a key.
    pub detail: String,
}

impl EmbedError {
    pub fn new(kind: &'static str, detail: impl Into<String>) -> Self {
        Self { kind, detail: detail.into() }
    }
}

/// How far down each list reciprocal rank fusion looks: 60, as in Cormack,
/// Clarke and Büttcher (2009); it keeps one list's first place from
/// outweighing agreement between the two further down.
pub const RRF_K: f64 = 60.0;

/// Merges ranked lists by reciprocal rank fusion: an id scores
/// `Σ 1 / (RRF_K + rank)` over the lists it is in (ranks from 1). Best
/// first; ties go to the better rank in any list, then to the earlier list.
pub fn reciprocal_rank_fusion(lists: &[&[MemoryId]]) -> Vec<MemoryId> {
    // id → (score, best rank, first list it appeared in, its place there)
    let mut scores: HashMap<MemoryId, (f64, usize, usize)> = HashMap::new();
    for (list_no, list) in lists.iter().enumerate() {
        for (at, id) in list.iter().enumerate() {
            #[expect(clippy::cast_precision_loss, reason = "ranks are small")]
            let share = 1.0 / (RRF_K + (at + 1) as f64);
            let entry = scores.entry(*id).or_insert((0.0, usize::MAX, list_no));
            entry.0 += share;
            entry.1 = entry.1.min(at);
        }
    }
    let mut fused: Vec<(MemoryId, (f64, usize, usize))> = scores.into_iter().collect();
    fused.sort_by(|(a_id, a), (b_id, b)| {
        b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)).then(a_id.cmp(b_id))
    });
    fused.into_iter().map(|(id, _)| id).collect()
}

/// A tenant's vectors from one model, unit length, side by side.
#[derive(Debug, Default)]
pub struct Vectors {
    pub ids: Vec<MemoryId>,
    /// `ids.len() × dims` floats.
    pub data: Vec<f32>,
    pub dims: usize,
}

impl Vectors {
    /// From the stored vectors: each scaled to unit length; those of
    /// another dimension than most (a model that changed under its name)
    /// and zero vectors are left out.
    pub fn new(rows: Vec<(MemoryId, Vec<f32>)>) -> Self {
        let mut by_dims: HashMap<usize, usize> = HashMap::new();
        for (_, v) in &rows {
            *by_dims.entry(v.len()).or_default() += 1;
        }
        let dims = by_dims.into_iter().max_by_key(|(d, n)| (*n, *d)).map_or(0, |(d, _)| d);
        let mut vectors = Self { ids: Vec::new(), data: Vec::new(), dims };
        for (id, v) in rows {
            if v.len() == dims
                && let Some(unit) = unit(&v)
            {
                vectors.ids.push(id);
                vectors.data.extend(unit);
            }
        }
        vectors
    }

    /// What they take in memory, roughly.
    pub fn bytes(&self) -> usize {
        self.ids.len() * size_of::<MemoryId>() + self.data.len() * size_of::<f32>()
    }

    /// Up to `n` ids most similar to `query` (cosine), at least `floor`,
    /// best first. Nothing when the query's dimension differs.
    pub fn nearest(&self, query: &[f32], n: usize, floor: f32) -> Vec<(MemoryId, f32)> {
        let Some(query) = unit(query) else { return Vec::new() };
        if query.len() != self.dims || self.dims == 0 {
            return Vec::new();
        }
        let mut scored: Vec<(MemoryId, f32)> = self
            .data
            .chunks_exact(self.dims)
            .zip(&self.ids)
            .map(|(v, id)| (*id, v.iter().zip(&query).map(|(a, b)| a * b).sum::<f32>()))
            .filter(|(_, s)| *s >= floor)
            .collect();
        let by_score =
            |a: &(MemoryId, f32), b: &(MemoryId, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if scored.len() > n && n > 0 {
            scored.select_nth_unstable_by(n - 1, by_score);
            scored.truncate(n);
        }
        scored.sort_by(by_score);
        scored.truncate(n);
        scored
    }
}

/// `v` scaled to unit length; `None` for a zero or non-finite vector.
fn unit(v: &[f32]) -> Option<Vec<f32>> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    (norm.is_finite() && norm > 0.0).then(|| v.iter().map(|x| x / norm).collect())
}

/// How many query vectors a replica keeps.
pub const QUERY_CACHE_ENTRIES: usize = 1_024;

/// Query vectors this replica computed, by a keyed hash of the tenant, the
/// model and the text (the keys are random per process, so no one can
/// choose a text to collide with another's), least recently used first out.
/// Queries of the same text at once make one call: the others wait for it.
#[derive(Debug)]
pub struct QueryCache {
    hasher: std::hash::RandomState,
    entries: Mutex<LruCache<u64, Arc<Vec<f32>>>>,
    /// One call at a time per key.
    calls: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
}

/// How many keys' gates are kept before those no one holds are dropped.
const GATES: usize = 64;

impl QueryCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            hasher: std::hash::RandomState::new(),
            entries: Mutex::new(LruCache::new(capacity.max(1))),
            calls: Mutex::new(HashMap::new()),
        }
    }

    pub fn key(&self, tenant: &TenantId, model: &str, text: &str) -> u64 {
        self.hasher.hash_one((tenant.as_str(), model, text))
    }

    pub fn get(&self, key: u64) -> Option<Arc<Vec<f32>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).get(&key).cloned()
    }

    pub fn put(&self, key: u64, vector: Arc<Vec<f32>>) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).insert(key, vector);
    }

    /// What a caller about to ask the model for `key` holds meanwhile.
    pub fn gate(&self, key: u64) -> Arc<tokio::sync::Mutex<()>> {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        if calls.len() >= GATES {
            calls.retain(|_, gate| Arc::strong_count(gate) > 1);
        }
        Arc::clone(calls.entry(key).or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<MemoryId> {
        let mut ids: Vec<MemoryId> = (0..n).map(|_| MemoryId::generate()).collect();
        ids.sort();
        ids
    }

    #[test]
    fn fusion_rewards_agreement_between_the_lists() {
        let [a, b, c, d] = ids(4)[..] else { unreachable!() };
        // `c` is second in both lists: it beats `a` and `b`, each first in one.
        let fused = reciprocal_rank_fusion(&[&[a, c, d], &[b, c]]);
        assert_eq!(fused[0], c);
        // `a` and `b` tie on score and rank: the first list's goes first.
        assert_eq!(&fused[1..], &[a, b, d]);
        assert_eq!(reciprocal_rank_fusion(&[&[a, b], &[]]), vec![a, b], "one list keeps its order");
        assert!(reciprocal_rank_fusion(&[&[], &[]]).is_empty());
    }

    #[test]
    fn fusion_scores_are_reciprocal_ranks_with_k_60() {
        let [a, b] = ids(2)[..] else { unreachable!() };
        let others = ids(8);
        // a: first, then tenth: 1/61 + 1/70 ≈ 0.03068; b: second in both:
        // 2/62 ≈ 0.03226. With k = 0, a would win (1 + 1/10 > 1/2 + 1/2).
        let second: Vec<MemoryId> =
            [others[0], b].into_iter().chain(others[1..].iter().copied()).chain([a]).collect();
        assert_eq!(second.iter().position(|x| *x == a), Some(9));
        assert_eq!(reciprocal_rank_fusion(&[&[a, b], &second])[..2], [b, a]);
    }

    #[test]
    fn nearest_is_by_cosine_above_the_floor() {
        let [a, b, c] = ids(3)[..] else { unreachable!() };
        let vectors = Vectors::new(vec![
            (a, vec![1.0, 0.0]),
            (b, vec![10.0, 10.0]),
            (c, vec![0.0, -3.0]),
            (MemoryId::generate(), vec![1.0, 2.0, 3.0]),
            (MemoryId::generate(), vec![0.0, 0.0]),
        ]);
        assert_eq!(vectors.dims, 2);
        assert_eq!(vectors.ids, vec![a, b, c], "other dimensions and zero vectors are left out");
        let near = vectors.nearest(&[2.0, 0.1], 5, 0.0);
        assert_eq!(near.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![a, b]);
        assert!((near[0].1 - 0.9988).abs() < 1e-3, "{near:?}");
        assert_eq!(vectors.nearest(&[2.0, 0.1], 1, 0.0).len(), 1);
        assert!(vectors.nearest(&[1.0, 0.0, 0.0], 5, -1.0).is_empty(), "another dimension");
        assert!(vectors.nearest(&[0.0, 0.0], 5, -1.0).is_empty(), "a zero query");
    }

    #[test]
    fn the_query_cache_is_bounded_and_keyed_by_tenant_model_and_text() {
        let cache = QueryCache::new(2);
        let acme = TenantId::parse("acme").unwrap();
        let globex = TenantId::parse("globex").unwrap();
        let k1 = cache.key(&acme, "m", "text");
        assert_ne!(k1, cache.key(&globex, "m", "text"));
        assert_ne!(k1, cache.key(&acme, "n", "text"));
        cache.put(k1, Arc::new(vec![1.0]));
        cache.put(2, Arc::new(vec![2.0]));
        cache.put(3, Arc::new(vec![3.0]));
        assert!(cache.get(k1).is_none(), "the least recently used went");
        assert_eq!(cache.get(3).as_deref(), Some(&vec![3.0]));
    }
}
