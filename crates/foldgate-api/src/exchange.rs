//! The one layer in front of rmcp for every message posted to `/mcp`. It
//! reads the request once and the answer once, and in between:
//!
//! 1. parses the JSON-RPC message and reads what it asks for
//!    ([`call`](crate::call)), then starts its operation — span and
//!    duration metric ([`observe`](crate::observe));
//! 2. checks it ([`guard`](crate::guard)): a bad message or bad arguments are
//!    a 400 that names the field, a missing scope a 403; a tool call it lets
//!    through goes on in the request's extensions, parsed
//!    ([`Checked`](crate::call::Checked));
//! 3. while the database is known to be out of reach ([`Outage`]), answers
//!    503 at once;
//! 4. hands it to rmcp;
//! 5. reads the answer's head: a limit's JSON-RPC error becomes HTTP 429
//!    with `Retry-After`, the database's becomes 503 (and trips the
//!    outage), and rmcp's plain-text refusal of a message it cannot read
//!    becomes a JSON-RPC 400;
//! 6. records the operation's outcome.
//!
//! One layer rather than one per concern, so that a call's request and
//! answer are each parsed once on the way through.

use std::sync::Arc;

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::Value;
use tracing::Instrument as _;

use crate::{
    auth::Authenticated,
    call::Read,
    error::{Outage, RATE_LIMITED, UNAVAILABLE, jsonrpc_error},
    guard::{self, GuardState},
    metrics::McpMetrics,
    observe::{Answer, Incoming, Operation, ResponseHead},
};

/// How rmcp's refusal of a message it cannot deserialize starts (HTTP 415,
/// plain text); the serde error follows.
const RMCP_UNREADABLE: &[u8] = b"fail to deserialize request body ";

/// What the layer needs.
#[derive(Debug, Clone)]
pub(crate) struct ExchangeState {
    pub guard: GuardState,
    pub metrics: McpMetrics,
    pub outage: Arc<Outage>,
}

pub(crate) async fn mcp_exchange(
    State(state): State<ExchangeState>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() != Method::POST {
        if let Some(refusal) = state.outage.refusal() {
            return refusal;
        }
        return next.run(req).await;
    }
    let (mut parts, bytes) = match buffered_request(req).await {
        Ok(buffered) => buffered,
        Err(response) => return response,
    };
    let message = serde_json::from_slice::<Value>(&bytes);
    let who = parts.extensions.get::<Authenticated>();
    let read = message
        .as_ref()
        .ok()
        .and_then(|m| Read::new(m, &parts.headers, who, &state.guard.upstreams));
    // A response to a server request, or not JSON-RPC at all (which the
    // guard refuses), is no operation to record.
    let operation = read
        .as_ref()
        .and_then(|read| Incoming::of(read, &parts.headers, who))
        .map(|incoming| Operation::start(state.metrics.clone(), incoming));
    let checked = guard::check_message(&state.guard, who, &message, read.as_ref());
    drop(read);
    drop(message);
    let exchange = async {
        let response = match checked {
            Err(refusal) => *refusal,
            Ok(checked) => match state.outage.refusal() {
                Some(refusal) => refusal,
                None => {
                    if let Some(checked) = checked {
                        parts.extensions.insert(checked);
                    }
                    next.run(Request::from_parts(parts, Body::from(bytes))).await
                }
            },
        };
        settle(response, &state.outage).await
    };
    let (response, answer) = match &operation {
        Some(operation) => exchange.instrument(operation.span().clone()).await,
        None => exchange.await,
    };
    if let Some(operation) = operation {
        operation.finish(&answer);
    }
    response
}

/// A request's head and body, read here, after authentication, within the
/// limit `limit_body` set; `Err` is the answer to a body over it (413) or
/// unreadable.
async fn buffered_request(req: Request) -> Result<(http::request::Parts, Bytes), Response> {
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => Ok((parts, bytes)),
        Err(e) => match parts.extensions.get::<guard::BodyLimit>() {
            Some(&guard::BodyLimit(max)) if guard::over_limit(&e) => {
                Err(guard::body_too_large(max))
            }
            _ => Err(jsonrpc_error(StatusCode::BAD_REQUEST, None, -32700, "unreadable body", None)),
        },
    }
}

/// Reads what an answer says (a JSON body is buffered, which rmcp has
/// already done; an event stream is left alone) and maps it to its HTTP
/// status as the module documentation says.
async fn settle(response: Response, outage: &Arc<Outage>) -> (Response, Answer) {
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE);
    let is_json = content_type
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let is_rmcp_refusal = status == StatusCode::UNSUPPORTED_MEDIA_TYPE && !is_json;
    if !is_json && !is_rmcp_refusal {
        return (response, Answer::of(status, None));
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        let failed = (StatusCode::INTERNAL_SERVER_ERROR, "response body unreadable");
        return (failed.into_response(), Answer::of(StatusCode::INTERNAL_SERVER_ERROR, None));
    };
    if is_rmcp_refusal {
        return unreadable_message(parts, bytes);
    }
    let head = serde_json::from_slice::<ResponseHead>(&bytes).ok();
    if status == StatusCode::OK
        && let Some(error) = head.as_ref().and_then(|h| h.error.as_ref())
    {
        let retry_after = error.data.as_ref().and_then(|d| d.retry_after);
        if error.code == i64::from(RATE_LIMITED)
            && let Some(secs) = retry_after
        {
            parts.status = StatusCode::TOO_MANY_REQUESTS;
            parts.headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        } else if error.code == i64::from(UNAVAILABLE) {
            outage.unavailable_answer(&mut parts);
        }
    }
    let answer = Answer::of(parts.status, head.as_ref());
    (Response::from_parts(parts, Body::from(bytes)), answer)
}

