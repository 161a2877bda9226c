//! The real gateway on `127.0.0.1:0` for a test, over a fresh database, and
//! real MCP clients connected to it; the usual federation behind it.

use std::{sync::LazyLock, time::Duration};

use foldgate::{config::Config, serve};
use foldgate_api::{
    auth::{self, Secret},
    upstream::UpstreamConfig,
};
use foldgate_telemetry::Telemetry;
use rmcp::{
    ClientLifecycleMode, ClientServiceExt,
    model::{CallToolRequestParams, CallToolResult, ProtocolVersion},
    service::{RoleClient, RunningService},
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::{Backend, TestDb, upstream::Upstream};

pub const SECRET: &str = "test-signing-secret-that-is-long-enough-0123456789";

/// What the files upstream asks of the gateway.
pub const FILES_AUTH: &str = "Bearer files-secret";

/// A running gateway.
#[derive(Debug)]
pub struct TestGateway {
    pub running: serve::Running,
    pub db: TestDb,
    pub url: String,
    pub base: String,
    /// What tokens for this gateway name as their audience.
    pub audience: String,
    _gate: Gate,
}

/// The test config: the database, the signing secret, no idle polling.
fn config(db_url: &str, tweak: impl FnOnce(&mut Config)) -> Config {
    let mut config = Config { database_url: db_url.into(), ..Config::default() };
    config.auth.jwt_secret = Some(Secret::new(SECRET));
    config.supervisor.idle_poll_interval = Duration::from_secs(3600);
    tweak(&mut config);
    config
}

/// The gateway with `config`, on free loopback ports.
pub async fn serve_on_loopback(config: Config, telemetry: Telemetry) -> serve::Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ops = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve::start(config, listener, ops, telemetry).await.unwrap()
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
        Self::start_gated(backend, tweak, telemetry, Gate::shared().await).await
    }

    /// A gateway that is the only one in the process while it runs (other
    /// tests' gateways wait): for a test that watches the whole process,
    /// such as its global tracing subscriber. Take `alone` before
    /// installing what the others must not see.
    pub async fn start_alone(
        backend: Backend,
        tweak: impl FnOnce(&mut Config),
        telemetry: Telemetry,
        alone: Gate,
    ) -> Self {
        Self::start_gated(backend, tweak, telemetry, alone).await
    }

    async fn start_gated(
        backend: Backend,
        tweak: impl FnOnce(&mut Config),
        telemetry: Telemetry,
        gate: Gate,
    ) -> Self {
        let db = TestDb::new(backend).await;
        let config = config(&db.url, tweak);
        let audience = config.auth.audience.clone();
        let running = serve_on_loopback(config, telemetry).await;
        let url = running.mcp_url.clone();
        let base = url.trim_end_matches("/mcp").to_owned();
        let audience = audience.unwrap_or_else(|| url.clone());
        Self { running, db, url, base, audience, _gate: gate }
    }

    /// A gateway with `upstreams`, creating branches as fast as a test
    /// likes.
    pub async fn with_upstreams(backend: Backend, upstreams: Vec<UpstreamConfig>) -> Self {
        Self::start_with(backend, move |c| {
            c.upstreams = upstreams;
            // Creating many branches in a test is not what is measured here.
            c.folding.limits.creations_per_minute = 1000;
        })
        .await
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
        self.token(tenant, sub, &["fold:read", "fold:write", "memory:read", "memory:write"])
    }

    /// An agent of tenant acme (alice) connected in `era`.
    pub async fn agent(&self, era: Era) -> Client {
        client(&self.url, &self.write_token("acme", "alice"), era).await
    }

    pub async fn stop(self) {
        self.running.stop().await.unwrap();
        self.db.cleanup().await;
    }

    /// Another replica on the same database.
    pub async fn replica(&self, tweak: impl FnOnce(&mut Config)) -> Replica {
        let running = serve_on_loopback(config(&self.db.url, tweak), Telemetry::local()).await;
        let url = running.mcp_url.clone();
        Replica { running, url }
    }
}

/// A second gateway process on a [`TestGateway`]'s database.
#[derive(Debug)]
pub struct Replica {
    pub running: serve::Running,
    pub url: String,
}

impl Replica {
    pub async fn stop(self) {
        self.running.stop().await.unwrap();
    }
}

