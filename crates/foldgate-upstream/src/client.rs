//! A minimal MCP client for upstream servers: JSON-RPC requests over
//! Streamable HTTP, answered as JSON or as an SSE stream, with the
//! `initialize` handshake done once and redone when the upstream forgets its
//! session. Responses are kept as raw JSON so that results reach the agent
//! exactly as the upstream shaped them.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use serde_json::{Map, Value, json};

use foldgate_background::Activator;

use super::{
    identity::{Identity, IdentityMode, OnBehalf},
    notice::Listener,
    oauth::TokenSource,
};

/// Most sessions kept with one upstream (one per tenant, or user, that
/// called it, and the gateway's own); the least recently used goes first.
const MAX_SESSIONS: usize = 1024;

/// The protocol version foldgate asks upstreams for.
pub(crate) const PROTOCOL_VERSION: &str = "2025-11-25";

/// Why an upstream request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CallError {
    /// Not reached, too slow, or answered something that is not MCP.
    #[error("{0}")]
    Unavailable(String),
    /// The upstream answered with a JSON-RPC error.
    #[error("upstream error {code}: {message}")]
    Rpc { code: i64, message: String, data: Option<Value> },
}

impl CallError {
    /// The failure as `error.type` on metrics and spans:
    /// `upstream_unavailable`, or the JSON-RPC error code.
    pub fn error_type(&self) -> String {
        match self {
            Self::Unavailable(_) => "upstream_unavailable".to_owned(),
            Self::Rpc { code, .. } => crate::metrics::rpc_error_type(*code),
        }
    }
}

/// What the handshake established.
#[derive(Debug)]
struct Session {
    id: Option<HeaderValue>,
    protocol: HeaderValue,
}

/// Whose session: a tenant's (a user's of the tenant, when the upstream is
/// told who calls), or (`None`) the gateway's own.
type SessionKey = Option<(String, Option<String>)>;

/// A session, once its handshake is done. Requests that find the
/// handshake under way wait for it.
type SessionCell = Arc<tokio::sync::OnceCell<Arc<Session>>>;

/// One upstream's sessions: one per tenant, never shared between two (one
/// per user of a tenant when the upstream is told who calls: a session it
/// binds to the user who opened it serves no other), and one for what the
/// gateway asks for itself (tool listings).
#[derive(Debug, Default)]
struct Sessions {
    slots: HashMap<SessionKey, (SessionCell, u64)>,
    /// Counts uses, to find the least recently used.
    clock: u64,
}

impl Sessions {
    /// The session of `key`, perhaps not yet established.
    fn slot(&mut self, key: &SessionKey) -> SessionCell {
        self.clock += 1;
        if let Some((cell, used)) = self.slots.get_mut(key) {
            *used = self.clock;
            return Arc::clone(cell);
        }
        if self.slots.len() >= MAX_SESSIONS {
            let oldest = self.slots.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k);
            if let Some(oldest) = oldest.cloned() {
                self.slots.remove(&oldest);
            }
        }
        let cell = SessionCell::default();
        self.slots.insert(key.clone(), (Arc::clone(&cell), self.clock));
        cell
    }

    /// Drops `key`'s session if it is still `session`.
    fn forget(&mut self, key: &SessionKey, session: &Arc<Session>) {
        let current = self.slots.get(key).and_then(|(cell, _)| cell.get());
        if current.is_some_and(|c| Arc::ptr_eq(c, session)) {
            self.slots.remove(key);
        }
    }
}

/// What the gateway sends an upstream to say who it is and who calls.
#[derive(Debug)]
pub(crate) struct Credentials {
    /// Sent with every request (the upstream's `headers`).
    pub headers: HeaderMap,
    /// Its OAuth client-credentials grant's token source.
    pub oauth: Option<TokenSource>,
    pub identity: Identity,
}

/// One upstream's client. Cheap to share; requests run concurrently.
#[derive(Debug)]
pub(crate) struct McpClient {
    http: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
    oauth: Option<TokenSource>,
    /// What the upstream is told of who calls.
    identity: Identity,
    timeout: Duration,
    max_bytes: usize,
    sessions: Mutex<Sessions>,
    next_id: AtomicU64,
    /// Set off when the upstream says its tool list changed.
    list_changed: Activator,
}

/// A response, or an accepted notification.
enum Answer {
    Message(Value),
    Accepted,
}

