//! Rate limits, Host and Origin checks, and the public endpoints.

use super::*;

fn assert_rate_limited(reply: &Reply, why: &str) -> u64 {
    let error = reply.jsonrpc_error(StatusCode::TOO_MANY_REQUESTS, -32029, why);
    let header: u64 = reply
        .header(RETRY_AFTER)
        .unwrap_or_else(|| panic!("{why}: no Retry-After"))
        .parse()
        .unwrap();
    assert!(header >= 1, "{why}");
    assert_eq!(error["data"]["retry_after"], header, "{why}: {error}");
    assert_eq!(error["data"]["code"], "rate_limited", "{why}: {error}");
    header
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_principal_rate_get_429() {
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.api.rate_limit = RateLimitConfig { per_second: 1, burst: 2, replicas: 1 };
    })
    .await;
    let alice = gw.write_token("acme", "alice");
    let bob = gw.write_token("acme", "bob");
    let status = json!({"session_id": "s"});
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(post_tool(&gw, &alice, "branch_status", status.clone()).await);
    }
    for (i, reply) in statuses.iter().take(2).enumerate() {
        reply.tool_result(&format!("request {i} within the burst"));
    }
    for (i, reply) in statuses.iter().enumerate().skip(2) {
        let secs = assert_rate_limited(reply, &format!("request {i} over the burst"));
        assert!(secs <= 2, "one token per second: {secs}");
    }
    // The limit is per principal: another subject is unaffected.
    post_tool(&gw, &bob, "branch_status", status).await.tool_result("bob");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_creation_rate_gives_429() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let token = gw.write_token("acme", "alice");
    for i in 0..5 {
        let created = post_tool(
            &gw,
            &token,
            "branch_create",
            json!({"session_id": "busy", "description": format!("attempt {i}")}),
        )
        .await;
        let branch = created.tool_result(&format!("create {i}"))["branch_id"].clone();
        post_tool(&gw, &token, "branch_return", json!({"branch_id": branch, "message": "done"}))
            .await
            .tool_result(&format!("return {i}"));
    }
    let sixth = post_tool(
        &gw,
        &token,
        "branch_create",
        json!({"session_id": "busy", "description": "one too many"}),
    )
    .await;
    let secs = assert_rate_limited(&sixth, "sixth create in a minute");
    assert!((50..=60).contains(&secs), "the window is a minute: {secs}");
    assert_eq!(sixth.body["id"], 7, "the request id is echoed");

    // Nothing was created, and other sessions are not limited.
    let status = post_tool(&gw, &token, "branch_status", json!({"session_id": "busy"})).await;
    assert_eq!(status.tool_result("after the refusal")["branch_id"], Value::Null);
    post_tool(&gw, &token, "branch_create", json!({"session_id": "calm", "description": "d"}))
        .await
        .tool_result("another session");
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Host and Origin

/// Extra request headers.
type Headers<'a> = Vec<(&'a str, &'a str)>;

/// Calls a tool on the gateway or replica at `url` with a raw request.
async fn post_tool_at(url: &str, token: &str, tool: &str, args: &Value) -> Reply {
    let http = reqwest::Client::new();
    let body = tool_call(Wire::Legacy, tool, args).to_string();
    send(mcp_request(&http, url, Some(token), Wire::Legacy).body(body)).await
}

