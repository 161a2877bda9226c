//! What a scrub found, without what it found.

use std::collections::BTreeMap;

use serde::Serialize;

/// Counts of redactions per rule id.
///
/// A report never holds secret material, only rule ids and counts, so it is
/// safe to log, print with `{:?}`, or return to a caller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    by_rule: BTreeMap<String, usize>,
    total: usize,
}

impl Report {
    /// Total number of redactions.
    #[must_use]
    pub fn total(&self) -> usize {
        self.total
    }

    /// `true` when nothing was redacted.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.total == 0
    }

    /// Redaction counts per rule id, in rule-id order.
    pub fn by_rule(&self) -> impl Iterator<Item = (&str, usize)> + '_ {
        self.by_rule.iter().map(|(id, n)| (id.as_str(), *n))
    }

    /// Number of redactions attributed to `rule_id`.
    #[must_use]
    pub fn count(&self, rule_id: &str) -> usize {
        self.by_rule.get(rule_id).copied().unwrap_or(0)
    }

    /// Adds another pass's counts to these.
    pub(crate) fn add(&mut self, other: Report) {
        for (rule, n) in other.by_rule {
            *self.by_rule.entry(rule).or_insert(0) += n;
        }
        self.total += other.total;
    }

    pub(crate) fn record(&mut self, rule_id: &str) {
        *self.by_rule.entry(rule_id.to_owned()).or_insert(0) += 1;
        self.total += 1;
    }
}
