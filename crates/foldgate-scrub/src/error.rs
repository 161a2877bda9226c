//! Error types: one enum for loading secret rules, one for scrubbing input,
//! and one for loading injection rules.

use std::fmt;
use std::path::PathBuf;

/// A rule that was refused at load time, with the reason.
///
/// Strict loading turns a non-empty list of these into
/// [`LoadError::InvalidRules`]; lenient loading hands them back next to the
/// compiled set so an operator can see exactly what is not enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRule {
    /// The rule's `id`, or `rules[N]` when the rule has no usable id.
    pub rule_id: String,
    /// Why the rule was refused (for example the regex compiler's message).
    pub reason: String,
}

impl fmt::Display for RejectedRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule_id, self.reason)
    }
}

/// A rule that is valid gitleaks configuration but has no meaning when
/// scanning text, so it is not part of the compiled set (for example a rule
/// that only matches file paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRule {
    /// The rule's `id`.
    pub rule_id: String,
    /// Why the rule does not apply to text scanning.
    pub reason: String,
}

/// Why a rule set could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The operator's rules file could not be read.
    #[error("cannot read rules file {}: {source}", path.display())]
    Io {
        /// The file that was asked for.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The document is not TOML, or its top level is not gitleaks' shape.
    #[error("rules document is not valid gitleaks TOML: {0}")]
    Toml(String),
    /// One or more rules do not compile or are malformed (strict loading).
    #[error("{} rule(s) rejected: {}", .0.len(), join_rejected(.0))]
    InvalidRules(Vec<RejectedRule>),
    /// The global `[allowlist]` / `[[allowlists]]` section is malformed.
    #[error("invalid global allowlist: {0}")]
    GlobalAllowlist(String),
    /// Two rules share an id, within one document or across the built-in
    /// set and an operator's file.
    #[error("duplicate rule id `{0}`")]
    DuplicateRuleId(String),
    /// The document uses a gitleaks feature that would change which rules
    /// apply and that we cannot honour (for example `[extend]`).
    #[error("unsupported gitleaks feature: {0}")]
    Unsupported(String),
    /// The configuration enables no rules at all, which would let every
    /// secret through.
    #[error("no rules configured: enable the built-in set or give a rules file")]
    NoRules,
    /// The keyword prefilter could not be built.
    #[error("cannot build the keyword prefilter: {0}")]
    Prefilter(#[from] aho_corasick::BuildError),
}

/// Why a set of injection rules could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectionLoadError {
    /// The document is not TOML, or its top level is not `[[rules]]`
    /// tables (an unknown key, such as a misspelt `rules`, is refused).
    #[error("injection rules document is not valid: {0}")]
    Toml(String),
    /// One or more rules are malformed or their regex does not compile.
    #[error("{} injection rule(s) rejected: {}", .0.len(), join_rejected(.0))]
    InvalidRules(Vec<RejectedRule>),
    /// Two rules share an id, or a rule takes the id of a built-in check,
    /// within one document or across the built-in set and an operator's
    /// file.
    #[error("duplicate injection rule id `{0}`")]
    DuplicateRuleId(String),
}

fn join_rejected(rejected: &[RejectedRule]) -> String {
    rejected.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Why a piece of input could not be scrubbed.
///
/// Every variant means "do not pass this input on": the caller has no
/// redacted version to use instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrubError {
    /// The input is larger than the configured limit.
    #[error("input is {len} bytes, over the limit of {max} bytes")]
    InputTooLarge {
        /// Size of the input in bytes.
        len: usize,
        /// The configured limit in bytes.
        max: usize,
    },
    /// A JSON value is nested deeper than the configured limit.
    #[error("JSON value is nested deeper than {max} levels")]
    TooDeep {
        /// The configured depth limit.
        max: usize,
    },
    /// The scrubber's own invariants did not hold (for example a reported
    /// secret value survived redaction). The input must not be passed on.
    #[error("internal inconsistency while scrubbing: {0}")]
    Internal(&'static str),
}
