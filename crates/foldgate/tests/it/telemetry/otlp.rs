//! Metrics and spans pushed to OTLP receivers (HTTP and gRPC), and the
//! trace context an upstream receives.

use super::*;

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
                    let numbers =
                        |points: &[opentelemetry_proto::tonic::metrics::v1::NumberDataPoint]| -> Vec<Point> {
                            points
                                .iter()
                                .map(|p| Point {
                                    attributes: attributes(&p.attributes),
                                    value: number(p),
                                })
                                .collect()
                        };
                    let points: Vec<Point> = match metric.data.as_ref().unwrap() {
                        Data::Sum(s) => numbers(&s.data_points),
                        Data::Gauge(g) => numbers(&g.data_points),
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
    // this is the one test of this binary that installs it. Every gateway's
    // spans reach it from then on, so this one runs alone (the health check
    // below is the only one while it runs).
    let alone = Gate::alone().await;
    tracing::subscriber::set_global_default(foldgate_telemetry::subscriber(
        &telemetry,
        LogFormat::Text,
        false,
    ))
    .unwrap();
    let (upstream, upstream_entry) = upstream().await;
    let gw = TestGateway::start_alone(
        Backend::Sqlite,
        |c| {
            c.telemetry.store_poll_interval = Duration::from_millis(20);
            c.upstreams = vec![upstream_entry];
        },
        telemetry,
        alone,
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
