//! The commands: each starts what it needs, runs, reports and checks.

use super::*;

/// The gateway to load: started here, or given by URL.
pub(super) struct Gateway {
    pub(super) target: Target,
    /// Kept running for the whole command.
    pub(super) _processes: Vec<Spawned>,
}

pub(super) async fn gateway(
    args: &GatewayArgs,
    extra_toml: String,
) -> anyhow::Result<Option<Gateway>> {
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

pub(super) fn workload(load: &LoadArgs, rate: Option<f64>, sample_default: Duration) -> Workload {
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
        inject_memories: load.inject_memories,
    }
}

pub(super) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
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

pub(super) async fn run_deadlines(args: DeadlineArgs) -> anyhow::Result<ExitCode> {
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

pub(super) async fn run_verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
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

pub(super) async fn run_slow(args: SlowArgs) -> anyhow::Result<ExitCode> {
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

pub(super) async fn run_runs(args: RunsArgs) -> anyhow::Result<ExitCode> {
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
