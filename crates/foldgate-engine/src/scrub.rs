//! The scrubbing port: what the return path calls to remove secrets from a
//! message before it is stored or leaves the branch.

use std::{fmt::Debug, sync::Arc};

use foldgate_scrub::{RuleSet, ScrubConfig};

/// Text of at most this many bytes is scrubbed and counted on the async
/// worker that has it. Counting runs at very roughly a microsecond per byte,
/// so this keeps such work well under the time a worker may run between two
/// awaits; for small texts, handing the work to the blocking pool and back
/// (two thread wake-ups) costs more than the work itself.
pub const INLINE_TEXT_BYTES: usize = 256;

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

/// A JSON value with secrets replaced inside its strings; same shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrubbedValue {
    pub value: serde_json::Value,
    pub redactions: u64,
    pub by_rule: Vec<(String, u64)>,
}

/// Removes secrets from text.
pub trait Scrubber: Send + Sync + Debug {
    fn scrub(&self, text: &str) -> Result<Scrubbed, ScrubFailure>;

    /// Removes secrets from every string of a JSON value (an upstream tool
    /// result), keeping its shape.
    fn scrub_json(&self, value: &serde_json::Value) -> Result<ScrubbedValue, ScrubFailure>;

    /// The id of every rule, as `by_rule` names them: the redaction count
    /// of each starts at zero. None by default.
    fn rules(&self) -> Vec<String> {
        Vec::new()
    }
}

fn counts(report: &foldgate_scrub::Report) -> (u64, Vec<(String, u64)>) {
    let total = u64::try_from(report.total()).unwrap_or(u64::MAX);
    let by_rule = report
        .by_rule()
        .map(|(rule, n)| (rule.to_owned(), u64::try_from(n).unwrap_or(u64::MAX)))
        .collect();
    (total, by_rule)
}

/// The gateway's scrubber: gitleaks-format rules (see `foldgate-scrub`).
impl Scrubber for RuleSet {
    fn scrub(&self, text: &str) -> Result<Scrubbed, ScrubFailure> {
        let scrubbed = self.scrub_text(text).map_err(|e| ScrubFailure(e.to_string()))?;
        let (redactions, by_rule) = counts(&scrubbed.report);
        Ok(Scrubbed { text: scrubbed.text, redactions, by_rule })
    }

    fn scrub_json(&self, value: &serde_json::Value) -> Result<ScrubbedValue, ScrubFailure> {
        let scrubbed = RuleSet::scrub_json(self, value).map_err(|e| ScrubFailure(e.to_string()))?;
        let (redactions, by_rule) = counts(&scrubbed.report);
        Ok(ScrubbedValue { value: scrubbed.value, redactions, by_rule })
    }

    fn rules(&self) -> Vec<String> {
        self.rule_ids().map(str::to_owned).collect()
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
