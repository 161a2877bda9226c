//! A small "files" MCP server (rmcp) on loopback, as an upstream for the
//! gateway's federation tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use rmcp::{
    ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
        ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    },
    service::{RequestContext, RoleServer},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

/// A secret the scrubber knows (a GitHub token's format).
pub const LEAKED: &str = "ghp_R7kP2mX9qL4vN8wZ3tY6bH1cJ5dF0gS2aE7u";

/// The synthetic content of a file: a few hundred tokens of plausible code.
pub fn file_text(path: &str, lines: usize) -> String {
    (0..lines)
        .map(|i| format!("// {path}:{i}\nfn handler_{i}(req: Request) -> Result<Response, Error> {{ retry(req, {i}) }}\n"))
        .collect()
}

#[derive(Debug, Clone, Default)]
pub struct Files {
    pub hold: Arc<Hold>,
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

pub fn schema(value: Value) -> Arc<Map<String, Value>> {
    let Value::Object(map) = value else { panic!("schema must be an object") };
    Arc::new(map)
}

impl ServerHandler for Files {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let path = json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "lines": {"type": "integer", "minimum": 1}},
            "required": ["path"],
            "additionalProperties": false,
        });
        Ok(ListToolsResult::with_all_items(vec![
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
            // As the Python SDK's servers shape a tool that returns a
            // string: an output schema, and the text twice (as content and
            // as `{"result": …}`).
            Tool::new("read_typed", "Read a file, typed", schema(path.clone()))
                .with_raw_output_schema(schema(json!({
                    "type": "object",
                    "properties": {"result": {"type": "string"}},
                    "required": ["result"],
                }))),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let result = match request.name.as_ref() {
            name @ ("read_file" | "read_held") => {
                if name == "read_held" {
                    self.hold.arrived.add_permits(1);
                    self.hold.released.acquire().await.unwrap().forget();
                }
                let lines = args.get("lines").and_then(Value::as_u64).unwrap_or(12);
                CallToolResult::success(vec![ContentBlock::text(file_text(
                    &text("path"),
                    lines as usize,
                ))])
            }
            "echo" => CallToolResult::success(vec![ContentBlock::text(text("text"))]),
            "leak" => CallToolResult::success(vec![ContentBlock::text(format!(
                "deploy with GITHUB_TOKEN={LEAKED}"
            ))]),
            "fail" => CallToolResult::error(vec![ContentBlock::text("disk on fire")]),
            "admin_reset" => CallToolResult::success(vec![ContentBlock::text("reset everything")]),
            "read_typed" => {
                let lines = args.get("lines").and_then(Value::as_u64).unwrap_or(12);
                let text = file_text(&text("path"), lines as usize);
                let mut result = CallToolResult::structured(json!({"result": text}));
                result.content = vec![ContentBlock::text(text)];
                result
            }
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(result.into())
    }
}

/// An upstream server on loopback that requires `Authorization: <auth>`.
pub struct Upstream {
    addr: SocketAddr,
    auth: &'static str,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// Its calls of `read_held`.
    pub hold: Arc<Hold>,
}

impl Upstream {
    pub async fn start(auth: &'static str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, auth)
    }

    fn serve(listener: tokio::net::TcpListener, auth: &'static str) -> Self {
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let files = Files::default();
        let hold = Arc::clone(&files.hold);
        let mcp = StreamableHttpService::new(
            move || Ok(files.clone()),
            Arc::new(NeverSessionManager::default()),
            StreamableHttpServerConfig::default()
                .with_legacy_session_mode(false)
                .with_json_response(true)
                .with_sse_keep_alive(None)
                .disable_allowed_hosts()
                .with_cancellation_token(stop.child_token()),
        );
        let app = Router::new()
            .route_service("/mcp", mcp)
            .layer(middleware::from_fn_with_state(auth, require_auth));
        let serve_stop = stop.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(serve_stop.cancelled_owned())
                .await
                .unwrap();
        });
        Self { addr, auth, stop, task, hold }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Stops serving (connections are refused) until `restart`.
    pub async fn down(self) -> (SocketAddr, &'static str) {
        self.stop.cancel();
        self.task.abort();
        let _ = self.task.await;
        (self.addr, self.auth)
    }

    pub async fn restart(addr: SocketAddr, auth: &'static str) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        Self::serve(listener, auth)
    }
}

pub async fn require_auth(
    State(expected): State<&'static str>,
    req: Request,
    next: Next,
) -> Response {
    let given = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    if given != Some(expected) {
        return (StatusCode::UNAUTHORIZED, "bad upstream credentials").into_response();
    }
    next.run(req).await
}
