//! Anthropic Messages: the JSON answer and the SSE events.

use super::*;

pub(super) fn anthropic_usage(input_tokens: u32, output_tokens: u32) -> Value {
    json!({
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens,
        "service_tier": "standard",
    })
}

pub(super) fn anthropic_stop_reason(answer: &Answer) -> &'static str {
    if answer.calls.is_empty() { "end_turn" } else { "tool_use" }
}

pub(super) fn anthropic_message(turn: &Turn, answer: &Answer) -> Value {
    let text = answer.text.iter().map(|text| json!({"type": "text", "text": text}));
    let calls = answer.calls.iter().map(|call| {
        json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
    });
    json!({
        "id": format!("msg_{}", turn.number),
        "type": "message",
        "role": "assistant",
        "model": turn.model,
        "content": text.chain(calls).collect::<Vec<_>>(),
        "stop_reason": anthropic_stop_reason(answer),
        "stop_sequence": null,
        "usage": anthropic_usage(answer.usage.input_tokens, answer.usage.output_tokens),
    })
}

/// The named SSE events of one answer: `message_start` (with the input
/// tokens), a `ping`, each content block as `content_block_start`, its
/// `text_delta` or `input_json_delta` fragments and `content_block_stop`,
/// then `message_delta` (stop reason and output tokens) and `message_stop`.
pub(super) fn anthropic_events(turn: &Turn, answer: &Answer) -> Vec<String> {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let early_usage = anthropic_usage(answer.usage.input_tokens, answer.usage.output_tokens.min(1));
    let mut events = vec![event(
        "message_start",
        json!({
            "type": "message_start",
            "message": {
                "id": format!("msg_{}", turn.number),
                "type": "message",
                "role": "assistant",
                "model": turn.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                // The real API reports a token or so of output this early.
                "usage": early_usage,
            },
        }),
    )];
    let mut index = 0;
    let mut block = |events: &mut Vec<String>, start: Value, deltas: Vec<Value>| {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        if index == 0 {
            events.push(event("ping", json!({"type": "ping"})));
        }
        for delta in deltas {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    };
    if let Some(text) = &answer.text {
        let deltas = pieces(text).into_iter().map(|p| json!({"type": "text_delta", "text": p}));
        block(&mut events, json!({"type": "text", "text": ""}), deltas.collect());
    }
    for call in &answer.calls {
        let arguments = call.arguments.to_string();
        // The first fragment is empty, as the real API's is.
        let deltas = std::iter::once("")
            .chain(pieces(&arguments))
            .map(|p| json!({"type": "input_json_delta", "partial_json": p}));
        let start = json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
        block(&mut events, start, deltas.collect());
    }
    events.push(event(
        "message_delta",
        json!({
            "type": "message_delta",
            "delta": {"stop_reason": anthropic_stop_reason(answer), "stop_sequence": null},
            "usage": {"output_tokens": answer.usage.output_tokens},
        }),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}
