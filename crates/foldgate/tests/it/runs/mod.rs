//! Gateway-run branches end to end: the real gateway, a real rmcp upstream,
//! a scripted model server speaking each provider's wire format, and rmcp
//! clients (or raw HTTP) as agents.

use std::time::{Duration, Instant};

use foldgate::config::Config;
use foldgate_api::upstream::UpstreamConfig;
use foldgate_runner::{ModelConfig, Provider};
use foldgate_testkit::{
    Backend,
    gateway::{
        Client, Era, FILES_AUTH, TestGateway, call, client, files_config, ok, refusal, tools_until,
    },
    model_server::{ModelServer, Reply, ToolCall},
    token_counter as counter,
    upstream::{LEAKED, Upstream, file_text},
};
use serde_json::{Map, Value, json};

/// The operator's key for the model provider.
const KEY: &str = "sk-operator-key-0123456789";

/// The files upstream for tenant acme, as the runs use it.
fn acme_files(url: &str) -> UpstreamConfig {
    files_config(url, &["read_file", "echo", "leak"])
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
        timeout: Duration::from_secs(5),
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
    let files = Upstream::start(FILES_AUTH).await;
    let models = vec![model_config(&model, provider, stream)];
    let upstreams = vec![acme_files(&files.url())];
    let gw = TestGateway::start_with(backend, |c| {
        c.upstreams = upstreams;
        c.models = models;
        c.folding.limits.creations_per_minute = 1000;
        tweak(c);
    })
    .await;
    let agent = gw.agent(Era::Legacy).await;
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

/// A 2026-07-28 request (JSON-RPC id 1) on `http`.
fn modern_request(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    method: &str,
    name: &str,
    params: Value,
) -> reqwest::RequestBuilder {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    http.post(url)
        .bearer_auth(token)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .header("Mcp-Name", name)
        .body(body.to_string())
}

/// A 2026-07-28 request, its JSON answer.
async fn post_modern(url: &str, token: &str, method: &str, name: &str, params: Value) -> Value {
    let http = reqwest::Client::new();
    let reply = modern_request(&http, url, token, method, name, params).send().await.unwrap();
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

mod distill;
mod faults;
mod takeover;
mod tasks;
