//! Gateway-run branches end to end: the real gateway, a real rmcp upstream,
//! a scripted model server speaking each provider's wire format, and rmcp
//! clients (or raw HTTP) as agents.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod common;

use std::time::{Duration, Instant};

use common::{
    Client, Era, TestGateway, call, client,
    files::{LEAKED, Upstream, file_text},
    ok, refusal, tools_until,
};
use foldgate::config::Config;
use foldgate_api::upstream::UpstreamConfig;
use foldgate_engine::{Encoding, TokenCounter};
use foldgate_runner::{ModelConfig, Provider};
use foldgate_testkit::{
    Backend,
    model_server::{ModelServer, Reply, ToolCall},
};
use serde_json::{Map, Value, json};

/// The operator's key for the model provider.
const KEY: &str = "sk-operator-key-0123456789";

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase).unwrap()
}

fn files_config(url: &str) -> UpstreamConfig {
    #[derive(serde::Deserialize)]
    struct Doc {
        upstreams: Vec<UpstreamConfig>,
    }
    let doc: Doc = toml::from_str(&format!(
        "[[upstreams]]\nname = \"files\"\nurl = \"{url}\"\ntenants = [\"acme\"]\n\
         tools = [\"read_file\", \"echo\", \"leak\"]\ntimeout_seconds = 5\nrefresh_seconds = 1\n\
         [upstreams.headers]\nAuthorization = \"Bearer files-secret\"\n"
    ))
    .unwrap();
    doc.upstreams.into_iter().next().unwrap()
}

fn model_config(server: &ModelServer, provider: Provider, stream: bool) -> ModelConfig {
    ModelConfig {
        name: "default".into(),
        provider,
        base_url: server.base_url(),
        model: "test-model".into(),
        api_key: Some(KEY.into()),
        tenants: Some(vec!["acme".into()]),
        max_output_tokens: 1_024,
        timeout_seconds: 5,
        stream,
        embeddings: false,
    }
}

/// A gateway with the files upstream and one model, an agent of tenant
/// acme connected to it, and the model server.
struct Env {
    gw: TestGateway,
    agent: Client,
    model: ModelServer,
    _files: Upstream,
}

async fn env(
    backend: Backend,
    provider: Provider,
    stream: bool,
    tweak: impl FnOnce(&mut Config),
) -> Env {
    let model = ModelServer::start().await;
    let files = Upstream::start("Bearer files-secret").await;
    let models = vec![model_config(&model, provider, stream)];
    let upstreams = vec![files_config(&files.url())];
    let gw = TestGateway::start_with(backend, |c| {
        c.upstreams = upstreams;
        c.models = models;
        c.folding.limits.creations_per_minute = 1000;
        tweak(c);
    })
    .await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    tools_until(&agent, |n| n.contains(&"files__read_file".to_owned())).await;
    Env { gw, agent, model, _files: files }
}

/// The JSON of every message a model request carried.
fn messages_text(body: &Value) -> String {
    let mut text = body["messages"].to_string();
    text.push_str(&body["system"].to_string());
    text
}

/// The answer cap a request asked for, as each provider spells it.
fn max_tokens(body: &Value) -> u64 {
    body.get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no answer cap in {body}"))
}

/// Expands `name(backend, provider, stream)` into a test per backend,
/// provider and answer mode.
macro_rules! on_each_provider {
    ($name:ident) => {
        mod each_provider {
            use super::*;

            #[tokio::test]
            async fn openai_sqlite() {
                $name(Backend::Sqlite, Provider::Openai, false).await;
            }
            #[tokio::test]
            async fn openai_streaming_sqlite() {
                $name(Backend::Sqlite, Provider::Openai, true).await;
            }
            #[tokio::test]
            async fn anthropic_sqlite() {
                $name(Backend::Sqlite, Provider::Anthropic, false).await;
            }
            #[tokio::test]
            async fn anthropic_streaming_sqlite() {
                $name(Backend::Sqlite, Provider::Anthropic, true).await;
            }
            #[tokio::test]
            async fn openai_postgres() {
                $name(Backend::Postgres, Provider::Openai, false).await;
            }
            #[tokio::test]
            async fn anthropic_streaming_postgres() {
                $name(Backend::Postgres, Provider::Anthropic, true).await;
            }
        }
    };
}
on_each_provider!(a_run_folds_into_its_finding);

