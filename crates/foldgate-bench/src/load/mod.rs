//! Simulated agents: each holds its own MCP clients and JWTs and runs one
//! kind of work in a loop, closed (the next call starts when the last one
//! ended) or paced (open loop: calls are due at a fixed rate, and latency
//! counts from when a call was due, so queueing is not hidden).

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use foldgate_api::{
    auth::{Secret, mint_hs256},
    names,
};
use foldgate_domain::{Subject, TenantId};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::{io::AsyncWriteExt, sync::Semaphore};
use tokio_util::sync::CancellationToken;

use crate::{
    client::{CallError, ClientOptions, McpClient},
    process::{CpuMark, CpuUse, ProcSample, sample_until},
    stats::{Live, Measured, Recorder},
};

mod agent;

use self::agent::*;
pub use foldgate_api::names::{
    BRANCH_CREATE, BRANCH_META_KEY, BRANCH_RETURN, BRANCH_STATUS, SESSION_END,
};

/// How long a URL that refused a connection is skipped, when there are
/// others; doubled for each failure in a row, up to `MAX_STRIKES` times.
const EJECTION: Duration = Duration::from_secs(2);
const MAX_STRIKES: u32 = 5;

/// What each agent does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Fold cycles: create, status, nested create, return the child, return
    /// the parent.
    Fold,
    /// `branch_status` of a branch the agent opened at the start.
    Status,
    /// Upstream tool calls through the gateway, metered to a branch the
    /// agent opens (and replaces every `calls_per_branch` calls).
    Proxy,
    /// Upstream tool calls through the gateway outside any branch: the agent
    /// has no open session, so the gateway only adds the call to its
    /// per-tenant usage.
    ProxyOutside,
    /// Calls of a plain `echo` tool (the baseline server's).
    Echo,
}

/// How agents spread over several URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// Each request goes to the next URL, like a round-robin load balancer
    /// (one that refused a connection is skipped for 2 s, doubling up to
    /// 32 s while it keeps refusing).
    Request,
    /// Each agent keeps to one URL.
    Agent,
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stop {
    /// After this long (plus the warm-up).
    Duration(#[serde(with = "secs")] Duration),
    /// After this many units of work: fold cycles, or calls in the other
    /// modes.
    Count(u64),
}

mod secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// How agents authenticate to a gateway.
#[derive(Debug, Clone)]
pub struct Auth {
    /// The gateway's HS256 secret.
    pub secret: String,
    /// The token audience; by default each URL is its own audience (the
    /// gateway's default).
    pub audience: Option<String>,
    /// Agents are spread over this many tenants.
    pub tenants: usize,
}

/// A server under load.
#[derive(Debug, Clone)]
pub struct Target {
    /// `gateway` or `baseline`, in reports.
    pub name: String,
    pub urls: Vec<String>,
    /// `None`: no `Authorization` header (the baseline).
    pub auth: Option<Auth>,
    /// The server process, for resource samples.
    pub pid: Option<u32>,
}

/// What the agents do and for how long.
#[derive(Debug, Clone)]
pub struct Workload {
    pub mode: Mode,
    pub agents: usize,
    pub stop: Stop,
    /// Calls started during the warm-up are made but not counted.
    pub warmup: Duration,
    /// Open loop at this many calls per second; `None` for a closed loop.
    pub rate: Option<f64>,
    pub balance: Balance,
    /// `timeout_seconds` of the branches agents open.
    pub branch_timeout: u32,
    /// Fold cycles per session; then the session is ended and a new one
    /// begins.
    pub cycles_per_session: u32,
    /// Every n-th fold cycle (counting all agents' cycles) stops after the
    /// nested create and leaves both branches to the supervisor's deadline.
    pub abandon_every: Option<u32>,
    /// The tool proxied calls use (`<upstream>__<tool>`).
    pub proxy_tool: String,
    /// Proxied calls per branch.
    pub calls_per_branch: u32,
    /// The tool `echo` mode calls.
    pub echo_tool: String,
    /// Pause after a transport failure, so that a server that is down is
    /// not hammered by a loop of refused connections.
    pub error_backoff: Duration,
    pub client: ClientOptions,
    /// Prefixes tenants and sessions, so runs never share either.
    pub run_id: String,
    /// Interval of throughput (and resource) samples.
    pub sample_interval: Duration,
    /// Print each sample as it is taken.
    pub progress: bool,
    /// Where to write each branch created and returned (JSON lines), for
    /// later checks against the database.
    pub record: Option<PathBuf>,
    /// Lessons given to each tenant before the run, trusted and matching
    /// the branches agents open; with them every branch is opened with
    /// `inject_memories: true`. `None`: no memory.
    pub inject_memories: Option<u32>,
}

impl Workload {
    /// A closed-loop workload of `mode` with the defaults of the command
    /// line: 16 agents for 10 s.
    pub fn new(mode: Mode, run_id: String) -> Self {
        Self {
            mode,
            agents: 16,
            stop: Stop::Duration(Duration::from_secs(10)),
            warmup: Duration::ZERO,
            rate: None,
            balance: Balance::Request,
            branch_timeout: 60,
            cycles_per_session: 10,
            abandon_every: None,
            proxy_tool: "echo__echo".to_owned(),
            calls_per_branch: 50,
            echo_tool: crate::echo::TOOL.to_owned(),
            error_backoff: Duration::from_millis(50),
            client: ClientOptions::default(),
            run_id,
            sample_interval: Duration::from_secs(1),
            progress: false,
            record: None,
            inject_memories: None,
        }
    }

    /// The tenant agent `i` acts for.
    pub fn tenant(&self, i: usize, tenants: usize) -> String {
        format!("{}-t{}", self.run_id, i % tenants.max(1))
    }
}

/// Throughput over one sample interval.
#[derive(Debug, Clone, Serialize)]
pub struct Tick {
    /// Seconds since the run started (warm-up included).
    pub t_s: f64,
    pub ok_per_s: f64,
    pub errors_per_s: f64,
}

/// What a load run produced.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    pub target: String,
    pub urls: Vec<String>,
    #[serde(flatten)]
    pub measured: Measured,
    /// Throughput per sample interval.
    pub series: Vec<Tick>,
    /// Resource samples of the target process.
    pub process: Vec<ProcSample>,
    /// CPU used while calls were counted.
    pub cpu: CpuUse,
    #[serde(skip)]
    pub recorder: Recorder,
}

