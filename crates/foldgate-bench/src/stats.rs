//! What a run measures: latency histograms per tool, errors by kind, and
//! the reports built from them.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::CallError;

/// Highest latency a histogram holds (longer ones are clamped to it).
const MAX_LATENCY_US: u64 = 120_000_000;
/// How many example messages are kept per error kind.
const SAMPLES_PER_KIND: usize = 3;

#[expect(clippy::expect_used, reason = "the bounds are constants that hdrhistogram accepts")]
fn histogram() -> Histogram<u64> {
    // Three significant digits from 1 µs to two minutes: about 40 KB each.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Latencies and failures of one tool.
#[derive(Debug, Clone)]
struct ToolStats {
    ok: Histogram<u64>,
    errors: u64,
}

impl Default for ToolStats {
    fn default() -> Self {
        Self { ok: histogram(), errors: 0 }
    }
}

/// Failures of one kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ErrorStats {
    pub count: u64,
    /// Failures per tool.
    pub by_tool: BTreeMap<String, u64>,
    /// A few example messages.
    pub samples: Vec<String>,
}

/// What one agent (or a whole run, once merged) recorded. Each agent has
/// its own, so recording needs no synchronisation.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    tools: BTreeMap<String, ToolStats>,
    errors: BTreeMap<String, ErrorStats>,
    /// Completed fold cycles (create, status, nested create, two returns).
    pub cycles: u64,
    /// Fold cycles deliberately left for the supervisor to end.
    pub abandoned: u64,
}

impl Recorder {
    /// Records a successful call that took `latency`.
    pub fn ok(&mut self, tool: &str, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).clamp(1, MAX_LATENCY_US);
        let stats = self.tool(tool);
        // Values are clamped into the histogram's range: recording cannot fail.
        let _ = stats.ok.record(us);
    }

    /// Records a failed call.
    pub fn error(&mut self, tool: &str, error: &CallError) {
        self.tool(tool).errors += 1;
        let entry = self.errors.entry(error.kind()).or_default();
        entry.count += 1;
        *entry.by_tool.entry(tool.to_owned()).or_default() += 1;
        if entry.samples.len() < SAMPLES_PER_KIND {
            entry.samples.push(error.to_string());
        }
    }

    fn tool(&mut self, tool: &str) -> &mut ToolStats {
        if !self.tools.contains_key(tool) {
            self.tools.insert(tool.to_owned(), ToolStats::default());
        }
        self.tools.entry(tool.to_owned()).or_default()
    }

    /// Adds another recorder's figures to this one.
    pub fn merge(&mut self, other: &Self) {
        for (tool, stats) in &other.tools {
            let mine = self.tool(tool);
            let _ = mine.ok.add(&stats.ok);
            mine.errors += stats.errors;
        }
        for (kind, stats) in &other.errors {
            let mine = self.errors.entry(kind.clone()).or_default();
            mine.count += stats.count;
            for (tool, n) in &stats.by_tool {
                *mine.by_tool.entry(tool.clone()).or_default() += n;
            }
            for sample in &stats.samples {
                if mine.samples.len() < SAMPLES_PER_KIND {
                    mine.samples.push(sample.clone());
                }
            }
        }
        self.cycles += other.cycles;
        self.abandoned += other.abandoned;
    }

    /// Successful calls, all tools.
    pub fn ok_calls(&self) -> u64 {
        self.tools.values().map(|t| t.ok.len()).sum()
    }

    /// Failed calls, all tools.
    pub fn error_calls(&self) -> u64 {
        self.errors.values().map(|e| e.count).sum()
    }

    /// The figures over `elapsed`.
    pub fn summary(&self, elapsed: Duration) -> Measured {
        let secs = elapsed.as_secs_f64().max(f64::EPSILON);
        let mut all = histogram();
        let mut tools = BTreeMap::new();
        for (name, stats) in &self.tools {
            let _ = all.add(&stats.ok);
            tools.insert(name.clone(), LatencySummary::of(&stats.ok, stats.errors, secs));
        }
        let ok_calls = self.ok_calls();
        let error_calls = self.error_calls();
        Measured {
            elapsed_s: secs,
            calls: ok_calls + error_calls,
            ok_calls,
            error_calls,
            calls_per_s: ok_calls as f64 / secs,
            cycles: self.cycles,
            cycles_per_s: self.cycles as f64 / secs,
            abandoned_cycles: self.abandoned,
            latency: LatencySummary::of(&all, error_calls, secs),
            tools,
            errors: self.errors.clone(),
        }
    }
}

