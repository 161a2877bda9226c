//! Reports: what a run measured, as JSON and as text for a terminal.

use std::{fmt::Write as _, time::Duration};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{
    deadlines::DeadlineReport,
    load::{Balance, LoadResult, Mode, Stop, Workload},
    process::{CpuUse, Drift, ProcSample},
    slow::SlowReport,
    stats::{LatencySummary, Measured, Recorder, Spread},
    verify::Verification,
};

/// The machine's load when a run started or ended: the figures are only
/// comparable between runs on an equally quiet machine.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub at: DateTime<Utc>,
    pub cpus: usize,
    /// 1, 5 and 15-minute load averages.
    pub load_average: [f64; 3],
}

impl Machine {
    pub fn now() -> Self {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().unwrap_or(0.0));
        let mut load = [0.0; 3];
        for slot in &mut load {
            *slot = fields.next().unwrap_or(0.0);
        }
        Self {
            at: Utc::now(),
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            load_average: load,
        }
    }

    pub(crate) fn line(&self) -> String {
        let [a, b, c] = self.load_average;
        format!("{} CPUs, load average {a:.2} {b:.2} {c:.2}", self.cpus)
    }
}

/// The settings a run used.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub mode: Mode,
    pub agents: usize,
    pub stop: Stop,
    pub warmup_s: f64,
    /// Open-loop rate, calls per second.
    pub rate: Option<f64>,
    pub balance: Balance,
    pub branch_timeout: u32,
    pub cycles_per_session: u32,
    pub abandon_every: Option<u32>,
    pub proxy_tool: String,
    pub run_id: String,
    pub rounds: u32,
}

/// One target's figures over all rounds.
#[derive(Debug, Clone, Serialize)]
pub struct TargetSummary {
    pub name: String,
    pub urls: Vec<String>,
    #[serde(flatten)]
    pub measured: Measured,
    pub max_rss_kib: Option<u64>,
    /// CPU use over all rounds (weighted by their length).
    pub cpu: CpuUse,
}

/// The gateway against the baseline, measured in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The gateway's calls compared (`all` in fold mode).
    pub gateway_tool: String,
    pub baseline_tool: String,
    pub gateway_per_s: f64,
    pub baseline_per_s: f64,
    /// Gateway throughput / baseline throughput.
    pub throughput_ratio: f64,
    pub gateway: LatencySummary,
    pub baseline: LatencySummary,
    /// Gateway latency / baseline latency.
    pub p50_ratio: f64,
    pub p90_ratio: f64,
    pub p99_ratio: f64,
}

/// A `run`'s report.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub started_at: DateTime<Utc>,
    pub machine_before: Machine,
    pub machine_after: Machine,
    pub settings: Settings,
    pub gateway: Option<TargetSummary>,
    pub baseline: Option<TargetSummary>,
    pub comparison: Option<Comparison>,
    /// The gateway's memory and sockets over a soak, after its warm-up.
    pub soak_drift: Option<Drift>,
    /// Each load run, in order.
    pub rounds: Vec<LoadResult>,
}

fn summarise(name: &str, rounds: &[LoadResult]) -> Option<TargetSummary> {
    let mine: Vec<&LoadResult> = rounds.iter().filter(|r| r.target == name).collect();
    let first = mine.first()?;
    let mut recorder = Recorder::default();
    let mut elapsed = 0.0;
    for round in &mine {
        recorder.merge(&round.recorder);
        elapsed += round.measured.elapsed_s;
    }
    let measured = recorder.summary(Duration::from_secs_f64(elapsed));
    // Weighted by each round's length: cores × seconds are CPU seconds.
    let weighted = |f: fn(&CpuUse) -> Option<f64>| -> Option<f64> {
        let parts: Option<Vec<f64>> =
            mine.iter().map(|r| f(&r.cpu).map(|v| v * r.measured.elapsed_s)).collect();
        parts.map(|p| p.iter().sum::<f64>() / elapsed.max(f64::EPSILON))
    };
    let target_cores = weighted(|c| c.target_cores);
    let cpu = CpuUse {
        target_cores,
        target_us_per_call: target_cores
            .filter(|_| measured.ok_calls > 0)
            .map(|cores| cores * elapsed * 1e6 / measured.ok_calls as f64),
        bench_cores: weighted(|c| c.bench_cores),
        machine_busy_pct: weighted(|c| c.machine_busy_pct),
    };
    Some(TargetSummary {
        name: name.to_owned(),
        urls: first.urls.clone(),
        measured,
        max_rss_kib: mine.iter().flat_map(|r| r.process.iter().map(|s| s.rss_kib)).max(),
        cpu,
    })
}

