//! The wire formats, checked without a server.

use super::*;

fn answer(text: Option<&str>, calls: &[(&str, &str, Value)]) -> Answer {
    Answer {
        text: text.map(str::to_owned),
        calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall::new(*id, *name, args.clone()))
            .collect(),
        usage: Usage { input_tokens: 12, output_tokens: 5 },
    }
}

fn turn() -> Turn {
    Turn { number: 1, model: "gpt-test".to_owned(), created: 0 }
}

fn data(frame: &str) -> Value {
    let data = frame.lines().find_map(|l| l.strip_prefix("data: ")).expect("a data line");
    serde_json::from_str(data).expect("JSON data")
}

#[test]
fn pieces_split_at_char_boundaries_into_several_parts() {
    let cases: [(&str, Vec<&str>); 5] = [
        ("", vec![]),
        ("a", vec!["a"]),
        ("ab", vec!["a", "b"]),
        ("abcdefg", vec!["abc", "def", "g"]),
        ("héllo wörld", vec!["héll", "o wö", "rld"]),
    ];
    for (text, expected) in cases {
        assert_eq!(pieces(text), expected, "pieces of {text:?}");
        assert_eq!(pieces(text).concat(), text, "pieces of {text:?} rejoin");
    }
}

#[test]
fn openai_usage_chunk_only_when_asked() {
    let answer = answer(Some("hello there"), &[]);
    for include_usage in [false, true] {
        let frames = openai_chunks(&turn(), &answer, include_usage);
        assert_eq!(frames.last().map(String::as_str), Some("data: [DONE]\n\n"));
        let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| data(f)).collect();
        let with_counts: Vec<&Value> =
            chunks.iter().filter(|c| c.get("usage").is_some_and(|u| !u.is_null())).collect();
        if include_usage {
            assert!(chunks.iter().all(|c| c.get("usage").is_some()), "every chunk has usage");
            assert_eq!(with_counts.len(), 1, "one chunk with counts");
            assert_eq!(with_counts[0]["choices"], json!([]), "the usage chunk has no choices");
            assert_eq!(with_counts[0]["usage"]["total_tokens"], 17);
            assert!(std::ptr::eq(with_counts[0], chunks.last().unwrap()), "and comes last");
        } else {
            assert!(chunks.iter().all(|c| c.get("usage").is_none()), "no usage field at all");
        }
    }
}

#[test]
fn openai_tool_call_fragments_rejoin_to_the_arguments() {
    let args = json!({"path": "/etc/hosts", "lines": [1, 2]});
    let answer = answer(None, &[("call_a", "read", args.clone()), ("call_b", "list", json!({}))]);
    let frames = openai_chunks(&turn(), &answer, false);
    let mut joined = [String::new(), String::new()];
    let mut fragments = [0, 0];
    for frame in &frames[..frames.len() - 1] {
        let chunk = data(frame);
        for call in chunk["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            joined[index].push_str(call["function"]["arguments"].as_str().unwrap());
            fragments[index] += 1;
        }
    }
    assert_eq!(serde_json::from_str::<Value>(&joined[0]).unwrap(), args);
    assert_eq!(joined[1], "{}");
    assert!(fragments[0] > 2, "the arguments arrive in several deltas: {fragments:?}");
    let first = data(&frames[0]);
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "the first delta has the role");
    assert_eq!(first["choices"][0]["delta"]["tool_calls"][0]["id"], "call_a");
    let finish = data(&frames[frames.len() - 2]);
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn anthropic_events_in_order_with_usage_split() {
    let answer = answer(Some("Looking."), &[("toolu_1", "read", json!({"path": "/a"}))]);
    let events = anthropic_events(&turn(), &answer);
    let names: Vec<&str> =
        events.iter().map(|e| e.lines().next().unwrap().trim_start_matches("event: ")).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 3]);
    expected.extend(["content_block_stop", "content_block_start"]);
    expected.extend(["content_block_delta"; 4]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    let start = data(&events[0]);
    assert_eq!(start["message"]["usage"]["input_tokens"], 12);
    let delta = data(&events[events.len() - 2]);
    assert_eq!(delta["usage"]["output_tokens"], 5);
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
}

#[test]
fn markers_pick_the_latest_mentioned_script() {
    let mut script = Script::default();
    script.marked.push(("[parent]".into(), VecDeque::from([Reply::text("parent", 1, 1)])));
    script.marked.push(("[child]".into(), VecDeque::from([Reply::text("child", 1, 1)])));
    script.unmarked.push_back(Reply::text("plain", 1, 1));
    let request = |body: Value| RecordedRequest {
        provider: Provider::Anthropic,
        headers: HeaderMap::new(),
        body,
        stream: false,
    };
    let cases = [
        (
            json!({
                "system": "[parent] rules",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "go [child]"}]}
                ]
            }),
            Ok("child"),
            "the child's marker is in a later turn than the parent's",
        ),
        (json!({"messages": [{"role": "user", "content": "hi"}]}), Ok("plain"), "no marker"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            Err(()),
            "unmarked queue used up",
        ),
        (
            json!({"messages": [{"role": "user", "content": "[child] again"}]}),
            Err(()),
            "the marked queue is used up and does not fall back",
        ),
    ];
    for (body, expected, why) in cases {
        let got = script.next_reply(&request(body)).map(|reply| match reply {
            Reply::Text { text, .. } => text,
            other => panic!("unexpected {other:?}"),
        });
        assert_eq!(got.as_deref().map_err(|_| ()), expected, "{why}");
    }
}
