//! The reasoning memory's use cases: record an item (scrubbed, screened),
//! search, feedback, and the lessons a new branch starts with.
//!
//! Every item is scrubbed of secrets before it is stored (failing closed)
//! and screened for prompt injection; a flagged item is kept, logged and,
//! unless the operator allows it, never injected nor found by a search.
//! Items an agent records start below the injection threshold
//! (`recorded_confidence`): they are found by `memory_search`, marked as not
//! yet trusted, and injected only once feedback has lifted them.

use std::{
    collections::HashMap,
    fmt::Debug,
    sync::{Arc, Mutex, PoisonError},
};

use foldgate_background::Activator;
use foldgate_domain::{
    BranchKind, Confidence, InvalidInput, MemoryId, MemoryItem, MemoryKind, MemorySource,
    Principal, Provenance, TenantId, Tokens,
};
use foldgate_scrub::InjectionRules;
use foldgate_store::{NewMemory, Store};

use crate::{Clock, FoldError, Scrubber, TokenCounter};

mod config;
mod embed;
mod extract;
mod hybrid;
mod metrics;
mod record;
mod tasks;
mod vector_cache;
pub use self::{
    config::{MemoryConfig, ScreenSetupError},
    embed::{EmbedError, Embedder, RRF_K, reciprocal_rank_fusion},
    extract::ExtractPass,
    hybrid::{BACKFILL_BATCH, EmbeddingFailed},
    metrics::MemoryMetrics,
    record::RecordMemory,
    tasks::{MemoryEmbedding, MemoryExtract, MemoryRetention, MemoryUses},
};

/// Checks text for prompt injection.
pub trait Screen: Send + Sync + Debug {
    /// The ids of the rules `text` sets off; empty when none.
    fn screen(&self, text: &str) -> Vec<String>;
}

impl Screen for InjectionRules {
    fn screen(&self, text: &str) -> Vec<String> {
        InjectionRules::screen(self, text).rule_ids().map(str::to_owned).collect()
    }
}

/// An item found for a query, and whether it may be injected.
#[derive(Debug, Clone)]
pub struct Found {
    pub item: MemoryItem,
    /// At or above the injection threshold (and not flagged).
    pub trusted: bool,
}

/// The lessons a branch starts with: the items, the text the branch is
/// given, and its tokens (charged to the branch).
#[derive(Debug, Clone, Default)]
pub struct Injection {
    pub items: Vec<MemoryItem>,
    pub text: String,
    pub tokens: Tokens,
}

impl Injection {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The reasoning memory. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct MemoryBank {
    store: Arc<dyn Store>,
    scrubber: Arc<dyn Scrubber>,
    screen: Arc<dyn Screen>,
    tokens: TokenCounter,
    clock: Arc<dyn Clock>,
    config: MemoryConfig,
    metrics: MemoryMetrics,
    /// Injections counted since the last flush, per tenant and item.
    uses: Mutex<HashMap<TenantId, HashMap<MemoryId, u64>>>,
    /// Wakes the extractor (`memory_extract`) when a return queued a lesson.
    extract_wake: Activator,
    /// Ranking by embeddings, when a model is configured.
    embedding: Option<Arc<hybrid::Embedding>>,
}

/// How injected lessons open, so the model knows what they are and where
/// they came from.
const INJECTION_HEADER: &str = "Lessons earlier branches of your team learned (from the \
gateway's memory; each says where it came from and how far it is trusted; check before \
relying on one):";

impl MemoryBank {
    pub fn new(
        store: Arc<dyn Store>,
        scrubber: Arc<dyn Scrubber>,
        screen: Arc<dyn Screen>,
        tokens: TokenCounter,
        clock: Arc<dyn Clock>,
        config: MemoryConfig,
    ) -> Self {
        Self {
            store,
            scrubber,
            screen,
            tokens,
            clock,
            config,
            metrics: MemoryMetrics::noop(),
            uses: Mutex::new(HashMap::new()),
            extract_wake: Activator::new(),
            embedding: None,
        }
    }

