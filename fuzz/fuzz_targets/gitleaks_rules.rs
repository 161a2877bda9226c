//! An operator's gitleaks rules file (TOML, with Go regular expressions that
//! are translated to Rust's), and the scrubbing of a text with the rules it
//! yields.
//!
//! Input: the TOML document, a NUL byte, then the text to scrub.
//!
//! Invariants:
//! - loading never panics, however the document or its regexes are formed;
//! - the strict load accepts exactly the documents the lenient load accepts
//!   without rejecting a rule, with the same rules;
//! - the rules that load scrub any text without an internal error, or
//!   refuse it whole (fail closed), and what they report is gone from the
//!   output.
#![no_main]

use foldgate_scrub::{RuleSet, ScrubError, fuzzing::unredacted};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let (doc, text) = match input.iter().position(|&b| b == 0) {
        Some(at) => (&input[..at], &input[at + 1..]),
        None => (input, &b""[..]),
    };
    let (Ok(doc), Ok(text)) = (std::str::from_utf8(doc), std::str::from_utf8(text)) else {
        return;
    };
    let strict = RuleSet::from_toml_str(doc);
    let lenient = RuleSet::from_toml_str_lenient(doc);
    match (&strict, &lenient) {
        (Ok(strict), Ok(lenient)) => {
            assert!(lenient.rejected.is_empty(), "strict accepted what lenient rejected");
            assert_eq!(
                strict.rule_ids().collect::<Vec<_>>(),
                lenient.rules.rule_ids().collect::<Vec<_>>()
            );
        }
        (Ok(_), Err(e)) => panic!("strict accepted a document lenient refused: {e}"),
        (Err(_), _) => {}
    }
    let Ok(load) = lenient else { return };
    let rules = load.rules;
    let found = rules.detect(text);
    match rules.scrub_text(text) {
        Ok(scrubbed) => {
            // Each distinct secret once, against the output's unredacted
            // text computed once: thousands of findings of one letter each
            // made this check, not the scrubbing, take tens of seconds.
            let shown = unredacted(&scrubbed.text, &rules);
            let secrets: std::collections::BTreeMap<&str, &str> =
                found.iter().map(|(span, rule)| (&text[span.clone()], *rule)).collect();
            for (secret, rule) in secrets {
                assert!(
                    !shown.iter().any(|part| part.contains(secret)),
                    "{rule} reported {secret:?}, which survived in {:?}",
                    scrubbed.text
                );
            }
        }
        Err(ScrubError::InputTooLarge { .. } | ScrubError::Internal(_)) => {}
        Err(e) => panic!("scrubbing failed: {e}"),
    }
});
