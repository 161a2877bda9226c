//! The `foldgate-bench` command line.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use crate::{
    client::ClientOptions,
    deadlines::{self, DeadlineSpec},
    echo,
    load::{self, Auth, Balance, Mode, Stop, Target, Workload},
    process::{self, GatewaySpawn, Spawned},
    report::{self, RunReport},
    runs::{self, ConcurrentSpec, ModelApi, RunTarget, RunsReport, SequentialSpec},
    slow::{self, SlowKind, SlowSpec},
    verify::{self, VerifyOptions},
};

/// Load generator, benchmarks and fault checks for foldgate.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive simulated agents against a gateway, and against the baseline
    /// echo server in the same run; print and save the figures.
    Run(Box<RunArgs>),
    /// Create many branches with short deadlines and check in the database
    /// that every one fired in time.
    Deadlines(Box<DeadlineArgs>),
    /// Check a run's branches in the database: none lost, none ended twice,
    /// deadlines in time, the books balanced. Exits 1 on a failed check.
    Verify(VerifyArgs),
    /// Open connections that stall or abandon their requests, and sample
    /// what they cost the server.
    SlowClients(SlowArgs),
    /// Gateway-run branches (`branch_run`) against a scripted model server
    /// and the echo server as upstream: the gateway's overhead per step
    /// (runs one at a time), then many runs in flight at once.
    Runs(Box<RunsArgs>),
    /// Serve the baseline: a bare rmcp server with one `echo` tool
    /// (Streamable HTTP, stateless, JSON responses). Prints its URL.
    EchoServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
}

/// Which gateway to load.
#[derive(Debug, Args)]
struct GatewayArgs {
    /// MCP URL of a running gateway. Repeat for several replicas; agents
    /// spread their requests over them (see --balance).
    #[arg(long = "url", value_name = "URL")]
    urls: Vec<String>,
    /// Start `foldgate serve` from this binary (on a free loopback port, with
    /// limits high enough to measure speed) instead of using --url.
    #[arg(long, value_name = "PATH", conflicts_with = "urls")]
    spawn_gateway: Option<PathBuf>,
    /// The database of the started gateway; for `deadlines`, also the one
    /// checked (Postgres).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// A configuration file for the started gateway instead of the bench's
    /// own (which raises the rate and branch limits).
    #[arg(long, value_name = "FILE", requires = "spawn_gateway")]
    gateway_config: Option<PathBuf>,
    /// Where the started gateway's log goes.
    #[arg(long, value_name = "FILE", requires = "spawn_gateway")]
    gateway_log: Option<PathBuf>,
    /// The gateway's HS256 secret; agents mint their tokens with it. A
    /// started gateway gets a random one by default.
    #[arg(long, env = "FOLDGATE_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// Token audience (default: each URL, the gateway's default audience).
    #[arg(long)]
    audience: Option<String>,
    /// Agents are spread over this many tenants (one subject each).
    #[arg(long, default_value_t = 4)]
    tenants: usize,
    /// PID of a gateway given by --url, to sample its memory and sockets.
    #[arg(long)]
    pid: Option<u32>,
}

