//! The gateway's telemetry, observed from outside: metrics and spans pushed
//! to an OTLP/HTTP receiver, trace context passed on to an upstream MCP
//! server, the Prometheus exposition on the operations port (and only
//! there), and the shipped dashboard and alert rules, which must query only
//! metrics the gateway exports.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::post,
};
use common::{Client, Era, TestGateway, call, client, ok, refusal};
use foldgate_api::upstream::UpstreamConfig;
use foldgate_telemetry::{LogFormat, OtelSettings, OtlpTarget, Protocol, Telemetry};
use foldgate_testkit::Backend;
use opentelemetry_proto::tonic::{
    collector::{
        metrics::v1::{
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
            metrics_service_server::{MetricsService, MetricsServiceServer},
        },
        trace::v1::{
            ExportTraceServiceRequest, ExportTraceServiceResponse,
            trace_service_server::{TraceService, TraceServiceServer},
        },
    },
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{metric::Data, number_data_point},
    trace::v1::span::SpanKind,
};
use prost::Message;
use rmcp::{
    ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
        ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    },
    service::{RequestContext, RoleServer},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tracing_subscriber::layer::SubscriberExt;

/// Series Prometheus itself creates for every scrape target.
const PROMETHEUS_SERIES: &[&str] = &["up", "scrape_duration_seconds"];

/// Labels the dashboard selects on that only a failure this test does not
/// provoke would create: a failing database (the store decorator's own test
/// records one).
const FAILURE_ONLY_LABELS: &[(&str, &str)] =
    &[("foldgate_db_operation_duration_seconds_count", "error_type")];

// ---------------------------------------------------------------------------
// A fold as a model would do it.

struct Fold {
    outer: String,
    inner: String,
}

/// Opens a branch and a nested one, asks for the session's status, and
/// returns the outer branch (which fails the inner one first).
async fn fold_cycle(gw: &TestGateway, tenant: &str, session: &str) -> Fold {
    let agent = client(&gw.url, &gw.write_token(tenant, "alice"), Era::Legacy).await;
    let outer = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": session, "description": "Find the retry settings",
               "prompt": "Look in the HTTP client.", "budget": 4000}),
    )
    .await);
    let inner = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": session, "description": "Read the client module", "budget": 1000}),
    )
    .await);
    let status = ok(&call(&agent, "branch_status", json!({"session_id": session})).await);
    assert_eq!(status["branch_id"], inner["branch_id"]);
    let outer = outer["branch_id"].as_str().unwrap().to_owned();
    let returned = ok(&call(
        &agent,
        "branch_return",
        json!({"branch_id": outer, "message": "Retries: config/http.rs, max 3, backoff 200 ms."}),
    )
    .await);
    assert_eq!(returned["status"], "completed");
    agent.cancel().await.unwrap();
    Fold { outer, inner: inner["branch_id"].as_str().unwrap().to_owned() }
}

// ---------------------------------------------------------------------------
// An upstream MCP server, and a fold that goes through it.

/// The trace context one tool call reached the upstream with.
#[derive(Debug, Clone)]
struct Traced {
    tool: String,
    /// The `traceparent` HTTP header.
    header: Option<String>,
    /// `_meta.traceparent` (SEP-414).
    meta: Option<String>,
}

/// A "files" server with two tools, `echo` and `fail` (a tool error), that
/// notes the trace context of every call.
#[derive(Debug, Clone, Default)]
struct Files {
    calls: Arc<Mutex<Vec<Traced>>>,
}

impl ServerHandler for Files {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let text = json!({"type": "object", "properties": {"text": {"type": "string"}}});
        let Value::Object(schema) = text else { panic!("a schema is an object") };
        let schema = Arc::new(schema);
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("echo", "Echo text", Arc::clone(&schema)),
            Tool::new("fail", "Always fails", schema),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let header = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get("traceparent"))
            .map(|v| v.to_str().unwrap().to_owned());
        let meta = request
            .meta
            .as_ref()
            .and_then(|m| m.get_traceparent())
            .or_else(|| context.meta.get_traceparent())
            .map(str::to_owned);
        let tool = request.name.to_string();
        self.calls.lock().unwrap().push(Traced { tool: tool.clone(), header, meta });
        let text = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let result = match tool.as_str() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(text)]),
            _ => CallToolResult::error(vec![ContentBlock::text("disk on fire")]),
        };
        Ok(result.into())
    }
}

/// The upstream on `127.0.0.1:0`, stateless and answering JSON, as
/// deployments run MCP servers behind foldgate.
struct Upstream {
    url: String,
    files: Files,
    stop: CancellationToken,
}

impl Upstream {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let files = Files::default();
        let stop = CancellationToken::new();
        let service = {
            let files = files.clone();
            StreamableHttpService::new(
                move || Ok(files.clone()),
                Arc::new(NeverSessionManager::default()),
                StreamableHttpServerConfig::default()
                    .with_legacy_session_mode(false)
                    .with_json_response(true)
                    .with_sse_keep_alive(None)
                    .disable_allowed_hosts()
                    .with_cancellation_token(stop.child_token()),
            )
        };
        let app = Router::new().route_service("/mcp", service);
        let serving = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(serving.cancelled_owned()).await
        });
        Self { url, files, stop }
    }

    /// `[[upstreams]]` for this server, named `files`, for every tenant.
    fn config(&self) -> UpstreamConfig {
        #[derive(serde::Deserialize)]
        struct Doc {
            upstreams: Vec<UpstreamConfig>,
        }
        let toml = format!(
            "[[upstreams]]\nname = \"files\"\nurl = \"{}\"\nrefresh_seconds = 1\n",
            self.url
        );
        toml::from_str::<Doc>(&toml).unwrap().upstreams.remove(0)
    }

    fn calls(&self) -> Vec<Traced> {
        self.files.calls.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Waits until the gateway offers the upstream's tools to `agent`.
async fn upstream_tools_listed(agent: &Client) {
    for _ in 0..100 {
        let tools = agent.list_all_tools().await.unwrap();
        if tools.iter().any(|t| t.name == "files__echo") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the upstream's tools were never listed");
}

/// A tool call that names its branch in `_meta`.
async fn call_in(agent: &Client, branch: &str, tool: &str, args: Value) -> CallToolResult {
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": tool, "arguments": args, "_meta": {"foldgate/branch_id": branch},
    }))
    .unwrap();
    agent.call_tool(params).await.unwrap_or_else(|e| panic!("{tool}: {e}"))
}

