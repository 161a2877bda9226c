//! The Prometheus exposition, on the operations port only.

use super::*;

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
