//! Behaviour of the public API: loading modes, configuration, JSON,
//! fail-closed limits and what reports reveal.

// Helpers outside #[test] functions fail loudly too.

use std::io::Write as _;

use foldgate_scrub::{LoadError, RuleSet, ScrubConfig, ScrubError};
use serde_json::json;

fn builtin() -> RuleSet {
    RuleSet::builtin().unwrap()
}

fn ghp(seed: &str) -> String {
    crate::common::secret("ghp_{an:36}", seed)
}

const OPERATOR_RULES: &str = r#"
[[rules]]
id = "acme-internal-token"
description = "ACME internal service token"
regex = '''\b(acme_[a-z0-9]{24})\b'''
keywords = ["acme_"]
"#;

#[test]
fn text_redaction_keeps_surrounding_structure() {
    let token = ghp("structure");
    let text = format!("line one\nexport GITHUB_TOKEN=\"{token}\" # ci\nline three\n");
    let out = builtin().scrub_text(&text).unwrap();
    assert_eq!(
        out.text,
        "line one\nexport GITHUB_TOKEN=\"[REDACTED:github-pat]\" # ci\nline three\n"
    );
    assert_eq!(out.report.total(), 1);
    assert_eq!(out.report.by_rule().collect::<Vec<_>>(), vec![("github-pat", 1)]);
}

#[test]
fn secret_group_limits_redaction_to_the_secret() {
    let pw = crate::common::secret("{an:16}", "url");
    let out = builtin().scrub_text(&format!("postgres://app:{pw}@db.internal:5432/app")).unwrap();
    assert_eq!(out.text, "postgres://app:[REDACTED:url-credentials]@db.internal:5432/app");
}

#[test]
fn every_occurrence_of_a_found_value_is_redacted() {
    // The value is only recognisable next to `password=`, but its echo in
    // the log line must go too.
    let pw = crate::common::secret("{an:14}", "echo");
    let text = format!("password={pw}\nlogin attempt with {pw} failed\n");
    let out = builtin().scrub_text(&text).unwrap();
    assert!(!out.text.contains(&pw), "{}", out.text);
    assert_eq!(out.report.count("generic-password"), 2);
}

#[test]
fn overlapping_findings_merge_without_exposing_parts() {
    // A JWT inside a Bearer header inside a generic assignment: three rules,
    // one redaction, nothing left over.
    let jwt = crate::common::secret("eyJhbGciOiJIUzI1NiJ9.eyJ{b64u:40}.{b64u:43}", "jwt");
    let text = format!("auth_token: Bearer {jwt}");
    let out = builtin().scrub_text(&text).unwrap();
    assert!(!out.text.contains("eyJ"), "{}", out.text);
    assert_eq!(out.report.total(), 1, "{:?}", out.report);
}

#[test]
fn text_without_keywords_is_returned_unchanged() {
    let text = "The quick brown fox jumps over the lazy dog.\n".repeat(100);
    let out = builtin().scrub_text(&text).unwrap();
    assert_eq!(out.text, text);
    assert!(out.report.is_clean());
}

#[test]
fn placeholders_are_not_secrets() {
    let rules = builtin();
    for text in [
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
        "GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "password: ${DB_PASSWORD}",
        "api_key: <your-api-key>",
        "DATABASE_URL=postgres://app:changeme@localhost/app",
        "token: {{ vault_token }}",
        "password = \"dummy-password\"",
    ] {
        let out = rules.scrub_text(text).unwrap();
        assert!(out.report.is_clean(), "{text:?} -> {:?}", out.text);
    }
}

#[test]
fn json_strings_are_scrubbed_and_shape_is_kept() {
    let token = ghp("json");
    let value = json!({
        "ok": true,
        "count": 3,
        "items": [format!("token {token}"), "plain", null],
        "nested": {"deeper": [{"note": format!("use {token} here")}]},
    });
    let out = builtin().scrub_json(&value).unwrap();
    assert_eq!(
        out.value,
        json!({
            "ok": true,
            "count": 3,
            "items": ["token [REDACTED:github-pat]", "plain", null],
            "nested": {"deeper": [{"note": "use [REDACTED:github-pat] here"}]},
        })
    );
    assert_eq!(out.report.count("github-pat"), 2);
}

