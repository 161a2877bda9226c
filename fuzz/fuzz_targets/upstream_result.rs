//! An upstream's answer to a tool call, as the metered call path treats it:
//! scrubbed, counted, cut to what a branch's charge granted, and read as the
//! tool result the agent receives.
//!
//! Input: four bytes of room (the tokens the charge grants), one byte of
//! flags, then the answer as JSON.
//!
//! Invariants:
//! - the gateway's token count of any text equals the tokenizer's own
//!   (the fast path agrees with tiktoken);
//! - scrubbing keeps the answer's shape, and what the scanner reports in
//!   its strings is gone from them;
//! - a cut result shows at most the room, or its marker alone when even that
//!   is more than the room; what it shows is what it is counted as; it keeps
//!   its content items in order and says it was cut;
//! - a result that was a valid tool result stays one once cut, and an
//!   answer that is not an object is never taken for one.
#![no_main]

use std::sync::LazyLock;

use foldgate_engine::{Encoding, TokenCounter};
use foldgate_scrub::RuleSet;
use foldgate_upstream::meter::fuzzing::{deliver, tokens_of};
use libfuzzer_sys::fuzz_target;
use rmcp::model::CallToolResult;
use serde_json::Value;

static TOKENS: LazyLock<TokenCounter> =
    LazyLock::new(|| TokenCounter::new(Encoding::O200kBase).expect("the tokenizer loads"));
static RULES: LazyLock<RuleSet> = LazyLock::new(|| RuleSet::builtin().expect("built-in rules"));

fn strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 5 {
        return;
    }
    let room = u64::from(u32::from_le_bytes([input[0], input[1], input[2], input[3]]) % 4096);
    let flags = input[4];
    let Ok(raw) = serde_json::from_slice::<Value>(&input[5..]) else { return };

    let mut texts = Vec::new();
    strings(&raw, &mut texts);
    let texts: Vec<String> = texts.into_iter().map(str::to_owned).collect();
    for text in &texts {
        let (_, exact) = TOKENS.truncate(text, u64::MAX);
        assert_eq!(TOKENS.count(text), exact, "the fast count differs on {text:?}");
    }
    let valid_before = serde_json::from_value::<CallToolResult>(raw.clone()).is_ok();
    let secrets: Vec<String> = texts
        .iter()
        .flat_map(|text| RULES.detect(text).into_iter().map(|(span, _)| text[span].to_owned()))
        .collect();

    let delivered = deliver(&*RULES, &TOKENS, raw, room, flags & 1 == 1, flags & 2 == 2);
    let Some(scrubbed) = delivered.scrubbed else { return };
    let mut after = Vec::new();
    strings(&scrubbed, &mut after);
    assert_eq!(after.len(), texts.len(), "scrubbing changed the answer's shape");
    for secret in &secrets {
        assert!(
            !after.iter().any(|s| unredacted(s).contains(secret.as_str())),
            "a reported secret survived scrubbing: {secret:?}"
        );
    }
    assert_eq!(delivered.total, tokens_of(&TOKENS, &scrubbed), "charged tokens");
    if !scrubbed.is_object() {
        // Not a tool result: the call fails as unreadable.
        assert!(matches!(delivered.result, Some(Err(_))), "{:?}", delivered.result);
        return;
    }
    if let Some((cut, shown)) = &delivered.cut {
        let content = cut["content"].as_array().expect("a cut result has content");
        let marker = content.last().and_then(|m| m["text"].as_str()).expect("a marker");
        assert!(marker.contains("[foldgate: result"), "the last item says it was cut");
        let marker_tokens = TOKENS.count(marker);
        assert!(*shown <= room.max(marker_tokens), "showed {shown} of room {room}");
        assert_eq!(*shown, tokens_of(&TOKENS, cut), "shown is what is counted");
        assert!(cut.get("structuredContent").is_none());
        if valid_before {
            assert!(
                matches!(delivered.result, Some(Ok(_))),
                "a valid tool result became invalid once cut: {:?}",
                delivered.result
            );
        }
    } else if valid_before {
        assert!(matches!(delivered.result, Some(Ok(_))));
    }
});

/// A string with each redaction marker replaced by a NUL, so that a secret
/// that happens to spell part of a marker is not taken for one that
/// survived.
fn unredacted(text: &str) -> String {
    let mut text = text.to_owned();
    for id in RULES.rule_ids() {
        text = text.replace(&format!("[REDACTED:{id}]"), "\0");
    }
    text
}