/// The model reads two files at once (parallel tool calls), then answers.
/// The caller gets the finding alone; the books are the provider's.
async fn a_run_folds_into_its_finding(backend: Backend, provider: Provider, stream: bool) {
    let Env { gw, agent, model, _files } = env(backend, provider, stream, |_| {}).await;
    let finding = format!("The flush handler is handler_3 in src/b.rs; token {LEAKED} was in it.");
    model.script(
        "flush handler",
        [
            Reply::tool_calls(
                vec![
                    ToolCall::new("c1", "files__read_file", json!({"path": "src/a.rs"})),
                    ToolCall::new("c2", "files__read_file", json!({"path": "src/b.rs"})),
                ],
                400,
                40,
            ),
            Reply::text(finding.clone(), 1_800, 20),
        ],
    );
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({
            "session_id": "s1",
            "description": "Find the flush handler",
            "prompt": "It is in src/a.rs or src/b.rs.",
            "budget": 8000,
        }),
    )
    .await);

    assert_eq!(run["status"], "completed", "{run:?}");
    assert_eq!(run["cut"], false);
    let message = run["message"].as_str().unwrap();
    assert!(message.starts_with("The flush handler is handler_3"), "{message}");
    assert!(!message.contains(LEAKED), "the finding is scrubbed: {message}");
    assert_eq!(run["tokens_used"], 1_820, "the last call's input and output");
    assert_eq!(
        run["model_usage"],
        json!({"input_tokens": 2_200, "output_tokens": 60, "calls": 2}),
        "as the provider reported it, summed"
    );
    assert_eq!(run["steps"], 4, "model, two tools, model");
    let returned = counter().count(message);
    assert_eq!(run["tokens_returned"], returned);
    let ratio = run["compression_ratio"].as_f64().unwrap();
    let expected = 1.0 - returned as f64 / 1_820.0;
    assert!((ratio - expected).abs() < 0.001, "{ratio} vs {expected}");
    assert_eq!(run["return_tier"], "phase");
    assert_eq!(run["tier_met"], true);

    let requests = model.requests();
    assert_eq!(requests.len(), 2, "one request per model call");
    for r in &requests {
        assert_eq!(r.api_key(), Some(KEY), "the operator's key");
        assert_eq!(r.stream, stream);
        let all = format!("{:?}{}", r.headers, r.body);
        assert!(!all.contains(&gw.write_token("acme", "alice")[..40]), "never the agent's token");
        assert!(max_tokens(&r.body) <= 1_024, "capped by the model's maximum");
    }
    let first = messages_text(&requests[0].body);
    assert!(first.contains("Find the flush handler") && first.contains("src/a.rs or src/b.rs"));
    assert!(!first.contains("handler_11"), "no file in the first context");
    let second = messages_text(&requests[1].body);
    for path in ["src/a.rs", "src/b.rs"] {
        let text = file_text(path, 12);
        let line = text.lines().nth(1).unwrap();
        assert!(second.contains(&line.replace('"', "\\\"")), "the tool results went to the model");
    }

    let status = ok(&call(&agent, "branch_status", json!({"branch_id": run["branch_id"]})).await);
    assert_eq!(status["kind"], "gateway");
    assert_eq!(status["status"], "completed");
    assert_eq!(status["calls"]["count"], 2, "both reads were metered to the branch");
    assert_eq!(status["run"]["state"], "done");
    let kinds: Vec<&str> = status["run"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["model", "tool", "tool", "model"]);
    assert_eq!(status["run"]["outcome"]["message"], message);

    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// Twelve tool calls in one answer are made at once, each step written as
