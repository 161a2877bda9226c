//! Many runs at once, each model answer delayed.

use super::*;

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
pub(super) async fn start_task(
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
pub(super) async fn outcome_later(
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
