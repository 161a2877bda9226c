//! Validation and compilation of gitleaks rules into their scanning form.
//!
//! Parsing turns the loosely typed TOML ([`crate::format`]) into compiled
//! [`Rule`]s and [`Allowlist`]s that cannot be in an invalid state: every
//! regex has compiled, every `secretGroup` exists, every allowlist target is
//! known. Problems are collected per rule so that strict and lenient loading
//! can share this code.

use std::sync::Arc;

use crate::error::{LoadError, RejectedRule, SkippedRule};
use crate::format::{RawAllowlist, RawConfig, RawRule};
use crate::translate::go_to_rust;
use aho_corasick::AhoCorasick;
use regex::{Regex, RegexBuilder};

/// Compiled-program size limit per regex. The default (10 MiB) is too small
/// for some real-world rules with large case-insensitive counted
/// repetitions; matching stays linear-time regardless.
const REGEX_SIZE_LIMIT: usize = 64 << 20;

/// What an allowlist regex is tested against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegexTarget {
    /// The secret (the secret group, or the whole match).
    Secret,
    /// The whole regex match.
    Match,
    /// The full line(s) containing the match.
    Line,
}

/// How the criteria of one allowlist combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Condition {
    Or,
    And,
}

/// A compiled allowlist: findings it matches are not secrets.
#[derive(Debug)]
pub(crate) struct Allowlist {
    condition: Condition,
    target: RegexTarget,
    /// All `regexes`, joined into one alternation.
    regex: Option<Regex>,
    /// Lower-cased stop words, searched in the lower-cased secret.
    stopwords: Option<AhoCorasick>,
    /// Under `AND`, a `paths` or `commits` criterion can never hold for text,
    /// so the whole allowlist can never apply.
    unsatisfiable: bool,
}

/// The pieces of a candidate finding an allowlist can look at.
pub(crate) struct Candidate<'a> {
    pub secret: &'a str,
    pub matched: &'a str,
    pub line: &'a str,
}

impl Allowlist {
    /// Whether this allowlist exempts the candidate.
    pub(crate) fn allows(&self, c: &Candidate<'_>) -> bool {
        if self.unsatisfiable {
            return false;
        }
        let target = match self.target {
            RegexTarget::Secret => c.secret,
            RegexTarget::Match => c.matched,
            RegexTarget::Line => c.line,
        };
        // gitleaks treats an empty target as "no regex match".
        let regex_hit = self.regex.as_ref().map(|re| !target.is_empty() && re.is_match(target));
        let stop_hit =
            self.stopwords.as_ref().map(|ac| ac.is_match(c.secret.to_lowercase().as_str()));
        match self.condition {
            Condition::Or => regex_hit == Some(true) || stop_hit == Some(true),
            Condition::And => {
                // Every criterion that is present must hold, and at least one
                // must be present.
                let checks = [regex_hit, stop_hit];
                checks.iter().any(Option::is_some) && checks.iter().flatten().all(|hit| *hit)
            }
        }
    }
}

/// A compiled detection rule.
#[derive(Debug)]
pub(crate) struct Rule {
    pub id: String,
    pub description: String,
    pub regex: Regex,
    /// Capture group holding the secret; `0` means "first non-empty group,
    /// else the whole match", as in gitleaks.
    pub secret_group: usize,
    /// Minimum Shannon entropy of the secret; `0.0` disables the gate.
    pub entropy: f64,
    /// Lower-cased keywords; empty means the rule always runs.
    pub keywords: Vec<String>,
    pub allowlists: Vec<Arc<Allowlist>>,
    /// Generic rules lose ties against specific ones when labelling a
    /// redaction, so reports name the most precise rule.
    pub generic: bool,
}

/// Rules parsed from one document, with what was refused or skipped.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub rules: Vec<Rule>,
    pub rejected: Vec<RejectedRule>,
    pub skipped: Vec<SkippedRule>,
    /// Global allowlists with `targetRules`, to attach once every document
    /// is known (targets may name rules from another document).
    pub targeted: Vec<(Vec<String>, Arc<Allowlist>)>,
}

