//! A model provider stand-in on loopback, answering from a script.
//!
//! No real provider is reachable from tests, so this server speaks each
//! provider's own wire format — OpenAI Chat Completions at
//! `POST {base}chat/completions`, Anthropic Messages at `POST {base}messages`,
//! as JSON or as SSE when the request says `"stream": true` — closely enough
//! that a real client library parses it as it would the real API.
//!
//! Answers are scripted ahead of time. A request whose messages mention a
//! marker takes the next reply scripted for that marker, so concurrent
//! conversations that each carry their own marker text each get their own
//! answers, in order; any other request takes the next unmarked reply. A
//! request nothing was scripted for is answered with a provider-shaped 500
//! that says so, which makes the failing test obvious.

use std::{
    collections::VecDeque,
    convert::Infallible,
    fmt,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    response::Response,
    routing::post,
};
use http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use serde_json::{Value, json};
use tokio::{
    net::TcpListener,
    task::{JoinHandle, JoinSet},
};

/// A scripted model provider listening on `127.0.0.1`.
///
/// Dropping it stops the server and closes every connection it holds, kept-
/// alive ones included, so a client that reused a pooled connection sees the
/// provider gone too.
pub struct ModelServer {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    serving: JoinHandle<()>,
}

impl fmt::Debug for ModelServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

impl ModelServer {
    /// Binds a free port on `127.0.0.1` and starts serving.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the model server");
        let addr = listener.local_addr().expect("model server address");
        let script = Arc::new(Mutex::new(Script::default()));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/messages", post(messages))
            .fallback(unknown_endpoint)
            .with_state(Arc::clone(&script));
        let serving = tokio::spawn(serve(listener, app));
        Self { addr, script, serving }
    }

    /// The API base both providers share: `http://127.0.0.1:PORT/v1/`.
    ///
    /// The trailing slash matters: clients join `chat/completions` or
    /// `messages` onto it.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1/", self.addr)
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues replies, in order, for requests whose messages mention
    /// `marker` (anywhere in any string of the `messages`, or of Anthropic's
    /// top-level `system`). Scripting the same marker again adds to its queue.
    ///
    /// When a request mentions several scripted markers, the one mentioned in
    /// the latest message wins (the earlier-scripted one on a tie): a
    /// conversation that carries its parent's context still reaches its own
    /// script. A request that matches a marker whose queue is empty gets the
    /// "no scripted reply" 500; it does not fall back to the unmarked queue.
    pub fn script(&self, marker: &str, replies: impl IntoIterator<Item = Reply>) {
        assert!(!marker.is_empty(), "an empty marker would match every request");
        let mut script = lock(&self.script);
        let queue = match script.marked.iter().position(|(m, _)| m == marker) {
            Some(at) => &mut script.marked[at].1,
            None => {
                script.marked.push((marker.to_owned(), VecDeque::new()));
                &mut script.marked.last_mut().expect("just pushed").1
            }
        };
        queue.extend(replies);
    }

    /// Queues a reply for requests that match no marker.
    pub fn push(&self, reply: Reply) {
        lock(&self.script).unmarked.push_back(reply);
    }

    /// Every request received, in the order it arrived (recorded on arrival,
    /// before any scripted delay).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.script).requests.clone()
    }

    /// How many scripted replies have not been used yet, marked and unmarked.
    pub fn unused_replies(&self) -> usize {
        let script = lock(&self.script);
        script.unmarked.len() + script.marked.iter().map(|(_, q)| q.len()).sum::<usize>()
    }
}

/// Which provider's API a request was made to, told by its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    Anthropic,
}