    /// Records into these instruments instead of nowhere.
    pub fn with_metrics(mut self, metrics: MemoryMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &MemoryMetrics {
        &self.metrics
    }

    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// Scrubs, screens and stores an item.
    pub async fn record(
        &self,
        who: &Principal,
        item: RecordMemory,
    ) -> Result<MemoryItem, FoldError> {
        let new = self.prepare(who, item)?;
        let stored = self.store.insert_memory(&new).await?;
        self.kept(&stored);
        Ok(stored)
    }

    /// An item as it is written: scrubbed of secrets (failing closed,
    /// `ScrubbingFailed`), screened for prompt injection, with its prior and
    /// provenance. For a writer that stores it with other changes, in one
    /// transaction, then reports it with [`MemoryBank::kept`].
    pub fn prepare(&self, who: &Principal, item: RecordMemory) -> Result<NewMemory, FoldError> {
        let scrub = |text: &str| {
            self.scrubber.scrub(text).map(|s| s.text).map_err(|e| {
                tracing::error!(tenant = %who.tenant, error = %e,
                    "a memory item could not be scrubbed; it was not stored");
                FoldError::ScrubbingFailed
            })
        };
        let title = scrub(item.title.as_str())?;
        let description = scrub(item.description.as_str())?;
        let content = scrub(item.content.as_str())?;
        let flagged = self.screen.screen(&format!("{title}\n{description}\n{content}"));
        let prior = item.prior.unwrap_or_else(|| match item.source {
            MemorySource::Recorded => Confidence::clamped(self.config.recorded_confidence),
            MemorySource::Distilled => Confidence::clamped(self.config.memory_min_confidence),
        });
        Ok(NewMemory {
            id: MemoryId::generate(),
            kind: item.kind,
            title,
            description,
            content,
            prior,
            provenance: Provenance {
                tenant: who.tenant.clone(),
                subject: who.subject.clone(),
                session: item.session,
                branch: item.branch,
                source: item.source,
            },
            flagged,
            at: self.clock.now(),
        })
    }

    /// Counts and logs an item that was stored.
    pub fn kept(&self, stored: &MemoryItem) {
        self.metrics.stored(stored);
        self.embed_later(stored);
        let tenant = &stored.provenance.tenant;
        if stored.flagged.is_empty() {
            tracing::debug!(%tenant, memory_id = %stored.id, kind = %stored.kind,
                source = stored.provenance.source.as_str(), "memory item stored");
        } else {
            tracing::warn!(%tenant, memory_id = %stored.id,
                rules = %stored.flagged.join(" "), source = stored.provenance.source.as_str(),
                "memory item flagged by the injection screen; it will not be injected");
        }
    }

    /// The tenant's items that match `text`, best first, trusted or not
    /// (flagged ones only if the operator allows them).
    pub async fn search(
        &self,
        who: &Principal,
        text: &str,
        kind: Option<MemoryKind>,
        limit: u32,
    ) -> Result<Vec<Found>, FoldError> {
        let ranked = self.ranked(who, text, kind, 0.0, limit).await?;
        Ok(ranked.into_iter().map(|item| Found { trusted: self.trusted(&item), item }).collect())
    }

    /// Counts a use of an item as helpful or not. `MemoryNotFound` for
    /// another tenant's item.
    pub async fn feedback(
        &self,
        who: &Principal,
        id: MemoryId,
        helpful: bool,
    ) -> Result<MemoryItem, FoldError> {
        // A flagged lesson is shown to no one, through no tool; a lesson's
        // author cannot vouch for it.
        let found = self.store.memory(&who.tenant, id).await?;
        let found = found.filter(|i| i.flagged.is_empty() || self.config.inject_flagged);
        let found = found.ok_or(FoldError::MemoryNotFound)?;
        if found.provenance.source == MemorySource::Recorded
            && found.provenance.subject == who.subject
        {
            return Err(FoldError::Invalid(InvalidInput::new(
                "id",
                "a lesson's own author cannot give feedback on it",
            )));
        }
        let now = self.clock.now();
        let item = self
            .store
            .memory_feedback(&who.tenant, id, &who.subject, helpful, now)
            .await?
            .ok_or(FoldError::MemoryNotFound)?;
        self.metrics.feedback(&who.tenant, helpful);
        tracing::debug!(tenant = %who.tenant, memory_id = %id, helpful,
            confidence = item.confidence.get(), "memory feedback");
        Ok(item)
    }

    /// The lessons for a branch about `task` with `budget` tokens: the
    /// trusted items that match, best first, as many as fit in
    /// `injection_budget_ratio` of the budget (and `memory_max_items`), and
    /// in `at_most` tokens.
    pub async fn for_branch(
        &self,
        who: &Principal,
        task: &str,
        budget: Tokens,
        at_most: Tokens,
    ) -> Result<Injection, FoldError> {
        let (floor, most) = (self.config.memory_min_confidence, self.config.memory_max_items);
        let ranked = self.ranked(who, task, None, floor, most).await?;
        #[expect(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "budgets are far below 2^52; the ratio is 0..=1"
        )]
        let room =
            ((budget as f64 * self.config.injection_budget_ratio).floor() as Tokens).min(at_most);
        // Chosen by the tokens of each part, counted once; the text as a
        // whole is counted at the end (pieces joined count no more than
        // apart, but rarely a token less).
        let mut parts: Vec<(MemoryItem, String)> = Vec::new();
        let mut estimate = self.tokens.count(INJECTION_HEADER);
        for item in ranked {
            let line = format!("\n{}", render(&item));
            let tokens = self.tokens.count(&line);
            if estimate + tokens > room {
                // A shorter item further down may still fit.
                continue;
            }
            estimate += tokens;
            parts.push((item, line));
        }
        loop {
            let text: String = std::iter::once(INJECTION_HEADER)
                .chain(parts.iter().map(|(_, line)| line.as_str()))
                .collect();
            let tokens = self.tokens.count(&text);
            if parts.is_empty() {
                return Ok(Injection::default());
            }
            if tokens <= room {
                let items = parts.into_iter().map(|(item, _)| item).collect();
                return Ok(Injection { items, text, tokens });
            }
            parts.pop();
        }
    }

