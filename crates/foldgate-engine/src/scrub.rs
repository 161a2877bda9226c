//! The scrubbing port: what the return path calls to remove secrets from a
//! message before it is stored or leaves the branch.

use std::{fmt::Debug, sync::Arc};

use foldgate_scrub::{RuleSet, ScrubConfig};

/// Text with secrets replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scrubbed {
    pub text: String,
    /// How many values were redacted.
    pub redactions: u64,
    /// How many values each rule redacted (never the values themselves).
    pub by_rule: Vec<(String, u64)>,
}

/// Scrubbing could not be completed. The caller must fail closed: nothing
/// unscrubbed may be stored, logged or returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scrubbing failed: {0}")]
pub struct ScrubFailure(pub String);

/// Removes secrets from text.
pub trait Scrubber: Send + Sync + Debug {
    fn scrub(&self, text: &str) -> Result<Scrubbed, ScrubFailure>;
}

/// The gateway's scrubber: gitleaks-format rules (see `foldgate-scrub`).
impl Scrubber for RuleSet {
    fn scrub(&self, text: &str) -> Result<Scrubbed, ScrubFailure> {
        let scrubbed = self.scrub_text(text).map_err(|e| ScrubFailure(e.to_string()))?;
        Ok(Scrubbed {
            text: scrubbed.text,
            redactions: u64::try_from(scrubbed.report.total()).unwrap_or(u64::MAX),
            by_rule: scrubbed
                .report
                .by_rule()
                .map(|(rule, n)| (rule.to_owned(), u64::try_from(n).unwrap_or(u64::MAX)))
                .collect(),
        })
    }
}

/// The built-in rule set, ready to share.
pub fn default_scrubber() -> Result<Arc<dyn Scrubber>, ScrubFailure> {
    scrubber_from_config(&ScrubConfig::default())
}

/// The rule set an operator configured: the built-in rules, a gitleaks-format
/// rule file, or both. A rule that does not compile is an error naming it.
pub fn scrubber_from_config(config: &ScrubConfig) -> Result<Arc<dyn Scrubber>, ScrubFailure> {
    let rules = RuleSet::from_config(config).map_err(|e| ScrubFailure(e.to_string()))?;
    Ok(Arc::new(rules))
}
