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

// ------------------------------------------------------------------------
// One at a time

/// Runs made one at a time.
#[derive(Debug, Clone, Copy)]
pub struct SequentialSpec {
    /// Measured runs.
    pub runs: usize,
    /// Runs made first and not counted.
    pub warmup: usize,
    /// Tool calls per run.
    pub tool_calls: usize,
}

/// Where the time of a run went, per run, milliseconds: from the call to
/// the first model request; from a model request to the tool call it asked
/// for (the model server's answer, and what the gateway did with it); from
/// a tool call's answer to the next model request; from the last model
/// request to the result at the caller.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub call_to_first_model_ms: Option<Spread>,
    pub model_to_tool_ms: Option<Spread>,
    pub tool_to_model_ms: Option<Spread>,
    pub last_model_to_result_ms: Option<Spread>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SequentialReport {
    pub runs: usize,
    pub warmup: usize,
    pub tool_calls: usize,
    /// Steps each run writes: a model step and a tool step per tool call,
    /// and the final model step.
    pub steps_per_run: usize,
    /// Measured runs that did not complete as scripted, by how they ended.
    pub failed: BTreeMap<String, usize>,
    /// From the call to its result, per run.
    pub wall_ms: Option<Spread>,
    /// The wall time divided by the steps, nothing subtracted.
    pub wall_per_step_ms: Option<Spread>,
    /// (wall − model server − upstream) / steps, per run: the gateway's
    /// overhead per step.
    pub overhead_per_step_ms: Option<Spread>,
    /// The upstream's time per tool call, timed on its side.
    pub upstream_ms: Option<Spread>,
    /// The model server's time per model call: a direct round trip of the
    /// last run's requests from this process (an upper bound).
    pub model_server_ms: Option<Spread>,
    pub timeline: Timeline,
    /// Runs whose model and tool requests did not line up with the script
    /// (left out of the timeline).
    pub unaligned: usize,
    /// The gateway's CPU per measured run and per step.
    pub gateway_cpu_ms_per_run: Option<f64>,
    pub gateway_cpu_ms_per_step: Option<f64>,
    /// The gateway's store calls per measured run, by operation.
    pub db: BTreeMap<String, DbOp>,
    /// The whole machine while the measured runs ran: busy share of all its
    /// cores, percent (one run at a time keeps about one core busy; much
    /// more means other work shared the machine).
    pub machine_busy_pct: Option<f64>,
}

/// Makes `spec.warmup + spec.runs` runs one after the other, instant
/// answers, and splits each run's time.
pub async fn sequential(
    target: &RunTarget,
    backends: &Backends,
    spec: SequentialSpec,
) -> anyhow::Result<SequentialReport> {
    let k = spec.tool_calls;
    let steps = 2 * k + 1;
    let options = ClientOptions {
        request_timeout: Duration::from_secs(u64::from(target.run_timeout) + 30),
        ..ClientOptions::default()
    };
    let http = client::http_client(&options, 2)?;
    let mut agent = target.client(&http, &target.tenant(0), "runner")?;
    agent.initialize().await.map_err(|e| anyhow::anyhow!("initialize: {e}"))?;
    // Retried calls take more answers; unused ones are harmless.
    backends.script((spec.warmup + spec.runs) * (k + 1) * 2, k, Duration::ZERO);

    let mut windows = Vec::with_capacity(spec.runs);
    let mut failed = BTreeMap::new();
    let mut cpu_start = None;
    let mut db_start = BTreeMap::new();
    let mut machine_start = None;
    for i in 0..spec.warmup + spec.runs {
        if i == spec.warmup {
            db_start = read_db_operations(target).await;
            cpu_start = cpu_seconds(target.pid);
            machine_start = machine_ticks();
        }
        let session = format!("{}-seq{i}", target.run_id);
        let args = target.run_args(&session, &task(i));
        let start = Instant::now();
        let result = agent.call_tool(BRANCH_RUN, args, None).await;
        let end = Instant::now();
        if i < spec.warmup {
            continue;
        }
        let as_scripted = result.as_ref().is_ok_and(|v| {
            v.get("status").and_then(Value::as_str) == Some("completed")
                && v.get("steps").and_then(Value::as_u64) == u64::try_from(steps).ok()
        });
        if as_scripted {
            windows.push((start, end));
        } else {
            *failed.entry(ended_as(&result)).or_default() += 1;
        }
    }
    let cpu = cpu_start.zip(cpu_seconds(target.pid)).map(|(a, b)| b - a);
    let machine_busy_pct = busy_pct(machine_start, machine_ticks());
    let db = db_delta(&db_start, &read_db_operations(target).await, spec.runs);

    let model_server_ms = replay_model_requests(backends, k + 1).await;
    let model_ms = model_server_ms.as_ref().map_or(0.0, |s| s.p50);

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut walls = Vec::new();
    let mut per_step = Vec::new();
    let mut overhead = Vec::new();
    let mut upstream = Vec::new();
    let (mut first, mut model_to_tool, mut tool_to_model, mut last) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut unaligned = 0;
    for &(start, end) in &windows {
        let wall = ms(end - start);
        let models = backends.model_arrivals(start, end);
        let tools = backends.echo_calls(start, end);
        let tool_ms: f64 = tools.iter().map(|(at, done)| ms(*done - *at)).sum();
        upstream.extend(tools.iter().map(|(at, done)| ms(*done - *at)));
        walls.push(wall);
        per_step.push(wall / steps as f64);
        overhead.push((wall - tool_ms - model_ms * (k + 1) as f64) / steps as f64);
        let aligned = models.len() == k + 1
            && tools.len() == k
            && models.iter().enumerate().all(|(j, a)| a.done == j);
        if !aligned {
            unaligned += 1;
            continue;
        }
        first.push(ms(models[0].at - start));
        for j in 0..k {
            model_to_tool.push(ms(tools[j].0 - models[j].at));
            tool_to_model.push(ms(models[j + 1].at - tools[j].1));
        }
        last.push(ms(end - models[k].at));
    }
    // The CPU of every measured run, as scripted or not.
    let cpu_per_run = cpu.filter(|_| spec.runs > 0).map(|c| c * 1e3 / spec.runs as f64);
    Ok(SequentialReport {
        runs: spec.runs,
        warmup: spec.warmup,
        tool_calls: k,
        steps_per_run: steps,
        failed,
        wall_ms: Spread::of(&walls),
        wall_per_step_ms: Spread::of(&per_step),
        overhead_per_step_ms: Spread::of(&overhead),
        upstream_ms: Spread::of(&upstream),
        model_server_ms,
        timeline: Timeline {
            call_to_first_model_ms: Spread::of(&first),
            model_to_tool_ms: Spread::of(&model_to_tool),
            tool_to_model_ms: Spread::of(&tool_to_model),
            last_model_to_result_ms: Spread::of(&last),
        },
        unaligned,
        gateway_cpu_ms_per_run: cpu_per_run,
        gateway_cpu_ms_per_step: cpu_per_run.map(|c| c / steps as f64),
        db,
        machine_busy_pct,
    })
}

