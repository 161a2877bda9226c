//! A model provider stand-in on loopback, answering from a script.
//!
//! No real provider is reachable from tests, so this server speaks each
//! provider's own wire format — OpenAI Chat Completions at
//! `POST {base}chat/completions`, Anthropic Messages at `POST {base}messages`,
//! as JSON or as SSE when the request says `"stream": true` — closely enough
//! that a real client library parses it as it would the real API.
//!
//! OpenAI's Embeddings API (`POST {base}embeddings`) is answered too, with
//! deterministic vectors from a feature-hashing embedder
//! ([`hashing_embedding`]); a test can make it slow or fail.
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

mod anthropic;
mod embeddings;
mod openai;
mod reply;
#[cfg(test)]
mod tests;

use anthropic::*;
pub use embeddings::{HASHING_DIMS, hashing_embedding};
use openai::*;
pub use reply::{Reply, ToolCall, Usage};

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
            .route("/v1/embeddings", post(embeddings::embeddings))
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

/// The scripted replies and the record of requests, shared by the handle
/// and the handlers.
#[derive(Debug, Default)]
struct Script {
    /// Replies by marker, markers in the order they were first scripted
    /// (which breaks ties between markers).
    marked: Vec<(String, VecDeque<Reply>)>,
    unmarked: VecDeque<Reply>,
    requests: Vec<RecordedRequest>,
    /// How the embeddings endpoint answers, and what it was asked.
    embeddings: embeddings::EmbeddingsScript,
    embedding_requests: Vec<RecordedRequest>,
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
        "the model server serves POST /v1/chat/completions, POST /v1/messages and \
         POST /v1/embeddings, not {uri} \
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