/// The shared state of a run.
struct Shared {
    workload: Workload,
    /// Where counted calls begin.
    measure_from: Instant,
    /// When the run stops (duration runs).
    end: Option<Instant>,
    /// Units of work left (count runs).
    remaining: AtomicI64,
    /// Fold cycles begun by all agents, numbering them.
    cycles: AtomicU64,
    stop: CancellationToken,
    pacer: Option<Pacer>,
    live: Live,
    record: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl Shared {
    /// Takes one unit of work; `false` when the run is over.
    fn claim(&self) -> bool {
        if self.stop.is_cancelled() || self.end.is_some_and(|end| Instant::now() >= end) {
            return false;
        }
        match self.workload.stop {
            Stop::Duration(_) => true,
            Stop::Count(_) => {
                if self.remaining.fetch_sub(1, Ordering::Relaxed) > 0 {
                    true
                } else {
                    self.stop.cancel();
                    false
                }
            }
        }
    }

    fn over(&self) -> bool {
        self.stop.is_cancelled() || self.end.is_some_and(|end| Instant::now() >= end)
    }
}

/// Issues calls at a fixed rate for an open loop: a task adds a permit
/// whenever a call falls due, and the `k`-th call taken was due at
/// `start + k / rate`.
struct Pacer {
    start: Instant,
    rate: f64,
    permits: Arc<Semaphore>,
    taken: AtomicU64,
}

impl Pacer {
    fn start(rate: f64, stop: CancellationToken) -> Self {
        let start = Instant::now();
        let permits = Arc::new(Semaphore::new(0));
        let issuer = Arc::clone(&permits);
        tokio::spawn(async move {
            let mut issued: u64 = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let due = (start.elapsed().as_secs_f64() * rate) as u64;
                if due > issued {
                    // At most Semaphore::MAX_PERMITS; a backlog that large
                    // has long stopped meaning anything.
                    let add = usize::try_from(due - issued).unwrap_or(usize::MAX).min(1 << 20);
                    issuer.add_permits(add);
                    issued = due;
                }
            }
        });
        Self { start, rate, permits, taken: AtomicU64::new(0) }
    }