/// What the agents do.
#[derive(Debug, Args)]
struct LoadArgs {
    #[arg(long, value_enum, default_value_t = Mode::Fold)]
    mode: Mode,
    /// Concurrent agents.
    #[arg(long, default_value_t = 16)]
    agents: usize,
    /// Measured time (after --warmup); ignored with --count.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Stop after this many fold cycles (fold mode) or calls (other modes).
    #[arg(long)]
    count: Option<u64>,
    /// Calls in this first period are made but not counted.
    #[arg(long, value_parser = parse_duration)]
    warmup: Option<Duration>,
    /// How requests spread over several --url.
    #[arg(long, value_enum, default_value_t = Balance::Request)]
    balance: Balance,
    /// `timeout_seconds` of the branches agents open.
    #[arg(long, default_value_t = 60)]
    branch_timeout: u32,
    /// Fold cycles per session before it is ended and a new one begins.
    #[arg(long, default_value_t = 10)]
    cycles_per_session: u32,
    /// Every n-th fold cycle leaves its two branches for the supervisor.
    #[arg(long)]
    abandon_every: Option<u32>,
    /// Upstream whose `echo` tool proxy mode calls (`<upstream>__echo`).
    #[arg(long, default_value = "echo")]
    upstream: String,
    /// Proxied calls per branch before it is returned and a new one opened.
    #[arg(long, default_value_t = 50)]
    calls_per_branch: u32,
    /// Longest time for one HTTP exchange.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// Pause after a connection failure or a 502/503.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    error_backoff: Duration,
    /// Prefix of tenants and sessions (default: random).
    #[arg(long)]
    run_id: Option<String>,
    /// Interval of throughput and resource samples.
    #[arg(long, value_parser = parse_duration)]
    sample_interval: Option<Duration>,
    /// Print throughput at every sample.
    #[arg(long)]
    progress: bool,
    /// Append every branch created and returned to this file (JSON lines),
    /// for `verify`.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    gateway: GatewayArgs,
    #[command(flatten)]
    load: LoadArgs,
    /// Also start the baseline echo server (a separate process) and load it
    /// with the same agents, before the gateway, in each round.
    #[arg(long)]
    baseline: bool,
    /// Load this running echo server as the baseline instead.
    #[arg(long, value_name = "URL", conflicts_with = "baseline")]
    baseline_url: Option<String>,
    /// Alternate baseline and gateway this many times; figures add up.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Open loop at --rate for --duration, sampling the gateway's memory,
    /// descriptors and sockets; reports their drift after --soak-warmup.
    #[arg(long, requires = "rate")]
    soak: bool,
    /// Calls per second of an open loop (all agents together).
    #[arg(long)]
    rate: Option<f64>,
    /// Samples before this are left out of the drift.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    soak_warmup: Duration,
    /// Write the report here (JSON).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Exit 2 if more than this many calls failed.
    #[arg(long)]
    max_errors: Option<u64>,
}

