//! Ranking by embeddings as well as full text, on both backends: it finds
//! what full text misses, in searches and injections; items are embedded
//! after they are recorded, or by the backfill; a vector goes with its
//! item; a slow or failing model leaves full text, within the timeout; and
//! a tenant's ranking never uses another tenant's vectors.

use std::{collections::HashMap, sync::Arc, time::Duration};

use foldgate_domain::{
    Confidence, MemoryContent, MemoryDescription, MemoryItem, MemoryKind, MemorySource,
    MemoryTitle, Principal, TenantId,
};
use foldgate_engine::{BACKFILL_BATCH, MemoryBank, MemoryConfig, RecordMemory};
use foldgate_store::{NewMemory, Store};
use foldgate_testkit::{Backend, TestDb, model_server::ModelServer, on_both_backends, principal};

use crate::{bank, embeddings_model, vectors};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    hybrid_ranking_finds_what_full_text_misses,
    a_vector_goes_with_its_item,
    the_backfill_embeds_items_that_have_no_vector,
    a_slow_or_failing_model_leaves_full_text_within_the_timeout,
    a_tenants_ranking_never_uses_another_tenants_vectors,
);

const MODEL: &str = "hashing-512";

/// A trusted lesson about a stalled vacuum. Full text finds it for
/// "postgresql vacuum wraparound", not for "postgres autovacuum": the
/// stemmer does not take "postgres" for "postgresql", and one shared term
/// of two is not a relation. Their vectors share the trigrams.
const VACUUM: (&str, &str) = (
    "Vacuum stalls on a PostgreSQL table near wraparound",
    "Autovacuum could not freeze rows while a long transaction held the xmin horizon back; \
     ending that transaction let it finish.",
);
const INVOICES: (&str, &str) = (
    "Render invoices as PDF with a headless browser",
    "Print to PDF from headless Chromium; fonts must be installed in the image first.",
);
const KEYS: (&str, &str) = (
    "Rotate the identity provider's signing keys in two steps",
    "Publish the new key in the JWKS a day before signing with it, so cached key sets know it.",
);

/// For the hashing embedder, whose unrelated texts stay below this.
fn config() -> MemoryConfig {
    MemoryConfig { embeddings_min_similarity: 0.1, ..MemoryConfig::default() }
}

fn lesson((title, content): (&str, &str)) -> RecordMemory {
    RecordMemory {
        kind: MemoryKind::Strategy,
        title: MemoryTitle::parse(title).unwrap(),
        description: MemoryDescription::parse("").unwrap(),
        content: MemoryContent::parse(content).unwrap(),
        source: MemorySource::Distilled,
        prior: Some(Confidence::new(0.8).unwrap()),
        session: None,
        branch: None,
    }
}

struct Env {
    _db: TestDb,
    store: Arc<dyn Store>,
    server: ModelServer,
    alice: Principal,
}

async fn env(backend: Backend) -> Env {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    Env { _db: db, store, server: ModelServer::start().await, alice: principal("acme", "alice") }
}

impl Env {
    fn bank(&self, config: MemoryConfig) -> Arc<MemoryBank> {
        bank(&self.store, config, &[embeddings_model(&self.server.base_url(), MODEL, None)])
    }
}

async fn titles(bank: &MemoryBank, who: &Principal, query: &str) -> Vec<String> {
    let found = bank.search(who, query, None, 10).await.unwrap();
    found.into_iter().map(|f| f.item.title).collect()
}

