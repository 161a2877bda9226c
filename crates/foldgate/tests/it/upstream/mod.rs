//! Federation end to end: real rmcp upstream servers on loopback, the
//! gateway in front of them, and rmcp clients (or raw HTTP) as agents.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{Router, http::StatusCode, routing::post};
use foldgate_api::upstream::UpstreamConfig;
use foldgate_testkit::{
    Backend,
    gateway::{
        Era, FILES_AUTH, Federation, TestGateway, all_files_config, call, call_in, client,
        files_config, metering, ok, refusal, text_of, tools_until, upstream_config,
    },
    on_both_backends, token_counter as counter,
    upstream::{LEAKED, Upstream, file_text},
};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

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

/// The files upstream for tenant acme, `admin_reset` and `read_held` left
/// out.
fn acme_files(url: &str) -> UpstreamConfig {
    files_config(url, &["read_file", "echo", "leak", "fail"])
}

fn notes_config(url: &str) -> UpstreamConfig {
    upstream_config(&format!(
        "[[upstreams]]\nname = \"notes\"\nurl = \"{url}\"\nrefresh_seconds = 1\n[upstreams.headers]\nAuthorization = \"Bearer notes-secret\"\n"
    ))
}

/// The files upstream for acme and notes for everyone, behind a gateway.
async fn files_and_notes() -> (Upstream, Upstream, TestGateway) {
    let files = Upstream::start(FILES_AUTH).await;
    let notes = Upstream::start("Bearer notes-secret").await;
    let gw = TestGateway::with_upstreams(
        Backend::Sqlite,
        vec![acme_files(&files.url()), notes_config(&notes.url())],
    )
    .await;
    (files, notes, gw)
}

#[tokio::test]
async fn tools_are_namespaced_filtered_by_tenant_scope_and_allow_list() {
    let (files, notes, gw) = files_and_notes().await;

    let acme = gw.agent(Era::Legacy).await;
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
    let Federation { files, gw, agent } =
        Federation::start(Backend::Sqlite, Era::Legacy, acme_files, "files__read_file").await;
    let token = gw.write_token("acme", "alice");

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

#[tokio::test]
async fn a_failing_upstream_drops_out_and_comes_back() {
    let (files, notes, gw) = files_and_notes().await;
    let agent = gw.agent(Era::Legacy).await;
    tools_until(&agent, |n| {
        n.contains(&"files__echo".to_owned()) && n.contains(&"notes__echo".to_owned())
    })
    .await;

    let down = files.down().await;
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

    let files = down.restart().await;
    tools_until(&agent, |n| n.contains(&"files__echo".to_owned())).await;
    assert_eq!(text_of(&call(&agent, "files__echo", json!({"text": "back"})).await), "back");

    gw.stop().await;
    files.down().await;
    notes.down().await;
}

#[tokio::test]
async fn results_are_scrubbed_unless_configured_otherwise_and_oauth_is_used() {
    let files = Upstream::start(FILES_AUTH).await;
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
    let gw = TestGateway::with_upstreams(
        Backend::Sqlite,
        vec![acme_files(&files.url()), raw, vault_config],
    )
    .await;
    let agent = gw.agent(Era::Legacy).await;
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
    let Federation { files, gw, agent } =
        Federation::start(Backend::Postgres, Era::Legacy, acme_files, "files__echo").await;
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

mod budget;
mod identity;
mod notices;
mod search;