/// its call is answered, while the other calls are charged.
async fn many_calls_in_one_answer(backend: Backend) {
    let Env { gw, agent, model, _files } = env(backend, Provider::Openai, false, |_| {}).await;
    let calls: Vec<ToolCall> = (0..12)
        .map(|i| {
            ToolCall::new(
                format!("c{i}"),
                "files__read_file",
                json!({"path": format!("src/m{i}.rs")}),
            )
        })
        .collect();
    model.script(
        "twelve",
        [Reply::tool_calls(calls, 300, 200), Reply::text("read them all", 5_000, 5)],
    );
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({"session_id": "twelve", "description": "read twelve files", "budget": 16000}),
    )
    .await);
    assert_eq!(run["status"], "completed", "{run:?}");
    assert_eq!(run["steps"], 14, "a model call, twelve tool calls, a model call");
    let status = ok(&call(&agent, "branch_status", json!({"branch_id": run["branch_id"]})).await);
    assert_eq!(status["calls"]["count"], 12);
    agent.cancel().await.unwrap();
    gw.stop().await;
}

#[tokio::test]
async fn many_calls_in_one_answer_sqlite() {
    many_calls_in_one_answer(Backend::Sqlite).await;
}

#[tokio::test]
async fn many_calls_in_one_answer_postgres() {
    many_calls_in_one_answer(Backend::Postgres).await;
}

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
        c.models[0].timeout_seconds = 1;
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
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
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
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        http.post(&gw.url)
            .bearer_auth(token)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", method)
            .header("Mcp-Name", name)
            .body(body.to_string())
            .send()
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

fn tool_params(tool: &str, arguments: Value, tasks: bool) -> Value {
    let capabilities = if tasks {
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    } else {
        json!({})
    };
    json!({
        "name": tool,
        "arguments": arguments,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        },
    })
}

/// A 2026-07-28 request, its JSON answer.
async fn post_modern(url: &str, token: &str, method: &str, name: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let reply = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .header("Mcp-Name", name)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = reply.status();
    let text = reply.text().await.unwrap();
    assert!(status.is_success(), "{method}: {status} {text}");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method}: not JSON: {text}"))
}

/// Polls `tasks/get` until the task is done.
async fn task_result(url: &str, token: &str, id: &str) -> Map<String, Value> {
    let params = |id: &str| {
        json!({"taskId": id, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        }})
    };
    for _ in 0..200 {
        let got = post_modern(url, token, "tasks/get", id, params(id)).await;
        let result = &got["result"];
        match result["status"].as_str() {
            Some("working") => tokio::time::sleep(Duration::from_millis(100)).await,
            Some("completed") => {
                return result["result"]["structuredContent"].as_object().unwrap().clone();
            }
            _ => panic!("unexpected task state: {got}"),
        }
    }
    panic!("the task never completed");
}

/// With the tasks extension, a run is a task at once, polled from any
/// replica; each run is executed by one replica.
#[tokio::test]
async fn a_run_is_a_task_polled_from_another_replica() {
    const AUDIENCE: &str = "foldgate-replicas";
    let Env { gw, agent, model, _files } = env(Backend::Postgres, Provider::Openai, false, |c| {
        c.auth.audience = Some(AUDIENCE.into());
    })
    .await;
    let files = Upstream::start("Bearer files-secret").await;
    let replica = gw
        .replica(|c| {
            c.auth.audience = Some(AUDIENCE.into());
            c.upstreams = vec![files_config(&files.url())];
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

/// The replica working on a run is killed (SIGKILL) with a model call in
/// flight: another process takes the run over once its lease lapses,
/// replays the written steps and completes it; each step is booked once.
#[tokio::test]
async fn a_run_survives_the_death_of_its_replica() {
    use std::io::{BufRead, BufReader};

    const AUDIENCE: &str = "foldgate-takeover";
    let model = ModelServer::start().await;
    let files = Upstream::start("Bearer files-secret").await;
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
            secret = common::SECRET,
            files = files.url(),
            base = model.base_url(),
        ),
    )
    .unwrap();
    let start = || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_foldgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .env_remove("DATABASE_URL")
            .env_remove("FOLDGATE_JWT_SECRET")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let url = first.strip_prefix("foldgate is serving MCP at ").unwrap().to_owned();
        (child, url)
    };
    let token = foldgate_api::auth::mint_hs256(
        &foldgate_api::auth::Secret::new(common::SECRET),
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
