//! Runs that stop or fail: budgets, deadlines, provider faults, return
//! tiers, session ends, and what the edge refuses.

use super::*;

/// A tool result that would overrun the budget is cut at it and the run
/// stops there: `timeout`, `budget_exhausted`, never past the budget.
#[tokio::test]
async fn the_budget_stops_a_run() {
    let Env { gw, agent, model, _files } =
        env(Backend::Sqlite, Provider::Openai, false, |_| {}).await;
    model.script(
        "big file",
        [
            Reply::tool_call(
                "c1",
                "files__read_file",
                json!({"path": "big.rs", "lines": 400}),
                300,
                30,
            ),
            Reply::text("unreachable", 10, 10),
        ],
    );
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({"session_id": "s2", "description": "Read the big file", "budget": 1000}),
    )
    .await);
    assert_eq!(run["status"], "timeout", "{run:?}");
    assert_eq!(run["reason"], "budget_exhausted");
    assert_eq!(run["cut"], true);
    assert!(run["tokens_used"].as_u64().unwrap() <= 1_000, "{run:?}");
    assert!(run["message"].as_str().unwrap().contains("token budget"), "marked as cut: {run:?}");
    assert_eq!(model.requests().len(), 1, "no model call past the budget");
    assert!(max_tokens(&model.requests()[0].body) < 1_000);

    // The model's own context filling the budget stops the run as well.
    model.script(
        "long thought",
        [Reply::tool_call("c1", "files__echo", json!({"text": "x"}), 900, 80)],
    );
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({"session_id": "s2b", "description": "A long thought", "budget": 1000}),
    )
    .await);
    assert_eq!(
        (run["status"].as_str(), run["reason"].as_str()),
        (Some("timeout"), Some("budget_exhausted"))
    );
    assert!(run["tokens_used"].as_u64().unwrap() <= 1_000);
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// The deadline cancels a model call in flight; the branch ends within a
/// second of it.
#[tokio::test]
async fn the_deadline_cancels_a_run_in_flight() {
    let Env { gw, agent, model, _files } =
        env(Backend::Sqlite, Provider::Anthropic, true, |_| {}).await;
    model.script(
        "slow task",
        [
            Reply::text("a first thought ".repeat(40), 100, 120),
            Reply::delayed(Duration::from_secs(30), Reply::text("too late", 10, 10)),
        ],
    );
    // The first answer is final but too long for the micro tier: the model
    // is asked to shorten it, and that call hangs.
    let started = Instant::now();
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({
            "session_id": "s3",
            "description": "A slow task",
            "prompt": "x ".repeat(10),
            "timeout_seconds": 2,
            "return_tier": "micro",
        }),
    )
    .await);
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    assert_eq!(run["status"], "timeout", "{run:?}");
    assert_eq!(run["reason"], "deadline_exceeded");
    assert_eq!(run["cut"], true);
    let status = ok(&call(&agent, "branch_status", json!({"branch_id": run["branch_id"]})).await);
    let deadline: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(status["deadline_at"].clone()).unwrap();
    let completed: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(status["completed_at"].clone()).unwrap();
    let late = completed - deadline;
    assert!(late < chrono::Duration::seconds(1), "ended {late} after its deadline");
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// Two runs at once: no model request of one carries anything of the
/// other.
#[tokio::test]
async fn runs_at_the_same_time_see_only_their_own_context() {
    let Env { gw, agent, model, _files } =
        env(Backend::Postgres, Provider::Openai, false, |_| {}).await;
    for name in ["alpha", "beta"] {
        model.script(
            &format!("{name}-task"),
            [
                Reply::tool_call(
                    "c1",
                    "files__echo",
                    json!({"text": format!("{name}-data")}),
                    100,
                    10,
                ),
                Reply::text(format!("{name} done"), 150, 5),
            ],
        );
    }
    let bob = client(&gw.url, &gw.write_token("acme", "bob"), Era::Legacy).await;
    let (a, b) = tokio::join!(
        call(&agent, "branch_run", json!({"session_id": "sa", "description": "the alpha-task"})),
        call(&bob, "branch_run", json!({"session_id": "sb", "description": "the beta-task"})),
    );
    assert_eq!(ok(&a)["message"], "alpha done");
    assert_eq!(ok(&b)["message"], "beta done");
    let requests = model.requests();
    assert_eq!(requests.len(), 4);
    for r in requests {
        let text = messages_text(&r.body);
        let (mine, theirs) =
            if text.contains("alpha-task") { ("alpha", "beta") } else { ("beta", "alpha") };
        assert!(text.contains(&format!("{mine}-task")));
        assert!(!text.contains(theirs), "a {mine} request carries {theirs}: {text}");
    }
    agent.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    gw.stop().await;
}

