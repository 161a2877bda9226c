//! A minimal MCP client over Streamable HTTP: JSON-RPC requests as plain
//! HTTP POSTs, the `initialize` handshake once per connection, and a
//! classification of every failure.
//!
//! The same client drives the gateway and the baseline echo server, so that
//! the difference between the two is the servers' and not the client's. It
//! keeps one HTTP/1.1 keep-alive connection per target and does no work per
//! call beyond serialising the request and parsing the response.

use std::{fmt, time::Duration};

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};

/// The protocol version the client negotiates (`initialize` era).
pub const PROTOCOL_VERSION: &str = "2025-11-25";

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// Why a call did not produce a tool result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No HTTP response: the connection was refused, reset or timed out.
    Transport { kind: &'static str, detail: String },
    /// A non-200 HTTP status. `rpc_code` is the JSON-RPC error code of the
    /// body, when it had one.
    Http { status: u16, rpc_code: Option<i64>, detail: String },
    /// A JSON-RPC error response (HTTP 200).
    JsonRpc { code: i64, message: String },
    /// A tool result with `isError: true`; `code` is the tool's error code
    /// (`structuredContent.error.code`) when it gave one.
    Tool { code: String, message: String },
    /// A response that is not a JSON-RPC answer to the request.
    Protocol(String),
}

impl CallError {
    /// A short, stable name of the failure's kind, used to count errors:
    /// `transport:connect`, `http:503`, `jsonrpc:-32603`, `tool:busy`, ….
    pub fn kind(&self) -> String {
        match self {
            Self::Transport { kind, .. } => format!("transport:{kind}"),
            Self::Http { status, .. } => format!("http:{status}"),
            Self::JsonRpc { code, .. } => format!("jsonrpc:{code}"),
            Self::Tool { code, .. } => format!("tool:{code}"),
            Self::Protocol(_) => "protocol".to_owned(),
        }
    }

    /// Whether the failure happened before the server answered at all.
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Transport { .. })
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport { kind, detail } => write!(f, "transport ({kind}): {detail}"),
            Self::Http { status, rpc_code: Some(code), detail } => {
                write!(f, "HTTP {status}, JSON-RPC {code}: {detail}")
            }
            Self::Http { status, rpc_code: None, detail } => write!(f, "HTTP {status}: {detail}"),
            Self::JsonRpc { code, message } => write!(f, "JSON-RPC {code}: {message}"),
            Self::Tool { code, message } => write!(f, "tool error {code}: {message}"),
            Self::Protocol(detail) => write!(f, "protocol: {detail}"),
        }
    }
}

impl std::error::Error for CallError {}

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Longest time for one HTTP exchange, connection included.
    pub request_timeout: Duration,
    /// Longest time to open a TCP connection.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self { request_timeout: Duration::from_secs(10), connect_timeout: Duration::from_secs(2) }
    }
}

/// One MCP client bound to one endpoint and one bearer token.
#[derive(Debug)]
pub struct McpClient {
    http: reqwest::Client,
    url: String,
    headers: HeaderMap,
    next_id: u64,
    initialized: bool,
}

impl McpClient {
    /// A client for `url`; nothing is sent until the first call.
    pub fn new(url: &str, token: Option<&str>, options: &ClientOptions) -> anyhow::Result<Self> {
        Self::with_http(http_client(options, 2)?, url, token)
    }

