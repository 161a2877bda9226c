//! The baseline: a bare rmcp server with one `echo` tool, served the way
//! the gateway serves MCP (Streamable HTTP, stateless, JSON responses) but
//! with nothing in front of it — no authentication, no limits, no database.
//! What the gateway costs is measured against it. It also serves as an
//! upstream MCP server for proxied calls.

use std::{net::SocketAddr, sync::Arc};

use rmcp::{
    ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, Implementation,
        ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    },
    service::{RequestContext, RoleServer},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The name of the one tool.
pub const TOOL: &str = "echo";

/// Answers `echo` with its `text` argument.
#[derive(Debug, Clone)]
pub struct Echo {
    tool: Arc<Tool>,
}

impl Default for Echo {
    fn default() -> Self {
        let mut schema = serde_json::Map::new();
        schema.insert("type".into(), "object".into());
        schema.insert(
            "properties".into(),
            json!({"text": {"type": "string", "description": "What to echo."}}),
        );
        Self { tool: Arc::new(Tool::new(TOOL, "Returns its text argument.", Arc::new(schema))) }
    }
}

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("foldgate-bench-echo", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![(*self.tool).clone()]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == TOOL).then(|| (*self.tool).clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != TOOL {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {:?}", request.name),
                Some(json!({"field": "name"})),
            ));
        }
        let text = request
            .arguments
            .as_ref()
            .and_then(|args| args.get("text"))
            .cloned()
            .unwrap_or(Value::String(String::new()));
        // Structured content plus the same JSON as text, as the gateway's
        // tools answer.
        Ok(CallToolResult::structured(json!({"text": text})).into())
    }
}

/// The echo server's HTTP application at `/mcp`.
pub fn router(shutdown: CancellationToken) -> axum::Router {
    let service = StreamableHttpService::new(
        || Ok(Echo::default()),
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_sse_keep_alive(None)
            .with_cancellation_token(shutdown),
    );
    axum::Router::new().route_service("/mcp", service)
}

/// Serves the echo server on `listener` until `shutdown` is cancelled.
pub async fn serve(listener: TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
    let app = router(shutdown.child_token());
    axum::serve(listener, app.into_make_service())
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// A running in-process echo server.
#[derive(Debug)]
pub struct EchoServer {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl EchoServer {
    /// Starts the server on `addr` (`127.0.0.1:0` for any free port).
    pub async fn start(addr: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(listener, shutdown.clone()));
        Ok(Self { addr, shutdown, task })
    }

    /// The MCP endpoint's URL.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub async fn stop(self) -> std::io::Result<()> {
        self.shutdown.cancel();
        self.task.await.map_err(std::io::Error::other)?
    }
}
