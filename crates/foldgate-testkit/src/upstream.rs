//! An MCP server on loopback to put behind the gateway: a small "files"
//! server (rmcp, Streamable HTTP, stateless, JSON responses, as deployments
//! run MCP servers behind foldgate).
//!
//! Its tools: `read_file`, `read_held` (answers when the test lets it, see
//! [`Hold`]), `read_typed` (a typed result as the Python SDK shapes one),
//! `echo`, `leak` (a secret the scrubber knows), `fail` (a tool error) and
//! `admin_reset` (one an allow-list leaves out). [`UpstreamBuilder::tools`]
//! offers only some of them. Every call is noted with the trace context it
//! came with ([`Upstream::calls`]), unless [`UpstreamBuilder::unrecorded`].
//!
//! The bench serves its baseline with it too: `echo` alone, answering as
//! the gateway's own tools do ([`UpstreamBuilder::structured_echo`]).

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::{Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use rmcp::{
    Peer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
        Implementation, ListToolsResult, NumberOrString, PaginatedRequestParams,
        ProgressNotificationParam, ProgressToken, ServerCapabilities, ServerConfig, Tool,
    },
    service::{RequestContext, RoleServer},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A secret the scrubber knows (a GitHub token's format).
pub const LEAKED: &str = "ghp_R7kP2mX9qL4vN8wZ3tY6bH1cJ5dF0gS2aE7u";

/// The `report` tool: `{list_changed?: bool}`.
pub fn report_tool() -> Tool {
    Tool::new(
        "report",
        "Report progress and log messages, then answer",
        schema(json!({"type": "object", "properties": {"list_changed": {"type": "boolean"}}})),
    )
}

/// What `report` does before it answers `reported`: progress 1 and 2 of 3
/// for the token it was given (the second's message holds [`LEAKED`]), and
/// between them progress for a token nobody gave; a `debug` log message
/// and a `warning` one (logger `probe`, data `{"detail": …}` holding
/// [`LEAKED`]); then, if `list_changed`, a tool list change.
pub async fn report(
    peer: &Peer<RoleServer>,
    token: Option<ProgressToken>,
    args: &Map<String, Value>,
) -> String {
    if let Some(token) = token {
        let step = |progress: f64, message: String| {
            ProgressNotificationParam::new(token.clone(), progress)
                .with_total(3.0)
                .with_message(message)
        };
        let _ = peer.notify_progress(step(1.0, "reading".into())).await;
        let nobody = ProgressToken(NumberOrString::String("nobody".into()));
        let _ = peer.notify_progress(ProgressNotificationParam::new(nobody, 9.0)).await;
        let _ = peer.notify_progress(step(2.0, format!("found {LEAKED}"))).await;
    }
    #[expect(deprecated, reason = "MCP log messages, still what clients read")]
    {
        use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
        let debug = LoggingMessageNotificationParam::new(LoggingLevel::Debug, json!("noise"));
        let _ = peer.notify_logging_message(debug).await;
        let detail = json!({"detail": format!("token {LEAKED}")});
        let warning = LoggingMessageNotificationParam::new(LoggingLevel::Warning, detail)
            .with_logger("probe");
        let _ = peer.notify_logging_message(warning).await;
    }
    if args.get("list_changed") == Some(&Value::Bool(true)) {
        let _ = peer.notify_tool_list_changed().await;
    }
    "reported".to_owned()
}

/// The synthetic content of a file: a few hundred tokens of plausible code.
pub fn file_text(path: &str, lines: usize) -> String {
    (0..lines)
        .map(|i| format!("// {path}:{i}\nfn handler_{i}(req: Request) -> Result<Response, Error> {{ retry(req, {i}) }}\n"))
        .collect()
}

/// A JSON schema object from `value`.
pub fn schema(value: Value) -> Arc<Map<String, Value>> {
    let Value::Object(map) = value else { panic!("schema must be an object") };
    Arc::new(map)
}

/// Every tool the server has, in the order it lists them.
fn catalogue() -> Vec<Tool> {
    let path = json!({
        "type": "object",
        "properties": {"path": {"type": "string"}, "lines": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": false,
    });
    vec![
        Tool::new("read_file", "Read a file", schema(path.clone())),
        Tool::new("read_held", "Read a file when the test says so", schema(path.clone())),
        Tool::new(
            "echo",
            "Echo text",
            schema(
                json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
            ),
        ),
        Tool::new("leak", "Print the deploy token", schema(json!({"type": "object"}))),
        Tool::new("fail", "Always fails", schema(json!({"type": "object"}))),
        Tool::new("admin_reset", "Not for agents", schema(json!({"type": "object"}))),
        // As the Python SDK's servers shape a tool that returns a string: an
        // output schema, and the text twice (as content and as
        // `{"result": …}`).
        Tool::new("read_typed", "Read a file, typed", schema(path)).with_raw_output_schema(schema(
            json!({
                "type": "object",
                "properties": {"result": {"type": "string"}},
                "required": ["result"],
            }),
        )),
    ]
}

/// Holds calls of `read_held` until the test lets them go.
#[derive(Debug)]
pub struct Hold {
    /// A permit for each call that came in.
    arrived: tokio::sync::Semaphore,
    /// A permit for each call that may answer.
    released: tokio::sync::Semaphore,
}

impl Default for Hold {
    fn default() -> Self {
        Self { arrived: tokio::sync::Semaphore::new(0), released: tokio::sync::Semaphore::new(0) }
    }
}

impl Hold {
    /// Waits until `n` more calls have come in (a test whose calls never
    /// reach the upstream fails here rather than waiting forever).
    pub async fn arrivals(&self, n: u32) {
        let arrived = tokio::time::timeout(Duration::from_secs(10), self.arrived.acquire_many(n));
        arrived.await.expect("the calls reached the upstream").unwrap().forget();
    }

    /// Lets `n` held calls answer.
    pub fn release(&self, n: usize) {
        self.released.add_permits(n);
    }
}

/// The trace context one tool call reached the upstream with.
#[derive(Debug, Clone)]
pub struct Traced {
    pub tool: String,
    /// The `traceparent` HTTP header.
    pub header: Option<String>,
    /// `_meta.traceparent` (SEP-414).
    pub meta: Option<String>,
}

/// How the server is set up; [`Upstream::builder`].
#[derive(Debug, Clone, Default)]
pub struct UpstreamBuilder {
    auth: Option<&'static str>,
    tools: Option<Vec<&'static str>>,
    structured_echo: bool,
    unrecorded: bool,
    name: Option<&'static str>,
    /// Offered instead of the files tools; each answers a line naming
    /// itself and its arguments.
    serving: Option<Arc<Vec<Tool>>>,
    reporting: bool,
}

impl UpstreamBuilder {
    /// Requires `Authorization: <auth>` of every request.
    pub fn auth(mut self, auth: &'static str) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Offers only these tools (in the server's order).
    pub fn tools(mut self, tools: &[&'static str]) -> Self {
        self.tools = Some(tools.to_vec());
        self
    }

    /// `echo` answers `{"text": <its text argument>}` as structured content
    /// plus the same JSON as text, as the gateway's own tools answer, and
    /// describes itself as the bench's baseline does.
    pub fn structured_echo(mut self) -> Self {
        self.structured_echo = true;
        self
    }

    /// Notes nothing of the calls (for load that would pile them up).
    pub fn unrecorded(mut self) -> Self {
        self.unrecorded = true;
        self
    }

    /// Offers these tools instead of the files tools ([`crate::catalog`]'s,
    /// say). A call of one answers `<tool> done: <arguments as JSON>`.
    pub fn serving(mut self, tools: Vec<Tool>) -> Self {
        self.serving = Some(Arc::new(tools));
        self
    }

    /// The name the server gives in its `serverInfo`.
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    /// Offers [`report_tool`] too.
    pub fn reporting(mut self) -> Self {
        self.reporting = true;
        self
    }

    /// The tools this server offers.
    fn offered(&self) -> Vec<Tool> {
        if let Some(tools) = &self.serving {
            return tools.to_vec();
        }
        let mut tools = catalogue();
        if self.reporting {
            tools.push(report_tool());
        }
        if let Some(wanted) = &self.tools {
            tools.retain(|t| wanted.contains(&t.name.as_ref()));
        }
        if self.structured_echo {
            for tool in tools.iter_mut().filter(|t| t.name == "echo") {
                *tool = Tool::new(
                    "echo",
                    "Returns its text argument.",
                    schema(json!({
                        "type": "object",
                        "properties": {"text": {"type": "string", "description": "What to echo."}},
                    })),
                );
            }
        }
        tools
    }

    /// The server's HTTP application at `/mcp`, serving until `shutdown`
    /// is cancelled, and the state its calls are noted in.
    pub fn router(&self, shutdown: CancellationToken) -> Router {
        self.app(Files::new(self), shutdown)
    }

    fn app(&self, files: Files, shutdown: CancellationToken) -> Router {
        let mcp = StreamableHttpService::new(
            move || Ok(files.clone()),
            Arc::new(NeverSessionManager::default()),
            StreamableHttpServerConfig::default()
                .with_legacy_session_mode(false)
                .with_json_response(true)
                .with_sse_keep_alive(None)
                .disable_allowed_hosts()
                .with_cancellation_token(shutdown),
        );
        let app = Router::new().route_service("/mcp", mcp);
        match self.auth {
            Some(auth) => app.layer(middleware::from_fn_with_state(auth, require_auth)),
            None => app,
        }
    }

    /// Starts the server on a free loopback port.
    pub async fn start(self) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.serve(listener)
    }

    /// Serves on `listener`.
    pub fn serve(self, listener: TcpListener) -> Upstream {
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let files = Files::new(&self);
        let hold = Arc::clone(&files.hold);
        let calls = Arc::clone(&files.calls);
        let listings = Arc::clone(&files.listings);
        let app = self.app(files, stop.child_token());
        let serving = stop.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(serving.cancelled_owned()).await
        });
        Upstream { addr, builder: self, stop, task, hold, calls, listings }
    }
}

/// The server's handler: one per request, sharing the test's state.
#[derive(Debug, Clone)]
struct Files {
    tools: Arc<Vec<Tool>>,
    structured_echo: bool,
    /// Serving tools of its own ([`UpstreamBuilder::serving`]).
    generic: bool,
    name: Option<&'static str>,
    hold: Arc<Hold>,
    /// `None` when calls are not noted.
    calls: Arc<Option<Mutex<Vec<Traced>>>>,
    /// How many times the tools were listed.
    listings: Arc<AtomicUsize>,
}

impl Files {
    fn new(builder: &UpstreamBuilder) -> Self {
        Self {
            tools: Arc::new(builder.offered()),
            structured_echo: builder.structured_echo,
            generic: builder.serving.is_some(),
            name: builder.name,
            hold: Arc::default(),
            calls: Arc::new((!builder.unrecorded).then(Mutex::default)),
            listings: Arc::default(),
        }
    }

    fn note(&self, request: &CallToolRequestParams, context: &RequestContext<RoleServer>) {
        let Some(calls) = self.calls.as_ref() else { return };
        let header = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get("traceparent"))
            .map(|v| v.to_str().unwrap().to_owned());
        let meta = request
            .meta
            .as_ref()
            .and_then(|m| m.get_traceparent())
            .or_else(|| context.meta.get_traceparent())
            .map(str::to_owned);
        let tool = request.name.to_string();
        calls.lock().unwrap().push(Traced { tool, header, meta });
    }
}

