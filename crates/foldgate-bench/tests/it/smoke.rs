//! The bench against a real gateway (in process, on a fresh Postgres
//! schema) and a real baseline echo server: a short fold run and an echo
//! run produce a complete report, and the run's branches check out in the
//! database.

use std::time::Duration;

use foldgate::{config::Config, serve};
use foldgate_api::auth::Secret;
use foldgate_bench::{
    echo::EchoServer,
    load::{self, Auth, Mode, Stop, Target, Workload},
    report::{Machine, RunReport},
    verify::{VerifyOptions, verify},
};
use foldgate_telemetry::Telemetry;
use foldgate_testkit::{Backend, TestDb, gateway::serve_on_loopback};

const SECRET: &str = "bench-smoke-signing-secret-0123456789abcdef";

async fn gateway(db: &TestDb) -> serve::Running {
    let mut config = Config { database_url: db.url.as_str().into(), ..Config::default() };
    config.auth.jwt_secret = Some(Secret::new(SECRET));
    config.api.rate_limit.per_second = 100_000;
    config.api.rate_limit.burst = 100_000;
    config.folding.limits.creations_per_minute = 100_000;
    config.supervisor.idle_poll_interval = Duration::from_secs(3600);
    serve_on_loopback(config, Telemetry::local()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fold_cycles_and_baseline_make_a_complete_report() {
    // Arrange
    let db = TestDb::new(Backend::Postgres).await;
    let running = gateway(&db).await;
    let echo = EchoServer::start("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("branches.jsonl");
    let run_id = format!("smoke{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    let gateway_target = Target {
        name: "gateway".into(),
        urls: vec![running.mcp_url.clone()],
        auth: Some(Auth { secret: SECRET.into(), audience: None, tenants: 2 }),
        pid: Some(std::process::id()),
    };
    let baseline_target =
        Target { name: "baseline".into(), urls: vec![echo.url()], auth: None, pid: None };
    let mut fold = Workload::new(Mode::Fold, run_id.clone());
    fold.agents = 2;
    fold.stop = Stop::Count(50);
    fold.cycles_per_session = 3;
    // Every tenth cycle leaves its branches to the supervisor (1 s deadline).
    fold.abandon_every = Some(10);
    fold.branch_timeout = 1;
    fold.record = Some(record.clone());
    let mut echo_load = Workload::new(Mode::Echo, run_id.clone());
    echo_load.agents = 2;
    echo_load.stop = Stop::Count(50);

    // Act
    let machine = Machine::now();
    let baseline = load::run(&baseline_target, &echo_load).await.unwrap();
    let folded = load::run(&gateway_target, &fold).await.unwrap();
    let report =
        RunReport::new(chrono::Utc::now(), machine, &fold, 1, None, vec![baseline, folded]);

    // Assert: every call succeeded and every figure is there.
    let g = report.gateway.as_ref().expect("gateway figures");
    assert_eq!(g.measured.error_calls, 0, "errors: {:?}", g.measured.errors);
    assert_eq!((g.measured.cycles, g.measured.abandoned_cycles), (45, 5));
    let tools = &g.measured.tools;
    assert_eq!(tools["branch_create"].ok, 100, "two creates per cycle");
    assert_eq!(tools["branch_status"].ok, 50);
    assert_eq!(tools["branch_return"].ok, 90, "abandoned cycles return nothing");
    assert!(tools.get("session_end").is_some_and(|t| t.ok >= 1), "sessions rotate");
    assert!(
        g.measured.latency.p50_ms > 0.0 && g.measured.latency.p99_ms >= g.measured.latency.p50_ms
    );
    assert!(g.max_rss_kib.is_some_and(|kib| kib > 0), "resources were sampled");
    let b = report.baseline.as_ref().expect("baseline figures");
    assert_eq!((b.measured.ok_calls, b.measured.error_calls), (50, 0));
    let comparison = report.comparison.as_ref().expect("gateway against baseline");
    assert!(comparison.throughput_ratio > 0.0);
    let json = serde_json::to_value(&report).unwrap();
    for key in ["machine_before", "settings", "gateway", "baseline", "comparison", "rounds"] {
        assert!(!json[key].is_null(), "report lacks {key}");
    }
    let text = report.render();
    assert!(text.contains("branch_create") && text.contains("gateway (all) / baseline (echo)"));

    // Assert: the database agrees with what the clients saw, and the
    // abandoned branches' deadlines fired in time.
    let verification = verify(&VerifyOptions {
        database_url: db.url.clone(),
        run_id,
        record: Some(record),
        settle: Duration::from_secs(10),
        max_late: Duration::from_secs(1),
        outages: Vec::new(),
        restart_slack: Duration::from_secs(5),
        logs: Vec::new(),
        whole_database: true,
    })
    .await
    .unwrap();
    assert!(verification.passed(), "{:?}", verification.failures);
    assert_eq!((verification.recorded_created, verification.lost), (100, 0));
    assert_eq!(verification.recorded_returned, 90);
    assert_eq!(verification.branches_in_db, 100);
    assert!(verification.fired >= 5, "abandoned branches fired: {verification:?}");

    running.stop().await.unwrap();
    echo.stop().await.unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn failures_are_told_apart() {
    let echo = EchoServer::start("127.0.0.1:0").await.unwrap();
    let options = foldgate_bench::client::ClientOptions::default();
    let mut client = foldgate_bench::client::McpClient::new(&echo.url(), None, &options).unwrap();

    let ok = client.call_tool("echo", serde_json::json!({"text": "hi"}), None).await.unwrap();
    assert_eq!(ok["text"], "hi");
    let unknown = client.call_tool("nope", serde_json::json!({}), None).await.unwrap_err();
    assert_eq!(unknown.kind(), "jsonrpc:-32602");

    let url = echo.url();
    echo.stop().await.unwrap();
    let mut refused = foldgate_bench::client::McpClient::new(&url, None, &options).unwrap();
    let down = refused.call_tool("echo", serde_json::json!({}), None).await.unwrap_err();
    assert_eq!(down.kind(), "transport:connect", "{down}");
}
