//! Starts the real gateway on `127.0.0.1:0` for a test, over a fresh
//! database, and connects real MCP clients to it.
#![allow(dead_code, reason = "each test binary uses part of this module")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

pub mod files;

use std::time::Duration;

use foldgate::{config::Config, serve};
use foldgate_api::auth::{self, Secret};
use foldgate_telemetry::Telemetry;
use foldgate_testkit::{Backend, TestDb};
use rmcp::{
    ClientLifecycleMode, ClientServiceExt,
    model::{CallToolRequestParams, CallToolResult, ProtocolVersion},
    service::{RoleClient, RunningService},
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Map, Value};

pub const SECRET: &str = "test-signing-secret-that-is-long-enough-0123456789";

pub struct TestGateway {
    pub running: serve::Running,
    pub db: TestDb,
    pub url: String,
    pub base: String,
    /// What tokens for this gateway name as their audience.
    pub audience: String,
}

impl TestGateway {
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, |_| {}).await
    }

    pub async fn start_with(backend: Backend, tweak: impl FnOnce(&mut Config)) -> Self {
        Self::start_with_telemetry(backend, tweak, Telemetry::local()).await
    }

    /// A gateway recording into `telemetry` (which it shuts down on stop).
    pub async fn start_with_telemetry(
        backend: Backend,
        tweak: impl FnOnce(&mut Config),
        telemetry: Telemetry,
    ) -> Self {
        let db = TestDb::new(backend).await;
        let mut config = Config { database_url: db.url.clone(), ..Config::default() };
        config.auth.jwt_secret = Some(Secret::new(SECRET));
        config.supervisor.idle_poll_interval = Duration::from_secs(3600);
        tweak(&mut config);
        let audience = config.auth.audience.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ops = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = serve::start(config, listener, ops, telemetry).await.unwrap();
        let url = running.mcp_url.clone();
        let base = url.trim_end_matches("/mcp").to_owned();
        let audience = audience.unwrap_or_else(|| url.clone());
        Self { running, db, url, base, audience }
    }

    /// A token for `tenant`/`sub` with `scopes`, valid for this gateway.
    pub fn token(&self, tenant: &str, sub: &str, scopes: &[&str]) -> String {
        auth::mint_hs256(
            &Secret::new(SECRET),
            &foldgate_domain::TenantId::parse(tenant).unwrap(),
            &foldgate_domain::Subject::parse(sub).unwrap(),
            scopes.iter().copied(),
            Duration::from_secs(600),
            None,
            Some(&self.audience),
        )
        .unwrap()
    }

    pub fn write_token(&self, tenant: &str, sub: &str) -> String {
        self.token(tenant, sub, &["fold:read", "fold:write"])
    }

    pub async fn stop(self) {
        self.running.stop().await.unwrap();
        self.db.cleanup().await;
    }

    /// Another replica on the same database.
    pub async fn replica(&self, tweak: impl FnOnce(&mut Config)) -> Replica {
        let mut config = Config { database_url: self.db.url.clone(), ..Config::default() };
        config.auth.jwt_secret = Some(Secret::new(SECRET));
        config.supervisor.idle_poll_interval = Duration::from_secs(3600);
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ops = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = serve::start(config, listener, ops, Telemetry::local()).await.unwrap();
        let url = running.mcp_url.clone();
        Replica { running, url }
    }
}

/// A second gateway process on a [`TestGateway`]'s database.
pub struct Replica {
    pub running: serve::Running,
    pub url: String,
}

impl Replica {
    pub async fn stop(self) {
        self.running.stop().await.unwrap();
    }
}

/// The protocol era a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// `initialize` handshake (2025-11-25 and earlier).
    Legacy,
    /// `server/discover`, no sessions (2026-07-28).
    Discover,
}

pub type Client = RunningService<RoleClient, ()>;

pub async fn client(url: &str, token: &str, era: Era) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token.to_owned()),
    );
    let mode = match era {
        Era::Legacy => ClientLifecycleMode::Initialize,
        Era::Discover => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    };
    ().serve_with_lifecycle(transport, mode).await.expect("connect")
}

/// Calls a tool and returns its result.
pub async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else { panic!("arguments must be an object") };
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
    client.call_tool(params).await.unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The structured content of a successful tool result.
pub fn ok(result: &CallToolResult) -> Map<String, Value> {
    assert_ne!(result.is_error, Some(true), "tool error: {result:?}");
    match result.structured_content.clone() {
        Some(Value::Object(map)) => map,
        other => panic!("no structured content: {other:?}"),
    }
}

/// The `{code, message}` of a refused tool call.
pub fn refusal(result: &CallToolResult) -> (String, String) {
    assert_eq!(result.is_error, Some(true), "expected a refusal: {result:?}");
    let content = result.structured_content.clone().expect("structured error");
    (
        content["error"]["code"].as_str().unwrap().to_owned(),
        content["error"]["message"].as_str().unwrap().to_owned(),
    )
}

/// Lists the tools until `pred` holds of their names (an upstream's tools
/// appear once its first listing is done).
pub async fn tools_until(agent: &Client, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
    for _ in 0..100 {
        let names: Vec<String> =
            agent.list_all_tools().await.unwrap().iter().map(|t| t.name.to_string()).collect();
        if pred(&names) {
            return names;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the tool list never got there");
}