struct Federated {
    branch: String,
    /// What the branch had consumed when it returned, as the gateway
    /// reported it.
    tokens_used: u64,
}

/// Calls the upstream outside any branch, then opens a branch in `session`,
/// calls `files__echo` and `files__fail` inside it, and returns it.
async fn federated_fold(gw: &TestGateway, tenant: &str, session: &str) -> Federated {
    let agent = client(&gw.url, &gw.write_token(tenant, "carol"), Era::Legacy).await;
    upstream_tools_listed(&agent).await;
    let outside = call(&agent, "files__echo", json!({"text": "before any branch"})).await;
    assert_eq!(outside.meta.unwrap().0["foldgate/metering"]["branch_id"], Value::Null);
    let branch = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": session, "description": "Ask the files server", "budget": 2000}),
    )
    .await)["branch_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let echoed =
        call_in(&agent, &branch, "files__echo", json!({"text": "inside the branch"})).await;
    assert_ne!(echoed.is_error, Some(true), "{echoed:?}");
    let failed = call_in(&agent, &branch, "files__fail", json!({})).await;
    assert_eq!(failed.is_error, Some(true), "{failed:?}");
    let returned = ok(&call(
        &agent,
        "branch_return",
        json!({"branch_id": branch, "message": "The files server echoes; fail fails."}),
    )
    .await);
    agent.cancel().await.unwrap();
    Federated { branch, tokens_used: returned["tokens_used"].as_u64().unwrap() }
}

// ---------------------------------------------------------------------------
// An OTLP/HTTP receiver.

