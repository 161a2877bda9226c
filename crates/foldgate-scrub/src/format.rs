//! The gitleaks TOML document, as written by people, before validation.
//!
//! gitleaks reads its configuration through viper, which matches keys
//! case-insensitively; the aliases below accept the spellings found in the
//! wild (`secretGroup` and `secretgroup`, ...). Unknown keys are refused so
//! that a misspelt `regex` or `entropy` cannot silently weaken a rule.

use serde::Deserialize;

/// The top level of a gitleaks configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    #[allow(dead_code)] // Informational only.
    pub title: Option<String>,
    #[serde(default)]
    #[allow(dead_code)] // Informational only.
    pub description: Option<String>,
    #[serde(default, rename = "minVersion", alias = "minversion")]
    #[allow(dead_code)] // We implement the format, not a gitleaks version.
    pub min_version: Option<String>,
    /// Presence is an error: extending other files would add rules we do not
    /// load.
    #[serde(default)]
    pub extend: Option<toml::Value>,
    /// The older single global allowlist.
    #[serde(default)]
    pub allowlist: Option<RawAllowlist>,
    /// The newer list of global allowlists.
    #[serde(default)]
    pub allowlists: Vec<RawAllowlist>,
    /// Rules stay as raw tables so that one malformed rule is reported by
    /// its id instead of failing the whole document.
    #[serde(default)]
    pub rules: Vec<toml::Table>,
}

/// One `[[rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub id: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub regex: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default, rename = "secretGroup", alias = "secretgroup")]
    pub secret_group: Option<i64>,
    #[serde(default)]
    pub entropy: Option<f64>,
    #[serde(default)]
    pub keywords: Vec<String>,
    #[serde(default)]
    #[allow(dead_code)] // Metadata for reports in gitleaks; unused here.
    pub tags: Vec<String>,
    /// The older single per-rule allowlist.
    #[serde(default)]
    pub allowlist: Option<RawAllowlist>,
    #[serde(default)]
    pub allowlists: Vec<RawAllowlist>,
    /// Composite-rule requirements; not supported, see the loader.
    #[serde(default)]
    pub required: Vec<toml::Value>,
    #[serde(default, rename = "skipReport", alias = "skipreport")]
    pub skip_report: bool,
}

/// An allowlist, global or per rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAllowlist {
    #[serde(default)]
    #[allow(dead_code)] // Informational only.
    pub description: Option<String>,
    #[serde(default)]
    pub condition: Option<String>,
    /// Commit SHAs; text has none, so these never match.
    #[serde(default)]
    pub commits: Vec<String>,
    /// Path patterns; text has no path, so these never match.
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default, rename = "regexTarget", alias = "regextarget")]
    pub regex_target: Option<String>,
    #[serde(default)]
    pub regexes: Vec<String>,
    #[serde(default, alias = "stopWords")]
    pub stopwords: Vec<String>,
    /// Only valid on global allowlists: the rule ids it applies to.
    #[serde(default, rename = "targetRules", alias = "targetrules")]
    pub target_rules: Vec<String>,
}
