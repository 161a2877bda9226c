//! Gateway-run branches (`branch_run`): what the gateway adds to each step
//! of a run, and how many runs one replica carries at once.
//!
//! The bench plays both parties a run talks to, in its own process: a
//! scripted model provider ([`ModelServer`]) whose every answer is computed
//! from the request (a call of the upstream's `echo` tool until the
//! conversation holds the planned number of tool results, then a short
//! finding, with usage figures of a real conversation), and its echo server
//! as the gateway's upstream `echo`, which times each tool call on its side.
//! Both log when each request arrived, so a run's time can be split into
//! what the model server and the upstream took and what the gateway took in
//! between.
//!
//! [`sequential`] makes runs one at a time with instant answers: the
//! gateway's overhead per step. [`concurrent`] starts many runs at once
//! with each model answer delayed, and samples the gateway (memory, CPU,
//! database pool) and the latency of a `branch_status` made meanwhile.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::bail;
use axum::{
    body::Body,
    extract::{Request, State},
    middleware::Next,
    response::Response,
};
use foldgate_store::inspect::Inspector;
use foldgate_testkit::model_server::{ModelServer, Provider, Reply};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::{net::TcpListener, task::JoinSet};
use tokio_util::sync::CancellationToken;

use crate::{
    client::{self, CallError, ClientOptions, McpClient},
    echo,
    load::{Auth, BRANCH_STATUS, SESSION_END, mint},
    process::{cpu_seconds, machine_ticks},
    report::Machine,
    stats::Spread,
};

/// The tool under measurement.
pub use foldgate_api::names::BRANCH_RUN;
/// The gateway's name for the bench's echo server.
pub const UPSTREAM: &str = "echo";
/// The `[[models]]` entry the runs use.
pub const MODEL: &str = "bench";
/// Each run's budget: room for the longest conversation the script makes.
const RUN_BUDGET: u32 = 16_384;
/// The finding every run ends with (about 30 tokens, within the `phase`
/// tier, so that the model is never asked to shorten it).
const FINDING: &str = "Retries are configured in config/http.rs: 3 attempts with exponential \
                       backoff from 200 ms, capped at 5 s; only idempotent methods are retried.";
/// The provider's usage for an answer that has seen `done` tool results:
/// a context that grows with each result, as a real one does.
const BASE_INPUT_TOKENS: u32 = 900;
const INPUT_TOKENS_PER_RESULT: u32 = 350;
const TOOL_CALL_OUTPUT_TOKENS: u32 = 45;
const FINDING_OUTPUT_TOKENS: u32 = 60;
/// How often each model request of the last sequential run is sent to the
/// model server directly, to time the model server alone.
const REPLAYS: usize = 20;
/// How often the gateway's memory and CPU are sampled during a concurrent
/// level; its `/metrics` and the database are read every other sample.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Clients initialised at once before a concurrent level starts.
const INIT_AT_ONCE: usize = 64;
/// The longest request body the timed echo server reads.
const MAX_ECHO_BODY: usize = 1 << 20;

/// Which provider API the gateway speaks to the model server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelApi {
    /// OpenAI Chat Completions.
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

impl ModelApi {
    fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
        }
    }
}

/// What the model server answers, and when each model request arrived
/// (with how many tool results its conversation held).
#[derive(Debug, Default)]
struct ModelLog {
    /// Tool calls per run, and how late each answer is. Read when a request
    /// arrives, so that answers queued for one phase and left over serve the
    /// next as it plans.
    plan: Mutex<(usize, Duration)>,
    arrivals: Mutex<Vec<Arrival>>,
}

/// One model request as the model server saw it.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: Instant,
    /// Tool results its conversation held.
    done: usize,
    /// The run it belongs to, when its task names one (`(run N)`).
    run: Option<usize>,
}

