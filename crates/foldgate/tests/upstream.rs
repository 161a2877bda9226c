//! Federation end to end: real rmcp upstream servers on loopback, the
//! gateway in front of them, and rmcp clients (or raw HTTP) as agents.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod common;

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{Router, http::StatusCode, routing::post};
use common::{
    Client, Era, TestGateway, call, client,
    files::{LEAKED, Upstream, file_text},
    ok, refusal, tools_until,
};
use foldgate_api::upstream::UpstreamConfig;
use foldgate_engine::{Encoding, TokenCounter};
use foldgate_testkit::Backend;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Value, json};

/// A `#[tokio::test]` on each backend (`sqlite::name`, `postgres::name`)
/// for each `async fn name(backend: Backend)`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(foldgate_testkit::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(foldgate_testkit::Backend::Postgres).await;
                }
            )*
        }
    };
}

on_both_backends!(
    ten_file_fold,
    a_typed_result_is_charged_once_and_cut_into_an_error,
    overrun,
    concurrent_results_are_cut_at_the_budget_together,
    a_result_is_withheld_when_its_branch_ended_during_the_call,
);

/// An OAuth token endpoint (client credentials) counting what it issues.
async fn token_endpoint(issued: Arc<AtomicUsize>) -> String {
    let app = Router::new().route(
        "/token",
        post(move |headers: axum::http::HeaderMap, body: String| {
            let issued = Arc::clone(&issued);
            async move {
                // "vault-client:vault-secret", base64.
                let basic = headers.get("authorization").and_then(|v| v.to_str().ok());
                if basic != Some("Basic dmF1bHQtY2xpZW50OnZhdWx0LXNlY3JldA==")
                    || !body.contains("grant_type=client_credentials")
                {
                    return (StatusCode::UNAUTHORIZED, "{}".to_owned());
                }
                issued.fetch_add(1, Ordering::SeqCst);
                (StatusCode::OK, json!({"access_token": "vault-access", "token_type": "Bearer", "expires_in": 3600}).to_string())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/token")
}

fn upstream_config(toml_src: &str) -> UpstreamConfig {
    #[derive(serde::Deserialize)]
    struct Doc {
        upstreams: Vec<UpstreamConfig>,
    }
    let doc: Doc = toml::from_str(toml_src).unwrap();
    doc.upstreams.into_iter().next().unwrap()
}

/// The usual deployment: `files` for tenant acme (with an allow-list),
/// `notes` for everyone.
async fn gateway_with(backend: Backend, upstreams: Vec<UpstreamConfig>) -> TestGateway {
    TestGateway::start_with(backend, move |c| {
        c.upstreams = upstreams;
        // Creating many branches in a test is not what is measured here.
        c.folding.limits.creations_per_minute = 1000;
    })
    .await
}

fn files_config(url: &str) -> UpstreamConfig {
    upstream_config(&format!(
        r#"[[upstreams]]
name = "files"
url = "{url}"
tenants = ["acme"]
tools = ["read_file", "echo", "leak", "fail"]
timeout_seconds = 5
refresh_seconds = 1
[upstreams.headers]
Authorization = "Bearer files-secret"
"#
    ))
}

/// The files upstream with every tool (`read_held` included).
fn all_files_config(url: &str) -> UpstreamConfig {
    upstream_config(&format!(
        "[[upstreams]]\nname = \"files\"\nurl = \"{url}\"\ntimeout_seconds = 10\n\
         refresh_seconds = 1\n[upstreams.headers]\nAuthorization = \"Bearer files-secret\"\n"
    ))
}

fn notes_config(url: &str) -> UpstreamConfig {
    upstream_config(&format!(
        "[[upstreams]]\nname = \"notes\"\nurl = \"{url}\"\nrefresh_seconds = 1\n[upstreams.headers]\nAuthorization = \"Bearer notes-secret\"\n"
    ))
}

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase).unwrap()
}

/// The text a result shows, all content items joined.
fn text_of(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect()
}

fn metering(result: &CallToolResult) -> Value {
    result
        .meta
        .as_ref()
        .and_then(|m| m.0.get("foldgate/metering"))
        .cloned()
        .expect("metering report")
}

/// A tool call naming its branch in `_meta`.
async fn call_in(agent: &Client, branch: &str, tool: &str, args: Value) -> CallToolResult {
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": tool, "arguments": args, "_meta": {"foldgate/branch_id": branch},
    }))
    .unwrap();
    agent.call_tool(params).await.unwrap_or_else(|e| panic!("{tool}: {e}"))
}