impl ServerHandler for Files {
    fn get_info(&self) -> ServerConfig {
        let config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        match self.name {
            Some(name) => {
                config.with_server_info(Implementation::new(name, env!("CARGO_PKG_VERSION")))
            }
            None => config,
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.listings.fetch_add(1, Ordering::SeqCst);
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.get_tool(&request.name).is_none() {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {:?}", request.name),
                Some(json!({"field": "name"})),
            ));
        }
        self.note(&request, &context);
        let args = request.arguments.unwrap_or_default();
        if self.generic {
            let line = format!("{} done: {}", request.name, Value::Object(args));
            return Ok(CallToolResult::success(vec![ContentBlock::text(line)]).into());
        }
        let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let lines = || args.get("lines").and_then(Value::as_u64).unwrap_or(12) as usize;
        let result = match request.name.as_ref() {
            name @ ("read_file" | "read_held") => {
                if name == "read_held" {
                    self.hold.arrived.add_permits(1);
                    self.hold.released.acquire().await.unwrap().forget();
                }
                CallToolResult::success(vec![ContentBlock::text(file_text(&text("path"), lines()))])
            }
            "echo" if self.structured_echo => {
                let text = args.get("text").cloned().unwrap_or(Value::String(String::new()));
                CallToolResult::structured(json!({"text": text}))
            }
            "echo" => CallToolResult::success(vec![ContentBlock::text(text("text"))]),
            "leak" => CallToolResult::success(vec![ContentBlock::text(format!(
                "deploy with GITHUB_TOKEN={LEAKED}"
            ))]),
            "admin_reset" => CallToolResult::success(vec![ContentBlock::text("reset everything")]),
            "report" => {
                let token = context.meta.get_progress_token();
                CallToolResult::success(vec![ContentBlock::text(
                    report(&context.peer, token, &args).await,
                )])
            }
            "read_typed" => {
                let text = file_text(&text("path"), lines());
                let mut result = CallToolResult::structured(json!({"result": text}));
                result.content = vec![ContentBlock::text(text)];
                result
            }
            _ => CallToolResult::error(vec![ContentBlock::text("disk on fire")]),
        };
        Ok(result.into())
    }
}