/// Sends the last `per_run` model requests the model server received (the
/// last run's) to it again, directly, `REPLAYS` times each: what the model
/// server takes per request, this client and loopback included.
async fn replay_model_requests(backends: &Backends, per_run: usize) -> Option<Spread> {
    let requests = backends.model.requests();
    let last = requests.get(requests.len().checked_sub(per_run)?..)?.to_vec();
    let http = client::http_client(&ClientOptions::default(), 2).ok()?;
    backends.script(last.len() * (REPLAYS + 1), per_run - 1, Duration::ZERO);
    let mut times = Vec::with_capacity(last.len() * REPLAYS);
    for round in 0..=REPLAYS {
        for request in &last {
            let path = match request.provider {
                Provider::OpenAi => "chat/completions",
                Provider::Anthropic => "messages",
            };
            let started = Instant::now();
            let sent = http
                .post(format!("{}{path}", backends.model.base_url()))
                .header("content-type", "application/json")
                .body(request.body.to_string())
                .send()
                .await;
            let Ok(response) = sent else { return None };
            if !response.status().is_success() || response.bytes().await.is_err() {
                return None;
            }
            // The first round opens the connection and is not counted.
            if round > 0 {
                times.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Spread::of(&times)
}

// ------------------------------------------------------------------------
// Many at once

/// One level of runs in flight at once.
#[derive(Debug, Clone, Copy)]
pub struct ConcurrentSpec {
    pub runs: usize,
    pub tool_calls: usize,
    /// How long each model answer takes.
    pub model_delay: Duration,
    /// Pause between two `branch_status` calls of the probe.
    pub status_interval: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConcurrentReport {
    pub runs: usize,
    pub tool_calls: usize,
    pub model_delay_s: f64,
    /// A run's time if the gateway took none: its model calls' delays.
    pub ideal_s: f64,
    /// Runs whose result says `completed`.
    pub completed: usize,
    /// How the runs ended: status, or `error:<kind>`.
    pub ended: BTreeMap<String, usize>,
    /// Calls answered `running` (the gateway's answer deadline) whose
    /// outcome was then read with `branch_status`.
    pub answered_running: usize,
    /// From the first call to the last result.
    pub makespan_s: f64,
    /// Each run, from its call to its result.
    pub wall_s: Option<Spread>,
    /// From the start of the level to each run's first model request.
    pub first_model_call_s: Option<Spread>,
    /// Where each run's time beyond its model's went: from its call to its
    /// first model request; from a model answer (sent `model_delay` after
    /// the request arrived) to the next model request, the tool call and
    /// the steps' writes in between; from the last answer to the result.
    pub call_to_first_model_s: Option<Spread>,
    pub answer_to_next_model_s: Option<Spread>,
    pub last_answer_to_result_s: Option<Spread>,
    pub rss_mib_before: Option<f64>,
    pub rss_mib_peak: Option<f64>,
    /// The gateway's CPU over the level, in cores; and its busiest second.
    pub gateway_cores_mean: Option<f64>,
    pub gateway_cores_peak: Option<f64>,
    /// This process (clients, model server, upstream), in cores.
    pub bench_cores_mean: Option<f64>,
    /// The whole machine (Postgres included): busy share of all its cores
    /// over the level, percent.
    pub machine_busy_pct: Option<f64>,
    /// The gateway's pool, as `/metrics` shows it (sampled).
    pub pool_used_max: Option<u64>,
    pub pool_size_max: Option<u64>,
    /// Connections to the gateway's database in Postgres (sampled): all,
    /// and those running a statement.
    pub pg_connections_max: Option<u64>,
    pub pg_active_max: Option<u64>,
    /// What the gateway's Postgres connections were doing while its pool
    /// was fully used: backends seen per `state wait_event_type
    /// wait_event`, over those samples.
    pub pg_states: BTreeMap<String, u64>,
    /// Share of the samples in which every pooled connection was in use.
    pub pool_saturated_pct: Option<f64>,
    /// The whole machine's busiest second, percent of all its cores.
    pub machine_busy_peak_pct: Option<f64>,
    /// `branch_status` of a gateway-run branch, called meanwhile.
    pub status_ms: Option<Spread>,
    pub status_errors: BTreeMap<String, usize>,
    /// The gateway's store calls per run over the level (the status
    /// probe's included), by operation.
    pub db: BTreeMap<String, DbOp>,
}

/// What the sampler saw.
#[derive(Debug, Default)]
struct Samples {
    rss_kib: Vec<u64>,
    /// (time, gateway CPU seconds so far).
    cpu: Vec<(Instant, f64)>,
    pool_used: Vec<u64>,
    pool_size: Vec<u64>,
    pg_all: Vec<u64>,
    pg_active: Vec<u64>,
    /// Backends seen in each state (and wait event), over the samples
    /// taken while the pool was fully used.
    pg_states: BTreeMap<String, u64>,
    /// (time, (busy, total) clock ticks of the machine).
    machine: Vec<(Instant, (u64, u64))>,
}

/// Starts `spec.runs` runs at once and waits for them all, sampling the
/// gateway meanwhile.
pub async fn concurrent(
    target: &RunTarget,
    backends: &Backends,
    spec: ConcurrentSpec,
) -> anyhow::Result<ConcurrentReport> {
    let k = spec.tool_calls;
    let level = format!("{}-c{}", target.run_id, spec.runs);
    let options = ClientOptions {
        request_timeout: Duration::from_secs(u64::from(target.run_timeout) + 60),
        connect_timeout: Duration::from_secs(10),
    };
    let http = client::http_client(&options, usize::MAX)?;

    // Every client has made its handshake before the clock starts.
    let mut clients = Vec::with_capacity(spec.runs);
    for i in 0..spec.runs {
        clients.push(target.client(&http, &target.tenant(i), &format!("agent-{i}"))?);
    }
    let mut ready = Vec::with_capacity(spec.runs);
    let mut pending = clients.into_iter();
    loop {
        let mut batch = JoinSet::new();
        for mut c in pending.by_ref().take(INIT_AT_ONCE) {
            batch.spawn(async move { c.initialize().await.map(|_| c) });
        }
        if batch.is_empty() {
            break;
        }
        while let Some(done) = batch.join_next().await {
            ready.push(done?.map_err(|e| anyhow::anyhow!("initialize: {e}"))?);
        }
    }
    backends.script(spec.runs * (k + 1) * 2, k, spec.model_delay);

    // The probe: a run whose model call lasts until its session is ended,
    // started as a task (which names its branch at once), and a client
    // that asks for its status meanwhile.
    let marker = format!("[status probe {level}]");
    let hold = Duration::from_secs(u64::from(target.run_timeout) + 60);
    backends.model.script(&marker, [Reply::delayed(hold, Reply::text("probe", 100, 5))]);
    let probe_session = format!("{level}-probe");
    let probe_tenant = target.tenant(0);
    let probe_token = mint(&target.auth, &probe_tenant, "probe", &target.url)?;
    let probe_args = target.run_args(&probe_session, &format!("Hold the line {marker}"));
    let probe_branch = start_task(&http, &target.url, &probe_token, probe_args).await?;
    let mut status_client = target.client(&http, &probe_tenant, "probe")?;
    let by_branch = json!({"branch_id": probe_branch});
    let view = status_client.call_tool(BRANCH_STATUS, by_branch.clone(), None).await;
    if !view.as_ref().is_ok_and(|v| v.get("run").is_some_and(|r| !r.is_null())) {
        bail!("the status probe's run is not there: {view:?}");
    }

    let stop = CancellationToken::new();
    let sampler = tokio::spawn(sample(target.clone(), stop.clone()));
    let status_stop = stop.clone();
    let interval = spec.status_interval;
    let prober = tokio::spawn(async move {
        let mut times = Vec::new();
        let mut errors: BTreeMap<String, usize> = BTreeMap::new();
        while !status_stop.is_cancelled() {
            let started = Instant::now();
            match status_client.call_tool(BRANCH_STATUS, by_branch.clone(), None).await {
                Ok(_) => times.push(started.elapsed().as_secs_f64() * 1e3),
                Err(e) => *errors.entry(e.kind()).or_default() += 1,
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = status_stop.cancelled() => {}
            }
        }
        (times, errors, status_client)
    });
    let cpu_bench_start = cpu_seconds(std::process::id());
    let machine_start = machine_ticks();

    let db_start = read_db_operations(target).await;
    let level_start = Instant::now();
    let mut runs = JoinSet::new();
    for (i, mut c) in ready.into_iter().enumerate() {
        let args = target.run_args(&format!("{level}-r{i}"), &task(i));
        let deadline = Duration::from_secs(u64::from(target.run_timeout) + 30);
        runs.spawn(async move {
            let start = Instant::now();
            let mut result = c.call_tool(BRANCH_RUN, args, None).await;
            let mut waited = false;
            if let Ok(v) = &result
                && v.get("status").and_then(Value::as_str) == Some("running")
            {
                waited = true;
                result = outcome_later(&mut c, v, start + deadline).await;
            }
            (i, start, Instant::now(), result, waited)
        });
    }
    let mut ended: BTreeMap<String, usize> = BTreeMap::new();
    let mut walls = Vec::with_capacity(spec.runs);
    let mut last_end = level_start;
    let mut answered_running = 0;
    let mut spans = BTreeMap::new();
    while let Some(done) = runs.join_next().await {
        let (i, start, end, result, waited) = done?;
        *ended.entry(ended_as(&result)).or_default() += 1;
        spans.insert(i, (start, end));
        walls.push((end - start).as_secs_f64());
        last_end = last_end.max(end);
        answered_running += usize::from(waited);
    }
    let makespan = (last_end - level_start).as_secs_f64();
    let cpu_bench = cpu_bench_start.zip(cpu_seconds(std::process::id())).map(|(a, b)| b - a);
    let machine_busy_pct = busy_pct(machine_start, machine_ticks());
    let db = db_delta(&db_start, &read_db_operations(target).await, spec.runs);
    stop.cancel();
    let samples = sampler.await?;
    let (status_times, status_errors, mut status_client) = prober.await?;

    // End the probe's run.
    if let Err(e) =
        status_client.call_tool(SESSION_END, json!({"session_id": probe_session}), None).await
    {
        eprintln!("ending the status probe's session failed (its deadline will end it): {e}");
    }

    let arrivals = backends.model_arrivals(level_start, last_end);
    let firsts: Vec<f64> = arrivals
        .iter()
        .filter(|a| a.done == 0 && a.run.is_some())
        .map(|a| (a.at - level_start).as_secs_f64())
        .collect();
    // Each run's model requests, to split its time: before its first model
    // request, between an answer and the next request, after the last answer.
    let mut by_run: BTreeMap<usize, Vec<Arrival>> = BTreeMap::new();
    for a in &arrivals {
        if let Some(run) = a.run {
            by_run.entry(run).or_default().push(*a);
        }
    }
    let delay = spec.model_delay;
    let (mut before, mut between, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (start, end)) in &spans {
        let Some(models) = by_run.get(i) else { continue };
        if models.len() != k + 1 || models.iter().enumerate().any(|(j, a)| a.done != j) {
            continue;
        }
        let secs = |later: Instant, earlier: Instant| {
            later.saturating_duration_since(earlier).as_secs_f64()
        };
        before.push(secs(models[0].at, *start));
        for pair in models.windows(2) {
            between.push(secs(pair[1].at, pair[0].at + delay));
        }
        after.push(secs(*end, models[k].at + delay));
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let (cores_mean, cores_peak) = cores(&samples.cpu);
    Ok(ConcurrentReport {
        runs: spec.runs,
        tool_calls: k,
        model_delay_s: spec.model_delay.as_secs_f64(),
        ideal_s: spec.model_delay.as_secs_f64() * (k + 1) as f64,
        completed: ended.get("completed").copied().unwrap_or(0),
        ended,
        answered_running,
        makespan_s: makespan,
        wall_s: Spread::of(&walls),
        first_model_call_s: Spread::of(&firsts),
        call_to_first_model_s: Spread::of(&before),
        answer_to_next_model_s: Spread::of(&between),
        last_answer_to_result_s: Spread::of(&after),
        rss_mib_before: samples.rss_kib.first().map(|k| mib(*k)),
        rss_mib_peak: samples.rss_kib.iter().max().map(|k| mib(*k)),
        gateway_cores_mean: cores_mean,
        gateway_cores_peak: cores_peak,
        bench_cores_mean: cpu_bench.map(|c| c / makespan.max(f64::EPSILON)),
        machine_busy_pct,
        pool_used_max: samples.pool_used.iter().max().copied(),
        pool_size_max: samples.pool_size.iter().max().copied(),
        pg_connections_max: samples.pg_all.iter().max().copied(),
        pg_active_max: samples.pg_active.iter().max().copied(),
        pg_states: samples.pg_states,
        pool_saturated_pct: (!samples.pool_used.is_empty()).then(|| {
            let full = samples
                .pool_used
                .iter()
                .zip(&samples.pool_size)
                .filter(|(u, s)| **s > 0 && u >= s)
                .count();
            full as f64 * 100.0 / samples.pool_used.len() as f64
        }),
        machine_busy_peak_pct: {
            let busy: Vec<(Instant, f64)> =
                samples.machine.iter().map(|(at, (b, _))| (*at, *b as f64)).collect();
            let total: Vec<(Instant, f64)> =
                samples.machine.iter().map(|(at, (_, t))| (*at, *t as f64)).collect();
            peak_share(&busy, &total)
        },
        status_ms: Spread::of(&status_times),
        status_errors,
        db,
    })
}

/// Starts a run as a task (the tasks extension, protocol 2026-07-28, which
/// carries the client's capabilities in each request): the gateway answers
/// at once with the task, whose id is the branch's.
async fn start_task(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    arguments: Value,
) -> anyhow::Result<String> {
    const VERSION: &str = "2026-07-28";
    let params = json!({
        "name": BRANCH_RUN,
        "arguments": arguments,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities":
                {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        },
    });
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let reply = http
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .header("mcp-method", "tools/call")
        .header("mcp-name", BRANCH_RUN)
        .body(body.to_string())
        .send()
        .await?;
    let status = reply.status();
    let text = reply.text().await?;
    let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    match answer.pointer("/result/taskId").and_then(Value::as_str) {
        Some(id) if status.is_success() => Ok(id.to_owned()),
        _ => bail!("starting a run as a task: HTTP {status}: {text}"),
    }
}

/// The outcome of a run whose call was answered `running`: read from
/// `branch_status` once a second until it is there or `until` passes.
async fn outcome_later(
    client: &mut McpClient,
    running: &Value,
    until: Instant,
) -> Result<Value, CallError> {
    let id = running.get("branch_id").cloned().unwrap_or(Value::Null);
    loop {
        let view = client.call_tool(BRANCH_STATUS, json!({"branch_id": id}), None).await?;
        if let Some(outcome) = view.get("run").and_then(|r| r.get("outcome"))
            && !outcome.is_null()
        {
            return Ok(outcome.clone());
        }
        if Instant::now() >= until {
            return Ok(json!({"status": "lost"}));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Samples the gateway until `stop`: memory and CPU every
/// [`SAMPLE_EVERY`], its pool and its Postgres connections every other
/// time.
async fn sample(target: RunTarget, stop: CancellationToken) -> Samples {
    let mut samples = Samples::default();
    let http = client::http_client(&ClientOptions::default(), 1).ok();
    let pg = match &target.postgres_url {
        Some(url) => sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .map_err(|e| eprintln!("counting database connections: {e}"))
            .ok(),
        None => None,
    };
    let mut ticker = tokio::time::interval(SAMPLE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick = 0_u64;
    loop {
        let stopping = tokio::select! {
            _ = ticker.tick() => false,
            () = stop.cancelled() => true,
        };
        if let Some(kib) = rss_kib(target.pid) {
            samples.rss_kib.push(kib);
        }
        if let Some(cpu) = cpu_seconds(target.pid) {
            samples.cpu.push((Instant::now(), cpu));
        }
        if let Some(ticks) = machine_ticks() {
            samples.machine.push((Instant::now(), ticks));
        }
        if tick.is_multiple_of(2) {
            let mut saturated = false;
            if let (Some(http), Some(ops)) = (&http, &target.ops_url)
                && let Ok(response) = http.get(format!("{ops}/metrics")).send().await
                && let Ok(text) = response.text().await
            {
                let (used, size) = pool_usage(&text);
                saturated = used.zip(size).is_some_and(|(u, s)| s > 0 && u >= s);
                samples.pool_used.extend(used);
                samples.pool_size.extend(size);
            }
            if let Some(pg) = &pg {
                let counted: Result<(i64, i64), _> = sqlx::query_as(
                    "SELECT count(*), count(*) FILTER (WHERE state = 'active') \
                     FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .fetch_one(pg)
                .await;
                if let Ok((all, active)) = counted {
                    samples.pg_all.push(u64::try_from(all).unwrap_or(0));
                    samples.pg_active.push(u64::try_from(active).unwrap_or(0));
                }
                let states: Result<Vec<(String, i64)>, _> = sqlx::query_as(
                    "SELECT concat_ws(' ', coalesce(state, '?'), wait_event_type, wait_event), \
                     count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1",
                )
                .fetch_all(pg)
                .await;
                for (state, n) in states.unwrap_or_default().into_iter().filter(|_| saturated) {
                    *samples.pg_states.entry(state).or_default() += u64::try_from(n).unwrap_or(0);
                }
            }
        }
        tick += 1;
        if stopping {
            if let Some(pg) = pg {
                pg.close().await;
            }
            return samples;
        }
    }
}

/// The machine's busy share between two readings of its clock ticks,
/// percent.
fn busy_pct(start: Option<(u64, u64)>, end: Option<(u64, u64)>) -> Option<f64> {
    let ((b0, t0), (b1, t1)) = start.zip(end)?;
    (t1 > t0).then(|| b1.saturating_sub(b0) as f64 * 100.0 / (t1 - t0) as f64)
}

/// The highest ratio of `part` to `whole` growth over any second of two
/// series sampled at the same instants, percent.
fn peak_share(part: &[(Instant, f64)], whole: &[(Instant, f64)]) -> Option<f64> {
    let mut peak: Option<f64> = None;
    for i in 0..part.len().min(whole.len()) {
        let Some(j) = (i..part.len().min(whole.len()))
            .find(|&j| part[j].0 - part[i].0 >= Duration::from_secs(1))
        else {
            break;
        };
        let grown = whole[j].1 - whole[i].1;
        if grown > 0.0 {
            let share = (part[j].1 - part[i].1) * 100.0 / grown;
            peak = Some(peak.map_or(share, |p| p.max(share)));
        }
    }
    peak
}

/// A process' resident memory (`VmRSS`), KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// Mean cores over the whole series, and the most over any second of it.
fn cores(series: &[(Instant, f64)]) -> (Option<f64>, Option<f64>) {
    let (Some(first), Some(last)) = (series.first(), series.last()) else { return (None, None) };
    let span = (last.0 - first.0).as_secs_f64();
    let mean = (span > 0.0).then(|| (last.1 - first.1) / span);
    let mut peak: Option<f64> = None;
    for (i, a) in series.iter().enumerate() {
        if let Some(b) = series[i..].iter().find(|b| b.0 - a.0 >= Duration::from_secs(1)) {
            let rate = (b.1 - a.1) / (b.0 - a.0).as_secs_f64();
            peak = Some(peak.map_or(rate, |p| p.max(rate)));
        }
    }
    (mean, peak)
}

/// The pool's busy and open connections in a Prometheus text exposition
/// (`foldgate_db_pool_connections{state="used"|"idle"}`).
fn pool_usage(text: &str) -> (Option<u64>, Option<u64>) {
    let (mut used, mut idle) = (None, None);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("foldgate_db_pool_connections") else { continue };
        if !rest.starts_with('{') {
            continue;
        }
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        let value = value.map(|v| v as u64);
        if rest.contains("state=\"used\"") {
            used = value;
        } else if rest.contains("state=\"idle\"") {
            idle = value;
        }
    }
    (used, used.zip(idle).map(|(u, i)| u + i))
}

/// One store operation over a measured period, as the gateway timed it
/// (`foldgate.db.operation.duration`, waiting for a connection included).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DbOp {
    /// Calls per run.
    pub per_run: f64,
    /// Mean time per call, milliseconds.
    pub mean_ms: f64,
}

/// Calls and total seconds of each store operation so far, by
/// `db_operation_name`, from a Prometheus text exposition.
fn db_operations(text: &str) -> BTreeMap<String, (f64, f64)> {
    let mut ops: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        if !line.starts_with("foldgate_db_operation_duration") {
            continue;
        }
        let Some((name, rest)) = line.split_once('{') else { continue };
        let is_count = name.ends_with("_count");
        if !is_count && !name.ends_with("_sum") {
            continue;
        }
        let Some(op) = rest
            .split_once("db_operation_name=\"")
            .and_then(|(_, tail)| tail.split_once('"'))
            .map(|(op, _)| op.to_owned())
        else {
            continue;
        };
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let entry = ops.entry(op).or_default();
        if is_count {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    ops
}

/// The store operations between two readings, per run.
fn db_delta(
    before: &BTreeMap<String, (f64, f64)>,
    after: &BTreeMap<String, (f64, f64)>,
    runs: usize,
) -> BTreeMap<String, DbOp> {
    after
        .iter()
        .filter_map(|(op, (count, sum))| {
            let (c0, s0) = before.get(op).copied().unwrap_or_default();
            let calls = count - c0;
            (calls > 0.0).then(|| {
                let op_stats =
                    DbOp { per_run: calls / runs.max(1) as f64, mean_ms: (sum - s0) * 1e3 / calls };
                (op.clone(), op_stats)
            })
        })
        .collect()
}

/// The gateway's store operations so far (empty when `/metrics` cannot be
/// read).
async fn read_db_operations(target: &RunTarget) -> BTreeMap<String, (f64, f64)> {
    let Some(ops) = &target.ops_url else { return BTreeMap::new() };
    let Ok(http) = client::http_client(&ClientOptions::default(), 1) else {
        return BTreeMap::new();
    };
    match http.get(format!("{ops}/metrics")).send().await {
        Ok(response) => db_operations(&response.text().await.unwrap_or_default()),
        Err(_) => BTreeMap::new(),
    }
}

fn render_db(out: &mut String, ops: &BTreeMap<String, DbOp>) {
    if ops.is_empty() {
        return;
    }
    let mut sorted: Vec<_> = ops.iter().collect();
    sorted.sort_by(|a, b| b.1.per_run.total_cmp(&a.1.per_run));
    let listed: Vec<String> = sorted
        .iter()
        .map(|(op, s)| format!("{op} {:.1}× {:.2} ms", s.per_run, s.mean_ms))
        .collect();
    let _ = writeln!(out, "  store calls per run (mean time): {}", listed.join(", "));
}

// ------------------------------------------------------------------------
// The report

#[derive(Debug, Clone, Serialize)]
pub struct RunsReport {
    pub machine_before: Machine,
    pub machine_after: Machine,
    pub run_id: String,
    pub model_api: ModelApi,
    pub stream: bool,
    /// `postgres` or `sqlite`.
    pub database: String,
    pub tenants: usize,
    /// The gateway's pool size, when the bench set it.
    pub max_connections: Option<u32>,
    pub sequential: Option<SequentialReport>,
    pub concurrent: Vec<ConcurrentReport>,
}

fn spread(s: Option<&Spread>, scale: f64, digits: usize) -> String {
    match s {
        Some(s) => format!(
            "{:.d$} / {:.d$} / {:.d$} (n={})",
            s.p50 * scale,
            s.p99 * scale,
            s.max * scale,
            s.n,
            d = digits
        ),
        None => "—".to_owned(),
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| v.to_string())
}

impl RunsReport {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "branch_run on {} ({} API{}), {} tenants, pool {}; before: {}; after: {}",
            self.database,
            self.model_api.as_str(),
            if self.stream { ", streamed" } else { "" },
            self.tenants,
            self.max_connections.map_or_else(|| "10 (default)".to_owned(), |n| n.to_string()),
            self.machine_before.line(),
            self.machine_after.line(),
        );
        if let Some(s) = &self.sequential {
            let _ = writeln!(
                out,
                "\none at a time: {} runs of {} tool calls ({} steps each), {} warm-up; \
                 figures p50 / p99 / max",
                s.runs, s.tool_calls, s.steps_per_run, s.warmup
            );
            if !s.failed.is_empty() {
                let _ = writeln!(out, "  not as scripted: {:?}", s.failed);
            }
            let rows = [
                ("run, call to result", &s.wall_ms),
                ("per step, nothing subtracted", &s.wall_per_step_ms),
                ("per step, gateway overhead", &s.overhead_per_step_ms),
                ("upstream per tool call (its side)", &s.upstream_ms),
                ("model server per call (direct)", &s.model_server_ms),
                ("call → first model request", &s.timeline.call_to_first_model_ms),
                ("model request → its tool call", &s.timeline.model_to_tool_ms),
                ("tool answered → next model request", &s.timeline.tool_to_model_ms),
                ("last model request → result", &s.timeline.last_model_to_result_ms),
            ];
            for (name, value) in rows {
                let _ = writeln!(out, "  {name:<38} {} ms", spread(value.as_ref(), 1.0, 3));
            }
            let _ = writeln!(
                out,
                "  gateway CPU: {} ms per run, {} ms per step; machine {}% busy; {} runs left out \
                 of the timeline",
                opt(s.gateway_cpu_ms_per_run.map(|v| format!("{v:.2}"))),
                opt(s.gateway_cpu_ms_per_step.map(|v| format!("{v:.3}"))),
                opt(s.machine_busy_pct.map(|v| format!("{v:.0}"))),
                s.unaligned
            );
            render_db(&mut out, &s.db);
        }
        for c in &self.concurrent {
            let _ = writeln!(
                out,
                "\n{} runs at once, {} tool calls, model answers {:.1} s late (ideal run {:.1} s)",
                c.runs, c.tool_calls, c.model_delay_s, c.ideal_s
            );
            let _ = writeln!(
                out,
                "  completed {}/{}; ended {:?}; answered `running` then read: {}",
                c.completed, c.runs, c.ended, c.answered_running
            );
            let _ = writeln!(
                out,
                "  all done in {:.2} s; run p50 / p99 / max {} s; first model request {} s",
                c.makespan_s,
                spread(c.wall_s.as_ref(), 1.0, 2),
                spread(c.first_model_call_s.as_ref(), 1.0, 2)
            );
            let _ = writeln!(
                out,
                "  per run: call → first model request {} s; answer → next model request {} s; \
                 last answer → result {} s",
                spread(c.call_to_first_model_s.as_ref(), 1.0, 3),
                spread(c.answer_to_next_model_s.as_ref(), 1.0, 3),
                spread(c.last_answer_to_result_s.as_ref(), 1.0, 3),
            );
            let _ = writeln!(
                out,
                "  gateway RSS {} → {} MiB peak; CPU {} cores mean, {} peak second; bench {} cores; \
                 machine {}% busy, {}% in its busiest second",
                opt(c.rss_mib_before.map(|v| format!("{v:.1}"))),
                opt(c.rss_mib_peak.map(|v| format!("{v:.1}"))),
                opt(c.gateway_cores_mean.map(|v| format!("{v:.2}"))),
                opt(c.gateway_cores_peak.map(|v| format!("{v:.2}"))),
                opt(c.bench_cores_mean.map(|v| format!("{v:.2}"))),
                opt(c.machine_busy_pct.map(|v| format!("{v:.0}"))),
                opt(c.machine_busy_peak_pct.map(|v| format!("{v:.0}"))),
            );
            let _ = writeln!(
                out,
                "  pool: {} used at most (of {} open), all in use in {}% of samples; \
                 Postgres connections {} ({} active at most)",
                opt(c.pool_used_max),
                opt(c.pool_size_max),
                opt(c.pool_saturated_pct.map(|v| format!("{v:.0}"))),
                opt(c.pg_connections_max),
                opt(c.pg_active_max)
            );
            if !c.pg_states.is_empty() {
                let seen: u64 = c.pg_states.values().sum();
                let mut states: Vec<_> = c.pg_states.iter().collect();
                states.sort_by(|a, b| b.1.cmp(a.1));
                let listed: Vec<String> = states
                    .iter()
                    .map(|(state, n)| format!("{state} {:.0}%", **n as f64 * 100.0 / seen as f64))
                    .collect();
                let _ = writeln!(
                    out,
                    "  Postgres connections while the pool was full: {}",
                    listed.join(", ")
                );
            }
            let _ = writeln!(
                out,
                "  branch_status meanwhile p50 / p99 / max {} ms; errors {:?}",
                spread(c.status_ms.as_ref(), 1.0, 2),
                c.status_errors
            );
            render_db(&mut out, &c.db);
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn tool_results_are_counted_in_both_formats() {
        let openai = json!({"messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "tool_calls": [{"id": "call_0"}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "call_1"}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "y"},
        ]});
        assert_eq!(tool_results(&openai), 2);
        let anthropic = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "task"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_0"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_0"}]},
        ]});
        assert_eq!(tool_results(&anthropic), 1);
        assert_eq!(tool_results(&json!({"messages": "nope"})), 0);
    }

    #[test]
    fn requests_name_their_run() {
        let body =
            json!({"messages": [{"role": "user", "content": format!("Task: {}", task(17))}]});
        assert_eq!(run_number(&body), Some(17));
        assert_eq!(run_number(&json!({"messages": [{"content": "Hold the line"}]})), None);
    }

    #[test]
    fn the_script_calls_tools_then_answers() {
        assert!(
            matches!(answer(0, 2), Reply::ToolCalls { ref calls, .. } if calls[0].name == "echo__echo")
        );
        assert!(matches!(answer(1, 2), Reply::ToolCalls { .. }));
        assert!(matches!(answer(2, 2), Reply::Text { ref text, .. } if text == FINDING));
    }

    #[test]
    fn pool_usage_is_read_from_metrics() {
        let text = "# HELP foldgate_db_pool_connections Database connections\n\
                    foldgate_db_pool_connections{state=\"used\",otel_scope_name=\"foldgate\"} 3\n\
                    foldgate_db_pool_connections{state=\"idle\",otel_scope_name=\"foldgate\"} 7\n\
                    foldgate_db_pool_connections_max{otel_scope_name=\"foldgate\"} 10\n";
        assert_eq!(pool_usage(text), (Some(3), Some(10)));
        assert_eq!(pool_usage("other 1\n"), (None, None));
    }

    #[test]
    fn store_operations_are_read_from_metrics() {
        let at = |count: f64, sum: f64| {
            format!(
                "foldgate_db_operation_duration_seconds_count{{db_operation_name=\"branch\",db_system_name=\"sqlite\"}} {count}\n\
                 foldgate_db_operation_duration_seconds_sum{{db_operation_name=\"branch\",db_system_name=\"sqlite\"}} {sum}\n\
                 foldgate_db_operation_duration_seconds_bucket{{db_operation_name=\"branch\",le=\"0.1\"}} {count}\n"
            )
        };
        let before = db_operations(&at(10.0, 0.01));
        assert_eq!(before["branch"], (10.0, 0.01));
        let after = db_operations(&at(30.0, 0.05));
        let delta = db_delta(&before, &after, 4);
        assert_eq!(delta["branch"].per_run, 5.0);
        assert!((delta["branch"].mean_ms - 2.0).abs() < 1e-9);
    }

    #[test]
    fn cores_are_cpu_seconds_per_second() {
        let t0 = Instant::now();
        let at = |ms: u64, cpu: f64| (t0 + Duration::from_millis(ms), cpu);
        let series = [at(0, 0.0), at(500, 0.2), at(1000, 0.5), at(1500, 1.7), at(2000, 2.0)];
        let (mean, peak) = cores(&series);
        assert!((mean.unwrap() - 1.0).abs() < 1e-9);
        assert!((peak.unwrap() - 1.5).abs() < 1e-9, "{peak:?}");
        assert_eq!(cores(&[]), (None, None));
    }
}