// ---------------------------------------------------------------------------

/// A result with both `content` and `structuredContent` (the same text
/// twice) is charged once, as its content; cut at the budget, it becomes an
/// error result, since what is left cannot match the tool's output schema.
async fn a_typed_result_is_charged_once_and_cut_into_an_error(backend: Backend) {
    let files = Upstream::start("Bearer files-secret").await;
    let gw = gateway_with(backend, vec![all_files_config(&files.url())]).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    tools_until(&agent, |n| n.contains(&"files__read_typed".to_owned())).await;
    let tokens = counter();
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "typed", "description": "typed reads", "budget": 4000}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();

    let args = json!({"path": "src/lib.rs", "lines": 30});
    let result = call_in(&agent, &id, "files__read_typed", args.clone()).await;
    assert_ne!(result.is_error, Some(true));
    assert!(result.structured_content.is_some(), "a whole result keeps its structured content");
    let text = file_text("src/lib.rs", 30);
    let report = metering(&result);
    assert_eq!(report["tokens_out"], tokens.count(&text), "the text once, not twice");
    assert_eq!(
        report["budget_used"].as_u64().unwrap(),
        created["budget_used"].as_u64().unwrap()
            + tokens.count(&args.to_string())
            + tokens.count(&text)
    );

    let big =
        call_in(&agent, &id, "files__read_typed", json!({"path": "big.rs", "lines": 400})).await;
    assert_eq!(big.is_error, Some(true), "a cut typed result is an error result: {big:?}");
    assert!(big.structured_content.is_none());
    let shown = text_of(&big);
    assert!(shown.contains("[foldgate: result truncated at the branch's token budget"), "{shown}");
    assert_eq!(metering(&big)["truncated"], true);
    agent.cancel().await.unwrap();
    gw.stop().await;
}