impl McpClient {
    pub fn new(
        http: reqwest::Client,
        url: reqwest::Url,
        Credentials { headers, oauth, identity }: Credentials,
        timeout: Duration,
        max_bytes: usize,
        list_changed: Activator,
    ) -> Self {
        Self {
            http,
            url,
            headers,
            oauth,
            identity,
            timeout,
            max_bytes,
            sessions: Mutex::default(),
            next_id: AtomicU64::new(1),
            list_changed,
        }
    }

    /// The upstream's host, as configured (`server.address` on spans).
    pub fn host(&self) -> Option<&str> {
        self.url.host_str()
    }

    /// The upstream's port, explicit or the scheme's (`server.port`).
    pub fn port(&self) -> Option<u16> {
        self.url.port_or_known_default()
    }

    /// Every tool the upstream lists (following pagination).
    pub async fn list_tools(&self) -> Result<Vec<Value>, CallError> {
        let none = HeaderMap::new();
        list_pages(|params| self.request("tools/list", params, &none, None, None)).await
    }

    /// Calls a tool for `caller`, in the caller's tenant's session; the raw
    /// `result` object. What the upstream sends about the call on the way
    /// goes to `listener`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Option<&Map<String, Value>>,
        meta: Option<&Map<String, Value>>,
        extra: &HeaderMap,
        listener: Option<&Listener>,
        caller: Option<&OnBehalf<'_>>,
    ) -> Result<Value, CallError> {
        let params = call_params(name, arguments, meta);
        self.request("tools/call", params, extra, listener, caller).await
    }

    /// A request in the session of `caller`'s tenant, or of the caller when
    /// the upstream is told who calls (the gateway's own without a caller),
    /// telling the upstream who calls as its `identity` says:
    /// the handshake done first, redone once if the upstream lost the
    /// session, and with a fresh token once if it refused ours.
    async fn request(
        &self,
        method: &str,
        params: Value,
        extra: &HeaderMap,
        listener: Option<&Listener>,
        caller: Option<&OnBehalf<'_>>,
    ) -> Result<Value, CallError> {
        let told = self.identity.mode != IdentityMode::None;
        let key: SessionKey = caller.map(|c| {
            let subject = told.then(|| c.principal.subject.as_str().to_owned());
            (c.principal.tenant.as_str().to_owned(), subject)
        });
        let work = async {
            let mut retried = false;
            loop {
                let who = self.identity.headers(caller).map_err(CallError::Unavailable)?;
                let session = self.session(&key, &who).await?;
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let message =
                    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
                let mut headers = extra.clone();
                headers.extend(who);
                match self.post(&message, Some(&session), &headers, listener).await {
                    Err(Retry::SessionLost) | Err(Retry::Unauthorized) if !retried => {
                        retried = true;
                        self.forget(&key, &session).await;
                    }
                    Err(Retry::SessionLost) => {
                        return Err(CallError::Unavailable("the upstream lost the session".into()));
                    }
                    Err(Retry::Unauthorized) => {
                        return Err(CallError::Unavailable(
                            "the upstream refused foldgate's credentials (HTTP 401)".into(),
                        ));
                    }
                    Err(Retry::Fail(e)) => return Err(e),
                    Ok(Answer::Accepted) => {
                        return Err(CallError::Unavailable(
                            "the upstream accepted a request without answering it".into(),
                        ));
                    }
                    Ok(Answer::Message(response)) => return result_of(response, id),
                }
            }
        };
        tokio::time::timeout(self.timeout, work).await.unwrap_or_else(|_| {
            Err(CallError::Unavailable(format!(
                "no answer within {} s",
                self.timeout.as_secs_f64()
            )))
        })
    }

    /// `key`'s established session, doing the handshake (as `who`) if there
    /// is none.
    async fn session(&self, key: &SessionKey, who: &HeaderMap) -> Result<Arc<Session>, CallError> {
        let cell = self.sessions.lock().unwrap_or_else(PoisonError::into_inner).slot(key);
        let session = cell.get_or_try_init(|| async { self.initialize(who).await.map(Arc::new) });
        session.await.cloned()
    }

    /// Drops `key`'s session (if it is still `session`) and a refused token.
    async fn forget(&self, key: &SessionKey, session: &Arc<Session>) {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner).forget(key, session);
        if let Some(oauth) = &self.oauth {
            oauth.invalidate().await;
        }
    }

    /// The handshake, as `who`.
    async fn initialize(&self, who: &HeaderMap) -> Result<Session, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let message = json!({
            "jsonrpc": "2.0", "id": id, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "foldgate", "version": env!("CARGO_PKG_VERSION")},
            },
        });
        let (answer, session_id) =
            self.post_raw(&message, None, who, None).await.map_err(Retry::into_error)?;
        let Answer::Message(response) = answer else {
            return Err(CallError::Unavailable("initialize was not answered".into()));
        };
        let result = result_of(response, id)?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .and_then(|v| HeaderValue::from_str(v).ok())
            .ok_or_else(|| {
                CallError::Unavailable("initialize answered without a protocol version".into())
            })?;
        let session = Session { id: session_id, protocol: version };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(&initialized, Some(&session), who, None).await.map_err(Retry::into_error)?;
        Ok(session)
    }

    async fn post(
        &self,
        message: &Value,
        session: Option<&Session>,
        extra: &HeaderMap,
        listener: Option<&Listener>,
    ) -> Result<Answer, Retry> {
        self.post_raw(message, session, extra, listener).await.map(|(answer, _)| answer)
    }

    /// Sends one message; the answer and any session id the upstream gave.
    /// The notifications that come before the answer on its event stream go
    /// to `listener`, a tool list change to the refresher.
    async fn post_raw(
        &self,
        message: &Value,
        session: Option<&Session>,
        extra: &HeaderMap,
        listener: Option<&Listener>,
    ) -> Result<(Answer, Option<HeaderValue>), Retry> {
        let unavailable = |why: String| Retry::Fail(CallError::Unavailable(why));
        let mut request = self
            .http
            .post(self.url.clone())
            .headers(self.headers.clone())
            .headers(extra.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
        if let Some(s) = session {
            request = request.header(PROTOCOL_HEADER, s.protocol.clone());
            if let Some(id) = &s.id {
                request = request.header(SESSION_HEADER, id.clone());
            }
        }
        if let Some(oauth) = &self.oauth {
            let bearer = oauth.bearer(&self.http, self.timeout).await.map_err(Retry::Fail)?;
            request = request.header(header::AUTHORIZATION, bearer);
        }
        let body = serde_json::to_vec(message).map_err(|e| unavailable(e.to_string()))?;
        let mut response = request
            .body(body)
            .send()
            .await
            .map_err(|e| unavailable(e.without_url().to_string()))?;
        let status = response.status();
        match status {
            StatusCode::ACCEPTED => return Ok((Answer::Accepted, None)),
            StatusCode::NOT_FOUND if session.is_some_and(|s| s.id.is_some()) => {
                return Err(Retry::SessionLost);
            }
            StatusCode::UNAUTHORIZED => return Err(Retry::Unauthorized),
            s if !s.is_success() => return Err(unavailable(format!("HTTP {status}"))),
            _ => {}
        }
        let session_id = response.headers().get(SESSION_HEADER).cloned();
        let is_sse = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let wanted = message.get("id").cloned();
        let mut body = Vec::new();
        let mut sse = SseReader::default();
        loop {
            let chunk =
                response.chunk().await.map_err(|e| unavailable(e.without_url().to_string()))?;
            let Some(chunk) = chunk else { break };
            if body.len() + chunk.len() > self.max_bytes {
                return Err(unavailable(format!(
                    "the response exceeds max_response_bytes ({})",
                    self.max_bytes
                )));
            }
            if is_sse {
                // Answers arrive as events; stop at ours, the stream may stay open.
                let mut notified = |method: &str, params: Option<&Value>| {
                    if method == "notifications/tools/list_changed" {
                        self.list_changed.activate();
                    } else if let Some(listener) = listener {
                        listener.offer(method, params);
                    }
                };
                if let Some(found) = sse.push(&chunk, wanted.as_ref(), &mut notified) {
                    return Ok((Answer::Message(found), session_id));
                }
                sse.account(chunk.len(), self.max_bytes).map_err(unavailable)?;
            } else {
                body.extend_from_slice(&chunk);
            }
        }
        if is_sse {
            return match wanted {
                None => Ok((Answer::Accepted, session_id)),
                Some(_) => Err(unavailable("the event stream ended without an answer".into())),
            };
        }
        if body.is_empty() && wanted.is_none() {
            return Ok((Answer::Accepted, session_id));
        }
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| unavailable(format!("unreadable response: {e}")))?;
        Ok((Answer::Message(value), session_id))
    }
}

