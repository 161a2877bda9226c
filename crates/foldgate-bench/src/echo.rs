//! The baseline: a bare rmcp server with one `echo` tool, served the way
//! the gateway serves MCP (Streamable HTTP, stateless, JSON responses) but
//! with nothing in front of it — no authentication, no limits, no database.
//! What the gateway costs is measured against it. It also serves as an
//! upstream MCP server for proxied calls.
//!
//! It is the test upstream of `foldgate-testkit` offering `echo` alone,
//! answering as the gateway's tools answer (structured content plus the
//! same JSON as text) and noting nothing of the calls.

use std::net::SocketAddr;

use foldgate_testkit::upstream::{Upstream, UpstreamBuilder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The name of the one tool.
pub const TOOL: &str = "echo";

/// The echo server's setup.
fn baseline() -> UpstreamBuilder {
    Upstream::builder().tools(&[TOOL]).structured_echo().unrecorded().named("foldgate-bench-echo")
}

/// The echo server's HTTP application at `/mcp`.
pub fn router(shutdown: CancellationToken) -> axum::Router {
    baseline().router(shutdown)
}

/// A running in-process echo server.
#[derive(Debug)]
pub struct EchoServer {
    pub addr: SocketAddr,
    upstream: Upstream,
}

impl EchoServer {
    /// Starts the server on `addr` (`127.0.0.1:0` for any free port).
    pub async fn start(addr: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let upstream = baseline().serve(listener);
        Ok(Self { addr: upstream.addr(), upstream })
    }

    /// The MCP endpoint's URL.
    pub fn url(&self) -> String {
        self.upstream.url()
    }

    pub async fn stop(self) -> std::io::Result<()> {
        self.upstream.stop().await
    }
}
