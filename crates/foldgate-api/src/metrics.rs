//! The front end's metric instruments, built from an injected meter.
//!
//! [`ApiMetrics`] holds what the HTTP layers record (request duration,
//! rate-limit and authentication rejections) and the MCP instruments:
//! [`McpMetrics`] (`mcp.server.operation.duration`, recorded for each
//! message the gateway serves, by a layer in front of the MCP guard) and [`UpstreamMetrics`]
//! (`mcp.client.operation.duration` and what passes through upstreams,
//! recorded by the upstream registry and the proxy), named and attributed
//! as the OpenTelemetry semantic conventions for MCP prescribe.
//! [`observe_upstreams`] adds the upstreams' health gauges.
//!
//! Every label is bounded: HTTP methods and MCP method names outside the
//! known sets are recorded as `_OTHER`, routes are the router's patterns,
//! JSON-RPC error codes outside the reserved range are `_OTHER`, protocol
//! versions are the known ones, and tool names are those the gateway offers
//! (see [`McpOperation::tool`]); upstream names come from the
//! configuration.

use std::time::Duration;

use axum::{
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::Response,
};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, Meter, MeterProvider as _, noop::NoopMeterProvider},
};

use foldgate_upstream::metrics::MCP_BUCKETS;
pub use foldgate_upstream::{
    UpstreamMetrics,
    metrics::{OTHER, observe_upstreams, rpc_error_type},
};

/// Bucket boundaries (seconds) for HTTP request durations, as the HTTP
/// semantic conventions recommend.
const HTTP_BUCKETS: [f64; 14] =
    [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];

/// Every instrument of the front end. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    pub http: HttpMetrics,
    /// `foldgate.rate_limit.rejections{reason}`: requests refused by the
    /// per-principal request rate (`reason="request_rate"`).
    pub(crate) rate_limited: Counter<u64>,
    /// `foldgate.auth.rejections{reason}`: requests refused by
    /// authentication, by [`AuthError::kind`](crate::auth::AuthError::kind).
    pub(crate) auth_rejected: Counter<u64>,
    pub mcp: McpMetrics,
    pub upstream: UpstreamMetrics,
}

impl ApiMetrics {
    pub fn new(meter: &Meter) -> Self {
        Self {
            http: HttpMetrics::new(meter),
            rate_limited: meter
                .u64_counter("foldgate.rate_limit.rejections")
                .with_description("Requests refused with 429 by the per-principal request rate")
                .with_unit("{request}")
                .build(),
            auth_rejected: meter
                .u64_counter("foldgate.auth.rejections")
                .with_description("Requests refused by authentication, by reason")
                .with_unit("{request}")
                .build(),
            mcp: McpMetrics::new(meter),
            upstream: UpstreamMetrics::new(meter),
        }
    }

    /// Instruments that record nothing.
    pub fn noop() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }
}

/// `foldgate.http.server.request.duration`: every HTTP request, by route,
/// method and status.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    duration: Histogram<f64>,
}

impl HttpMetrics {
    fn new(meter: &Meter) -> Self {
        Self {
            duration: meter
                .f64_histogram("foldgate.http.server.request.duration")
                .with_description("Duration of HTTP requests, until the response head is sent")
                .with_unit("s")
                .with_boundaries(HTTP_BUCKETS.to_vec())
                .build(),
        }
    }

    fn record(&self, method: &http::Method, route: Option<&str>, status: u16, elapsed: Duration) {
        let mut attributes = vec![
            KeyValue::new("http.request.method", known_http_method(method)),
            KeyValue::new("http.response.status_code", i64::from(status)),
        ];
        // Requests no route matched carry no route, so that unknown paths
        // cannot create series.
        if let Some(route) = route {
            attributes.push(KeyValue::new("http.route", route.to_owned()));
        }
        self.duration.record(elapsed.as_secs_f64(), &attributes);
    }
}

/// Axum middleware recording [`HttpMetrics`]; add it with `Router::layer`
/// so that the matched route is known.
pub(crate) async fn record_http(
    State(metrics): State<HttpMetrics>,
    request: Request,
    next: Next,
) -> Response {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let response = next.run(request).await;
    metrics.record(&method, route.as_deref(), response.status().as_u16(), started.elapsed());
    response
}

fn known_http_method(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => OTHER,
    }
}

