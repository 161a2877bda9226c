//! The gateway over real HTTP with rmcp's client, in both protocol eras:
//! a fold as a model would do it.

use foldgate_testkit::Backend;
use foldgate_testkit::gateway::{Era, TestGateway, call, client, ok, refusal};
use serde_json::json;

async fn full_fold(backend: Backend, era: Era) {
    let gw = TestGateway::start(backend).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), era).await;

    let tools = agent.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for expected in ["branch_create", "branch_return", "branch_status", "session_end"] {
        assert!(names.contains(&expected), "{names:?}");
    }

    // Explore in a branch, go one level deeper, and come back.
    let outer = ok(&call(
        &agent,
        "branch_create",
        json!({
            "session_id": "conv-1",
            "description": "Find where the retry policy is configured",
            "prompt": "Search the config loader and the HTTP client for retry settings.",
            "budget": 50000,
        }),
    )
    .await);
    assert_eq!(outer["depth"], 1);
    assert_eq!(outer["budget_allocated"], 32768, "capped");
    let outer_id = outer["branch_id"].as_str().unwrap().to_owned();

    let inner = ok(&call(
        &agent,
        "branch_create",
        json!({
            "session_id": "conv-1",
            "description": "Read the HTTP client module",
            "budget": 4000,
        }),
    )
    .await);
    assert_eq!(inner["depth"], 2);
    assert_eq!(inner["parent_branch_id"], outer_id.as_str());
    let inner_id = inner["branch_id"].as_str().unwrap().to_owned();

    let status = ok(&call(&agent, "branch_status", json!({"session_id": "conv-1"})).await);
    assert_eq!(status["branch_id"], inner_id.as_str(), "the innermost branch is current");
    assert_eq!(status["status"], "active");

    // Returning the outer branch ends the inner one first.
    let returned = ok(&call(
        &agent,
        "branch_return",
        json!({
            "branch_id": outer_id,
            "message": "Retries are set in config/http.rs: max 3, backoff 200ms.",
        }),
    )
    .await);
    assert_eq!(returned["success"], true);
    assert_eq!(returned["status"], "completed");
    assert_eq!(returned["children_force_returned"], json!([inner_id]));
    assert!(returned["tokens_used"].as_u64().unwrap() > 0);

    let inner_status = ok(&call(&agent, "branch_status", json!({"branch_id": inner_id})).await);
    assert_eq!(inner_status["status"], "failed");
    assert_eq!(inner_status["reason"], "parent_returning");

    // A second return is refused in a way the model can read.
    let again =
        call(&agent, "branch_return", json!({"branch_id": outer_id, "message": "again"})).await;
    assert_eq!(refusal(&again).0, "branch_not_active");

    // A new branch, then the session ends.
    let third =
        ok(&call(&agent, "branch_create", json!({"session_id": "conv-1", "description": "x"}))
            .await);
    let ended = ok(&call(&agent, "session_end", json!({"session_id": "conv-1"})).await);
    assert_eq!(ended["branches_ended"], 1);
    assert_eq!(ended["session_ended"], true);
    let third_status =
        ok(&call(&agent, "branch_status", json!({"branch_id": third["branch_id"]})).await);
    assert_eq!(third_status["reason"], "session_ended");
    let none = ok(&call(&agent, "branch_status", json!({"session_id": "conv-1"})).await);
    // What folding added to the caller's context: the outer branch's
    // message (the forced ends returned nothing).
    assert_eq!(
        none,
        json!({
            "branch_id": null,
            "status": "No active branch found",
            "session_tokens_returned": returned["tokens_returned"],
        })
        .as_object()
        .unwrap()
        .clone()
    );

    agent.cancel().await.unwrap();
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_fold_legacy_client_sqlite() {
    full_fold(Backend::Sqlite, Era::Legacy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_fold_discover_client_sqlite() {
    full_fold(Backend::Sqlite, Era::Discover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_fold_legacy_client_postgres() {
    full_fold(Backend::Postgres, Era::Legacy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_fold_discover_client_postgres() {
    full_fold(Backend::Postgres, Era::Discover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_list_is_private_and_tools_have_schemas() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    let listed = agent.list_tools(None).await.unwrap();
    assert_eq!(listed.cache_scope, Some(rmcp::model::CacheScope::Private));
    for tool in &listed.tools {
        assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
        assert!(tool.description.as_ref().is_some_and(|d| d.len() > 40), "{}", tool.name);
    }
    agent.cancel().await.unwrap();
    gw.stop().await;
}
