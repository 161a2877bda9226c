//! MCP operations, observed where the gateway receives them: one server
//! span (`tools/call branch_create`, `initialize`, …) and one
//! `mcp.server.operation.duration` sample per JSON-RPC request or
//! notification posted to `/mcp`, named and attributed as the OpenTelemetry
//! semantic conventions for MCP prescribe.
//!
//! This is done by the exchange layer (`exchange.rs`) rather than in the
//! tool handlers, because only there is every operation seen once: the
//! methods rmcp answers itself (`initialize`, `server/discover`, `ping`,
//! notifications), the calls the guard refuses before any handler runs
//! (invalid arguments, unknown tools, missing scopes), and the handlers'
//! own answers. The duration is the exchange as this side sees it —
//! validation, the handler, serialising the answer — and the outcome is
//! read from the answer itself: a JSON-RPC error's code, `tool_error` for a
//! tool result with `isError`, or the HTTP status of a refusal without a
//! JSON-RPC body. Requests stopped in front of that layer (413, 403 for Host
//! or Origin, 401, 429 from the request rate) carry no message the gateway
//! read; the HTTP metrics and the rejection counters count them.
//!
//! Tool names on metrics are bounded to the tools the gateway offers the
//! caller (folding tools, and upstream tools its tenant sees): any other
//! name is a client's free text, and is left out.

use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use foldgate_domain::{BranchId, SessionId};
use serde::Deserialize;
use serde_json::Value;
use tracing::{Span, field::Empty};

use crate::{
    auth::Authenticated,
    call::{Read, Target},
    metrics::{McpMetrics, McpOperation, known_mcp_method, known_protocol_version, rpc_error_type},
};

/// Where a 2026-07-28 client states its protocol version in each request.
const PROTOCOL_VERSION_META_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// JSON-RPC ids longer than this are left off spans.
const MAX_SHOWN_ID: usize = 128;

/// What the request says about itself.
#[derive(Debug)]
pub(crate) struct Incoming {
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
    pub fn of(read: &Read<'_>, headers: &HeaderMap, who: Option<&Authenticated>) -> Option<Self> {
        let method = known_mcp_method(read.method()?);
        let named = read.tool.as_ref().filter(|named| named.target.offered());

        let protocol_version = headers
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
            .or_else(|| read.meta?.get(PROTOCOL_VERSION_META_KEY)?.as_str())
            .and_then(known_protocol_version);
        let request_id = match read.id {
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(Value::String(s)) if s.len() <= MAX_SHOWN_ID => Some(s.clone()),
            _ => None,
        };

        // Ids only once they parse: they are client text until the guard
        // has checked them.
        let argument =
            |key: &str| read.arguments().and_then(|a| a.get(key)).and_then(Value::as_str);
        let (session, branch) = match named.map(|n| &n.target) {
            // A folding tool's own arguments.
            Some(Target::Folding(_)) => (
                argument("session_id").and_then(|s| SessionId::parse(s).ok()),
                argument("branch_id").and_then(|b| BranchId::parse(b).ok()),
            ),
            // An upstream tool's arguments are the upstream's: only the
            // branch the call names for metering.
            Some(Target::Upstream { branch, .. }) => (None, branch.clone().ok().flatten()),
            _ => (None, None),
        };

        Some(Self {
            method,
            tool: named.map(|n| n.name.to_owned()),
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
pub(crate) struct Operation {
    metrics: McpMetrics,
    method: &'static str,
    tool: Option<String>,
    protocol_version: Option<&'static str>,
    span: Span,
    started: Instant,
    finished: bool,
}

impl Operation {
    pub fn start(metrics: McpMetrics, incoming: Incoming) -> Self {
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

    /// The operation's span, for the work done for it.
    pub fn span(&self) -> &Span {
        &self.span
    }

    pub fn finish(mut self, answer: &Answer) {
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
        let elapsed = self.started.elapsed();
        self.metrics.record_operation(&operation, elapsed);
        // Nothing is written unless the access log is on (see
        // `telemetry.access_log`); the span adds tenant, session and branch.
        tracing::info!(target: foldgate_telemetry::ACCESS_LOG_TARGET, parent: &self.span,
            method = self.method, tool = self.tool.as_deref(),
            outcome = error_type.unwrap_or("ok"),
            duration_ms = elapsed.as_secs_f64() * 1000.0, "request");
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
pub(crate) struct Answer {
    pub error_type: Option<String>,
    /// The version `initialize` settled on.
    pub protocol_version: Option<&'static str>,
}

impl Answer {
    /// The outcome of an answer with this status and, for a JSON body, this
    /// head: a JSON-RPC error's code, `tool_error` for a tool result with
    /// `isError`, else a 4xx or 5xx status.
    pub fn of(status: StatusCode, head: Option<&ResponseHead>) -> Self {
        let by_status = (status.is_client_error() || status.is_server_error())
            .then(|| status.as_str().to_owned());
        match head {
            Some(ResponseHead { error: Some(error), .. }) => {
                Self { error_type: Some(rpc_error_type(error.code)), protocol_version: None }
            }
            Some(ResponseHead { result: Some(result), .. }) => Self {
                error_type: if result.is_error == Some(true) {
                    Some("tool_error".to_owned())
                } else {
                    by_status
                },
                protocol_version: result
                    .protocol_version
                    .as_deref()
                    .and_then(known_protocol_version),
            },
            _ => Self { error_type: by_status, protocol_version: None },
        }
    }
}

/// The parts of a JSON-RPC response that tell the outcome; everything else
/// (a tool's content) is skipped without being built.
#[derive(Debug, Deserialize)]
pub(crate) struct ResponseHead {
    pub error: Option<ErrorHead>,
    pub result: Option<ResultHead>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ErrorHead {
    pub code: i64,
    pub data: Option<ErrorDataHead>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ErrorDataHead {
    pub retry_after: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ResultHead {
    #[serde(rename = "isError")]
    pub is_error: Option<bool>,
    #[serde(rename = "protocolVersion")]
    pub protocol_version: Option<String>,
}
