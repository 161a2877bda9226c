//! A small MCP server over stdio (rmcp), to run as a stdio upstream behind
//! the gateway: it reads newline-delimited JSON-RPC on stdin and answers on
//! stdout, as community MCP servers do.
//!
//! ```text
//! foldgate-stdio-upstream
//! ```
//!
//! Its tools:
//! - `echo {text}`: the text.
//! - `whoami {}`: `{"pid": …, "calls": n}`, the process's id and how many
//!   calls this process has served (this one included); it also sends a
//!   notification (the tool list changed) before answering.
//! - `env {name}`: the value of an environment variable, or `(unset)`.
//! - `cwd {}`: the working directory.
//! - `log {text}`: writes the text to stderr.
//! - `sleep {ms}`: answers after that many milliseconds.
//! - `big {bytes}`: a text of that many bytes.
//! - `allocate {mib}`: allocates and touches that many MiB, then answers.
//! - `ask {}`: sends the client a `ping` and a `roots/list` request and
//!   says how each was answered.
//! - `exit {}`: the process exits (code 3) without answering.
//! - `report {list_changed?}`: progress and log messages, then `reported`
//!   (as the HTTP test upstream's `report` does).

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use foldgate_testkit::upstream::{report, report_tool, schema};
use rmcp::{
    ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
        Implementation, ListToolsResult, PaginatedRequestParams, PingRequest, ServerCapabilities,
        ServerConfig, ServerRequest, Tool,
    },
    service::{RequestContext, RoleServer},
};
use serde_json::{Value, json};

#[derive(Debug, Default)]
struct Probe {
    calls: AtomicU64,
}

fn tools() -> Vec<Tool> {
    let none = || schema(json!({"type": "object"}));
    let one = |key: &str, kind: &str| {
        schema(json!({
            "type": "object",
            "properties": {key: {"type": kind}},
            "required": [key],
        }))
    };
    vec![
        Tool::new("echo", "Echo text", one("text", "string")),
        Tool::new("whoami", "This process's id and calls", none()),
        Tool::new("env", "An environment variable", one("name", "string")),
        Tool::new("cwd", "The working directory", none()),
        Tool::new("log", "Write to stderr", one("text", "string")),
        Tool::new("sleep", "Answer later", one("ms", "integer")),
        Tool::new("big", "A long text", one("bytes", "integer")),
        Tool::new("allocate", "Use memory", one("mib", "integer")),
        Tool::new("ask", "Send the client requests", none()),
        Tool::new("exit", "Exit without answering", none()),
        report_tool(),
    ]
}

impl ServerHandler for Probe {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("stdio-probe", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let calls = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let args = request.arguments.unwrap_or_default();
        let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let number = |key: &str| args.get(key).and_then(Value::as_u64).unwrap_or_default();
        let answer = match request.name.as_ref() {
            "echo" => text("text"),
            "whoami" => {
                let _ = context.peer.notify_tool_list_changed().await;
                json!({"pid": std::process::id(), "calls": calls}).to_string()
            }
            "env" => std::env::var(text("name")).unwrap_or_else(|_| "(unset)".to_owned()),
            "cwd" => std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default(),
            "log" => {
                eprintln!("{}", text("text"));
                "logged".to_owned()
            }
            "sleep" => {
                tokio::time::sleep(std::time::Duration::from_millis(number("ms"))).await;
                "slept".to_owned()
            }
            "big" => "x".repeat(usize::try_from(number("bytes")).unwrap_or(0)),
            "allocate" => {
                let bytes = usize::try_from(number("mib")).unwrap_or(0) << 20;
                let mut block: Vec<u8> = Vec::new();
                if block.try_reserve_exact(bytes).is_err() {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(
                        "could not allocate",
                    )])
                    .into());
                }
                block.resize(bytes, 1);
                format!("allocated {}", block.len())
            }
            "ask" => {
                let ping =
                    context.peer.send_request(ServerRequest::PingRequest(PingRequest::default()));
                let ping = match ping.await {
                    Ok(_) => "ping answered".to_owned(),
                    Err(e) => format!("ping refused: {e}"),
                };
                #[allow(deprecated, reason = "roots/list is what a server may still ask")]
                let roots = context.peer.send_request(ServerRequest::ListRootsRequest(
                    rmcp::model::ListRootsRequest::default(),
                ));
                let roots = match roots.await {
                    Ok(_) => "roots answered".to_owned(),
                    Err(e) => format!("roots refused: {e}"),
                };
                format!("{ping}; {roots}")
            }
            "exit" => std::process::exit(3),
            "report" => report(&context.peer, context.meta.get_progress_token(), &args).await,
            other => {
                return Err(ErrorData::invalid_params(format!("unknown tool {other:?}"), None));
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(answer)]).into())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let running = Probe::default()
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await
        .context("the MCP handshake")?;
    running.waiting().await.context("serving")?;
    Ok(())
}