impl Provider {
    /// An error body in the shape this provider sends with a failed status.
    ///
    /// OpenAI: `{"error": {"message", "type", "param", "code"}}`;
    /// Anthropic: `{"type": "error", "error": {"type", "message"}}`. The
    /// `type` (and OpenAI's `code`) follow the status the way the real APIs
    /// do, e.g. 429 is `requests`/`rate_limit_exceeded` and `rate_limit_error`.
    pub fn error_body(self, status: u16, message: &str) -> String {
        match self {
            Provider::OpenAi => {
                let (kind, code) = match status {
                    401 => ("invalid_request_error", Some("invalid_api_key")),
                    429 => ("requests", Some("rate_limit_exceeded")),
                    500..=599 => ("server_error", None),
                    _ => ("invalid_request_error", None),
                };
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            }
            Provider::Anthropic => {
                let kind = match status {
                    401 => "authentication_error",
                    402 => "billing_error",
                    403 => "permission_error",
                    404 => "not_found_error",
                    413 => "request_too_large",
                    429 => "rate_limit_error",
                    504 => "timeout_error",
                    529 => "overloaded_error",
                    500..=599 => "api_error",
                    _ => "invalid_request_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": message}})
            }
        }
        .to_string()
    }

    /// The response header that carries the provider's request id.
    fn request_id_header(self) -> &'static str {
        match self {
            Provider::OpenAi => "x-request-id",
            Provider::Anthropic => "request-id",
        }
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// The API the request was made to.
    pub provider: Provider,
    /// Headers as received, credentials included.
    pub headers: HeaderMap,
    /// The JSON body; a body that is not JSON is kept as one string.
    pub body: Value,
    /// Whether the request asked for an SSE answer (`"stream": true`).
    pub stream: bool,
}

impl RecordedRequest {
    /// The API key the request carried: OpenAI's `authorization: Bearer …`,
    /// Anthropic's `x-api-key`.
    pub fn api_key(&self) -> Option<&str> {
        match self.provider {
            Provider::OpenAi => {
                self.headers.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ")
            }
            Provider::Anthropic => self.headers.get("x-api-key")?.to_str().ok(),
        }
    }

    /// The model the request named.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model")?.as_str()
    }

    /// Whether a streamed OpenAI answer must end with a usage chunk.
    fn include_usage(&self) -> bool {
        self.body.pointer("/stream_options/include_usage").and_then(Value::as_bool) == Some(true)
    }
}

/// What the server answers one request with.
#[derive(Clone)]
pub enum Reply {
    /// A final answer (`finish_reason: "stop"` / `stop_reason: "end_turn"`).
    Text { text: String, usage: Usage },
    /// One assistant turn asking for tool calls, in parallel when there are
    /// several, optionally after some text (`finish_reason: "tool_calls"` /
    /// `stop_reason: "tool_use"`).
    ToolCalls { text: Option<String>, calls: Vec<ToolCall>, usage: Usage },
    /// A failed HTTP status, with a `retry-after` header when set. Without a
    /// body the provider's own error JSON is sent (see
    /// [`Provider::error_body`]); a body is sent as is, as JSON.
    Status { status: u16, retry_after: Option<u64>, body: Option<String> },
    /// Waits, then answers with the inner reply. The request is recorded
    /// before the wait, and a client that gives up meanwhile simply closes
    /// the connection.
    Delay { wait: Duration, then: Box<Reply> },
    /// A 200 whose body is the given text, verbatim: as `application/json`
    /// for a plain request, as `text/event-stream` for a streaming one.
    Garbage(String),
    /// Computed from the request when it arrives.
    Dynamic(Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>),
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Text { text, usage } => {
                f.debug_struct("Text").field("text", text).field("usage", usage).finish()
            }
            Reply::ToolCalls { text, calls, usage } => f
                .debug_struct("ToolCalls")
                .field("text", text)
                .field("calls", calls)
                .field("usage", usage)
                .finish(),
            Reply::Status { status, retry_after, body } => f
                .debug_struct("Status")
                .field("status", status)
                .field("retry_after", retry_after)
                .field("body", body)
                .finish(),
            Reply::Delay { wait, then } => {
                f.debug_struct("Delay").field("wait", wait).field("then", then).finish()
            }
            Reply::Garbage(body) => f.debug_tuple("Garbage").field(body).finish(),
            Reply::Dynamic(_) => f.write_str("Dynamic(..)"),
        }
    }
}