async fn hybrid_ranking_finds_what_full_text_misses(backend: Backend) {
    let env = env(backend).await;
    let hybrid = env.bank(config());
    for lesson_text in [VACUUM, INVOICES, KEYS] {
        hybrid.record(&env.alice, lesson(lesson_text)).await.unwrap();
    }
    vectors(&env.store, "acme", MODEL, 3).await;
    let requests = env.server.embedding_requests();
    assert_eq!(requests.len(), 3, "one call per recorded item");
    // Items are embedded in the background, so the calls may come in any order.
    let mut embedded: Vec<&str> = requests
        .iter()
        .map(|request| {
            assert_eq!(request.body["model"], MODEL);
            assert_eq!(request.api_key(), Some("sk-embeddings"));
            let input = request.body["input"][0].as_str().unwrap();
            [VACUUM.0, INVOICES.0, KEYS.0]
                .into_iter()
                .find(|title| input.starts_with(title))
                .unwrap_or_else(|| panic!("an embedding of an unknown text: {input}"))
        })
        .collect();
    embedded.sort_unstable();
    let mut recorded = [VACUUM.0, INVOICES.0, KEYS.0];
    recorded.sort_unstable();
    assert_eq!(embedded, recorded, "each recorded item embedded once");

    let full_text = bank(&env.store, config(), &[]);
    let both = "postgresql vacuum wraparound";
    assert_eq!(titles(&full_text, &env.alice, both).await, [VACUUM.0]);
    assert_eq!(titles(&hybrid, &env.alice, both).await, [VACUUM.0]);
    let morphology = "postgres autovacuum";
    assert!(titles(&full_text, &env.alice, morphology).await.is_empty());
    assert_eq!(titles(&hybrid, &env.alice, morphology).await, [VACUUM.0]);

    // Injection ranks the same way.
    let injected = hybrid.for_branch(&env.alice, morphology, 8_192, 8_192).await.unwrap();
    assert_eq!(injected.items.iter().map(|i| i.title.as_str()).collect::<Vec<_>>(), [VACUUM.0]);
    let none = full_text.for_branch(&env.alice, morphology, 8_192, 8_192).await.unwrap();
    assert!(none.is_empty());
    // Each distinct query was embedded once: the second use was cached.
    let before = env.server.embedding_requests().len();
    assert_eq!(titles(&hybrid, &env.alice, morphology).await, [VACUUM.0]);
    assert_eq!(env.server.embedding_requests().len(), before);
    // The same query asked at once makes one call.
    env.server.embeddings_delay(Some(Duration::from_millis(100)));
    let before = env.server.embedding_requests().len();
    let searches = (0..8).map(|_| titles(&hybrid, &env.alice, "autovacuum on postgres"));
    for found in futures::future::join_all(searches).await {
        assert_eq!(found, [VACUUM.0]);
    }
    assert_eq!(env.server.embedding_requests().len(), before + 1);
    env.server.embeddings_delay(None);
    // The kind filter applies to what vectors bring too.
    let pitfalls = hybrid.search(&env.alice, morphology, Some(MemoryKind::Pitfall), 10).await;
    assert!(pitfalls.unwrap().is_empty());
}

async fn a_vector_goes_with_its_item(backend: Backend) {
    let env = env(backend).await;
    let hybrid = env.bank(config());
    let item = hybrid.record(&env.alice, lesson(VACUUM)).await.unwrap();
    vectors(&env.store, "acme", MODEL, 1).await;
    assert_eq!(titles(&hybrid, &env.alice, "postgres autovacuum").await, [VACUUM.0]);
    let acme = TenantId::parse("acme").unwrap();
    assert!(env.store.delete_memory(&acme, item.id).await.unwrap());
    assert!(env.store.memory_vectors(&acme, MODEL).await.unwrap().is_empty());
    // This replica still holds the vector for a while; the item is gone all
    // the same.
    assert!(titles(&hybrid, &env.alice, "postgres autovacuum").await.is_empty());
    assert!(titles(&hybrid, &env.alice, "autovacuum postgres").await.is_empty());
}