/// Latency percentiles of successful calls, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub ok: u64,
    pub errors: u64,
    /// Successful calls per second.
    pub per_s: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl LatencySummary {
    fn of(h: &Histogram<u64>, errors: u64, secs: f64) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        let empty = h.is_empty();
        let q = |q: f64| if empty { 0.0 } else { ms(h.value_at_quantile(q)) };
        Self {
            ok: h.len(),
            errors,
            per_s: h.len() as f64 / secs,
            mean_ms: if empty { 0.0 } else { h.mean() / 1000.0 },
            p50_ms: q(0.50),
            p90_ms: q(0.90),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: if empty { 0.0 } else { ms(h.max()) },
        }
    }
}

/// The figures of one load run against one target.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub elapsed_s: f64,
    pub calls: u64,
    pub ok_calls: u64,
    pub error_calls: u64,
    /// Successful calls per second, all tools.
    pub calls_per_s: f64,
    pub cycles: u64,
    pub cycles_per_s: f64,
    pub abandoned_cycles: u64,
    /// All successful calls together.
    pub latency: LatencySummary,
    pub tools: BTreeMap<String, LatencySummary>,
    /// Failures by kind (`http:503`, `jsonrpc:-32603`, `tool:busy`,
    /// `transport:connect`, …).
    pub errors: BTreeMap<String, ErrorStats>,
}

/// Live counters, read by the sampler while a run goes on.
#[derive(Debug, Default)]
pub struct Live {
    pub ok: AtomicU64,
    pub errors: AtomicU64,
}

impl Live {
    pub fn snapshot(&self) -> (u64, u64) {
        (self.ok.load(Ordering::Relaxed), self.errors.load(Ordering::Relaxed))
    }
}

/// Percentiles of a list of values (for lateness and resource series).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Spread {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((sorted.len() - 1) as f64 * q).round() as usize;
            sorted[i.min(sorted.len() - 1)]
        };
        Some(Self { n: sorted.len(), min: sorted[0], p50: at(0.5), p99: at(0.99), max: at(1.0) })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn recorders_merge_and_summarise() {
        let mut a = Recorder::default();
        let mut b = Recorder::default();
        for ms in 1..=100 {
            a.ok("branch_create", Duration::from_millis(ms));
        }
        b.ok("branch_create", Duration::from_millis(1000));
        b.error("branch_return", &CallError::Tool { code: "busy".into(), message: "m".into() });
        b.cycles = 3;
        a.merge(&b);
        let m = a.summary(Duration::from_secs(2));
        assert_eq!((m.calls, m.ok_calls, m.error_calls, m.cycles), (102, 101, 1, 3));
        let create = &m.tools["branch_create"];
        assert!((create.p50_ms - 51.0).abs() < 0.1, "p50 {}", create.p50_ms);
        assert!((create.max_ms - 1000.0).abs() < 1.0, "max {}", create.max_ms);
        assert_eq!(m.tools["branch_return"].errors, 1);
        assert_eq!(m.errors["tool:busy"].by_tool["branch_return"], 1);
        assert!((m.calls_per_s - 50.5).abs() < 1e-9);
    }

    #[test]
    fn spreads() {
        assert_eq!(Spread::of(&[]), None);
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.n, s.min, s.p50, s.max), (3, 1.0, 2.0, 3.0));
    }
}
