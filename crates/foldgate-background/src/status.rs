//! What each task last did: the board the ops endpoint and readiness read,
//! and the metrics every activation records.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use foldgate_domain::{Clock, SystemClock};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, Meter},
};
use serde::Serialize;
use serde_json::Value;

use crate::{Activation, OnStop, StopOrder};

/// Bucket boundaries (seconds) for activation durations: from a flag check
/// to a batch of deadlines or an upstream's slow tool listing.
const DURATION_BUCKETS: [f64; 12] =
    [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Registered; the driver has not started.
    Registered,
    /// Waiting for its next activation.
    Waiting,
    /// In an activation.
    Activating,
    /// Stopped (at shutdown, or its activation panicked).
    Stopped,
}

/// Why an activation ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The first activation, when the driver started.
    Start,
    /// Its period, or the delay it asked for, ran out.
    Timer,
    /// One of its triggers fired.
    Trigger,
    /// The last pass at shutdown.
    Shutdown,
}

/// The last activation of a task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LastActivation {
    /// When it started (RFC 3339).
    pub started_at: String,
    pub reason: Reason,
    pub duration_ms: f64,
    /// `ok` or `error`.
    pub outcome: &'static str,
    /// Why it failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the task reported.
    pub status: Value,
}

/// A task as the board shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskReport {
    pub name: String,
    /// Its period; `None`: only when triggered or when it asks.
    pub period_ms: Option<u64>,
    /// How many triggers can activate it.
    pub triggers: usize,
    pub stop_order: StopOrder,
    pub on_stop: OnStop,
    pub state: State,
    /// Activations so far.
    pub activations: u64,
    pub last: Option<LastActivation>,
}

/// One task's entry on the board.
#[derive(Debug)]
pub(crate) struct Cell(Mutex<TaskReport>);

impl Cell {
    pub(crate) fn new(report: TaskReport) -> Arc<Self> {
        Arc::new(Self(Mutex::new(report)))
    }

    fn lock(&self) -> MutexGuard<'_, TaskReport> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn name(&self) -> String {
        self.lock().name.clone()
    }

    pub(crate) fn set(&self, state: State) {
        self.lock().state = state;
    }

    /// Marks the task running until the guard is dropped — when its loop
    /// ends, or unwinds from a panic.
    pub(crate) fn running(self: &Arc<Self>) -> Alive {
        self.set(State::Waiting);
        Alive(Arc::clone(self))
    }

    pub(crate) fn record(
        &self,
        started_at: String,
        reason: Reason,
        took: Duration,
        activation: &Activation,
    ) {
        let mut report = self.lock();
        report.activations += 1;
        report.state = State::Waiting;
        report.last = Some(LastActivation {
            started_at,
            reason,
            duration_ms: took.as_secs_f64() * 1000.0,
            outcome: outcome(activation),
            error: activation.error.clone(),
            status: activation.status.clone(),
        });
    }
}

/// Marks its task stopped when dropped.
#[derive(Debug)]
pub(crate) struct Alive(Arc<Cell>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.set(State::Stopped);
    }
}

fn outcome(activation: &Activation) -> &'static str {
    if activation.error.is_some() { "error" } else { "ok" }
}

/// The now, as activations are stamped.
pub(crate) fn now() -> String {
    SystemClock.now().to_rfc3339()
}

/// What every task last did. Cheap to clone; filled as tasks register.
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<Vec<Arc<Cell>>>>);

impl Board {
    pub(crate) fn add(&self, cell: Arc<Cell>) {
        self.cells().push(cell);
    }

    pub(crate) fn remove(&self, cell: &Arc<Cell>) {
        self.cells().retain(|c| !Arc::ptr_eq(c, cell));
    }

    fn cells(&self) -> MutexGuard<'_, Vec<Arc<Cell>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every task, in the order they were registered.
    pub fn tasks(&self) -> Vec<TaskReport> {
        self.cells().iter().map(|c| c.lock().clone()).collect()
    }

    /// One task, by name.
    pub fn task(&self, name: &str) -> Option<TaskReport> {
        self.tasks().into_iter().find(|t| t.name == name)
    }

    /// Whether every registered task is running (for readiness): a task
    /// stops only at shutdown, or when its activation panicked.
    pub fn all_running(&self) -> bool {
        self.cells().iter().all(|c| matches!(c.lock().state, State::Waiting | State::Activating))
    }
}

/// The driver's instruments.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    /// `foldgate.background.activations{task, outcome}`.
    activations: Counter<u64>,
    /// `foldgate.background.activation.duration{task, outcome}`.
    duration: Histogram<f64>,
}

impl Metrics {
    pub(crate) fn new(meter: &Meter) -> Self {
        Self {
            activations: meter
                .u64_counter("foldgate.background.activations")
                .with_description("Activations of background tasks, by task and outcome")
                .with_unit("{activation}")
                .build(),
            duration: meter
                .f64_histogram("foldgate.background.activation.duration")
                .with_description("How long one activation of a background task took")
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
        }
    }

    pub(crate) fn record(&self, task: &str, took: Duration, activation: &Activation) {
        let attributes =
            [KeyValue::new("task", task.to_owned()), KeyValue::new("outcome", outcome(activation))];
        self.activations.add(1, &attributes);
        self.duration.record(took.as_secs_f64(), &attributes);
    }
}