/// Parses and compiles one gitleaks document.
///
/// Document-level problems (TOML syntax, `[extend]`, a bad global allowlist)
/// are errors; rule-level problems are collected in [`Parsed::rejected`].
pub(crate) fn parse_document(src: &str) -> Result<Parsed, LoadError> {
    let raw: RawConfig = toml::from_str(src).map_err(|e| LoadError::Toml(e.to_string()))?;
    from_raw(raw)
}

fn from_raw(raw: RawConfig) -> Result<Parsed, LoadError> {
    if raw.extend.is_some() {
        return Err(LoadError::Unsupported(
            "[extend] (use `use_builtin` and `rules_file` in the scrub configuration instead)"
                .to_owned(),
        ));
    }
    if raw.allowlist.is_some() && !raw.allowlists.is_empty() {
        return Err(LoadError::GlobalAllowlist(
            "[allowlist] cannot be combined with [[allowlists]]".to_owned(),
        ));
    }
    let mut global = Vec::new();
    let mut targeted = Vec::new();
    for raw_list in raw.allowlist.into_iter().chain(raw.allowlists) {
        let targets = raw_list.target_rules.clone();
        let list = Arc::new(compile_allowlist(raw_list).map_err(LoadError::GlobalAllowlist)?);
        if targets.is_empty() {
            global.push(list);
        } else {
            targeted.push((targets, list));
        }
    }

    let mut parsed = Parsed { targeted, ..Parsed::default() };
    for (index, table) in raw.rules.into_iter().enumerate() {
        let fallback_id = format!("rules[{index}]");
        let id = match table.get("id").and_then(toml::Value::as_str) {
            Some(id) if !id.trim().is_empty() => id.to_owned(),
            _ => fallback_id,
        };
        let rule = match toml::Value::Table(table).try_into::<RawRule>() {
            Ok(rule) => rule,
            Err(e) => {
                parsed
                    .rejected
                    .push(RejectedRule { rule_id: id, reason: e.to_string().trim().to_owned() });
                continue;
            }
        };
        match compile_rule(rule, &id, &global) {
            Ok(Compiled::Rule(rule)) => parsed.rules.push(*rule),
            Ok(Compiled::Skipped(reason)) => {
                parsed.skipped.push(SkippedRule { rule_id: id, reason })
            }
            Err(reason) => parsed.rejected.push(RejectedRule { rule_id: id, reason }),
        }
    }
    Ok(parsed)
}

enum Compiled {
    Rule(Box<Rule>),
    Skipped(String),
}

fn compile_rule(raw: RawRule, id: &str, global: &[Arc<Allowlist>]) -> Result<Compiled, String> {
    if raw.id.trim().is_empty() {
        return Err("rule has an empty `id`".to_owned());
    }
    if raw.allowlist.is_some() && !raw.allowlists.is_empty() {
        return Err("[rules.allowlist] cannot be combined with [[rules.allowlists]]".to_owned());
    }
    let Some(pattern) = raw.regex.filter(|r| !r.is_empty()) else {
        return if raw.path.is_some() {
            Ok(Compiled::Skipped(
                "path-only rule: it matches file names, and scanned text has none".to_owned(),
            ))
        } else {
            Err("rule has neither `regex` nor `path`".to_owned())
        };
    };
    if raw.skip_report {
        return Ok(Compiled::Skipped(
            "skipReport rule: it only feeds composite rules, which are not supported".to_owned(),
        ));
    }
    let regex = compile_regex(&pattern)?;
    let groups = regex.captures_len() - 1;
    let secret_group = match raw.secret_group {
        None => 0,
        Some(g) => {
            let g = usize::try_from(g).map_err(|_| format!("secretGroup {g} is negative"))?;
            if g > groups {
                return Err(format!(
                    "secretGroup {g} but the regex has only {groups} capture group(s)"
                ));
            }
            g
        }
    };
    let entropy = raw.entropy.unwrap_or(0.0);
    if !entropy.is_finite() || entropy < 0.0 {
        return Err(format!("entropy {entropy} is not a non-negative number"));
    }
    let mut keywords: Vec<String> =
        raw.keywords.iter().map(|k| k.to_lowercase()).filter(|k| !k.is_empty()).collect();
    // The prefilter folds ASCII case only; a keyword with other letters could
    // miss a differently-cased occurrence, so such a rule always runs.
    if keywords.len() != raw.keywords.len() || keywords.iter().any(|k| !k.is_ascii()) {
        keywords.clear();
    }
    keywords.sort();
    keywords.dedup();

    let mut allowlists: Vec<Arc<Allowlist>> = global.to_vec();
    for list in raw.allowlist.into_iter().chain(raw.allowlists) {
        if !list.target_rules.is_empty() {
            return Err("`targetRules` is only valid in a global allowlist".to_owned());
        }
        allowlists.push(Arc::new(compile_allowlist(list).map_err(|e| format!("allowlist: {e}"))?));
    }
    if !raw.required.is_empty() {
        tracing::debug!(rule = id, "`required` is not supported; the rule runs on its own");
    }
    let generic = raw.id.to_ascii_lowercase().contains("generic");
    Ok(Compiled::Rule(Box::new(Rule {
        id: raw.id,
        description: raw.description.unwrap_or_default(),
        regex,
        secret_group,
        entropy,
        keywords,
        allowlists,
        generic,
    })))
}