#[test]
fn json_key_names_give_context_to_values() {
    let value = json!({"password": "hunter2hunter2", "user": "alice", "db_passwd": "S3cure!pass"});
    let out = builtin().scrub_json(&value).unwrap();
    assert_eq!(
        out.value,
        json!({
            "password": "[REDACTED:generic-password]",
            "user": "alice",
            "db_passwd": "[REDACTED:generic-password]",
        })
    );
    // The same value with no telling key is not a secret on its own...
    let alone = builtin().scrub_json(&json!({"note": "hunter2hunter2"})).unwrap();
    assert!(alone.report.is_clean());
    // ...but once found anywhere in the document it is hidden everywhere.
    let echoed = builtin()
        .scrub_json(&json!({"password": "hunter2hunter2", "log": "tried hunter2hunter2"}))
        .unwrap();
    assert_eq!(echoed.value["log"], "tried [REDACTED:generic-password]");
}

#[test]
fn json_keys_are_scrubbed_and_stay_unique() {
    let a = ghp("key-a");
    let b = ghp("key-b");
    let value = json!({ a.clone(): 1, b.clone(): 2, "plain": 3 });
    let out = builtin().scrub_json(&value).unwrap();
    let obj = out.value.as_object().unwrap();
    assert_eq!(obj.len(), 3);
    assert!(obj.contains_key("[REDACTED:github-pat]"));
    assert!(obj.contains_key("[REDACTED:github-pat]#2"));
    let rendered = out.value.to_string();
    assert!(!rendered.contains(&a) && !rendered.contains(&b));
}

#[test]
fn json_output_stays_valid_json() {
    let key = crate::common::secret(
        "-----BEGIN PRIVATE KEY-----\n{b64:64}\n{b64:64}\n-----END PRIVATE KEY-----\n",
        "sa",
    );
    let value = json!({"type": "service_account", "private_key": key});
    let out = builtin().scrub_json(&value).unwrap();
    let text = serde_json::to_string(&out.value).unwrap();
    let reparsed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reparsed["private_key"], "[REDACTED:private-key]\n");
}

#[test]
fn oversized_input_is_an_error_not_a_pass_through() {
    let rules = builtin().with_max_input_bytes(64);
    let err = rules.scrub_text(&"a".repeat(65)).unwrap_err();
    assert_eq!(err, ScrubError::InputTooLarge { len: 65, max: 64 });
    assert!(rules.scrub_text(&"a".repeat(64)).is_ok());
    let err = rules.scrub_json(&json!(["a".repeat(40), "b".repeat(40)])).unwrap_err();
    assert!(matches!(err, ScrubError::InputTooLarge { max: 64, .. }));
}

#[test]
fn deep_json_is_an_error() {
    let mut value = json!("leaf");
    for _ in 0..10 {
        value = json!([value]);
    }
    let rules = builtin().with_max_json_depth(5);
    assert_eq!(rules.scrub_json(&value).unwrap_err(), ScrubError::TooDeep { max: 5 });
    assert!(builtin().with_max_json_depth(10).scrub_json(&value).is_ok());
}

#[test]
fn reports_and_results_never_print_secrets() {
    let token = ghp("debug");
    let rules = builtin();
    let out = rules.scrub_text(&format!("t={token}")).unwrap();
    let json_out = rules.scrub_json(&json!({ "t": token })).unwrap();
    for printed in [
        format!("{out:?}"),
        format!("{:?}", out.report),
        format!("{json_out:?}"),
        serde_json::to_string(&out.report).unwrap(),
        format!("{rules:?}"),
    ] {
        assert!(!printed.contains(&token), "{printed}");
    }
}

#[test]
fn strict_loading_lists_every_bad_rule() {
    let src = r#"
[[rules]]
id = "good"
regex = '''good_[a-z]{8}'''

[[rules]]
id = "bad-regex"
regex = '''(unclosed'''

[[rules]]
id = "bad-group"
regex = '''x(y)'''
secretGroup = 2

[[rules]]
id = "misspelt-field"
regex = '''z+'''
entropyy = 3.0

[[rules]]
description = "no id at all"
regex = '''q+'''
"#;
    let Err(LoadError::InvalidRules(rejected)) = RuleSet::from_toml_str(src) else {
        panic!("strict load must fail");
    };
    let ids: Vec<_> = rejected.iter().map(|r| r.rule_id.as_str()).collect();
    assert_eq!(ids, ["bad-regex", "bad-group", "misspelt-field", "rules[4]"]);
    let message = LoadError::InvalidRules(rejected).to_string();
    assert!(message.contains("bad-regex") && message.contains("secretGroup 2"), "{message}");

    let lenient = RuleSet::from_toml_str_lenient(src).unwrap();
    assert_eq!(lenient.rules.rule_count(), 1);
    assert_eq!(lenient.rejected.len(), 4);
}

