//! Scrubbing arbitrary text, and the same text inside JSON, with the
//! built-in rules.
//!
//! Invariants:
//! - what the scanner reports in a text is gone from its scrubbed output,
//!   and so is every other occurrence of it;
//! - text the scanner reports nothing in comes back unchanged;
//! - scrubbing is stable: scrubbing the output again finds nothing more;
//! - a JSON value keeps its shape, and its strings are scrubbed as the text
//!   scrubber scrubs them.
#![no_main]

use std::sync::LazyLock;

use foldgate_scrub::{RuleSet, ScrubError, fuzzing::unredacted};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

static RULES: LazyLock<RuleSet> = LazyLock::new(|| RuleSet::builtin().expect("built-in rules"));

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else { return };
    let found = RULES.detect(text);
    let scrubbed = match RULES.scrub_text(text) {
        Ok(scrubbed) => scrubbed,
        Err(ScrubError::InputTooLarge { .. }) => return,
        Err(e) => panic!("scrubbing failed: {e}"),
    };
    if found.is_empty() {
        assert_eq!(scrubbed.text, text, "a text without findings was changed");
        assert!(scrubbed.report.is_clean());
    }
    for (span, rule) in &found {
        let secret = &text[span.clone()];
        assert!(
            !unredacted(&scrubbed.text, &RULES).iter().any(|part| part.contains(secret)),
            "{rule} reported {secret:?}, which survived in {:?}",
            scrubbed.text
        );
    }
    let again = RULES.scrub_text(&scrubbed.text).expect("the output scrubs");
    assert!(again.report.is_clean(), "a second pass found more in {:?}", scrubbed.text);

    let value = json!({"content": [{"type": "text", "text": text}], "k": [text, 1, null]});
    let in_json = RULES.scrub_json(&value).expect("JSON of a scrubbable text scrubs");
    assert_eq!(in_json.value["content"][0]["text"], Value::String(scrubbed.text.clone()));
    assert_eq!(in_json.value["k"][0], Value::String(scrubbed.text.clone()));
    assert_eq!(in_json.value["k"][1], json!(1));
    assert_eq!(in_json.report.total(), 2 * scrubbed.report.total());
});
