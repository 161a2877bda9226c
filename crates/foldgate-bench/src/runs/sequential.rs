//! Runs one at a time with instant answers: the gateway's overhead per step.

use super::*;

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
pub(super) async fn replay_model_requests(backends: &Backends, per_run: usize) -> Option<Spread> {
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