/// A running server.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    builder: UpstreamBuilder,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Its calls of `read_held`.
    pub hold: Arc<Hold>,
    calls: Arc<Option<Mutex<Vec<Traced>>>>,
    listings: Arc<AtomicUsize>,
}

impl Upstream {
    pub fn builder() -> UpstreamBuilder {
        UpstreamBuilder::default()
    }

    /// Every tool on a free loopback port, requiring `Authorization: <auth>`.
    pub async fn start(auth: &'static str) -> Self {
        Self::builder().auth(auth).start().await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The MCP endpoint's URL.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// How many times its tools were listed so far.
    pub fn listings(&self) -> usize {
        self.listings.load(Ordering::SeqCst)
    }

    /// The calls that came in so far, in order.
    pub fn calls(&self) -> Vec<Traced> {
        self.calls.as_ref().as_ref().map(|c| c.lock().unwrap().clone()).unwrap_or_default()
    }

    /// Stops serving at once (connections are refused) until
    /// [`Down::restart`].
    pub async fn down(mut self) -> Down {
        self.stop.cancel();
        self.task.abort();
        let _ = (&mut self.task).await;
        Down { addr: self.addr, builder: self.builder.clone() }
    }

    /// Stops once the requests in flight are answered.
    pub async fn stop(mut self) -> std::io::Result<()> {
        self.stop.cancel();
        (&mut self.task).await.map_err(std::io::Error::other)?
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A server taken down, to be restarted on the same address.
#[derive(Debug)]
pub struct Down {
    addr: SocketAddr,
    builder: UpstreamBuilder,
}

impl Down {
    pub async fn restart(self) -> Upstream {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.builder.serve(listener)
    }
}

async fn require_auth(State(expected): State<&'static str>, req: Request, next: Next) -> Response {
    let given = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    if given != Some(expected) {
        return (StatusCode::UNAUTHORIZED, "bad upstream credentials").into_response();
    }
    next.run(req).await
}
