//! The scrubbing port: what the return path calls to remove secrets from a
//! message before it is stored or leaves the branch.

use std::{fmt::Debug, sync::Arc};

use foldgate_scrub::RuleSet;

/// Text with secrets replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scrubbed {
    pub text: String,
    /// How many values were redacted.
    pub redactions: u64,
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
        })
    }
}

/// The built-in rule set, ready to share.
pub fn default_scrubber() -> Result<Arc<dyn Scrubber>, ScrubFailure> {
    let rules = RuleSet::builtin().map_err(|e| ScrubFailure(e.to_string()))?;
    Ok(Arc::new(rules))
}