/// The files upstream ([`FILES_AUTH`]) behind a gateway, and an agent of
/// acme that sees `tool` listed: how a federation test starts.
#[derive(Debug)]
pub struct Federation {
    pub files: Upstream,
    pub gw: TestGateway,
    pub agent: Client,
}

impl Federation {
    /// The gateway is configured with `upstream(files_url)`.
    pub async fn start(
        backend: Backend,
        era: Era,
        upstream: impl FnOnce(&str) -> UpstreamConfig,
        tool: &str,
    ) -> Self {
        let files = Upstream::start(FILES_AUTH).await;
        let gw = TestGateway::with_upstreams(backend, vec![upstream(&files.url())]).await;
        let agent = gw.agent(era).await;
        tools_until(&agent, |n| n.iter().any(|t| t == tool)).await;
        Self { files, gw, agent }
    }

    pub async fn stop(self) {
        self.gw.stop().await;
        self.files.down().await;
    }
}

/// One `[[upstreams]]` entry from TOML.
pub fn upstream_config(toml_src: &str) -> UpstreamConfig {
    #[derive(serde::Deserialize)]
    struct Doc {
        upstreams: Vec<UpstreamConfig>,
    }
    let doc: Doc = toml::from_str(toml_src).unwrap();
    doc.upstreams.into_iter().next().unwrap()
}

/// The files upstream at `url` for tenant acme, allowing `tools`.
pub fn files_config(url: &str, tools: &[&str]) -> UpstreamConfig {
    let tools: Vec<String> = tools.iter().map(|t| format!("\"{t}\"")).collect();
    upstream_config(&format!(
        "[[upstreams]]\nname = \"files\"\nurl = \"{url}\"\ntenants = [\"acme\"]\n\
         tools = [{}]\ntimeout_seconds = 5\nrefresh_seconds = 1\n\
         [upstreams.headers]\nAuthorization = \"{FILES_AUTH}\"\n",
        tools.join(", ")
    ))
}

/// The files upstream with every tool (`read_held` included), for everyone.
pub fn all_files_config(url: &str) -> UpstreamConfig {
    upstream_config(&format!(
        "[[upstreams]]\nname = \"files\"\nurl = \"{url}\"\ntimeout_seconds = 10\n\
         refresh_seconds = 1\n[upstreams.headers]\nAuthorization = \"{FILES_AUTH}\"\n"
    ))
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

/// A tool call naming its branch in `_meta`.
pub async fn call_in(agent: &Client, branch: &str, tool: &str, args: Value) -> CallToolResult {
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": tool, "arguments": args, "_meta": {"foldgate/branch_id": branch},
    }))
    .unwrap();
    agent.call_tool(params).await.unwrap_or_else(|e| panic!("{tool}: {e}"))
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

/// The text a result shows, all content items joined.
pub fn text_of(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect()
}

/// The gateway's metering report on an upstream call's result.
pub fn metering(result: &CallToolResult) -> Value {
    result
        .meta
        .as_ref()
        .and_then(|m| m.0.get("foldgate/metering"))
        .cloned()
        .expect("metering report")
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

/// How many gateways run, and whether one runs alone.
static GATES: LazyLock<watch::Sender<(usize, bool)>> =
    LazyLock::new(|| watch::Sender::new((0, false)));

/// A gateway's place in the process: one of many, or alone.
#[derive(Debug)]
pub struct Gate {
    alone: bool,
}

impl Gate {
    /// Waits while a gateway runs alone.
    async fn shared() -> Self {
        let mut watching = GATES.subscribe();
        loop {
            let _ = watching.wait_for(|(_, alone)| !alone).await;
            let entered = GATES.send_if_modified(|(count, alone)| {
                if *alone {
                    return false;
                }
                *count += 1;
                true
            });
            if entered {
                return Self { alone: false };
            }
        }
    }

    /// Waits for a moment no other gateway runs, then keeps the others
    /// out until dropped (they wait to start; none is stopped).
    pub async fn alone() -> Self {
        let mut watching = GATES.subscribe();
        loop {
            let _ = watching.wait_for(|&(count, alone)| count == 0 && !alone).await;
            let entered = GATES.send_if_modified(|(count, alone)| {
                if *count > 0 || *alone {
                    return false;
                }
                *alone = true;
                true
            });
            if entered {
                return Self { alone: true };
            }
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let alone = self.alone;
        GATES.send_modify(|(count, running_alone)| {
            if alone {
                *running_alone = false;
            } else {
                *count -= 1;
            }
        });
    }
}
