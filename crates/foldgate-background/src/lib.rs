//! foldgate's background work.
//!
//! Every background task of the gateway — the supervisor's reconcilers, the
//! runner's, the upstream tool lists, the store gauges, the usage flusher,
//! the rate limiter's cleanup, the database outage probe, the JWKS refresh —
//! implements [`BackgroundTask`]: one method, [`BackgroundTask::activate`],
//! that does one pass and reports how it went. The [`Driver`] owns them all:
//! it activates each at start, then on its period and whenever one of its
//! triggers ([`Activator`]) fires; a task whose cadence adapts (a backoff, a
//! sleep until the next deadline) says when it wants to run next
//! ([`Next`]). Nothing else spawns a loop or sleeps between passes.
//!
//! At shutdown the driver stops the tasks stage by stage in their
//! [`StopOrder`], each as its [`OnStop`] says. Tasks of things that come and
//! go while the gateway runs (an upstream registered through the admin API)
//! are added through a [`Spawner`] and stop when their [`TaskHandle`] is
//! dropped. What every task last did is kept on a [`Board`] (for the ops endpoint and readiness) and recorded as
//! metrics (`foldgate.background.activations`,
//! `foldgate.background.activation.duration`).

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::Notify;

mod driver;
mod status;

pub use driver::{Driver, Running, Spawner, TaskDef, TaskHandle};
pub use status::{Board, LastActivation, Reason, State, TaskReport};

/// A boxed future, as [`BackgroundTask::activate`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A piece of background work the [`Driver`] activates.
pub trait BackgroundTask: Send + 'static {
    /// Does one pass and says how it went and when to run next. Never
    /// sleeps between passes: that is the driver's job.
    fn activate(&mut self) -> BoxFuture<'_, Activation>;
}

/// What one activation did.
#[derive(Debug, Clone, PartialEq)]
pub struct Activation {
    /// What the pass did or found, as JSON (shown on the ops endpoint).
    pub status: Value,
    /// Why the pass failed, if it did (it is retried at the next activation).
    pub error: Option<String>,
    /// When the task wants to run next.
    pub next: Next,
}

impl Activation {
    /// A pass that went well.
    pub fn ok(status: Value) -> Self {
        Self { status, error: None, next: Next::Period }
    }

    /// A pass that failed.
    pub fn failed(error: impl fmt::Display, status: Value) -> Self {
        Self { status, error: Some(error.to_string()), next: Next::Period }
    }

    /// The same activation, asking to run next as `next` says.
    #[must_use]
    pub fn next(self, next: Next) -> Self {
        Self { next, ..self }
    }
}

/// When a task wants its next activation (a trigger always activates it
/// sooner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Next {
    /// One period from now; for a task without a period, at its next
    /// trigger.
    #[default]
    Period,
    /// After this long, whatever the period.
    After(Duration),
    /// At its next trigger only.
    Trigger,
}

/// A handle that asks for a task's activation: given to the task's
/// registration as a trigger, and to whatever should wake it (a create with
/// an earlier deadline, the database outage being noticed).
#[derive(Debug, Clone, Default)]
pub struct Activator(Arc<Notify>);

impl Activator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for an activation: at once if the task is waiting, or right
    /// after the activation in progress. Requests made before the task
    /// wakes count as one.
    pub fn activate(&self) {
        self.0.notify_one();
    }

    async fn activated(&self) {
        self.0.notified().await;
    }
}

/// When a task stops at shutdown: stages stop in ascending order, each
/// after the previous one has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct StopOrder(pub u8);

impl StopOrder {
    /// Tasks that serve requests (tool lists, signing keys, the rate
    /// limiter, the outage probe): they stop first, once the listeners
    /// have drained.
    pub const SERVING: Self = Self(10);
    /// The runner's reconcilers: they stop before the runs give their
    /// leases up, so that no run is taken over meanwhile.
    pub const RUNS: Self = Self(20);
    /// The supervisor's reconcilers (deadlines, idle sessions).
    pub const SUPERVISOR: Self = Self(30);
    /// The usage flusher: its last pass writes what the calls of the grace
    /// period added.
    pub const USAGE: Self = Self(40);
    /// The store gauges: last, as they read the database until it closes.
    pub const GAUGES: Self = Self(50);
}

/// What stopping does to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStop {
    /// The activation in progress, if any, is dropped (it is safe to cut).
    Abandon,
    /// The activation in progress, if any, completes.
    Finish,
    /// The activation in progress completes, then one more runs.
    LastPass,
}
