//! The gitleaks project's own default configuration loads, and its rules
//! detect secrets of the formats they describe.

// Helpers outside #[test] functions fail loudly too.

use foldgate_scrub::{LoadError, RuleSet};

const GITLEAKS: &str = include_str!("../data/gitleaks.toml");

/// Floor for the share of gitleaks' text rules that compile here. Measured:
/// 100 % (221 of 221; one path-only rule is skipped). See the test's
/// printed figures); the floor keeps a regression in translation visible.
const MIN_COMPILED_SHARE: f64 = 0.99;

fn rule_count_in_document() -> usize {
    GITLEAKS.lines().filter(|l| l.trim() == "[[rules]]").count()
}

#[test]
fn lenient_load_compiles_nearly_all_rules() {
    let loaded = RuleSet::from_toml_str_lenient(GITLEAKS).unwrap();
    let total = rule_count_in_document();
    let compiled = loaded.rules.rule_count();
    let skipped = loaded.rules.skipped().len();
    let rejected = loaded.rejected.len();
    // Every rule is accounted for: compiled, skipped with a reason, or
    // rejected with a reason. Nothing disappears silently.
    assert_eq!(compiled + skipped + rejected, total);
    let applicable = total - skipped;
    let share = compiled as f64 / applicable as f64;
    println!(
        "gitleaks.toml: {total} rules; {compiled} compiled, {skipped} skipped (path-only), \
         {rejected} rejected; {:.1}% of text rules compiled",
        share * 100.0
    );
    for s in loaded.rules.skipped() {
        println!("  skipped {}: {}", s.rule_id, s.reason);
    }
    for r in &loaded.rejected {
        println!("  rejected {}: {}", r.rule_id, r.reason);
    }
    assert!(share >= MIN_COMPILED_SHARE, "only {:.1}% compiled", share * 100.0);
}

#[test]
fn strict_load_names_every_rejected_rule_or_succeeds() {
    let lenient = RuleSet::from_toml_str_lenient(GITLEAKS).unwrap();
    match RuleSet::from_toml_str(GITLEAKS) {
        Ok(set) => {
            assert!(lenient.rejected.is_empty());
            assert_eq!(set.rule_count(), lenient.rules.rule_count());
        }
        Err(LoadError::InvalidRules(rejected)) => {
            assert_eq!(rejected, lenient.rejected);
        }
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[test]
fn gitleaks_rules_detect_known_formats() {
    let rules = RuleSet::from_toml_str_lenient(GITLEAKS).unwrap().rules;
    let cases = [
        ("github-pat", "GITHUB_TOKEN=ghp_{an:36}"),
        ("gitlab-pat", "token: glpat-{b64u:20}"),
        ("aws-access-token", "aws_access_key_id = AKIA{b32:16}"),
        ("slack-bot-token", "SLACK=xoxb-{dig:12}-{dig:13}-{an:24}"),
        ("stripe-access-token", "key = sk_live_{an:32}"),
        ("npm-access-token", "//registry.npmjs.org/:_authToken=npm_{an:36}"),
        (
            "private-key",
            "-----BEGIN RSA PRIVATE KEY-----\n{b64:64}\n{b64:64}\n-----END RSA PRIVATE KEY-----",
        ),
    ];
    for (rule, template) in cases {
        let text = crate::common::secret(template, rule);
        let out = rules.scrub_text(&text).unwrap();
        assert!(out.report.count(rule) >= 1, "{rule} did not fire on {text:?}: {:?}", out.report);
        assert!(out.text.contains(&format!("[REDACTED:{rule}]")), "{}", out.text);
    }
}

#[test]
fn gitleaks_global_allowlist_applies() {
    // The gitleaks configuration allowlists AWS's documented example key
    // by regex; that allowlist must be honoured.
    let rules = RuleSet::from_toml_str_lenient(GITLEAKS).unwrap().rules;
    let out = rules.scrub_text("aws_access_key_id = AKIAIOSFODNN7EXAMPLE").unwrap();
    assert!(out.report.is_clean(), "{:?}", out.report);
}
