//! The driver: registration, the one loop every task runs in, and the
//! shutdown in stop order.

use std::{
    collections::BTreeMap,
    future::poll_fn,
    sync::Arc,
    task::Poll,
    time::{Duration, Instant},
};

use opentelemetry::metrics::{Meter, MeterProvider as _, noop::NoopMeterProvider};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    Activation, Activator, BackgroundTask, Next, OnStop, StopOrder,
    status::{self, Board, Cell, Metrics, Reason, State, TaskReport},
};

/// How a task is driven: its name, its period, its triggers and when it
/// stops.
#[derive(Debug, Clone)]
pub struct TaskDef {
    name: String,
    period: Option<Duration>,
    triggers: Vec<Activator>,
    stop: StopOrder,
    on_stop: OnStop,
}

impl TaskDef {
    /// A task activated at start, then only when triggered or when it asks
    /// ([`Next::After`]), stopped at `stop` after its current activation.
    pub fn new(name: impl Into<String>, stop: StopOrder) -> Self {
        Self {
            name: name.into(),
            period: None,
            triggers: Vec::new(),
            stop,
            on_stop: OnStop::Finish,
        }
    }

    /// Activated every `period` (after the end of the previous activation).
    #[must_use]
    pub fn period(self, period: Duration) -> Self {
        Self { period: Some(period), ..self }
    }

    /// Also activated whenever `activator` fires.
    #[must_use]
    pub fn trigger(mut self, activator: Activator) -> Self {
        self.triggers.push(activator);
        self
    }

    #[must_use]
    pub fn on_stop(self, on_stop: OnStop) -> Self {
        Self { on_stop, ..self }
    }

    fn report(&self) -> TaskReport {
        TaskReport {
            name: self.name.clone(),
            period_ms: self.period.map(|p| u64::try_from(p.as_millis()).unwrap_or(u64::MAX)),
            triggers: self.triggers.len(),
            stop_order: self.stop,
            on_stop: self.on_stop,
            state: State::Registered,
            activations: 0,
            last: None,
        }
    }
}

/// A registered task.
struct Entry {
    def: TaskDef,
    task: Box<dyn BackgroundTask>,
    cell: Arc<Cell>,
}

/// Owns every background task until [`Driver::start`].
pub struct Driver {
    entries: Vec<Entry>,
    board: Board,
    metrics: Metrics,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("board", &self.board).finish_non_exhaustive()
    }
}

impl Default for Driver {
    /// A driver that records no metrics.
    fn default() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }
}

impl Driver {
    /// A driver recording its metrics into `meter`.
    pub fn new(meter: &Meter) -> Self {
        Self { entries: Vec::new(), board: Board::default(), metrics: Metrics::new(meter) }
    }

    /// Adds a task; it runs once the driver starts.
    pub fn register(&mut self, def: TaskDef, task: impl BackgroundTask) {
        let cell = Cell::new(def.report());
        self.board.add(Arc::clone(&cell));
        self.entries.push(Entry { def, task: Box::new(task), cell });
    }

    /// The board of the registered tasks (and of those registered later).
    pub fn board(&self) -> Board {
        self.board.clone()
    }

    /// Starts every task: each is activated at once.
    pub fn start(self) -> Running {
        let cancel = CancellationToken::new();
        let mut stages: BTreeMap<StopOrder, Stage> = BTreeMap::new();
        for entry in self.entries {
            let stage = stages
                .entry(entry.def.stop)
                .or_insert_with(|| Stage { stop: cancel.child_token(), tasks: Vec::new() });
            let name = entry.def.name.clone();
            let handle = tokio::spawn(drive(entry, self.metrics.clone(), stage.stop.clone()));
            stage.tasks.push((name, handle));
        }
        Running { cancel, stages, board: self.board }
    }
}

/// The tasks of one stop order.
#[derive(Debug)]
struct Stage {
    stop: CancellationToken,
    tasks: Vec<(String, JoinHandle<()>)>,
}

/// The running tasks. Dropping it stops them all at once; [`Running::shutdown`]
/// stops them in order.
#[derive(Debug)]
pub struct Running {
    /// The driver's one cancellation token: each stage's is its child.
    cancel: CancellationToken,
    stages: BTreeMap<StopOrder, Stage>,
    board: Board,
}

impl Running {
    pub fn board(&self) -> Board {
        self.board.clone()
    }

    /// Stops, stage by stage, every task whose stop order is at most
    /// `order`, waiting for each stage before the next.
    pub async fn stop_through(&mut self, order: StopOrder) {
        let later = match order.0.checked_add(1) {
            Some(next) => self.stages.split_off(&StopOrder(next)),
            None => BTreeMap::new(),
        };
        let now = std::mem::replace(&mut self.stages, later);
        for stage in now.into_values() {
            stage.stop.cancel();
            for (name, task) in stage.tasks {
                if let Err(e) = task.await {
                    tracing::error!(task = %name, error = %e, "a background task failed");
                }
            }
        }
    }

    /// Stops every task, in stop order.
    pub async fn shutdown(mut self) {
        self.stop_through(StopOrder(u8::MAX)).await;
        self.cancel.cancel();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A task's life: activated at once, then whenever its timer or a trigger
/// says, until its stage is stopped.
async fn drive(mut entry: Entry, metrics: Metrics, stop: CancellationToken) {
    let _alive = entry.cell.running();
    let name = entry.cell.name();
    let abandon = entry.def.on_stop == OnStop::Abandon;
    let mut reason = Reason::Start;
    while !stop.is_cancelled() {
        let pass = once(&mut entry, &name, reason, &metrics);
        let activation = if abandon {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                activation = pass => activation,
            }
        } else {
            pass.await
        };
        let wait = match activation.next {
            Next::Period => entry.def.period,
            Next::After(after) => Some(after),
            Next::Trigger => None,
        };
        reason = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = sleep(wait) => Reason::Timer,
            () = any(&entry.def.triggers) => Reason::Trigger,
        };
    }
    if entry.def.on_stop == OnStop::LastPass {
        once(&mut entry, &name, Reason::Shutdown, &metrics).await;
    }
}

/// One activation, recorded on the board and in the metrics.
async fn once(entry: &mut Entry, name: &str, reason: Reason, metrics: &Metrics) -> Activation {
    entry.cell.set(State::Activating);
    let started_at = status::now();
    let started = Instant::now();
    let activation = entry.task.activate().await;
    let took = started.elapsed();
    entry.cell.record(started_at, reason, took, &activation);
    metrics.record(name, took, &activation);
    match &activation.error {
        Some(error) => tracing::debug!(task = name, %error, "background activation failed"),
        None => tracing::trace!(task = name, "background activation"),
    }
    activation
}

/// Sleeps `wait`; never ends for `None`.
async fn sleep(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// Ends when any of `triggers` fires; never for none.
async fn any(triggers: &[Activator]) {
    let mut waits: Vec<_> = triggers.iter().map(|t| Box::pin(t.activated())).collect();
    poll_fn(|cx| {
        if waits.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}