/// Every tool an upstream lists, following pagination; `request` sends one
/// `tools/list` with the params given.
pub(crate) async fn list_pages<F, Fut>(mut request: F) -> Result<Vec<Value>, CallError>
where
    F: FnMut(Value) -> Fut,
    Fut: Future<Output = Result<Value, CallError>>,
{
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    // A bound on pages, against an upstream that never stops paginating.
    for _ in 0..100 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let result = request(params).await?;
        let page = result.get("tools").and_then(Value::as_array).ok_or_else(|| {
            CallError::Unavailable("tools/list answered without a tools array".into())
        })?;
        tools.extend(page.iter().cloned());
        match result.get("nextCursor").and_then(Value::as_str) {
            Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
            _ => return Ok(tools),
        }
    }
    Err(CallError::Unavailable("tools/list paginates without end".into()))
}

/// The params of a `tools/call`.
pub(crate) fn call_params(
    name: &str,
    arguments: Option<&Map<String, Value>>,
    meta: Option<&Map<String, Value>>,
) -> Value {
    let mut params = Map::new();
    params.insert("name".into(), Value::String(name.to_owned()));
    if let Some(arguments) = arguments {
        params.insert("arguments".into(), Value::Object(arguments.clone()));
    }
    if let Some(meta) = meta.filter(|m| !m.is_empty()) {
        params.insert("_meta".into(), Value::Object(meta.clone()));
    }
    Value::Object(params)
}