#[test]
fn path_only_rules_are_skipped_with_a_reason() {
    let src = r#"
[[rules]]
id = "keystore-file"
path = '''\.p12$'''

[[rules]]
id = "real"
regex = '''real_[a-z]{8}'''
"#;
    let rules = RuleSet::from_toml_str(src).unwrap();
    assert_eq!(rules.rule_count(), 1);
    assert_eq!(rules.skipped().len(), 1);
    assert_eq!(rules.skipped()[0].rule_id, "keystore-file");
    assert!(rules.skipped()[0].reason.contains("path-only"));
}

#[test]
fn allowlist_targets_and_conditions_follow_gitleaks() {
    let src = r#"
[allowlist]
regexTarget = "line"
regexes = ['''#\s*test-fixture''']

[[rules]]
id = "tok"
regex = '''tok_([a-z0-9]{10})'''
keywords = ["tok_"]
  [[rules.allowlists]]
  condition = "AND"
  stopwords = ["aaaa"]
  regexes = ['''^aaaa''']
  [[rules.allowlists]]
  condition = "AND"
  paths = ['''\.md$''']
  stopwords = ["bbbb"]

[[rules]]
id = "other"
regex = '''oth_[a-z]{10}'''
"#;
    let rules = RuleSet::from_toml_str(src).unwrap();
    let found = |t: &str| rules.scrub_text(t).unwrap().report.total();
    assert_eq!(found("tok_abcdefghij"), 1);
    // Global line allowlist.
    assert_eq!(found("tok_abcdefghij # test-fixture"), 0);
    // AND: both the stop word and the regex hold.
    assert_eq!(found("tok_aaaa123456"), 0);
    // AND: only the stop word holds.
    assert_eq!(found("tok_x1aaaa2345"), 1);
    // AND with a path criterion can never hold for text.
    assert_eq!(found("tok_bbbb123456"), 1);
    assert_eq!(found("oth_abcdefghij"), 1);
}

#[test]
fn entropy_gate_uses_the_secret_group() {
    let src = r#"
[[rules]]
id = "gated"
regex = '''key=([a-z0-9]{12})'''
secretGroup = 1
entropy = 3.0
"#;
    let rules = RuleSet::from_toml_str(src).unwrap();
    assert_eq!(rules.scrub_text("key=aaaaaaaaaaaa").unwrap().report.total(), 0);
    assert_eq!(rules.scrub_text("key=a8f3k2m9x7q1").unwrap().text, "key=[REDACTED:gated]");
}

#[test]
fn document_level_problems_are_errors() {
    assert!(matches!(RuleSet::from_toml_str("not = [toml"), Err(LoadError::Toml(_))));
    assert!(matches!(
        RuleSet::from_toml_str("[extend]\nuseDefault = true\n"),
        Err(LoadError::Unsupported(_))
    ));
    assert!(matches!(RuleSet::from_toml_str("title = \"empty\"\n"), Err(LoadError::NoRules)));
    assert!(matches!(
        RuleSet::from_toml_str("[[rule]]\nid = \"typo\"\nregex = 'x'\n"),
        Err(LoadError::Toml(_))
    ));
    let dup = "[[rules]]\nid = \"a\"\nregex = 'x'\n[[rules]]\nid = \"a\"\nregex = 'y'\n";
    assert!(
        matches!(RuleSet::from_toml_str(dup), Err(LoadError::DuplicateRuleId(id)) if id == "a")
    );
}

#[test]
fn config_selects_builtin_file_or_both() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(OPERATOR_RULES.as_bytes()).unwrap();
    let path = file.path().to_owned();
    let builtin_count = builtin().rule_count();

    let both =
        RuleSet::from_config(&ScrubConfig { use_builtin: true, rules_file: Some(path.clone()) })
            .unwrap();
    assert_eq!(both.rule_count(), builtin_count + 1);
    let token = crate::common::secret("acme_{loan:24}", "acme");
    let text = format!("{token} {}", ghp("both"));
    let out = both.scrub_text(&text).unwrap();
    assert_eq!(out.text, "[REDACTED:acme-internal-token] [REDACTED:github-pat]");

    let only_file =
        RuleSet::from_config(&ScrubConfig { use_builtin: false, rules_file: Some(path) }).unwrap();
    assert_eq!(only_file.rule_count(), 1);

    let only_builtin = RuleSet::from_config(&ScrubConfig::default()).unwrap();
    assert_eq!(only_builtin.rule_count(), builtin_count);

    assert!(matches!(
        RuleSet::from_config(&ScrubConfig { use_builtin: false, rules_file: None }),
        Err(LoadError::NoRules)
    ));
    assert!(matches!(
        RuleSet::from_config(&ScrubConfig {
            use_builtin: false,
            rules_file: Some("/nonexistent/rules.toml".into()),
        }),
        Err(LoadError::Io { .. })
    ));
}

