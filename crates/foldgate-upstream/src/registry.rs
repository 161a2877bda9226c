//! The upstreams a deployment fronts: their clients, their tool lists (kept
//! fresh in the background), and which principal may see which tool.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock},
    time::{Duration, Instant},
};

use foldgate_background::{Activator, Driver, Spawner, TaskHandle};
use http::{HeaderMap, HeaderName, HeaderValue};
use rmcp::model::Tool;
use serde_json::{Map, Value};
use tracing::{Instrument as _, field::Empty};

use super::{
    NAMESPACE_SEPARATOR, UpstreamConfig,
    client::{CallError, Credentials, McpClient},
    config::expand_env,
    identity::{Identity, IdentityMode, OnBehalf, Signer},
    notice::Listener,
    oauth::{Grant, TokenSource},
    stdio::{Spec, StdioClient},
};
use foldgate_domain::{Caller, TenantId};
use foldgate_engine::{TenantRules, TenantSeries};

use crate::metrics::UpstreamMetrics;

mod processes;
mod refresh;

/// The longest name a tool may have (MCP tool-name guidance).
const MAX_TOOL_NAME: usize = 128;
/// First retry after a failed tool listing; doubles up to the refresh
/// interval.
const FIRST_RETRY: Duration = Duration::from_millis(500);

/// An upstream tool as agents see it.
#[derive(Debug)]
pub struct UpstreamTool {
    /// `<upstream>__<tool>`, with the upstream's description and schemas.
    pub tool: Tool,
    /// The name the upstream knows it by.
    pub upstream_name: String,
    validator: jsonschema::Validator,
}

/// Arguments that do not match a tool's `inputSchema`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaMismatch {
    /// Where, as `arguments` plus a JSON pointer (`arguments/path`).
    pub field: String,
    pub reason: String,
}

impl UpstreamTool {
    /// Checks arguments against the tool's `inputSchema`.
    pub fn check_arguments(
        &self,
        arguments: Option<&Map<String, Value>>,
    ) -> Result<(), SchemaMismatch> {
        let empty = Value::Object(Map::new());
        let owned;
        let instance = match arguments {
            Some(map) => {
                owned = Value::Object(map.clone());
                &owned
            }
            None => &empty,
        };
        match self.validator.iter_errors(instance).next() {
            None => Ok(()),
            Some(e) => Err(SchemaMismatch {
                field: format!("arguments{}", e.instance_path().as_str()),
                reason: e.to_string(),
            }),
        }
    }
}

#[derive(Debug, Default)]
struct Listing {
    tools: Arc<HashMap<String, Arc<UpstreamTool>>>,
    /// Whether the last listing or call succeeded. A failing upstream's
    /// tools leave `tools/list` until it answers again.
    up: bool,
    last_error: Option<String>,
    /// When a failed call asked for the list to be checked again (a little
    /// after the failure, not at once).
    recheck_at: Option<tokio::time::Instant>,
}

/// One upstream.
#[derive(Debug)]
pub struct Upstream {
    pub config: UpstreamConfig,
    pub origin: Origin,
    transport: Transport,
    listing: RwLock<Listing>,
    /// Wakes the refresher early (a call failed, or the upstream said its
    /// tool list changed).
    recheck: Activator,
    /// Where requests to the upstream, and what the proxy meters of them,
    /// are recorded.
    pub(crate) metrics: UpstreamMetrics,
}

/// How an upstream is reached.
#[derive(Debug)]
enum Transport {
    /// Streamable HTTP (`url`).
    Http(Box<McpClient>),
    /// Child processes over stdio (`command`), per tenant.
    Stdio(StdioClient),
}

impl Upstream {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether it answers, how many tools it offers, and its last error.
    pub fn health(&self) -> (bool, usize, Option<String>) {
        let listing = self.read();
        (listing.up, listing.tools.len(), listing.last_error.clone())
    }

    /// Whether the upstream answered its last listing or call.
    pub fn is_up(&self) -> bool {
        self.read().up
    }

