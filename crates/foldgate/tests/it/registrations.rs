//! Upstreams and models registered through the admin API, over HTTP on
//! each backend: kept in the database, live on another replica within
//! seconds and without a restart, removed from it the same way; refused
//! when a credential is not a reference to an allowed environment variable,
//! when the configuration file declares the name, or for a tenant admin;
//! every change in the audit log.

use std::time::Duration;

use foldgate_testkit::{
    Backend,
    gateway::{Era, TestGateway, call, client, files_config, tools_until},
    on_both_backends,
    upstream::Upstream,
};
use reqwest::{Method, StatusCode};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::admin::{Admin, error_code};

/// Credentials of registrations may only name variables with this prefix.
/// The test names `CARGO_PKG_NAME` (`foldgate`), which Cargo sets for the
/// tests it runs: the gateway reads it from its own environment, as it
/// would a secret mounted into a pod.
const PREFIX: &str = "CARGO_PKG_";

/// The task names on a gateway's ops port.
async fn tasks(ops: std::net::SocketAddr) -> Vec<String> {
    let board: Value =
        reqwest::get(format!("http://{ops}/background")).await.unwrap().json().await.unwrap();
    board["tasks"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().into()).collect()
}

async fn registrations_are_live_on_every_replica_without_a_restart(backend: Backend) {
    let configured = Upstream::start(foldgate_testkit::gateway::FILES_AUTH).await;
    // The team's server asks for the credential the registration names.
    let team = Upstream::builder().auth("Bearer foldgate").start().await;
    let gw = TestGateway::start_with(backend, |c| {
        c.upstreams = vec![files_config(&configured.url(), &["read_file"])];
        c.admin.credential_env_prefix = PREFIX.into();
    })
    .await;
    let audience = gw.audience.clone();
    let replica = gw
        .replica(|c| {
            c.upstreams = vec![files_config(&configured.url(), &["read_file"])];
            c.admin.credential_env_prefix = PREFIX.into();
            c.auth.audience = Some(audience);
        })
        .await;
    let deployment = Admin::deployment(&gw);
    let agent = client(&replica.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    tools_until(&agent, |names| names.iter().any(|n| n == "files__read_file")).await;

    let declared = json!({
        "name": "team-files",
        "url": team.url(),
        "tools": ["read_file"],
        "refresh_seconds": 1,
        "headers": {"Authorization": "Bearer ${CARGO_PKG_NAME}"},
    });
    // Refused, changing nothing: a tenant admin; credentials that are not
    // references to allowed variables, or that this replica lacks; a name
    // the configuration file declares; an unknown field.
    let tenant_admin = Admin::new(&gw, Some(gw.token("acme", "lead", &["tenant:admin"])));
    let (status, body) =
        tenant_admin.send_json(Method::POST, "/upstreams", Some(declared.clone())).await;
    assert_eq!((status, error_code(&body)), (StatusCode::FORBIDDEN, "forbidden"));
    let with = |field: &str, value: Value| {
        let mut d = declared.clone();
        d[field] = value;
        d
    };
    for (bad, why) in [
        (with("headers", json!({"Authorization": "Bearer files-secret"})), "environment variable"),
        (with("headers", json!({"Authorization": "Bearer ${HOME}"})), "HOME"),
        (with("headers", json!({"Authorization": "${CARGO_PKG_NOT_SET_ANYWHERE}"})), "not set"),
        (with("name", json!("files")), "configuration file"),
        (with("name", json!("bad name")), "name"),
        (with("colour", json!("blue")), "colour"),
        (with("url", json!("ftp://files")), "http"),
        // Only the configuration file may have the gateway run a program.
        (
            json!({"name": "team-shell", "command": ["/bin/sh", "-c", "id"]}),
            "only the configuration file may declare a stdio upstream",
        ),
        (with("command", json!(["/bin/sh"])), "only the configuration file"),
    ] {
        let (status, body) = deployment.send_json(Method::POST, "/upstreams", Some(bad)).await;
        assert!(
            matches!(status, StatusCode::BAD_REQUEST | StatusCode::CONFLICT),
            "{why}: {status} {body}"
        );
        assert!(body["error"]["message"].as_str().unwrap().contains(why), "{why}: {body}");
    }
    assert_eq!(deployment.read("/upstreams").await["upstreams"].as_array().unwrap().len(), 1);

    let (status, created) =
        deployment.send_json(Method::POST, "/upstreams", Some(declared.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        (created["source"].as_str(), created["name"].as_str()),
        (Some("api"), Some("team-files"))
    );
    assert_eq!(created["registered"]["by"], "ops/root");
    assert_eq!(created["headers"], json!(["Authorization"]));
    let (status, again) = deployment.send_json(Method::POST, "/upstreams", Some(declared)).await;
    assert_eq!((status, error_code(&again)), (StatusCode::CONFLICT, "already_registered"));

    // The other replica serves the new upstream's tool within seconds, and
    // calls it with the credential from its own environment.
    tools_until(&agent, |names| names.iter().any(|n| n == "team-files__read_file")).await;
    let args = json!({"path": "notes.txt"});
    let result = call(&agent, "team-files__read_file", args.clone()).await;
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert!(tasks(replica.running.ops_addr).await.iter().any(|t| t == "upstream_tools:team-files"));
    let replica_base = replica.url.trim_end_matches("/mcp");
    let on_replica = Admin::at(replica_base, Some(gw.token("ops", "root", &["foldgate:admin"])));
    let mut listed = Value::Null;
    for _ in 0..50 {
        listed = on_replica.read("/upstreams").await;
        if listed["upstreams"][1]["up"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let view = &listed["upstreams"][1];
    assert_eq!(
        (view["name"].as_str(), view["tools"].as_u64()),
        (Some("team-files"), Some(1)),
        "{listed}"
    );
    assert_eq!(listed["upstreams"][0]["source"], "config");

    // A chat model; an embeddings model is the configuration file's only.
    let model = json!({
        "name": "team-chat", "provider": "openai", "base_url": "http://127.0.0.1:9/v1",
        "model": "m", "api_key": "${CARGO_PKG_NAME}", "tenants": ["acme"],
    });
    let (status, body) = deployment
        .send_json(Method::POST, "/models", Some(json!({"embeddings": true, "name": "e", "provider": "openai", "base_url": "http://h/v1", "model": "m"})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) =
        deployment.send_json(Method::POST, "/models", Some(with_key(&model, "sk-live"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a literal key: {body}");
    let (status, body) = deployment.send_json(Method::POST, "/models", Some(model)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut models = Value::Null;
    for _ in 0..50 {
        models = deployment.read("/models").await;
        if models["models"][0]["health"].is_object() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let chat = &models["models"][0];
    assert_eq!(
        (chat["name"].as_str(), chat["source"].as_str()),
        (Some("team-chat"), Some("api")),
        "{models}"
    );
    assert_eq!(chat["health"]["attempts"], 0);
    assert!(!models.to_string().contains("foldgate\""), "never the resolved key: {models}");

    // Removed: gone from the other replica within seconds, its refresher
    // stopped; the configuration's stay and cannot be removed here.
    let (status, body) = deployment.send_json(Method::DELETE, "/upstreams/files", None).await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "declared_in_config"));
    let (status, _) = deployment.send_json(Method::DELETE, "/upstreams/team-files", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = deployment.send_json(Method::DELETE, "/upstreams/team-files", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = deployment.send_json(Method::DELETE, "/models/team-chat", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let names =
        tools_until(&agent, |names| !names.iter().any(|n| n == "team-files__read_file")).await;
    assert!(names.iter().any(|n| n == "files__read_file"), "{names:?}");
    let gone = agent
        .call_tool(
            CallToolRequestParams::new("team-files__read_file")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await;
    assert!(gone.is_err() || gone.unwrap().is_error == Some(true), "a removed upstream's tool");
    assert!(
        !tasks(replica.running.ops_addr).await.iter().any(|t| t.starts_with("upstream_tools:team"))
    );
    assert_ne!(call(&agent, "files__read_file", args).await.is_error, Some(true));

    let audit = deployment.read("/audit").await;
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions[..4],
        ["model.remove", "upstream.remove", "model.register", "upstream.register"]
    );
    assert_eq!(
        audit["entries"][3]["detail"]["headers"]["Authorization"],
        "Bearer ${CARGO_PKG_NAME}"
    );

    agent.cancel().await.unwrap();
    replica.stop().await;
    gw.stop().await;
    team.down().await;
    configured.down().await;
}

/// Durations in a registration take units, or a whole number of seconds
/// under the new name or the former one; both names at once, or a value
/// that is no duration, are refused naming the field. The declaration is
/// kept under the new names, and read back from the database.
async fn registrations_take_durations_with_units_or_former_names(backend: Backend) {
    let gw =
        TestGateway::start_with(backend, |c| c.admin.credential_env_prefix = PREFIX.into()).await;
    let deployment = Admin::deployment(&gw);
    let upstream = |name: &str, durations: Value| {
        let mut declared = json!({"name": name, "url": "http://127.0.0.1:9/mcp"});
        declared.as_object_mut().unwrap().extend(durations.as_object().unwrap().clone());
        declared
    };
    let model = |name: &str, durations: Value| {
        let mut declared = json!({
            "name": name, "provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
        });
        declared.as_object_mut().unwrap().extend(durations.as_object().unwrap().clone());
        declared
    };
    let seconds =
        r#"expected a duration such as "30s", "500ms" or "5m", or a whole number of seconds"#;
    for (path, bad, why) in [
        (
            "/upstreams",
            upstream("u", json!({"timeout": "5s", "timeout_seconds": 5})),
            "timeout and timeout_seconds are one setting".to_owned(),
        ),
        (
            "/upstreams",
            upstream("u", json!({"refresh_interval": 1, "refresh_seconds": 1})),
            "refresh_interval and refresh_seconds are one setting".to_owned(),
        ),
        (
            "/upstreams",
            upstream("u", json!({"timeout": "5 parsecs"})),
            format!("timeout: {seconds}; got \"5 parsecs\""),
        ),
        (
            "/upstreams",
            upstream("u", json!({"refresh_seconds": -1})),
            "refresh_seconds: expected a duration".to_owned(),
        ),
        (
            "/upstreams",
            upstream("u", json!({"timeout": "2h"})),
            "timeout must be from 1s to 1h, got 2h".to_owned(),
        ),
        (
            "/models",
            model("m", json!({"timeout": 60, "timeout_seconds": 60})),
            "timeout and timeout_seconds are one setting".to_owned(),
        ),
        ("/models", model("m", json!({"timeout": 1.5})), "not a whole number".to_owned()),
    ] {
        let (status, body) = deployment.send_json(Method::POST, path, Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&why), "{bad}: {message}");
    }

    for (path, declared) in [
        (
            "/upstreams",
            upstream("by-units", json!({"timeout": "1m30s", "refresh_interval": "1500ms"})),
        ),
        (
            "/upstreams",
            upstream("by-former-names", json!({"timeout_seconds": 20, "refresh_seconds": 2})),
        ),
        ("/upstreams", upstream("by-numbers", json!({"timeout": 20}))),
        ("/models", model("by-units", json!({"timeout": "2m"}))),
        ("/models", model("by-former-name", json!({"timeout_seconds": 45}))),
    ] {
        let (status, body) = deployment.send_json(Method::POST, path, Some(declared.clone())).await;
        assert_eq!(status, StatusCode::CREATED, "{declared}: {body}");
    }
    // Kept under the new names, as text with units.
    let audit = deployment.read("/audit").await;
    let detail = |name: &str, kind: &str| {
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["target"] == name && e["action"] == format!("{kind}.register"))
            .map(|e| e["detail"].clone())
            .unwrap_or_else(|| panic!("{kind} {name} in {audit}"))
    };
    let timings = |d: Value| {
        (
            d["timeout"].clone(),
            d.get("refresh_interval").cloned(),
            d.get("timeout_seconds").cloned(),
        )
    };
    assert_eq!(
        timings(detail("by-units", "upstream")),
        (json!("1m 30s"), Some(json!("1s 500ms")), None)
    );
    assert_eq!(
        timings(detail("by-former-names", "upstream")),
        (json!("20s"), Some(json!("2s")), None)
    );
    assert_eq!(timings(detail("by-numbers", "upstream")), (json!("20s"), Some(json!("30s")), None));
    assert_eq!(timings(detail("by-units", "model")), (json!("2m"), None, None));
    assert_eq!(timings(detail("by-former-name", "model")), (json!("45s"), None, None));
    // And read back from the database: every registration is listed.
    let listed = deployment.read("/upstreams").await;
    assert_eq!(listed["upstreams"].as_array().unwrap().len(), 3, "{listed}");
    let listed = deployment.read("/models").await;
    assert_eq!(listed["models"].as_array().unwrap().len(), 2, "{listed}");

    gw.stop().await;
}

fn with_key(model: &Value, key: &str) -> Value {
    let mut m = model.clone();
    m["api_key"] = json!(key);
    m
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    registrations_are_live_on_every_replica_without_a_restart,
    registrations_take_durations_with_units_or_former_names
);
