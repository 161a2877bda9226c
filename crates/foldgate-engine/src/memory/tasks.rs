//! The memory's tasks on the background driver: use counts, retention,
//! the lessons kept from returns and the embedding backfill.

use std::{collections::HashMap, sync::Arc, time::Duration};

use foldgate_background::{Activation, BackgroundTask, BoxFuture, Next};
use foldgate_domain::{MemoryId, TenantId};

use super::{MemoryBank, extract::BATCH};

/// Writes the lessons' use counts on the background driver
/// (`memory_uses`): every few seconds, and once more at shutdown.
#[derive(Debug)]
pub struct MemoryUses(pub Arc<MemoryBank>);

impl BackgroundTask for MemoryUses {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.0.flush_uses().await {
                Ok(written) => Activation::ok(serde_json::json!({"written": written})),
                Err(e) => {
                    tracing::warn!(error = %e, "memory uses were not written; kept for the next try");
                    Activation::failed(e, serde_json::json!({}))
                }
            }
        })
    }
}

/// The memory's retention on the background driver (`memory_retention`).
#[derive(Debug)]
pub struct MemoryRetention(pub Arc<MemoryBank>);

impl BackgroundTask for MemoryRetention {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.0.prune().await {
                Ok(pruned) => Activation::ok(serde_json::json!({"pruned": pruned})),
                Err(e) => {
                    tracing::warn!(error = %e, "memory retention failed; it runs again later");
                    Activation::failed(e, serde_json::json!({}))
                }
            }
        })
    }
}

/// Keeps the lessons returns queued (`extract_memory`) on the background
/// driver (`memory_extract`): every few seconds, when a return of this
/// replica queued one, and at once again while a pass finds a full batch.
#[derive(Debug)]
pub struct MemoryExtract(pub Arc<MemoryBank>);

impl BackgroundTask for MemoryExtract {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.0.extract_pending().await {
                Ok(pass) => {
                    let status = serde_json::json!({
                        "claimed": pass.claimed, "kept": pass.kept,
                        "retried": pass.retried, "failed": pass.failed,
                    });
                    let more = pass.claimed >= BATCH as usize;
                    let activation = Activation::ok(status);
                    if more { activation.next(Next::After(Duration::ZERO)) } else { activation }
                }
                Err(e) => {
                    tracing::warn!(error = %e,
                        "keeping returns as lessons failed; retried once their hold lapses");
                    Activation::failed(e, serde_json::json!({}))
                }
            }
        })
    }
}

/// Embeds the items that have no vector from the model serving their
/// tenant, a bounded batch per pass, on the background driver
/// (`memory_embed`). Any replica may run it: two that embed the same item
/// write the same vector.
#[derive(Debug)]
pub struct MemoryEmbedding {
    bank: Arc<MemoryBank>,
    /// Where the last pass got to, per model.
    cursors: HashMap<String, (TenantId, MemoryId)>,
}

impl MemoryEmbedding {
    pub fn new(bank: Arc<MemoryBank>) -> Self {
        Self { bank, cursors: HashMap::new() }
    }
}

impl BackgroundTask for MemoryEmbedding {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.bank.backfill(&mut self.cursors).await {
                Ok(embedded) => Activation::ok(serde_json::json!({"embedded": embedded})),
                Err(e) => {
                    tracing::warn!(error = %e, "embedding memory items failed; tried again later");
                    Activation::failed(e, serde_json::json!({}))
                }
            }
        })
    }
}