/// A tenant's daily token quota, spent through one replica, refuses its
/// next call on another with 429 `quota_exceeded`; other tenants go on.
async fn a_token_quota_refuses_on_every_replica(backend: Backend) {
    use foldgate_testkit::gateway::{FILES_AUTH, files_config, tools_until};
    let files = foldgate_testkit::upstream::Upstream::start(FILES_AUTH).await;
    let config = files_config(&files.url(), &["read_file"]);
    let upstreams = vec![config.clone()];
    let gw = TestGateway::with_upstreams(backend, upstreams.clone()).await;
    let audience = gw.audience.clone();
    let replica = gw
        .replica(move |c| {
            c.upstreams = upstreams;
            c.auth.audience = Some(audience);
        })
        .await;
    let admin = crate::admin::Admin::deployment(&gw);
    let (status, body) = admin.put("/tenants/acme/limits", json!({"tokens_per_day": 50})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let token = gw.write_token("acme", "alice");
    let agent = client(&gw.url, &token, Era::Discover).await;
    tools_until(&agent, |n| n.iter().any(|t| t == "files__read_file")).await;

    // Within the quota: a file of 40 lines is far more than 50 tokens.
    let read = json!({"path": "src/lib.rs", "lines": 40});
    let first = post_tool_at(&gw.url, &token, "files__read_file", &read).await;
    first.tool_result("the first call, within the quota");

    // Spent: refused on the replica, once it has seen the total.
    let create = json!({"session_id": "s", "description": "more"});
    let mut refused = None;
    for _ in 0..60 {
        let reply = post_tool_at(&replica.url, &token, "branch_create", &create).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(reply);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let refused = refused.expect("the replica never refused");
    let error = refused.jsonrpc_error(StatusCode::TOO_MANY_REQUESTS, -32029, "over the quota");
    assert_eq!(error["data"]["reason"], "quota_exceeded", "{error}");
    assert_eq!(error["data"]["period"], "day", "{error}");
    let wait: u64 = refused.header(RETRY_AFTER).expect("Retry-After").parse().unwrap();
    assert!((1..=86_400).contains(&wait), "until midnight UTC: {wait}");
    let again = post_tool_at(&replica.url, &token, "files__read_file", &read).await;
    again.jsonrpc_error(StatusCode::TOO_MANY_REQUESTS, -32029, "an upstream call too");

    // Another tenant is not held to acme's quota.
    let other = gw.write_token("globex", "gina");
    post_tool_at(&replica.url, &other, "branch_create", &create).await.tool_result("globex");

    // The usage report counts the call, per day and per upstream.
    let usage = admin.read("/tenants/acme/usage?group_by=upstream").await;
    assert_eq!(usage["rows"][0]["key"], "files", "{usage}");
    assert_eq!(usage["rows"][0]["outside_calls"], 1, "{usage}");
    let spent = usage["total"]["outside_tokens_in"].as_u64().unwrap()
        + usage["total"]["outside_tokens_out"].as_u64().unwrap();
    assert!(spent >= 50, "{usage}");
    let limits = admin.read("/tenants/acme/limits").await;
    assert_eq!(limits["spent_today"].as_u64(), Some(spent), "{limits}");

    // An empty allow-list of upstreams hides the tenant's upstream tools.
    let hidden = json!({"tokens_per_day": 50, "upstreams": []});
    assert_eq!(admin.put("/tenants/acme/limits", hidden).await.0, StatusCode::OK);
    tools_until(&agent, |n| !n.iter().any(|t| t.starts_with("files__"))).await;

    agent.cancel().await.unwrap();
    replica.stop().await;
    gw.stop().await;
    files.down().await;
}

foldgate_testkit::on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_token_quota_refuses_on_every_replica
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_and_origin_are_checked() {
    let allowed_origin = "https://app.example";
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.api.allowed_origins = vec![allowed_origin.to_owned()];
    })
    .await;
    let token = gw.write_token("acme", "alice");
    let port = gw.running.addr.port();
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    let http = reqwest::Client::new();
    let evil_host = format!("evil.example:{port}");
    let localhost = format!("localhost:{port}");
    let cases: Vec<(Headers<'_>, StatusCode, &str)> = vec![
        (vec![("Host", "evil.example")], StatusCode::FORBIDDEN, "foreign Host"),
        (vec![("Host", &evil_host)], StatusCode::FORBIDDEN, "foreign Host with our port"),
        (vec![("Origin", "https://evil.example")], StatusCode::FORBIDDEN, "foreign Origin"),
        (vec![("Origin", "null")], StatusCode::FORBIDDEN, "opaque Origin"),
        (
            vec![("Origin", "https://app.example.evil.example")],
            StatusCode::FORBIDDEN,
            "Origin extending an allowed one",
        ),
        (vec![("Origin", "http://app.example")], StatusCode::FORBIDDEN, "Origin other scheme"),
        (vec![], StatusCode::OK, "no Origin"),
        (vec![("Origin", allowed_origin)], StatusCode::OK, "allowed Origin"),
        (vec![("Host", &localhost)], StatusCode::OK, "localhost"),
    ];
    for (headers, status, why) in cases {
        let mut req = mcp_request(&http, &gw.url, Some(&token), Wire::Legacy).body(body.clone());
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let reply = send(req).await;
        if status == StatusCode::OK {
            reply.tool_result(why);
        } else {
            reply.jsonrpc_error(status, -32600, why);
        }
    }
    // Refused before authentication: no token needed to be turned away.
    let reply = send(
        mcp_request(&http, &gw.url, None, Wire::Legacy)
            .header("Origin", "https://evil.example")
            .body(body),
    )
    .await;
    reply.jsonrpc_error(StatusCode::FORBIDDEN, -32600, "foreign Origin without a token");
    gw.stop().await;

    // With no allowed origins configured, a foreign Origin is refused too.
    let gw = TestGateway::start(Backend::Sqlite).await;
    let token = gw.write_token("acme", "alice");
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    for origin in ["https://evil.example", "null"] {
        let reply = send(
            mcp_request(&http, &gw.url, Some(&token), Wire::Legacy)
                .header("Origin", origin)
                .body(body.clone()),
        )
        .await;
        reply.jsonrpc_error(StatusCode::FORBIDDEN, -32600, &format!("default policy: {origin}"));
    }
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Public endpoints

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_protected_resource_metadata() {
    let gw =
        TestGateway::start_with(Backend::Sqlite, |c| c.auth.issuer = Some(ISSUER.into())).await;
    let http = reqwest::Client::new();

    let health = http.get(format!("{}/healthz", gw.base)).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let ready = send(http.get(format!("{}/readyz", gw.base))).await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:?}");
    assert_eq!(ready.body, json!({"ready": true, "database": "ok", "supervisor": "ok"}));

    let expected = json!({
        "resource": gw.url,
        "authorization_servers": [ISSUER],
        "scopes_supported": ["fold:read", "fold:write", "memory:read", "memory:write"],
        "bearer_methods_supported": ["header"],
    });
    for path in
        ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]
    {
        let reply = send(http.get(format!("{}{path}", gw.base))).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert_eq!(reply.body, expected, "{path}");
    }

    // The URL in the 401 challenge leads to the same document.
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    let challenged = post_raw(&gw, None, body).await;
    let challenge = challenged.header(WWW_AUTHENTICATE).unwrap();
    let url = challenge.split("resource_metadata=\"").nth(1).unwrap().split('"').next().unwrap();
    let reply = send(http.get(url)).await;
    assert_eq!(reply.body, expected, "{url}");
    gw.stop().await;
}