/// Rate limits, server errors, timeouts and garbage are retried, then the
/// run fails with a clear reason; a refusal is not retried; the key never
/// shows.
#[tokio::test]
async fn provider_faults_are_retried_then_fail_clearly() {
    let Env { gw, agent, model, _files } = env(Backend::Sqlite, Provider::Openai, false, |c| {
        c.models[0].timeout = Duration::from_secs(1);
    })
    .await;
    let run_it = |session: &str, description: &str| {
        call(&agent, "branch_run", json!({"session_id": session, "description": description}))
    };

    model.script("rate limited", [Reply::rate_limited(1), Reply::text("fine", 50, 5)]);
    let started = Instant::now();
    let run = ok(&run_it("f1", "rate limited").await);
    assert_eq!(run["status"], "completed", "{run:?}");
    assert_eq!(run["model_usage"]["calls"], 1, "the refused attempt is not billed");
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After was honoured");

    model.script("down", [Reply::status(503), Reply::status(502), Reply::status(500)]);
    let run = ok(&run_it("f2", "down").await);
    assert_eq!(
        (run["status"].as_str(), run["reason"].as_str()),
        (Some("failed"), Some("model_failed"))
    );
    let error = run["error"].as_str().unwrap();
    assert!(error.starts_with("server_error") && error.contains("500"), "{error}");
    assert_eq!(run["model_usage"]["calls"], 0);

    model.script(
        "garbage",
        [
            Reply::Garbage("{not json".into()),
            Reply::delayed(Duration::from_secs(3), Reply::text("slow", 1, 1)),
            Reply::Garbage("[]".into()),
        ],
    );
    let run = ok(&run_it("f3", "garbage").await);
    assert_eq!(run["reason"], "model_failed", "{run:?}");
    assert!(run["error"].as_str().unwrap().starts_with("malformed_answer"), "{run:?}");

    let echo = format!("{{\"error\": {{\"message\": \"Incorrect API key provided: {KEY}\"}}}}");
    model.script(
        "bad key",
        [
            Reply::Status { status: 401, retry_after: None, body: Some(echo) },
            Reply::text("no", 1, 1),
        ],
    );
    let before = model.requests().len();
    let run = ok(&run_it("f4", "bad key").await);
    let error = run["error"].as_str().unwrap();
    assert!(error.starts_with("refused") && error.contains("401"), "{error}");
    assert!(!error.contains(KEY), "the key never shows: {error}");
    assert_eq!(model.requests().len(), before + 1, "a refusal is not retried");

    // Another tenant has no model here.
    let other = client(&gw.url, &gw.write_token("globex", "carol"), Era::Legacy).await;
    let refused = call(&other, "branch_run", json!({"session_id": "g", "description": "x"})).await;
    assert_eq!(refusal(&refused).0, "model_not_found");
    let named =
        call(&agent, "branch_run", json!({"session_id": "g", "description": "x", "model": "nope"}))
            .await;
    assert_eq!(refusal(&named).0, "model_not_found");
    other.cancel().await.unwrap();
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// A gateway-run branch is the gateway's: the agent cannot return it, nest
/// under it, or charge calls to it.
#[tokio::test]
async fn a_gateway_run_branch_is_the_gateways() {
    let Env { gw, agent, model, _files } =
        env(Backend::Sqlite, Provider::Openai, false, |_| {}).await;
    model.script("held", [Reply::delayed(Duration::from_secs(2), Reply::text("done", 10, 2))]);
    let token = gw.write_token("acme", "alice");
    let task = post_modern(
        &gw.url,
        &token,
        "tools/call",
        "branch_run",
        tool_params("branch_run", json!({"session_id": "k", "description": "held"}), true),
    )
    .await;
    let id = task["result"]["taskId"].as_str().unwrap().to_owned();
    let back = call(&agent, "branch_return", json!({"branch_id": id, "message": "mine"})).await;
    assert_eq!(refusal(&back).0, "gateway_run_branch");
    let nested = call(
        &agent,
        "branch_create",
        json!({"session_id": "k", "description": "child", "parent_branch_id": id}),
    )
    .await;
    assert_eq!(refusal(&nested).0, "gateway_run_branch");
    // The session's own stack does not include it: a new branch is depth 1.
    let own =
        ok(&call(&agent, "branch_create", json!({"session_id": "k", "description": "own"})).await);
    assert_eq!(own["depth"], 1);
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// A finding longer than its tier is asked for once more, shorter; an
/// agent-run return over its tier is flagged.
#[tokio::test]
async fn findings_are_held_to_their_return_tier() {
    let Env { gw, agent, model, _files } =
        env(Backend::Sqlite, Provider::Anthropic, false, |_| {}).await;
    let long = "The retry policy lives in three places. ".repeat(30);
    model.script(
        "tiered",
        [
            Reply::text(long.clone(), 200, 300),
            Reply::text("Retries: config/http.rs, max 3.", 520, 9),
        ],
    );
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({"session_id": "t", "description": "tiered", "return_tier": "micro"}),
    )
    .await);
    assert_eq!(run["message"], "Retries: config/http.rs, max 3.");
    assert_eq!(
        (run["return_tier"].as_str(), run["tier_met"].as_bool()),
        (Some("micro"), Some(true))
    );
    assert_eq!(run["steps"], 2);
    let requests = model.requests();
    let second = messages_text(&requests[1].body);
    assert!(second.contains("at most 50 tokens") && second.contains("three places"), "{second}");
    assert!(
        messages_text(&requests[0].body).contains("at most 50 tokens"),
        "the tier is asked for"
    );

    // A model that will not shorten it: the finding is returned, the tier
    // is not met.
    model.script(
        "stubborn",
        [Reply::text(long.clone(), 200, 300), Reply::text(long.clone(), 520, 300)],
    );
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({"session_id": "t", "description": "stubborn", "return_tier": "micro"}),
    )
    .await);
    assert_eq!(
        (run["status"].as_str(), run["tier_met"].as_bool()),
        (Some("completed"), Some(false))
    );
    assert_eq!(model.requests().len(), 4, "asked to shorten once, not again");

    // Agent-run: the tier is reported and an overlong return flagged.
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "t2", "description": "mine", "return_tier": "micro"}),
    )
    .await);
    assert_eq!(created["return_tier"], "micro");
    let returned = ok(&call(
        &agent,
        "branch_return",
        json!({"branch_id": created["branch_id"], "message": long}),
    )
    .await);
    assert_eq!(
        (returned["return_tier"].as_str(), returned["tier_exceeded"].as_bool()),
        (Some("micro"), Some(true))
    );
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// Ending the session ends its gateway-run branch too: the run stops at
/// once with what it had, marked.
#[tokio::test]
async fn a_session_end_stops_its_runs() {
    let Env { gw, agent, model, _files } =
        env(Backend::Postgres, Provider::Openai, true, |_| {}).await;
    model.script(
        "ended",
        [
            Reply::tool_call("c1", "files__echo", json!({"text": "x"}), 100, 10),
            Reply::delayed(Duration::from_secs(30), Reply::text("never", 1, 1)),
        ],
    );
    let token = gw.write_token("acme", "alice");
    let args = json!({"session_id": "e", "description": "ended"});
    let task = post_modern(
        &gw.url,
        &token,
        "tools/call",
        "branch_run",
        tool_params("branch_run", args, true),
    )
    .await;
    let id = task["result"]["taskId"].as_str().unwrap().to_owned();
    for _ in 0..100 {
        if model.requests().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let ended = ok(&call(&agent, "session_end", json!({"session_id": "e"})).await);
    assert_eq!(ended["branches_ended"], 1);
    let result = task_result(&gw.url, &token, &id).await;
    // Well before the model's reply, due in 30 s: the run did not wait for it.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(
        (result["status"].as_str(), result["reason"].as_str()),
        (Some("failed"), Some("session_ended"))
    );
    assert!(
        result["message"].as_str().unwrap().contains("because its session ended"),
        "{result:?}"
    );
    assert_eq!(result["model_usage"]["calls"], 1, "the call in flight was never booked");
    let session = ok(&call(&agent, "branch_status", json!({"session_id": "e"})).await);
    assert_eq!(
        session["session_tokens_returned"], result["tokens_returned"],
        "what the caller got of the cut run counts as returned"
    );
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// Bad run arguments are a 400 naming the field, tasks need the scopes of
/// the branches they are, and `branch_run` is offered only where a model
/// serves the tenant.
#[tokio::test]
async fn runs_are_checked_at_the_edge() {
    let Env { gw, agent, model: _model, _files } =
        env(Backend::Sqlite, Provider::Openai, false, |_| {}).await;
    let http = reqwest::Client::new();
    let post = |token: String, method: &'static str, name: &'static str, params: Value| {
        modern_request(&http, &gw.url, &token, method, name, params).send()
    };
    let writer = gw.write_token("acme", "alice");
    for (args, field) in [
        (json!({"session_id": "s", "description": "d", "tools": ["files__admin_reset"]}), "tools"),
        (json!({"session_id": "s", "description": "d", "tools": ["nope__x"]}), "tools"),
        (json!({"session_id": "s", "description": "d", "model": "m".repeat(65)}), "model"),
        (json!({"session_id": "s", "description": "d", "return_tier": "big"}), "return_tier"),
    ] {
        let reply = post(
            writer.clone(),
            "tools/call",
            "branch_run",
            tool_params("branch_run", args.clone(), false),
        )
        .await
        .unwrap();
        assert_eq!(reply.status(), 400, "{args}");
        let body: Value = reply.json().await.unwrap();
        assert_eq!(body["error"]["data"]["field"], field, "{body}");
    }
    let reader = gw.token("acme", "alice", &["fold:read"]);
    let task_id = "br_01234567-89ab-7cde-8f01-23456789abcd";
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let cancel =
        post(reader.clone(), "tasks/cancel", task_id, json!({"taskId": task_id, "_meta": meta}))
            .await
            .unwrap();
    assert_eq!(cancel.status(), 403);
    assert!(cancel.headers()["www-authenticate"].to_str().unwrap().contains("fold:write"));
    let nothing = gw.token("acme", "alice", &[]);
    let get = post(nothing, "tasks/get", task_id, json!({"taskId": task_id, "_meta": meta}))
        .await
        .unwrap();
    assert_eq!(get.status(), 403);
    let unknown = post(reader, "tasks/get", task_id, json!({"taskId": task_id, "_meta": meta}))
        .await
        .unwrap();
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32602, "an unknown task: {body}");

    // A tenant with no model is not offered branch_run.
    let names = |tools: Vec<rmcp::model::Tool>| -> Vec<String> {
        tools.iter().map(|t| t.name.to_string()).collect()
    };
    assert!(names(agent.list_all_tools().await.unwrap()).contains(&"branch_run".to_owned()));
    let other = client(&gw.url, &gw.write_token("globex", "carol"), Era::Legacy).await;
    assert!(!names(other.list_all_tools().await.unwrap()).contains(&"branch_run".to_owned()));
    other.cancel().await.unwrap();
    agent.cancel().await.unwrap();
    gw.stop().await;
}