#[derive(Clone, Default)]
struct Received {
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

fn protobuf(body: Vec<u8>) -> axum::response::Response {
    ([(header::CONTENT_TYPE, "application/x-protobuf")], body).into_response()
}

async fn receive_metrics(State(r): State<Received>, body: Bytes) -> axum::response::Response {
    match ExportMetricsServiceRequest::decode(body) {
        Ok(request) => {
            r.metrics.lock().unwrap().push(request);
            protobuf(ExportMetricsServiceResponse::default().encode_to_vec())
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

async fn receive_traces(State(r): State<Received>, body: Bytes) -> axum::response::Response {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            r.traces.lock().unwrap().push(request);
            protobuf(ExportTraceServiceResponse::default().encode_to_vec())
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// Starts an OTLP/HTTP receiver on `127.0.0.1:0`; returns its base URL.
async fn http_receiver() -> (String, Received) {
    let received = Received::default();
    let app = Router::new()
        .route("/v1/metrics", post(receive_metrics))
        .route("/v1/traces", post(receive_traces))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

/// The same receiver over gRPC.
#[derive(Clone)]
struct GrpcReceiver(Received);

#[tonic::async_trait]
impl MetricsService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.metrics.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.traces.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Starts an OTLP/gRPC receiver on `127.0.0.1:0`; returns its URL.
async fn grpc_receiver() -> (String, Received) {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder()
        .add_service(MetricsServiceServer::new(GrpcReceiver(received.clone())))
        .add_service(TraceServiceServer::new(GrpcReceiver(received.clone())));
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    (url, received)
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

type Attributes = BTreeMap<String, String>;

/// A metric, the attributes (or labels) one of its points has, and that
/// point's value.
type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

/// One data point: its attributes and its value (a sum's or gauge's value,
/// a histogram's count).
#[derive(Debug)]
struct Point {
    attributes: BTreeMap<String, String>,
    value: f64,
}

/// The points of every metric in the last export that has it (metrics are
/// cumulative), and the resources of every export.
fn last_points(
    requests: &[ExportMetricsServiceRequest],
) -> (BTreeMap<String, Vec<Point>>, Vec<Attributes>) {
    let mut by_name = BTreeMap::new();
    let mut resources = Vec::new();
    for request in requests {
        for rm in &request.resource_metrics {
            resources.push(attributes(&rm.resource.as_ref().unwrap().attributes));
            for sm in &rm.scope_metrics {
                for metric in &sm.metrics {
                    let number = |p: &opentelemetry_proto::tonic::metrics::v1::NumberDataPoint| {
                        match p.value {
                            Some(number_data_point::Value::AsInt(i)) => i as f64,
                            Some(number_data_point::Value::AsDouble(d)) => d,
                            None => f64::NAN,
                        }
                    };
                    let points: Vec<Point> = match metric.data.as_ref().unwrap() {
                        Data::Sum(s) => s
                            .data_points
                            .iter()
                            .map(|p| Point {
                                attributes: attributes(&p.attributes),
                                value: number(p),
                            })
                            .collect(),
                        Data::Gauge(g) => g
                            .data_points
                            .iter()
                            .map(|p| Point {
                                attributes: attributes(&p.attributes),
                                value: number(p),
                            })
                            .collect(),
                        Data::Histogram(h) => h
                            .data_points
                            .iter()
                            .map(|p| Point {
                                attributes: attributes(&p.attributes),
                                value: p.count as f64,
                            })
                            .collect(),
                        other => panic!("{}: unexpected data {other:?}", metric.name),
                    };
                    by_name.insert(metric.name.clone(), points);
                }
            }
        }
    }
    (by_name, resources)
}

fn find<'a>(points: &'a [Point], wanted: &[(&str, &str)]) -> Option<&'a Point> {
    points
        .iter()
        .find(|p| wanted.iter().all(|(k, v)| p.attributes.get(*k).map(String::as_str) == Some(*v)))
}

#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    kind: i32,
    /// The span status code (`StatusCode::Error` = 2).
    status: i32,
    attributes: BTreeMap<String, String>,
    resource: BTreeMap<String, String>,
}

fn spans(requests: &[ExportTraceServiceRequest]) -> Vec<Span> {
    let mut all = Vec::new();
    for request in requests {
        for rs in &request.resource_spans {
            let resource = attributes(&rs.resource.as_ref().unwrap().attributes);
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    all.push(Span {
                        name: s.name.clone(),
                        trace_id: s.trace_id.clone(),
                        span_id: s.span_id.clone(),
                        parent_span_id: s.parent_span_id.clone(),
                        kind: s.kind,
                        status: s.status.as_ref().map_or(0, |st| st.code),
                        attributes: attributes(&s.attributes),
                        resource: resource.clone(),
                    });
                }
            }
        }
    }
    all
}

fn assert_resource(resource: &BTreeMap<String, String>) {
    assert_eq!(resource.get("service.name").map(String::as_str), Some("foldgate"), "{resource:?}");
    assert_eq!(
        resource.get("service.version").map(String::as_str),
        Some(foldgate_telemetry::VERSION),
        "{resource:?}"
    );
    let instance = resource.get("service.instance.id").expect("service.instance.id");
    assert!(uuid::Uuid::parse_str(instance).is_ok(), "{instance}");
    assert_eq!(
        resource.get("deployment.environment.name").map(String::as_str),
        Some("test"),
        "OTEL_RESOURCE_ATTRIBUTES"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_receives_the_fold_metrics_and_spans() {
    let (endpoint, received) = http_receiver().await;
    let settings = OtelSettings {
        traces: Some(OtlpTarget {
            endpoint: format!("{endpoint}/v1/traces"),
            protocol: Protocol::HttpProtobuf,
        }),
        metrics: Some(OtlpTarget {
            endpoint: format!("{endpoint}/v1/metrics"),
            protocol: Protocol::HttpProtobuf,
        }),
        resource_attributes: vec![("deployment.environment.name".into(), "test".into())],
        ..OtelSettings::default()
    };
    let telemetry = Telemetry::new(&settings).unwrap();
    // `tracing` spans reach a tracer only through the process's subscriber:
    // this is the one test of this binary that installs it.
    tracing::subscriber::set_global_default(foldgate_telemetry::subscriber(
        &telemetry,
        LogFormat::Text,
    ))
    .unwrap();
    let upstream = Upstream::start().await;
    let gw = TestGateway::start_with_telemetry(
        Backend::Sqlite,
        |c| {
            c.telemetry.store_poll_interval = Duration::from_millis(20);
            c.upstreams = vec![upstream.config()];
        },
        telemetry,
    )
    .await;

    // A tenant of its own: the spans of other tests' gateways in this process
    // reach the same subscriber.
    let fold = fold_cycle(&gw, "otlp", "otlp-1").await;
    let federated = federated_fold(&gw, "otlp-up", "otlp-up-1").await;
    // A caller that is itself traced: the gateway continues its trace.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let health = reqwest::Client::new()
        .get(format!("{}/healthz", gw.base))
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Stopping shuts the telemetry down, which exports everything.
    gw.stop().await;

    let (metrics, resources) = last_points(&received.metrics.lock().unwrap());
    assert!(!resources.is_empty(), "no metrics arrived");
    resources.iter().for_each(assert_resource);
    let tenant = ("tenant", "otlp");
    let get = |name: &str| {
        metrics.get(name).unwrap_or_else(|| panic!("{name} not exported: {:?}", metrics.keys()))
    };
    let cases: &[Expected<'_>] = &[
        ("foldgate.branches.created", &[tenant], 2.0),
        (
            "foldgate.branches.completed",
            &[tenant, ("status", "completed"), ("reason", "returned")],
            1.0,
        ),
        (
            "foldgate.branches.completed",
            &[tenant, ("status", "failed"), ("reason", "parent_returning")],
            1.0,
        ),
        ("foldgate.branches.forced_returns", &[tenant, ("reason", "parent_returning")], 1.0),
        ("foldgate.branch.duration", &[tenant, ("status", "completed")], 1.0),
        ("foldgate.branch.duration", &[tenant, ("status", "failed")], 1.0),
        ("foldgate.branch.budget.utilization", &[tenant, ("status", "completed")], 1.0),
        ("foldgate.branch.compression", &[tenant], 1.0),
        ("foldgate.db.pool.connections.max", &[], 10.0),
    ];
    for (name, wanted, value) in cases {
        let point =
            find(get(name), wanted).unwrap_or_else(|| panic!("{name} {wanted:?}: {:?}", get(name)));
        assert_eq!(point.value, *value, "{name} {wanted:?}");
    }
    assert!(find(get("foldgate.tokens.consumed"), &[tenant]).unwrap().value > 0.0);
    assert!(
        find(get("foldgate.branches.active"), &[tenant]).is_some(),
        "active branches per tenant"
    );
    for state in ["used", "idle"] {
        assert!(
            find(get("foldgate.db.pool.connections"), &[("state", state)]).is_some(),
            "{state}"
        );
    }
    let mcp_posts = find(
        get("foldgate.http.server.request.duration"),
        &[
            ("http.route", "/mcp"),
            ("http.request.method", "POST"),
            ("http.response.status_code", "200"),
        ],
    )
    .unwrap();
    assert!(mcp_posts.value >= 4.0, "{mcp_posts:?}");

    let spans = spans(&received.traces.lock().unwrap());
    assert!(!spans.is_empty(), "no spans arrived");
    spans.iter().for_each(|s| assert_resource(&s.resource));
    let by_id: BTreeMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), s)).collect();
    let ours = |s: &&Span| s.attributes.get("tenant").is_some_and(|t| t == "otlp");
    let created: Vec<&Span> =
        spans.iter().filter(ours).filter(|s| s.name == "branch.create").collect();
    let created_ids: BTreeSet<&str> =
        created.iter().map(|s| s.attributes["branch.id"].as_str()).collect();
    assert_eq!(created_ids, BTreeSet::from([fold.outer.as_str(), fold.inner.as_str()]));
    for span in &created {
        assert_eq!(span.attributes["session.id"], "otlp-1");
        // Each operation runs inside the server span of its HTTP request
        // (with rmcp's own spans in between).
        let mut request = *span;
        while request.name != "POST /mcp" {
            let parents: Vec<&str> = std::iter::successors(Some(*span), |s| {
                by_id.get(s.parent_span_id.as_slice()).copied()
            })
            .map(|s| s.name.as_str())
            .collect();
            request = by_id
                .get(request.parent_span_id.as_slice())
                .unwrap_or_else(|| panic!("no request span above {}: {parents:?}", span.name));
        }
        assert_eq!(request.kind, SpanKind::Server as i32);
        assert_eq!(request.trace_id, span.trace_id);
        assert_eq!(request.attributes["http.route"], "/mcp");
        assert_eq!(request.attributes["http.response.status_code"], "200");
    }
    let returned =
        spans.iter().filter(ours).find(|s| s.name == "branch.return").expect("branch.return");
    assert_eq!(returned.attributes["branch.id"], fold.outer);
    assert_eq!(returned.attributes["session.id"], "otlp-1");
    assert!(spans.iter().filter(ours).any(|s| s.name == "branch.status"));

    let health = spans.iter().find(|s| s.name == "GET /healthz").expect("the health check span");
    assert_eq!(hex(&health.trace_id), trace_id, "the caller's trace goes on");
    assert_eq!(hex(&health.parent_span_id), caller_span);

    assert_federation_exported(&metrics, &spans, &upstream, &federated);
}

/// What [`federated_fold`] (tenant `otlp-up`, session `otlp-up-1`) leaves in
/// the export: MCP operation and upstream metrics, upstream charges in the
/// tokens consumed, database latency, and one trace from the agent's
/// request down to the upstream, whose context the upstream received.
fn assert_federation_exported(
    metrics: &BTreeMap<String, Vec<Point>>,
    spans: &[Span],
    upstream: &Upstream,
    federated: &Federated,
) {
    let value = |name: &str, wanted: &[(&str, &str)]| {
        let points = metrics
            .get(name)
            .unwrap_or_else(|| panic!("{name} not exported: {:?}", metrics.keys()));
        find(points, wanted).unwrap_or_else(|| panic!("{name} {wanted:?}: {points:?}")).value
    };
    let files = ("upstream", "files");
    let who = ("tenant", "otlp-up");
    let call = ("mcp.method.name", "tools/call");
    let cases: &[Expected<'_>] = &[
        // As the agents called them (both eras' clients here are legacy).
        ("mcp.server.operation.duration", &[("mcp.method.name", "initialize")], 2.0),
        (
            "mcp.server.operation.duration",
            &[call, ("gen_ai.tool.name", "branch_create"), ("mcp.protocol.version", "2025-11-25")],
            3.0,
        ),
        ("mcp.server.operation.duration", &[call, ("gen_ai.tool.name", "files__echo")], 2.0),
        (
            "mcp.server.operation.duration",
            &[call, ("gen_ai.tool.name", "files__fail"), ("error.type", "tool_error")],
            1.0,
        ),
        // As the gateway sent them on.
        ("mcp.client.operation.duration", &[call, ("gen_ai.tool.name", "echo"), files], 2.0),
        (
            "mcp.client.operation.duration",
            &[call, ("gen_ai.tool.name", "fail"), files, ("error.type", "tool_error")],
            1.0,
        ),
        ("foldgate.upstream.calls_outside_branches", &[who, files], 1.0),
        ("foldgate.upstream.up", &[files], 1.0),
        ("foldgate.upstream.tools", &[files], 2.0),
        // Every token the branch was charged, its upstream calls included.
        ("foldgate.tokens.consumed", &[who], federated.tokens_used as f64),
        (
            "foldgate.db.operation.duration",
            &[("db.operation.name", "create_branch"), ("db.system.name", "sqlite")],
            3.0,
        ),
        ("foldgate.db.operation.duration", &[("db.operation.name", "meter_call")], 2.0),
    ];
    for (name, wanted, expected) in cases {
        assert_eq!(value(name, wanted), *expected, "{name} {wanted:?}");
    }
    let listings = value("mcp.client.operation.duration", &[("mcp.method.name", "tools/list")]);
    assert!(listings >= 1.0, "the refresher's listings");
    for direction in ["in", "out"] {
        assert!(value("foldgate.upstream.tokens", &[who, files, ("direction", direction)]) > 0.0);
    }

    // Each call the upstream received carries the trace of the agent's
    // request, with the gateway's client span as its parent.
    let by_id: BTreeMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), s)).collect();
    let received = upstream.calls();
    let tools: Vec<&str> = received.iter().map(|c| c.tool.as_str()).collect();
    assert_eq!(tools, ["echo", "echo", "fail"]);
    for (i, traced) in received.iter().enumerate() {
        let header = traced.header.as_deref().expect("a traceparent header");
        assert_eq!(traced.meta.as_deref(), Some(header), "_meta.traceparent is the same");
        let [version, trace_id, parent_id, flags] = header.split('-').collect::<Vec<_>>()[..]
        else {
            panic!("not a traceparent: {header}");
        };
        assert_eq!((version, flags), ("00", "01"), "{header}");
        let client = by_id
            .get(hex_bytes(parent_id).as_slice())
            .unwrap_or_else(|| panic!("no exported span is the parent in {header}"));
        assert_eq!(client.name, format!("tools/call {}", traced.tool));
        assert_eq!(client.kind, SpanKind::Client as i32);
        assert_eq!(hex(&client.trace_id), trace_id);
        assert_eq!(client.attributes["upstream"], "files");
        assert_eq!(client.attributes["gen_ai.tool.name"], traced.tool);
        assert_eq!(client.attributes["mcp.method.name"], "tools/call");
        let chain: Vec<&Span> = std::iter::successors(Some(*client), |s| {
            by_id.get(s.parent_span_id.as_slice()).copied()
        })
        .collect();
        let names: Vec<&str> = chain.iter().map(|s| s.name.as_str()).collect();
        let metering = chain.iter().find(|s| s.name == "upstream.call").expect("upstream.call");
        let server = chain
            .iter()
            .find(|s| s.name == format!("tools/call files__{}", traced.tool))
            .unwrap_or_else(|| panic!("no MCP server span above: {names:?}"));
        let request = chain.last().unwrap();
        assert_eq!(request.name, "POST /mcp", "{names:?}");
        assert_eq!(hex(&request.trace_id), trace_id, "the agent's request's trace");
        assert_eq!(server.kind, SpanKind::Server as i32);
        assert_eq!(server.attributes["tenant"], "otlp-up");
        assert_eq!(server.attributes["mcp.method.name"], "tools/call");
        assert_eq!(metering.attributes["tenant"], "otlp-up");
        assert!(metering.attributes["tokens_in"].parse::<u64>().unwrap() > 0);
        let error = Some("tool_error").filter(|_| traced.tool == "fail");
        for span in [client, server] {
            assert_eq!(span.attributes.get("error.type").map(String::as_str), error, "{span:?}");
            assert_eq!(span.status == 2, error.is_some(), "status of {}", span.name);
        }
        assert_eq!(metering.attributes["outcome"], error.unwrap_or("ok"));
        if i == 0 {
            // Outside any branch.
            assert!(!metering.attributes.contains_key("branch.id"), "{metering:?}");
        } else {
            // Named in `_meta`, seen by the server span; charged there.
            assert_eq!(server.attributes["branch.id"], federated.branch);
            assert_eq!(metering.attributes["branch.id"], federated.branch);
            assert_eq!(metering.attributes["session.id"], "otlp-up-1");
        }
    }
}