/// When each `tools/call` reached the echo server and when its answer was
/// ready.
#[derive(Debug, Default)]
struct EchoLog {
    calls: Mutex<Vec<(Instant, Instant)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The model server and the upstream, both in this process.
#[derive(Debug)]
pub struct Backends {
    pub model: ModelServer,
    model_log: Arc<ModelLog>,
    echo_url: String,
    echo_log: Arc<EchoLog>,
    echo_stop: CancellationToken,
    echo_task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Backends {
    /// Starts both on free loopback ports.
    pub async fn start() -> anyhow::Result<Self> {
        let model = ModelServer::start().await;
        let echo_log = Arc::new(EchoLog::default());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let echo_url = format!("http://{}/mcp", listener.local_addr()?);
        let echo_stop = CancellationToken::new();
        let app = echo::router(echo_stop.child_token())
            .layer(axum::middleware::from_fn_with_state(Arc::clone(&echo_log), timed));
        let stop = echo_stop.clone();
        let echo_task = tokio::spawn(async move {
            axum::serve(listener, app.into_make_service())
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        });
        Ok(Self {
            model,
            model_log: Arc::new(ModelLog::default()),
            echo_url,
            echo_log,
            echo_stop,
            echo_task,
        })
    }

    /// The upstream's MCP URL.
    pub fn echo_url(&self) -> &str {
        &self.echo_url
    }

    /// The `[[models]]` and `[[upstreams]]` a gateway needs to run branches
    /// on these two.
    pub fn gateway_toml(&self, api: ModelApi, stream: bool) -> String {
        format!(
            "[[models]]\nname = {MODEL:?}\nprovider = {:?}\nbase_url = {:?}\n\
             model = \"bench-model\"\napi_key = \"sk-bench-0123456789\"\n\
             max_output_tokens = 1024\ntimeout_seconds = 120\nstream = {stream}\n\n\
             [[upstreams]]\nname = {UPSTREAM:?}\nurl = {:?}\ntimeout_seconds = 30\n",
            api.as_str(),
            self.model.base_url(),
            self.echo_url,
        )
    }

    /// From now on, runs make `tool_calls` tool calls and each model answer
    /// is `delay` late; queues `count` more answers.
    fn script(&self, count: usize, tool_calls: usize, delay: Duration) {
        *lock(&self.model_log.plan) = (tool_calls, delay);
        let log = Arc::clone(&self.model_log);
        let reply = Reply::dynamic(move |request| {
            let done = tool_results(&request.body);
            let run = run_number(&request.body);
            lock(&log.arrivals).push(Arrival { at: Instant::now(), done, run });
            let (tool_calls, delay) = *lock(&log.plan);
            let answer = answer(done, tool_calls);
            if delay.is_zero() { answer } else { Reply::delayed(delay, answer) }
        });
        for _ in 0..count {
            self.model.push(reply.clone());
        }
    }

    fn model_arrivals(&self, from: Instant, to: Instant) -> Vec<Arrival> {
        let mut found: Vec<_> = lock(&self.model_log.arrivals)
            .iter()
            .filter(|a| a.at >= from && a.at <= to)
            .copied()
            .collect();
        found.sort_by_key(|a| a.at);
        found
    }

    fn echo_calls(&self, from: Instant, to: Instant) -> Vec<(Instant, Instant)> {
        let mut found: Vec<_> = lock(&self.echo_log.calls)
            .iter()
            .filter(|(at, done)| *at >= from && *done <= to)
            .copied()
            .collect();
        found.sort_by_key(|(at, _)| *at);
        found
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.echo_stop.cancel();
        self.echo_task.await??;
        Ok(())
    }
}

/// Times each `tools/call` the echo server answers, from its arrival to its
/// answer being ready.
async fn timed(State(log): State<Arc<EchoLog>>, request: Request, next: Next) -> Response {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_ECHO_BODY).await.unwrap_or_default();
    let call = bytes.windows(b"tools/call".len()).any(|w| w == b"tools/call");
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    if call {
        lock(&log.calls).push((arrived, Instant::now()));
    }
    response
}

/// Tool results in a model request: OpenAI's `tool` messages, Anthropic's
/// `tool_result` blocks.
fn tool_results(body: &Value) -> usize {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else { return 0 };
    messages
        .iter()
        .map(|m| {
            if m.get("role").and_then(Value::as_str) == Some("tool") {
                return 1;
            }
            m.get("content").and_then(Value::as_array).map_or(0, |blocks| {
                blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                    .count()
            })
        })
        .sum()
}

/// The number a run's task carries (`(run N)`), which every model request
/// of the run repeats.
fn run_number(body: &Value) -> Option<usize> {
    let text = body.get("messages")?.to_string();
    let at = text.find(RUN_MARK)? + RUN_MARK.len();
    let digits: String = text[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

const RUN_MARK: &str = "(run ";

/// The task of run `i`.
fn task(i: usize) -> String {
    format!("Find where HTTP retries are configured {RUN_MARK}{i})")
}

/// The answer to a conversation that holds `done` tool results.
fn answer(done: usize, tool_calls: usize) -> Reply {
    let input = BASE_INPUT_TOKENS
        + INPUT_TOKENS_PER_RESULT * u32::try_from(done).unwrap_or(u32::MAX / 1024);
    if done < tool_calls {
        Reply::tool_call(
            format!("call_{done}"),
            format!("{UPSTREAM}__{}", echo::TOOL),
            json!({"text": format!("GET /api/v1/config?page={done} HTTP/1.1 — 200 OK, 412 bytes")}),
            input,
            TOOL_CALL_OUTPUT_TOKENS,
        )
    } else {
        Reply::text(FINDING, input, FINDING_OUTPUT_TOKENS)
    }
}

/// The gateway under measurement.
#[derive(Debug, Clone)]
pub struct RunTarget {
    /// Its MCP URL.
    pub url: String,
    /// Its operations listener (`http://host:port`), for `/metrics`.
    pub ops_url: Option<String>,
    /// Its process, sampled.
    pub pid: u32,
    pub auth: Auth,
    /// Prefixes tenants and sessions.
    pub run_id: String,
    /// `timeout_seconds` of every run.
    pub run_timeout: u32,
    /// The gateway's Postgres database, to count its connections there.
    pub postgres_url: Option<String>,
}

impl RunTarget {
    fn tenant(&self, i: usize) -> String {
        format!("{}-t{}", self.run_id, i % self.auth.tenants.max(1))
    }

    fn client(
        &self,
        http: &reqwest::Client,
        tenant: &str,
        subject: &str,
    ) -> anyhow::Result<McpClient> {
        let token = mint(&self.auth, tenant, subject, &self.url)?;
        McpClient::with_http(http.clone(), &self.url, Some(&token))
    }

    fn run_args(&self, session: &str, description: &str) -> Value {
        json!({
            "session_id": session,
            "description": description,
            "prompt": "Look through the service's HTTP client configuration and report the retry \
                       setting and where it is set.",
            "budget": RUN_BUDGET,
            "timeout_seconds": self.run_timeout,
            "return_tier": "phase",
            "tools": [format!("{UPSTREAM}__{}", echo::TOOL)],
        })
    }
}

/// Waits (30 s at most) until the gateway lists the upstream's `echo`
/// tool, which it learns in the background after it starts.
pub async fn wait_for_upstream(target: &RunTarget) -> anyhow::Result<()> {
    let http = client::http_client(&ClientOptions::default(), 1)?;
    let mut c = target.client(&http, &target.tenant(0), "runner")?;
    let tool = format!("{UPSTREAM}__{}", echo::TOOL);
    let started = Instant::now();
    loop {
        let names = c.list_tool_names().await;
        if names.as_ref().is_ok_and(|n| n.contains(&tool)) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the gateway does not list {tool} after 30 s: {names:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How a run ended, as its caller saw it: the run's status
/// (`completed`, `timeout`, `failed`) or `error:<kind>` for a failed call.
fn ended_as(result: &Result<Value, CallError>) -> String {
    match result {
        Ok(v) => v.get("status").and_then(Value::as_str).unwrap_or("unknown").to_owned(),
        Err(e) => format!("error:{}", e.kind()),
    }
}

mod concurrent;
mod report;
mod sampling;
mod sequential;
#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests;

pub use self::{concurrent::*, report::*, sampling::*, sequential::*};
