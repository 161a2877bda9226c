//! Tenants' vectors as this replica last read them, so that ranking does
//! not read every vector from the database on every search or create.
//!
//! A tenant's entry is used for `ttl` after it was read or checked; then
//! the next query checks, with one cheap statement, whether vectors were
//! written since ([`VectorsVersion`]), and reads them all again only if
//! they were. A vector this replica writes marks the tenant's entry for
//! that check at once (as does a read or check that was under way
//! meanwhile). So a lesson embedded by another replica joins the ranking by
//! embeddings within `ttl` (it is found by full text at once);
//! a deleted lesson's vector may linger as long, but ranking only ever
//! returns lessons still in the database. Entries are bounded in bytes,
//! the least recently used going first. One read per tenant at a time:
//! others wait for it rather than read too.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use foldgate_domain::TenantId;
use foldgate_store::{Store, StoreError, VectorsVersion};
use hashlink::LinkedHashMap;

use super::embed::Vectors;

type Key = (TenantId, String);

/// What this replica knows of one tenant's vectors from one model.
#[derive(Debug)]
struct Entry {
    vectors: Arc<Vectors>,
    version: VectorsVersion,
    /// When they were last read or checked; `None`: check before use.
    checked: Option<Instant>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: LinkedHashMap<Key, Entry>,
    bytes: usize,
    /// One read at a time per tenant and model.
    reads: HashMap<Key, Arc<tokio::sync::Mutex<()>>>,
}

/// Tenants' vectors, per replica.
pub struct VectorCache {
    ttl: Duration,
    max_bytes: usize,
    inner: Mutex<Inner>,
    /// Counts the vectors this replica wrote: a read that saw it change
    /// may have missed one, so what it read is checked before its next use.
    writes: AtomicU64,
}

impl fmt::Debug for VectorCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("VectorCache")
            .field("ttl", &self.ttl)
            .field("max_bytes", &self.max_bytes)
            .field("tenants", &inner.entries.len())
            .field("bytes", &inner.bytes)
            .finish()
    }
}