#[derive(Debug, Args)]
struct DeadlineArgs {
    #[command(flatten)]
    gateway: GatewayArgs,
    /// Branches to create.
    #[arg(long, default_value_t = 10_000)]
    branches: u64,
    /// Nested branches per session (at most the gateway's max_depth).
    #[arg(long, default_value_t = 1)]
    chain: u32,
    /// `timeout_seconds` of every branch.
    #[arg(long, default_value_t = 60)]
    timeout: u32,
    /// Concurrent creators.
    #[arg(long, default_value_t = 16)]
    agents: usize,
    /// Latest a deadline may fire.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    max_late: Duration,
    /// Wait this long after the last deadline before checking.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    grace: Duration,
    /// Fail if the gateway's resident memory went above this (MiB).
    #[arg(long, default_value_t = 150)]
    max_rss_mib: u64,
    #[arg(long)]
    run_id: Option<String>,
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RunsArgs {
    /// The gateway: --spawn-gateway is required (the bench writes its
    /// `[[models]]` and `[[upstreams]]`); without --database-url, a SQLite
    /// file in a temporary directory.
    #[command(flatten)]
    gateway: GatewayArgs,
    /// Runs made one at a time, to measure the overhead per step (0: none).
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// Runs made before those, not counted.
    #[arg(long, default_value_t = 5)]
    warmup_runs: usize,
    /// Tool calls per run made one at a time; each makes a model step and a
    /// tool step, and a final model step ends the run.
    #[arg(long, default_value_t = 5)]
    tool_calls: usize,
    /// Runs in flight at once, one level after the other: e.g.
    /// `50,200,1000`. None: no such level.
    #[arg(long, value_delimiter = ',')]
    concurrent: Vec<usize>,
    /// Tool calls per run of the concurrent levels.
    #[arg(long, default_value_t = 2)]
    concurrent_tool_calls: usize,
    /// How long each model answer takes in the concurrent levels.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    model_delay: Duration,
    /// Pause between two `branch_status` calls made while the concurrent
    /// runs work.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    status_interval: Duration,
    /// The provider API the gateway speaks to the model server.
    #[arg(long, value_enum, default_value_t = ModelApi::Openai)]
    provider: ModelApi,
    /// Ask the model server for streamed answers.
    #[arg(long)]
    stream: bool,
    /// `timeout_seconds` of every run.
    #[arg(long, default_value_t = 120)]
    run_timeout: u32,
    /// The started gateway's `database.max_connections` (default: the
    /// gateway's own, 10).
    #[arg(long)]
    max_connections: Option<u32>,
    /// Prefix of tenants and sessions (default: random).
    #[arg(long)]
    run_id: Option<String>,
    /// Write the report here (JSON).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// The gateway's database (Postgres).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// The run id the load used (--run-id).
    #[arg(long)]
    run_id: String,
    /// The load run's record (--record).
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Wait for branches whose deadline falls within this time to end
    /// (checking sooner if none is left).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    settle: Duration,
    /// Latest a deadline may fire while a gateway runs.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    max_late: Duration,
    /// A period with no gateway: START,END in Unix seconds (END = when the
    /// replacement was ready). Repeatable.
    #[arg(long, value_name = "START,END", value_parser = parse_outage)]
    outage: Vec<(f64, f64)>,
    /// Latest a deadline that passed during an outage may fire after it.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    restart_slack: Duration,
    /// Gateway logs (JSON lines) to check for branches ended twice.
    #[arg(long = "log", value_name = "FILE")]
    logs: Vec<PathBuf>,
    /// The database holds only this run: check the deployment counter too.
    #[arg(long)]
    whole_database: bool,
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct SlowArgs {
    /// The gateway's MCP URL.
    #[arg(long)]
    url: String,
    /// The gateway's process id (sampled).
    #[arg(long)]
    pid: u32,
    #[arg(long, env = "FOLDGATE_JWT_SECRET", hide_env_values = true)]
    jwt_secret: String,
    /// Token audience (default: the URL).
    #[arg(long)]
    audience: Option<String>,
    #[arg(long, value_enum)]
    kind: SlowKind,
    #[arg(long, default_value_t = 500)]
    connections: usize,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    hold: Duration,
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// `500ms`, `30s`, `30m`, `2h`, or plain seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let n: f64 = number.parse().map_err(|_| format!("{raw:?}: expected e.g. 500ms, 30s, 30m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{raw:?}: the unit must be ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{raw:?}: {e}"))
}

fn parse_outage(raw: &str) -> Result<(f64, f64), String> {
    let (start, end) = raw.split_once(',').ok_or("expected START,END")?;
    let parse = |s: &str| s.trim().parse::<f64>().map_err(|e| format!("{s:?}: {e}"));
    let (start, end) = (parse(start)?, parse(end)?);
    if end < start {
        return Err("the outage ends before it starts".into());
    }
    Ok((start, end))
}

fn random_id() -> String {
    // Short, and a valid prefix of tenant and session ids.
    format!("b{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

fn random_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Runs the command line.
pub async fn main() -> ExitCode {
    match run_cli(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("foldgate-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_cli(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Deadlines(args) => run_deadlines(*args).await,
        Command::Verify(args) => run_verify(args).await,
        Command::SlowClients(args) => run_slow(args).await,
        Command::Runs(args) => run_runs(*args).await,
        Command::EchoServer { listen } => {
            let server = echo::EchoServer::start(&listen).await?;
            println!("{}{}", crate::ECHO_ANNOUNCEMENT, server.url());
            shutdown_signal().await?;
            server.stop().await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    Ok(())
}

/// The gateway to load: started here, or given by URL.
struct Gateway {
    target: Target,
    /// Kept running for the whole command.
    _processes: Vec<Spawned>,
}

async fn gateway(args: &GatewayArgs, extra_toml: String) -> anyhow::Result<Option<Gateway>> {
    if let Some(binary) = &args.spawn_gateway {
        let database_url =
            args.database_url.clone().context("--spawn-gateway needs --database-url")?;
        let secret = args.jwt_secret.clone().unwrap_or_else(random_secret);
        let spawned = process::spawn_gateway(&GatewaySpawn {
            binary: binary.clone(),
            database_url,
            jwt_secret: secret.clone(),
            config: args.gateway_config.clone(),
            extra_toml,
            log: args.gateway_log.clone(),
            ops_listen: None,
        })
        .await?;
        eprintln!("started the gateway (pid {}) at {}", spawned.pid, spawned.url);
        let target = Target {
            name: "gateway".into(),
            urls: vec![spawned.url.clone()],
            auth: Some(Auth { secret, audience: args.audience.clone(), tenants: args.tenants }),
            pid: Some(spawned.pid),
        };
        return Ok(Some(Gateway { target, _processes: vec![spawned] }));
    }
    if args.urls.is_empty() {
        return Ok(None);
    }
    let secret =
        args.jwt_secret.clone().context("--url needs --jwt-secret (or FOLDGATE_JWT_SECRET)")?;
    Ok(Some(Gateway {
        target: Target {
            name: "gateway".into(),
            urls: args.urls.clone(),
            auth: Some(Auth { secret, audience: args.audience.clone(), tenants: args.tenants }),
            pid: args.pid,
        },
        _processes: Vec::new(),
    }))
}

fn workload(load: &LoadArgs, rate: Option<f64>, sample_default: Duration) -> Workload {
    let stop = match load.count {
        Some(n) => Stop::Count(n),
        None => Stop::Duration(load.duration),
    };
    let default_warmup = if load.count.is_some() || rate.is_some() {
        Duration::ZERO
    } else {
        Duration::from_secs(1)
    };
    Workload {
        mode: load.mode,
        agents: load.agents,
        stop,
        warmup: load.warmup.unwrap_or(default_warmup),
        rate,
        balance: load.balance,
        branch_timeout: load.branch_timeout,
        cycles_per_session: load.cycles_per_session.max(1),
        abandon_every: load.abandon_every,
        proxy_tool: format!("{}__{}", load.upstream, echo::TOOL),
        calls_per_branch: load.calls_per_branch,
        echo_tool: echo::TOOL.to_owned(),
        error_backoff: load.error_backoff,
        client: ClientOptions { request_timeout: load.request_timeout, ..ClientOptions::default() },
        run_id: load.run_id.clone().unwrap_or_else(random_id),
        sample_interval: load.sample_interval.unwrap_or(sample_default),
        progress: load.progress,
        record: load.record.clone(),
    }
}

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let machine_before = report::Machine::now();
    let started_at = chrono::Utc::now();
    if args.rate.is_some() && !args.soak {
        bail!("--rate is for --soak (an open loop)");
    }
    let rate = args.rate;
    let sample_default = if args.soak { Duration::from_secs(10) } else { Duration::from_secs(1) };
    let workload = workload(&args.load, rate, sample_default);

    // Proxy mode through a started gateway: the bench's echo server is
    // its upstream.
    let mut upstream = None;
    let mut extra_toml = String::new();
    if matches!(workload.mode, Mode::Proxy | Mode::ProxyOutside)
        && args.gateway.spawn_gateway.is_some()
    {
        let echo = process::spawn_echo_server().await?;
        extra_toml = format!(
            "[[upstreams]]\nname = {:?}\nurl = {:?}\ntimeout_seconds = 30\n",
            args.load.upstream, echo.url
        );
        upstream = Some(echo);
    }
    let gateway = gateway(&args.gateway, extra_toml).await?;
    let baseline_process =
        if args.baseline { Some(process::spawn_echo_server().await?) } else { None };
    let baseline = match (&baseline_process, &args.baseline_url) {
        (Some(p), _) => Some(Target {
            name: "baseline".into(),
            urls: vec![p.url.clone()],
            auth: None,
            pid: Some(p.pid),
        }),
        (None, Some(url)) => {
            Some(Target { name: "baseline".into(), urls: vec![url.clone()], auth: None, pid: None })
        }
        (None, None) => None,
    };
    if gateway.is_none() && baseline.is_none() {
        bail!("nothing to load: give --url, --spawn-gateway, --baseline or --baseline-url");
    }
    if args.soak && gateway.is_none() {
        bail!("--soak needs a gateway");
    }
    let baseline_workload =
        Workload { mode: Mode::Echo, rate: None, record: None, ..workload.clone() };

    let mut rounds = Vec::new();
    for round in 0..args.rounds.max(1) {
        if let Some(target) = baseline.as_ref().filter(|_| !args.soak) {
            eprintln!("round {}: baseline ({} agents, echo)", round + 1, workload.agents);
            rounds.push(load::run(target, &baseline_workload).await?);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if let Some(gateway) = &gateway {
            let mut w = workload.clone();
            // Each round its own tenants and sessions.
            if args.rounds > 1 {
                w.run_id = format!("{}r{}", workload.run_id, round + 1);
            }
            eprintln!("round {}: gateway ({} agents, {:?})", round + 1, w.agents, w.mode);
            rounds.push(load::run(&gateway.target, &w).await?);
        }
    }
    let report = RunReport::new(
        started_at,
        machine_before,
        &workload,
        args.rounds.max(1),
        args.soak.then_some(args.soak_warmup),
        rounds,
    );
    print!("{}", report.render());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    drop(upstream);
    let errors = report.gateway.as_ref().map_or(0, |g| g.measured.error_calls)
        + report.baseline.as_ref().map_or(0, |b| b.measured.error_calls);
    if args.max_errors.is_some_and(|max| errors > max) {
        eprintln!(
            "foldgate-bench: {errors} calls failed (at most {} allowed)",
            args.max_errors.unwrap_or(0)
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_deadlines(args: DeadlineArgs) -> anyhow::Result<ExitCode> {
    let machine_before = report::Machine::now();
    let database_url = args
        .gateway
        .database_url
        .clone()
        .context("--database-url (Postgres) is needed to check the deadlines")?;
    let gateway = gateway(&args.gateway, String::new())
        .await?
        .context("give --url (with --jwt-secret) or --spawn-gateway")?;
    let mut workload = Workload::new(Mode::Fold, args.run_id.clone().unwrap_or_else(random_id));
    workload.agents = args.agents;
    workload.client.request_timeout = Duration::from_secs(30);
    let spec = DeadlineSpec {
        branches: args.branches,
        chain: args.chain,
        timeout_seconds: args.timeout,
        agents: args.agents,
        max_late: args.max_late,
        grace: args.grace,
        database_url,
        sample_interval: Duration::from_secs(1),
    };
    let started = Instant::now();
    let outcome = deadlines::run(&gateway.target, &workload, &spec).await?;
    let rss_ok = outcome.max_rss_kib.is_none_or(|kib| kib <= args.max_rss_mib * 1024);
    let all_fired = outcome.verification.fired as u64
        + outcome.verification.by_status.get("failed/parent_returning").copied().unwrap_or(0)
        >= outcome.created;
    let passed = outcome.verification.passed() && rss_ok && all_fired && outcome.create_errors == 0;
    let report = report::DeadlineRun {
        machine_before,
        machine_after: report::Machine::now(),
        run_id: workload.run_id.clone(),
        seconds: started.elapsed().as_secs_f64(),
        max_rss_mib_allowed: args.max_rss_mib,
        passed,
        outcome,
    };
    print!("{}", report.render());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn run_verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let at = |secs: f64| {
        chrono::DateTime::<chrono::Utc>::from_timestamp_micros((secs * 1e6) as i64)
            .context("an outage time out of range")
    };
    let mut outages = Vec::new();
    for (start, end) in &args.outage {
        outages.push((at(*start)?, at(*end)?));
    }
    let verification = verify::verify(&VerifyOptions {
        database_url: args.database_url,
        run_id: args.run_id,
        record: args.record,
        settle: args.settle,
        max_late: args.max_late,
        outages,
        restart_slack: args.restart_slack,
        logs: args.logs,
        whole_database: args.whole_database,
    })
    .await?;
    print!("{}", report::render_verification(&verification));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&verification)?)?;
    }
    Ok(if verification.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn run_slow(args: SlowArgs) -> anyhow::Result<ExitCode> {
    let auth = Auth { secret: args.jwt_secret, audience: args.audience, tenants: 1 };
    let token = load::mint(&auth, "slow-clients", "prober", &args.url)?;
    let outcome = slow::run(&SlowSpec {
        url: args.url,
        token,
        kind: args.kind,
        connections: args.connections,
        hold: args.hold,
        pid: args.pid,
    })
    .await?;
    print!("{}", report::render_slow(&outcome));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&outcome)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_runs(args: RunsArgs) -> anyhow::Result<ExitCode> {
    let machine_before = report::Machine::now();
    let binary = args
        .gateway
        .spawn_gateway
        .clone()
        .context("runs needs --spawn-gateway: the bench configures the gateway's model")?;
    if args.gateway.gateway_config.is_some() {
        bail!("runs writes the gateway's configuration itself; --gateway-config is not taken");
    }
    let backends = runs::Backends::start().await?;
    let dir = tempfile::tempdir()?;
    let database_url = match &args.gateway.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}", dir.path().join("foldgate.db").display()),
    };
    let postgres = database_url.starts_with("postgres");
    let ops_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let secret = args.gateway.jwt_secret.clone().unwrap_or_else(random_secret);
    let spawned = process::spawn_gateway(&GatewaySpawn {
        binary,
        database_url: database_url.clone(),
        jwt_secret: secret.clone(),
        config: None,
        extra_toml: match args.max_connections {
            Some(n) => format!(
                "[database]\nmax_connections = {n}\n\n{}",
                backends.gateway_toml(args.provider, args.stream)
            ),
            None => backends.gateway_toml(args.provider, args.stream),
        },
        log: args.gateway.gateway_log.clone(),
        ops_listen: Some(format!("127.0.0.1:{ops_port}")),
    })
    .await?;
    eprintln!("started the gateway (pid {}) at {}", spawned.pid, spawned.url);
    let target = RunTarget {
        url: spawned.url.clone(),
        ops_url: Some(format!("http://127.0.0.1:{ops_port}")),
        pid: spawned.pid,
        auth: Auth {
            secret,
            audience: args.gateway.audience.clone(),
            tenants: args.gateway.tenants,
        },
        run_id: args.run_id.clone().unwrap_or_else(random_id),
        run_timeout: args.run_timeout,
        postgres_url: postgres.then(|| database_url.clone()),
    };
    runs::wait_for_upstream(&target).await?;

    let sequential = if args.runs > 0 {
        eprintln!("{} runs one at a time, {} tool calls each", args.runs, args.tool_calls);
        let spec = SequentialSpec {
            runs: args.runs,
            warmup: args.warmup_runs,
            tool_calls: args.tool_calls,
        };
        Some(runs::sequential(&target, &backends, spec).await?)
    } else {
        None
    };
    let mut concurrent = Vec::new();
    for &n in args.concurrent.iter().filter(|n| **n > 0) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        eprintln!("{n} runs at once");
        let spec = ConcurrentSpec {
            runs: n,
            tool_calls: args.concurrent_tool_calls,
            model_delay: args.model_delay,
            status_interval: args.status_interval,
        };
        let level = runs::concurrent(&target, &backends, spec).await?;
        let all_done = level.completed == n;
        concurrent.push(level);
        if !all_done {
            eprintln!("not every run completed at {n}: no higher level");
            break;
        }
    }
    let report = RunsReport {
        machine_before,
        machine_after: report::Machine::now(),
        run_id: target.run_id.clone(),
        model_api: args.provider,
        stream: args.stream,
        database: if postgres { "postgres" } else { "sqlite" }.to_owned(),
        tenants: args.gateway.tenants,
        max_connections: args.max_connections,
        sequential,
        concurrent,
    };
    print!("{}", report.render());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    spawned.kill().await?;
    backends.stop().await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("500ms", Some(Duration::from_millis(500))),
            ("30s", Some(Duration::from_secs(30))),
            ("30", Some(Duration::from_secs(30))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("30m", Some(Duration::from_secs(1800))),
            ("2h", Some(Duration::from_secs(7200))),
            ("3d", None),
            ("s", None),
        ];
        for (raw, expected) in cases {
            assert_eq!(parse_duration(raw).ok(), expected, "{raw}");
        }
        assert_eq!(parse_outage("10.5,12"), Ok((10.5, 12.0)));
        assert!(parse_outage("12,10").is_err());
    }
}
