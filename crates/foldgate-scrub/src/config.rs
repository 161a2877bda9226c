//! Operator configuration of the scrubber.

use std::path::PathBuf;

use serde::Deserialize;

/// Which secret rules the gateway enforces.
///
/// Deserialised from the operator's configuration, for example:
///
/// ```toml
/// [scrub]
/// use_builtin = true
/// rules_file = "/etc/foldgate/extra-secrets.toml"
/// ```
///
/// Unknown keys are refused, so a misspelt option cannot silently leave the
/// defaults in place.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubConfig {
    /// Enforce the built-in rule set shipped with this crate. Defaults to
    /// `true`; turn it off only when `rules_file` fully replaces it.
    #[serde(default = "default_use_builtin")]
    pub use_builtin: bool,
    /// A rules file in gitleaks' TOML format, added to (or, with
    /// `use_builtin = false`, used instead of) the built-in set. Relative
    /// paths are resolved against the process's working directory. Every
    /// rule in it must compile: a bad rule fails start-up.
    #[serde(default)]
    pub rules_file: Option<PathBuf>,
}

fn default_use_builtin() -> bool {
    true
}

impl Default for ScrubConfig {
    fn default() -> Self {
        Self { use_builtin: true, rules_file: None }
    }
}