impl RunReport {
    pub fn new(
        started_at: DateTime<Utc>,
        machine_before: Machine,
        workload: &Workload,
        rounds_run: u32,
        soak_warmup: Option<Duration>,
        rounds: Vec<LoadResult>,
    ) -> Self {
        let gateway = summarise("gateway", &rounds);
        let baseline = summarise("baseline", &rounds);
        let gateway_tool = match workload.mode {
            Mode::Fold => None,
            Mode::Status => Some(crate::load::BRANCH_STATUS.to_owned()),
            Mode::Proxy | Mode::ProxyOutside => Some(workload.proxy_tool.clone()),
            Mode::Echo => Some(workload.echo_tool.clone()),
        };
        let comparison = match (&gateway, &baseline) {
            (Some(g), Some(b)) => {
                let g_latency = match &gateway_tool {
                    Some(tool) => g.measured.tools.get(tool).cloned(),
                    None => Some(g.measured.latency.clone()),
                };
                let b_latency = b.measured.tools.get(&workload.echo_tool).cloned();
                match (g_latency, b_latency) {
                    (Some(gl), Some(bl)) => {
                        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
                        Some(Comparison {
                            gateway_tool: gateway_tool.clone().unwrap_or_else(|| "all".into()),
                            baseline_tool: workload.echo_tool.clone(),
                            gateway_per_s: gl.per_s,
                            baseline_per_s: bl.per_s,
                            throughput_ratio: ratio(gl.per_s, bl.per_s),
                            p50_ratio: ratio(gl.p50_ms, bl.p50_ms),
                            p90_ratio: ratio(gl.p90_ms, bl.p90_ms),
                            p99_ratio: ratio(gl.p99_ms, bl.p99_ms),
                            gateway: gl,
                            baseline: bl,
                        })
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let soak_drift = soak_warmup.and_then(|warmup| {
            let samples: Vec<ProcSample> = rounds
                .iter()
                .filter(|r| r.target == "gateway")
                .flat_map(|r| r.process.iter().cloned())
                .collect();
            Drift::of(&samples, warmup.as_secs_f64())
        });
        Self {
            started_at,
            machine_before,
            machine_after: Machine::now(),
            settings: Settings {
                mode: workload.mode,
                agents: workload.agents,
                stop: workload.stop,
                warmup_s: workload.warmup.as_secs_f64(),
                rate: workload.rate,
                balance: workload.balance,
                branch_timeout: workload.branch_timeout,
                cycles_per_session: workload.cycles_per_session,
                abandon_every: workload.abandon_every,
                proxy_tool: workload.proxy_tool.clone(),
                run_id: workload.run_id.clone(),
                rounds: rounds_run,
            },
            gateway,
            baseline,
            comparison,
            soak_drift,
            rounds,
        }
    }

    /// The report for a terminal.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let s = &self.settings;
        let _ = writeln!(
            out,
            "\n{:?} mode, {} agents, {}, run id {}",
            s.mode,
            s.agents,
            match (s.stop, s.rate) {
                (Stop::Count(n), _) => format!("{n} units"),
                (Stop::Duration(d), Some(rate)) =>
                    format!("{:.0} s open loop at {rate:.0} calls/s", d.as_secs_f64()),
                (Stop::Duration(d), None) => format!(
                    "{:.0} s closed loop after {:.0} s warm-up",
                    d.as_secs_f64(),
                    s.warmup_s
                ),
            },
            s.run_id
        );
        let _ = writeln!(out, "machine before: {}", self.machine_before.line());
        let _ = writeln!(out, "machine after:  {}", self.machine_after.line());
        for target in [&self.baseline, &self.gateway].into_iter().flatten() {
            render_target(&mut out, target);
        }
        if let Some(c) = &self.comparison {
            let _ = writeln!(
                out,
                "\ngateway ({}) / baseline ({}): throughput {:.2} ({:.0} vs {:.0} calls/s); \
                 latency p50 {:.2}x, p90 {:.2}x, p99 {:.2}x",
                c.gateway_tool,
                c.baseline_tool,
                c.throughput_ratio,
                c.gateway_per_s,
                c.baseline_per_s,
                c.p50_ratio,
                c.p90_ratio,
                c.p99_ratio
            );
        }
        if let Some(d) = &self.soak_drift {
            let _ = writeln!(
                out,
                "\nsoak drift over {} samples after warm-up: RSS first {} last {} min {} max {} KiB \
                 (last vs first {:+.1}%, max vs min {:.1}%); fds {} -> {} (max {}); \
                 client connections {} -> {} (max {})",
                d.samples,
                d.first_rss_kib,
                d.last_rss_kib,
                d.min_rss_kib,
                d.max_rss_kib,
                d.last_vs_first_pct,
                d.max_vs_min_pct,
                d.first_fds,
                d.last_fds,
                d.max_fds,
                d.first_inbound,
                d.last_inbound,
                d.max_inbound
            );
        }
        out
    }
}

fn render_target(out: &mut String, target: &TargetSummary) {
    let m = &target.measured;
    let _ = writeln!(out, "\n{} at {}", target.name, target.urls.join(", "));
    let _ = write!(
        out,
        "  {} calls in {:.1} s: {:.1} calls/s, {} errors",
        m.calls, m.elapsed_s, m.calls_per_s, m.error_calls
    );
    if m.cycles > 0 || m.abandoned_cycles > 0 {
        let _ = write!(
            out,
            "; {} fold cycles, {:.1} cycles/s ({:.1} create+return pairs/s)",
            m.cycles,
            m.cycles_per_s,
            m.cycles_per_s * 2.0
        );
        if m.abandoned_cycles > 0 {
            let _ = write!(out, ", {} abandoned", m.abandoned_cycles);
        }
    }
    let _ = writeln!(out);
    if let Some(kib) = target.max_rss_kib {
        let _ = writeln!(out, "  peak RSS {:.1} MiB", kib as f64 / 1024.0);
    }
    let c = &target.cpu;
    let mut cpu = Vec::new();
    if let (Some(cores), Some(us)) = (c.target_cores, c.target_us_per_call) {
        cpu.push(format!("{} {cores:.2} cores ({us:.0} µs per call)", target.name));
    }
    if let Some(cores) = c.bench_cores {
        cpu.push(format!("load generator {cores:.2} cores"));
    }
    if let Some(pct) = c.machine_busy_pct {
        cpu.push(format!("machine {pct:.0}% busy"));
    }
    if !cpu.is_empty() {
        let _ = writeln!(out, "  CPU: {}", cpu.join(", "));
    }
    let _ = writeln!(
        out,
        "  {:<18} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "tool", "ok", "calls/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"
    );
    let rows = m.tools.iter().map(|(n, l)| (n.as_str(), l)).chain([("all", &m.latency)]);
    for (name, l) in rows {
        let _ = writeln!(
            out,
            "  {:<18} {:>9} {:>9.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8}",
            name, l.ok, l.per_s, l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms, l.errors
        );
    }
    for (kind, e) in &m.errors {
        let by_tool: Vec<String> = e.by_tool.iter().map(|(t, n)| format!("{t} {n}")).collect();
        let _ = writeln!(out, "  error {kind}: {} ({})", e.count, by_tool.join(", "));
        if let Some(sample) = e.samples.first() {
            let _ = writeln!(out, "    e.g. {sample}");
        }
    }
}

/// A `deadlines` run's report.
#[derive(Debug, Clone, Serialize)]
pub struct DeadlineRun {
    pub machine_before: Machine,
    pub machine_after: Machine,
    pub run_id: String,
    pub seconds: f64,
    pub max_rss_mib_allowed: u64,
    pub passed: bool,
    #[serde(flatten)]
    pub outcome: DeadlineReport,
}

impl DeadlineRun {
    pub fn render(&self) -> String {
        let o = &self.outcome;
        let mut out = String::new();
        let _ = writeln!(out, "\ndeadline scale, run id {}", self.run_id);
        let _ = writeln!(out, "machine before: {}", self.machine_before.line());
        let _ = writeln!(out, "machine after:  {}", self.machine_after.line());
        let _ = writeln!(
            out,
            "created {} branches ({} errors) in {:.1} s: {:.0}/s, create p50 {:.2} ms p99 {:.2} ms; \
             {} active after creation",
            o.created,
            o.create_errors,
            o.create_seconds,
            o.creates_per_s,
            o.create.latency.p50_ms,
            o.create.latency.p99_ms,
            o.active_after_creation
        );
        if let Some(kib) = o.max_rss_kib {
            let _ = writeln!(
                out,
                "gateway peak RSS {:.1} MiB (allowed {} MiB)",
                kib as f64 / 1024.0,
                self.max_rss_mib_allowed
            );
        }
        out.push_str(&render_verification(&o.verification));
        let _ = writeln!(out, "{}", if self.passed { "PASSED" } else { "FAILED" });
        out
    }
}

fn spread_ms(s: &Option<Spread>) -> String {
    match s {
        Some(s) => format!(
            "n {} min {:.0} p50 {:.0} p99 {:.0} max {:.0} ms",
            s.n, s.min, s.p50, s.p99, s.max
        ),
        None => "none".into(),
    }
}

/// A verification for a terminal.
pub fn render_verification(v: &Verification) -> String {
    let mut out = String::new();
    let statuses: Vec<String> = v.by_status.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(out, "database: {} branches ({})", v.branches_in_db, statuses.join(", "));
    if v.recorded_created > 0 {
        let _ = writeln!(
            out,
            "recorded by clients: {} created, {} lost; {} returned, {} not kept {:?}",
            v.recorded_created, v.lost, v.recorded_returned, v.returns_not_kept, v.lost_examples
        );
    }
    let _ = writeln!(
        out,
        "deadlines: {} fired; lateness {}; {} late, {} early; {} still active past their deadline",
        v.fired,
        spread_ms(&v.lateness_ms),
        v.late,
        v.early,
        v.overdue_active
    );
    if v.fired_after_outage > 0 {
        let _ = writeln!(
            out,
            "deadlines that passed during an outage: {}, fired after the restart: {}; {} too late",
            v.fired_after_outage,
            spread_ms(&v.after_outage_ms),
            v.late_after_outage
        );
    }
    if let Some((counter, active)) = v.deployment_counter {
        let _ = writeln!(out, "deployment counter {counter}, active branches {active}");
    }
    if v.terminal_events_in_logs > 0 {
        let _ = writeln!(
            out,
            "logs: {} terminal events, {} branches ended more than once",
            v.terminal_events_in_logs, v.duplicate_terminal_events
        );
    }
    for failure in &v.failures {
        let _ = writeln!(out, "FAILED: {failure}");
    }
    if v.passed() {
        let _ = writeln!(out, "verification passed");
    }
    out
}

fn sample_line(label: &str, s: &ProcSample) -> String {
    let tcp: Vec<String> = s.tcp.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!(
        "  {label:<12} RSS {:>7.1} MiB, {:>5} fds, {:>3} threads, {:>4} client connections, TCP {}\n",
        s.rss_kib as f64 / 1024.0,
        s.fds,
        s.threads,
        s.inbound,
        tcp.join(", ")
    )
}

/// A slow-clients run for a terminal.
pub fn render_slow(r: &SlowReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{:?}: {} connections ({} failed to open)",
        r.kind, r.connections, r.connect_failures
    );
    out.push_str(&sample_line("before", &r.before));
    out.push_str(&sample_line("during", &r.during));
    out.push_str(&sample_line("end of hold", &r.end_of_hold));
    out.push_str(&sample_line("after", &r.after));
    let closed = match &r.closed_after_s {
        Some(s) => format!("after {:.1}–{:.1} s", s.min, s.max),
        None => "none".into(),
    };
    let _ = writeln!(
        out,
        "  closed or answered by the server while stalled: {} ({closed})",
        r.closed_by_server
    );
    let p = &r.probe;
    let _ = writeln!(
        out,
        "  a well-behaved client meanwhile: {} ok, {} errors, p50 {:.2} ms, p99 {:.2} ms",
        p.ok_calls, p.error_calls, p.latency.p50_ms, p.latency.p99_ms
    );
    out
}