#[tokio::test]
async fn tools_are_namespaced_filtered_by_tenant_scope_and_allow_list() {
    let files = Upstream::start("Bearer files-secret").await;
    let notes = Upstream::start("Bearer notes-secret").await;
    let gw =
        gateway_with(Backend::Sqlite, vec![files_config(&files.url()), notes_config(&notes.url())])
            .await;

    let acme = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    let names = tools_until(&acme, |n| {
        n.iter().any(|t| t.starts_with("files__")) && n.iter().any(|t| t.starts_with("notes__"))
    })
    .await;
    for expected in [
        "branch_create",
        "files__read_file",
        "files__echo",
        "files__leak",
        "notes__read_file",
        "notes__admin_reset",
    ] {
        assert!(names.contains(&expected.to_owned()), "{expected} missing from {names:?}");
    }
    assert!(!names.contains(&"files__admin_reset".to_owned()), "the allow-list leaves it out");
    let listed = acme.list_all_tools().await.unwrap();
    let read = listed.iter().find(|t| t.name == "files__read_file").unwrap();
    assert_eq!(read.description.as_deref(), Some("Read a file"));
    assert_eq!(read.input_schema["required"], json!(["path"]), "the upstream's schema is kept");

    // Another tenant sees only the shared upstream, and cannot call acme's.
    let beta = client(&gw.url, &gw.write_token("beta", "bob"), Era::Discover).await;
    let names = tools_until(&beta, |n| n.iter().any(|t| t.starts_with("notes__"))).await;
    assert!(!names.iter().any(|n| n.starts_with("files__")), "{names:?}");
    let err = beta
        .call_tool(
            CallToolRequestParams::new("files__echo")
                .with_arguments(json!({"text": "hi"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown tool"), "{err}");
    let echoed = call(&beta, "notes__echo", json!({"text": "shared"})).await;
    assert_eq!(text_of(&echoed), "shared");

    // A read-only token sees no upstream tools (calls are charged to branches).
    let reader = client(&gw.url, &gw.token("acme", "alice", &["fold:read"]), Era::Legacy).await;
    let names: Vec<String> =
        reader.list_all_tools().await.unwrap().iter().map(|t| t.name.to_string()).collect();
    assert!(!names.iter().any(|n| n.contains("__")), "{names:?}");

    // The upstream's credentials were used, and results come back unchanged.
    let echoed = call(&acme, "files__echo", json!({"text": "hello"})).await;
    assert_eq!(text_of(&echoed), "hello");
    assert_ne!(echoed.is_error, Some(true));
    let failed = call(&acme, "files__fail", json!({})).await;
    assert_eq!(failed.is_error, Some(true), "an upstream tool error stays one");
    assert_eq!(text_of(&failed), "disk on fire");

    gw.stop().await;
    files.down().await;
    notes.down().await;
}

#[tokio::test]
async fn bad_arguments_unknown_tools_and_missing_scopes_are_refused_over_http() {
    let files = Upstream::start("Bearer files-secret").await;
    let gw = gateway_with(Backend::Sqlite, vec![files_config(&files.url())]).await;
    let token = gw.write_token("acme", "alice");
    let agent = client(&gw.url, &token, Era::Legacy).await;
    tools_until(&agent, |n| n.contains(&"files__read_file".to_owned())).await;

    let http = reqwest::Client::new();
    let post = |token: String, params: Value| {
        let http = http.clone();
        let url = gw.url.clone();
        async move {
            let resp = http
                .post(url)
                .bearer_auth(token)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("MCP-Protocol-Version", "2025-11-25")
                .body(
                    json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params})
                        .to_string(),
                )
                .send()
                .await
                .unwrap();
            let status = resp.status();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let cases = [
        (json!({"name": "files__read_file", "arguments": {}}), "arguments", "path"),
        (json!({"name": "files__read_file", "arguments": {"path": 7}}), "arguments/path", "string"),
        (
            json!({"name": "files__read_file", "arguments": {"path": "a", "lines": 0}}),
            "arguments/lines",
            "minimum",
        ),
        (
            json!({"name": "files__read_file", "arguments": {"path": "a", "mode": "x"}}),
            "arguments",
            "mode",
        ),
        (json!({"name": "files__nope", "arguments": {}}), "name", "unknown tool"),
        (json!({"name": "files__admin_reset", "arguments": {}}), "name", "unknown tool"),
        (
            json!({"name": "files__echo", "arguments": {"text": "x"}, "_meta": {"foldgate/branch_id": "br_nope"}}),
            "_meta.foldgate/branch_id",
            "",
        ),
    ];
    for (params, field, reason) in cases {
        let (status, body) = post(token.clone(), params.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{params}: {body}");
        assert_eq!(body["error"]["code"], -32602, "{body}");
        assert_eq!(body["error"]["data"]["field"], field, "{params}: {body}");
        let why = body["error"]["data"]["reason"].as_str().unwrap();
        assert!(why.contains(reason), "{params}: {why}");
    }
    let (status, body) = post(
        gw.token("acme", "alice", &["fold:read"]),
        json!({"name": "files__echo", "arguments": {"text": "x"}}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = post(
        gw.token("beta", "bob", &["fold:read", "fold:write"]),
        json!({"name": "files__echo", "arguments": {"text": "x"}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "another tenant's upstream is unknown: {body}");

    // The branch named by the header, and a malformed one.
    let branch =
        ok(&call(&agent, "branch_create", json!({"session_id": "s", "description": "via header"}))
            .await);
    let id = branch["branch_id"].as_str().unwrap();
    let resp = http
        .post(&gw.url)
        .bearer_auth(&token)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .header("Foldgate-Branch", id)
        .body(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "files__echo", "arguments": {"text": "x"}}}).to_string())
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["result"]["_meta"]["foldgate/metering"]["branch_id"], id, "{body}");
    let resp = http
        .post(&gw.url)
        .bearer_auth(&token)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .header("Foldgate-Branch", "garbage")
        .body(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "files__echo", "arguments": {"text": "x"}}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["data"]["field"], "Foldgate-Branch");

    gw.stop().await;
    files.down().await;
}

/// The spec's scenario P1: a branch reads ten files through an upstream
/// and returns a short summary. Everything that passed through is charged.
async fn ten_file_fold(backend: Backend) {
    let files = Upstream::start("Bearer files-secret").await;
    let gw = gateway_with(backend, vec![files_config(&files.url())]).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    tools_until(&agent, |n| n.contains(&"files__read_file".to_owned())).await;
    let tokens = counter();

    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "debug-1", "description": "Find where retries are configured", "budget": 16000}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();
    let mut expected_used = created["budget_used"].as_u64().unwrap();
    let mut passed = 0;
    for i in 0..10 {
        let args = json!({"path": format!("src/module_{i}.rs")});
        // Half name the branch, half rely on the session's active branch.
        let result = if i % 2 == 0 {
            call_in(&agent, &id, "files__read_file", args.clone()).await
        } else {
            call(&agent, "files__read_file", args.clone()).await
        };
        let text = text_of(&result);
        assert_eq!(text, file_text(&format!("src/module_{i}.rs"), 12), "unchanged");
        let tokens_in = tokens.count(&args.to_string());
        let tokens_out = tokens.count(&text);
        let report = metering(&result);
        assert_eq!(report["branch_id"], id.as_str());
        assert_eq!(
            (report["tokens_in"].as_u64().unwrap(), report["tokens_out"].as_u64().unwrap()),
            (tokens_in, tokens_out)
        );
        expected_used += tokens_in + tokens_out;
        passed += tokens_out;
        assert_eq!(report["budget_used"].as_u64().unwrap(), expected_used);
    }
    let status = ok(&call(&agent, "branch_status", json!({"branch_id": id})).await);
    assert_eq!(
        status["budget_used"].as_u64().unwrap(),
        expected_used,
        "the budget consumed is what passed through"
    );
    assert_eq!(status["calls"]["count"], 10);
    assert_eq!(status["calls"]["tokens_out"].as_u64().unwrap(), passed);
    assert_eq!(status["calls"]["by_tool"][0]["tool"], "files__read_file");
    assert_eq!(status["calls"]["errors"], 0);
    assert!(passed > 3000, "ten large files: {passed} tokens");

    let summary = "Retries are configured in src/module_3.rs: handler_7 calls retry(req, 7).";
    let returned =
        ok(&call(&agent, "branch_return", json!({"branch_id": id, "message": summary})).await);
    assert_eq!(returned["tokens_returned"].as_u64().unwrap(), tokens.count(summary));
    assert_eq!(returned["tokens_used"].as_u64().unwrap(), expected_used + tokens.count(summary));
    let ratio = returned["compression_ratio"].as_f64().unwrap();
    assert!(ratio > 0.9, "compression {ratio}");

    gw.stop().await;
    files.down().await;
}

/// A result larger than what the branch has left is cut at the budget,
/// marked, and the branch is force-returned; its parent gets back the rest.
async fn overrun(backend: Backend) {
    let files = Upstream::start("Bearer files-secret").await;
    let gw = gateway_with(backend, vec![files_config(&files.url())]).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    tools_until(&agent, |n| n.contains(&"files__read_file".to_owned())).await;

    let parent = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "parent", "budget": 8000}),
    )
    .await);
    let parent_id = parent["branch_id"].as_str().unwrap().to_owned();
    let parent_prompt = parent["budget_used"].as_u64().unwrap();
    let child = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "child", "budget": 600}),
    )
    .await);
    let child_id = child["branch_id"].as_str().unwrap().to_owned();

    let result =
        call_in(&agent, &child_id, "files__read_file", json!({"path": "big.rs", "lines": 200}))
            .await;
    let text = text_of(&result);
    assert!(text.contains("[foldgate: result truncated at the branch's token budget"), "{text}");
    assert!(text.starts_with("// big.rs:0\n"), "the start of the result is kept");
    let report = metering(&result);
    assert_eq!(report["truncated"], true);
    assert_eq!(report["branch_force_returned"], true);
    assert_eq!(report["budget_used"], 600);
    assert!(counter().count(&text) <= 600);

    let child = ok(&call(&agent, "branch_status", json!({"branch_id": child_id})).await);
    assert_eq!(
        (child["status"].as_str(), child["reason"].as_str()),
        (Some("timeout"), Some("budget_exhausted"))
    );
    assert_eq!(child["budget_used"], 600);
    assert_eq!(child["calls"]["truncated"], 1);
    let parent = ok(&call(&agent, "branch_status", json!({"branch_id": parent_id})).await);
    assert_eq!(parent["status"], "active");
    assert_eq!(parent["budget_lent_to_children"], 0, "the loan is released");
    assert_eq!(
        parent["budget_used"].as_u64().unwrap(),
        parent_prompt + 600,
        "the child's spending, no more"
    );

    // The ended branch takes no more calls; the parent is current again.
    let refused = call_in(&agent, &child_id, "files__echo", json!({"text": "x"})).await;
    assert_eq!(refusal(&refused).0, "branch_not_active");
    let echoed = call(&agent, "files__echo", json!({"text": "back in the parent"})).await;
    assert_eq!(metering(&echoed)["branch_id"], parent_id.as_str());

    // Arguments that alone use up what is left are not forwarded.
    let small = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "tiny", "budget": 256}),
    )
    .await);
    let small_id = small["branch_id"].as_str().unwrap().to_owned();
    let refused =
        call_in(&agent, &small_id, "files__echo", json!({"text": "word ".repeat(400)})).await;
    assert_eq!(refusal(&refused).0, "budget_exhausted");
    let small = ok(&call(&agent, "branch_status", json!({"branch_id": small_id})).await);
    assert_eq!(
        (small["status"].as_str(), small["reason"].as_str()),
        (Some("timeout"), Some("budget_exhausted"))
    );

    gw.stop().await;
    files.down().await;
}

