//! The runs' report, as JSON and as text.

use super::*;

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

pub(super) fn spread(s: Option<&Spread>, scale: f64, digits: usize) -> String {
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

pub(super) fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
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
