//! The memory ranked by embeddings as well as full text, against real
//! databases and the scripted model server's embeddings endpoint, in one
//! binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod hybrid;
mod retrieval;

use std::{sync::Arc, time::Duration};

use foldgate_domain::{MemoryId, TenantId};
use foldgate_engine::{MemoryBank, MemoryConfig, SystemClock};
use foldgate_runner::{ModelConfig, Models, Provider, RunMetrics};
use foldgate_store::Store;
use foldgate_testkit::token_counter;

/// An embeddings model entry at `base_url`.
fn embeddings_model(base_url: &str, model: &str, tenants: Option<&[&str]>) -> ModelConfig {
    ModelConfig {
        name: format!("embed-{model}"),
        provider: Provider::Openai,
        base_url: base_url.to_owned(),
        model: model.to_owned(),
        api_key: Some("sk-embeddings".into()),
        tenants: tenants.map(|list| list.iter().map(|t| (*t).to_owned()).collect()),
        max_output_tokens: 1,
        timeout: Duration::from_secs(30),
        stream: false,
        embeddings: true,
    }
}

/// A memory over `store`, ranking by embeddings with `models` (none: full
/// text alone).
fn bank(store: &Arc<dyn Store>, config: MemoryConfig, models: &[ModelConfig]) -> Arc<MemoryBank> {
    let screen = config.screen().unwrap();
    let mut bank = MemoryBank::new(
        Arc::clone(store),
        foldgate_engine::default_scrubber().unwrap(),
        screen,
        token_counter(),
        Arc::new(SystemClock),
        config,
    );
    if let Some(embedder) = Models::new(models, |_| None).unwrap().embedder(RunMetrics::noop()) {
        bank = bank.with_embedder(embedder);
    }
    Arc::new(bank)
}

/// Waits until the tenant's items have `count` vectors from `model`.
async fn vectors(store: &Arc<dyn Store>, tenant: &str, model: &str, count: usize) -> Vec<MemoryId> {
    let tenant = TenantId::parse(tenant).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = store.memory_vectors(&tenant, model).await.unwrap();
        if found.len() >= count || tokio::time::Instant::now() > deadline {
            assert_eq!(found.len(), count, "vectors of {tenant} from {model}");
            return found.into_iter().map(|(id, _)| id).collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
