//! The metered path's own rules: counting, cutting, forwarding `_meta`.

use foldgate_engine::Encoding;

use super::*;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase).unwrap()
}

#[test]
fn result_tokens_count_what_a_model_reads() {
    let t = counter();
    let text = json!({"content": [{"type": "text", "text": "hello world"}]});
    assert_eq!(result_tokens(&t, &text), 2);
    // A structured result that is also given as text is counted once,
    // as its content.
    let both = json!({
        "content": [{"type": "text", "text": "{\"a\": 1}"}],
        "structuredContent": {"a": 1},
    });
    assert_eq!(result_tokens(&t, &both), t.count("{\"a\": 1}"));
    // As the Python SDK's servers shape a tool that returns a string:
    // the text, and the same text wrapped in `{"result": …}`.
    let file = "fn flush(&mut self) -> io::Result<()> { self.inner.flush() }\n".repeat(40);
    let wrapped = json!({
        "content": [{"type": "text", "text": file}],
        "structuredContent": {"result": file},
    });
    assert_eq!(result_tokens(&t, &wrapped), t.count(&file), "the file once");
    let structured_only = json!({"content": [], "structuredContent": {"a": 1}});
    assert_eq!(result_tokens(&t, &structured_only), t.count("{\"a\":1}"));
    let resource = json!({"content": [{"type": "resource", "resource": {"uri": "file:///x", "text": "hello world"}}]});
    assert_eq!(result_tokens(&t, &resource), 2);
}

#[test]
fn truncation_fits_the_room_and_marks_it() {
    let t = counter();
    let long = "word ".repeat(500);
    let mut result = json!({
        "content": [{"type": "text", "text": "first"}, {"type": "text", "text": long}, {"type": "text", "text": "third"}],
        "structuredContent": {"big": true},
        "_meta": {"upstream/extra": "x".repeat(2_000)},
    });
    let total = result_tokens(&t, &result);
    let id = BranchId::generate();
    let original = result.clone();
    let returned = Cut::Budget { force_returned: Some(id) };
    let shown = truncate_result(&t, &mut result, 100, total, returned, false);
    assert!(shown <= 100, "{shown}");
    assert_eq!(result_tokens(&t, &result), shown);
    let content = result["content"].as_array().unwrap();
    assert_eq!(content.len(), 3, "first, the cut second, the marker");
    let marker = content[2]["text"].as_str().unwrap();
    assert!(marker.contains("truncated") && marker.contains(&id.to_string()), "{marker}");
    assert!(result.get("structuredContent").is_none());
    assert_eq!(result["isError"], true, "structured content cut away: an error result");
    assert!(result.get("_meta").is_none(), "the upstream's _meta goes with the cut");

    // A branch whose remaining budget is lent to children is not
    // returned, and the marker does not say it is.
    let mut lent = original.clone();
    truncate_result(&t, &mut lent, 100, total, Cut::Budget { force_returned: None }, false);
    let marker = lent["content"].as_array().unwrap().last().unwrap()["text"].as_str().unwrap();
    assert!(marker.contains("truncated") && !marker.contains("force-returned"), "{marker}");

    // Too little room for the full marker: the short one, and no
    // content cut to nothing.
    let mut tight = original.clone();
    let shown = truncate_result(&t, &mut tight, 20, total, returned, false);
    let content = tight["content"].as_array().unwrap();
    assert_eq!(content[0]["text"], "first", "{content:?}");
    let marker = content.last().unwrap()["text"].as_str().unwrap();
    assert_eq!(marker, "\n[foldgate: result truncated at the branch's token budget]");
    assert!(content.iter().all(|c| c["text"] != ""), "no item cut to nothing: {content:?}");
    assert!(shown <= 20, "{shown}");

    // Nothing granted: the marker alone, even if it is more than that.
    let mut ended = original;
    let shown = truncate_result(&t, &mut ended, 0, total, Cut::Ended(id), false);
    let content = ended["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{content:?}");
    let marker = content[0]["text"].as_str().unwrap();
    assert!(marker.contains("withheld") && marker.contains(&id.to_string()), "{marker}");
    assert_eq!(shown, t.count(marker));
}

#[test]
fn a_cut_result_of_a_tool_with_an_output_schema_is_an_error() {
    let t = counter();
    let why = Cut::Budget { force_returned: None };
    let text = json!({"content": [{"type": "text", "text": "word ".repeat(300)}]});
    let total = result_tokens(&t, &text);
    let mut plain = text.clone();
    truncate_result(&t, &mut plain, 50, total, why, false);
    assert!(plain.get("isError").is_none(), "a plain text result stays a result: {plain}");
    let mut schema_bound = text;
    truncate_result(&t, &mut schema_bound, 50, total, why, true);
    assert_eq!(schema_bound["isError"], true, "{schema_bound}");
}

#[test]
fn a_cut_error_message_is_marked() {
    let t = counter();
    let message = "the disk is on fire ".repeat(50);
    let total = t.count(&message);
    let why = Cut::Budget { force_returned: None };
    let cut = cut_text(&t, &message, 60, total, why);
    assert!(t.count(&cut) <= 60, "{cut}");
    assert!(cut.starts_with("the disk is on fire") && cut.contains("[foldgate: result"), "{cut}");
    let nothing = cut_text(&t, &message, 0, total, why);
    assert_eq!(nothing, "[foldgate: result truncated at the branch's token budget]");
}

#[test]
fn small_text_is_told_from_large() {
    let small = json!({"content": [{"type": "text", "text": "a".repeat(100)}], "isError": false});
    assert!(text_within(&small, &mut { INLINE_TEXT_BYTES }));
    let long_string = json!({"content": [{"type": "text", "text": "a".repeat(300)}]});
    assert!(!text_within(&long_string, &mut { INLINE_TEXT_BYTES }));
    let many_items = json!({"content": vec![json!({"type": "text", "text": "abcdefgh"}); 40]});
    assert!(!text_within(&many_items, &mut { INLINE_TEXT_BYTES }));
    let mut room = 10;
    assert!(text_within(&json!({"ab": "cd"}), &mut room));
    assert_eq!(room, 6, "keys and values are counted");
}

#[test]
fn foldgate_and_connection_keys_are_not_forwarded() {
    let meta: Map<String, Value> = [
        ("foldgate/branch_id".to_owned(), json!("x")),
        ("io.modelcontextprotocol/protocolVersion".to_owned(), json!("2026-07-28")),
        ("progressToken".to_owned(), json!(1)),
        ("team/trace".to_owned(), json!("kept")),
    ]
    .into_iter()
    .collect();
    let forwarded = forwarded_meta(Some(&meta), None).unwrap();
    assert_eq!(forwarded.len(), 1);
    assert!(forwarded.contains_key("team/trace"));
    assert_eq!(forwarded_meta(None, None), None);

    // A listener's own token and log level replace the agent's.
    let (sink, _) = tokio::sync::mpsc::channel(1);
    let listener = Listener::new(sink, true, Some("info"), None);
    let forwarded = forwarded_meta(Some(&meta), Some(&listener)).unwrap();
    assert_eq!(forwarded["progressToken"], json!(listener.token().unwrap()));
    assert_ne!(forwarded["progressToken"], json!(1));
    assert_eq!(forwarded[LOG_LEVEL_META_KEY], json!("info"));
    assert_eq!(forwarded.len(), 3);
}
