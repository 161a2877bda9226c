//! The compiled rule set and the ways to build it.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};

use crate::config::ScrubConfig;
use crate::error::{LoadError, RejectedRule, SkippedRule};
use crate::rules::{Parsed, Rule, parse_document};

/// The built-in rules, in gitleaks format so they go through the same loader
/// as an operator's file.
const BUILTIN_RULES: &str = include_str!("builtin.toml");

/// Default limit on the size of one input (text, or all strings of one JSON
/// value together).
pub const DEFAULT_MAX_INPUT_BYTES: usize = 16 << 20;

/// Default limit on JSON nesting, the same as `serde_json`'s parser uses.
pub const DEFAULT_MAX_JSON_DEPTH: usize = 128;

/// A compiled, immutable set of secret rules.
///
/// Building one compiles every regex, so build it once at start-up and share
/// it (`Arc<RuleSet>`); scanning takes `&self` and is thread-safe.
pub struct RuleSet {
    pub(crate) rules: Vec<Rule>,
    /// Case-insensitive search for every rule keyword.
    pub(crate) prefilter: Option<AhoCorasick>,
    /// For each prefilter pattern, the rules that keyword enables.
    pub(crate) keyword_rules: Vec<Vec<usize>>,
    /// Rules without keywords: they run on every input.
    pub(crate) always: Vec<usize>,
    skipped: Vec<SkippedRule>,
    pub(crate) max_input_bytes: usize,
    pub(crate) max_json_depth: usize,
}

/// A rule set built leniently, with the rules that were refused.
#[derive(Debug)]
pub struct LenientLoad {
    /// The rules that compiled.
    pub rules: RuleSet,
    /// The rules that did not, each with its id and reason.
    pub rejected: Vec<RejectedRule>,
}

impl RuleSet {
    /// The built-in rule set.
    ///
    /// # Errors
    /// Only if the embedded file is broken, which the crate's tests rule
    /// out; it still returns an error rather than panicking.
    pub fn builtin() -> Result<RuleSet, LoadError> {
        Self::from_toml_str(BUILTIN_RULES)
    }

    /// Builds a rule set from a gitleaks-format TOML document, refusing the
    /// whole document if any rule is invalid.
    ///
    /// # Errors
    /// [`LoadError::InvalidRules`] lists every rejected rule id with its
    /// reason; other variants describe document-level problems.
    pub fn from_toml_str(src: &str) -> Result<RuleSet, LoadError> {
        let parsed = parse_document(src)?;
        if !parsed.rejected.is_empty() {
            return Err(LoadError::InvalidRules(parsed.rejected));
        }
        Self::assemble(vec![parsed])
    }

    /// Builds a rule set from a gitleaks-format TOML document, keeping the
    /// rules that compile and returning the others with their reasons.
    ///
    /// # Errors
    /// Document-level problems only (TOML syntax, `[extend]`, a malformed
    /// global allowlist, duplicate ids, or no usable rule at all).
    pub fn from_toml_str_lenient(src: &str) -> Result<LenientLoad, LoadError> {
        let mut parsed = parse_document(src)?;
        let rejected = std::mem::take(&mut parsed.rejected);
        // A targeted allowlist may name a rejected rule; that is not a second
        // error, the rule is simply absent.
        let known: HashSet<&str> = parsed.rules.iter().map(|r| r.id.as_str()).collect();
        let targeted = std::mem::take(&mut parsed.targeted)
            .into_iter()
            .map(|(targets, list)| {
                let targets =
                    targets.into_iter().filter(|t| known.contains(t.as_str())).collect::<Vec<_>>();
                (targets, list)
            })
            .collect();
        parsed.targeted = targeted;
        Ok(LenientLoad { rules: Self::assemble(vec![parsed])?, rejected })
    }

    /// Builds the rule set an operator configured: the built-in set, the
    /// rules file, or both. The rules file is loaded strictly.
    ///
    /// # Errors
    /// Any [`LoadError`]; in particular [`LoadError::NoRules`] when neither
    /// source is enabled and [`LoadError::DuplicateRuleId`] when the file
    /// reuses a built-in id.
    pub fn from_config(cfg: &ScrubConfig) -> Result<RuleSet, LoadError> {
        let mut documents = Vec::new();
        if cfg.use_builtin {
            documents.push(parse_document(BUILTIN_RULES)?);
        }
        if let Some(path) = &cfg.rules_file {
            let src = std::fs::read_to_string(path)
                .map_err(|source| LoadError::Io { path: path.clone(), source })?;
            documents.push(parse_document(&src)?);
        }
        let rejected: Vec<RejectedRule> =
            documents.iter_mut().flat_map(|d| std::mem::take(&mut d.rejected)).collect();
        if !rejected.is_empty() {
            return Err(LoadError::InvalidRules(rejected));
        }
        Self::assemble(documents)
    }

