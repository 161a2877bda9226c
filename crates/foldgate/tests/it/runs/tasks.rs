//! Runs as tasks of the tasks extension, and progress for legacy clients.

use super::*;

/// With the tasks extension, a run is a task at once, polled from any
/// replica; each run is executed by one replica.
#[tokio::test]
async fn a_run_is_a_task_polled_from_another_replica() {
    const AUDIENCE: &str = "foldgate-replicas";
    let Env { gw, agent, model, _files } = env(Backend::Postgres, Provider::Openai, false, |c| {
        c.auth.audience = Some(AUDIENCE.into());
    })
    .await;
    let files = Upstream::start(FILES_AUTH).await;
    let replica = gw
        .replica(|c| {
            c.auth.audience = Some(AUDIENCE.into());
            c.upstreams = vec![acme_files(&files.url())];
            c.models = vec![model_config(&model, Provider::Openai, false)];
        })
        .await;
    let token = gw.write_token("acme", "alice");
    for i in 0..4 {
        model.script(
            &format!("task-{i}"),
            [
                Reply::tool_call("c1", "files__echo", json!({"text": format!("t{i}")}), 100, 10),
                Reply::delayed(
                    Duration::from_millis(300),
                    Reply::text(format!("found {i}"), 120, 4),
                ),
            ],
        );
    }
    let mut ids = Vec::new();
    for i in 0..4 {
        let args = json!({"session_id": format!("t{i}"), "description": format!("task-{i}")});
        let url = if i % 2 == 0 { &gw.url } else { &replica.url };
        let created = post_modern(
            url,
            &token,
            "tools/call",
            "branch_run",
            tool_params("branch_run", args, true),
        )
        .await;
        assert_eq!(created["result"]["resultType"], "task", "{created}");
        assert_eq!(created["result"]["status"], "working");
        ids.push(created["result"]["taskId"].as_str().unwrap().to_owned());
    }
    for (i, id) in ids.iter().enumerate() {
        // Polled from the other replica than the one that started it.
        let url = if i % 2 == 0 { &replica.url } else { &gw.url };
        let result = task_result(url, &token, id).await;
        assert_eq!(result["message"], format!("found {i}"));
        assert_eq!(result["resumes"], 0);
    }
    assert_eq!(model.requests().len(), 8, "each run executed once");
    assert_eq!(model.unused_replies(), 0);
    // Another principal does not see the task.
    let eve = gw.write_token("acme", "eve");
    let denied = reqwest::Client::new()
        .post(&gw.url)
        .bearer_auth(&eve)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tasks/get")
        .header("Mcp-Name", ids[0].as_str())
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": ids[0], "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
            }}})
            .to_string(),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(denied.contains("-32602") || denied.contains("401"), "{denied}");
    replica.stop().await;
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// A legacy client that asks for progress hears of each step over SSE,
/// then gets the result.
#[tokio::test]
async fn a_legacy_client_hears_progress() {
    let Env { gw, agent, model, _files } =
        env(Backend::Sqlite, Provider::Openai, false, |_| {}).await;
    model.script(
        "progress",
        [
            Reply::tool_call("c1", "files__echo", json!({"text": "a"}), 100, 10),
            Reply::text("done", 120, 2),
        ],
    );
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "branch_run",
        "arguments": {"session_id": "p", "description": "progress"},
        "_meta": {"progressToken": "p-1"},
    }});
    let reply = reqwest::Client::new()
        .post(&gw.url)
        .bearer_auth(gw.write_token("acme", "alice"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(
        reply.headers()["content-type"].to_str().unwrap().split(';').next(),
        Some("text/event-stream")
    );
    let text = reply.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect();
    let progress: Vec<f64> = events
        .iter()
        .filter(|e| e["method"] == "notifications/progress")
        .map(|e| {
            assert_eq!(e["params"]["progressToken"], "p-1");
            e["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert!(progress.len() >= 2, "{text}");
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "progress grows: {progress:?}");
    let last = events.last().unwrap();
    assert_eq!(last["id"], 3);
    assert_eq!(last["result"]["structuredContent"]["message"], "done", "{last}");
    agent.cancel().await.unwrap();
    gw.stop().await;
}
