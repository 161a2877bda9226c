//! A run outlives the replica running it.

use super::*;

/// The replica working on a run is killed (SIGKILL) with a model call in
/// flight: another process takes the run over once its lease lapses,
/// replays the written steps and completes it; each step is booked once.
#[tokio::test]
async fn a_run_survives_the_death_of_its_replica() {
    const AUDIENCE: &str = "foldgate-takeover";
    let model = ModelServer::start().await;
    let files = Upstream::start(FILES_AUTH).await;
    let db = foldgate_testkit::TestDb::postgres().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("foldgate.toml");
    std::fs::write(
        &config,
        format!(
            "database_url = \"{db}\"\nmigrate = true\n\
             [auth]\njwt_secret = \"{secret}\"\naudience = \"{AUDIENCE}\"\n\
             [runner]\nlease_seconds = 3\npoll_interval_seconds = 1\n\
             [[upstreams]]\nname = \"files\"\nurl = \"{files}\"\ntools = [\"echo\"]\nrefresh_seconds = 1\n\
             [upstreams.headers]\nAuthorization = \"Bearer files-secret\"\n\
             [[models]]\nname = \"default\"\nprovider = \"openai\"\nbase_url = \"{base}\"\n\
             model = \"test-model\"\napi_key = \"{KEY}\"\ntimeout_seconds = 120\n",
            db = db.url,
            secret = foldgate_testkit::gateway::SECRET,
            files = files.url(),
            base = model.base_url(),
        ),
    )
    .unwrap();
    let start = || {
        let (child, first, _) = crate::spawn_serve(|c| {
            c.arg("--config").arg(&config).env("RUST_LOG", "warn");
        });
        let url = first.strip_prefix("foldgate is serving MCP at ").unwrap().to_owned();
        (child, url)
    };
    let token = foldgate_api::auth::mint_hs256(
        &foldgate_api::auth::Secret::new(foldgate_testkit::gateway::SECRET),
        &foldgate_domain::TenantId::parse("acme").unwrap(),
        &foldgate_domain::Subject::parse("alice").unwrap(),
        ["fold:read", "fold:write"],
        Duration::from_secs(600),
        None,
        Some(AUDIENCE),
    )
    .unwrap();
    model.script(
        "takeover",
        [
            Reply::tool_call(
                "c1",
                "files__echo",
                json!({"text": "echoed-before-the-crash"}),
                100,
                10,
            ),
            Reply::delayed(Duration::from_secs(120), Reply::text("never sent", 1, 1)),
            Reply::text("recovered", 300, 5),
        ],
    );

    let (mut first, url) = start();
    let agent = client(&url, &token, Era::Legacy).await;
    tools_until(&agent, |n| n.contains(&"files__echo".to_owned())).await;
    let args = json!({"session_id": "crash", "description": "the takeover task"});
    let created = post_modern(
        &url,
        &token,
        "tools/call",
        "branch_run",
        tool_params("branch_run", args, true),
    )
    .await;
    let id = created["result"]["taskId"].as_str().unwrap().to_owned();
    // The second model call is in flight.
    for _ in 0..100 {
        if model.requests().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(model.requests().len(), 2, "the second model call reached the provider");
    drop(agent);
    first.kill().unwrap();
    first.wait().unwrap();

    let (mut second, url) = start();
    let result = task_result(&url, &token, &id).await;
    assert_eq!(result["status"], "completed", "{result:?}");
    assert_eq!(result["message"], "recovered");
    assert_eq!(result["resumes"], 1);
    assert_eq!(result["steps"], 3, "model, tool, model: the lost call left no step");
    assert_eq!(
        result["model_usage"],
        json!({"input_tokens": 400, "output_tokens": 15, "calls": 2}),
        "each written step booked once; the call lost with the replica is not"
    );
    assert_eq!(result["tokens_used"], 305);
    let requests = model.requests();
    assert_eq!(requests.len(), 3, "the call in flight was made again, once");
    assert!(
        messages_text(&requests[2].body).contains("echoed-before-the-crash"),
        "the replayed context holds the tool result written before the crash"
    );
    let agent = client(&url, &token, Era::Legacy).await;
    let status = ok(&call(&agent, "branch_status", json!({"branch_id": id})).await);
    let steps = status["run"]["steps"].as_array().unwrap();
    let repeated: Vec<bool> = steps.iter().map(|s| s["repeated"].as_bool().unwrap()).collect();
    assert_eq!(repeated, [false, false, true], "the step in flight is marked repeated");
    assert_eq!(status["calls"]["count"], 1, "the tool call was made once");
    agent.cancel().await.unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(second.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    second.wait().unwrap();
    db.cleanup().await;
}
