//! The gateway's telemetry, observed from outside: metrics and spans pushed
//! to an OTLP/HTTP receiver, trace context passed on to an upstream MCP
//! server, the Prometheus exposition on the operations port (and only
//! there), and the shipped dashboard and alert rules, which must query only
//! metrics the gateway exports.

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
use foldgate_api::upstream::UpstreamConfig;
use foldgate_telemetry::{LogFormat, OtelSettings, OtlpTarget, Protocol, Telemetry};
use foldgate_testkit::{
    Backend,
    gateway::{
        Client, Era, Gate, TestGateway, call, call_in, client, ok, refusal, upstream_config,
    },
    upstream::Upstream,
};
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
use serde_json::{Value, json};
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

/// The upstream: `echo` and `fail` (a tool error), noting the trace
/// context of every call, for every tenant.
async fn upstream() -> (Upstream, UpstreamConfig) {
    let upstream = Upstream::builder().tools(&["echo", "fail"]).start().await;
    let config = upstream_config(&format!(
        "[[upstreams]]\nname = \"files\"\nurl = \"{}\"\nrefresh_seconds = 1\n",
        upstream.url()
    ));
    (upstream, config)
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
// The Prometheus exposition.

#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
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

pub(crate) fn sample<'a>(
    samples: &'a [Sample],
    name: &str,
    wanted: &[(&str, &str)],
) -> Option<&'a Sample> {
    samples.iter().find(|s| {
        s.name == name
            && wanted.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

pub(crate) async fn scrape(gw: &TestGateway) -> (Vec<Sample>, BTreeMap<String, String>) {
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

/// A metric, the attributes (or labels) one of its points has, and that
/// point's value.
type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

mod dashboard;
mod otlp;
mod prometheus;
mod zero;