impl Reply {
    /// A final answer.
    pub fn text(text: impl Into<String>, input_tokens: u32, output_tokens: u32) -> Self {
        Reply::Text { text: text.into(), usage: Usage { input_tokens, output_tokens } }
    }

    /// A turn asking for one tool call.
    pub fn tool_call(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: Value,
        input_tokens: u32,
        output_tokens: u32,
    ) -> Self {
        Reply::tool_calls([ToolCall::new(id, name, arguments)], input_tokens, output_tokens)
    }

    /// A turn asking for several tool calls at once.
    pub fn tool_calls(
        calls: impl IntoIterator<Item = ToolCall>,
        input_tokens: u32,
        output_tokens: u32,
    ) -> Self {
        Reply::ToolCalls {
            text: None,
            calls: calls.into_iter().collect(),
            usage: Usage { input_tokens, output_tokens },
        }
    }

    /// A failed status with the provider's own error body.
    pub fn status(status: u16) -> Self {
        Reply::Status { status, retry_after: None, body: None }
    }

    /// A 429 that asks the client to wait `retry_after_secs` seconds.
    pub fn rate_limited(retry_after_secs: u64) -> Self {
        Reply::Status { status: 429, retry_after: Some(retry_after_secs), body: None }
    }

    /// `then`, after `wait`.
    pub fn delayed(wait: Duration, then: Reply) -> Self {
        Reply::Delay { wait, then: Box::new(then) }
    }

    /// A reply computed from the request.
    pub fn dynamic(compute: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static) -> Self {
        Reply::Dynamic(Arc::new(compute))
    }
}

/// Token counts reported with an answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// One tool call the model asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The provider's call id (`call_…` for OpenAI, `toolu_…` for Anthropic
    /// by convention; any string is sent as given).
    pub id: String,
    pub name: String,
    /// Sent as a JSON string by OpenAI and as an object by Anthropic.
    pub arguments: Value,
}

impl ToolCall {
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self { id: id.into(), name: name.into(), arguments }
    }
}

/// The scripted replies and the record of requests, shared by the handle
/// and the handlers.
#[derive(Debug, Default)]
struct Script {
    /// Replies by marker, markers in the order they were first scripted
    /// (which breaks ties between markers).
    marked: Vec<(String, VecDeque<Reply>)>,
    unmarked: VecDeque<Reply>,
    requests: Vec<RecordedRequest>,
    /// Requests answered so far; numbers response and request ids.
    answered: u64,
}

impl Script {
    /// The next reply for `request`, or why there is none.
    fn next_reply(&mut self, request: &RecordedRequest) -> Result<Reply, String> {
        let turns = conversation(&request.body);
        let mut chosen: Option<(usize, usize)> = None;
        for (queue, (marker, _)) in self.marked.iter().enumerate() {
            if let Some(turn) = turns.iter().rposition(|t| mentions(t, marker))
                && chosen.is_none_or(|(_, latest)| turn > latest)
            {
                chosen = Some((queue, turn));
            }
        }
        match chosen {
            Some((queue, _)) => {
                let (marker, replies) = &mut self.marked[queue];
                replies.pop_front().ok_or_else(|| format!("no scripted reply left for {marker:?}"))
            }
            None => self
                .unmarked
                .pop_front()
                .ok_or_else(|| "no scripted reply for a request that matches no marker".to_owned()),
        }
    }
}

fn lock(script: &Mutex<Script>) -> MutexGuard<'_, Script> {
    // A test that panicked while holding the lock leaves the script as
    // consistent as any other moment; later requests can still be answered.
    script.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The turns a marker is looked for in, oldest first: Anthropic's top-level
/// `system`, then each message.
fn conversation(body: &Value) -> Vec<&Value> {
    let messages = body.get("messages").and_then(Value::as_array).into_iter().flatten();
    body.get("system").into_iter().chain(messages).collect()
}