    /// Waits until a call is due; returns when it was due.
    async fn next(&self, stop: &CancellationToken) -> Option<Instant> {
        let permit = tokio::select! {
            permit = self.permits.acquire() => permit.ok()?,
            () = stop.cancelled() => return None,
        };
        permit.forget();
        let k = self.taken.fetch_add(1, Ordering::Relaxed);
        Some(self.start + Duration::from_secs_f64(k as f64 / self.rate))
    }
}

/// Mints a token for agent `i` of a target: its tenant, subject
/// `agent-<i>`.
pub(crate) fn agent_token(
    auth: &Auth,
    workload: &Workload,
    i: usize,
    url: &str,
) -> anyhow::Result<String> {
    mint(auth, &workload.tenant(i, auth.tenants), &format!("agent-{i}"), url)
}

/// Gives each tenant `lessons` lessons that match the branches agents open
/// (`agent.rs`), each made trusted by three uses that helped, as three
/// other subjects of the tenant report them.
async fn seed_memories(target: &Target, workload: &Workload, lessons: u32) -> anyhow::Result<()> {
    let (Some(auth), Some(url)) = (&target.auth, target.urls.first()) else {
        anyhow::bail!("--inject-memories needs a gateway whose tokens the bench can mint");
    };
    for t in 0..auth.tenants {
        let tenant = workload.tenant(t, auth.tenants);
        let token = mint(auth, &tenant, "seeder", url)?;
        let mut client = McpClient::new(url, Some(&token), &workload.client)?;
        // A lesson's author cannot vouch for it: three others do.
        let mut voters = Vec::new();
        for v in 0..3 {
            let token = mint(auth, &tenant, &format!("voter-{v}"), url)?;
            voters.push(McpClient::new(url, Some(&token), &workload.client)?);
        }
        for k in 0..lessons {
            let item = client
                .call_tool(
                    names::MEMORY_RECORD,
                    json!({
                        "title": format!("Where HTTP retries are configured ({k})"),
                        "kind": "strategy",
                        "content": format!(
                            "HTTP retries are configured in config/http.rs: report the attempts \
                             and the backoff setting found there, then check the client builder \
                             in src/http/client.rs, which can override them (lesson {k})."
                        ),
                    }),
                    None,
                )
                .await
                .map_err(|e| anyhow::anyhow!("memory_record: {e}"))?;
            let id = item["item"]["id"].clone();
            for voter in &mut voters {
                voter
                    .call_tool(names::MEMORY_FEEDBACK, json!({"id": id, "helpful": true}), None)
                    .await
                    .map_err(|e| anyhow::anyhow!("memory_feedback: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Mints a token with both scopes for `tenant` and `subject`, valid a day,
/// for the gateway at `url`.
pub fn mint(auth: &Auth, tenant: &str, subject: &str, url: &str) -> anyhow::Result<String> {
    let audience = auth.audience.as_deref().unwrap_or(url);
    Ok(mint_hs256(
        &Secret::new(auth.secret.clone()),
        &TenantId::parse(tenant)?,
        &Subject::parse(subject)?,
        ["fold:read", "fold:write", "memory:read", "memory:write"],
        Duration::from_secs(24 * 3600),
        None,
        Some(audience),
    )?)
}

/// Runs the workload against a target and gathers its figures.
pub async fn run(target: &Target, workload: &Workload) -> anyhow::Result<LoadResult> {
    anyhow::ensure!(!target.urls.is_empty(), "no URL to load");
    anyhow::ensure!(workload.agents > 0, "at least one agent is needed");
    if let Some(lessons) = workload.inject_memories {
        seed_memories(target, workload, lessons).await?;
    }
    // Clients and tokens are made before the clock starts.
    let mut agents_clients = Vec::with_capacity(workload.agents);
    for i in 0..workload.agents {
        let mut clients = Vec::with_capacity(target.urls.len());
        for url in &target.urls {
            let token =
                target.auth.as_ref().map(|auth| agent_token(auth, workload, i, url)).transpose()?;
            clients.push(McpClient::new(url, token.as_deref(), &workload.client)?);
        }
        agents_clients.push(clients);
    }

    let (record_tx, record_task) = match &workload.record {
        Some(path) => {
            let file = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .await
                .with_context(|| format!("opening {}", path.display()))?;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
            let task = tokio::spawn(async move {
                let mut out = tokio::io::BufWriter::new(file);
                while let Some(line) = rx.recv().await {
                    out.write_all(line.as_bytes()).await?;
                    out.write_all(b"\n").await?;
                }
                out.flush().await
            });
            (Some(tx), Some(task))
        }
        None => (None, None),
    };

    let start = Instant::now();
    let measure_from = start + workload.warmup;
    let stop = CancellationToken::new();
    let shared = Arc::new(Shared {
        workload: workload.clone(),
        measure_from,
        end: match workload.stop {
            Stop::Duration(d) => Some(measure_from + d),
            Stop::Count(_) => None,
        },
        remaining: AtomicI64::new(match workload.stop {
            Stop::Count(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Stop::Duration(_) => i64::MAX,
        }),
        cycles: AtomicU64::new(0),
        pacer: workload.rate.map(|rate| Pacer::start(rate, stop.clone())),
        stop: stop.clone(),
        live: Live::default(),
        record: record_tx,
    });

    let sampler_stop = CancellationToken::new();
    let proc_task = target
        .pid
        .map(|pid| tokio::spawn(sample_until(pid, workload.sample_interval, sampler_stop.clone())));
    let ticks_task = tokio::spawn(ticks(Arc::clone(&shared), start, sampler_stop.clone()));
    if let Stop::Duration(_) = workload.stop {
        let stop = stop.clone();
        let end = measure_from
            + match workload.stop {
                Stop::Duration(d) => d,
                Stop::Count(_) => Duration::ZERO,
            };
        tokio::spawn(async move {
            tokio::time::sleep_until(end.into()).await;
            stop.cancel();
        });
    }

    let pid = target.pid;
    let cpu_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        CpuMark::now(pid)
    });
    let mut tasks = Vec::with_capacity(workload.agents);
    for (index, clients) in agents_clients.into_iter().enumerate() {
        let agent = Agent {
            index,
            next_client: index,
            ejected: vec![None; clients.len()],
            strikes: vec![0; clients.len()],
            clients,
            shared: Arc::clone(&shared),
            recorder: Recorder::default(),
            sessions: 0,
            session: String::new(),
        };
        let mut agent = agent;
        agent.new_session();
        tasks.push(tokio::spawn(agent.run()));
    }
    let mut recorder = Recorder::default();
    for task in tasks {
        recorder.merge(&task.await.context("an agent task failed")?);
    }
    let ended = Instant::now();
    let cpu_end = CpuMark::now(target.pid);
    stop.cancel();
    sampler_stop.cancel();
    let series = ticks_task.await.unwrap_or_default();
    let process = match proc_task {
        Some(task) => task.await.unwrap_or_default(),
        None => Vec::new(),
    };
    drop(shared);
    if let Some(task) = record_task {
        task.await.context("the record writer failed")??;
    }
    let measured = recorder.summary(ended.saturating_duration_since(measure_from));
    // A run that ended before its warm-up did has nothing to account.
    let cpu = match cpu_start.is_finished() {
        true => cpu_start.await.map_or_else(
            |_| CpuUse::default(),
            |start| start.until(&cpu_end, measured.elapsed_s, measured.ok_calls),
        ),
        false => {
            cpu_start.abort();
            CpuUse::default()
        }
    };
    Ok(LoadResult {
        target: target.name.clone(),
        urls: target.urls.clone(),
        measured,
        series,
        process,
        cpu,
        recorder,
    })
}

/// Samples throughput every interval until stopped.
async fn ticks(shared: Arc<Shared>, start: Instant, stop: CancellationToken) -> Vec<Tick> {
    let interval = shared.workload.sample_interval;
    let mut series = Vec::new();
    let mut last = (0, 0);
    let mut last_at = Instant::now();
    let mut ticker = tokio::time::interval_at((start + interval).into(), interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.cancelled() => return series,
        }
        let now = Instant::now();
        let (ok, errors) = shared.live.snapshot();
        let secs = now.duration_since(last_at).as_secs_f64().max(f64::EPSILON);
        let tick = Tick {
            t_s: now.duration_since(start).as_secs_f64(),
            ok_per_s: (ok - last.0) as f64 / secs,
            errors_per_s: (errors - last.1) as f64 / secs,
        };
        if shared.workload.progress {
            eprintln!(
                "[{:>7.1} s] {:>9.1} ok/s {:>8.1} errors/s",
                tick.t_s, tick.ok_per_s, tick.errors_per_s
            );
        }
        series.push(tick);
        last = (ok, errors);
        last_at = now;
    }
}
