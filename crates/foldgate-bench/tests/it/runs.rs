//! `foldgate-bench runs` against a real gateway (in process, on SQLite)
//! configured as the bench configures the one it starts: runs one at a time
//! split into their parts, and a level of runs at once with its samples.

use std::time::Duration;

use foldgate::config::Config;
use foldgate_bench::{
    load::Auth,
    process::BENCH_GATEWAY_CONFIG,
    runs::{
        Backends, ConcurrentSpec, ModelApi, RunTarget, SequentialSpec, concurrent, sequential,
        wait_for_upstream,
    },
};
use foldgate_telemetry::Telemetry;
use foldgate_testkit::{Backend, TestDb, gateway::serve_on_loopback};

const SECRET: &str = "bench-runs-signing-secret-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_split_into_their_parts_and_sampled_at_once() {
    // Arrange: the gateway with the bench's own configuration.
    let db = TestDb::new(Backend::Sqlite).await;
    let backends = Backends::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foldgate.toml");
    let toml =
        format!("{BENCH_GATEWAY_CONFIG}\n{}", backends.gateway_toml(ModelApi::Openai, false));
    std::fs::write(&path, toml).unwrap();
    let env = [
        ("DATABASE_URL".to_owned(), db.url.clone()),
        ("FOLDGATE_JWT_SECRET".to_owned(), SECRET.to_owned()),
    ];
    let config = Config::load(Some(&path), env).unwrap();
    let running = serve_on_loopback(config, Telemetry::local()).await;
    let target = RunTarget {
        url: running.mcp_url.clone(),
        ops_url: Some(format!("http://{}", running.ops_addr)),
        pid: std::process::id(),
        auth: Auth { secret: SECRET.into(), audience: None, tenants: 2 },
        run_id: format!("runs{}", &uuid::Uuid::new_v4().simple().to_string()[..6]),
        run_timeout: 30,
        postgres_url: None,
    };
    wait_for_upstream(&target).await.unwrap();

    // Act: one at a time.
    let spec = SequentialSpec { runs: 4, warmup: 1, tool_calls: 2 };
    let one = sequential(&target, &backends, spec).await.unwrap();

    // Assert: every run as scripted, and each split into its parts.
    assert!(one.failed.is_empty(), "{:?}", one.failed);
    assert_eq!(one.steps_per_run, 5, "two model and tool steps, and the final answer");
    assert_eq!(one.wall_ms.as_ref().unwrap().n, 4);
    assert_eq!(one.unaligned, 0);
    assert_eq!(one.upstream_ms.as_ref().unwrap().n, 8, "two tool calls per run, timed");
    assert_eq!(one.timeline.model_to_tool_ms.as_ref().unwrap().n, 8);
    assert_eq!(one.timeline.last_model_to_result_ms.as_ref().unwrap().n, 4);
    assert!(one.model_server_ms.is_some(), "the model server was timed alone");
    let (overhead, per_step) =
        (one.overhead_per_step_ms.as_ref().unwrap(), one.wall_per_step_ms.as_ref().unwrap());
    assert!(overhead.p50 > 0.0 && overhead.p50 < per_step.p50, "{overhead:?} {per_step:?}");
    assert!(one.gateway_cpu_ms_per_step.is_some_and(|c| c > 0.0));
    let steps_written = one.db.get("record_step").map(|op| op.per_run);
    assert_eq!(steps_written, Some(5.0), "store calls read from /metrics: {:?}", one.db);

    // Act: several at once, each model answer 300 ms late.
    let spec = ConcurrentSpec {
        runs: 6,
        tool_calls: 1,
        model_delay: Duration::from_millis(300),
        status_interval: Duration::from_millis(50),
    };
    let level = concurrent(&target, &backends, spec).await.unwrap();

    // Assert
    assert_eq!(level.completed, 6, "{:?}", level.ended);
    assert!((level.ideal_s - 0.6).abs() < 1e-9);
    let wall = level.wall_s.as_ref().unwrap();
    assert!(wall.min >= 0.6, "no run is faster than its model: {wall:?}");
    assert!(level.makespan_s >= wall.max, "{}", level.makespan_s);
    assert_eq!(level.first_model_call_s.as_ref().unwrap().n, 6, "one first request per run");
    assert_eq!(level.call_to_first_model_s.as_ref().unwrap().n, 6, "every run split");
    assert_eq!(level.answer_to_next_model_s.as_ref().unwrap().n, 6, "one tool call each");
    assert_eq!(level.last_answer_to_result_s.as_ref().unwrap().n, 6);
    assert!(level.status_ms.as_ref().is_some_and(|s| s.n > 0), "{:?}", level.status_errors);
    assert!(level.status_errors.is_empty(), "{:?}", level.status_errors);
    assert!(level.pool_used_max.is_some() && level.pool_size_max.is_some(), "read from /metrics");
    assert!(level.rss_mib_peak.is_some() && level.gateway_cores_mean.is_some());

    running.stop().await.unwrap();
    backends.stop().await.unwrap();
    db.cleanup().await;
}