/// The MCP methods of the semantic conventions; any other name a client
/// sends is recorded as [`OTHER`].
const MCP_METHODS: &[&str] = &[
    "completion/complete",
    "elicitation/create",
    "initialize",
    "logging/setLevel",
    "notifications/cancelled",
    "notifications/initialized",
    "notifications/message",
    "notifications/progress",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
    "notifications/resources/updated",
    "notifications/roots/list_changed",
    "notifications/tools/list_changed",
    "ping",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/templates/list",
    "resources/unsubscribe",
    "roots/list",
    "sampling/createMessage",
    "server/discover",
    "tasks/cancel",
    "tasks/get",
    "tasks/update",
    "tools/call",
    "tools/list",
];

/// The bounded `mcp.method.name` of a method a client sent.
pub fn known_mcp_method(method: &str) -> &'static str {
    MCP_METHODS.iter().copied().find(|m| *m == method).unwrap_or(OTHER)
}

/// A protocol version this build knows, as a static string; `None` for any
/// other text a client sends.
pub fn known_protocol_version(version: &str) -> Option<&'static str> {
    rmcp::model::ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .map(rmcp::model::ProtocolVersion::as_str)
        .find(|known| *known == version)
}

/// One MCP request or notification as the server handled it.
#[derive(Debug, Clone, Copy, Default)]
pub struct McpOperation<'a> {
    /// The JSON-RPC method, as sent (bounded by [`known_mcp_method`]).
    pub method: &'a str,
    /// For `tools/call`: the tool's name. Only names of tools the gateway
    /// offers: pass `None` for an unknown tool, whose name is the client's
    /// free text.
    pub tool: Option<&'a str>,
    /// `None` on success; otherwise the JSON-RPC error code as text
    /// (`"-32602"`, see [`rpc_error_type`]), `"tool_error"` for a tool
    /// result with `isError`, the HTTP status (`"406"`) of a refusal without
    /// a JSON-RPC body, or `"cancelled"` for a request dropped before it was
    /// answered (request timeout, client gone).
    pub error_type: Option<&'a str>,
    /// The MCP protocol version of the exchange (`2025-11-25`), when known;
    /// versions this build does not know are left out.
    pub protocol_version: Option<&'a str>,
}

/// `mcp.server.operation.duration` (histogram, seconds): each MCP request
/// or notification the gateway serves, from receipt to response. Attributes
/// per the MCP semantic conventions: `mcp.method.name`, `gen_ai.tool.name`
/// and `gen_ai.operation.name = "execute_tool"` for tool calls, `error.type`
/// on failure, `mcp.protocol.version`, and the transport
/// (`network.transport = "tcp"`, `network.protocol.name = "http"`).
#[derive(Debug, Clone)]
pub struct McpMetrics {
    operation_duration: Histogram<f64>,
}

impl McpMetrics {
    pub fn new(meter: &Meter) -> Self {
        Self {
            operation_duration: meter
                .f64_histogram("mcp.server.operation.duration")
                .with_description(
                    "MCP request or notification duration as observed on the receiver",
                )
                .with_unit("s")
                .with_boundaries(MCP_BUCKETS.to_vec())
                .build(),
        }
    }

    /// Records one operation that took `duration`.
    pub fn record_operation(&self, operation: &McpOperation<'_>, duration: Duration) {
        let method = known_mcp_method(operation.method);
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", method),
            KeyValue::new("network.transport", "tcp"),
            KeyValue::new("network.protocol.name", "http"),
        ];
        if let Some(tool) = operation.tool.filter(|_| method == "tools/call") {
            attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
            attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        }
        if let Some(error) = operation.error_type {
            attributes.push(KeyValue::new("error.type", error.to_owned()));
        }
        if let Some(version) = operation.protocol_version.and_then(known_protocol_version) {
            attributes.push(KeyValue::new("mcp.protocol.version", version));
        }
        self.operation_duration.record(duration.as_secs_f64(), &attributes);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use std::collections::BTreeMap;

    use opentelemetry_sdk::metrics::{
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
        data::{AggregatedMetrics, MetricData},
    };

    use super::*;

