//! What an upstream says about a call while it runs: its progress and log
//! messages reach the agent that asked, on the call's own event stream,
//! scrubbed and under the agent's own progress token; a tool list change
//! makes the gateway list the upstream's tools again.

use std::time::Duration;

use super::*;

/// The files upstream with `report`, for acme; listed again only when it
/// says its list changed (or in an hour).
async fn reporting() -> (Upstream, TestGateway) {
    let files = Upstream::builder().auth(FILES_AUTH).reporting().start().await;
    let config = upstream_config(&format!(
        "[[upstreams]]\nname = \"files\"\nurl = \"{}\"\ntenants = [\"acme\"]\n\
         timeout_seconds = 5\nrefresh_seconds = 3600\n\
         [upstreams.headers]\nAuthorization = \"{FILES_AUTH}\"\n",
        files.url()
    ));
    let gw = TestGateway::with_upstreams(Backend::Sqlite, vec![config]).await;
    let agent = gw.agent(Era::Legacy).await;
    tools_until(&agent, |n| n.iter().any(|t| t == "files__report")).await;
    (files, gw)
}

/// Calls `files__report` over raw HTTP with `meta`; the answer's content
/// type and its JSON-RPC messages in order.
async fn report(gw: &TestGateway, args: Value, meta: Value) -> (String, Vec<Value>) {
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "files__report", "arguments": args, "_meta": meta,
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
    assert_eq!(reply.status(), 200);
    let kind = reply.headers()["content-type"].to_str().unwrap();
    let kind = kind.split(';').next().unwrap_or_default().to_owned();
    let text = reply.text().await.unwrap();
    let messages = if kind == "text/event-stream" {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else {
        vec![serde_json::from_str(&text).unwrap()]
    };
    (kind, messages)
}

#[tokio::test]
async fn an_upstreams_progress_and_log_messages_reach_the_agent_that_asked() {
    let (files, gw) = reporting().await;
    let meta = json!({"progressToken": "agent-7", "io.modelcontextprotocol/logLevel": "info"});
    let (kind, messages) = report(&gw, json!({}), meta).await;
    assert_eq!(kind, "text/event-stream");
    let (answer, notices) = messages.split_last().unwrap();
    assert_eq!(answer["id"], 5);
    assert_eq!(answer["result"]["content"][0]["text"], "reported", "{answer}");

    // The agent's own token, on its own call's progress only; the message
    // scrubbed; the warning and not the debug message, scrubbed.
    let methods: Vec<&str> = notices.iter().map(|n| n["method"].as_str().unwrap()).collect();
    assert_eq!(
        methods,
        ["notifications/progress", "notifications/progress", "notifications/message"],
        "{notices:?}"
    );
    assert_eq!(
        notices[0]["params"],
        json!({"progressToken": "agent-7", "progress": 1.0, "total": 3.0, "message": "reading"})
    );
    let second = &notices[1]["params"];
    assert_eq!((&second["progressToken"], &second["progress"]), (&json!("agent-7"), &json!(2.0)));
    let found = second["message"].as_str().unwrap();
    assert!(found.contains("REDACTED") && !found.contains(LEAKED), "{found}");
    let log = &notices[2]["params"];
    assert_eq!((&log["level"], &log["logger"]), (&json!("warning"), &json!("probe")));
    let detail = log["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("REDACTED") && !detail.contains(LEAKED), "{detail}");

    // Progress only: no log message.
    let (_, messages) = report(&gw, json!({}), json!({"progressToken": 8})).await;
    let methods: Vec<&str> = messages.iter().filter_map(|m| m["method"].as_str()).collect();
    assert_eq!(methods, ["notifications/progress", "notifications/progress"]);
    assert_eq!(messages[0]["params"]["progressToken"], 8, "a number stays a number");

    // Nothing asked: a plain JSON answer.
    let (kind, messages) = report(&gw, json!({}), json!({})).await;
    assert_eq!(kind, "application/json");
    assert_eq!(messages[0]["result"]["content"][0]["text"], "reported");

    gw.stop().await;
    files.down().await;
}

#[tokio::test]
async fn a_tool_list_change_has_the_upstream_listed_again() {
    let (files, gw) = reporting().await;
    let listed = files.listings();
    let (_, messages) = report(&gw, json!({}), json!({})).await;
    assert_eq!(messages[0]["result"]["content"][0]["text"], "reported");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(files.listings(), listed, "not listed again without a change");

    let (_, messages) = report(&gw, json!({"list_changed": true}), json!({})).await;
    assert_eq!(messages[0]["result"]["content"][0]["text"], "reported");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while files.listings() == listed {
        assert!(tokio::time::Instant::now() < deadline, "not listed again within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.stop().await;
    files.down().await;
}
