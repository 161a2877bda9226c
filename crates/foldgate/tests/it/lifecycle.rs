//! Starting with no configuration, and stopping cleanly.

use foldgate::config::Config;
use foldgate_telemetry::Telemetry;
use foldgate_testkit::{
    TestDb,
    gateway::{Era, TestGateway, call, client, ok, serve_on_loopback},
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_prints_a_token_that_works() {
    let db = TestDb::sqlite().await;
    // Nothing configured but where the database file goes.
    let config = Config { database_url: db.url.as_str().into(), ..Config::default() };
    let running = serve_on_loopback(config, Telemetry::local()).await;
    let dev = running.dev_token.clone().expect("a development token");
    assert!(dev.secret.len() >= 32);

    let agent = client(&running.mcp_url, &dev.token, Era::Legacy).await;
    let created =
        ok(&call(&agent, "branch_create", json!({"session_id": "s", "description": "try it"}))
            .await);
    assert_eq!(created["depth"], 1);
    agent.cancel().await.unwrap();
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_lets_requests_finish_and_closes_the_listener() {
    let gw = TestGateway::start(foldgate_testkit::Backend::Sqlite).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    let created =
        ok(&call(&agent, "branch_create", json!({"session_id": "s", "description": "d"})).await);
    let ops = format!("http://{}", gw.running.ops_addr);
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{ops}/readyz")).send().await.unwrap().status(), 200);
    assert_eq!(
        http.get(format!("{}/mcp", gw.base)).send().await.unwrap().status().as_u16() / 100,
        4
    );

    let base = gw.base.clone();
    agent.cancel().await.unwrap();
    let db = gw.db;
    gw.running.stop().await.unwrap();
    assert!(http.get(format!("{base}/healthz")).send().await.is_err(), "no longer listening");

    // Nothing was lost: the branch is in the database for the next process.
    let store = db.connect().await;
    let tenant = foldgate_domain::TenantId::parse("acme").unwrap();
    let id = foldgate_domain::BranchId::parse(created["branch_id"].as_str().unwrap()).unwrap();
    assert!(
        store.branch(&tenant, id).await.unwrap().unwrap().status
            == foldgate_domain::BranchStatus::Active
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ops_port_lists_the_background_tasks_with_their_last_outcome() {
    let gw = TestGateway::start(foldgate_testkit::Backend::Sqlite).await;
    let url = format!("http://{}/background", gw.running.ops_addr);
    let expected = [
        "rate_limit_cleanup",
        "database_outage",
        "registrations",
        "run_takeover",
        "run_ends",
        "usage_flush",
        "tenant_sync",
        "store_gauges",
        "deadlines",
        "idle_sessions",
        "retention",
        "memory_retention",
        "memory_distill",
        "memory_extract",
        "memory_uses",
    ];

    // Each task is activated once when the gateway starts.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let tasks = loop {
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.unwrap();
        let tasks = body["tasks"].as_array().unwrap().clone();
        if tasks.iter().all(|t| t["activations"].as_u64() > Some(0)) {
            break tasks;
        }
        assert!(tokio::time::Instant::now() < deadline, "not every task ran: {tasks:#?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };

    let mut names: Vec<&str> = tasks.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    let mut wanted = expected.to_vec();
    wanted.sort_unstable();
    assert_eq!(names, wanted);
    for task in &tasks {
        assert_eq!(task["last"]["outcome"], "ok", "{task:#}");
        assert!(task["last"]["status"].is_object(), "{task:#}");
    }
    let flush = tasks.iter().find(|t| t["name"] == "usage_flush").unwrap();
    assert_eq!(
        (flush["period_ms"].as_u64(), flush["on_stop"].as_str()),
        (Some(5000), Some("last_pass"))
    );
    gw.running.stop().await.unwrap();
}
