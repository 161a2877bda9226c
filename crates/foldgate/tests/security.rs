//! The gateway's defences, seen from outside over real HTTP: authentication
//! and scopes, tenant isolation, body and input limits, malformed JSON-RPC,
//! rate limits, Host and Origin checks, and the public endpoints.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod common;

use std::{
    io::Write as _,
    time::{SystemTime, UNIX_EPOCH},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use common::{Era, TestGateway, call, client, ok, refusal};
use foldgate_api::RateLimitConfig;
use foldgate_testkit::Backend;
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

// ---------------------------------------------------------------------------
// Authentication

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_with_a_challenge() {
    let gw =
        TestGateway::start_with(Backend::Sqlite, |c| c.auth.issuer = Some(ISSUER.into())).await;
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    let secret = common::SECRET.as_bytes();
    let good = sign_hs256(&valid_claims(&gw), secret);

    // The control: the same claims, correctly signed, pass.
    let reply = post_raw(&gw, Some(&good), body.clone()).await;
    assert_eq!(reply.tool_result("valid token")["branch_id"], Value::Null);

    let claims = |changes: Value| patched(valid_claims(&gw), &changes);
    let cases: Vec<(Option<String>, &str)> = vec![
        (None, "no token"),
        (Some(sign_hs256(&claims(json!({"exp": now() - 120})), secret)), "expired"),
        (
            Some(sign_hs256(&claims(json!({"nbf": now() + 120})), secret)),
            "not yet valid (beyond the leeway)",
        ),
        (
            Some(sign_hs256(&claims(json!({"iss": "https://other-idp.example"})), secret)),
            "wrong issuer",
        ),
        (Some(sign_hs256(&claims(json!({"iss": null})), secret)), "no issuer"),
        (
            Some(sign_hs256(&claims(json!({"aud": "https://other.example/mcp"})), secret)),
            "wrong audience",
        ),
        (Some(sign_hs256(&claims(json!({"aud": null})), secret)), "no audience"),
        (Some(unsigned(&valid_claims(&gw), "")), "alg none, empty signature"),
        (Some(unsigned(&valid_claims(&gw), signature_of(&good))), "alg none, a real signature"),
        (
            Some(with_payload(&good, &claims(json!({"tenant": "globex"})))),
            "tampered payload (tenant changed)",
        ),
        (
            Some(with_payload(&good, &claims(json!({"exp": now() + 86_400 * 365})))),
            "tampered payload (expiry extended)",
        ),
        (
            Some(sign_hs256(&valid_claims(&gw), b"another-secret-that-is-long-enough-0123456789")),
            "wrong secret",
        ),
        (Some("not-a-jwt".to_owned()), "not a JWT"),
    ];
    for (token, why) in cases {
        let reply = post_raw(&gw, token.as_deref(), body.clone()).await;
        assert_unauthorized(&reply, &gw, token.is_some(), why);
    }

    // Another scheme is no bearer token.
    let http = reqwest::Client::new();
    let reply = send(
        mcp_request(&http, &gw.url, None, Wire::Legacy)
            .header("Authorization", "Basic YWxpY2U6c2VjcmV0")
            .body(body.clone()),
    )
    .await;
    assert_unauthorized(&reply, &gw, false, "basic auth");
    gw.stop().await;
}

/// A gateway configured with an RSA public key refuses an HS256 token
/// signed with that key's PEM text as the HMAC secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithm_confusion_is_refused() {
    use rsa::{
        RsaPrivateKey,
        pkcs1::EncodeRsaPrivateKey,
        pkcs8::{EncodePublicKey, LineEnding},
    };
    let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
    let private_pem = key.to_pkcs1_pem(LineEnding::LF).unwrap().to_string();
    let public_pem = key.to_public_key().to_public_key_pem(LineEnding::LF).unwrap();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(public_pem.as_bytes()).unwrap();
    let path = file.path().to_owned();

    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.auth.jwt_secret = None;
        c.auth.public_key_file = Some(path);
        c.auth.issuer = Some(ISSUER.into());
    })
    .await;
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();

    let rsa_key = EncodingKey::from_rsa_pem(private_pem.as_bytes()).unwrap();
    let good = sign(Algorithm::RS256, &valid_claims(&gw), &rsa_key);
    let reply = post_raw(&gw, Some(&good), body.clone()).await;
    assert_eq!(reply.tool_result("RS256 control")["branch_id"], Value::Null);

    let cases = [
        (sign_hs256(&valid_claims(&gw), public_pem.as_bytes()), "HS256 with the PEM as secret"),
        (
            sign_hs256(&valid_claims(&gw), public_pem.trim_end().as_bytes()),
            "HS256 with the trimmed PEM as secret",
        ),
        (
            sign(
                Algorithm::HS384,
                &valid_claims(&gw),
                &EncodingKey::from_secret(public_pem.as_bytes()),
            ),
            "HS384 with the PEM as secret",
        ),
        (sign_hs256(&valid_claims(&gw), common::SECRET.as_bytes()), "HS256 with the test secret"),
        (unsigned(&valid_claims(&gw), ""), "alg none"),
        (
            with_payload(&good, &patched(valid_claims(&gw), &json!({"tenant": "globex"}))),
            "RS256 with a tampered payload",
        ),
    ];
    for (token, why) in cases {
        let reply = post_raw(&gw, Some(&token), body.clone()).await;
        assert_unauthorized(&reply, &gw, true, why);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_scopes_are_refused_with_insufficient_scope() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let read_only = gw.token("acme", "alice", &["fold:read"]);
    let write_only = gw.token("acme", "alice", &["fold:write"]);
    let no_scope = gw.token("acme", "alice", &[]);
    let create = json!({"session_id": "s", "description": "d"});
    let ret = json!({"branch_id": UNKNOWN_BRANCH, "message": "m"});
    let status = json!({"session_id": "s"});
    let end = json!({"session_id": "s"});
    let cases = [
        (&read_only, "branch_create", &create, "fold:write", "read-only creates"),
        (&read_only, "branch_return", &ret, "fold:write", "read-only returns"),
        (&read_only, "session_end", &end, "fold:write", "read-only ends a session"),
        (&write_only, "branch_status", &status, "fold:read", "write-only reads status"),
        (&no_scope, "branch_status", &status, "fold:read", "no scope reads status"),
        (&no_scope, "branch_create", &create, "fold:write", "no scope creates"),
    ];
    for (token, tool, args, scope, why) in cases {
        let reply = post_tool(&gw, token, tool, args.clone()).await;
        reply.jsonrpc_error(StatusCode::FORBIDDEN, -32003, why);
        let challenge = reply.header(WWW_AUTHENTICATE).unwrap_or_else(|| panic!("{why}"));
        assert!(
            challenge
                .starts_with(&format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\"")),
            "{why}: {challenge}"
        );
        assert!(
            challenge.contains(&format!("resource_metadata=\"{}\"", metadata_url(&gw))),
            "{why}: {challenge}"
        );
    }
    // Nothing was created by the refused calls.
    let full = gw.write_token("acme", "alice");
    let reply = post_tool(&gw, &full, "branch_status", status.clone()).await;
    assert_eq!(reply.tool_result("after refusals")["branch_id"], Value::Null);

    // The controls: each scope is enough for its own tools.
    let reply = post_tool(&gw, &read_only, "branch_status", status).await;
    assert_eq!(reply.tool_result("read-only reads")["branch_id"], Value::Null);
    let reply = post_tool(&gw, &write_only, "branch_create", create).await;
    assert_eq!(reply.tool_result("write-only creates")["depth"], 1);
    gw.stop().await;
}

