//! The driver: registration, the one loop every task runs in, and the
//! shutdown in stop order.

use std::{
    collections::BTreeMap,
    future::poll_fn,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
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
    /// Cancelled when its [`TaskHandle`] is dropped; never, for a task
    /// registered for the gateway's whole life.
    own: CancellationToken,
}

/// What the driver, its spawners and the running tasks share.
struct Shared {
    board: Board,
    metrics: Metrics,
    phase: Mutex<Phase>,
}

enum Phase {
    /// Tasks wait for [`Driver::start`].
    Registering(Vec<Entry>),
    Started {
        /// The driver's one cancellation token: each stage's is its child.
        cancel: CancellationToken,
        stages: BTreeMap<StopOrder, Stage>,
        /// Stages up to this order are stopped: tasks spawned into them now
        /// never run.
        stopped_through: Option<StopOrder>,
    },
}

impl Shared {
    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a task, stopped with its stage or when `own` is cancelled:
    /// queued before the start, running at once after it. Its board entry,
    /// if it will run.
    fn add(
        &self,
        def: TaskDef,
        task: Box<dyn BackgroundTask>,
        own: CancellationToken,
    ) -> Option<Arc<Cell>> {
        let cell = Cell::new(def.report());
        let entry = Entry { def, task, cell: Arc::clone(&cell), own };
        let mut phase = self.phase();
        match &mut *phase {
            Phase::Registering(entries) => entries.push(entry),
            Phase::Started { cancel, stages, stopped_through } => {
                if stopped_through.is_some_and(|through| entry.def.stop <= through) {
                    // Shutting down: a task of a stopped stage never runs.
                    return None;
                }
                let stage = stages
                    .entry(entry.def.stop)
                    .or_insert_with(|| Stage { stop: cancel.child_token(), tasks: Vec::new() });
                stage.tasks.retain(|(_, task)| !task.is_finished());
                stage.spawn(entry, &self.metrics);
            }
        }
        self.board.add(Arc::clone(&cell));
        Some(cell)
    }
}

/// Owns every background task until [`Driver::start`].
pub struct Driver {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("board", &self.shared.board).finish_non_exhaustive()
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
        let shared = Shared {
            board: Board::default(),
            metrics: Metrics::new(meter),
            phase: Mutex::new(Phase::Registering(Vec::new())),
        };
        Self { shared: Arc::new(shared) }
    }

    /// Adds a task for the gateway's whole life; it runs once the driver
    /// starts.
    pub fn register(&mut self, def: TaskDef, task: impl BackgroundTask) {
        // Stopped with its stage only.
        self.shared.add(def, Box::new(task), CancellationToken::new());
    }

    /// A handle that adds tasks later, while the driver runs (tasks of
    /// things that come and go, such as an upstream registered at run time).
    pub fn spawner(&self) -> Spawner {
        Spawner { shared: Arc::clone(&self.shared) }
    }

    /// The board of the registered tasks (and of those registered later).
    pub fn board(&self) -> Board {
        self.shared.board.clone()
    }

    /// Starts every task: each is activated at once.
    pub fn start(self) -> Running {
        let cancel = CancellationToken::new();
        let mut stages: BTreeMap<StopOrder, Stage> = BTreeMap::new();
        let mut phase = self.shared.phase();
        let started = Phase::Started {
            cancel: cancel.clone(),
            stages: BTreeMap::new(),
            stopped_through: None,
        };
        let Phase::Registering(entries) = std::mem::replace(&mut *phase, started) else {
            unreachable!("a driver starts once: `start` takes it by value");
        };
        for entry in entries {
            let stage = stages
                .entry(entry.def.stop)
                .or_insert_with(|| Stage { stop: cancel.child_token(), tasks: Vec::new() });
            stage.spawn(entry, &self.shared.metrics);
        }
        if let Phase::Started { stages: running, .. } = &mut *phase {
            *running = stages;
        }
        drop(phase);
        Running { cancel, shared: Arc::clone(&self.shared) }
    }
}

/// Adds tasks to a driver, before or after it starts. Cheap to clone.
#[derive(Clone)]
pub struct Spawner {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawner").finish_non_exhaustive()
    }
}

impl Spawner {
    /// Adds a task, which runs until the handle is dropped (or its stage
    /// stops): at once if the driver runs, else when it starts. During
    /// shutdown, a task of a stage already stopped never runs.
    #[must_use = "dropping the handle stops the task"]
    pub fn spawn(&self, def: TaskDef, task: impl BackgroundTask) -> TaskHandle {
        let own = CancellationToken::new();
        let cell = self.shared.add(def, Box::new(task), own.clone());
        TaskHandle { own, cell, board: self.shared.board.clone() }
    }
}

/// A task added through a [`Spawner`]. Dropping it stops the task (after
/// its current activation, or at once for [`OnStop::Abandon`]) and takes it
/// off the board.
#[derive(Debug)]
pub struct TaskHandle {
    own: CancellationToken,
    /// Its board entry; `None` for a task that never ran (spawned during
    /// shutdown).
    cell: Option<Arc<Cell>>,
    board: Board,
}

impl Drop for TaskHandle {
    fn drop(&mut self) {
        self.own.cancel();
        if let Some(cell) = &self.cell {
            self.board.remove(cell);
        }
    }
}

/// The tasks of one stop order.
#[derive(Debug)]
struct Stage {
    stop: CancellationToken,
    tasks: Vec<(String, JoinHandle<()>)>,
}

impl Stage {
    fn spawn(&mut self, entry: Entry, metrics: &Metrics) {
        let name = entry.def.name.clone();
        let handle = tokio::spawn(drive(entry, metrics.clone(), self.stop.clone()));
        self.tasks.push((name, handle));
    }
}

/// The running tasks. Dropping it stops them all at once; [`Running::shutdown`]
/// stops them in order.
pub struct Running {
    cancel: CancellationToken,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("board", &self.shared.board).finish_non_exhaustive()
    }
}

impl Running {
    pub fn board(&self) -> Board {
        self.shared.board.clone()
    }

    /// Stops, stage by stage, every task whose stop order is at most
    /// `order`, waiting for each stage before the next.
    pub async fn stop_through(&mut self, order: StopOrder) {
        let now = {
            let mut phase = self.shared.phase();
            let Phase::Started { stages, stopped_through, .. } = &mut *phase else {
                return;
            };
            *stopped_through = Some(stopped_through.map_or(order, |s| s.max(order)));
            let later = match order.0.checked_add(1) {
                Some(next) => stages.split_off(&StopOrder(next)),
                None => BTreeMap::new(),
            };
            std::mem::replace(stages, later)
        };
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
async fn drive(mut entry: Entry, metrics: Metrics, stage: CancellationToken) {
    // Stopped with its stage, or alone when its handle is dropped.
    let stop = Stop { stage, own: entry.own.clone() };
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

/// A task's two ways to stop: its stage's, and its own handle's.
struct Stop {
    stage: CancellationToken,
    own: CancellationToken,
}

impl Stop {
    fn is_cancelled(&self) -> bool {
        self.stage.is_cancelled() || self.own.is_cancelled()
    }

    async fn cancelled(&self) {
        tokio::select! {
            () = self.stage.cancelled() => {}
            () = self.own.cancelled() => {}
        }
    }
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