/// The same export over gRPC, checked more briefly: the exporters differ,
/// the telemetry does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_over_grpc_receives_metrics_and_spans() {
    let (endpoint, received) = grpc_receiver().await;
    let target = OtlpTarget { endpoint, protocol: Protocol::Grpc };
    let settings = OtelSettings {
        traces: Some(target.clone()),
        metrics: Some(target),
        ..OtelSettings::default()
    };
    let telemetry = Telemetry::new(&settings).unwrap();
    // This test installs no subscriber: it exports the spans it makes itself.
    let layer = telemetry.trace_layer().expect("traces are exported");
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("branch.create", tenant = "grpc").in_scope(|| {});
    });
    let gw = TestGateway::start_with_telemetry(Backend::Sqlite, |_| {}, telemetry).await;
    fold_cycle(&gw, "grpc", "grpc-1").await;
    gw.stop().await;

    let (metrics, resources) = last_points(&received.metrics.lock().unwrap());
    assert_eq!(resources[0].get("service.name").map(String::as_str), Some("foldgate"));
    let created = find(&metrics["foldgate.branches.created"], &[("tenant", "grpc")]).unwrap();
    assert_eq!(created.value, 2.0);
    let spans = spans(&received.traces.lock().unwrap());
    assert!(
        spans.iter().any(|s| s.name == "branch.create" && s.attributes["tenant"] == "grpc"),
        "{spans:?}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_bytes(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

// ---------------------------------------------------------------------------
// The Prometheus exposition.

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text format: `# TYPE` lines and samples (labels unescaped).
fn parse_exposition(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    let mut samples = Vec::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap();
        let name = line[..name_end].to_owned();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices();
            let mut key = String::new();
            loop {
                let (i, c) = chars.next().unwrap();
                match c {
                    '}' => {
                        rest = &inner[i + 1..];
                        break;
                    }
                    ',' => {}
                    '=' => {
                        assert_eq!(chars.next().unwrap().1, '"', "{line}");
                        let mut value = String::new();
                        loop {
                            match chars.next().unwrap().1 {
                                '\\' => match chars.next().unwrap().1 {
                                    'n' => value.push('\n'),
                                    other => value.push(other),
                                },
                                '"' => break,
                                other => value.push(other),
                            }
                        }
                        labels.insert(std::mem::take(&mut key), value);
                    }
                    other => key.push(other),
                }
            }
        }
        let value = rest.trim().split(' ').next().unwrap();
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value of {line}")),
        };
        samples.push(Sample { name, labels, value });
    }
    (samples, types)
}