const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
const PROTOCOL_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// What a failed POST asks of the caller.
enum Retry {
    /// HTTP 404 on a session: handshake again.
    SessionLost,
    /// HTTP 401: fetch a fresh token.
    Unauthorized,
    Fail(CallError),
}

impl Retry {
    fn into_error(self) -> CallError {
        match self {
            Self::SessionLost => CallError::Unavailable("the upstream lost the session".into()),
            Self::Unauthorized => CallError::Unavailable(
                "the upstream refused foldgate's credentials (HTTP 401)".into(),
            ),
            Self::Fail(e) => e,
        }
    }
}

/// The `result` of a JSON-RPC response to request `id`.
pub(crate) fn result_of(response: Value, id: u64) -> Result<Value, CallError> {
    let Value::Object(mut obj) = response else {
        return Err(CallError::Unavailable("the response is not a JSON-RPC object".into()));
    };
    if obj.get("id").and_then(Value::as_u64) != Some(id) {
        return Err(CallError::Unavailable("the response answers another request".into()));
    }
    if let Some(error) = obj.remove("error") {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603);
        let message = error.get("message").and_then(Value::as_str).unwrap_or("").to_owned();
        return Err(CallError::Rpc { code, message, data: error.get("data").cloned() });
    }
    match obj.remove("result") {
        Some(result @ Value::Object(_)) => Ok(result),
        _ => Err(CallError::Unavailable("the response has no result object".into())),
    }
}

/// Reads server-sent events as they arrive, looking for one message.
#[derive(Default)]
struct SseReader {
    pending: Vec<u8>,
    seen: usize,
}

impl SseReader {
    /// Adds bytes; returns the JSON-RPC response with the wanted id if a
    /// complete event carried it. The notifications of the events before it
    /// go to `notified` (method, params).
    fn push(
        &mut self,
        bytes: &[u8],
        wanted: Option<&Value>,
        notified: &mut dyn FnMut(&str, Option<&Value>),
    ) -> Option<Value> {
        self.pending.extend_from_slice(bytes);
        while let Some((end, sep)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + sep).take(end).collect();
            let Some(message) = event_data(&event) else { continue };
            match (message.get("id"), message.get("method").and_then(Value::as_str)) {
                (None, Some(method)) => notified(method, message.get("params")),
                (id, None)
                    if id == wanted
                        && (message.get("result").is_some() || message.get("error").is_some()) =>
                {
                    return Some(message);
                }
                // The upstream's own requests (sampling, elicitation) are
                // not answered: the call goes on without them.
                _ => {}
            }
        }
        None
    }

    fn account(&mut self, n: usize, max: usize) -> Result<(), String> {
        self.seen += n;
        if self.seen > max {
            return Err(format!("the response exceeds max_response_bytes ({max})"));
        }
        Ok(())
    }
}

/// Where the first complete event ends, and the separator's length.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i..].starts_with(b"\r\n\r\n") {
            return Some((i, 4));
        }
        if buf[i..].starts_with(b"\n\n") || buf[i..].starts_with(b"\r\r") {
            return Some((i, 2));
        }
        i += 1;
    }
    None
}