/// JSON objects with repeated members, where the checks in front of rmcp
/// and rmcp itself might read different values: none may let a read-only
/// token create a branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_members_cannot_smuggle_a_call_past_the_checks() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let read_only = gw.token("acme", "alice", &["fold:read"]);
    let args = r#"{"session_id": "smuggled", "description": "d"}"#;
    let cases = [
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {{"name": "branch_create", "arguments": {args}}}, "method": "ping"}}"#
            ),
            "method repeated",
        ),
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "tools/call",
                    "params": {{"name": "branch_create", "arguments": {args}}}}}"#
            ),
            "method repeated, tools/call last",
        ),
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {{"name": "branch_create", "name": "branch_status", "arguments": {args}}}}}"#
            ),
            "name repeated, read tool last",
        ),
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {{"name": "branch_create", "arguments": {args}}},
                    "params": {{"name": "branch_status", "arguments": {{"session_id": "s"}}}}}}"#
            ),
            "params repeated, read call last",
        ),
    ];
    for (body, why) in cases {
        let reply = post_raw(&gw, Some(&read_only), body).await;
        assert!(
            matches!(reply.status, StatusCode::BAD_REQUEST | StatusCode::FORBIDDEN),
            "{why}: {reply:?}"
        );
        assert!(reply.body["error"]["code"].is_i64(), "{why}: a JSON-RPC error: {reply:?}");
    }
    let full = gw.write_token("acme", "alice");
    let reply = post_tool(&gw, &full, "branch_status", json!({"session_id": "smuggled"})).await;
    assert_eq!(reply.tool_result("nothing was created")["branch_id"], Value::Null);
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Tenant isolation

