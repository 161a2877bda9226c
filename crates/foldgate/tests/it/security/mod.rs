//! The gateway's defences, seen from outside over real HTTP: authentication
//! and scopes, tenant isolation, body and input limits, malformed JSON-RPC,
//! rate limits, Host and Origin checks, and the public endpoints.

use std::{
    io::Write as _,
    time::{SystemTime, UNIX_EPOCH},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use foldgate_api::RateLimitConfig;
use foldgate_testkit::Backend;
use foldgate_testkit::gateway::{Era, TestGateway, call, client, ok, refusal};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{
    StatusCode,
    header::{HeaderMap, RETRY_AFTER, WWW_AUTHENTICATE},
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const ISSUER: &str = "https://idp.example";
/// A well-formed branch id that no branch has.
const UNKNOWN_BRANCH: &str = "br_01234567-89ab-7cde-8f01-23456789abcd";

// ---------------------------------------------------------------------------
// Raw HTTP

/// An HTTP answer: status, headers and the body parsed as JSON (or kept as
/// a JSON string when it is not JSON).
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn header(&self, name: impl reqwest::header::AsHeaderName) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// Asserts a JSON-RPC error answer and returns its `error` object.
    fn jsonrpc_error(&self, status: StatusCode, code: i64, why: &str) -> &Value {
        assert_eq!(self.status, status, "{why}: {self:?}");
        let content_type = self.header(reqwest::header::CONTENT_TYPE).unwrap_or_default();
        assert!(content_type.starts_with("application/json"), "{why}: {content_type:?}");
        assert_eq!(self.body["jsonrpc"], "2.0", "{why}: {}", self.body);
        assert!(self.body.get("id").is_some(), "{why}: a JSON-RPC error has an id: {}", self.body);
        assert!(self.body.get("result").is_none(), "{why}: {}", self.body);
        let error = &self.body["error"];
        assert_eq!(error["code"], code, "{why}: {}", self.body);
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{why}: {}", self.body);
        error
    }

    /// Asserts a successful tool call and returns its structured content.
    fn tool_result(&self, why: &str) -> &Value {
        assert_eq!(self.status, StatusCode::OK, "{why}: {self:?}");
        assert!(self.body.get("error").is_none(), "{why}: {}", self.body);
        assert_eq!(self.body["result"]["isError"], false, "{why}: {}", self.body);
        &self.body["result"]["structuredContent"]
    }
}

/// The protocol era of a raw request.
#[derive(Debug, Clone, Copy)]
enum Wire {
    /// A bare POST as a 2025-11-25 client sends it after `initialize`
    /// (stateless: no handshake needed).
    Legacy,
    /// 2026-07-28: routing headers and per-request `_meta`.
    Modern,
}

/// A `tools/call` request body.
fn tool_call(wire: Wire, tool: &str, args: &Value) -> Value {
    let mut params = json!({"name": tool, "arguments": args});
    if let Wire::Modern = wire {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        });
    }
    json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
}

fn mcp_request(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    wire: Wire,
) -> reqwest::RequestBuilder {
    let mut req = http
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream");
    req = match wire {
        Wire::Legacy => req.header("MCP-Protocol-Version", "2025-11-25"),
        Wire::Modern => req.header("MCP-Protocol-Version", "2026-07-28"),
    };
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req
}

async fn send(req: reqwest::RequestBuilder) -> Reply {
    let resp = req.send().await.expect("send");
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("read body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply { status, headers, body }
}

/// Posts `body` as is to the MCP endpoint.
async fn post_raw(gw: &TestGateway, token: Option<&str>, body: impl Into<String>) -> Reply {
    let http = reqwest::Client::new();
    send(mcp_request(&http, &gw.url, token, Wire::Legacy).body(body.into())).await
}

/// Calls a tool with a raw legacy request.
async fn post_tool(gw: &TestGateway, token: &str, tool: &str, args: Value) -> Reply {
    post_raw(gw, Some(token), tool_call(Wire::Legacy, tool, &args).to_string()).await
}

/// Writes `head` and `body` on a fresh TCP connection and reads one answer.
/// For requests reqwest will not make (chunked bodies, lying lengths).
async fn raw_http(gw: &TestGateway, head: &str, body: &[u8]) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(gw.running.addr).await.unwrap();
    let mut request = head.replace('\n', "\r\n").into_bytes();
    request.extend_from_slice(body);
    // The server may answer (and close) before reading everything.
    let _ = stream.write_all(&request).await;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(reply) = parse_http(&received) {
            return reply;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
    parse_http(&received)
        .unwrap_or_else(|| panic!("no complete answer: {:?}", String::from_utf8_lossy(&received)))
}

/// A complete HTTP/1.1 answer with a `Content-Length` body, if `bytes`
/// holds one.
fn parse_http(bytes: &[u8]) -> Option<Reply> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse::<u16>().ok()?;
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        headers.append(
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).ok()?,
            value.trim().parse().ok()?,
        );
    }
    let length: usize = headers.get("content-length")?.to_str().ok()?.parse().ok()?;
    if body.len() < length {
        return None;
    }
    let body = &body[..length];
    Some(Reply {
        status: StatusCode::from_u16(status).ok()?,
        headers,
        body: serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned())),
    })
}

// ---------------------------------------------------------------------------
// Tokens

fn now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

/// Claims of a token the gateway accepts (with `ISSUER` configured).
fn valid_claims(gw: &TestGateway) -> Value {
    json!({
        "iss": ISSUER,
        "aud": gw.url,
        "sub": "alice",
        "tenant": "acme",
        "scope": "fold:read fold:write",
        "iat": now(),
        "exp": now() + 600,
    })
}

/// `base` with the given members replaced.
fn patched(mut base: Value, changes: &Value) -> Value {
    for (k, v) in changes.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

fn sign(alg: Algorithm, claims: &Value, key: &EncodingKey) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).unwrap()
}

fn sign_hs256(claims: &Value, secret: &[u8]) -> String {
    sign(Algorithm::HS256, claims, &EncodingKey::from_secret(secret))
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

/// An unsigned token (`alg: none`) carrying `claims`, with `signature` as
/// its third part.
fn unsigned(claims: &Value, signature: &str) -> String {
    format!("{}.{}.{signature}", b64(&json!({"alg": "none", "typ": "JWT"})), b64(claims))
}

/// `token` with its payload replaced and its signature kept.
fn with_payload(token: &str, claims: &Value) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    format!("{}.{}.{}", parts[0], b64(claims), parts[2])
}

fn signature_of(token: &str) -> &str {
    token.rsplit('.').next().unwrap()
}

fn metadata_url(gw: &TestGateway) -> String {
    format!("{}/.well-known/oauth-protected-resource/mcp", gw.base)
}

/// Asserts a 401 with the RFC 9728 challenge; `invalid_token` says whether
/// the challenge must carry `error="invalid_token"` (a token was sent).
fn assert_unauthorized(reply: &Reply, gw: &TestGateway, invalid_token: bool, why: &str) {
    reply.jsonrpc_error(StatusCode::UNAUTHORIZED, -32001, why);
    let challenge = reply.header(WWW_AUTHENTICATE).unwrap_or_else(|| panic!("{why}: no challenge"));
    let expected = format!("Bearer resource_metadata=\"{}\"", metadata_url(gw));
    assert!(challenge.starts_with(&expected), "{why}: {challenge}");
    assert_eq!(challenge.contains("error=\"invalid_token\""), invalid_token, "{why}: {challenge}");
}

mod auth;
mod isolation;
mod limits;
mod traffic;
