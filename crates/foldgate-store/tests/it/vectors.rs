//! The memory's vectors on both backends: kept per tenant, item and model
//! exactly as written, gone with their items whichever way those go, found
//! missing for the backfill within a model's tenants, and the filters of
//! full-text search applied to the items ranking by vector brings.
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use foldgate_domain::{
    BranchId, Confidence, MemoryId, MemoryKind, MemorySource, Provenance, Subject, TenantId,
};
use foldgate_store::{MemoryQuery, NewMemory, Store, TenantScope};
use foldgate_testkit::{Backend, TestDb, on_both_backends};

on_both_backends!(
    vectors_are_kept_per_tenant_item_and_model,
    vectors_go_with_their_items,
    items_without_a_vector_are_listed_per_model_and_scope,
    items_among_ids_pass_the_search_filters,
);

fn tenant(name: &str) -> TenantId {
    TenantId::parse(name).unwrap()
}

fn at(minutes: i64) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-01T00:00:00Z").unwrap().with_timezone(&Utc)
        + Duration::minutes(minutes)
}

async fn store(backend: Backend) -> (TestDb, Arc<dyn Store>) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    (db, store)
}

/// Stores an item of `tenant_name`, created at minute `minute`.
async fn stored(store: &Arc<dyn Store>, tenant_name: &str, title: &str, minute: i64) -> MemoryId {
    let new = NewMemory {
        id: MemoryId::generate(),
        kind: MemoryKind::Strategy,
        title: title.to_owned(),
        description: String::new(),
        content: "content".to_owned(),
        prior: Confidence::new(0.8).unwrap(),
        provenance: Provenance {
            tenant: tenant(tenant_name),
            subject: Subject::parse("alice").unwrap(),
            session: None,
            branch: Some(BranchId::generate()),
            source: MemorySource::Distilled,
        },
        flagged: Vec::new(),
        at: at(minute),
    };
    store.insert_memory(&new).await.unwrap();
    new.id
}

async fn count(store: &Arc<dyn Store>, t: &str, model: &str) -> usize {
    store.memory_vectors(&tenant(t), model).await.unwrap().len()
}

async fn vectors_are_kept_per_tenant_item_and_model(backend: Backend) {
    let (_db, store) = store(backend).await;
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    let id = stored(&store, "acme", "one", 0).await;
    let v = vec![0.25_f32, -1.5, 3.0e-7, f32::MAX];
    let empty = store.memory_vectors_version(&acme, "small").await.unwrap();
    assert_eq!((empty.count, empty.latest.as_deref()), (0, None));

    assert!(store.put_memory_vector(&acme, id, "small", &v, at(1)).await.unwrap());
    assert_eq!(store.memory_vectors(&acme, "small").await.unwrap(), vec![(id, v.clone())]);
    assert!(store.memory_vectors(&acme, "large").await.unwrap().is_empty(), "per model");
    // Another tenant can neither read it nor write to the item.
    assert!(store.memory_vectors(&globex, "small").await.unwrap().is_empty());
    assert!(!store.put_memory_vector(&globex, id, "small", &v, at(1)).await.unwrap());
    assert!(store.memory_vectors(&globex, "small").await.unwrap().is_empty());
    // No item, no vector.
    assert!(
        !store.put_memory_vector(&acme, MemoryId::generate(), "small", &v, at(1)).await.unwrap()
    );
    assert!(store.put_memory_vector(&acme, id, "small", &[], at(1)).await.is_err());
    assert!(store.put_memory_vector(&acme, id, "small", &[f32::NAN], at(1)).await.is_err());

    // The version moves when a vector is written or rewritten.
    let first = store.memory_vectors_version(&acme, "small").await.unwrap();
    assert_eq!(first.count, 1);
    assert!(first.latest.is_some());
    assert_eq!(store.memory_vectors_version(&acme, "small").await.unwrap(), first, "stable");
    assert!(store.put_memory_vector(&acme, id, "small", &[1.0, 2.0], at(2)).await.unwrap());
    let rewritten = store.memory_vectors_version(&acme, "small").await.unwrap();
    assert_ne!(rewritten, first);
    assert_eq!(rewritten.count, 1, "replaced, not added");
    assert_eq!(store.memory_vectors(&acme, "small").await.unwrap(), vec![(id, vec![1.0, 2.0])]);
    assert!(store.put_memory_vector(&acme, id, "large", &[1.0; 3], at(2)).await.unwrap());
    assert_eq!(store.memory_vectors_version(&acme, "small").await.unwrap(), rewritten);
}

async fn vectors_go_with_their_items(backend: Backend) {
    let (_db, store) = store(backend).await;
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    let mut ids = Vec::new();
    for i in 0..6 {
        let id = stored(&store, "acme", &format!("acme {i}"), i).await;
        for model in ["small", "large"] {
            assert!(store.put_memory_vector(&acme, id, model, &[1.0, 0.0], at(i)).await.unwrap());
        }
        ids.push(id);
    }
    for i in 0..3 {
        let id = stored(&store, "globex", &format!("globex {i}"), i).await;
        assert!(store.put_memory_vector(&globex, id, "small", &[0.0, 1.0], at(i)).await.unwrap());
    }
    assert_eq!(count(&store, "acme", "small").await, 6);

    // `foldgate memory delete --id`
    assert!(store.delete_memory(&acme, ids[5]).await.unwrap());
    assert_eq!(count(&store, "acme", "small").await, 5);
    assert_eq!(count(&store, "acme", "large").await, 5);
    // Retention: older than minute 1 (one of each), then the newest 3 each.
    assert_eq!(store.prune_memories(at(1), 3).await.unwrap(), 3);
    let left: Vec<MemoryId> =
        store.memory_vectors(&acme, "small").await.unwrap().into_iter().map(|(id, _)| id).collect();
    assert_eq!(left.len(), 3);
    assert!(left.iter().all(|id| ids[2..5].contains(id)), "the newest three's");
    assert_eq!(count(&store, "acme", "large").await, 3);
    assert_eq!(count(&store, "globex", "small").await, 2);
    // `foldgate memory delete --all`
    assert_eq!(store.delete_memories(&acme).await.unwrap(), 3);
    assert_eq!(count(&store, "acme", "small").await, 0);
    assert_eq!(count(&store, "acme", "large").await, 0);
    assert_eq!(count(&store, "globex", "small").await, 2, "another tenant's stay");
}