/// Three calls in one branch, each of whose results fits what the branch
/// had left when the call was made, but not all three: the charges, not
/// the read before each call, decide what the agent receives.
async fn concurrent_results_are_cut_at_the_budget_together(backend: Backend) {
    let files = Upstream::start("Bearer files-secret").await;
    let gw = gateway_with(backend, vec![all_files_config(&files.url())]).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    tools_until(&agent, |n| n.contains(&"files__read_held".to_owned())).await;
    let tokens = counter();
    let each = tokens.count(&file_text("a.rs", 30));
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "read three", "budget": 2 * each + 60}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();
    let prompt = created["budget_used"].as_u64().unwrap();
    let budget = created["budget_allocated"].as_u64().unwrap();

    let read = |path: &'static str| {
        call_in(&agent, &id, "files__read_held", json!({"path": path, "lines": 30}))
    };
    // The upstream answers once all three calls are in: all three were let
    // through by the read before the call, and are charged after it.
    let (a, b, c, ()) = tokio::join!(read("a.rs"), read("b.rs"), read("c.rs"), async {
        files.hold.arrivals(3).await;
        files.hold.release(3);
    });
    let mut shown = 0;
    let mut charged = 0;
    let mut cut = 0;
    for (result, path) in [(&a, "a.rs"), (&b, "b.rs"), (&c, "c.rs")] {
        let report = metering(result);
        charged += report["tokens_in"].as_u64().unwrap() + report["tokens_out"].as_u64().unwrap();
        // The upstream's text the agent received, without the marker.
        let texts: Vec<&str> =
            result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect();
        let marked = texts.last().is_some_and(|t| t.starts_with("\n[foldgate: result truncated"));
        let upstream_text = if marked { &texts[..texts.len() - 1] } else { &texts[..] };
        shown += upstream_text.iter().map(|t| tokens.count(t)).sum::<u64>();
        if report["truncated"] == true {
            cut += 1;
            assert!(marked, "a cut result says so: {result:?}");
        } else {
            assert_eq!(report["tokens_out"].as_u64().unwrap(), tokens.count(&file_text(path, 30)));
        }
    }
    assert!(cut >= 1, "three results of {each} tokens do not fit {budget}");
    assert!(shown <= budget - prompt, "the agent saw {shown} tokens of {}", budget - prompt);
    assert_eq!(charged, budget - prompt, "the calls are charged what was left");

    let status = ok(&call(&agent, "branch_status", json!({"branch_id": id})).await);
    assert_eq!(
        (status["status"].as_str(), status["reason"].as_str()),
        (Some("timeout"), Some("budget_exhausted"))
    );
    assert_eq!(status["budget_used"].as_u64().unwrap(), budget);
    assert_eq!(status["calls"]["count"], 3);
    assert_eq!(status["calls"]["truncated"], cut);
    assert_eq!(
        status["calls"]["tokens_in"].as_u64().unwrap()
            + status["calls"]["tokens_out"].as_u64().unwrap(),
        budget - prompt,
        "the trace records what the agent received"
    );

    gw.stop().await;
    files.down().await;
}

