//! Background reconcilers.
//!
//! Each reconciler is a task of the background driver, activated by a timer
//! (and the deadline reconciler also by a trigger when a nearer deadline
//! appears, and at the earliest deadline it knows of); it takes no input, reads what
//! is due from the database and acts on it. Activations are idempotent: the
//! store's conditional transitions make a second firing a no-op, and claims
//! with a lease (`FOR UPDATE SKIP LOCKED` on Postgres) keep replicas from
//! doing the same work. Because the database is the source of truth, the
//! first activation after a start fires every deadline that passed while the
//! process was down.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use foldgate_background::{
    Activation, BackgroundTask, BoxFuture, Driver, Next, StopOrder, TaskDef,
};
use foldgate_domain::{BranchId, EndReason};
use serde_json::json;

use crate::{FoldError, FoldingService, RetentionConfig, SupervisorConfig};

/// What one activation of a reconciler did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// When the pass ran.
    pub at: Option<DateTime<Utc>>,
    /// Branches force-returned by this pass, with the reason.
    pub fired: Vec<(BranchId, EndReason)>,
    /// Sessions ended by this pass.
    pub sessions_ended: u64,
    /// The error that cut the pass short, if any (it is retried next time).
    pub error: Option<String>,
}

/// The shortest sleep between two deadline passes, so that a deadline that
/// cannot be fired right now does not turn the loop into a busy one.
const MIN_SLEEP: Duration = Duration::from_millis(10);

/// Fires deadlines and finishes branches whose budget ran out.
#[derive(Debug, Clone)]
pub struct DeadlineReconciler {
    service: Arc<FoldingService>,
    config: SupervisorConfig,
}

impl DeadlineReconciler {
    pub fn new(service: Arc<FoldingService>, config: SupervisorConfig) -> Self {
        Self { service, config }
    }

    /// One pass: claims due branches batch by batch, deepest first, and
    /// force-returns each batch (in one transaction where it can).
    pub async fn activate(&self) -> Pass {
        let mut pass = Pass { at: Some(self.service.clock().now()), ..Pass::default() };
        if let Err(e) = self.fire_due(&mut pass).await {
            tracing::error!(error = %e, "deadline pass failed");
            pass.error = Some(e.to_string());
        }
        pass
    }

    async fn fire_due(&self, pass: &mut Pass) -> Result<(), FoldError> {
        let store = self.service.store();
        loop {
            // Each claim's lease starts when it is taken, however long the
            // pass has been running.
            let now = self.service.clock().now();
            let mut due = store
                .claim_due_branches(now, self.config.claim_lease, self.config.batch_size)
                .await?;
            if due.is_empty() {
                return Ok(());
            }
            due.sort_by_key(|b| std::cmp::Reverse(b.depth));
            for (fired, reason) in self.service.force_return_due(&due).await? {
                let late = fired.completed_at.unwrap_or(now) - fired.deadline_at;
                if reason == EndReason::DeadlineExceeded {
                    self.service.metrics().deadline_fired(late.to_std().unwrap_or_default());
                }
                tracing::debug!(branch_id = %fired.id, %reason,
                    late_ms = late.num_milliseconds(), "branch due, force-returned");
                pass.fired.push((fired.id, reason));
            }
            if due.len() < self.config.batch_size as usize {
                return Ok(());
            }
        }
    }

    /// When to wake: at the earliest unclaimed deadline, at most one poll
    /// interval from now.
    async fn next_wake(&self) -> DateTime<Utc> {
        let now = self.service.clock().now();
        let poll = now + to_delta(self.config.deadline_poll_interval);
        match self.service.store().next_deadline(now).await {
            Ok(Some(deadline)) => deadline.clamp(now, poll),
            Ok(None) => poll,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the next deadline");
                poll
            }
        }
    }

    /// One activation on the driver: a pass, then the planned wake-up — at
    /// the earliest unclaimed deadline, at most a poll interval away (a
    /// poll interval after a failed pass: the database is probably
    /// unavailable). A create with an earlier deadline triggers it sooner.
    async fn activate_on_driver(&self) -> Activation {
        // Until the next wake-up is planned, every create signals: a
        // deadline created while this pass runs is not missed.
        self.service.plan_wake(DateTime::<Utc>::MAX_UTC);
        let pass = self.activate().await;
        let wake = if pass.error.is_some() {
            self.service.clock().now() + to_delta(self.config.deadline_poll_interval)
        } else {
            self.next_wake().await
        };
        self.service.plan_wake(wake);
        let sleep = (wake - self.service.clock().now()).to_std().unwrap_or_default().max(MIN_SLEEP);
        pass.activation().next(Next::After(sleep))
    }
}