/// The JSON of an event's `data:` lines.
fn event_data(event: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    if data.is_empty() {
        return None;
    }
    serde_json::from_str(&data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn established() -> Arc<Session> {
        Arc::new(Session { id: None, protocol: HeaderValue::from_static(PROTOCOL_VERSION) })
    }

    #[test]
    fn sessions_are_kept_per_key_and_the_least_recently_used_goes() {
        let mut sessions = Sessions::default();
        let key = |i: usize| Some((format!("tenant-{i}"), None));
        let first = sessions.slot(&key(0));
        assert!(Arc::ptr_eq(&first, &sessions.slot(&key(0))), "one slot per key");
        assert!(!Arc::ptr_eq(&first, &sessions.slot(&None)), "the gateway's own is apart");
        let alice = Some(("acme".to_owned(), Some("alice".to_owned())));
        let bob = Some(("acme".to_owned(), Some("bob".to_owned())));
        assert!(!Arc::ptr_eq(&sessions.slot(&alice), &sessions.slot(&bob)), "and each user's");
        // Four so far: tenant 0's, the gateway's, alice's and bob's.
        for i in 1..=MAX_SESSIONS - 4 {
            sessions.slot(&key(i));
            // Tenant 0 keeps being used; tenant 1 is left alone.
            sessions.slot(&key(0));
        }
        assert_eq!(sessions.slots.len(), MAX_SESSIONS);
        sessions.slot(&key(MAX_SESSIONS));
        assert_eq!(sessions.slots.len(), MAX_SESSIONS, "bounded");
        assert!(Arc::ptr_eq(&first, &sessions.slot(&key(0))), "the used one stays");
        assert!(!sessions.slots.contains_key(&None), "the least recently used went first");
        assert!(sessions.slots.contains_key(&key(1)) && sessions.slots.contains_key(&alice));
        sessions.slot(&key(MAX_SESSIONS + 1));
        assert!(!sessions.slots.contains_key(&alice), "then the next least recently used");
    }

    #[test]
    fn a_session_is_forgotten_only_while_it_is_the_current_one() {
        let mut sessions = Sessions::default();
        let key = Some(("acme".to_owned(), None));
        let (old, new) = (established(), established());
        sessions.slot(&key).set(Arc::clone(&new)).unwrap();
        // A request that failed on the session before it is not the current one's.
        sessions.forget(&key, &old);
        assert!(sessions.slot(&key).get().is_some_and(|s| Arc::ptr_eq(s, &new)));
        sessions.forget(&key, &new);
        assert!(sessions.slot(&key).get().is_none(), "a handshake is due");
    }

    #[test]
    fn sse_events_are_split_and_matched() {
        let mut r = SseReader::default();
        let wanted = json!(7);
        let mut seen = Vec::new();
        let mut notified = |method: &str, params: Option<&Value>| {
            seen.push((method.to_owned(), params.cloned()));
        };
        let notification = "event: message\ndata: {\"jsonrpc\":\"2.0\",\
            \"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n";
        assert_eq!(r.push(notification.as_bytes(), Some(&wanted), &mut notified), None);
        let request =
            "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"sampling/createMessage\"}\n\n";
        assert_eq!(r.push(request.as_bytes(), Some(&wanted), &mut notified), None);
        let start = b"id: 1\r\ndata: {\"jsonrpc\":\"2.0\",";
        assert_eq!(r.push(start, Some(&wanted), &mut notified), None);
        let end = b"\"id\":7,\"result\":{}}\r\n\r\n";
        let found = r.push(end, Some(&wanted), &mut notified).unwrap();
        assert_eq!(found["id"], 7);
        let other = "data: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{}}\n\n";
        assert_eq!(r.push(other.as_bytes(), Some(&wanted), &mut notified), None);
        assert_eq!(
            seen,
            [("notifications/progress".to_owned(), Some(json!({"progress": 1})))],
            "the notification, not the upstream's request"
        );
    }

    #[test]
    fn multi_line_data_is_joined() {
        let v = event_data(b"data: {\"a\":\ndata: 1}").unwrap();
        assert_eq!(v, json!({"a": 1}));
        assert_eq!(event_data(b": comment"), None);
    }

    #[test]
    fn results_and_errors() {
        assert_eq!(
            result_of(json!({"jsonrpc":"2.0","id":1,"result":{"x":1}}), 1).unwrap(),
            json!({"x":1})
        );
        match result_of(json!({"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad"}}), 1)
        {
            Err(CallError::Rpc { code, message, .. }) => {
                assert_eq!((code, message.as_str()), (-32602, "bad"))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            result_of(json!({"jsonrpc":"2.0","id":2,"result":{}}), 1),
            Err(CallError::Unavailable(_))
        ));
        assert!(matches!(
            result_of(json!({"jsonrpc":"2.0","id":1,"result":[]}), 1),
            Err(CallError::Unavailable(_))
        ));
    }
}