    /// A client for `url` that sends through `http`, which many clients may
    /// share (see [`http_client`]); nothing is sent until the first call.
    pub fn with_http(
        http: reqwest::Client,
        url: &str,
        token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        if let Some(token) = token {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}"))?);
        }
        Ok(Self { http, url: url.to_owned(), headers, next_id: 1, initialized: false })
    }

    /// The endpoint this client talks to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs the `initialize` handshake (and `notifications/initialized`).
    /// Called by the first [`Self::call_tool`]; a stateless server needs it
    /// once per client, never again.
    pub async fn initialize(&mut self) -> Result<Value, CallError> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "foldgate-bench", "version": env!("CARGO_PKG_VERSION")},
        });
        let (result, response_headers) = self.request("initialize", params).await?;
        if let Some(session) = response_headers.get(SESSION_HEADER) {
            // A stateful server: every later request names the session.
            self.headers.insert(SESSION_HEADER, session.clone());
        }
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .and_then(|v| HeaderValue::from_str(v).ok())
            .unwrap_or(HeaderValue::from_static(PROTOCOL_VERSION));
        self.headers.insert(PROTOCOL_HEADER, version);
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let response = self
            .http
            .post(&self.url)
            .headers(self.headers.clone())
            .body(note.to_string())
            .send()
            .await
            .map_err(transport)?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let body = response.bytes().await.unwrap_or_default();
            return Err(http_error(status, &body));
        }
        self.initialized = true;
        Ok(result)
    }

    /// Calls a tool. `meta` becomes the request's `params._meta`. Returns the
    /// tool's structured content (or, without one, the whole result).
    pub async fn call_tool(
        &mut self,
        name: &str,
        arguments: Value,
        meta: Option<Value>,
    ) -> Result<Value, CallError> {
        if !self.initialized {
            self.initialize().await?;
        }
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        let (result, _) = self.request("tools/call", params).await?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            return Err(tool_error(&result));
        }
        Ok(match result {
            Value::Object(mut map) => map.remove("structuredContent").unwrap_or(Value::Object(map)),
            other => other,
        })
    }

    /// The names of the tools the server lists (first page).
    pub async fn list_tool_names(&mut self) -> Result<Vec<String>, CallError> {
        if !self.initialized {
            self.initialize().await?;
        }
        let (result, _) = self.request("tools/list", json!({})).await?;
        Ok(result
            .get("tools")
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Sends one JSON-RPC request and returns its `result`.
    async fn request(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<(Value, HeaderMap), CallError> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let response = self
            .http
            .post(&self.url)
            .headers(self.headers.clone())
            .body(body.to_string())
            .send()
            .await
            .map_err(transport)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let is_sse = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let bytes = response.bytes().await.map_err(transport)?;
        if status != 200 {
            return Err(http_error(status, &bytes));
        }
        let message = if is_sse { sse_response(&bytes, id)? } else { json_body(&bytes)? };
        if let Some(error) = message.get("error") {
            return Err(CallError::JsonRpc {
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
            });
        }
        if message.get("id").and_then(Value::as_u64) != Some(id) {
            return Err(CallError::Protocol(format!("response to another request: {message}")));
        }
        match message {
            Value::Object(mut map) => match map.remove("result") {
                Some(result) => Ok((result, headers)),
                None => Err(CallError::Protocol("response without result".into())),
            },
            other => Err(CallError::Protocol(format!("not a JSON-RPC response: {other}"))),
        }
    }
}

/// The HTTP client of [`McpClient`]: HTTP/1.1, keep-alive, no proxy,
/// keeping up to `max_idle` idle connections per host.
pub fn http_client(options: &ClientOptions, max_idle: usize) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(max_idle)
        .timeout(options.request_timeout)
        .connect_timeout(options.connect_timeout)
        .build()?)
}

fn transport(e: reqwest::Error) -> CallError {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    };
    // The source chain says what happened (connection reset, refused, …).
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        source = s.source();
    }
    CallError::Transport { kind, detail }
}

fn http_error(status: u16, body: &[u8]) -> CallError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let rpc = parsed.as_ref().and_then(|v| v.get("error"));
    let rpc_code = rpc.and_then(|e| e.get("code")).and_then(Value::as_i64);
    let detail = rpc
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    CallError::Http { status, rpc_code, detail }
}

fn json_body(bytes: &[u8]) -> Result<Value, CallError> {
    serde_json::from_slice(bytes).map_err(|e| CallError::Protocol(format!("invalid JSON: {e}")))
}

/// The response to request `id` in a `text/event-stream` body.
fn sse_response(bytes: &[u8], id: u64) -> Result<Value, CallError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| CallError::Protocol("event stream is not UTF-8".into()))?;
    let mut data = String::new();
    // Events end with a blank line; their `data:` lines join with newlines.
    for line in text.lines().chain(std::iter::once("")) {
        if let Some(rest) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        } else if line.is_empty() && !data.is_empty() {
            if let Ok(message) = serde_json::from_str::<Value>(&data)
                && message.get("id").and_then(Value::as_u64) == Some(id)
                && (message.get("result").is_some() || message.get("error").is_some())
            {
                return Ok(message);
            }
            data.clear();
        }
    }
    Err(CallError::Protocol("the event stream held no response".into()))
}

fn tool_error(result: &Value) -> CallError {
    let error = result.get("structuredContent").and_then(|s| s.get("error"));
    let code = error.and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("unknown");
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| {
            result
                .get("content")
                .and_then(|c| c.get(0))
                .and_then(|c| c.get("text"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_default();
    CallError::Tool { code: code.to_owned(), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_streams_yield_the_matching_response() {
        let body = b"id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
                     data: {\"jsonrpc\":\"2.0\",\"id\":7,\n\
                     data: \"result\":{\"ok\":true}}\n\n";
        let message = sse_response(body, 7).unwrap();
        assert_eq!(message["result"]["ok"], true);
        assert!(sse_response(body, 8).is_err(), "no response to request 8");
    }

    #[test]
    fn failures_are_classified() {
        let cases = [
            (http_error(503, br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32004,"message":"database unavailable"}}"#), "http:503"),
            (http_error(502, b"bad gateway"), "http:502"),
            (tool_error(&json!({"isError":true,"structuredContent":{"error":{"code":"busy","message":"retry"}}})), "tool:busy"),
            (tool_error(&json!({"isError":true,"content":[{"type":"text","text":"boom"}]})), "tool:unknown"),
            (CallError::JsonRpc { code: -32603, message: "internal".into() }, "jsonrpc:-32603"),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error}");
        }
        let CallError::Http { rpc_code, detail, .. } =
            http_error(503, br#"{"error":{"code":-32004,"message":"database unavailable"}}"#)
        else {
            unreachable!()
        };
        assert_eq!((rpc_code, detail.as_str()), (Some(-32004), "database unavailable"));
    }
}