fn sample<'a>(samples: &'a [Sample], name: &str, wanted: &[(&str, &str)]) -> Option<&'a Sample> {
    samples.iter().find(|s| {
        s.name == name
            && wanted.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

async fn scrape(gw: &TestGateway) -> (Vec<Sample>, BTreeMap<String, String>) {
    let response = reqwest::get(format!("http://{}/metrics", gw.running.ops_addr)).await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    parse_exposition(&response.text().await.unwrap())
}

/// Scrapes until a sample matching `wanted` has `value` (gauges read from
/// the database are refreshed in the background).
async fn scrape_until(
    gw: &TestGateway,
    name: &str,
    wanted: &[(&str, &str)],
    value: f64,
) -> (Vec<Sample>, BTreeMap<String, String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let scraped = scrape(gw).await;
        if sample(&scraped.0, name, wanted).is_some_and(|s| s.value == value) {
            return scraped;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} {wanted:?} never became {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_exposition_is_served_on_the_ops_port_only() {
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.telemetry.store_poll_interval = Duration::from_millis(20);
    })
    .await;
    fold_cycle(&gw, "acme", "conv-1").await;

    let acme = ("tenant", "acme");
    let (samples, types) = scrape_until(&gw, "foldgate_branches_active", &[acme], 0.0).await;
    let cases: &[Expected<'_>] = &[
        ("foldgate_branches_created_total", &[acme], 2.0),
        (
            "foldgate_branches_completed_total",
            &[acme, ("status", "completed"), ("reason", "returned")],
            1.0,
        ),
        (
            "foldgate_branches_completed_total",
            &[acme, ("status", "failed"), ("reason", "parent_returning")],
            1.0,
        ),
        ("foldgate_branches_forced_returns_total", &[acme, ("reason", "parent_returning")], 1.0),
        ("foldgate_branch_duration_seconds_count", &[acme, ("status", "completed")], 1.0),
        (
            "foldgate_branch_duration_seconds_bucket",
            &[acme, ("status", "failed"), ("le", "+Inf")],
            1.0,
        ),
        ("foldgate_branch_budget_utilization_ratio_count", &[acme, ("status", "completed")], 1.0),
        ("foldgate_branch_compression_ratio_count", &[acme], 1.0),
        ("foldgate_db_pool_connections_max", &[], 10.0),
        (
            "mcp_server_operation_duration_seconds_count",
            &[
                ("mcp_method_name", "tools/call"),
                ("gen_ai_tool_name", "branch_create"),
                ("gen_ai_operation_name", "execute_tool"),
                ("mcp_protocol_version", "2025-11-25"),
            ],
            2.0,
        ),
        (
            "foldgate_db_operation_duration_seconds_count",
            &[("db_operation_name", "create_branch"), ("db_system_name", "sqlite")],
            2.0,
        ),
        (
            "target_info",
            &[("service_name", "foldgate"), ("service_version", foldgate_telemetry::VERSION)],
            1.0,
        ),
    ];
    for (name, wanted, value) in cases {
        let found = sample(&samples, name, wanted).unwrap_or_else(|| panic!("{name} {wanted:?}"));
        assert_eq!(found.value, *value, "{name} {wanted:?}");
    }
    assert!(sample(&samples, "foldgate_tokens_consumed_total", &[acme]).unwrap().value > 0.0);
    assert!(sample(&samples, "foldgate_db_pool_connections", &[("state", "idle")]).is_some());
    let posts = sample(
        &samples,
        "foldgate_http_server_request_duration_seconds_count",
        &[
            ("http_route", "/mcp"),
            ("http_request_method", "POST"),
            ("http_response_status_code", "200"),
        ],
    )
    .unwrap();
    assert!(posts.value >= 4.0, "{posts:?}");

    // Histogram buckets are cumulative and end with the count.
    let buckets: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == "foldgate_branch_duration_seconds_bucket" && s.labels["status"] == "completed"
        })
        .collect();
    assert!(buckets.len() > 2);
    assert!(buckets.windows(2).all(|w| w[0].value <= w[1].value), "{buckets:?}");
    assert!(
        sample(&samples, "foldgate_branch_duration_seconds_sum", &[acme]).unwrap().value >= 0.0
    );

    for (name, kind) in [
        ("foldgate_branches_created_total", "counter"),
        ("foldgate_branches_active", "gauge"),
        ("foldgate_branch_duration_seconds", "histogram"),
        ("foldgate_http_server_request_duration_seconds", "histogram"),
        ("mcp_server_operation_duration_seconds", "histogram"),
        ("foldgate_db_operation_duration_seconds", "histogram"),
    ] {
        assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}");
    }

    // The MCP port does not expose metrics.
    let on_mcp = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap();
    assert_eq!(on_mcp.status(), 404);
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Dashboard and alert rules.

