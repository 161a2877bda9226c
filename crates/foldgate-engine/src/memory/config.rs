//! `[memory]`: the reasoning memory's settings.

use std::{path::PathBuf, sync::Arc, time::Duration};

use foldgate_domain::{
    TenantId,
    duration::{self, Renamed},
};
use foldgate_scrub::{InjectionLoadError, InjectionRules};
use serde::Deserialize;

use super::Screen;

/// `[memory]`: the reasoning memory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Whether the memory tools are offered and lessons injected at all.
    pub enabled: bool,
    /// Whether `branch_create` and `branch_run` inject lessons when the
    /// caller does not say (`inject_memories`).
    pub inject_by_default: bool,
    /// The share of a branch's budget that injected lessons may take.
    pub injection_budget_ratio: f64,
    /// Items below this confidence are not injected.
    pub memory_min_confidence: f64,
    /// The most items injected into one branch.
    pub memory_max_items: u32,
    /// How many distinct terms (stemmed, stop words aside) an item must
    /// share with a task or a search to count as related (or all of them,
    /// when the query has fewer).
    pub memory_min_matched_terms: u32,
    /// The confidence an agent's own item starts from.
    pub recorded_confidence: f64,
    /// Whether items the injection screen flagged may still be injected
    /// and found (not recommended).
    pub inject_flagged: bool,
    /// The tenants whose gateway-run branches are distilled into lessons
    /// when they end, by the branch's own model (`"*"`: every tenant).
    /// None by default: each distillation is a model call the operator
    /// pays for.
    pub distill_tenants: Vec<String>,
    /// Retention: the most items a tenant keeps (the oldest go first).
    pub max_items_per_tenant: u64,
    /// Retention: items older than this are deleted. A bare number counts
    /// days.
    #[serde(alias = "max_age_days", deserialize_with = "duration::days")]
    pub max_age: Duration,
    /// A TOML file of injection-screen rules added to the built-in ones
    /// (`[[rules]]` with `id`, `description`, `regex`).
    pub screen_rules_file: Option<PathBuf>,
    /// With an embeddings model: how long a search or an injection waits
    /// for the query's vector (and the tenant's vectors, when this replica
    /// has to read them) before it ranks by full text alone. A bare number
    /// counts milliseconds.
    #[serde(alias = "embeddings_timeout_ms", deserialize_with = "duration::millis")]
    pub embeddings_timeout: Duration,
    /// With an embeddings model: the cosine similarity below which an item
    /// does not count as related by its vector (it may still be by its
    /// terms).
    pub embeddings_min_similarity: f64,
    /// How long a replica ranks by the vectors it read of a tenant before
    /// it checks (one cheap statement) whether others were written since.
    /// A bare number counts seconds.
    #[serde(alias = "embeddings_cache_seconds", deserialize_with = "duration::seconds")]
    pub embeddings_cache_ttl: Duration,
    /// The most memory a replica gives to tenants' vectors (MiB); the
    /// tenants ranked least recently go first.
    pub embeddings_cache_mib: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            inject_by_default: false,
            injection_budget_ratio: 0.2,
            memory_min_confidence: 0.7,
            memory_max_items: 10,
            memory_min_matched_terms: 3,
            recorded_confidence: 0.5,
            inject_flagged: false,
            distill_tenants: Vec::new(),
            max_items_per_tenant: 10_000,
            max_age: Duration::from_secs(365 * 24 * 3600),
            screen_rules_file: None,
            embeddings_timeout: Duration::from_millis(500),
            embeddings_min_similarity: 0.3,
            embeddings_cache_ttl: Duration::from_secs(30),
            embeddings_cache_mib: 256,
        }
    }
}

impl MemoryConfig {
    /// The former names of its settings.
    pub const RENAMED: &'static [Renamed] = &[
        Renamed::new("max_age_days", "max_age"),
        Renamed::new("embeddings_timeout_ms", "embeddings_timeout"),
        Renamed::new("embeddings_cache_seconds", "embeddings_cache_ttl"),
    ];

    /// Checks the settings, naming the first one that is wrong.
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        let share = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(foldgate_domain::ConfigError::new(format!(
                    "{name} must be from 0 to 1, got {v}"
                )))
            }
        };
        share("injection_budget_ratio", self.injection_budget_ratio)?;
        share("memory_min_confidence", self.memory_min_confidence)?;
        share("recorded_confidence", self.recorded_confidence)?;
        if self.memory_min_matched_terms == 0 {
            return Err("memory_min_matched_terms must be at least 1".into());
        }
        if self.memory_max_items > 100 {
            return Err("memory_max_items must be at most 100".into());
        }
        if self.max_items_per_tenant == 0 {
            return Err("max_items_per_tenant must be above 0".into());
        }
        // At most a century: longer cannot be subtracted from a date.
        duration::check_range(
            "max_age",
            self.max_age,
            Duration::from_secs(1),
            Duration::from_secs(100 * 365 * 24 * 3600),
        )?;
        duration::check_range(
            "embeddings_timeout",
            self.embeddings_timeout,
            Duration::from_millis(1),
            Duration::from_secs(60),
        )?;
        if !(-1.0..=1.0).contains(&self.embeddings_min_similarity) {
            return Err(format!(
                "embeddings_min_similarity must be from -1 to 1, got {}",
                self.embeddings_min_similarity
            )
            .into());
        }
        duration::check_range(
            "embeddings_cache_ttl",
            self.embeddings_cache_ttl,
            Duration::from_secs(1),
            Duration::from_secs(3600),
        )?;
        if !(1..=1_048_576).contains(&self.embeddings_cache_mib) {
            return Err("embeddings_cache_mib must be from 1 to 1048576".into());
        }
        Ok(())
    }
}

impl MemoryConfig {
    /// Whether `tenant`'s gateway-run branches are distilled.
    pub fn distills(&self, tenant: &TenantId) -> bool {
        self.enabled && self.distill_tenants.iter().any(|t| t == "*" || t == tenant.as_str())
    }

    /// The injection screen: the built-in rules, and the operator's file.
    pub fn screen(&self) -> Result<Arc<dyn Screen>, ScreenSetupError> {
        let rules = match &self.screen_rules_file {
            None => InjectionRules::builtin()?,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ScreenSetupError::Read(path.clone(), e))?;
                InjectionRules::with_operator_rules(&text)?
            }
        };
        Ok(Arc::new(rules))
    }
}

/// The injection screen could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ScreenSetupError {
    #[error("reading memory.screen_rules_file {0:?}: {1}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("memory.screen_rules_file: {0}")]
    Rules(#[from] InjectionLoadError),
}
