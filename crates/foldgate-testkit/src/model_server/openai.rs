//! OpenAI Chat Completions: the JSON answer and the SSE chunks.

use super::*;

pub(super) fn openai_usage(usage: Usage) -> Value {
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": u64::from(usage.input_tokens) + u64::from(usage.output_tokens),
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0
        }
    })
}

pub(super) fn openai_finish_reason(answer: &Answer) -> &'static str {
    if answer.calls.is_empty() { "stop" } else { "tool_calls" }
}

pub(super) fn openai_completion(turn: &Turn, answer: &Answer) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": answer.text,
        "refusal": null,
        "annotations": [],
    });
    if !answer.calls.is_empty() {
        let calls: Vec<Value> = answer
            .calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments.to_string()},
                })
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": format!("chatcmpl-{}", turn.number),
        "object": "chat.completion",
        "created": turn.created,
        "model": turn.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": openai_finish_reason(answer),
        }],
        "usage": openai_usage(answer.usage),
        "service_tier": "default",
        "system_fingerprint": "fp_foldgate",
    })
}

/// The `chat.completion.chunk` frames of one answer, ending with
/// `data: [DONE]`.
///
/// As the real API does: the first delta carries the role; a tool call's
/// first delta carries its index, id, name and empty arguments, later ones
/// only the index and an argument fragment; the finish reason comes in a
/// delta of its own; and only when `stream_options.include_usage` is set do
/// all chunks carry `usage: null` and a last chunk with empty `choices`
/// carry the counts.
pub(super) fn openai_chunks(turn: &Turn, answer: &Answer, include_usage: bool) -> Vec<String> {
    let frame = |choices: Value, usage: Option<Value>| {
        let mut chunk = json!({
            "id": format!("chatcmpl-{}", turn.number),
            "object": "chat.completion.chunk",
            "created": turn.created,
            "model": turn.model,
            "service_tier": "default",
            "system_fingerprint": "fp_foldgate",
            "choices": choices,
        });
        if include_usage {
            chunk["usage"] = usage.unwrap_or(Value::Null);
        }
        format!("data: {chunk}\n\n")
    };
    let delta = |delta: Value, finish_reason: Option<&str>| {
        let mut choice = json!({"index": 0, "delta": delta, "logprobs": null});
        choice["finish_reason"] = json!(finish_reason);
        json!([choice])
    };

    let mut frames = Vec::new();
    let mut role_sent = false;
    if let Some(text) = &answer.text {
        frames.push(frame(
            delta(json!({"role": "assistant", "content": "", "refusal": null}), None),
            None,
        ));
        role_sent = true;
        for piece in pieces(text) {
            frames.push(frame(delta(json!({"content": piece}), None), None));
        }
    }
    for (index, call) in answer.calls.iter().enumerate() {
        let head = json!([{
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]);
        let first = if role_sent {
            json!({"tool_calls": head})
        } else {
            role_sent = true;
            json!({"role": "assistant", "content": null, "tool_calls": head, "refusal": null})
        };
        frames.push(frame(delta(first, None), None));
        let arguments = call.arguments.to_string();
        for piece in pieces(&arguments) {
            let fragment =
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]});
            frames.push(frame(delta(fragment, None), None));
        }
    }
    frames.push(frame(delta(json!({}), Some(openai_finish_reason(answer))), None));
    if include_usage {
        frames.push(frame(json!([]), Some(openai_usage(answer.usage))));
    }
    frames.push("data: [DONE]\n\n".to_owned());
    frames
}
