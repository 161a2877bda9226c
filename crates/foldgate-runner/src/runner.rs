//! The runner: works inside gateway-run branches until they end.
//!
//! A run is a tool loop. The model sees the gateway's system text, the
//! branch's description and prompt, and nothing else of the caller's; each
//! tool it asks for is called through the same metered path as an agent's
//! own calls ([`foldgate_upstream::meter`]); its final answer, scrubbed, is
//! the branch's return message. Every step is written to the store as it
//! completes, under a lease this replica renews; if the replica dies,
//! another takes the run over once the lease lapses and replays the steps.
//!
//! The books are exact because every token passes through here: after each
//! model call the branch's spending is set to its context as the provider
//! counted it (the call's input plus its output); before each call the
//! answer is capped to what the budget has left, and the run stops when too
//! little is left to be useful. The deadline cancels whatever is in flight.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use foldgate_domain::{
    Branch, BranchId, BranchStatus, EndReason, Principal, ReturnTier, TenantId, Tokens, duration,
};
use foldgate_engine::{CallTarget, CreateBranch, FoldError, FoldingService, ScrubFailure};
use foldgate_store::{
    Finish, NewRun, NewStep, Run, RunEnd, RunState, RunStep, StepKind, StepWritten, UsageKind,
};
use foldgate_upstream::{
    Caller, Lookup, Upstream, UpstreamTool, Upstreams,
    meter::{self, Answer, CallFailure, UpstreamCall},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

mod conversation;
mod distill;
mod reconcile;
#[cfg(test)]
mod tests;
mod tool_loop;

use self::conversation::*;

use crate::{
    RunMetrics, RunOutcome,
    model::{Call, Model, ModelFailure, Models, ToolSpec, Turn},
};

/// How the runner works (`[runner]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunnerConfig {
    /// How long a replica holds a run without renewing it; another replica
    /// takes the run over once this has lapsed. Renewed every third of it.
    /// A bare number counts seconds.
    #[serde(alias = "lease_seconds", deserialize_with = "duration::seconds")]
    pub lease: Duration,
    /// How often each replica looks for runs whose lease lapsed. A bare
    /// number counts seconds.
    #[serde(alias = "poll_interval_seconds", deserialize_with = "duration::seconds")]
    pub poll_interval: Duration,
    /// The most runs taken over in one pass.
    pub batch_size: u32,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(5),
            batch_size: 16,
        }
    }
}

impl RunnerConfig {
    /// The former names of its settings.
    pub const RENAMED: &'static [duration::Renamed] = &[
        duration::Renamed::new("lease_seconds", "lease"),
        duration::Renamed::new("poll_interval_seconds", "poll_interval"),
    ];

    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        let hour = Duration::from_secs(3_600);
        duration::check_range("lease", self.lease, Duration::from_secs(3), hour)?;
        duration::check_range("poll_interval", self.poll_interval, Duration::from_secs(1), hour)?;
        if self.batch_size == 0 {
            return Err("batch_size must be at least 1".into());
        }
        Ok(())
    }
}

/// An answer shorter than this is not worth a model call: at that point the
/// budget is spent.
const MIN_ANSWER_TOKENS: Tokens = 16;
/// How often a replica checks that the branches of its runs are still
/// active (a session end or a parent's return ends one from outside).
const BRANCH_CHECK: Duration = Duration::from_millis(500);
/// How often a caller waiting for a run on another replica reads its state.
const WAIT_POLL: Duration = Duration::from_millis(250);
/// How often a caller waiting for a run worked on in this process reads its
/// state all the same (the run tells it of each step and of its end).
const LOCAL_RECHECK: Duration = Duration::from_secs(5);
/// The most tool calls one model answer may ask for; more are answered with
/// an error.
const MAX_CALLS_PER_ANSWER: usize = 16;

/// A `branch_run` request, validated.
#[derive(Debug, Clone)]
pub struct RunBranch {
    pub create: CreateBranch,
    /// The `[[models]]` entry, by name; `None`: the tenant's first.
    pub model: Option<String>,
    /// `<upstream>__<tool>` names the model may call; `None`: every upstream
    /// tool the caller may call.
    pub tools: Option<Vec<String>>,
}