async fn the_backfill_embeds_items_that_have_no_vector(backend: Backend) {
    let env = env(backend).await;
    // Recorded before a model was configured, and while it failed.
    let before = bank(&env.store, config(), &[]);
    before.record(&env.alice, lesson(VACUUM)).await.unwrap();
    env.server.embeddings_fail(Some(503));
    let hybrid = env.bank(config());
    hybrid.record(&env.alice, lesson(INVOICES)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while env.server.embedding_requests().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    vectors(&env.store, "acme", MODEL, 0).await;

    let mut cursors = HashMap::new();
    assert!(hybrid.backfill(&mut cursors).await.is_err(), "the model still fails");
    env.server.embeddings_fail(None);
    assert_eq!(hybrid.backfill(&mut cursors).await.unwrap(), 2);
    vectors(&env.store, "acme", MODEL, 2).await;
    assert_eq!(titles(&hybrid, &env.alice, "postgres autovacuum").await, [VACUUM.0]);
    assert_eq!(hybrid.backfill(&mut cursors).await.unwrap(), 0, "nothing left");

    // Bounded batches, continued where the last pass ended.
    let many = BACKFILL_BATCH as usize + 6;
    for i in 0..many {
        let at = chrono::Utc::now();
        let mut new = new_memory("acme", &format!("Lesson number {i} about caching"), at);
        new.content = format!("Cache entry {i} expires after a while.");
        env.store.insert_memory(&new).await.unwrap();
    }
    let calls = env.server.embedding_requests().len();
    assert_eq!(hybrid.backfill(&mut cursors).await.unwrap(), BACKFILL_BATCH as usize);
    assert_eq!(hybrid.backfill(&mut cursors).await.unwrap(), 6);
    assert_eq!(hybrid.backfill(&mut cursors).await.unwrap(), 0);
    vectors(&env.store, "acme", MODEL, many + 2).await;
    let inputs: Vec<usize> = env.server.embedding_requests()[calls..]
        .iter()
        .map(|r| r.body["input"].as_array().unwrap().len())
        .collect();
    assert!(inputs.iter().all(|n| *n <= 16), "at most 16 texts a call: {inputs:?}");
    assert_eq!(inputs.iter().sum::<usize>(), many);
}

fn new_memory(tenant: &str, title: &str, at: chrono::DateTime<chrono::Utc>) -> NewMemory {
    NewMemory {
        id: foldgate_domain::MemoryId::generate(),
        kind: MemoryKind::Strategy,
        title: title.to_owned(),
        description: String::new(),
        content: String::new(),
        prior: Confidence::new(0.8).unwrap(),
        provenance: foldgate_domain::Provenance {
            tenant: TenantId::parse(tenant).unwrap(),
            subject: foldgate_domain::Subject::parse("alice").unwrap(),
            session: None,
            branch: None,
            source: MemorySource::Distilled,
        },
        flagged: Vec::new(),
        at,
    }
}

async fn a_slow_or_failing_model_leaves_full_text_within_the_timeout(backend: Backend) {
    let env = env(backend).await;
    env.bank(config()).record(&env.alice, lesson(VACUUM)).await.unwrap();
    vectors(&env.store, "acme", MODEL, 1).await;
    let timeout = Duration::from_millis(300);
    let config = MemoryConfig { embeddings_timeout: timeout, ..config() };

    env.server.embeddings_delay(Some(Duration::from_secs(5)));
    let slow = env.bank(config.clone());
    let started = std::time::Instant::now();
    assert!(titles(&slow, &env.alice, "postgres autovacuum").await.is_empty());
    assert_eq!(titles(&slow, &env.alice, "postgresql vacuum wraparound").await, [VACUUM.0]);
    let injected = slow.for_branch(&env.alice, "postgresql vacuum wraparound", 8_192, 8_192);
    assert_eq!(injected.await.unwrap().items.len(), 1, "injection goes on by full text");
    let elapsed = started.elapsed();
    assert!(elapsed >= timeout * 3, "each waited for the model: {elapsed:?}");
    assert!(elapsed < timeout * 3 + Duration::from_secs(2), "and no longer: {elapsed:?}");

    env.server.embeddings_delay(None);
    env.server.embeddings_fail(Some(500));
    let failing = env.bank(config.clone());
    let started = std::time::Instant::now();
    assert!(titles(&failing, &env.alice, "postgres autovacuum").await.is_empty());
    assert_eq!(titles(&failing, &env.alice, "postgresql vacuum wraparound").await, [VACUUM.0]);
    assert!(started.elapsed() < Duration::from_secs(2), "a refusal is not waited out");

    // Once the model answers again, so does the hybrid rank.
    env.server.embeddings_fail(None);
    assert_eq!(titles(&failing, &env.alice, "postgres autovacuum").await, [VACUUM.0]);
}

async fn a_tenants_ranking_never_uses_another_tenants_vectors(backend: Backend) {
    let env = env(backend).await;
    let hybrid = env.bank(config());
    let mallory = principal("globex", "mallory");
    hybrid.record(&env.alice, lesson(VACUUM)).await.unwrap();
    hybrid.record(&mallory, lesson(KEYS)).await.unwrap();
    vectors(&env.store, "acme", MODEL, 1).await;
    vectors(&env.store, "globex", MODEL, 1).await;
    let found: Vec<MemoryItem> = hybrid
        .search(&mallory, "postgres autovacuum", None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.item)
        .collect();
    assert!(found.iter().all(|i| i.provenance.tenant.as_str() == "globex"), "{found:?}");
    assert!(found.is_empty(), "the key lesson is unrelated: {found:?}");
    let injected = hybrid.for_branch(&mallory, "postgres autovacuum", 8_192, 8_192).await;
    assert!(injected.unwrap().is_empty());
    assert_eq!(titles(&hybrid, &env.alice, "postgres autovacuum").await, [VACUUM.0]);

    // A model that serves acme alone: globex is ranked by full text, and
    // its lessons are never sent to the model.
    let env = self::env(backend).await;
    let acme_only = bank(
        &env.store,
        config(),
        &[embeddings_model(&env.server.base_url(), MODEL, Some(&["acme"]))],
    );
    acme_only.record(&env.alice, lesson(VACUUM)).await.unwrap();
    acme_only.record(&mallory, lesson(KEYS)).await.unwrap();
    acme_only.record(&mallory, lesson(VACUUM)).await.unwrap();
    vectors(&env.store, "acme", MODEL, 1).await;
    assert_eq!(acme_only.backfill(&mut HashMap::new()).await.unwrap(), 0);
    assert!(titles(&acme_only, &mallory, "postgres autovacuum").await.is_empty());
    assert_eq!(titles(&acme_only, &env.alice, "postgres autovacuum").await, [VACUUM.0]);
    vectors(&env.store, "globex", MODEL, 0).await;
    let sent: Vec<String> =
        env.server.embedding_requests().iter().map(|r| r.body["input"].to_string()).collect();
    assert!(sent.iter().all(|input| !input.contains("JWKS")), "{sent:?}");
}
