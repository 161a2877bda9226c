//! Listing tools by search: the catalogue's 327 tools on 25 upstream
//! servers behind the gateway. A tenant whose tools are listed by search
//! sees the folding tools, `tool_search` and the upstream tools its open
//! sessions used; any tool it may call is called by name in either mode;
//! and what each listing costs in tokens.

use axum::http::Method;
use foldgate_domain::ToolListing;
use foldgate_testkit::{
    Backend, catalog,
    gateway::{Era, TestGateway, call, call_in, client, ok, text_of, tools_until, upstream_config},
    on_both_backends, token_counter,
    upstream::Upstream,
};
use serde_json::{Value, json};

use crate::admin::Admin;

/// Every server of the catalogue, on loopback.
async fn catalogue() -> (Vec<Upstream>, Vec<foldgate_api::upstream::UpstreamConfig>) {
    let mut servers = Vec::new();
    let mut configs = Vec::new();
    for u in catalog::upstreams() {
        let server = Upstream::builder().serving(u.tools).start().await;
        configs.push(upstream_config(&format!(
            "[[upstreams]]\nname = \"{}\"\nurl = \"{}\"\n",
            u.name,
            server.url()
        )));
        servers.push(server);
    }
    (servers, configs)
}

/// `tool_search`'s answer once every upstream has been listed.
async fn search_when_listed(agent: &foldgate_testkit::gateway::Client, query: &str) -> Value {
    let total = catalog::namespaced_tools().len();
    for _ in 0..100 {
        let found = ok(&call(agent, "tool_search", json!({"query": query})).await);
        if found["tools_searched"] == total {
            return Value::Object(found);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the upstreams were never all listed");
}

fn names(found: &Value) -> Vec<&str> {
    found["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect()
}

const PULL_REQUEST: &str = "github__create_pull_request";

fn pull_request_args() -> Value {
    json!({"owner": "acme", "repo": "gateway", "title": "Fold", "head": "feature", "base": "main"})
}

async fn tools_are_listed_by_search_and_called_by_name(backend: Backend) {
    let (servers, configs) = catalogue().await;
    let on_replica = configs.clone();
    let gw = TestGateway::start_with(backend, |c| {
        c.upstreams = configs;
        c.folding.tool_listing = ToolListing::Search;
    })
    .await;
    let agent = gw.agent(Era::Discover).await;

    let found = search_when_listed(&agent, "open a pull request from my feature branch").await;
    let top = names(&found);
    assert!(top.len() <= 5, "the default limit: {top:?}");
    assert!(top[..3].contains(&PULL_REQUEST), "{found}");
    let first = &found["tools"][0];
    assert!(
        first["inputSchema"]["properties"].is_object() && first["score"].as_f64().unwrap() > 0.0
    );
    let limited = ok(&call(&agent, "tool_search", json!({"query": "issues", "limit": 2})).await);
    assert_eq!(limited["tools"].as_array().unwrap().len(), 2);
    for bad in [
        json!({}),
        json!({"query": " "}),
        json!({"query": "x", "limit": 21}),
        json!({"query": "x", "colour": 1}),
    ] {
        let refused = agent
            .call_tool(
                rmcp::model::CallToolRequestParams::new("tool_search")
                    .with_arguments(bad.as_object().unwrap().clone()),
            )
            .await;
        assert!(refused.is_err(), "{bad}: {refused:?}");
    }

    // The list: folding tools and tool_search, no upstream tool yet.
    let listed = tools_until(&agent, |n| n.iter().any(|t| t == "tool_search")).await;
    assert!(!listed.iter().any(|t| t.contains("__")), "{listed:?}");

    // A tool found is called by name, in a branch, and metered there.
    let created =
        ok(&call(&agent, "branch_create", json!({"session_id": "s1", "description": "d"})).await);
    let branch = created["branch_id"].as_str().unwrap();
    let result = call_in(&agent, branch, PULL_REQUEST, pull_request_args()).await;
    assert!(text_of(&result).starts_with("create_pull_request done"), "{result:?}");
    // Now the session has used it: it is listed, and nothing else of the
    // upstreams.
    let listed = tools_until(&agent, |n| n.iter().any(|t| t == PULL_REQUEST)).await;
    assert_eq!(listed.iter().filter(|t| t.contains("__")).count(), 1, "{listed:?}");

    // Another principal of the tenant does not see alice's tools.
    let bob = client(&gw.url, &gw.write_token("acme", "bob"), Era::Discover).await;
    let theirs = tools_until(&bob, |n| n.iter().any(|t| t == "tool_search")).await;
    assert!(!theirs.iter().any(|t| t.contains("__")), "{theirs:?}");
    // But may call any tool it may see by name, outside a branch too.
    let result =
        call(&bob, "slack__slack_post_message", json!({"channel_id": "C1", "text": "hi"})).await;
    assert!(!text_of(&result).is_empty(), "{result:?}");

    // Another replica reads the used tools from the database once written.
    let audience = gw.audience.clone();
    let replica = gw
        .replica(|c| {
            c.auth.audience = Some(audience);
            c.upstreams = on_replica;
            c.folding.tool_listing = ToolListing::Search;
        })
        .await;
    let there = client(&replica.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    tools_until(&there, |n| n.iter().any(|t| t == PULL_REQUEST)).await;

    // An ended session's tools leave the list.
    ok(&call(&agent, "session_end", json!({"session_id": "s1"})).await);
    let listed = tools_until(&agent, |n| !n.iter().any(|t| t == PULL_REQUEST)).await;
    assert!(!listed.iter().any(|t| t.contains("__")), "{listed:?}");

    // A tenant set to `full` sees every tool again, within seconds.
    let deployment = Admin::deployment(&gw);
    let (status, body) = deployment
        .send_json(Method::PUT, "/tenants/acme/limits", Some(json!({"tool_listing": "full"})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["effective"]["tool_listing"], "full");
    assert_eq!(body["deployment"]["tool_listing"], "search");
    let total = catalog::namespaced_tools().len();
    let listed =
        tools_until(&agent, |n| n.iter().filter(|t| t.contains("__")).count() == total).await;
    assert!(!listed.iter().any(|t| t == "tool_search"), "not listed in full mode");
    // tool_search still answers in full mode.
    let found =
        ok(&call(&agent, "tool_search", json!({"query": "page the on-call engineer"})).await);
    assert!(!names(&Value::Object(found)).is_empty());
    let (status, body) = deployment
        .send_json(Method::PUT, "/tenants/acme/limits", Some(json!({"tool_listing": "some"})))
        .await;
    assert_eq!(status, 400, "{body}");

    for c in [agent, bob, there] {
        c.cancel().await.unwrap();
    }
    replica.stop().await;
    gw.stop().await;
    for s in servers {
        s.down().await;
    }
}

/// What `tools/list` costs an agent in each mode, in the gateway's tokens
/// (o200k), as the JSON the client receives: printed, and bounded.
async fn listing_by_search_costs_a_fraction_of_the_full_list(backend: Backend) {
    let (servers, configs) = catalogue().await;
    let gw = TestGateway::start_with(backend, |c| c.upstreams = configs).await;
    let total = catalog::namespaced_tools().len();
    let agent = gw.agent(Era::Discover).await;
    let full =
        tools_until(&agent, |n| n.iter().filter(|t| t.contains("__")).count() == total).await;
    let tokens = token_counter();
    let cost = |tools: &[rmcp::model::Tool]| tokens.count(&serde_json::to_string(tools).unwrap());
    let full_tools = agent.list_all_tools().await.unwrap();
    let full_cost = cost(&full_tools);

    let deployment = Admin::deployment(&gw);
    let (status, body) = deployment
        .send_json(Method::PUT, "/tenants/acme/limits", Some(json!({"tool_listing": "search"})))
        .await;
    assert_eq!(status, 200, "{body}");
    tools_until(&agent, |n| n.iter().any(|t| t == "tool_search")).await;
    let search_tools = agent.list_all_tools().await.unwrap();
    let search_cost = cost(&search_tools);
    let tool_search = search_tools.iter().find(|t| t.name == "tool_search").unwrap();
    let found = search_when_listed(&agent, "open a pull request from my feature branch").await;
    let answer_cost = tokens.count(&found.to_string());
    eprintln!(
        "tools/list with {total} upstream tools: full {} tools, {full_cost} tokens; search {} tools, \
         {search_cost} tokens (tool_search itself {}); one tool_search answer (5 tools) {answer_cost} tokens",
        full.len(),
        search_tools.len(),
        cost(std::slice::from_ref(tool_search)),
    );
    // The folding tools' own schemas are most of what remains.
    let folding_cost =
        cost(&full_tools.iter().filter(|t| !t.name.contains("__")).cloned().collect::<Vec<_>>());
    eprintln!("the folding tools alone: {folding_cost} tokens");
    assert!(search_cost * 5 < full_cost, "search {search_cost}, full {full_cost}");
    assert!(
        search_cost < folding_cost + 1000,
        "search {search_cost}, folding tools {folding_cost}"
    );

    agent.cancel().await.unwrap();
    gw.stop().await;
    for s in servers {
        s.down().await;
    }
}

on_both_backends!(
    tools_are_listed_by_search_and_called_by_name,
    listing_by_search_costs_a_fraction_of_the_full_list
);