impl BackgroundTask for DeadlineReconciler {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.activate_on_driver())
    }
}

fn to_delta(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Ends sessions that have been idle for `session_idle_timeout`.
#[derive(Debug, Clone)]
pub struct IdleSessionReconciler {
    service: Arc<FoldingService>,
    config: SupervisorConfig,
}

impl IdleSessionReconciler {
    pub fn new(service: Arc<FoldingService>, config: SupervisorConfig) -> Self {
        Self { service, config }
    }

    pub async fn activate(&self) -> Pass {
        let now = self.service.clock().now();
        let mut pass = Pass { at: Some(now), ..Pass::default() };
        if let Err(e) = self.end_idle(now, &mut pass).await {
            tracing::error!(error = %e, "idle-session pass failed");
            pass.error = Some(e.to_string());
        }
        pass
    }

    async fn end_idle(&self, now: DateTime<Utc>, pass: &mut Pass) -> Result<(), FoldError> {
        let idle = to_delta(self.service.config().session_idle_timeout);
        let idle_since = now.checked_sub_signed(idle).unwrap_or(DateTime::<Utc>::MIN_UTC);
        loop {
            let sessions = self
                .service
                .store()
                .claim_idle_sessions(
                    idle_since,
                    now,
                    self.config.claim_lease,
                    self.config.batch_size,
                )
                .await?;
            for session in &sessions {
                let ended = self
                    .service
                    .end_session_of(&session.tenant, &session.id, Some(idle_since))
                    .await?;
                if ended.session_ended {
                    tracing::info!(tenant = %session.tenant, session_id = %session.id,
                        branches_ended = ended.branches_ended, "idle session ended");
                    pass.sessions_ended += 1;
                }
            }
            if sessions.len() < self.config.batch_size as usize {
                return Ok(());
            }
        }
    }
}

impl BackgroundTask for IdleSessionReconciler {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move { IdleSessionReconciler::activate(self).await.activation() })
    }
}

impl Pass {
    /// The pass as the driver reports it.
    fn activation(&self) -> Activation {
        let status = json!({
            "fired": self.fired.len(),
            "sessions_ended": self.sessions_ended,
        });
        match &self.error {
            Some(error) => Activation::failed(error, status),
            None => Activation::ok(status),
        }
    }
}

/// Registers the reconcilers on the driver: deadlines (woken by creates
/// with an earlier deadline, at most every `deadline_poll_interval`) and
/// idle sessions (every `idle_poll_interval`). Their first passes run when
/// the driver starts, recovering whatever fell due while no process was
/// running; at shutdown they stop after their current pass.
/// Deletes what ended long ago ([`FoldingService::prune`]), every
/// retention `interval` and once at start.
#[derive(Debug)]
pub struct RetentionReconciler {
    service: Arc<FoldingService>,
    config: RetentionConfig,
}

impl BackgroundTask for RetentionReconciler {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.service.prune(&self.config).await {
                Ok(pruned) => Activation::ok(json!(pruned)),
                Err(e) => {
                    tracing::warn!(error = %e, "a retention pass failed; the next one goes on");
                    Activation::failed(e, json!({}))
                }
            }
        })
    }
}

/// Registers the retention reconciler.
pub fn register_retention(
    driver: &mut Driver,
    service: Arc<FoldingService>,
    config: RetentionConfig,
) {
    let def = TaskDef::new("retention", StopOrder::SUPERVISOR).period(config.interval);
    driver.register(def, RetentionReconciler { service, config });
}

pub fn register(driver: &mut Driver, service: Arc<FoldingService>, config: SupervisorConfig) {
    let deadlines = TaskDef::new("deadlines", StopOrder::SUPERVISOR)
        .period(config.deadline_poll_interval)
        .trigger(service.deadline_activator());
    driver.register(deadlines, DeadlineReconciler::new(Arc::clone(&service), config.clone()));
    let idle =
        TaskDef::new("idle_sessions", StopOrder::SUPERVISOR).period(config.idle_poll_interval);
    driver.register(idle, IdleSessionReconciler::new(service, config));
}
