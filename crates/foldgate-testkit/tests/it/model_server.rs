//! The scripted model server, driven by the `genai` client the gateway uses:
//! what it serves must parse there the way the real providers' answers do.

use std::time::{Duration, Instant};

use foldgate_testkit::model_server::{ModelServer, Provider, Reply, ToolCall, Usage};
use futures::StreamExt;
use genai::{
    Client, ModelIden, ServiceTarget,
    adapter::AdapterKind,
    chat::{ChatMessage, ChatOptions, ChatRequest, ChatStreamEvent, StopReason, StreamEnd, Tool},
    resolver::{AuthData, Endpoint, ServiceTargetResolver},
};
use serde_json::{Value, json};

const KEY: &str = "sk-test-4f1c";

/// Each provider with the adapter and a model name the gateway would use.
const PROVIDERS: [(Provider, AdapterKind, &str); 2] = [
    (Provider::OpenAi, AdapterKind::OpenAI, "gpt-4o-mini"),
    (Provider::Anthropic, AdapterKind::Anthropic, "claude-sonnet-4-5"),
];

/// A genai client that sends every model to `base_url` as `kind`.
fn client(base_url: String, kind: AdapterKind) -> Client {
    let resolver = ServiceTargetResolver::from_resolver_fn(
        move |target: ServiceTarget| -> Result<ServiceTarget, genai::resolver::Error> {
            Ok(ServiceTarget {
                endpoint: Endpoint::from_owned(base_url.clone()),
                auth: AuthData::from_single(KEY),
                model: ModelIden::new(kind, target.model.model_name),
            })
        },
    );
    Client::builder().with_service_target_resolver(resolver).build().unwrap()
}

fn streaming_options() -> ChatOptions {
    ChatOptions::default()
        .with_capture_usage(true)
        .with_capture_content(true)
        .with_capture_tool_calls(true)
}

fn weather_tool() -> Tool {
    Tool::new("get_weather").with_description("Weather for a city").with_schema(json!({
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"]
    }))
}

/// What a streamed answer came to.
struct Streamed {
    text: String,
    text_chunks: usize,
    tool_call_chunks: usize,
    end: StreamEnd,
}

async fn stream(
    client: &Client,
    model: &str,
    request: ChatRequest,
    options: &ChatOptions,
) -> genai::Result<Streamed> {
    let mut events = client.exec_chat_stream(model, request, Some(options)).await?.stream;
    let (mut text, mut text_chunks, mut tool_call_chunks) = (String::new(), 0, 0);
    while let Some(event) = events.next().await {
        match event? {
            ChatStreamEvent::Chunk(chunk) => {
                text.push_str(&chunk.content);
                text_chunks += 1;
            }
            ChatStreamEvent::ToolCallChunk(_) => tool_call_chunks += 1,
            ChatStreamEvent::End(end) => {
                return Ok(Streamed { text, text_chunks, tool_call_chunks, end });
            }
            _ => {}
        }
    }
    panic!("the stream ended without an End event");
}

fn tool_call_triples<'a>(
    calls: impl IntoIterator<Item = &'a genai::chat::ToolCall>,
) -> Vec<(String, String, Value)> {
    calls
        .into_iter()
        .map(|c| (c.call_id.clone(), c.fn_name.clone(), c.fn_arguments.clone()))
        .collect()
}