/// A branch that ends while a call in it is running (returned here; a
/// deadline or a parent's return alike) is charged nothing for it, and the
/// agent receives nothing of the result.
async fn a_result_is_withheld_when_its_branch_ended_during_the_call(backend: Backend) {
    let files = Upstream::start("Bearer files-secret").await;
    let gw = gateway_with(backend, vec![all_files_config(&files.url())]).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    tools_until(&agent, |n| n.contains(&"files__read_held".to_owned())).await;
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "slow read", "budget": 4000}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();
    let prompt = created["budget_used"].as_u64().unwrap();

    let args = json!({"path": "slow.rs", "lines": 30});
    let (result, returned) = tokio::join!(call_in(&agent, &id, "files__read_held", args), async {
        files.hold.arrivals(1).await;
        let returned = call(&agent, "branch_return", json!({"branch_id": id, "message": "done"}));
        let returned = ok(&returned.await);
        files.hold.release(1);
        returned
    });
    assert_eq!(returned["tokens_used"].as_u64().unwrap(), prompt + counter().count("done"));
    let text = text_of(&result);
    assert!(text.contains("[foldgate: result withheld"), "{text}");
    assert!(!text.contains("slow.rs"), "nothing of the result: {text}");
    let report = metering(&result);
    assert_eq!(
        (report["truncated"].as_bool(), report["branch_ended"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(report["tokens_out"], 0);

    let status = ok(&call(&agent, "branch_status", json!({"branch_id": id})).await);
    assert_eq!(status["status"], "completed");
    assert_eq!(status["budget_used"].as_u64().unwrap(), prompt + counter().count("done"));
    assert_eq!(status["calls"]["count"], 1);
    assert_eq!(status["calls"]["truncated"], 1);
    assert_eq!(status["calls"]["tokens_out"], 0, "recorded as received");

    gw.stop().await;
    files.down().await;
}

#[tokio::test]
async fn a_failing_upstream_drops_out_and_comes_back() {
    let files = Upstream::start("Bearer files-secret").await;
    let notes = Upstream::start("Bearer notes-secret").await;
    let gw =
        gateway_with(Backend::Sqlite, vec![files_config(&files.url()), notes_config(&notes.url())])
            .await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    tools_until(&agent, |n| {
        n.contains(&"files__echo".to_owned()) && n.contains(&"notes__echo".to_owned())
    })
    .await;

    let (addr, auth) = files.down().await;
    let failed = call(&agent, "files__echo", json!({"text": "anyone?"})).await;
    let (code, message) = refusal(&failed);
    assert_eq!(code, "upstream_unavailable");
    assert!(message.contains("files"), "{message}");
    let names = tools_until(&agent, |n| !n.iter().any(|t| t.starts_with("files__"))).await;
    assert!(names.contains(&"notes__echo".to_owned()), "the others stay: {names:?}");
    assert_eq!(
        text_of(&call(&agent, "notes__echo", json!({"text": "still here"})).await),
        "still here"
    );

    let files = Upstream::restart(addr, auth).await;
    tools_until(&agent, |n| n.contains(&"files__echo".to_owned())).await;
    assert_eq!(text_of(&call(&agent, "files__echo", json!({"text": "back"})).await), "back");

    gw.stop().await;
    files.down().await;
    notes.down().await;
}

#[tokio::test]
async fn results_are_scrubbed_unless_configured_otherwise_and_oauth_is_used() {
    let files = Upstream::start("Bearer files-secret").await;
    let vault = Upstream::start("Bearer vault-access").await;
    let issued = Arc::new(AtomicUsize::new(0));
    let token_url = token_endpoint(Arc::clone(&issued)).await;
    let raw = upstream_config(&format!(
        "[[upstreams]]\nname = \"raw\"\nurl = \"{}\"\nscrub_results = false\nrefresh_seconds = 1\n[upstreams.headers]\nAuthorization = \"Bearer files-secret\"\n",
        files.url()
    ));
    let vault_config = upstream_config(&format!(
        "[[upstreams]]\nname = \"vault\"\nurl = \"{}\"\nrefresh_seconds = 3600\n[upstreams.oauth]\ntoken_url = \"{token_url}\"\nclient_id = \"vault-client\"\nclient_secret = \"vault-secret\"\nscope = \"tools\"\n",
        vault.url()
    ));
    let gw =
        gateway_with(Backend::Sqlite, vec![files_config(&files.url()), raw, vault_config]).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    tools_until(&agent, |n| {
        ["files__leak", "raw__leak", "vault__echo"].iter().all(|t| n.contains(&(*t).to_owned()))
    })
    .await;

    let scrubbed = text_of(&call(&agent, "files__leak", json!({})).await);
    assert!(!scrubbed.contains(LEAKED), "{scrubbed}");
    assert!(scrubbed.contains("[REDACTED:github-pat]"), "{scrubbed}");
    let passed = text_of(&call(&agent, "raw__leak", json!({})).await);
    assert!(passed.contains(LEAKED), "scrub_results = false: {passed}");

    for _ in 0..3 {
        assert_eq!(
            text_of(&call(&agent, "vault__echo", json!({"text": "via oauth"})).await),
            "via oauth"
        );
    }
    assert_eq!(issued.load(Ordering::SeqCst), 1, "one token, cached");

    gw.stop().await;
    files.down().await;
    vault.down().await;
}

#[tokio::test]
async fn calls_outside_branches_are_counted_for_reporting() {
    let files = Upstream::start("Bearer files-secret").await;
    let gw = gateway_with(Backend::Postgres, vec![files_config(&files.url())]).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    tools_until(&agent, |n| n.contains(&"files__echo".to_owned())).await;
    let tokens = counter();

    // No session at all.
    let result = call(&agent, "files__echo", json!({"text": "no session"})).await;
    assert_eq!(metering(&result)["branch_id"], Value::Null);
    // A session whose branch has returned: counted for the session.
    let b =
        ok(&call(&agent, "branch_create", json!({"session_id": "conv", "description": "d"})).await);
    ok(&call(&agent, "branch_return", json!({"branch_id": b["branch_id"], "message": "done"}))
        .await);
    let text = "in the session, outside any branch";
    let result = call(&agent, "files__echo", json!({"text": text})).await;
    assert_eq!(metering(&result)["branch_id"], Value::Null);

    let db_url = gw.db.url.clone();
    gw.running.stop().await.unwrap();
    let store =
        foldgate_store::connect(&foldgate_store::ConnectOptions::new(db_url), false).await.unwrap();
    let tenant = foldgate_domain::TenantId::parse("acme").unwrap();
    let session = foldgate_domain::SessionId::parse("conv").unwrap();
    let usage = store.outside_usage(&tenant, Some(&session)).await.unwrap();
    assert_eq!(usage.calls, 1);
    assert_eq!(usage.tokens_in, tokens.count(&json!({"text": text}).to_string()));
    assert_eq!(usage.tokens_out, tokens.count(text));
    assert_eq!(
        store.outside_usage(&tenant, None).await.unwrap().calls,
        1,
        "the call with no session"
    );
    store.close().await;
    gw.db.cleanup().await;
    files.down().await;
}