fn deploy_file(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `expr` of a dashboard's panels (nested rows included) and every
/// query of its template variables.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                assert_eq!(target["datasource"]["uid"], "prometheus", "{}", panel["title"]);
                out.push(target["expr"].as_str().expect("every target has an expr").to_owned());
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] == "query" {
            let query = &variable["query"];
            let query = query.as_str().or_else(|| query["query"].as_str()).unwrap();
            out.push(query.to_owned());
        }
    }
    out
}

/// The metric names a PromQL expression (or a Grafana `label_values`
/// query) selects.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"#).unwrap();
    let matchers = regex::Regex::new(r"\{[^}]*\}|\[[^\]]*\]").unwrap();
    let grouping =
        regex::Regex::new(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
            .unwrap();
    let label_values = regex::Regex::new(r"label_values\(\s*([^,()]+?)\s*,[^)]*\)").unwrap();
    let identifier = regex::Regex::new(r"\$\{?\w+\}?|[0-9][\w.]*|[A-Za-z_:][\w:]*").unwrap();
    const KEYWORDS: &[&str] =
        &["and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"];

    let expr = strings.replace_all(expr, "");
    let expr = matchers.replace_all(&expr, "");
    let expr = grouping.replace_all(&expr, "");
    let expr = label_values.replace_all(&expr, "$1");
    let mut names = BTreeSet::new();
    for m in identifier.find_iter(&expr) {
        let token = m.as_str();
        let is_call = expr[m.end()..].trim_start().starts_with('(');
        if token.starts_with('$') || token.starts_with(|c: char| c.is_ascii_digit()) || is_call {
            continue;
        }
        if !KEYWORDS.contains(&token.to_ascii_lowercase().as_str()) {
            names.insert(token.to_owned());
        }
    }
    names
}