impl VectorCache {
    pub fn new(ttl: Duration, max_bytes: usize) -> Self {
        Self { ttl, max_bytes, inner: Mutex::new(Inner::default()), writes: AtomicU64::new(0) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tenant's vectors from `model`, read or checked within `ttl`.
    ///
    /// The read runs as a task of its own: a caller that stops waiting
    /// (its time is up) leaves it to finish for the next one.
    pub async fn get(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        tenant: &TenantId,
        model: &str,
    ) -> Result<Arc<Vectors>, StoreError> {
        let key = (tenant.clone(), model.to_owned());
        if let Some(vectors) = self.fresh(&key) {
            return Ok(vectors);
        }
        let gate = Arc::clone(self.lock().reads.entry(key.clone()).or_default());
        let (cache, store) = (Arc::clone(self), Arc::clone(store));
        let read = tokio::spawn(async move {
            let result = {
                let _one_at_a_time = gate.lock().await;
                cache.read(&store, &key).await
            };
            // Forget the gate when no one else waits on it.
            let mut inner = cache.lock();
            if inner.reads.get(&key).is_some_and(|g| Arc::strong_count(g) <= 2) {
                inner.reads.remove(&key);
            }
            result
        });
        read.await.map_err(|e| StoreError::Corrupt(format!("reading vectors: {e}")))?
    }

    /// Marks the tenant's vectors from `model` for a check before their
    /// next use (this replica wrote one).
    pub fn touched(&self, tenant: &TenantId, model: &str) {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if let Some(entry) = self.lock().entries.get_mut(&(tenant.clone(), model.to_owned())) {
            entry.checked = None;
        }
    }

    /// The entry, if it was read or checked within `ttl` (and it becomes
    /// the most recently used).
    fn fresh(&self, key: &Key) -> Option<Arc<Vectors>> {
        let mut inner = self.lock();
        let entry = inner.entries.to_back(key)?;
        let fresh = entry.checked.is_some_and(|at| at.elapsed() < self.ttl);
        fresh.then(|| Arc::clone(&entry.vectors))
    }

    /// Checks the entry against the database, and reads the vectors again
    /// if they changed (or were never read).
    async fn read(&self, store: &Arc<dyn Store>, key: &Key) -> Result<Arc<Vectors>, StoreError> {
        if let Some(vectors) = self.fresh(key) {
            // Read by the caller this one waited for.
            return Ok(vectors);
        }
        let (tenant, model) = key;
        let writes = self.writes.load(Ordering::SeqCst);
        let version = store.memory_vectors_version(tenant, model).await?;
        {
            let mut inner = self.lock();
            if let Some(entry) = inner.entries.get_mut(key)
                && entry.version == version
            {
                if self.writes.load(Ordering::SeqCst) == writes {
                    entry.checked = Some(Instant::now());
                }
                return Ok(Arc::clone(&entry.vectors));
            }
        }
        // Read after the version: a vector written in between is read and
        // makes the next check read again, never the other way round.
        let vectors = Arc::new(Vectors::new(store.memory_vectors(tenant, model).await?));
        let missed = self.writes.load(Ordering::SeqCst) != writes;
        self.put(
            key.clone(),
            Entry { vectors: Arc::clone(&vectors), version, checked: None },
            !missed,
        );
        Ok(vectors)
    }

    /// Keeps an entry, within the bound: freshly checked, or to be checked
    /// before its next use.
    fn put(&self, key: Key, mut entry: Entry, fresh: bool) {
        let size = entry.vectors.bytes();
        let mut inner = self.lock();
        if let Some(old) = inner.entries.remove(&key) {
            inner.bytes -= old.vectors.bytes();
        }
        if size > self.max_bytes {
            tracing::warn!(tenant = %key.0, model = %key.1, bytes = size,
                max_bytes = self.max_bytes,
                "a tenant's vectors exceed memory.embeddings_cache_mib; they are read for every query");
            return;
        }
        entry.checked = fresh.then(Instant::now);
        inner.bytes += size;
        inner.entries.insert(key, entry);
        while inner.bytes > self.max_bytes {
            let Some((_, old)) = inner.entries.pop_front() else { break };
            inner.bytes -= old.vectors.bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foldgate_domain::MemoryId;

    fn entry(n: usize) -> Entry {
        let rows = (0..n).map(|_| (MemoryId::generate(), vec![1.0_f32; 4])).collect();
        Entry {
            vectors: Arc::new(Vectors::new(rows)),
            version: VectorsVersion { count: 0, latest: None },
            checked: None,
        }
    }

    #[test]
    fn entries_are_bounded_in_bytes_least_recently_used_first_out() {
        let one = entry(1).vectors.bytes();
        let cache = VectorCache::new(Duration::from_secs(60), one * 5);
        let key = |t: &str| (TenantId::parse(t).unwrap(), "m".to_owned());
        cache.put(key("a"), entry(2), true);
        cache.put(key("b"), entry(2), true);
        assert!(cache.fresh(&key("a")).is_some(), "a is now the most recently used");
        cache.put(key("c"), entry(2), true);
        assert!(cache.fresh(&key("b")).is_none(), "b went first");
        assert!(cache.fresh(&key("a")).is_some() && cache.fresh(&key("c")).is_some());
        assert_eq!(cache.lock().bytes, one * 4);
        cache.put(key("big"), entry(6), true);
        assert!(cache.fresh(&key("big")).is_none(), "larger than the bound: not kept");
        assert_eq!(cache.lock().bytes, one * 4, "and nothing else went for it");
        cache.touched(&key("a").0, "m");
        assert!(cache.fresh(&key("a")).is_none(), "touched: checked before its next use");
        cache.put(key("d"), entry(1), false);
        assert!(cache.fresh(&key("d")).is_none(), "kept, to be checked before its next use");
        assert!(cache.lock().entries.contains_key(&key("d")));
    }
}