#[tokio::test]
async fn text_answer_with_usage() {
    for (provider, kind, model) in PROVIDERS {
        for streamed in [false, true] {
            let case = format!("{provider:?}, streamed: {streamed}");
            // Arrange
            let server = ModelServer::start().await;
            let client = client(server.base_url(), kind);
            let answer = "The answer is forty-two, as computed.";
            server.push(Reply::text(answer, 31, 9));
            let request = ChatRequest::from_user("What is the answer?");

            // Act / Assert
            if streamed {
                let got = stream(&client, model, request, &streaming_options()).await.unwrap();
                assert_eq!(got.text, answer, "{case}");
                assert!(got.text_chunks > 1, "{case}: text arrives in several deltas");
                assert_eq!(got.end.captured_first_text(), Some(answer), "{case}");
                let usage = got.end.captured_usage.expect("usage captured");
                assert_eq!(
                    (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
                    (Some(31), Some(9), Some(40)),
                    "{case}"
                );
                assert!(
                    matches!(got.end.captured_stop_reason, Some(StopReason::Completed(_))),
                    "{case}: {:?}",
                    got.end.captured_stop_reason
                );
            } else {
                let got = client.exec_chat(model, request, None).await.unwrap();
                assert_eq!(got.first_text(), Some(answer), "{case}");
                assert_eq!(
                    (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens),
                    (Some(31), Some(9), Some(40)),
                    "{case}"
                );
                assert!(matches!(got.stop_reason, Some(StopReason::Completed(_))), "{case}");
            }

            let requests = server.requests();
            assert_eq!(requests.len(), 1, "{case}");
            let seen = &requests[0];
            assert_eq!(seen.provider, provider, "{case}");
            assert_eq!(seen.stream, streamed, "{case}");
            assert_eq!(seen.model(), Some(model), "{case}");
            assert_eq!(seen.api_key(), Some(KEY), "{case}");
            match provider {
                Provider::OpenAi => {
                    let bearer = format!("Bearer {KEY}");
                    assert_eq!(seen.headers["authorization"], bearer.as_str(), "{case}");
                    assert!(seen.headers.get("x-api-key").is_none(), "{case}");
                    assert_eq!(seen.body.get("max_tokens"), None, "{case}: no default max_tokens");
                    let include_usage = seen.body.pointer("/stream_options/include_usage");
                    let expected = streamed.then_some(&Value::Bool(true));
                    assert_eq!(include_usage, expected, "{case}: include_usage when streaming");
                }
                Provider::Anthropic => {
                    assert_eq!(seen.headers["x-api-key"], KEY, "{case}");
                    assert_eq!(seen.headers["anthropic-version"], "2023-06-01", "{case}");
                    assert!(seen.headers.get("authorization").is_none(), "{case}");
                    assert_eq!(seen.body["max_tokens"], 64000, "{case}: genai's default");
                }
            }
        }
    }
}

#[tokio::test]
async fn parallel_tool_calls_come_back_exactly() {
    let calls = vec![
        ToolCall::new("call_wx_1", "get_weather", json!({"city": "Zürich", "units": "metric"})),
        ToolCall::new(
            "call_fs_2",
            "read_file",
            json!({"path": "/tmp/a \"b\".txt", "range": [1, 20], "opts": {"follow": true}}),
        ),
    ];
    let expected: Vec<(String, String, Value)> =
        calls.iter().map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone())).collect();
    for (provider, kind, model) in PROVIDERS {
        for (streamed, lead) in
            [(false, None), (true, None), (false, Some("Checking.")), (true, Some("Checking."))]
        {
            let case = format!("{provider:?}, streamed: {streamed}, leading text: {lead:?}");
            // Arrange
            let server = ModelServer::start().await;
            let client = client(server.base_url(), kind);
            server.push(Reply::ToolCalls {
                text: lead.map(str::to_owned),
                calls: calls.clone(),
                usage: Usage { input_tokens: 50, output_tokens: 20 },
            });
            let request = ChatRequest::from_user("Weather in Zürich, and read the file.")
                .with_tools(vec![weather_tool()]);

            // Act / Assert
            if streamed {
                let got = stream(&client, model, request, &streaming_options()).await.unwrap();
                let captured = got.end.captured_tool_calls().expect("tool calls captured");
                assert_eq!(tool_call_triples(captured), expected, "{case}");
                assert!(
                    got.tool_call_chunks >= 2 * calls.len() + 2,
                    "{case}: arguments arrive in several deltas ({} chunks)",
                    got.tool_call_chunks
                );
                assert_eq!(got.text, lead.unwrap_or(""), "{case}");
                assert!(
                    matches!(got.end.captured_stop_reason, Some(StopReason::ToolCall(_))),
                    "{case}: {:?}",
                    got.end.captured_stop_reason
                );
                assert_eq!(got.end.captured_usage.unwrap().completion_tokens, Some(20), "{case}");
            } else {
                let got = client.exec_chat(model, request, None).await.unwrap();
                assert_eq!(tool_call_triples(got.tool_calls()), expected, "{case}");
                assert_eq!(got.first_text(), lead, "{case}");
                assert!(matches!(got.stop_reason, Some(StopReason::ToolCall(_))), "{case}");
                assert_eq!(got.usage.prompt_tokens, Some(50), "{case}");
            }

            let body = &server.requests()[0].body;
            let sent_tool = match provider {
                Provider::OpenAi => json!({
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather for a city",
                        "parameters": weather_tool().schema,
                        "strict": false
                    }
                }),
                Provider::Anthropic => json!({
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "input_schema": weather_tool().schema
                }),
            };
            assert_eq!(body["tools"], json!([sent_tool]), "{case}: the tools as genai sends them");
        }
    }
}