#[test]
fn config_file_reusing_a_builtin_id_is_refused() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(b"[[rules]]\nid = \"github-pat\"\nregex = 'ghp_x'\n").unwrap();
    let path = file.path().to_owned();
    let err = RuleSet::from_config(&ScrubConfig { use_builtin: true, rules_file: Some(path) })
        .unwrap_err();
    assert!(matches!(err, LoadError::DuplicateRuleId(id) if id == "github-pat"));
}

#[test]
fn config_deserialises_with_defaults_and_refuses_typos() {
    let cfg: ScrubConfig = toml::from_str("").unwrap();
    assert_eq!(cfg, ScrubConfig::default());
    assert!(cfg.use_builtin);
    let cfg: ScrubConfig =
        toml::from_str("use_builtin = false\nrules_file = \"/etc/x.toml\"").unwrap();
    assert!(!cfg.use_builtin);
    assert_eq!(cfg.rules_file.as_deref(), Some(std::path::Path::new("/etc/x.toml")));
    assert!(toml::from_str::<ScrubConfig>("use_builtins = false").is_err());
}

#[test]
fn rule_set_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<RuleSet>();
    let rules = std::sync::Arc::new(builtin());
    let token = ghp("threads");
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let rules = std::sync::Arc::clone(&rules);
            let text = format!("t={token}");
            std::thread::spawn(move || rules.scrub_text(&text).unwrap().report.total())
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 1);
    }
}

/// Found by the `scrub` fuzz target: a secret reached by a rule only once
/// another secret before it was redacted (the `mysql … -p…` rule allows at
/// most 100 characters between the two) survived a single pass.
#[test]
fn a_secret_reached_only_after_a_redaction_is_redacted_too() {
    let long = crate::common::secret("{an:110}", "first-password");
    let flag = crate::common::secret("{an:14}", "mysql-flag");
    let text = format!("mysql -u ro password:{long} -p{flag} appdb");
    let rules = builtin();

    let scrubbed = rules.scrub_text(&text).unwrap();

    assert!(!scrubbed.text.contains(&long), "{}", scrubbed.text);
    assert!(!scrubbed.text.contains(&flag), "{}", scrubbed.text);
    assert_eq!(scrubbed.report.count("cli-password-argument"), 1, "{:?}", scrubbed.report);
    assert!(rules.scrub_text(&scrubbed.text).unwrap().report.is_clean());
    let in_json = rules.scrub_json(&json!({"command": text})).unwrap();
    assert_eq!(in_json.value["command"], json!(scrubbed.text));
}

/// A rule that matches a letter of `REDACTED` once redacted the marker's own
/// letters on the next pass, and each pass multiplied the markers until the
/// text reached the size limit: seconds of work for a few kilobytes (found
/// by fuzzing the gitleaks loader). Markers are the scrubber's own text and
/// are left alone; the passes settle.
#[test]
fn a_rule_that_matches_inside_markers_does_not_redact_them_again() {
    let rules = RuleSet::from_toml_str(
        r#"
[[rules]]
id = "capital"
description = "one capital letter after a space or a bracket"
regex = '''(?:^|[ \[])([A-Z])'''
secretGroup = 1
"#,
    )
    .unwrap();
    let text = "Alpha Beta Gamma ".repeat(200);
    let scrubbed = rules.scrub_text(&text).unwrap();
    assert_eq!(scrubbed.report.count("capital"), 600, "{:?}", scrubbed.report);
    let marker = "[REDACTED:capital]";
    assert_eq!(scrubbed.text, format!("{marker}lpha {marker}eta {marker}amma ").repeat(200));
    assert!(rules.scrub_text(&scrubbed.text).unwrap().report.is_clean());
}

/// Something shaped like a marker but naming no rule is text like any
/// other: a secret cannot hide in `[REDACTED:<secret>]` (found by fuzzing
/// the gitleaks loader, whose rules' own markers are recognised and no
/// other).
#[test]
fn a_secret_inside_a_marker_of_no_rule_is_redacted() {
    let rules = RuleSet::builtin().unwrap();
    let token = "ghp_R7kP2mX9qL4vN8wZ3tY6bH1cJ5dF0gS2aE7u";
    for text in [format!("[REDACTED:{token}]"), format!("see [REDACTED:x] {token} [REDACTED:y]")] {
        let scrubbed = rules.scrub_text(&text).unwrap();
        assert!(!scrubbed.text.contains(token), "{}", scrubbed.text);
        assert!(!scrubbed.report.is_clean(), "{text}");
    }
}
