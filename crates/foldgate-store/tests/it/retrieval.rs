//! Retrieval quality of the full-text ranking on a labelled set
//! (`foldgate-testkit/data/memory-eval.json`: 121 lessons in twelve topics,
//! 45 tasks with the lessons that would help them, four with none), on
//! both backends: precision at 5 and recall at 10, and what unrelated tasks
//! get. The figures are printed (`--nocapture`) and reported in
//! `docs/memory.md`; the assertions keep them from sliding back.
use foldgate_domain::{
    BranchId, Confidence, MemoryId, MemoryKind, MemorySource, Provenance, Subject, TenantId,
};
use foldgate_store::{MemoryQuery, NewMemory};
use foldgate_testkit::{Backend, TestDb, on_both_backends};
use serde::Deserialize;

on_both_backends!(full_text_ranking_on_the_labelled_set);

#[derive(Deserialize)]
struct Set {
    items: Vec<Item>,
    queries: Vec<Query>,
}

#[derive(Deserialize)]
struct Item {
    id: String,
    kind: String,
    title: String,
    description: String,
    content: String,
}

#[derive(Deserialize)]
struct Query {
    description: String,
    prompt: String,
    relevant: Vec<String>,
}

/// The labelled set.
fn set() -> Set {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../foldgate-testkit/data/memory-eval.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

async fn full_text_ranking_on_the_labelled_set(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let tenant = TenantId::parse("acme").unwrap();
    let set = set();
    let mut ids = std::collections::HashMap::new();
    for item in &set.items {
        let new = NewMemory {
            id: MemoryId::generate(),
            kind: item.kind.parse::<MemoryKind>().unwrap(),
            title: item.title.clone(),
            description: item.description.clone(),
            content: item.content.clone(),
            prior: Confidence::new(0.8).unwrap(),
            provenance: Provenance {
                tenant: tenant.clone(),
                subject: Subject::parse("eval").unwrap(),
                session: None,
                branch: Some(BranchId::generate()),
                source: MemorySource::Distilled,
            },
            flagged: Vec::new(),
            at: chrono::Utc::now(),
        };
        store.insert_memory(&new).await.unwrap();
        ids.insert(new.id, item.id.clone());
    }

    for min_matched_terms in 1..=4 {
        let (precision, recall, unrelated) =
            measure(&store, &tenant, &set, &ids, min_matched_terms).await;
        println!(
            "{backend:?}: full text, at least {min_matched_terms} terms shared: precision@5 \
             {precision:.3}, recall@10 {recall:.3}; lessons found for the unrelated tasks \
             {unrelated:?}"
        );
        if min_matched_terms == 3 {
            assert!(precision >= 0.55, "precision@5 {precision:.3}");
            assert!(recall >= 0.65, "recall@10 {recall:.3}");
        }
    }
}

/// Precision at 5 and recall at 10 over the tasks with relevant lessons,
/// and how many lessons each unrelated task got.
async fn measure(
    store: &std::sync::Arc<dyn foldgate_store::Store>,
    tenant: &TenantId,
    set: &Set,
    ids: &std::collections::HashMap<MemoryId, String>,
    min_matched_terms: u32,
) -> (f64, f64, Vec<usize>) {
    let (mut precision, mut recall, mut judged) = (0.0, 0.0, 0.0);
    let mut unrelated = Vec::new();
    for q in &set.queries {
        let query = MemoryQuery {
            text: format!("{}\n{}", q.description, q.prompt),
            kind: None,
            min_confidence: 0.7,
            include_flagged: false,
            min_matched_terms,
            limit: 10,
        };
        let found: Vec<&String> = store
            .search_memories(tenant, &query)
            .await
            .unwrap()
            .iter()
            .map(|r| &ids[&r.item.id])
            .collect();
        if q.relevant.is_empty() {
            unrelated.push(found.len());
            continue;
        }
        let hits = |n: usize| found.iter().take(n).filter(|id| q.relevant.contains(id)).count();
        // Precision at 5 counts against what could be found: a task with
        // two relevant lessons scores 1 with both in its first five.
        #[expect(clippy::cast_precision_loss, reason = "small counts")]
        {
            precision += hits(5) as f64 / q.relevant.len().min(5) as f64;
            recall += hits(10) as f64 / q.relevant.len() as f64;
        }
        judged += 1.0;
    }
    (precision / judged, recall / judged, unrelated)
}