#[tokio::test]
async fn rate_limit_reaches_genai_with_status_and_retry_after() {
    for (provider, kind, model) in PROVIDERS {
        let case = format!("{provider:?}");
        let error_kind = |body: &str| {
            let body: Value = serde_json::from_str(body).unwrap();
            match provider {
                Provider::OpenAi => body["error"]["code"].clone(),
                Provider::Anthropic => body["error"]["type"].clone(),
            }
        };
        let expected_kind = match provider {
            Provider::OpenAi => "rate_limit_exceeded",
            Provider::Anthropic => "rate_limit_error",
        };
        let server = ModelServer::start().await;
        let client = client(server.base_url(), kind);
        server.push(Reply::rate_limited(7));
        server.push(Reply::rate_limited(7));

        // Not streamed: `Error::WebModelCall { webc_error: ResponseFailedStatus { .. } }`.
        let err = client.exec_chat(model, ChatRequest::from_user("hi"), None).await.unwrap_err();
        assert_eq!(err.status().map(|s| s.as_u16()), Some(429), "{case}");
        match err {
            genai::Error::WebModelCall {
                webc_error: genai::webc::Error::ResponseFailedStatus { status, body, headers },
                ..
            } => {
                assert_eq!(status.as_u16(), 429, "{case}");
                assert_eq!(headers["retry-after"], "7", "{case}");
                assert_eq!(error_kind(&body), expected_kind, "{case}");
            }
            other => panic!("{case}: not streamed, got {other:?}"),
        }

        // Streamed: the request starts, then the first item after `Start` is
        // `Error::WebStream` boxing an `Error::HttpError`.
        let mut events = client
            .exec_chat_stream(model, ChatRequest::from_user("hi"), Some(&streaming_options()))
            .await
            .unwrap()
            .stream;
        assert!(matches!(events.next().await, Some(Ok(ChatStreamEvent::Start))), "{case}");
        match events.next().await {
            Some(Err(genai::Error::WebStream { error, .. })) => {
                match error.downcast_ref::<genai::Error>() {
                    Some(genai::Error::HttpError { status, headers, body, .. }) => {
                        assert_eq!(status.as_u16(), 429, "{case}");
                        assert_eq!(headers["retry-after"], "7", "{case}");
                        assert_eq!(error_kind(body), expected_kind, "{case}");
                    }
                    other => panic!("{case}: streamed, boxed {other:?}"),
                }
            }
            other => panic!("{case}: streamed, got {other:?}"),
        }
        assert_eq!(server.requests().len(), 2, "{case}");
    }
}

