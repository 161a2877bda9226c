//! MCP operations, observed where the gateway receives them: one server
//! span (`tools/call branch_create`, `initialize`, …) and one
//! `mcp.server.operation.duration` sample per JSON-RPC request or
//! notification posted to `/mcp`, named and attributed as the OpenTelemetry
//! semantic conventions for MCP prescribe.
//!
//! This is a layer just in front of the MCP guard rather than code in the
//! tool handlers, because only here is every operation seen once: the
//! methods rmcp answers itself (`initialize`, `server/discover`, `ping`,
//! notifications), the calls the guard refuses before any handler runs
//! (invalid arguments, unknown tools, missing scopes), and the handlers'
//! own answers. The duration is the exchange as this side sees it —
//! validation, the handler, serialising the answer — and the outcome is
//! read from the answer itself: a JSON-RPC error's code, `tool_error` for a
//! tool result with `isError`, or the HTTP status of a refusal without a
//! JSON-RPC body. Requests stopped in front of the layer (413, 403 for Host
//! or Origin, 401, 429 from the request rate) carry no message the gateway
//! read; the HTTP metrics and the rejection counters count them.
//!
//! Tool names on metrics are bounded to the tools the gateway offers the
//! caller (folding tools, and upstream tools its tenant sees): any other
//! name is a client's free text, and is left out.

use std::{sync::Arc, time::Instant};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use foldgate_domain::{BranchId, SessionId};
use serde::Deserialize;
use serde_json::Value;
use tracing::{Instrument as _, Span, field::Empty};

use crate::{
    args::FoldingTool,
    auth::Authenticated,
    guard::buffered_request,
    metrics::{McpMetrics, McpOperation, known_mcp_method, known_protocol_version, rpc_error_type},
    proxy,
    upstream::{Lookup, Upstreams},
};

/// Where a 2026-07-28 client states its protocol version in each request.
const PROTOCOL_VERSION_META_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// JSON-RPC ids longer than this are left off spans.
const MAX_SHOWN_ID: usize = 128;

/// What the layer needs.
#[derive(Debug, Clone)]
pub(crate) struct ObserveState {
    pub metrics: McpMetrics,
    /// To tell the upstream tools a caller is offered from unknown names.
    pub upstreams: Arc<Upstreams>,
}

/// Times and traces each MCP message posted to `/mcp`; see the module
/// documentation.
pub(crate) async fn observe_mcp(
    State(state): State<ObserveState>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let (parts, bytes) = match buffered_request(req).await {
        Ok(buffered) => buffered,
        Err(response) => return response,
    };
    let incoming = Incoming::read(&state.upstreams, &parts, &bytes);
    let req = Request::from_parts(parts, Body::from(bytes));
    let Some(incoming) = incoming else {
        // A response to a server request, or not JSON-RPC at all (which the
        // guard refuses): no operation to record.
        return next.run(req).await;
    };
    let operation = Operation::start(state.metrics, incoming);
    let response = next.run(req).instrument(operation.span.clone()).await;
    let (response, answer) = read_answer(response).await;
    operation.finish(&answer);
    response
}

/// What the request says about itself.
#[derive(Debug)]
struct Incoming {
    method: &'static str,
    /// For `tools/call`: the tool, if the gateway offers it to the caller.
    tool: Option<String>,
    request_id: Option<String>,
    protocol_version: Option<&'static str>,
    tenant: Option<String>,
    session: Option<SessionId>,
    branch: Option<BranchId>,
}

impl Incoming {
    /// `None` for anything but a JSON-RPC request or notification.
    fn read(upstreams: &Upstreams, parts: &http::request::Parts, bytes: &[u8]) -> Option<Self> {
        let message: Value = serde_json::from_slice(bytes).ok()?;
        let method = known_mcp_method(message.get("method")?.as_str()?);
        let params = message.get("params").and_then(Value::as_object);
        let meta = params.and_then(|p| p.get("_meta")).and_then(Value::as_object);
        let who = parts.extensions.get::<Authenticated>();

        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
        let tool = name.filter(|_| method == "tools/call");
        let folding = tool.and_then(FoldingTool::from_name);
        let offered = tool.filter(|name| {
            folding.is_some()
                || who.is_some_and(|who| !matches!(upstreams.lookup(who, name), Lookup::Unknown))
        });

        let protocol_version = parts
            .headers
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
            .or_else(|| meta?.get(PROTOCOL_VERSION_META_KEY)?.as_str())
            .and_then(known_protocol_version);
        let request_id = match message.get("id") {
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(Value::String(s)) if s.len() <= MAX_SHOWN_ID => Some(s.clone()),
            _ => None,
        };

        // Ids only once they parse: they are client text until the guard
        // has checked them.
        let arguments = params.and_then(|p| p.get("arguments")).and_then(Value::as_object);
        let argument = |key: &str| arguments.and_then(|a| a.get(key)).and_then(Value::as_str);
        let (session, branch) = match (folding, offered) {
            // A folding tool's own arguments.
            (Some(_), _) => (
                argument("session_id").and_then(|s| SessionId::parse(s).ok()),
                argument("branch_id").and_then(|b| BranchId::parse(b).ok()),
            ),
            // An upstream tool's arguments are the upstream's: only the
            // branch the call names for metering.
            (None, Some(_)) => {
                (None, proxy::named_branch(meta, Some(&parts.headers)).ok().flatten())
            }
            (None, None) => (None, None),
        };

        Some(Self {
            method,
            tool: offered.map(str::to_owned),
            request_id,
            protocol_version,
            tenant: who.map(|w| w.principal.tenant.to_string()),
            session,
            branch,
        })
    }
}