/// The labels an expression's selectors match on, with their metrics:
/// `rate(a{x="1", y!=""}[5m])` gives `(a, x)` and `(a, y)`.
fn selector_labels(expr: &str) -> Vec<(String, String)> {
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"#).unwrap();
    let selector = regex::Regex::new(r"([A-Za-z_:][\w:]*)\{([^}]*)\}").unwrap();
    let matcher = regex::Regex::new(r"(\w+)\s*(?:=~|!~|!=|=)").unwrap();
    let expr = strings.replace_all(expr, "\"\"");
    let mut found = Vec::new();
    for s in selector.captures_iter(&expr) {
        for m in matcher.captures_iter(&s[2]) {
            found.push((s[1].to_owned(), m[1].to_owned()));
        }
    }
    found
}

#[test]
fn metric_names_are_extracted_from_promql() {
    let cases: &[(&str, &[&str])] = &[
        (
            r#"sum by (tenant) (rate(foldgate_branches_created_total{tenant=~"$tenant"}[$__rate_interval]))"#,
            &["foldgate_branches_created_total"],
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0.5 and on() b offset 1h",
            &["a_bucket", "b"],
        ),
        (
            "label_values(foldgate_branches_created_total, tenant)",
            &["foldgate_branches_created_total"],
        ),
        ("up{job=\"foldgate\"} == 0", &["up"]),
        ("sum(x) / clamp_min(sum(y), 1) * 100", &["x", "y"]),
    ];
    for (expr, expected) in cases {
        let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(metric_names(expr), expected, "{expr}");
    }
    let labels = selector_labels(
        r#"sum by (a) (rate(m_count{instance=~"$i", error_type!="", x="a=b{c}"}[5m])) / n"#,
    );
    let pairs: Vec<(&str, &str)> = labels.iter().map(|(m, l)| (m.as_str(), l.as_str())).collect();
    assert_eq!(pairs, [("m_count", "instance"), ("m_count", "error_type"), ("m_count", "x")]);
}