/// What an intruder's call must look like.
#[derive(Debug, Clone, Copy)]
enum Seen {
    /// A tool refusal with this code.
    Refused(&'static str),
    /// `branch_status` by session: as if the session had no branch.
    NoActiveBranch,
}

async fn tenant_isolation(backend: Backend) {
    let gw = TestGateway::start(backend).await;
    let owner = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    let session = "conv-shared-name";
    let created = ok(&call(
        &owner,
        "branch_create",
        json!({
            "session_id": session,
            "description": "Alice's private investigation",
            "prompt": "Look at the payroll export.",
            "budget": 4096,
        }),
    )
    .await);
    let branch = created["branch_id"].as_str().unwrap().to_owned();
    let before = ok(&call(&owner, "branch_status", json!({"branch_id": branch})).await);
    assert_eq!(before["status"], "active");

    let other_tenant = client(&gw.url, &gw.write_token("globex", "alice"), Era::Legacy).await;
    let same_tenant = client(&gw.url, &gw.write_token("acme", "mallory"), Era::Discover).await;
    for (intruder, who) in [(&other_tenant, "tenant globex"), (&same_tenant, "acme/mallory")] {
        let probes = [
            ("branch_status", json!({"branch_id": branch}), Seen::Refused("branch_not_found")),
            ("branch_status", json!({"session_id": session}), Seen::NoActiveBranch),
            (
                "branch_status",
                json!({"branch_id": branch, "session_id": session}),
                Seen::Refused("branch_not_found"),
            ),
            (
                "branch_return",
                json!({"branch_id": branch, "message": "hijacked"}),
                Seen::Refused("branch_not_found"),
            ),
            (
                "branch_return",
                json!({"branch_id": branch, "message": "hijacked", "outcome": "failure"}),
                Seen::Refused("branch_not_found"),
            ),
            ("session_end", json!({"session_id": session}), Seen::Refused("session_not_found")),
            (
                "branch_create",
                json!({"session_id": session, "description": "child", "parent_branch_id": branch}),
                Seen::Refused("branch_not_found"),
            ),
            (
                "branch_create",
                json!({"session_id": "elsewhere", "description": "c", "parent_branch_id": branch}),
                Seen::Refused("branch_not_found"),
            ),
            // After the refused creates, the session is still not theirs.
            ("session_end", json!({"session_id": session}), Seen::Refused("session_not_found")),
            ("branch_status", json!({"session_id": session}), Seen::NoActiveBranch),
        ];
        for (tool, args, seen) in probes {
            let why = format!("{who}: {tool} {args}");
            let result = call(intruder, tool, args).await;
            match seen {
                Seen::Refused(code) => assert_eq!(refusal(&result).0, code, "{why}"),
                Seen::NoActiveBranch => assert_eq!(
                    Value::Object(ok(&result)),
                    json!({
                        "branch_id": null,
                        "status": "No active branch found",
                        "session_tokens_returned": 0,
                    }),
                    "{why}"
                ),
            }
        }
    }

    // Another subject in the same tenant cannot open branches in the session.
    let result =
        call(&same_tenant, "branch_create", json!({"session_id": session, "description": "squat"}))
            .await;
    assert_eq!(refusal(&result).0, "session_not_found", "acme/mallory creates in alice's session");

    // Another tenant using the same session name gets a session of its own.
    let theirs = ok(&call(
        &other_tenant,
        "branch_create",
        json!({"session_id": session, "description": "globex's own work"}),
    )
    .await);
    assert_eq!(theirs["depth"], 1, "not nested under alice's branch");
    assert_eq!(theirs["parent_branch_id"], Value::Null);
    let ended = ok(&call(&other_tenant, "session_end", json!({"session_id": session})).await);
    assert_eq!(ended["branches_ended"], 1, "only globex's branch");

    // Alice's branch is exactly as it was, and still hers to finish.
    let after = ok(&call(&owner, "branch_status", json!({"branch_id": branch})).await);
    assert_eq!(after, before, "alice's branch changed");
    let current = ok(&call(&owner, "branch_status", json!({"session_id": session})).await);
    assert_eq!(current["branch_id"], branch.as_str());
    let returned = ok(&call(
        &owner,
        "branch_return",
        json!({"branch_id": branch, "message": "Payroll export is fine."}),
    )
    .await);
    assert_eq!(returned["status"], "completed");
    assert_eq!(returned["message"], "Payroll export is fine.");
    assert_eq!(returned["children_force_returned"], json!([]));

    for c in [owner, other_tenant, same_tenant] {
        c.cancel().await.unwrap();
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_isolation_sqlite() {
    tenant_isolation(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_isolation_postgres() {
    tenant_isolation(Backend::Postgres).await;
}

// ---------------------------------------------------------------------------
// Slow and idle connections

/// Reads from `stream` until the server closes it, for at most `limit`;
/// returns what was read, or `None` if the connection was still open.
async fn read_until_closed(
    stream: &mut tokio::net::TcpStream,
    limit: std::time::Duration,
) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read_all).await.ok().map(|()| received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_and_idle_connections_are_closed() {
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.api.header_read_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    let limit = std::time::Duration::from_secs(15);

    // Half a request head, then silence.
    let mut half = tokio::net::TcpStream::connect(gw.running.addr).await.unwrap();
    half.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl").await.unwrap();
    let answer = read_until_closed(&mut half, limit).await;
    assert!(answer.is_some(), "a half-sent request head kept its connection open");

    // A complete request is answered; the kept-alive connection is then
    // closed once it stays idle.
    let mut idle = tokio::net::TcpStream::connect(gw.running.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let answer = read_until_closed(&mut idle, limit)
        .await
        .expect("an idle kept-alive connection stayed open");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // A connection that keeps sending complete requests is served for
    // longer than the timeout.
    let http = reqwest::Client::new();
    for _ in 0..4 {
        let health = http.get(format!("{}/healthz", gw.base)).send().await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Request bodies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused_with_413() {
    let gw = TestGateway::start_with(Backend::Sqlite, |c| c.api.max_body_bytes = 4096).await;
    let token = gw.write_token("acme", "alice");
    let call_with_prompt = |len: usize| {
        tool_call(
            Wire::Legacy,
            "branch_create",
            &json!({"session_id": "s", "description": "d", "prompt": "p".repeat(len)}),
        )
        .to_string()
    };
    let small = call_with_prompt(3000);
    let large = call_with_prompt(10 * 1024);
    assert!(small.len() < 4096 && large.len() > 10 * 1024);

    // The control: a body under the limit passes.
    let reply = post_raw(&gw, Some(&token), small.clone()).await;
    assert_eq!(reply.tool_result("3 KB body")["depth"], 1);

    let addr = gw.running.addr;
    let head = |extra: &str| {
        format!(
            "POST /mcp HTTP/1.1\nHost: {addr}\nAuthorization: Bearer {token}\n\
             Content-Type: application/json\nAccept: application/json, text/event-stream\n\
             MCP-Protocol-Version: 2025-11-25\nConnection: close\n{extra}\n"
        )
    };
    let chunked = {
        let mut body = Vec::new();
        for chunk in large.as_bytes().chunks(1000) {
            write!(body, "{:x}\r\n", chunk.len()).unwrap();
            body.extend_from_slice(chunk);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"0\r\n\r\n");
        body
    };
    let cases: Vec<(Reply, &str)> = vec![
        (post_raw(&gw, Some(&token), large.clone()).await, "10 KB with Content-Length"),
        (
            raw_http(&gw, &head("Transfer-Encoding: chunked\n"), &chunked).await,
            "10 KB chunked, no Content-Length",
        ),
        (
            raw_http(&gw, &head("Content-Length: 100000000\n"), small.as_bytes()).await,
            "Content-Length over the limit, short body sent",
        ),
        (post_raw(&gw, None, large.clone()).await, "10 KB without a token"),
    ];
    for (reply, why) in cases {
        let error = reply.jsonrpc_error(StatusCode::PAYLOAD_TOO_LARGE, -32600, why);
        assert!(error["message"].as_str().unwrap().contains("4096"), "{why}: {error}");
    }

    // A chunked body under the limit is read whole and served.
    let mut body = Vec::new();
    for chunk in small.as_bytes().chunks(700) {
        write!(body, "{:x}\r\n", chunk.len()).unwrap();
        body.extend_from_slice(chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let reply = raw_http(&gw, &head("Transfer-Encoding: chunked\n"), &body).await;
    assert_eq!(reply.tool_result("3 KB chunked")["depth"], 2);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_rpc_is_refused_with_400() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let token = gw.write_token("acme", "alice");
    let valid = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"}));
    let cases: Vec<(String, i64, &str)> = vec![
        ("{not json".to_owned(), -32700, "malformed JSON"),
        (String::new(), -32700, "empty body"),
        (r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/call""#.to_owned(), -32700, "truncated"),
        (r#"{"hello": 1}"#.to_owned(), -32600, "an object that is not JSON-RPC"),
        (json!([valid]).to_string(), -32600, "a batch"),
        ("[]".to_owned(), -32600, "an empty batch"),
        (r#""tools/call""#.to_owned(), -32600, "a string"),
        ("42".to_owned(), -32600, "a number"),
        (patched(valid.clone(), &json!({"jsonrpc": "1.0"})).to_string(), -32600, "jsonrpc 1.0"),
        (patched(valid.clone(), &json!({"jsonrpc": 2})).to_string(), -32600, "jsonrpc a number"),
        (
            {
                let mut v = valid.clone();
                v.as_object_mut().unwrap().remove("jsonrpc");
                v.to_string()
            },
            -32600,
            "no jsonrpc member",
        ),
        (patched(valid.clone(), &json!({"method": 5})).to_string(), -32600, "method a number"),
        (patched(valid.clone(), &json!({"id": {"n": 1}})).to_string(), -32600, "id an object"),
        (patched(valid.clone(), &json!({"id": true})).to_string(), -32600, "id a boolean"),
        (patched(valid.clone(), &json!({"params": "x"})).to_string(), -32602, "params a string"),
        (
            patched(valid.clone(), &json!({"params": {"name": 5}})).to_string(),
            -32602,
            "tool name a number",
        ),
        (patched(valid.clone(), &json!({"params": {}})).to_string(), -32602, "no tool name"),
        (r#"{"jsonrpc": "2.0", "id": 1}"#.to_owned(), -32600, "neither request nor response"),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "ping"}"#.to_owned(),
            -32600,
            "a repeated member",
        ),
    ];
    for (body, code, why) in cases {
        let reply = post_raw(&gw, Some(&token), body).await;
        reply.jsonrpc_error(StatusCode::BAD_REQUEST, code, why);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_argument_is_a_400_naming_the_field() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let token = gw.write_token("acme", "alice");
    let id = UNKNOWN_BRANCH;
    let create = |changes: Value| patched(json!({"session_id": "s", "description": "d"}), &changes);
    let ret = |changes: Value| patched(json!({"branch_id": id, "message": "m"}), &changes);
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        // branch_create
        ("branch_create", json!({"description": "d"}), "session_id", "session_id missing"),
        ("branch_create", create(json!({"session_id": 5})), "session_id", "session_id type"),
        ("branch_create", create(json!({"session_id": ""})), "session_id", "session_id empty"),
        ("branch_create", create(json!({"session_id": "a b"})), "session_id", "session_id space"),
        ("branch_create", create(json!({"session_id": "a/b"})), "session_id", "session_id slash"),
        (
            "branch_create",
            create(json!({"session_id": "s".repeat(129)})),
            "session_id",
            "session_id 129 chars",
        ),
        ("branch_create", json!({"session_id": "s"}), "description", "description missing"),
        ("branch_create", create(json!({"description": ""})), "description", "description empty"),
        (
            "branch_create",
            create(json!({"description": "\u{7}\u{1b}"})),
            "description",
            "description only control characters",
        ),
        (
            "branch_create",
            create(json!({"description": "x".repeat(501)})),
            "description",
            "description 501 chars",
        ),
        ("branch_create", create(json!({"description": ["d"]})), "description", "description type"),
        (
            "branch_create",
            create(json!({"prompt": "x".repeat(10_001)})),
            "prompt",
            "prompt 10,001 chars",
        ),
        ("branch_create", create(json!({"prompt": 1})), "prompt", "prompt type"),
        ("branch_create", create(json!({"budget": "big"})), "budget", "budget type"),
        ("branch_create", create(json!({"budget": 1.5})), "budget", "budget fraction"),
        ("branch_create", create(json!({"budget": true})), "budget", "budget boolean"),
        ("branch_create", create(json!({"budget": 10})), "budget", "budget under the minimum"),
        ("branch_create", create(json!({"budget": -1})), "budget", "budget negative"),
        ("branch_create", create(json!({"budget": 1e300})), "budget", "budget huge float"),
        (
            "branch_create",
            create(json!({"timeout_seconds": 0})),
            "timeout_seconds",
            "timeout_seconds zero",
        ),
        (
            "branch_create",
            create(json!({"timeout_seconds": -5})),
            "timeout_seconds",
            "timeout_seconds negative",
        ),
        (
            "branch_create",
            create(json!({"timeout_seconds": "60"})),
            "timeout_seconds",
            "timeout_seconds type",
        ),
        (
            "branch_create",
            create(json!({"parent_branch_id": "x"})),
            "parent_branch_id",
            "parent_branch_id format",
        ),
        (
            "branch_create",
            create(json!({"parent_branch_id": "br_not-a-uuid"})),
            "parent_branch_id",
            "parent_branch_id not a UUID",
        ),
        (
            "branch_create",
            create(json!({"parent_branch_id": 3})),
            "parent_branch_id",
            "parent_branch_id type",
        ),
        ("branch_create", create(json!({"tenant": "globex"})), "tenant", "unknown argument"),
        // branch_return
        ("branch_return", json!({"message": "m"}), "branch_id", "branch_id missing"),
        ("branch_return", ret(json!({"branch_id": "nope"})), "branch_id", "branch_id format"),
        ("branch_return", ret(json!({"branch_id": 42})), "branch_id", "branch_id type"),
        (
            "branch_return",
            ret(json!({"branch_id": id.to_uppercase()})),
            "branch_id",
            "branch_id prefix case",
        ),
        ("branch_return", json!({"branch_id": id}), "message", "message missing"),
        (
            "branch_return",
            ret(json!({"message": "x".repeat(50_001)})),
            "message",
            "message 50,001 chars",
        ),
        ("branch_return", ret(json!({"message": {"text": "m"}})), "message", "message type"),
        ("branch_return", ret(json!({"outcome": "meh"})), "outcome", "outcome value"),
        ("branch_return", ret(json!({"outcome": 1})), "outcome", "outcome type"),
        ("branch_return", ret(json!({"tokens_used": 1})), "tokens_used", "unknown argument"),
        // branch_status
        ("branch_status", json!({}), "branch_id", "neither id"),
        ("branch_status", json!({"branch_id": null, "session_id": null}), "branch_id", "both null"),
        ("branch_status", json!({"branch_id": "x"}), "branch_id", "branch_id format"),
        ("branch_status", json!({"session_id": ""}), "session_id", "session_id empty"),
        ("branch_status", json!({"session_id": "a b"}), "session_id", "session_id format"),
        ("branch_status", json!({"session_id": "s", "depth": 1}), "depth", "unknown argument"),
        // session_end
        ("session_end", json!({}), "session_id", "session_id missing"),
        ("session_end", json!({"session_id": "bad id!"}), "session_id", "session_id format"),
        (
            "session_end",
            json!({"session_id": "s".repeat(129)}),
            "session_id",
            "session_id 129 chars",
        ),
        ("session_end", json!({"session_id": "s", "force": true}), "force", "unknown argument"),
    ];
    let http = reqwest::Client::new();
    for wire in [Wire::Legacy, Wire::Modern] {
        for (tool, args, field, why) in &cases {
            let why = format!("{wire:?} {tool}: {why}");
            let req = mcp_request(&http, &gw.url, Some(&token), wire)
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", *tool)
                .body(tool_call(wire, tool, args).to_string());
            let reply = send(req).await;
            let error = reply.jsonrpc_error(StatusCode::BAD_REQUEST, -32602, &why);
            assert_eq!(reply.body["id"], 7, "{why}: the request id is echoed");
            assert_eq!(error["data"]["field"], *field, "{why}: {error}");
            assert!(error["data"]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{why}");
        }
        // Arguments that are not an object.
        let req = mcp_request(&http, &gw.url, Some(&token), wire)
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", "branch_create")
            .body(tool_call(wire, "branch_create", &json!(["s", "d"])).to_string());
        let reply = send(req).await;
        let error = reply.jsonrpc_error(StatusCode::BAD_REQUEST, -32602, "arguments an array");
        assert_eq!(error["data"]["field"], "arguments");
    }

    // The controls, in both eras: valid calls of each tool pass.
    for wire in [Wire::Legacy, Wire::Modern] {
        let session = format!("valid-{wire:?}");
        let mut branch = None;
        for (tool, args) in [
            ("branch_create", json!({"session_id": session, "description": "d", "budget": 256.0})),
            ("branch_status", json!({"session_id": session})),
            ("branch_return", json!({"message": "done", "outcome": "success"})),
            ("session_end", json!({"session_id": session})),
        ] {
            let mut args = args;
            if tool == "branch_return" {
                args["branch_id"] = json!(branch.clone().unwrap());
            }
            let req = mcp_request(&http, &gw.url, Some(&token), wire)
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", tool)
                .body(tool_call(wire, tool, &args).to_string());
            let reply = send(req).await;
            let result = reply.tool_result(&format!("{wire:?} valid {tool}"));
            if tool == "branch_create" {
                branch = Some(result["branch_id"].as_str().unwrap().to_owned());
            }
        }
    }
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Rate limits

fn assert_rate_limited(reply: &Reply, why: &str) -> u64 {
    let error = reply.jsonrpc_error(StatusCode::TOO_MANY_REQUESTS, -32029, why);
    let header: u64 = reply
        .header(RETRY_AFTER)
        .unwrap_or_else(|| panic!("{why}: no Retry-After"))
        .parse()
        .unwrap();
    assert!(header >= 1, "{why}");
    assert_eq!(error["data"]["retry_after"], header, "{why}: {error}");
    assert_eq!(error["data"]["code"], "rate_limited", "{why}: {error}");
    header
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_principal_rate_get_429() {
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.api.rate_limit = RateLimitConfig { per_second: 1, burst: 2 };
    })
    .await;
    let alice = gw.write_token("acme", "alice");
    let bob = gw.write_token("acme", "bob");
    let status = json!({"session_id": "s"});
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(post_tool(&gw, &alice, "branch_status", status.clone()).await);
    }
    for (i, reply) in statuses.iter().take(2).enumerate() {
        reply.tool_result(&format!("request {i} within the burst"));
    }
    for (i, reply) in statuses.iter().enumerate().skip(2) {
        let secs = assert_rate_limited(reply, &format!("request {i} over the burst"));
        assert!(secs <= 2, "one token per second: {secs}");
    }
    // The limit is per principal: another subject is unaffected.
    post_tool(&gw, &bob, "branch_status", status).await.tool_result("bob");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_creation_rate_gives_429() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let token = gw.write_token("acme", "alice");
    for i in 0..5 {
        let created = post_tool(
            &gw,
            &token,
            "branch_create",
            json!({"session_id": "busy", "description": format!("attempt {i}")}),
        )
        .await;
        let branch = created.tool_result(&format!("create {i}"))["branch_id"].clone();
        post_tool(&gw, &token, "branch_return", json!({"branch_id": branch, "message": "done"}))
            .await
            .tool_result(&format!("return {i}"));
    }
    let sixth = post_tool(
        &gw,
        &token,
        "branch_create",
        json!({"session_id": "busy", "description": "one too many"}),
    )
    .await;
    let secs = assert_rate_limited(&sixth, "sixth create in a minute");
    assert!((50..=60).contains(&secs), "the window is a minute: {secs}");
    assert_eq!(sixth.body["id"], 7, "the request id is echoed");

    // Nothing was created, and other sessions are not limited.
    let status = post_tool(&gw, &token, "branch_status", json!({"session_id": "busy"})).await;
    assert_eq!(status.tool_result("after the refusal")["branch_id"], Value::Null);
    post_tool(&gw, &token, "branch_create", json!({"session_id": "calm", "description": "d"}))
        .await
        .tool_result("another session");
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Host and Origin

/// Extra request headers.
type Headers<'a> = Vec<(&'a str, &'a str)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_and_origin_are_checked() {
    let allowed_origin = "https://app.example";
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.api.allowed_origins = vec![allowed_origin.to_owned()];
    })
    .await;
    let token = gw.write_token("acme", "alice");
    let port = gw.running.addr.port();
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    let http = reqwest::Client::new();
    let evil_host = format!("evil.example:{port}");
    let localhost = format!("localhost:{port}");
    let cases: Vec<(Headers<'_>, StatusCode, &str)> = vec![
        (vec![("Host", "evil.example")], StatusCode::FORBIDDEN, "foreign Host"),
        (vec![("Host", &evil_host)], StatusCode::FORBIDDEN, "foreign Host with our port"),
        (vec![("Origin", "https://evil.example")], StatusCode::FORBIDDEN, "foreign Origin"),
        (vec![("Origin", "null")], StatusCode::FORBIDDEN, "opaque Origin"),
        (
            vec![("Origin", "https://app.example.evil.example")],
            StatusCode::FORBIDDEN,
            "Origin extending an allowed one",
        ),
        (vec![("Origin", "http://app.example")], StatusCode::FORBIDDEN, "Origin other scheme"),
        (vec![], StatusCode::OK, "no Origin"),
        (vec![("Origin", allowed_origin)], StatusCode::OK, "allowed Origin"),
        (vec![("Host", &localhost)], StatusCode::OK, "localhost"),
    ];
    for (headers, status, why) in cases {
        let mut req = mcp_request(&http, &gw.url, Some(&token), Wire::Legacy).body(body.clone());
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let reply = send(req).await;
        if status == StatusCode::OK {
            reply.tool_result(why);
        } else {
            reply.jsonrpc_error(status, -32600, why);
        }
    }
    // Refused before authentication: no token needed to be turned away.
    let reply = send(
        mcp_request(&http, &gw.url, None, Wire::Legacy)
            .header("Origin", "https://evil.example")
            .body(body),
    )
    .await;
    reply.jsonrpc_error(StatusCode::FORBIDDEN, -32600, "foreign Origin without a token");
    gw.stop().await;

    // With no allowed origins configured, a foreign Origin is refused too.
    let gw = TestGateway::start(Backend::Sqlite).await;
    let token = gw.write_token("acme", "alice");
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    for origin in ["https://evil.example", "null"] {
        let reply = send(
            mcp_request(&http, &gw.url, Some(&token), Wire::Legacy)
                .header("Origin", origin)
                .body(body.clone()),
        )
        .await;
        reply.jsonrpc_error(StatusCode::FORBIDDEN, -32600, &format!("default policy: {origin}"));
    }
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Public endpoints

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_protected_resource_metadata() {
    let gw =
        TestGateway::start_with(Backend::Sqlite, |c| c.auth.issuer = Some(ISSUER.into())).await;
    let http = reqwest::Client::new();

    let health = http.get(format!("{}/healthz", gw.base)).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let ready = send(http.get(format!("{}/readyz", gw.base))).await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:?}");
    assert_eq!(ready.body, json!({"ready": true, "database": "ok", "supervisor": "ok"}));

    let expected = json!({
        "resource": gw.url,
        "authorization_servers": [ISSUER],
        "scopes_supported": ["fold:read", "fold:write"],
        "bearer_methods_supported": ["header"],
    });
    for path in
        ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]
    {
        let reply = send(http.get(format!("{}{path}", gw.base))).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert_eq!(reply.body, expected, "{path}");
    }

    // The URL in the 401 challenge leads to the same document.
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    let challenged = post_raw(&gw, None, body).await;
    let challenge = challenged.header(WWW_AUTHENTICATE).unwrap();
    let url = challenge.split("resource_metadata=\"").nth(1).unwrap().split('"').next().unwrap();
    let reply = send(http.get(url)).await;
    assert_eq!(reply.body, expected, "{url}");
    gw.stop().await;
}
