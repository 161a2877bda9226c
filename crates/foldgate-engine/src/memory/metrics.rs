//! The reasoning memory's metric instruments.

use foldgate_domain::{BranchKind, MemoryItem, TenantId, Tokens};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Meter, MeterProvider, noop::NoopMeterProvider},
};

/// Instruments the memory records into.
#[derive(Debug, Clone)]
pub struct MemoryMetrics {
    /// `foldgate.memory.items{tenant, kind, source, flagged}`: lessons
    /// stored (`flagged="true"` when the injection screen flagged them).
    items: Counter<u64>,
    /// `foldgate.memory.flagged{tenant, rule}`: lessons the injection screen
    /// flagged, by each rule they set off.
    flagged: Counter<u64>,
    /// `foldgate.memory.injections{tenant, kind}`: branches that started
    /// with lessons, by kind of branch (`agent`, `gateway`).
    injections: Counter<u64>,
    /// `foldgate.memory.injected{tenant}`: lessons injected.
    injected: Counter<u64>,
    /// `foldgate.memory.tokens.injected{tenant}`: tokens of injected lessons.
    tokens_injected: Counter<u64>,
    /// `foldgate.memory.feedback{tenant, helpful}`.
    feedback: Counter<u64>,
    /// `foldgate.memory.distillations{tenant, outcome}`: distillations of
    /// gateway-run branches (`done`, `retry`, `failed`).
    distillations: Counter<u64>,
    /// `foldgate.memory.extractions{tenant, outcome}`: returns kept as
    /// lessons (`extract_memory`): `done`, `retry`, `failed` (given up).
    extractions: Counter<u64>,
    /// `foldgate.memory.embedding.fallbacks{tenant, reason}`: searches and
    /// injections ranked by full text alone although an embeddings model
    /// serves the tenant (`timeout`, `model`, `store`, `error`).
    fallbacks: Counter<u64>,
    /// `foldgate.memory.embedding.queries{cache}`: query vectors, from this
    /// replica's cache (`hit`) or the model (`miss`).
    queries: Counter<u64>,
    /// `foldgate.memory.embedding.items{via, outcome}`: items embedded
    /// right after they were stored (`record`) or by the backfill
    /// (`backfill`): `embedded`, `failed`, or `deferred` to the backfill.
    embedded: Counter<u64>,
}

fn tenant(t: &TenantId) -> KeyValue {
    KeyValue::new("tenant", t.as_str().to_owned())
}

impl MemoryMetrics {
    pub fn new(meter: &Meter) -> Self {
        let lessons = "{lesson}";
        Self {
            items: meter
                .u64_counter("foldgate.memory.items")
                .with_description(
                    "Lessons stored in the memory, by kind, source and whether flagged",
                )
                .with_unit(lessons)
                .build(),
            flagged: meter
                .u64_counter("foldgate.memory.flagged")
                .with_description("Lessons the injection screen flagged, by rule")
                .with_unit(lessons)
                .build(),
            injections: meter
                .u64_counter("foldgate.memory.injections")
                .with_description("Branches that started with lessons from the memory")
                .with_unit("{branch}")
                .build(),
            injected: meter
                .u64_counter("foldgate.memory.injected")
                .with_description("Lessons injected into branches")
                .with_unit(lessons)
                .build(),
            tokens_injected: meter
                .u64_counter("foldgate.memory.tokens.injected")
                .with_description("Tokens of the lessons injected into branches")
                .with_unit("{token}")
                .build(),
            feedback: meter
                .u64_counter("foldgate.memory.feedback")
                .with_description("Feedback on lessons, by whether they helped")
                .with_unit("{feedback}")
                .build(),
            distillations: meter
                .u64_counter("foldgate.memory.distillations")
                .with_description("Distillations of ended gateway-run branches, by outcome")
                .with_unit("{branch}")
                .build(),
            extractions: meter
                .u64_counter("foldgate.memory.extractions")
                .with_description("Returns kept as lessons (extract_memory), by outcome")
                .with_unit("{branch}")
                .build(),
            fallbacks: meter
                .u64_counter("foldgate.memory.embedding.fallbacks")
                .with_description(
                    "Memory queries ranked by full text alone because ranking by embeddings failed",
                )
                .with_unit("{query}")
                .build(),
            queries: meter
                .u64_counter("foldgate.memory.embedding.queries")
                .with_description("Query vectors for memory ranking, by whether they were cached")
                .with_unit("{query}")
                .build(),
            embedded: meter
                .u64_counter("foldgate.memory.embedding.items")
                .with_description("Lessons embedded, by when and how it went")
                .with_unit(lessons)
                .build(),
        }
    }

    /// Instruments that record nowhere.
    pub fn noop() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }

    pub(super) fn stored(&self, item: &MemoryItem) {
        let who = tenant(&item.provenance.tenant);
        self.items.add(
            1,
            &[
                who.clone(),
                KeyValue::new("kind", item.kind.as_str()),
                KeyValue::new("source", item.provenance.source.as_str()),
                KeyValue::new("flagged", !item.flagged.is_empty()),
            ],
        );
        for rule in &item.flagged {
            self.flagged.add(1, &[who.clone(), KeyValue::new("rule", rule.clone())]);
        }
    }

    pub(super) fn injected(&self, who: &TenantId, kind: BranchKind, items: usize, tokens: Tokens) {
        let who = tenant(who);
        self.injections.add(1, &[who.clone(), KeyValue::new("kind", kind.as_str())]);
        self.injected.add(u64::try_from(items).unwrap_or(u64::MAX), std::slice::from_ref(&who));
        self.tokens_injected.add(tokens, &[who]);
    }

    pub(super) fn feedback(&self, who: &TenantId, helpful: bool) {
        self.feedback.add(1, &[tenant(who), KeyValue::new("helpful", helpful)]);
    }

    /// A distillation that ended: `done`, `retry` (tried again later) or
    /// `failed` (given up).
    pub fn distillation(&self, who: &TenantId, outcome: &'static str) {
        self.distillations.add(1, &[tenant(who), KeyValue::new("outcome", outcome)]);
    }

    /// An attempt at keeping a return as a lesson: `done`, `retry` (tried
    /// again once its hold lapses) or `failed` (given up).
    pub(super) fn extraction(&self, who: &TenantId, outcome: &'static str) {
        self.extractions.add(1, &[tenant(who), KeyValue::new("outcome", outcome)]);
    }

    pub(super) fn embedding_fallback(&self, who: &TenantId, reason: &'static str) {
        self.fallbacks.add(1, &[tenant(who), KeyValue::new("reason", reason)]);
    }

    pub(super) fn query_vector(&self, cached: bool) {
        self.queries.add(1, &[KeyValue::new("cache", if cached { "hit" } else { "miss" })]);
    }

    pub(super) fn embedded(&self, via: &'static str, outcome: &'static str, items: usize) {
        let attributes = [KeyValue::new("via", via), KeyValue::new("outcome", outcome)];
        self.embedded.add(u64::try_from(items).unwrap_or(u64::MAX), &attributes);
    }
}