/// One operation in progress. Dropped unfinished — the request timed out,
/// or the client went away — it is recorded as `cancelled`.
struct Operation {
    metrics: McpMetrics,
    method: &'static str,
    tool: Option<String>,
    protocol_version: Option<&'static str>,
    span: Span,
    started: Instant,
    finished: bool,
}

impl Operation {
    fn start(metrics: McpMetrics, incoming: Incoming) -> Self {
        let Incoming { method, tool, request_id, protocol_version, tenant, session, branch } =
            incoming;
        let name = match &tool {
            Some(tool) => format!("{method} {tool}"),
            None => method.to_owned(),
        };
        let span = tracing::info_span!(
            "mcp.server",
            otel.name = %name,
            otel.kind = "server",
            otel.status_code = Empty,
            mcp.method.name = method,
            jsonrpc.request.id = request_id.as_deref(),
            gen_ai.tool.name = tool.as_deref(),
            gen_ai.operation.name = (method == "tools/call").then_some("execute_tool"),
            mcp.protocol.version = Empty,
            network.transport = "tcp",
            network.protocol.name = "http",
            error.type = Empty,
            tenant = tenant.as_deref(),
            session.id = session.as_ref().map(SessionId::as_str),
            branch.id = branch.map(tracing::field::display),
        );
        Self {
            metrics,
            method,
            tool,
            protocol_version,
            span,
            started: Instant::now(),
            finished: false,
        }
    }

    fn finish(mut self, answer: &Answer) {
        self.finished = true;
        let version = answer.protocol_version.or(self.protocol_version);
        self.record(answer.error_type.as_deref(), version);
    }

    fn record(&self, error_type: Option<&str>, protocol_version: Option<&'static str>) {
        let operation = McpOperation {
            method: self.method,
            tool: self.tool.as_deref(),
            error_type,
            protocol_version,
        };
        self.metrics.record_operation(&operation, self.started.elapsed());
        if let Some(version) = protocol_version {
            self.span.record("mcp.protocol.version", version);
        }
        if let Some(error_type) = error_type {
            self.span.record("error.type", error_type);
            self.span.record("otel.status_code", "ERROR");
        }
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        if !self.finished {
            self.record(Some("cancelled"), self.protocol_version);
        }
    }
}

/// What the answer says about the operation.
#[derive(Debug, Default)]
struct Answer {
    error_type: Option<String>,
    /// The version `initialize` settled on.
    protocol_version: Option<&'static str>,
}

/// The parts of a JSON-RPC response that tell the outcome; everything else
/// (a tool's content) is skipped without being built.
#[derive(Deserialize)]
struct ResponseHead {
    error: Option<ErrorHead>,
    result: Option<ResultHead>,
}

#[derive(Deserialize)]
struct ErrorHead {
    code: i64,
}

#[derive(Deserialize)]
struct ResultHead {
    #[serde(rename = "isError")]
    is_error: Option<bool>,
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
}

/// Reads the outcome from a response (a JSON body is buffered, which the
/// layers inside have already done; an event stream is left alone).
async fn read_answer(response: Response) -> (Response, Answer) {
    let status = response.status();
    let by_status =
        (status.is_client_error() || status.is_server_error()).then(|| status.as_str().to_owned());
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return (response, Answer { error_type: by_status, protocol_version: None });
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        let failed = (StatusCode::INTERNAL_SERVER_ERROR, "response body unreadable");
        let answer = Answer { error_type: Some("500".to_owned()), protocol_version: None };
        return (failed.into_response(), answer);
    };
    let head = serde_json::from_slice::<ResponseHead>(&bytes).ok();
    let answer = match head {
        Some(ResponseHead { error: Some(error), .. }) => {
            Answer { error_type: Some(rpc_error_type(error.code)), protocol_version: None }
        }
        Some(ResponseHead { result: Some(result), .. }) => Answer {
            error_type: if result.is_error == Some(true) {
                Some("tool_error".to_owned())
            } else {
                by_status
            },
            protocol_version: result.protocol_version.as_deref().and_then(known_protocol_version),
        },
        _ => Answer { error_type: by_status, protocol_version: None },
    };
    (Response::from_parts(parts, Body::from(bytes)), answer)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use serde_json::json;

    use super::*;

    async fn answer_of(status: StatusCode, body: Value) -> Answer {
        let response = (status, [(header::CONTENT_TYPE, "application/json")], body.to_string())
            .into_response();
        let (response, answer) = read_answer(response).await;
        let kept = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&kept).unwrap(), body, "the body is kept");
        answer
    }

    #[tokio::test]
    async fn outcomes_are_read_from_the_answer() {
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
                StatusCode::TOO_MANY_REQUESTS,
                json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32029, "message": "slow"}}),
                Some("-32029"),
            ),
            (
                StatusCode::OK,
                json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 7, "message": "app"}}),
                Some("_OTHER"),
            ),
            (StatusCode::NOT_ACCEPTABLE, json!({"unexpected": true}), Some("406")),
        ];
        for (status, body, expected) in cases {
            let answer = answer_of(status, body.clone()).await;
            assert_eq!(answer.error_type.as_deref(), expected, "{status} {body}");
        }
        let initialized = answer_of(
            StatusCode::OK,
            json!({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25"}}),
        )
        .await;
        assert_eq!(initialized.protocol_version, Some("2025-11-25"));
        let accepted =
            Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).unwrap();
        let (_, answer) = read_answer(accepted).await;
        assert_eq!(answer.error_type, None, "a notification accepted");
    }
}
