//! The "files" MCP server ([`Upstream`]) as a process of its own, for
//! checks that drive the real gateway from outside Rust (the console's
//! browser test).
//!
//! ```text
//! foldgate-files-upstream [--tools read_file,echo] [--auth 'Bearer secret']
//! ```
//!
//! Once listening on a free loopback port it prints
//! `files upstream at http://127.0.0.1:PORT/mcp` on stdout: the `url` of an
//! `[[upstreams]]` entry. It serves until SIGTERM or SIGINT, or until its
//! stdin closes when stdin is a pipe or a socket (so that a parent that
//! dies takes it along).

use std::io::{self, Write};

use anyhow::Context;
use clap::Parser;
use foldgate_testkit::{child::stdin_closed, upstream::Upstream};
use tokio::signal::unix::{SignalKind, signal};

/// Serves the files MCP server's tools on loopback.
#[derive(Debug, Parser)]
struct Args {
    /// Offer only these tools (comma-separated), in the server's order.
    #[arg(long, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Require this `Authorization` header of every request.
    #[arg(long)]
    auth: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;

    // The builder keeps `&'static str`s: the process's arguments live as
    // long as it does.
    let mut builder = Upstream::builder().named("files").unrecorded();
    if let Some(tools) = args.tools {
        let tools: Vec<&'static str> =
            tools.into_iter().map(|t| &*Box::leak(t.into_boxed_str())).collect();
        builder = builder.tools(&tools);
    }
    if let Some(auth) = args.auth {
        builder = builder.auth(Box::leak(auth.into_boxed_str()));
    }
    let upstream = builder.start().await;
    {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "files upstream at {}", upstream.url())?;
        stdout.flush()?;
    }

    let closed = stdin_closed();
    tokio::pin!(closed);
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
        () = &mut closed => {}
    }
    upstream.stop().await.context("stopping")?;
    Ok(())
}
