//! Slow and abandoned clients: many connections that send part of a
//! request and stall, or requests dropped before their answer. What they
//! cost the server (memory, descriptors, sockets) is sampled before, during
//! and after, while a well-behaved client checks that the server still
//! answers.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{
    client::{ClientOptions, McpClient},
    load::BRANCH_STATUS,
    process::ProcSample,
    stats::{Measured, Recorder, Spread},
};

/// How the misbehaving connections misbehave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SlowKind {
    /// Send the request line and some headers, never the blank line.
    HalfHeaders,
    /// Send the headers and part of the declared body, never the rest.
    HalfBody,
    /// Send a whole request and close the connection without reading the
    /// answer.
    Abandon,
}

/// What to do.
#[derive(Debug, Clone)]
pub struct SlowSpec {
    pub url: String,
    /// A valid token, so that half bodies and abandoned requests get past
    /// authentication.
    pub token: String,
    pub kind: SlowKind,
    pub connections: usize,
    /// How long stalled connections are held open.
    pub hold: Duration,
    /// The server process.
    pub pid: u32,
}

/// The outcome.
#[derive(Debug, Clone, Serialize)]
pub struct SlowReport {
    pub kind: SlowKind,
    pub connections: usize,
    /// Connections that could not be opened.
    pub connect_failures: usize,
    pub before: ProcSample,
    /// Once every connection is open (or every request sent).
    pub during: ProcSample,
    /// At the end of the hold.
    pub end_of_hold: ProcSample,
    /// After the clients let go, and a short pause.
    pub after: ProcSample,
    /// Connections the server closed (or answered) while they stalled.
    pub closed_by_server: usize,
    /// When, after they were opened, in seconds.
    pub closed_after_s: Option<Spread>,
    /// A well-behaved client's calls meanwhile.
    pub probe: Measured,
}

/// Host and path of an `http://host:port/path` URL.
fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let rest = url.strip_prefix("http://").context("only http:// URLs are supported")?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    Ok((authority.to_owned(), format!("/{path}")))
}

/// Runs the scenario.
pub async fn run(spec: &SlowSpec) -> anyhow::Result<SlowReport> {
    let (authority, path) = split_url(&spec.url)?;
    let started = Instant::now();
    let sample = |label: &str| {
        ProcSample::read(spec.pid, started.elapsed().as_secs_f64())
            .with_context(|| format!("sampling the server ({label})"))
    };
    let before = sample("before")?;

    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": BRANCH_STATUS, "arguments": {"session_id": "slow-clients"}},
    })
    .to_string();
    let head = |content_length: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {}\r\n\
             Authorization: Bearer {}\r\nContent-Length: {content_length}\r\n\r\n",
            crate::client::PROTOCOL_VERSION,
            spec.token
        )
    };

    let mut connect_failures = 0;
    let mut held = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        let Ok(mut stream) = TcpStream::connect(&authority).await else {
            connect_failures += 1;
            continue;
        };
        let sent = match spec.kind {
            SlowKind::HalfHeaders => {
                let partial = format!(
                    "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n"
                );
                stream.write_all(partial.as_bytes()).await
            }
            SlowKind::HalfBody => {
                let mut request = head(body.len()).into_bytes();
                request.extend_from_slice(&body.as_bytes()[..body.len() / 2]);
                stream.write_all(&request).await
            }
            SlowKind::Abandon => {
                let mut request = head(body.len()).into_bytes();
                request.extend_from_slice(body.as_bytes());
                stream.write_all(&request).await
            }
        };
        if sent.is_err() {
            connect_failures += 1;
            continue;
        }
        if spec.kind == SlowKind::Abandon {
            // Dropped at once: the answer is never read.
            drop(stream);
            continue;
        }
        let opened = Instant::now();
        held.push(tokio::spawn(async move {
            // Resolves when the server closes the connection or answers.
            let mut buf = [0_u8; 1024];
            match stream.read(&mut buf).await {
                Ok(_) | Err(_) => Some(opened.elapsed()),
            }
        }));
    }
    // Let the server take in what was sent.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = sample("during")?;

    // A well-behaved client meanwhile.
    let probe_client = McpClient::new(&spec.url, Some(&spec.token), &ClientOptions::default());
    let mut probe = probe_client?;
    let mut recorder = Recorder::default();
    let hold_until = Instant::now() + spec.hold;
    while Instant::now() < hold_until {
        let at = Instant::now();
        match probe.call_tool(BRANCH_STATUS, json!({"session_id": "slow-clients"}), None).await {
            Ok(_) => recorder.ok(BRANCH_STATUS, at.elapsed()),
            Err(e) => recorder.error(BRANCH_STATUS, &e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let probe = recorder.summary(spec.hold);
    let end_of_hold = sample("end of hold")?;

    let mut closed = Vec::new();
    for task in held {
        if task.is_finished() {
            if let Ok(Some(after)) = task.await {
                closed.push(after.as_secs_f64());
            }
        } else {
            task.abort();
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = sample("after")?;
    Ok(SlowReport {
        kind: spec.kind,
        connections: spec.connections,
        connect_failures,
        before,
        during,
        end_of_hold,
        after,
        closed_by_server: closed.len(),
        closed_after_s: Spread::of(&closed),
        probe,
    })
}