    /// Counts the injection of these lessons into a branch of `kind`
    /// (their uses are written off the create's path: a failure is logged,
    /// nothing else).
    pub fn used(&self, who: &Principal, injection: &Injection, kind: BranchKind) {
        let items = &injection.items;
        if items.is_empty() {
            return;
        }
        self.metrics.injected(&who.tenant, kind, items.len(), injection.tokens);
        let mut pending = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = pending.entry(who.tenant.clone()).or_default();
        for item in items {
            *counts.entry(item.id).or_default() += 1;
        }
    }

    /// Writes the uses counted since the last flush, a statement per
    /// tenant. What could not be written is kept for the next flush.
    pub async fn flush_uses(&self) -> Result<usize, FoldError> {
        let taken = std::mem::take(&mut *self.uses.lock().unwrap_or_else(PoisonError::into_inner));
        let at = self.clock.now();
        let mut written = 0;
        let mut failed = None;
        for (tenant, counts) in taken {
            let uses: Vec<(MemoryId, u64)> = counts.iter().map(|(id, n)| (*id, *n)).collect();
            if failed.is_none() {
                match self.store.memories_used(&tenant, &uses, at).await {
                    Ok(()) => {
                        written += uses.len();
                        continue;
                    }
                    Err(e) => failed = Some(FoldError::from(e)),
                }
            }
            // Back into the tally, with what was counted meanwhile.
            let mut pending = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
            let again = pending.entry(tenant).or_default();
            for (id, n) in counts {
                *again.entry(id).or_default() += n;
            }
        }
        failed.map_or(Ok(written), Err)
    }

    /// Retention: deletes items older than `max_age`, then each
    /// tenant's oldest beyond `max_items_per_tenant`. How many went.
    pub async fn prune(&self) -> Result<u64, FoldError> {
        // A validated `max_age` is at most a century.
        let older_than = chrono::Duration::from_std(self.config.max_age)
            .ok()
            .and_then(|age| self.clock.now().checked_sub_signed(age))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let pruned =
            self.store.prune_memories(older_than, self.config.max_items_per_tenant).await?;
        if pruned > 0 {
            tracing::info!(pruned, "memory items past retention deleted");
        }
        Ok(pruned)
    }

    fn trusted(&self, item: &MemoryItem) -> bool {
        item.injectable(self.config.memory_min_confidence)
    }
}

/// `text` on one line: a title or description cannot start a line of its
/// own that would read as another lesson.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One item as a branch reads it: kind, confidence and provenance first.
fn render(item: &MemoryItem) -> String {
    let from = match (item.provenance.source, item.provenance.branch) {
        (MemorySource::Distilled, Some(branch)) => format!("distilled from branch {branch}"),
        (MemorySource::Distilled, None) => "distilled by the gateway".to_owned(),
        (MemorySource::Recorded, _) => format!("recorded by {}", item.provenance.subject),
    };
    let mut text = format!(
        "- [{} {}, confidence {:.2}, {from}] {}",
        item.kind,
        item.id,
        item.confidence.get(),
        one_line(&item.title)
    );
    if !item.description.is_empty() {
        text.push_str(" — ");
        text.push_str(&one_line(&item.description));
    }
    text.push_str("\n  ");
    text.push_str(&item.content.replace('\n', "\n  "));
    text
}
