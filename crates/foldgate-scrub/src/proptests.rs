//! Property tests: the scrubber never panics, never refuses input within
//! its limits, and never returns a value it detected.
//!
//! They live inside the crate so they can see the raw findings (the secret
//! values themselves), which the public API deliberately never exposes.

use std::sync::LazyLock;

use proptest::prelude::*;
use serde_json::json;

use crate::RuleSet;

static RULES: LazyLock<RuleSet> = LazyLock::new(|| RuleSet::builtin().unwrap());

/// Fragments that steer generated text towards rule prefixes, separators
/// and context words, so that the interesting code paths are exercised.
const FRAGMENTS: &[&str] = &[
    "ghp_",
    "github_pat_11",
    "glpat-",
    "AKIA",
    "sk-ant-api03-",
    "sk-proj-",
    "sk_live_",
    "xoxb-",
    "hf_",
    "eyJ",
    "eyJhbGciOiJIUzI1NiJ9.",
    "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\\n",
    "postgres://",
    "https://user:",
    "@",
    ":",
    "password=",
    "\"password\": \"",
    "api_key: ",
    "token=",
    "Authorization: Bearer ",
    "Authorization: Basic ",
    "[REDACTED:github-pat]",
    "[REDACTED:",
    "${",
    "}",
    "\"",
    "'",
    "\n",
    "\r\n",
    " ",
    "=",
    "é",
    "日本",
    "\u{0}",
];

/// Text assembled from fragments, random token-ish runs and arbitrary
/// Unicode.
fn secretish_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => proptest::sample::select(FRAGMENTS).prop_map(str::to_owned),
        3 => "[A-Za-z0-9]{1,60}",
        1 => "[A-Za-z0-9+/=_-]{1,80}",
        1 => any::<String>().prop_map(|s| s.chars().take(12).collect::<String>()),
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|parts| parts.concat())
}

/// Replaces every `[REDACTED:…]` marker with a separator that cannot be part
/// of a secret, so that only text copied from the input remains to check.
fn strip_markers(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("[REDACTED:") {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        match after.find(']') {
            Some(end) => {
                out.push('\u{1}');
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(after);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The values the scrubber detected in `text`.
fn detected(text: &str) -> Vec<String> {
    RULES.find(text).iter().map(|f| text[f.start..f.end].to_owned()).collect()
}

fn assert_no_detected_value_survives(input: &str, output: &str) -> Result<(), TestCaseError> {
    let visible = strip_markers(output);
    for secret in detected(input) {
        prop_assert!(
            !visible.contains(&secret),
            "detected value {:?} survived in {:?}",
            secret,
            output
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics_or_fails(text in any::<String>()) {
        let out = RULES.scrub_text(&text);
        prop_assert!(out.is_ok(), "{:?}", out.err());
    }

    #[test]
    fn detected_values_never_survive_in_text(text in secretish_text()) {
        let out = RULES.scrub_text(&text);
        prop_assert!(out.is_ok(), "{:?}", out.as_ref().err());
        if let Ok(out) = out {
            assert_no_detected_value_survives(&text, &out.text)?;
            if detected(&text).is_empty() {
                prop_assert_eq!(&out.text, &text);
                prop_assert!(out.report.is_clean());
            } else {
                prop_assert!(out.report.total() > 0);
            }
        }
    }

    #[test]
    fn json_scrub_keeps_shape_and_hides_values(
        a in secretish_text(),
        b in secretish_text(),
        n in any::<i64>(),
    ) {
        let value = json!({ "password": a, "note": [b, n, null, {"nested": a}], "k": true });
        let out = RULES.scrub_json(&value);
        prop_assert!(out.is_ok(), "{:?}", out.as_ref().err());
        if let Ok(out) = out {
            let object = out.value.as_object().unwrap();
            prop_assert_eq!(object.len(), 3);
            prop_assert_eq!(&out.value["note"][1], &json!(n));
            prop_assert_eq!(&out.value["k"], &json!(true));
            let rendered = serde_json::to_string(&out.value).unwrap();
            let reparsed: serde_json::Value = serde_json::from_str(&rendered).unwrap();
            prop_assert_eq!(&reparsed, &out.value);
            for (input, output) in [
                (&a, &out.value["note"][3]["nested"]),
                (&b, &out.value["note"][0]),
            ] {
                assert_no_detected_value_survives(input, output.as_str().unwrap())?;
            }
        }
    }
}

#[test]
fn strip_markers_removes_only_markers() {
    assert_eq!(strip_markers("a[REDACTED:x]b[REDACTED:y"), "a\u{1}b[REDACTED:y");
}
