//! Embeddings models (`[[models]]` with `embeddings = true`): OpenAI's
//! `POST {base_url}/embeddings`, for ranking the reasoning memory.
//!
//! The model that serves a tenant's memory is the first embeddings entry
//! that serves the tenant. Its vectors are stored under its provider model
//! id (`model`), so that changing the model makes the backfill embed every
//! lesson again rather than compare vectors of two models.

use std::sync::Arc;

use async_trait::async_trait;
use foldgate_domain::{TenantId, duration};
use foldgate_engine::{EmbedError, Embedder};
use foldgate_store::TenantScope;
use genai::embed::EmbedRequest;

use super::{Fault, FaultKind, Model, ModelFailure, Models, malformed};
use crate::RunMetrics;

impl Model {
    /// One call of an embeddings model: one vector per text, in order.
    /// Not retried (a query falls back to full text; an item is tried
    /// again by the backfill); at most `timeout`.
    pub async fn embed(
        &self,
        texts: &[String],
        metrics: &RunMetrics,
    ) -> Result<Vec<Vec<f32>>, ModelFailure> {
        let started = std::time::Instant::now();
        let request = EmbedRequest::new_batch(texts.to_vec());
        let call = self.client.exec_embed(self.target(), request, None);
        let result = match tokio::time::timeout(self.config.timeout, call).await {
            Err(_elapsed) => Err(Fault {
                kind: FaultKind::Timeout,
                detail: format!("no answer within {}", duration::show(self.config.timeout)),
                retry_after: None,
            }),
            Ok(Err(e)) => Err(self.fault(&e)),
            Ok(Ok(response)) => vectors(response.embeddings, texts.len()),
        };
        metrics.embeddings(&self.config, started.elapsed(), result.as_ref().err().map(|f| f.kind));
        result.map_err(|fault| {
            tracing::warn!(model = %self.config.name, kind = %fault.kind, detail = %fault.detail,
                texts = texts.len(), "embeddings call failed");
            ModelFailure { kind: fault.kind, detail: fault.detail, attempts: 1 }
        })
    }
}

/// The vectors of an answer, in the order of the texts: one per text, all
/// of one dimension, finite.
fn vectors(mut data: Vec<genai::embed::Embedding>, texts: usize) -> Result<Vec<Vec<f32>>, Fault> {
    data.sort_by_key(|e| e.index);
    if data.len() != texts || data.iter().enumerate().any(|(i, e)| e.index != i) {
        return Err(malformed(&format!(
            "{} embeddings (indexes {:?}) for {texts} texts",
            data.len(),
            data.iter().map(|e| e.index).take(8).collect::<Vec<_>>()
        )));
    }
    let dims = data.first().map_or(0, |e| e.vector.len());
    if data.iter().any(|e| {
        e.vector.is_empty() || e.vector.len() != dims || e.vector.iter().any(|x| !x.is_finite())
    }) {
        return Err(malformed("embeddings of different or no dimensions, or not finite"));
    }
    Ok(data.into_iter().map(|e| e.vector).collect())
}

/// The embeddings models, as the memory uses them.
#[derive(Debug)]
pub struct ModelEmbedder {
    /// In configuration order, with the tenants each serves.
    models: Vec<(Arc<Model>, TenantScope)>,
    metrics: RunMetrics,
}

impl Models {
    /// The embeddings models, for the memory; `None` when there is none.
    pub fn embedder(&self, metrics: RunMetrics) -> Option<Arc<dyn Embedder>> {
        let mut models = Vec::new();
        // The tenants earlier entries serve by name; `None` once one
        // serves every tenant (later entries then serve no one).
        let mut taken: Option<Vec<TenantId>> = Some(Vec::new());
        for model in self.configured.iter().filter(|m| m.config.embeddings) {
            let Some(earlier) = &taken else { break };
            let only = model
                .config
                .tenants
                .as_ref()
                .map(|list| list.iter().filter_map(|t| TenantId::parse(t).ok()).collect());
            let scope = TenantScope { only, except: earlier.clone() };
            taken =
                scope.only.as_ref().map(|listed| earlier.iter().chain(listed).cloned().collect());
            models.push((Arc::clone(model), scope));
        }
        if models.is_empty() {
            return None;
        }
        Some(Arc::new(ModelEmbedder { models, metrics }))
    }
}

impl ModelEmbedder {
    fn model(&self, tenant: &TenantId) -> Option<&Arc<Model>> {
        self.models.iter().find(|(m, _)| m.config.serves_tenant(tenant.as_str())).map(|(m, _)| m)
    }
}

#[async_trait]
impl Embedder for ModelEmbedder {
    fn model_for(&self, tenant: &TenantId) -> Option<&str> {
        self.model(tenant).map(|m| m.config.model.as_str())
    }

    fn scopes(&self) -> Vec<(String, TenantScope)> {
        self.models.iter().map(|(m, scope)| (m.config.model.clone(), scope.clone())).collect()
    }

    async fn embed(
        &self,
        tenant: &TenantId,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let model = self
            .model(tenant)
            .ok_or_else(|| EmbedError::new("refused", "no embeddings model serves the tenant"))?;
        model
            .embed(texts, &self.metrics)
            .await
            .map_err(|failure| EmbedError::new(failure.kind.as_str(), failure.detail))
    }
}