    /// Sets the largest input accepted by [`RuleSet::scrub_text`] and
    /// [`RuleSet::scrub_json`]; larger inputs are refused, not passed on.
    #[must_use]
    pub fn with_max_input_bytes(mut self, max: usize) -> Self {
        self.max_input_bytes = max;
        self
    }

    /// Sets the deepest JSON nesting accepted by [`RuleSet::scrub_json`].
    #[must_use]
    pub fn with_max_json_depth(mut self, max: usize) -> Self {
        self.max_json_depth = max;
        self
    }

    /// Number of compiled rules.
    #[must_use]
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Ids of the compiled rules, in load order.
    pub fn rule_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.rules.iter().map(|r| r.id.as_str())
    }

    /// Id and description of each compiled rule, in load order.
    pub fn rule_descriptions(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.rules.iter().map(|r| (r.id.as_str(), r.description.as_str()))
    }

    /// Rules that are valid gitleaks configuration but do not apply to text
    /// (for example path-only rules), with the reason.
    #[must_use]
    pub fn skipped(&self) -> &[SkippedRule] {
        &self.skipped
    }

    /// The largest accepted input, in bytes.
    #[must_use]
    pub fn max_input_bytes(&self) -> usize {
        self.max_input_bytes
    }

    /// Merges parsed documents into one set: checks ids are unique, attaches
    /// targeted allowlists and builds the keyword prefilter.
    fn assemble(documents: Vec<Parsed>) -> Result<RuleSet, LoadError> {
        let mut rules = Vec::new();
        let mut skipped = Vec::new();
        let mut targeted = Vec::new();
        for doc in documents {
            rules.extend(doc.rules);
            skipped.extend(doc.skipped);
            targeted.extend(doc.targeted);
        }
        let mut seen = HashSet::new();
        for rule in &rules {
            if !seen.insert(rule.id.as_str()) {
                return Err(LoadError::DuplicateRuleId(rule.id.clone()));
            }
        }
        for (targets, list) in targeted {
            for target in targets {
                let rule = rules.iter_mut().find(|r| r.id == target).ok_or_else(|| {
                    LoadError::GlobalAllowlist(format!("target rule `{target}` does not exist"))
                })?;
                rule.allowlists.push(Arc::clone(&list));
            }
        }
        if rules.is_empty() {
            return Err(LoadError::NoRules);
        }
        for s in &skipped {
            tracing::info!(rule = %s.rule_id, reason = %s.reason, "secret rule skipped");
        }

        let mut keywords: Vec<String> = Vec::new();
        let mut keyword_rules: Vec<Vec<usize>> = Vec::new();
        let mut always = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            if rule.keywords.is_empty() {
                always.push(index);
                continue;
            }
            for kw in &rule.keywords {
                if let Some(pos) = keywords.iter().position(|k| k == kw) {
                    keyword_rules[pos].push(index);
                } else {
                    keywords.push(kw.clone());
                    keyword_rules.push(vec![index]);
                }
            }
        }
        let prefilter = if keywords.is_empty() {
            None
        } else {
            Some(
                // Built once per rule set and run on every input: a DFA costs
                // more to build but searches several times faster than the
                // NFA the builder would pick for this many keywords.
                AhoCorasickBuilder::new()
                    .kind(Some(AhoCorasickKind::DFA))
                    .ascii_case_insensitive(true)
                    .match_kind(MatchKind::Standard)
                    .build(&keywords)?,
            )
        };
        Ok(RuleSet {
            rules,
            prefilter,
            keyword_rules,
            always,
            skipped,
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
        })
    }
}

impl fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuleSet")
            .field("rules", &self.rules.len())
            .field("always_on", &self.always.len())
            .field("skipped", &self.skipped.len())
            .field("max_input_bytes", &self.max_input_bytes)
            .field("max_json_depth", &self.max_json_depth)
            .finish_non_exhaustive()
    }
}