    /// Starts the counts of `who`'s calls to this upstream at zero, if it
    /// serves the tenant (its `tenants`; a tenant's own allow-list, which
    /// changes at runtime, is not consulted).
    fn start_series(&self, who: &TenantId) {
        if self.config.serves_tenant(who.as_str()) {
            self.metrics.start_tenant(who.as_str(), self.name());
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Listing> {
        self.listing.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Listing> {
        self.listing.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The processes of a stdio upstream running now; `None` for an HTTP
    /// one.
    pub fn processes(&self) -> Option<usize> {
        match &self.transport {
            Transport::Http(_) => None,
            Transport::Stdio(stdio) => Some(stdio.live()),
        }
    }

    /// The pids of a stdio upstream's processes serving `tenant` (`None`:
    /// the process that lists its tools); empty for an HTTP upstream.
    pub async fn process_ids(&self, tenant: Option<&TenantId>) -> Vec<u32> {
        match &self.transport {
            Transport::Http(_) => Vec::new(),
            Transport::Stdio(stdio) => stdio.pids(tenant.map(TenantId::as_str)).await,
        }
    }

    /// Stops a stdio upstream's idle processes; how many run afterwards.
    pub(crate) async fn reap_idle(&self) -> usize {
        match &self.transport {
            Transport::Http(_) => 0,
            Transport::Stdio(stdio) => stdio.reap_idle().await,
        }
    }

    /// Calls a tool by its upstream name for `caller` (a stdio upstream
    /// uses one of the tenant's own processes, an HTTP upstream the tenant's
    /// own session, told who calls as its `identity` says); the raw
    /// `result`.
    ///
    /// The call is a client span (`tools/call <tool>`) whose context goes to
    /// the upstream both as the W3C `traceparent`/`tracestate` headers and
    /// in the request's `_meta` (where MCP servers look for it), replacing
    /// any the agent sent: the upstream's work continues the gateway's
    /// trace. The call is timed into `mcp.client.operation.duration`.
    pub(crate) async fn call(
        &self,
        caller: &OnBehalf<'_>,
        tool: &UpstreamTool,
        arguments: Option<&Map<String, Value>>,
        meta: Option<&Map<String, Value>>,
        headers: &HeaderMap,
        listener: Option<&Listener>,
    ) -> Result<Value, CallError> {
        let tenant = &caller.principal.tenant;
        let name = &tool.upstream_name;
        let span = tracing::info_span!(
            "mcp.client",
            otel.name = %format!("tools/call {name}"),
            otel.kind = "client",
            otel.status_code = Empty,
            mcp.method.name = "tools/call",
            gen_ai.tool.name = %name,
            gen_ai.operation.name = "execute_tool",
            upstream = %self.name(),
            server.address = Empty,
            server.port = Empty,
            network.transport = Empty,
            network.protocol.name = Empty,
            error.type = Empty,
        );
        match &self.transport {
            Transport::Http(client) => {
                if let Some(host) = client.host() {
                    span.record("server.address", host);
                }
                if let Some(port) = client.port() {
                    span.record("server.port", port);
                }
                span.record("network.transport", "tcp");
                span.record("network.protocol.name", "http");
            }
            Transport::Stdio(_) => {
                span.record("network.transport", "pipe");
            }
        }
        let (headers, meta) = span.in_scope(|| with_trace_context(headers, meta));
        let started = Instant::now();
        let result = match &self.transport {
            Transport::Http(client) => {
                client
                    .call_tool(name, arguments, meta.as_ref(), &headers, listener, Some(caller))
                    .instrument(span.clone())
                    .await
            }
            Transport::Stdio(stdio) => {
                stdio
                    .call_tool(tenant.as_str(), name, arguments, meta.as_ref(), listener)
                    .instrument(span.clone())
                    .await
            }
        };
        let error_type = match &result {
            Ok(result) if result.get("isError").and_then(Value::as_bool) == Some(true) => {
                Some("tool_error".to_owned())
            }
            Ok(_) => None,
            Err(e) => Some(e.error_type()),
        };
        let stdio = matches!(self.transport, Transport::Stdio(_));
        self.metrics.record_call(
            self.name(),
            stdio,
            name,
            started.elapsed(),
            error_type.as_deref(),
        );
        if let Some(error_type) = &error_type {
            span.record("error.type", error_type.as_str());
            span.record("otel.status_code", "ERROR");
        }
        match &result {
            Err(CallError::Unavailable(why)) => {
                let mut listing = self.write();
                if listing.up {
                    tracing::warn!(upstream = %self.name(), error = %why, "upstream unavailable");
                }
                listing.up = false;
                listing.last_error = Some(why.clone());
                listing.recheck_at.get_or_insert_with(|| tokio::time::Instant::now() + FIRST_RETRY);
                drop(listing);
                self.recheck.activate();
            }
            Ok(_) | Err(CallError::Rpc { .. }) => {
                let mut listing = self.write();
                if !listing.up && !listing.tools.is_empty() {
                    listing.up = true;
                    listing.last_error = None;
                }
            }
        }
        result
    }

    /// Fetches the tool list and keeps the offered, well-formed tools. The
    /// listing (all its pages) is timed into `mcp.client.operation.duration`;
    /// it makes no span, being background work on a timer.
    async fn refresh(&self) -> Result<usize, String> {
        let started = Instant::now();
        let (listed, stdio) = match &self.transport {
            Transport::Http(client) => (client.list_tools().await, false),
            Transport::Stdio(stdio) => (stdio.list_tools().await, true),
        };
        let error_type = listed.as_ref().err().map(CallError::error_type);
        self.metrics.record_listing(self.name(), stdio, started.elapsed(), error_type.as_deref());
        let listed = listed.map_err(|e| e.to_string())?;
        let mut tools = HashMap::new();
        for raw in listed {
            match self.adopt(raw) {
                Ok(Some(tool)) => {
                    tools.insert(tool.tool.name.to_string(), Arc::new(tool));
                }
                Ok(None) => {}
                Err(why) => {
                    tracing::warn!(upstream = %self.name(), error = %why, "upstream tool skipped");
                }
            }
        }
        let count = tools.len();
        let mut listing = self.write();
        listing.tools = Arc::new(tools);
        listing.up = true;
        listing.last_error = None;
        Ok(count)
    }

    /// A listed tool, namespaced; `None` if the allow-list leaves it out.
    fn adopt(&self, raw: Value) -> Result<Option<UpstreamTool>, String> {
        let mut tool: Tool =
            serde_json::from_value(raw).map_err(|e| format!("unreadable tool: {e}"))?;
        let upstream_name = tool.name.to_string();
        if !self.config.offers(&upstream_name) {
            return Ok(None);
        }
        let name = format!("{}{NAMESPACE_SEPARATOR}{upstream_name}", self.config.name);
        let valid = name.len() <= MAX_TOOL_NAME
            && upstream_name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !valid {
            return Err(format!("tool {upstream_name:?}: not a valid tool name once namespaced"));
        }
        let schema = Value::Object((*tool.input_schema).clone());
        let validator = jsonschema::validator_for(&schema).map_err(|e| {
            format!("tool {upstream_name:?}: its inputSchema does not compile: {e}")
        })?;
        tool.name = name.into();
        Ok(Some(UpstreamTool { tool, upstream_name, validator }))
    }
}

/// The headers and `_meta` of a request, with the current span's trace
/// context added (W3C Trace Context; in `_meta` as SEP-414 proposes).
/// Without exported traces there is no context and both stay as they are.
fn with_trace_context(
    headers: &HeaderMap,
    meta: Option<&Map<String, Value>>,
) -> (HeaderMap, Option<Map<String, Value>>) {
    let mut context = HeaderMap::new();
    foldgate_telemetry::inject_current_context(&mut context);
    let mut headers = headers.clone();
    if context.is_empty() {
        return (headers, meta.cloned());
    }
    let mut meta = meta.cloned().unwrap_or_default();
    for (name, value) in &context {
        if let Ok(text) = value.to_str() {
            meta.insert(name.as_str().to_owned(), Value::String(text.to_owned()));
        }
        headers.insert(name.clone(), value.clone());
    }
    (headers, Some(meta))
}

/// What a tool name resolves to for a principal.
#[derive(Debug)]
pub enum Lookup {
    /// Not an upstream tool, or not one this principal may see.
    Unknown,
    /// Visible to the tenant, but the token lacks this scope.
    MissingScope(String),
    Found(Arc<Upstream>, Arc<UpstreamTool>),
}

/// Where an upstream was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The configuration file (`[[upstreams]]`).
    Config,
    /// The admin API (kept in the database).
    Registered,
}

/// An upstream registered through the admin API, as this replica has it.
#[derive(Debug)]
struct Registered {
    /// The declaration it was built from.
    config: UpstreamConfig,
    /// Built, with the task refreshing its tools; or why it could not be.
    built: Result<(Arc<Upstream>, Option<TaskHandle>), String>,
}

/// Every upstream: those of the configuration file, fixed at startup, and
/// those registered through the admin API, which come and go while the
/// gateway runs ([`Upstreams::apply`]).
#[derive(Debug)]
pub struct Upstreams {
    /// What requests see: the configured upstreams, then the registered
    /// ones by name. Replaced whole when a registration changes, so a
    /// request works with one consistent list.
    current: RwLock<Arc<[Arc<Upstream>]>>,
    /// From the configuration file.
    configured: Vec<Arc<Upstream>>,
    /// Registered through the admin API, by name.
    registered: Mutex<BTreeMap<String, Registered>>,
    builder: Builder,
    /// Starts the refreshers of upstreams registered while the gateway runs.
    spawner: OnceLock<Spawner>,
    /// The tenants' own allow-lists, over the upstreams' `tenants`.
    rules: OnceLock<Arc<TenantRules>>,
    /// The tenants whose series exist: an upstream registered later starts
    /// its counts for them.
    tenants: OnceLock<Arc<TenantSeries>>,
}

/// Builds upstreams' clients.
#[derive(Debug, Clone)]
struct Builder {
    http: reqwest::Client,
    metrics: UpstreamMetrics,
    /// Signs the tokens of upstreams with `identity = "token"`.
    signer: Option<Arc<Signer>>,
}

impl Builder {
    /// An upstream's client, resolving `${VAR}`s with `env`; nothing is
    /// contacted.
    fn build(
        &self,
        config: &UpstreamConfig,
        origin: Origin,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Upstream, String> {
        config.validate().map_err(|e| e.to_string())?;
        // Also what an upstream's `notifications/tools/list_changed` sets off.
        let recheck = Activator::new();
        let transport = match &config.command {
            Some(_) if origin == Origin::Registered => {
                return Err(
                    "command: only the configuration file may declare a stdio upstream".into()
                );
            }
            Some(command) => {
                Transport::Stdio(StdioClient::new(stdio_spec(config, command, env, &recheck)?))
            }
            None => Transport::Http(Box::new(self.http_client(config, env, recheck.clone())?)),
        };
        Ok(Upstream {
            config: config.clone(),
            origin,
            transport,
            listing: RwLock::new(Listing::default()),
            recheck,
            metrics: self.metrics.clone(),
        })
    }

    fn http_client(
        &self,
        config: &UpstreamConfig,
        env: &dyn Fn(&str) -> Option<String>,
        list_changed: Activator,
    ) -> Result<McpClient, String> {
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let value = expand_env(value, env).map_err(|e| format!("headers.{name}: {e}"))?;
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| format!("headers.{name}: not a valid header value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let oauth = match &config.oauth {
            None => None,
            Some(o) => Some(TokenSource::new(Grant {
                token_url: o.token_url.clone(),
                client_id: expand_env(&o.client_id, env)
                    .map_err(|e| format!("oauth.client_id: {e}"))?,
                client_secret: expand_env(&o.client_secret, env)
                    .map_err(|e| format!("oauth.client_secret: {e}"))?,
                scope: o.scope.clone(),
                resource: o.resource.clone(),
            })),
        };
        let url = config.url.as_deref().ok_or("url is not set")?;
        let url = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
        if config.identity == IdentityMode::Token && self.signer.is_none() {
            return Err("identity = \"token\": the gateway has no signing key".into());
        }
        let identity = Identity {
            mode: config.identity,
            audience: config.audience().to_owned(),
            signer: self.signer.clone(),
        };
        Ok(McpClient::new(
            self.http.clone(),
            url,
            Credentials { headers, oauth, identity },
            config.timeout,
            config.max_response_bytes,
            list_changed,
        ))
    }
}

/// How to run a stdio upstream's server: its `env` resolved with `env`.
fn stdio_spec(
    config: &UpstreamConfig,
    command: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    list_changed: &Activator,
) -> Result<Spec, String> {
    let (program, args) = command.split_first().ok_or("command is empty")?;
    let mut vars = Vec::with_capacity(config.env.len());
    for (name, value) in &config.env {
        vars.push((name.clone(), expand_env(value, env).map_err(|e| format!("env.{name}: {e}"))?));
    }
    Ok(Spec {
        upstream: config.name.clone(),
        program: program.clone(),
        args: args.to_vec(),
        env: vars,
        cwd: config.cwd.as_ref().map(std::path::PathBuf::from),
        max_memory: config.max_memory,
        max_cpu: config.max_cpu.map(|c| c.as_secs()),
        timeout: config.timeout,
        max_bytes: config.max_response_bytes,
        idle_timeout: config.idle_timeout,
        max_processes: config.max_processes,
        list_changed: list_changed.clone(),
    })
}

impl Default for Upstreams {
    fn default() -> Self {
        Self {
            current: RwLock::new(Arc::from([])),
            configured: Vec::new(),
            registered: Mutex::default(),
            builder: Builder {
                http: reqwest::Client::new(),
                metrics: UpstreamMetrics::noop(),
                signer: None,
            },
            spawner: OnceLock::new(),
            rules: OnceLock::new(),
            tenants: OnceLock::new(),
        }
    }
}

impl Upstreams {
    /// No upstreams.
    pub fn none() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Builds the clients of the configuration's upstreams, resolving
    /// `${VAR}`s with `env`, recording into `metrics`, minting the tokens of
    /// upstreams with `identity = "token"` with `signer`. Nothing is
    /// contacted until the driver starts ([`Upstreams::register`]).
    pub fn new(
        configs: &[UpstreamConfig],
        env: impl Fn(&str) -> Option<String>,
        metrics: &UpstreamMetrics,
        signer: Option<Arc<Signer>>,
    ) -> Result<Arc<Self>, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            // A redirect would carry the request's headers (the caller's
            // identity among them) to wherever it points, over any scheme.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the upstream HTTP client: {e}"))?;
        let builder = Builder { http, metrics: metrics.clone(), signer };
        let mut configured: Vec<Arc<Upstream>> = Vec::with_capacity(configs.len());
        for config in configs {
            let at = |e: String| format!("upstream {:?}: {e}", config.name);
            if configured.iter().any(|u| u.config.name == config.name) {
                return Err(at("the name is used twice".into()));
            }
            let upstream = builder.build(config, Origin::Config, &env).map_err(at)?;
            configured.push(Arc::new(upstream));
        }
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::from(configured.clone())),
            configured,
            builder,
            ..Self::default()
        }))
    }

    /// Registers, for each configured upstream, the task that keeps its
    /// tool list fresh ([`refresh`]), and keeps the driver's spawner for
    /// those registered later.
    pub fn register(&self, driver: &mut Driver) {
        for upstream in &self.configured {
            refresh::register(driver, upstream);
            if matches!(upstream.transport, Transport::Stdio(_)) {
                processes::register(driver, upstream);
            }
        }
        // A second call is a no-op: the first spawner stays.
        let _ = self.spawner.set(driver.spawner());
    }

    /// Makes the registered upstreams those of `wanted` (the admin API's
    /// registrations), resolving `${VAR}`s with `env`: builds those that
    /// are new or changed and starts their refreshers, drops those no longer
    /// wanted, keeps the rest as they are. A registration that cannot be
    /// built here (a variable this replica lacks, a name the configuration
    /// uses) is kept with its error, for the admin API to show. Returns the
    /// errors of those built now.
    pub fn apply(
        &self,
        wanted: &[UpstreamConfig],
        env: impl Fn(&str) -> Option<String>,
    ) -> Vec<(String, String)> {
        let mut registered = lock(&self.registered);
        let before = registered.len();
        registered.retain(|name, _| wanted.iter().any(|w| &w.name == name));
        let mut changed = registered.len() != before;
        let mut errors = Vec::new();
        let mut added = Vec::new();
        for config in wanted {
            if registered.get(&config.name).is_some_and(|r| &r.config == config) {
                continue;
            }
            let built = if self.configured.iter().any(|u| u.config.name == config.name) {
                Err("the configuration file declares an upstream of this name".to_owned())
            } else {
                self.builder.build(config, Origin::Registered, &env).map(|upstream| {
                    let upstream = Arc::new(upstream);
                    let refresher = self.spawner.get().map(|s| refresh::spawn(s, &upstream));
                    (upstream, refresher)
                })
            };
            match &built {
                Ok((upstream, _)) => added.push(Arc::clone(upstream)),
                Err(why) => errors.push((config.name.clone(), why.clone())),
            }
            registered.insert(config.name.clone(), Registered { config: config.clone(), built });
            changed = true;
        }
        if changed {
            let now: Vec<Arc<Upstream>> = self
                .configured
                .iter()
                .chain(registered.values().filter_map(|r| r.built.as_ref().ok().map(|(u, _)| u)))
                .cloned()
                .collect();
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::from(now);
            // After the list is replaced: a tenant seen from here on finds
            // the new upstreams in it.
            if let Some(tenants) = self.tenants.get() {
                let known = tenants.tenants();
                for upstream in &added {
                    for who in &known {
                        upstream.start_series(who);
                    }
                }
            }
        }
        errors
    }

    /// Whether a declaration could be built here (its `${VAR}`s set, its
    /// headers valid), without keeping it.
    pub fn check(
        &self,
        config: &UpstreamConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        self.builder.build(config, Origin::Registered, &env).map(drop)
    }

    /// Registered upstreams this replica could not build, with why.
    pub fn unbuilt(&self) -> Vec<(String, String)> {
        lock(&self.registered)
            .iter()
            .filter_map(|(name, r)| r.built.as_ref().err().map(|e| (name.clone(), e.clone())))
            .collect()
    }

    /// The upstreams now, configured ones first.
    pub fn snapshot(&self) -> Arc<[Arc<Upstream>]> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    /// The tools a principal sees: of upstreams that serve its tenant, that
    /// its token has the scope for, and that are answering.
    pub fn tools_for(&self, who: &dyn Caller) -> Vec<Tool> {
        let mut tools = Vec::new();
        let all = self.snapshot();
        for upstream in self.visible(&all, who) {
            if !who.has_scope(upstream.config.required_scope()) {
                continue;
            }
            let listing = upstream.read();
            if !listing.up {
                continue;
            }
            let mut names: Vec<&String> = listing.tools.keys().collect();
            names.sort();
            tools.extend(
                names.into_iter().filter_map(|n| listing.tools.get(n)).map(|t| t.tool.clone()),
            );
        }
        tools
    }

    /// The upstream tools a principal may call (as [`Upstreams::tools_for`])
    /// that best match `query`, best first, with their scores
    /// ([`crate::search`]); and how many tools were searched.
    pub fn search(&self, who: &dyn Caller, query: &str, limit: usize) -> (Vec<(Tool, f32)>, usize) {
        let tools = self.tools_for(who);
        let found = crate::search::rank(&tools, query, limit)
            .into_iter()
            .filter_map(|(i, score)| tools.get(i).map(|t| (t.clone(), score)))
            .collect();
        (found, tools.len())
    }

    /// Of these namespaced names, the tools a principal may call now (of
    /// upstreams that answer), in the order given; the others are left out.
    pub fn tools_named(&self, who: &dyn Caller, names: &[String]) -> Vec<Tool> {
        names
            .iter()
            .filter_map(|name| match self.lookup(who, name) {
                Lookup::Found(upstream, tool) if upstream.is_up() => Some(tool.tool.clone()),
                _ => None,
            })
            .collect()
    }

    /// Resolves a namespaced tool name for a principal. A tool of an
    /// upstream that is down is still found (and tried) if it was listed.
    pub fn lookup(&self, who: &dyn Caller, name: &str) -> Lookup {
        let Some((prefix, _)) = name.split_once(NAMESPACE_SEPARATOR) else {
            return Lookup::Unknown;
        };
        let all = self.snapshot();
        let Some(upstream) = self.visible(&all, who).find(|u| u.config.name == prefix) else {
            return Lookup::Unknown;
        };
        let tool = upstream.read().tools.get(name).cloned();
        let Some(tool) = tool else {
            return Lookup::Unknown;
        };
        let scope = upstream.config.required_scope();
        if !who.has_scope(scope) {
            return Lookup::MissingScope(scope.to_owned());
        }
        Lookup::Found(Arc::clone(upstream), tool)
    }

    fn visible<'a>(
        &self,
        all: &'a [Arc<Upstream>],
        who: &'a dyn Caller,
    ) -> impl Iterator<Item = &'a Arc<Upstream>> {
        let rules = self.rules.get().map(|rules| rules.of(who.tenant()));
        all.iter().filter(move |u| {
            u.config.serves_tenant(who.tenant().as_str())
                && rules.as_ref().is_none_or(|r| r.allows_upstream(&u.config.name))
        })
    }

    /// Starts the call counts of every tenant of `tenants` at zero, for
    /// each upstream serving it: now, for each tenant seen later, and for
    /// each upstream registered later. Set once, at startup.
    pub fn start_series(self: &Arc<Self>, tenants: &Arc<TenantSeries>) {
        if self.tenants.set(Arc::clone(tenants)).is_err() {
            return;
        }
        let upstreams = Arc::downgrade(self);
        tenants.on_new_tenant(move |who| {
            if let Some(upstreams) = upstreams.upgrade() {
                for upstream in upstreams.snapshot().iter() {
                    upstream.start_series(who);
                }
            }
        });
    }

    /// Applies each tenant's own allow-list of upstreams (its settings'
    /// `upstreams`) from now on; set once, at startup.
    pub fn restrict_with(&self, rules: Arc<TenantRules>) {
        // A second call is a no-op: the first rules stay.
        let _ = self.rules.set(rules);
    }

    /// Stops every process of the stdio upstreams, each in order (its stdin
    /// closed, killed if it has not exited soon after), all at once; for
    /// the gateway's shutdown.
    pub async fn stop_processes(&self) {
        let mut stopping = tokio::task::JoinSet::new();
        for upstream in self.snapshot().iter() {
            if matches!(upstream.transport, Transport::Stdio(_)) {
                let upstream = Arc::clone(upstream);
                stopping.spawn(async move {
                    if let Transport::Stdio(stdio) = &upstream.transport {
                        stdio.stop_all().await;
                    }
                });
            }
        }
        while stopping.join_next().await.is_some() {}
    }

    /// Per stdio upstream: its name and how many of its processes run.
    pub fn processes(&self) -> Vec<(String, usize)> {
        self.snapshot()
            .iter()
            .filter_map(|u| u.processes().map(|n| (u.config.name.clone(), n)))
            .collect()
    }

    /// Per upstream: name, whether it answers, tools offered, last error.
    pub fn health(&self) -> Vec<(String, bool, usize, Option<String>)> {
        self.snapshot()
            .iter()
            .map(|u| {
                let l = u.read();
                (u.config.name.clone(), l.up, l.tools.len(), l.last_error.clone())
            })
            .collect()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