    /// Histogram data points of `name`, as sorted attribute maps with their
    /// counts.
    fn points(
        exporter: &InMemoryMetricExporter,
        name: &str,
    ) -> Vec<(BTreeMap<String, String>, u64)> {
        let mut found = Vec::new();
        for resource in exporter.get_finished_metrics().unwrap() {
            for scope in resource.scope_metrics() {
                for metric in scope.metrics().filter(|m| m.name() == name) {
                    let AggregatedMetrics::F64(MetricData::Histogram(h)) = metric.data() else {
                        panic!("{name} is an f64 histogram");
                    };
                    for p in h.data_points() {
                        let attrs = p
                            .attributes()
                            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                            .collect();
                        found.push((attrs, p.count()));
                    }
                }
            }
        }
        found
    }

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn mcp_operations_follow_the_semantic_conventions() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let metrics = ApiMetrics::new(&provider.meter("foldgate"));
        let ms = Duration::from_millis(12);
        metrics.mcp.record_operation(
            &McpOperation {
                method: "tools/call",
                tool: Some("branch_create"),
                protocol_version: Some("2025-11-25"),
                ..McpOperation::default()
            },
            ms,
        );
        // A version nobody defined is left out.
        metrics.mcp.record_operation(
            &McpOperation {
                method: "ping",
                protocol_version: Some("1999-01-01"),
                ..McpOperation::default()
            },
            ms,
        );
        metrics.mcp.record_operation(
            &McpOperation {
                method: "tools/call",
                tool: Some("files__grep"),
                error_type: Some("tool_error"),
                ..McpOperation::default()
            },
            ms,
        );
        // A method nobody defined, with a tool name it must not carry.
        metrics.mcp.record_operation(
            &McpOperation {
                method: "x/made-up",
                tool: Some("branch_create"),
                ..McpOperation::default()
            },
            ms,
        );
        metrics.upstream.record_call("files", false, "grep", ms, None);
        metrics.upstream.record_call("files", false, "grep", ms, Some("upstream_unavailable"));
        metrics.upstream.record_listing("files", false, ms, None);
        provider.force_flush().unwrap();

        let transport = [("network.transport", "tcp"), ("network.protocol.name", "http")];
        let with = |extra: &[(&str, &str)]| {
            let mut all = attrs(&transport);
            all.extend(attrs(extra));
            all
        };
        let mut server = points(&exporter, "mcp.server.operation.duration");
        server.sort();
        let mut expected = vec![
            (
                with(&[
                    ("mcp.method.name", "tools/call"),
                    ("gen_ai.tool.name", "branch_create"),
                    ("gen_ai.operation.name", "execute_tool"),
                    ("mcp.protocol.version", "2025-11-25"),
                ]),
                1,
            ),
            (
                with(&[
                    ("mcp.method.name", "tools/call"),
                    ("gen_ai.tool.name", "files__grep"),
                    ("gen_ai.operation.name", "execute_tool"),
                    ("error.type", "tool_error"),
                ]),
                1,
            ),
            (with(&[("mcp.method.name", OTHER)]), 1),
            (with(&[("mcp.method.name", "ping")]), 1),
        ];
        expected.sort();
        assert_eq!(server, expected);

        let mut client = points(&exporter, "mcp.client.operation.duration");
        client.sort();
        let call = [
            ("mcp.method.name", "tools/call"),
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "grep"),
            ("upstream", "files"),
        ];
        let mut failed = with(&call);
        failed.insert("error.type".into(), "upstream_unavailable".into());
        let listing = with(&[("mcp.method.name", "tools/list"), ("upstream", "files")]);
        let mut expected = vec![(with(&call), 1), (failed, 1), (listing, 1)];
        expected.sort();
        assert_eq!(client, expected);
    }

    #[test]
    fn unknown_names_are_bounded() {
        assert_eq!(rpc_error_type(-32602), "-32602");
        assert_eq!(rpc_error_type(-32029), "-32029");
        assert_eq!(rpc_error_type(404), OTHER);
        assert_eq!(rpc_error_type(-31999), OTHER);
        assert_eq!(known_protocol_version("2026-07-28"), Some("2026-07-28"));
        assert_eq!(known_protocol_version("2026-07-28\n"), None);
        assert_eq!(known_mcp_method("tools/list"), "tools/list");
        assert_eq!(known_mcp_method("tasks/get"), "tasks/get");
        assert_eq!(known_mcp_method("tools/list/../x"), OTHER);
        assert_eq!(known_http_method(&http::Method::from_bytes(b"BREW").unwrap()), OTHER);
        assert_eq!(known_http_method(&http::Method::POST), "POST");
    }
}
