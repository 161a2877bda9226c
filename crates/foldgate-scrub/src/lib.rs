//! Secret detection and redaction for everything that leaves a sub-task
//! branch of the gateway.
//!
//! Rules are written in gitleaks' TOML format: the crate ships its own
//! built-in set ([`RuleSet::builtin`]) and accepts an operator's file
//! ([`RuleSet::from_config`]). Text and JSON are scrubbed by replacing each
//! secret with `[REDACTED:rule-id]`; the accompanying [`Report`] says which
//! rules fired and how often, never what they matched.
//!
//! The same crate screens reasoning-memory items for prompt injection
//! before they reach another agent's context ([`InjectionRules`]), with
//! rules in TOML in the same spirit: a built-in set and an operator's file.
//!
//! The API fails closed: anything that cannot be scrubbed with confidence
//! (input over the size limit, JSON nested too deeply, a broken invariant)
//! is an error, so callers never receive unscrubbed data by accident.
//!
//! ```
//! use foldgate_scrub::RuleSet;
//!
//! let rules = RuleSet::builtin()?;
//! let token = format!("ghp_{}", "a1B2c3D4e5F6".repeat(3));
//! let out = rules.scrub_text(&format!("GITHUB_TOKEN={token}\n"))?;
//! assert_eq!(out.text, "GITHUB_TOKEN=[REDACTED:github-pat]\n");
//! assert_eq!(out.report.total(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
mod error;
mod format;
#[cfg(fuzzing)]
pub mod fuzzing;
mod injection;
mod invisible;
mod json;
mod report;
mod rules;
mod ruleset;
mod scan;
mod translate;

#[cfg(test)]
mod proptests;

pub use config::ScrubConfig;
pub use error::{InjectionLoadError, LoadError, RejectedRule, ScrubError, SkippedRule};
pub use injection::{
    DEFAULT_MAX_SCREEN_BYTES, HIDDEN_UNICODE_RULE_ID, INPUT_TOO_LARGE_RULE_ID, InjectionFinding,
    InjectionRules, Screening,
};
pub use json::ScrubbedJson;
pub use report::Report;
pub use ruleset::{DEFAULT_MAX_INPUT_BYTES, DEFAULT_MAX_JSON_DEPTH, LenientLoad, RuleSet};
pub use scan::Scrubbed;
