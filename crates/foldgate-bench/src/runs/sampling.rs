//! The gateway sampled while runs go on: memory, CPU, its pool, its
//! database connections and its store calls.

use super::*;

/// What the sampler saw.
#[derive(Debug, Default)]
pub(super) struct Samples {
    pub(super) rss_kib: Vec<u64>,
    /// (time, gateway CPU seconds so far).
    pub(super) cpu: Vec<(Instant, f64)>,
    pub(super) pool_used: Vec<u64>,
    pub(super) pool_size: Vec<u64>,
    pub(super) pg_all: Vec<u64>,
    pub(super) pg_active: Vec<u64>,
    /// Backends seen in each state (and wait event), over the samples
    /// taken while the pool was fully used.
    pub(super) pg_states: BTreeMap<String, u64>,
    /// (time, (busy, total) clock ticks of the machine).
    pub(super) machine: Vec<(Instant, (u64, u64))>,
}

/// Samples the gateway until `stop`: memory and CPU every
/// [`SAMPLE_EVERY`], its pool and its Postgres connections every other
/// time.
pub(super) async fn sample(target: RunTarget, stop: CancellationToken) -> Samples {
    let mut samples = Samples::default();
    let http = client::http_client(&ClientOptions::default(), 1).ok();
    let pg = match &target.postgres_url {
        Some(url) => Inspector::connect(url)
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
                if let Ok((all, active)) = pg.connections().await {
                    samples.pg_all.push(u64::try_from(all).unwrap_or(0));
                    samples.pg_active.push(u64::try_from(active).unwrap_or(0));
                }
                let states = pg.connection_states().await;
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
pub(super) fn busy_pct(start: Option<(u64, u64)>, end: Option<(u64, u64)>) -> Option<f64> {
    let ((b0, t0), (b1, t1)) = start.zip(end)?;
    (t1 > t0).then(|| b1.saturating_sub(b0) as f64 * 100.0 / (t1 - t0) as f64)
}

/// The highest ratio of `part` to `whole` growth over any second of two
/// series sampled at the same instants, percent.
pub(super) fn peak_share(part: &[(Instant, f64)], whole: &[(Instant, f64)]) -> Option<f64> {
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
pub(super) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// Mean cores over the whole series, and the most over any second of it.
pub(super) fn cores(series: &[(Instant, f64)]) -> (Option<f64>, Option<f64>) {
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
pub(super) fn pool_usage(text: &str) -> (Option<u64>, Option<u64>) {
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
pub(super) fn db_operations(text: &str) -> BTreeMap<String, (f64, f64)> {
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
pub(super) fn db_delta(
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
pub(super) async fn read_db_operations(target: &RunTarget) -> BTreeMap<String, (f64, f64)> {
    let Some(ops) = &target.ops_url else { return BTreeMap::new() };
    let Ok(http) = client::http_client(&ClientOptions::default(), 1) else {
        return BTreeMap::new();
    };
    match http.get(format!("{ops}/metrics")).send().await {
        Ok(response) => db_operations(&response.text().await.unwrap_or_default()),
        Err(_) => BTreeMap::new(),
    }
}

pub(super) fn render_db(out: &mut String, ops: &BTreeMap<String, DbOp>) {
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