/// Runs everything the dashboard and the alerts look at, so that each of
/// their series exists: a fold, a fold through an upstream (calls inside
/// and outside a branch, a tool error), a call of a tool nobody offers, a
/// refused create, a deadline fired by the supervisor, a request refused by
/// authentication and one by the rate limit.
async fn exercise_everything(gw: &TestGateway) {
    fold_cycle(gw, "acme", "conv-1").await;
    federated_fold(gw, "acme", "fed-1").await;
    let agent = client(&gw.url, &gw.write_token("acme", "bob"), Era::Discover).await;
    // Too deep (the test gateway allows depth 2).
    let mut parent = None;
    for depth in 1..=2 {
        let mut args = json!({"session_id": "deep", "description": format!("level {depth}")});
        if let Some(id) = &parent {
            args["parent_branch_id"] = json!(id);
        }
        parent = Some(ok(&call(&agent, "branch_create", args).await)["branch_id"].clone());
    }
    let refused = call(
        &agent,
        "branch_create",
        json!({"session_id": "deep", "description": "level 3", "parent_branch_id": parent}),
    )
    .await;
    assert_eq!(refusal(&refused).0, "max_depth_exceeded");
    // A return that gives a secret away, which is redacted.
    let leaky =
        ok(&call(&agent, "branch_create", json!({"session_id": "leak", "description": "d"})).await);
    let token = format!("ghp_{}", "Zq8vN2kLp4Rt6Wx9Yb1Cd3Ef5Gh7Jk0Mn2Pq");
    let returned = ok(&call(
        &agent,
        "branch_return",
        json!({"branch_id": leaky["branch_id"], "message": format!("the token is {token}")}),
    )
    .await);
    assert!(!returned["message"].as_str().unwrap().contains(&token));
    // A deadline the supervisor fires.
    let short = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "short", "description": "quick look", "timeout_seconds": 1}),
    )
    .await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let status =
            ok(&call(&agent, "branch_status", json!({"branch_id": short["branch_id"]})).await);
        if status["status"] == "timeout" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the deadline never fired: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.cancel().await.unwrap();

    let http = reqwest::Client::new();
    let unknown = http
        .post(&gw.url)
        .bearer_auth(gw.write_token("acme", "dave"))
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "made_up__tool", "arguments": {}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let unauthenticated = http.post(&gw.url).json(&ping).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    let token = gw.write_token("acme", "mallory");
    let mut limited = false;
    for _ in 0..50 {
        let response = http
            .post(&gw.url)
            .bearer_auth(&token)
            .header(header::ACCEPT, "application/json, text/event-stream")
            .json(&ping)
            .send()
            .await
            .unwrap();
        if response.status() == 429 {
            limited = true;
            break;
        }
    }
    assert!(limited, "the request rate limit never applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_query_only_exported_metrics() {
    let upstream = Upstream::start().await;
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.telemetry.store_poll_interval = Duration::from_millis(20);
        c.folding.max_depth = 2;
        c.supervisor.deadline_poll_interval = Duration::from_millis(50);
        c.api.rate_limit.per_second = 1;
        c.api.rate_limit.burst = 30;
        c.upstreams = vec![upstream.config()];
    })
    .await;
    exercise_everything(&gw).await;
    let (samples, _) =
        scrape_until(&gw, "foldgate_branches_active", &[("tenant", "acme")], 2.0).await;
    gw.stop().await;
    let exported: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();

    // The federation and MCP series, as Prometheus names them.
    let files = ("upstream", "files");
    let acme = ("tenant", "acme");
    // The call of a tool nobody offers.
    let refused = [("mcp_method_name", "tools/call"), ("error_type", "-32602")];
    let cases: &[Expected<'_>] = &[
        ("foldgate_upstream_up", &[files], 1.0),
        ("foldgate_upstream_tools", &[files], 2.0),
        ("foldgate_upstream_calls_outside_branches_total", &[acme, files], 1.0),
        (
            "mcp_client_operation_duration_seconds_count",
            &[files, ("gen_ai_tool_name", "fail"), ("error_type", "tool_error")],
            1.0,
        ),
        (
            "mcp_server_operation_duration_seconds_count",
            &[("gen_ai_tool_name", "files__echo"), ("network_transport", "tcp")],
            2.0,
        ),
        ("mcp_server_operation_duration_seconds_count", &refused, 1.0),
    ];
    for (name, wanted, value) in cases {
        let found = sample(&samples, name, wanted).unwrap_or_else(|| panic!("{name} {wanted:?}"));
        assert_eq!(found.value, *value, "{name} {wanted:?}");
    }
    let refused =
        sample(&samples, "mcp_server_operation_duration_seconds_count", &refused).unwrap();
    assert!(!refused.labels.contains_key("gen_ai_tool_name"), "an unknown tool is not named");
    assert!(
        samples.iter().all(|s| s.labels.values().all(|v| !v.contains("made_up"))),
        "a client's free text makes no series"
    );
    // rmcp answers the 2026-07-28 client's discovery itself; it is counted.
    let discovered = sample(
        &samples,
        "mcp_server_operation_duration_seconds_count",
        &[("mcp_method_name", "server/discover"), ("mcp_protocol_version", "2026-07-28")],
    );
    assert!(discovered.is_some_and(|s| s.value >= 1.0), "{discovered:?}");
    assert!(
        sample(&samples, "foldgate_upstream_tokens_total", &[acme, files, ("direction", "out")])
            .unwrap()
            .value
            > 0.0
    );
    assert!(
        sample(
            &samples,
            "foldgate_db_operation_duration_seconds_count",
            &[("db_operation_name", "meter_call"), ("db_system_name", "sqlite")]
        )
        .unwrap()
        .value
            >= 2.0
    );

    let dashboard: Value = serde_json::from_str(&deploy_file("grafana/foldgate.json")).unwrap();
    let mut queries: Vec<(String, String)> = dashboard_queries(&dashboard)
        .into_iter()
        .map(|q| ("grafana/foldgate.json".to_owned(), q))
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&deploy_file("prometheus/alerts.yaml")).unwrap();
    let mut alert_names = Vec::new();
    for group in alerts["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().expect("alerting rules only");
            assert!(rule["for"].as_str().is_some(), "{name}: a `for` duration");
            assert!(rule["labels"]["severity"].as_str().is_some(), "{name}: a severity");
            assert!(rule["annotations"]["summary"].as_str().is_some(), "{name}: a summary");
            alert_names.push(name.to_owned());
            queries.push((name.to_owned(), rule["expr"].as_str().unwrap().to_owned()));
        }
    }
    assert!(alert_names.len() >= 5, "{alert_names:?}");

    let mut unknown = Vec::new();
    for (origin, query) in &queries {
        for name in metric_names(query) {
            let known =
                exported.contains(name.as_str()) || PROMETHEUS_SERIES.contains(&name.as_str());
            if !known {
                unknown.push(format!("{origin}: {name} (in {query})"));
            }
        }
        // Selectors match on labels the metric has (Prometheus adds
        // `instance` and `job` to every series it scrapes).
        for (name, label) in selector_labels(query) {
            if PROMETHEUS_SERIES.contains(&name.as_str())
                || ["instance", "job"].contains(&label.as_str())
                || FAILURE_ONLY_LABELS.contains(&(name.as_str(), label.as_str()))
            {
                continue;
            }
            if !samples.iter().any(|s| s.name == name && s.labels.contains_key(&label)) {
                unknown.push(format!("{origin}: {name} has no label {label} (in {query})"));
            }
        }
    }
    assert!(unknown.is_empty(), "queried but not exported:\n{}", unknown.join("\n"));
}