/// Translates and compiles one gitleaks regex.
pub(crate) fn compile_regex(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(&go_to_rust(pattern)).size_limit(REGEX_SIZE_LIMIT).build().map_err(
        |e| match e {
            regex::Error::Syntax(msg) => format!("regex does not compile: {msg}"),
            regex::Error::CompiledTooBig(limit) => {
                format!("regex is too large to compile (over {limit} bytes)")
            }
            other => format!("regex does not compile: {other}"),
        },
    )
}

fn compile_allowlist(raw: RawAllowlist) -> Result<Allowlist, String> {
    let condition = match raw.condition.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("" | "OR" | "||") => Condition::Or,
        Some("AND" | "&&") => Condition::And,
        Some(other) => return Err(format!("unknown condition `{other}` (expected AND or OR)")),
    };
    let target = match raw.regex_target.as_deref() {
        None | Some("" | "secret") => RegexTarget::Secret,
        Some("match") => RegexTarget::Match,
        Some("line") => RegexTarget::Line,
        Some(other) => {
            return Err(format!("unknown regexTarget `{other}` (expected secret, match or line)"));
        }
    };
    if raw.commits.is_empty()
        && raw.paths.is_empty()
        && raw.regexes.is_empty()
        && raw.stopwords.is_empty()
    {
        return Err("must contain at least one of commits, paths, regexes or stopwords".to_owned());
    }
    // Path patterns are never used, but a broken one is still a broken file.
    for path in &raw.paths {
        compile_regex(path).map_err(|e| format!("path `{path}`: {e}"))?;
    }
    let regex = if raw.regexes.is_empty() {
        None
    } else {
        for r in &raw.regexes {
            compile_regex(r).map_err(|e| format!("allowlist regex `{r}`: {e}"))?;
        }
        let joined = format!("(?:{})", raw.regexes.join("|"));
        Some(compile_regex(&joined)?)
    };
    let stopwords = if raw.stopwords.is_empty() {
        None
    } else {
        // An empty stop word would exempt every finding; ignore it rather
        // than disable the rule.
        let words: Vec<String> =
            raw.stopwords.iter().map(|w| w.to_lowercase()).filter(|w| !w.is_empty()).collect();
        if words.is_empty() {
            return Err("stopwords are all empty".to_owned());
        }
        Some(AhoCorasick::new(&words).map_err(|e| format!("stopwords: {e}"))?)
    };
    let unsatisfiable =
        condition == Condition::And && (!raw.paths.is_empty() || !raw.commits.is_empty());
    Ok(Allowlist { condition, target, regex, stopwords, unsatisfiable })
}