/// rmcp's 415 for a message it cannot read, as the JSON-RPC 400 that every
/// other bad message gets; any other 415 (a wrong `Content-Type`) is kept.
fn unreadable_message(parts: http::response::Parts, bytes: Bytes) -> (Response, Answer) {
    let Some(detail) = bytes.strip_prefix(RMCP_UNREADABLE) else {
        let answer = Answer::of(parts.status, None);
        return (Response::from_parts(parts, Body::from(bytes)), answer);
    };
    let message = format!("invalid request: {}", String::from_utf8_lossy(detail));
    let response = jsonrpc_error(StatusCode::BAD_REQUEST, None, -32600, &message, None);
    let head = ResponseHead {
        error: Some(crate::observe::ErrorHead { code: -32600, data: None }),
        result: None,
    };
    (response, Answer::of(StatusCode::BAD_REQUEST, Some(&head)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use foldgate_store::{ConnectOptions, SqliteStore, Store};
    use rmcp::model::{ErrorCode, ErrorData, JsonRpcError, RequestId, ServerJsonRpcMessage};
    use serde_json::json;

    async fn outage() -> Arc<Outage> {
        let store = SqliteStore::connect(&ConnectOptions::new("sqlite::memory:")).await.unwrap();
        // Migrated, so that the outage's check finds it ready.
        store.migrate().await.unwrap();
        let store: Arc<dyn Store> = Arc::new(store);
        Outage::new(store)
    }

    /// Settles a JSON answer; its body must come back unchanged, whatever
    /// its status becomes.
    async fn settled(status: StatusCode, body: &Value, outage: &Arc<Outage>) -> (Response, Answer) {
        let response = (status, [(header::CONTENT_TYPE, "application/json")], body.to_string())
            .into_response();
        let (response, answer) = settle(response, outage).await;
        let (parts, kept) = response.into_parts();
        let kept = axum::body::to_bytes(kept, usize::MAX).await.unwrap();
        assert_eq!(&serde_json::from_slice::<Value>(&kept).unwrap(), body, "the body is kept");
        (Response::from_parts(parts, Body::from(kept)), answer)
    }

    #[tokio::test]
    async fn outcomes_are_read_from_the_answer() {
        let outage = outage().await;
        let cases = [
            (StatusCode::OK, json!({"jsonrpc": "2.0", "id": 1, "result": {"content": []}}), None),
            (
                StatusCode::OK,
                json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [], "isError": true}}),
                Some("tool_error"),
            ),
            (
                StatusCode::BAD_REQUEST,
                json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}),
                Some("-32602"),
            ),
            (
                StatusCode::OK,
                json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 7, "message": "app"}}),
                Some("_OTHER"),
            ),
            (StatusCode::NOT_ACCEPTABLE, json!({"unexpected": true}), Some("406")),
        ];
        for (status, body, expected) in cases {
            let (response, answer) = settled(status, &body, &outage).await;
            assert_eq!(response.status(), status, "{body}");
            assert_eq!(answer.error_type.as_deref(), expected, "{status} {body}");
        }
        let initialized = settled(
            StatusCode::OK,
            &json!({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25"}}),
            &outage,
        )
        .await
        .1;
        assert_eq!(initialized.protocol_version, Some("2025-11-25"));
        let accepted =
            Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).unwrap();
        let (_, answer) = settle(accepted, &outage).await;
        assert_eq!(answer.error_type, None, "a notification accepted");
        assert!(outage.refusal().is_none(), "nothing tripped the outage");
    }

    #[tokio::test]
    async fn a_limit_is_429_with_retry_after() {
        let outage = outage().await;
        let body = json!({"jsonrpc": "2.0", "id": 1, "error": {
            "code": RATE_LIMITED, "message": "slow down",
            "data": {"code": "rate_limited", "limit": "creations_per_minute", "retry_after": 7},
        }});
        let (response, answer) = settled(StatusCode::OK, &body, &outage).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        assert_eq!(answer.error_type.as_deref(), Some("-32029"));
    }

    #[tokio::test]
    async fn the_database_out_of_reach_is_503_and_trips_the_outage() {
        let outage = outage().await;
        let mut driver = foldgate_background::Driver::default();
        outage.register(&mut driver);
        let _background = driver.start();
        // Exactly as rmcp writes a tool's error.
        let error = ErrorData::new(ErrorCode(UNAVAILABLE), "down", Some(json!({"retry_after": 1})));
        let message =
            ServerJsonRpcMessage::Error(JsonRpcError::new(Some(RequestId::Number(7)), error));
        let body = serde_json::to_value(&message).unwrap();
        let (response, _) = settled(StatusCode::OK, &body, &outage).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let refusal = outage.refusal().expect("tripped");
        assert_eq!(refusal.status(), StatusCode::SERVICE_UNAVAILABLE);
        // The in-memory database answers, so the background check clears it.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while outage.refusal().is_some() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn rmcp_refusing_an_unreadable_message_becomes_a_jsonrpc_400() {
        let outage = outage().await;
        let refusal = Response::builder()
            .status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            .body(Body::from("fail to deserialize request body invalid type: map, expected id"))
            .unwrap();
        let (response, answer) = settle(refusal, &outage).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], -32600);
        assert_eq!(body["error"]["message"], "invalid request: invalid type: map, expected id");
        assert_eq!(answer.error_type.as_deref(), Some("-32600"));
        let wrong_type = Response::builder()
            .status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            .body(Body::from("Unsupported Media Type: Content-Type must be application/json"))
            .unwrap();
        let (response, answer) = settle(wrong_type, &outage).await;
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "kept as it is");
        assert_eq!(answer.error_type.as_deref(), Some("415"));
    }
}