#[tokio::test]
async fn unscripted_request_gets_a_provider_shaped_500() {
    for (provider, kind, model) in PROVIDERS {
        let server = ModelServer::start().await;
        let client = client(server.base_url(), kind);

        let err = client.exec_chat(model, ChatRequest::from_user("hi"), None).await.unwrap_err();

        let genai::Error::WebModelCall {
            webc_error: genai::webc::Error::ResponseFailedStatus { status, body, .. },
            ..
        } = err
        else {
            panic!("{provider:?}: {err:?}");
        };
        assert_eq!(status.as_u16(), 500, "{provider:?}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("no scripted reply"), "{provider:?}: {body}");
        let expected = match provider {
            Provider::OpenAi => "server_error",
            Provider::Anthropic => "api_error",
        };
        assert_eq!(body["error"]["type"], expected, "{provider:?}: {body}");
        if provider == Provider::Anthropic {
            assert_eq!(body["type"], "error");
        }
    }
}

#[tokio::test]
async fn markers_route_concurrent_conversations() {
    // Arrange
    let server = ModelServer::start().await;
    let client = client(server.base_url(), AdapterKind::Anthropic);
    let model = "claude-sonnet-4-5";
    server.script("[branch-a]", [Reply::text("a one", 1, 1), Reply::text("a two", 1, 1)]);
    server.script("[branch-b]", [Reply::text("b one", 1, 1)]);
    server.push(Reply::text("unmarked", 1, 1));
    let ask = |request: ChatRequest| {
        let client = client.clone();
        async move {
            let got = client.exec_chat(model, request, None).await.unwrap();
            got.first_text().unwrap().to_owned()
        }
    };

    // Act
    let (a, b, plain) = tokio::join!(
        ask(ChatRequest::from_user("[branch-a] start")),
        ask(ChatRequest::from_user("[branch-b] start")),
        ask(ChatRequest::from_user("hello")),
    );
    let follow_up = ChatRequest::from_system("You are [branch-b]'s sibling.")
        .append_message(ChatMessage::user("[branch-a] start"))
        .append_message(ChatMessage::assistant("a one"))
        .append_message(ChatMessage::user("go on"));
    let a_again = ask(follow_up).await;

    // Assert
    assert_eq!([a, b, plain, a_again], ["a one", "b one", "unmarked", "a two"]);
    assert_eq!(server.unused_replies(), 0);
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn delay_holds_the_answer_back() {
    let server = ModelServer::start().await;
    let client = client(server.base_url(), AdapterKind::OpenAI);
    let wait = Duration::from_millis(300);
    server.push(Reply::delayed(wait, Reply::text("late", 1, 1)));
    server.push(Reply::delayed(Duration::from_secs(30), Reply::text("too late", 1, 1)));

    let started = Instant::now();
    let got = client.exec_chat("gpt-4o-mini", ChatRequest::from_user("hi"), None).await.unwrap();
    assert_eq!(got.first_text(), Some("late"));
    assert!(started.elapsed() >= wait, "answered after {:?}", started.elapsed());

    // A caller that gives up leaves the request recorded and the server fine.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        client.exec_chat("gpt-4o-mini", ChatRequest::from_user("hi"), None),
    )
    .await;
    assert!(gave_up.is_err(), "the second answer was held back");
    assert_eq!(server.requests().len(), 2);
    server.push(Reply::text("still here", 1, 1));
    let got = client.exec_chat("gpt-4o-mini", ChatRequest::from_user("hi"), None).await.unwrap();
    assert_eq!(got.first_text(), Some("still here"));
}

#[tokio::test]
async fn dynamic_reply_is_computed_from_the_request() {
    let server = ModelServer::start().await;
    let client = client(server.base_url(), AdapterKind::OpenAI);
    server.push(Reply::dynamic(|request| {
        let size = u32::try_from(request.body.to_string().len()).unwrap();
        Reply::text(format!("you asked {}", request.model().unwrap()), size, 2)
    }));

    let got = client.exec_chat("gpt-4o-mini", ChatRequest::from_user("hi"), None).await.unwrap();

    let size = server.requests()[0].body.to_string().len();
    assert_eq!(got.first_text(), Some("you asked gpt-4o-mini"));
    assert_eq!(got.usage.prompt_tokens, Some(i32::try_from(size).unwrap()));
}

#[tokio::test]
async fn garbage_is_not_an_answer() {
    type Check = fn(&genai::Error) -> bool;
    let cases: [(AdapterKind, bool, &str, Check); 3] = [
        (AdapterKind::OpenAI, false, "{\"choices\": [", |e| {
            matches!(
                e,
                genai::Error::WebModelCall {
                    webc_error: genai::webc::Error::ResponseFailedInvalidJson { .. },
                    ..
                }
            )
        }),
        (AdapterKind::Anthropic, false, "{\"id\": \"msg_1\"}", |e| {
            matches!(e, genai::Error::ChatResponseGeneration { .. })
        }),
        (AdapterKind::OpenAI, true, "data: {not json\n\n", |e| {
            matches!(e, genai::Error::StreamParse { .. })
        }),
    ];
    for (kind, streamed, garbage, is_expected) in cases {
        let case = format!("{kind:?}, streamed: {streamed}, {garbage:?}");
        let server = ModelServer::start().await;
        let client = client(server.base_url(), kind);
        server.push(Reply::Garbage(garbage.to_owned()));
        let model = if kind == AdapterKind::OpenAI { "gpt-4o-mini" } else { "claude-sonnet-4-5" };

        let err = if streamed {
            stream(&client, model, ChatRequest::from_user("hi"), &streaming_options())
                .await
                .err()
                .expect("garbage must not stream as an answer")
        } else {
            client.exec_chat(model, ChatRequest::from_user("hi"), None).await.unwrap_err()
        };

        assert!(is_expected(&err), "{case}: {err:?}");
    }
}

#[tokio::test]
async fn base_url_needs_its_trailing_slash() {
    for (_, kind, model) in PROVIDERS {
        let server = ModelServer::start().await;
        server.push(Reply::text("unreachable", 1, 1));
        let base = server.base_url();
        let client = client(base.trim_end_matches('/').to_owned(), kind);

        let err = client.exec_chat(model, ChatRequest::from_user("hi"), None).await.unwrap_err();

        assert_eq!(err.status().map(|s| s.as_u16()), Some(404), "{kind:?}: {err:?}");
        assert!(server.requests().is_empty(), "{kind:?}");
    }
}

#[tokio::test]
async fn dropping_the_server_closes_its_connections() {
    let server = ModelServer::start().await;
    let client = client(server.base_url(), AdapterKind::OpenAI);
    server.push(Reply::text("first", 1, 1));
    server.push(Reply::text("second", 1, 1));
    let got = client.exec_chat("gpt-4o-mini", ChatRequest::from_user("hi"), None).await.unwrap();
    assert_eq!(got.first_text(), Some("first"));

    drop(server);
    let result = client.exec_chat("gpt-4o-mini", ChatRequest::from_user("hi"), None).await;

    assert!(
        matches!(
            result,
            Err(genai::Error::WebModelCall { webc_error: genai::webc::Error::Reqwest(_), .. })
        ),
        "{result:?}"
    );
}