/// Who started a run: its principal and its token's scopes, kept with the
/// run so that a replica resuming it grants the same tools.
#[derive(Debug, Clone)]
pub struct Grant {
    pub principal: Principal,
    pub scopes: BTreeSet<String>,
}

impl Caller for Grant {
    fn tenant(&self) -> &TenantId {
        &self.principal.tenant
    }

    fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }
}

/// Runs gateway-run branches. One per process, shared.
#[derive(Debug)]
pub struct Runner {
    service: Arc<FoldingService>,
    upstreams: Arc<Upstreams>,
    models: Arc<Models>,
    config: RunnerConfig,
    metrics: RunMetrics,
    /// This replica, as the holder of leases.
    owner: String,
    /// The runs this process works on: their steps, for callers waiting
    /// here, and the signal that their branch was ended from outside.
    local: Mutex<HashMap<BranchId, Local>>,
    /// The runs this process works on, waited for at shutdown.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

/// A run this process works on.
#[derive(Debug)]
struct Local {
    /// Steps written so far.
    steps: watch::Sender<u32>,
    /// Cancelled when its branch was found ended from outside.
    ended: CancellationToken,
}

/// Why a run stopped.
#[derive(Debug)]
enum Stop {
    /// The model gave its final answer.
    Done(String),
    /// Too little budget left for another model call, or a tool call used
    /// it up.
    Budget,
    Deadline,
    /// The branch was ended from outside (session end, a parent's return,
    /// the supervisor).
    Ended,
    Model(ModelFailure),
    /// This replica no longer holds the run: leave it to the one that does.
    LeaseLost,
}

/// A model step as stored.
#[derive(Debug, Serialize, Deserialize)]
struct ModelBody {
    text: String,
    calls: Vec<Call>,
}

/// A tool step as stored.
#[derive(Debug, Serialize, Deserialize)]
struct ToolBody {
    call_id: String,
    name: String,
    /// What the model got back.
    content: String,
    error: bool,
}

/// The model's side of a run, rebuilt from its steps.
#[derive(Debug, Default)]
struct Conversation {
    turns: Vec<Turn>,
    /// Steps written; the next one's number.
    seq: u32,
    model_calls: u32,
    /// Calls of the last model step not yet answered.
    pending: Vec<Call>,
    /// The last model step's answer, when it asked for no tool.
    final_text: Option<String>,
    /// The model was asked to shorten its finding to the tier.
    compress_asked: bool,
    /// The last text the model wrote, for a run that is cut.
    last_text: String,
}

impl Runner {
    pub fn new(
        service: Arc<FoldingService>,
        upstreams: Arc<Upstreams>,
        models: Arc<Models>,
        config: RunnerConfig,
        metrics: RunMetrics,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            service,
            upstreams,
            models,
            config,
            metrics,
            owner: format!("replica-{}", uuid::Uuid::new_v4().simple()),
            local: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            shutdown,
        })
    }

    pub fn models(&self) -> &Arc<Models> {
        &self.models
    }

    /// Opens the branch as `branch_create` would, with its run, and starts
    /// working on it in the background. Returns the branch at once.
    #[tracing::instrument(name = "run.start", skip_all, fields(tenant = %who.principal.tenant))]
    pub async fn start(self: &Arc<Self>, who: &Grant, req: RunBranch) -> Result<Branch, FoldError> {
        let tenant = &who.principal.tenant;
        let rules = self.service.tenant_rules().of(tenant);
        // A model the tenant's settings leave out is one it does not have.
        let model = self
            .models
            .for_tenant(tenant, req.model.as_deref())
            .filter(|m| rules.allows_model(&m.config.name))
            .ok_or_else(|| FoldError::ModelNotFound {
                name: req.model.clone().unwrap_or_else(|| "(default)".into()),
            })?;
        let tools = self.grantable_tools(who, req.tools.as_deref())?;
        let run = NewRun {
            model: model.config.name.clone(),
            tools,
            scopes: who.scopes.iter().cloned().collect(),
            lease_owner: self.owner.clone(),
            lease_until: self.lease_end(),
            lessons: None,
        };
        let created = self.service.create_run(&who.principal, req.create, run).await?;
        let branch = created.branch;
        self.spawn(branch.tenant.clone(), branch.id, false);
        Ok(branch)
    }

    /// The tool names a run may use: those asked for, each of which the
    /// caller may call, or every upstream tool the caller may call.
    fn grantable_tools(
        &self,
        who: &Grant,
        asked: Option<&[String]>,
    ) -> Result<Vec<String>, FoldError> {
        let Some(asked) = asked else {
            return Ok(self
                .upstreams
                .tools_for(who)
                .into_iter()
                .map(|t| t.name.to_string())
                .collect());
        };
        for name in asked {
            if !matches!(self.upstreams.lookup(who, name), Lookup::Found(..)) {
                return Err(FoldError::Invalid(foldgate_domain::InvalidInput::new(
                    "tools",
                    format!("{name:?} is not an upstream tool this token may call"),
                )));
            }
        }
        Ok(asked.to_vec())
    }

    /// Waits until a run is done, from this replica or any other, calling
    /// `on_step` with the steps written as they grow. The caller must own
    /// the branch.
    pub async fn wait(
        &self,
        who: &Principal,
        id: BranchId,
        mut on_step: impl FnMut(u32) + Send,
    ) -> Result<RunOutcome, FoldError> {
        let mut local = self.subscribe(id);
        let mut seen = None;
        let mut report = |steps: u32| {
            if seen != Some(steps) {
                seen = Some(steps);
                on_step(steps);
            }
        };
        loop {
            match self.outcome_or_steps(who, id).await? {
                Ok(outcome) => return Ok(outcome),
                Err(steps) => report(steps),
            }
            let Some(rx) = &mut local else {
                // Worked on by another replica: its steps are in the store.
                tokio::time::sleep(WAIT_POLL).await;
                continue;
            };
            // Worked on here: follow it without reading the store, until it
            // stops (done, or given up to another replica).
            loop {
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            local = None;
                            break;
                        }
                        report(*rx.borrow_and_update());
                    }
                    () = tokio::time::sleep(LOCAL_RECHECK) => break,
                }
            }
        }
    }

    /// A run's outcome if it is done, else the steps written so far.
    pub async fn outcome_or_steps(
        &self,
        who: &Principal,
        id: BranchId,
    ) -> Result<Result<RunOutcome, u32>, FoldError> {
        let run = self.owned_run(who, id).await?;
        match (run.state, &run.outcome) {
            (RunState::Done, Some(outcome)) => serde_json::from_str(outcome)
                .map(Ok)
                .map_err(|e| FoldError::Store(foldgate_store::StoreError::Corrupt(e.to_string()))),
            _ => Ok(Err(run.steps)),
        }
    }

    /// A run and its steps, for `branch_status`.
    pub async fn run_of(
        &self,
        who: &Principal,
        id: BranchId,
    ) -> Result<Option<(Run, Vec<RunStep>)>, FoldError> {
        let store = self.service.store();
        let Some(run) = store.run(&who.tenant, id).await? else { return Ok(None) };
        let steps = store.run_steps(&who.tenant, id).await?;
        Ok(Some((run, steps)))
    }

    async fn owned_run(&self, who: &Principal, id: BranchId) -> Result<Run, FoldError> {
        let store = self.service.store();
        let owned = store.branch(&who.tenant, id).await?.is_some_and(|b| b.owner == who.subject);
        match store.run(&who.tenant, id).await? {
            Some(run) if owned => Ok(run),
            _ => Err(FoldError::BranchNotFound),
        }
    }

    fn locals(&self) -> std::sync::MutexGuard<'_, HashMap<BranchId, Local>> {
        self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn subscribe(&self, id: BranchId) -> Option<watch::Receiver<u32>> {
        self.locals().get(&id).map(|l| l.steps.subscribe())
    }

    fn lease_end(&self) -> DateTime<Utc> {
        let lease = chrono::Duration::from_std(self.config.lease).unwrap_or_default();
        self.service.clock().now() + lease
    }

    fn spawn(self: &Arc<Self>, tenant: TenantId, id: BranchId, resumed: bool) {
        let ended = CancellationToken::new();
        {
            let mut map = self.locals();
            if map.contains_key(&id) {
                // Already worked on here (its lease lapsed while a renewal
                // failed, and this replica took it over again).
                return;
            }
            map.insert(id, Local { steps: watch::channel(0).0, ended: ended.clone() });
        }
        let runner = Arc::clone(self);
        let span = tracing::info_span!("run", tenant = %tenant, branch.id = %id, resumed);
        self.tasks.spawn(
            async move {
                runner.metrics.working(1);
                if let Err(e) = runner.execute(&tenant, id, resumed, &ended).await {
                    // The lease lapses and the run is taken over again.
                    tracing::error!(tenant = %tenant, branch_id = %id, error = %e,
                        "a run failed; it will be taken over when its lease lapses");
                }
                runner.metrics.working(-1);
                runner.locals().remove(&id);
            }
            .instrument(span),
        );
    }

    fn notify(&self, id: BranchId, steps: u32) {
        if let Some(local) = self.locals().get(&id) {
            local.steps.send_replace(steps);
        }
    }

    /// Works on a run until it is done, this replica loses it, or the
    /// process shuts down (then the lease is given up, so that another
    /// replica takes the run over at once).
    async fn execute(
        self: &Arc<Self>,
        tenant: &TenantId,
        id: BranchId,
        resumed: bool,
        ended: &CancellationToken,
    ) -> Result<(), FoldError> {
        let store = Arc::clone(self.service.store());
        let Some(run) = store.run(tenant, id).await? else { return Ok(()) };
        if run.state == RunState::Done {
            return Ok(());
        }
        let Some(branch) = store.branch(tenant, id).await? else { return Ok(()) };
        let steps = store.run_steps(tenant, id).await?;
        let mut talk = Conversation::replay(&branch, &steps);
        let lost = CancellationToken::new();
        let renewer = tokio::spawn(Arc::clone(self).renew(tenant.clone(), id, lost.clone()));

        let stop = match self.models.for_tenant(tenant, Some(&run.model)) {
            None => Stop::Model(ModelFailure {
                kind: crate::model::FaultKind::Refused,
                detail: format!("model {:?} is no longer configured for this tenant", run.model),
                attempts: 0,
            }),
            Some(_) if branch.status != BranchStatus::Active => Stop::Ended,
            Some(model) => {
                let deadline = tokio::time::Instant::now()
                    + (branch.deadline_at - self.service.clock().now())
                        .to_std()
                        .unwrap_or_default();
                let drive = self.drive(&branch, &run, &model, &mut talk, resumed);
                tokio::select! {
                    stop = drive => stop,
                    () = tokio::time::sleep_until(deadline) => Stop::Deadline,
                    () = ended.cancelled() => Stop::Ended,
                    () = lost.cancelled() => Stop::LeaseLost,
                    () = self.shutdown.cancelled() => Stop::LeaseLost,
                }
            }
        };
        renewer.abort();
        if matches!(stop, Stop::LeaseLost) {
            if self.shutdown.is_cancelled() {
                // Give the run up now rather than when the lease lapses.
                let now = self.service.clock().now();
                store.renew_run_lease(tenant, id, &self.owner, now).await?;
            }
            return Ok(());
        }
        self.conclude(&branch, &run, talk, stop).await
    }

    /// Renews the lease every third of it; cancels `lost` when it can no
    /// longer be renewed.
    async fn renew(self: Arc<Self>, tenant: TenantId, id: BranchId, lost: CancellationToken) {
        loop {
            tokio::time::sleep(self.config.lease / 3).await;
            match self
                .service
                .store()
                .renew_run_lease(&tenant, id, &self.owner, self.lease_end())
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(%tenant, branch_id = %id, "the run's lease was lost");
                    lost.cancel();
                    return;
                }
                // A database hiccup: the lease has two more thirds to go.
                Err(e) => {
                    tracing::warn!(%tenant, branch_id = %id, error = %e, "renewing a run's lease failed")
                }
            }
        }
    }
}