async fn items_without_a_vector_are_listed_per_model_and_scope(backend: Backend) {
    let (_db, store) = store(backend).await;
    let acme = tenant("acme");
    let mut acme_ids = Vec::new();
    for i in 0..5 {
        acme_ids.push(stored(&store, "acme", &format!("acme {i}"), i).await);
    }
    let globex_id = stored(&store, "globex", "globex", 0).await;
    let initech_id = stored(&store, "initech", "initech", 0).await;
    assert!(store.put_memory_vector(&acme, acme_ids[1], "small", &[1.0], at(0)).await.unwrap());

    let missing = |scope: TenantScope, after: Option<(TenantId, MemoryId)>, limit: u32| {
        let store = Arc::clone(&store);
        async move {
            store
                .memories_without_vector("small", &scope, after.as_ref(), limit)
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.id)
                .collect::<Vec<_>>()
        }
    };
    let mut acme_missing = acme_ids.clone();
    acme_missing.remove(1);
    let mut all = acme_missing.clone();
    all.extend([globex_id, initech_id]);
    assert_eq!(missing(TenantScope::every(), None, 100).await, all, "(tenant, id) order");
    let only = TenantScope { only: Some(vec![acme.clone()]), except: Vec::new() };
    assert_eq!(missing(only, None, 100).await, acme_missing);
    let except = TenantScope { only: None, except: vec![acme.clone(), tenant("globex")] };
    assert_eq!(missing(except, None, 100).await, vec![initech_id]);
    // Paged from where the last page ended.
    let first = missing(TenantScope::every(), None, 3).await;
    assert_eq!(first, all[..3]);
    let next = missing(TenantScope::every(), Some((acme.clone(), first[2])), 3).await;
    assert_eq!(next, all[3..]);
    // Another model's vector does not count.
    assert!(
        store
            .put_memory_vector(&tenant("initech"), initech_id, "large", &[1.0], at(0))
            .await
            .unwrap()
    );
    assert!(missing(TenantScope::every(), None, 100).await.contains(&initech_id));
}

async fn items_among_ids_pass_the_search_filters(backend: Backend) {
    let (_db, store) = store(backend).await;
    let acme = tenant("acme");
    let strategy = stored(&store, "acme", "a strategy", 0).await;
    let mut pitfall = NewMemory {
        id: MemoryId::generate(),
        kind: MemoryKind::Pitfall,
        ..store_item_like(&store, &acme, strategy).await
    };
    store.insert_memory(&pitfall).await.unwrap();
    pitfall.id = MemoryId::generate();
    pitfall.prior = Confidence::new(0.5).unwrap();
    store.insert_memory(&pitfall).await.unwrap();
    let low = pitfall.id;
    pitfall.id = MemoryId::generate();
    pitfall.prior = Confidence::new(0.9).unwrap();
    pitfall.flagged = vec!["override-instructions".into()];
    store.insert_memory(&pitfall).await.unwrap();
    let flagged = pitfall.id;
    let other = stored(&store, "globex", "another tenant's", 0).await;

    let filter =
        |kind: Option<MemoryKind>, min_confidence: f64, include_flagged: bool| MemoryQuery {
            text: String::new(),
            kind,
            min_confidence,
            include_flagged,
            min_matched_terms: 1,
            limit: 1,
        };
    let among = |ids: Vec<MemoryId>, f: MemoryQuery| {
        let (store, acme) = (Arc::clone(&store), acme.clone());
        async move {
            let mut found: Vec<MemoryId> = store
                .memories_among(&acme, &ids, &f)
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.id)
                .collect();
            found.sort();
            found
        }
    };
    let every = vec![strategy, low, flagged, other, MemoryId::generate()];
    let mut expected = vec![strategy, low];
    expected.sort();
    assert_eq!(among(every.clone(), filter(None, 0.0, false)).await, expected);
    assert_eq!(among(every.clone(), filter(None, 0.7, false)).await, vec![strategy]);
    assert_eq!(
        among(every.clone(), filter(Some(MemoryKind::Pitfall), 0.0, false)).await,
        vec![low]
    );
    let mut with_flagged = vec![low, flagged];
    with_flagged.sort();
    assert_eq!(
        among(every.clone(), filter(Some(MemoryKind::Pitfall), 0.0, true)).await,
        with_flagged
    );
    assert!(among(Vec::new(), filter(None, 0.0, true)).await.is_empty());
}

/// A new item of `tenant` like the stored one `id` (text and provenance).
async fn store_item_like(store: &Arc<dyn Store>, tenant: &TenantId, id: MemoryId) -> NewMemory {
    let item = store.memory(tenant, id).await.unwrap().unwrap();
    NewMemory {
        id: MemoryId::generate(),
        kind: item.kind,
        title: item.title,
        description: item.description,
        content: item.content,
        prior: item.prior,
        provenance: item.provenance,
        flagged: Vec::new(),
        at: item.created_at,
    }
}