fn mentions(value: &Value, marker: &str) -> bool {
    match value {
        Value::String(text) => text.contains(marker),
        Value::Array(items) => items.iter().any(|item| mentions(item, marker)),
        Value::Object(fields) => fields.values().any(|field| mentions(field, marker)),
        _ => false,
    }
}

type Shared = Arc<Mutex<Script>>;

/// Serves connections until the task is aborted. Connections live in a
/// `JoinSet` owned by this task, so aborting it closes them all.
async fn serve(listener: TcpListener, app: Router) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else {
                    // Out of descriptors or similar; pause rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let service = TowerToHyperService::new(app.clone());
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                connections.spawn(async move {
                    // A client hanging up mid-answer is part of what tests do.
                    let _ = connection.await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn chat_completions(
    State(script): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(&script, Provider::OpenAi, headers, &body).await
}

async fn messages(State(script): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&script, Provider::Anthropic, headers, &body).await
}

/// A path neither API has, most often a base URL without its trailing slash.
async fn unknown_endpoint(uri: Uri) -> Response {
    let body = format!(
        "the model server serves POST /v1/chat/completions and POST /v1/messages, not {uri} \
         (does the base URL end with a slash?)"
    );
    plain_response(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", body)
}

async fn answer(
    script: &Mutex<Script>,
    provider: Provider,
    headers: HeaderMap,
    raw: &[u8],
) -> Response {
    let body = serde_json::from_slice(raw)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(raw).into_owned()));
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let request = RecordedRequest { provider, headers, body, stream };
    let (next, number) = {
        let mut script = lock(script);
        script.requests.push(request.clone());
        script.answered += 1;
        (script.next_reply(&request), script.answered)
    };
    let reply = next.unwrap_or_else(|why| Reply::Status {
        status: 500,
        retry_after: None,
        body: Some(provider.error_body(500, &why)),
    });
    let outcome = settle(reply, &request).await;
    respond(outcome, &request, number)
}

/// A reply with its waits served and its computation done.
enum Outcome {
    Answer(Answer),
    Status { status: u16, retry_after: Option<u64>, body: Option<String> },
    Garbage(String),
}

/// An assistant turn, whether a final answer or a request for tools.
struct Answer {
    text: Option<String>,
    calls: Vec<ToolCall>,
    usage: Usage,
}

async fn settle(mut reply: Reply, request: &RecordedRequest) -> Outcome {
    loop {
        reply = match reply {
            Reply::Text { text, usage } => {
                return Outcome::Answer(Answer { text: Some(text), calls: Vec::new(), usage });
            }
            Reply::ToolCalls { text, calls, usage } => {
                return Outcome::Answer(Answer { text, calls, usage });
            }
            Reply::Status { status, retry_after, body } => {
                return Outcome::Status { status, retry_after, body };
            }
            Reply::Garbage(body) => return Outcome::Garbage(body),
            Reply::Delay { wait, then } => {
                tokio::time::sleep(wait).await;
                *then
            }
            Reply::Dynamic(compute) => compute(request),
        };
    }
}

fn respond(outcome: Outcome, request: &RecordedRequest, number: u64) -> Response {
    let provider = request.provider;
    let mut response = match outcome {
        Outcome::Status { status, retry_after, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = body.unwrap_or_else(|| {
                provider.error_body(status.as_u16(), status.canonical_reason().unwrap_or("error"))
            });
            let mut response = plain_response(status, "application/json", body);
            if let Some(seconds) = retry_after {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            response
        }
        Outcome::Garbage(body) => {
            let content_type = if request.stream { SSE } else { "application/json" };
            plain_response(StatusCode::OK, content_type, body)
        }
        Outcome::Answer(answer) => {
            let turn = Turn {
                number,
                model: request.model().unwrap_or("unknown-model").to_owned(),
                created: unix_secs(),
            };
            match (provider, request.stream) {
                (Provider::OpenAi, false) => json_response(&openai_completion(&turn, &answer)),
                (Provider::OpenAi, true) => {
                    sse_response(openai_chunks(&turn, &answer, request.include_usage()))
                }
                (Provider::Anthropic, false) => json_response(&anthropic_message(&turn, &answer)),
                (Provider::Anthropic, true) => sse_response(anthropic_events(&turn, &answer)),
            }
        }
    };
    response.headers_mut().insert(
        provider.request_id_header(),
        HeaderValue::from_str(&format!("req_{number}")).expect("ascii request id"),
    );
    response
}

const SSE: &str = "text/event-stream; charset=utf-8";

fn plain_response(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response(body: &Value) -> Response {
    plain_response(StatusCode::OK, "application/json", body.to_string())
}

/// Sends each SSE frame as its own body chunk, the way a provider flushes
/// them as they are generated.
fn sse_response(frames: Vec<String>) -> Response {
    let frames = futures::stream::iter(frames.into_iter().map(Ok::<_, Infallible>));
    let mut response = Response::new(Body::from_stream(frames));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(SSE));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// What every part of one answer shares.
struct Turn {
    number: u64,
    model: String,
    created: u64,
}

fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

/// Splits `text` into up to three pieces at character boundaries, so that
/// every streamed text or argument string arrives in several deltas.
fn pieces(text: &str) -> Vec<&str> {
    let chars = text.chars().count();
    let per_piece = chars.div_ceil(3).max(1);
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest.char_indices().nth(per_piece).map_or(rest.len(), |(at, _)| at);
        let (piece, tail) = rest.split_at(cut);
        out.push(piece);
        rest = tail;
    }
    out
}

// OpenAI Chat Completions

fn openai_usage(usage: Usage) -> Value {
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

fn openai_finish_reason(answer: &Answer) -> &'static str {
    if answer.calls.is_empty() { "stop" } else { "tool_calls" }
}

fn openai_completion(turn: &Turn, answer: &Answer) -> Value {
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
fn openai_chunks(turn: &Turn, answer: &Answer, include_usage: bool) -> Vec<String> {
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

// Anthropic Messages

fn anthropic_usage(input_tokens: u32, output_tokens: u32) -> Value {
    json!({
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens,
        "service_tier": "standard",
    })
}

fn anthropic_stop_reason(answer: &Answer) -> &'static str {
    if answer.calls.is_empty() { "end_turn" } else { "tool_use" }
}

fn anthropic_message(turn: &Turn, answer: &Answer) -> Value {
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
fn anthropic_events(turn: &Turn, answer: &Answer) -> Vec<String> {
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

#[cfg(test)]
mod tests {
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
        let answer =
            answer(None, &[("call_a", "read", args.clone()), ("call_b", "list", json!({}))]);
        let frames = openai_chunks(&turn(), &answer, false);
        let mut joined = [String::new(), String::new()];
        let mut fragments = [0, 0];
        for frame in &frames[..frames.len() - 1] {
            let chunk = data(frame);
            for call in chunk["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten()
            {
                let index = call["index"].as_u64().unwrap() as usize;
                joined[index].push_str(call["function"]["arguments"].as_str().unwrap());
                fragments[index] += 1;
            }
        }
        assert_eq!(serde_json::from_str::<Value>(&joined[0]).unwrap(), args);
        assert_eq!(joined[1], "{}");
        assert!(fragments[0] > 2, "the arguments arrive in several deltas: {fragments:?}");
        let first = data(&frames[0]);
        assert_eq!(
            first["choices"][0]["delta"]["role"], "assistant",
            "the first delta has the role"
        );
        assert_eq!(first["choices"][0]["delta"]["tool_calls"][0]["id"], "call_a");
        let finish = data(&frames[frames.len() - 2]);
        assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn anthropic_events_in_order_with_usage_split() {
        let answer = answer(Some("Looking."), &[("toolu_1", "read", json!({"path": "/a"}))]);
        let events = anthropic_events(&turn(), &answer);
        let names: Vec<&str> = events
            .iter()
            .map(|e| e.lines().next().unwrap().trim_start_matches("event: "))
            .collect();
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
}
