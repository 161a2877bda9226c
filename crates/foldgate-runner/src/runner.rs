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
    Branch, BranchId, BranchStatus, EndReason, Principal, ReturnTier, TenantId, Tokens,
};
use foldgate_engine::{CallTarget, CreateBranch, FoldError, FoldingService};
use foldgate_store::{Finish, NewRun, NewStep, Run, RunState, RunStep, StepKind, StepWritten};
use foldgate_upstream::{
    Caller, Lookup, Upstream, UpstreamTool, Upstreams,
    meter::{self, Answer, CallFailure, UpstreamCall},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

mod reconcile;

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
    pub lease_seconds: u64,
    /// How often each replica looks for runs whose lease lapsed.
    pub poll_interval_seconds: u64,
    /// The most runs taken over in one pass.
    pub batch_size: u32,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self { lease_seconds: 30, poll_interval_seconds: 5, batch_size: 16 }
    }
}

impl RunnerConfig {
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        if !(3..=3_600).contains(&self.lease_seconds) {
            return Err("lease_seconds must be between 3 and 3600".into());
        }
        if !(1..=3_600).contains(&self.poll_interval_seconds) {
            return Err("poll_interval_seconds must be between 1 and 3600".into());
        }
        if self.batch_size == 0 {
            return Err("batch_size must be at least 1".into());
        }
        Ok(())
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(self.poll_interval_seconds)
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
        let model = self.models.for_tenant(tenant, req.model.as_deref()).ok_or_else(|| {
            FoldError::ModelNotFound {
                name: req.model.clone().unwrap_or_else(|| "(default)".into()),
            }
        })?;
        let tools = self.grantable_tools(who, req.tools.as_deref())?;
        let run = NewRun {
            model: model.config.name.clone(),
            tools,
            scopes: who.scopes.iter().cloned().collect(),
            lease_owner: self.owner.clone(),
            lease_until: self.lease_end(),
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
        let lease = chrono::Duration::from_std(self.config.lease()).unwrap_or_default();
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
            tokio::time::sleep(self.config.lease() / 3).await;
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

    /// The tool loop.
    async fn drive(
        &self,
        branch: &Branch,
        run: &Run,
        model: &Model,
        talk: &mut Conversation,
        resumed: bool,
    ) -> Stop {
        let tenant = &branch.tenant;
        let store = self.service.store();
        let tools = self.tools_of(branch, run);
        let specs: Vec<ToolSpec> = tools.values().map(|(_, t)| spec(t)).collect();
        let system = system_text(branch.return_tier);
        // The first call's input holds what the branch was not charged for
        // at creation: the system text and the tool definitions.
        let overhead = self.service.tokens().count(&system)
            + self
                .service
                .tokens()
                .count(&serde_json::to_string(&specs_json(&specs)).unwrap_or_default());
        // A step in flight when the previous replica died is made again.
        let mut repeated = resumed;
        loop {
            if let Some(text) = talk.final_text.take() {
                let too_long = self.service.tokens().count(&text) > branch.return_tier.max_tokens();
                if too_long && !talk.compress_asked {
                    talk.compress_asked = true;
                    talk.turns.push(Turn::User(compress_text(branch.return_tier)));
                } else {
                    return Stop::Done(text);
                }
            }
            let Ok(Some(now)) = store.branch(tenant, branch.id).await else { return Stop::Ended };
            if now.status != BranchStatus::Active {
                return Stop::Ended;
            }
            if !talk.pending.is_empty() {
                let calls = std::mem::take(&mut talk.pending);
                match self.call_tools(&now, run, &tools, calls, talk, repeated).await {
                    Ok(false) => {}
                    Ok(true) => return Stop::Budget,
                    Err(stop) => return stop,
                }
                repeated = false;
                continue;
            }
            let estimate = now.ledger.used + if talk.model_calls == 0 { overhead } else { 0 };
            let left =
                now.ledger.budget.saturating_sub(now.ledger.reserved).saturating_sub(estimate);
            // The provider counts with its own tokenizer: leave a tenth.
            let cap = Tokens::from(model.config.max_output_tokens).min(left - left / 10);
            if cap < MIN_ANSWER_TOKENS {
                return Stop::Budget;
            }
            let started = Instant::now();
            let span = tracing::info_span!("run.step", kind = "model", seq = talk.seq, model = %model.config.name);
            let answer = model
                .complete(
                    &system,
                    &talk.turns,
                    &specs,
                    u32::try_from(cap).unwrap_or(u32::MAX),
                    &self.metrics,
                )
                .instrument(span)
                .await;
            let completion = match answer {
                Ok(completion) => completion,
                Err(failure) => return Stop::Model(failure),
            };
            let body = ModelBody { text: completion.text.clone(), calls: completion.calls.clone() };
            let step = NewStep {
                seq: talk.seq,
                kind: StepKind::Model,
                body: serde_json::to_string(&body).unwrap_or_default(),
                input_tokens: completion.input_tokens,
                output_tokens: completion.output_tokens,
                context_tokens: Some(completion.input_tokens + completion.output_tokens),
                duration: started.elapsed(),
                repeated,
                at: self.service.clock().now(),
            };
            repeated = false;
            let written = match store.record_step(tenant, branch.id, &self.owner, &step).await {
                Ok(StepWritten::Written(consumption)) => consumption,
                Ok(StepWritten::NotOwner) => return Stop::LeaseLost,
                Err(e) => {
                    tracing::warn!(error = %e, "writing a model step failed");
                    return Stop::LeaseLost;
                }
            };
            self.metrics.step(&model.config.name, "model");
            self.metrics.billed(
                tenant.as_str(),
                &model.config,
                completion.input_tokens,
                completion.output_tokens,
            );
            talk.apply(body);
            self.notify(branch.id, talk.seq);
            if written.is_some_and(|c| c.exhausted) && !talk.pending.is_empty() {
                // The context is at the budget: no room for the results.
                return Stop::Budget;
            }
        }
    }

    /// The tools a run may call, by name, as this replica's upstreams
    /// offer them now.
    fn tools_of(
        &self,
        branch: &Branch,
        run: &Run,
    ) -> HashMap<String, (Arc<Upstream>, Arc<UpstreamTool>)> {
        let grant = Grant {
            principal: Principal::new(branch.tenant.clone(), branch.owner.clone()),
            scopes: run.scopes.iter().cloned().collect(),
        };
        run.tools
            .iter()
            .filter_map(|name| match self.upstreams.lookup(&grant, name) {
                Lookup::Found(upstream, tool) => Some((name.clone(), (upstream, tool))),
                _ => None,
            })
            .collect()
    }

    /// Makes the calls of one model answer, at the same time, and writes
    /// their steps in order. `Ok(true)` when the branch's budget ran out.
    async fn call_tools(
        &self,
        branch: &Branch,
        run: &Run,
        tools: &HashMap<String, (Arc<Upstream>, Arc<UpstreamTool>)>,
        calls: Vec<Call>,
        talk: &mut Conversation,
        repeated: bool,
    ) -> Result<bool, Stop> {
        let principal = Principal::new(branch.tenant.clone(), branch.owner.clone());
        let target = CallTarget::Branch(Box::new(branch.clone()));
        // Each call's step is written as soon as it is answered, so that a
        // replica dying meanwhile repeats only the calls still in flight.
        // The calls and the writes run side by side: a call left unpolled
        // while a step is written could be holding the database (its charge
        // in a transaction) that the write waits for.
        let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
        let calling = futures::future::join_all(calls.iter().enumerate().map(|(i, call)| {
            let span = tracing::info_span!("run.step", kind = "tool", tool = %call.name);
            let (principal, target, answered) = (&principal, &target, answered.clone());
            async move {
                let started = Instant::now();
                let (content, error, exhausted) = if i >= MAX_CALLS_PER_ANSWER {
                    (
                        format!("error: at most {MAX_CALLS_PER_ANSWER} tool calls per answer"),
                        true,
                        false,
                    )
                } else {
                    self.call_tool(principal, target, tools, call).await
                };
                // The writer is gone only if it failed: the run stops anyway.
                let _ = answered.send((call, content, error, exhausted, started.elapsed()));
            }
            .instrument(span)
        }));
        drop(answered);
        let writing = async {
            let mut exhausted = false;
            let mut failed = None;
            while let Some((call, content, error, ran_out, duration)) = answers.recv().await {
                if failed.is_some() {
                    continue;
                }
                exhausted |= ran_out;
                let body =
                    ToolBody { call_id: call.id.clone(), name: call.name.clone(), content, error };
                let step = NewStep {
                    seq: talk.seq,
                    kind: StepKind::Tool,
                    body: serde_json::to_string(&body).unwrap_or_default(),
                    input_tokens: 0,
                    output_tokens: 0,
                    context_tokens: None,
                    duration,
                    repeated,
                    at: self.service.clock().now(),
                };
                match self
                    .service
                    .store()
                    .record_step(&branch.tenant, branch.id, &self.owner, &step)
                    .await
                {
                    Ok(StepWritten::Written(_)) => {
                        self.metrics.step(&run.model, "tool");
                        talk.answer(body);
                        self.notify(branch.id, talk.seq);
                    }
                    Ok(StepWritten::NotOwner) => failed = Some(Stop::LeaseLost),
                    Err(e) => {
                        tracing::warn!(error = %e, "writing a tool step failed");
                        failed = Some(Stop::LeaseLost);
                    }
                }
            }
            failed.map_or(Ok(exhausted), Err)
        };
        let (_, written) = tokio::join!(calling, writing);
        written
    }

    /// One tool call: what the model gets back, whether it is an error, and
    /// whether the branch's budget ran out with it.
    async fn call_tool(
        &self,
        principal: &Principal,
        target: &CallTarget,
        tools: &HashMap<String, (Arc<Upstream>, Arc<UpstreamTool>)>,
        call: &Call,
    ) -> (String, bool, bool) {
        let Some((upstream, tool)) = tools.get(&call.name) else {
            return (format!("error: there is no tool {:?}", call.name), true, false);
        };
        let arguments = match &call.arguments {
            Value::Object(map) => Some(map),
            Value::Null => None,
            _ => return ("error: the arguments must be a JSON object".into(), true, false),
        };
        if let Err(mismatch) = tool.check_arguments(arguments) {
            return (
                format!("error: invalid arguments at {}: {}", mismatch.field, mismatch.reason),
                true,
                false,
            );
        }
        let call = UpstreamCall { upstream, tool, arguments, meta: None };
        match meter::call(&self.service, principal, target, call).await {
            Ok(Answer::Result(result)) => {
                let report = result.meta.as_ref().and_then(|m| m.0.get(meter::METERING_META_KEY));
                let ran_out = report.is_some_and(|r| {
                    r["branch_force_returned"] == json!(true) || r["branch_ended"] == json!(true)
                });
                let text = result_text(&serde_json::to_value(&result).unwrap_or_default());
                let error = result.is_error == Some(true);
                (if error { format!("error: {text}") } else { text }, error, ran_out)
            }
            Ok(Answer::Error(e)) => (format!("error: {}", e.message), true, false),
            Err(CallFailure::Refused(FoldError::BudgetExhausted { .. })) => {
                ("error: the branch's budget does not cover this call".into(), true, true)
            }
            Err(CallFailure::Refused(e)) => (format!("error: {e}"), true, false),
            Err(CallFailure::Internal(what)) => {
                tracing::error!(error = %what, "a run's tool call failed in the gateway");
                ("error: the gateway could not make the call".into(), true, false)
            }
        }
    }

    /// Ends the branch as the run ended and records the outcome for its
    /// caller.
    async fn conclude(
        &self,
        branch: &Branch,
        run: &Run,
        talk: Conversation,
        stop: Stop,
    ) -> Result<(), FoldError> {
        let tenant = &branch.tenant;
        let (end, text, cut, failure) = match stop {
            Stop::Done(text) => (Some((BranchStatus::Completed, None)), text, false, None),
            Stop::Budget => (
                Some((BranchStatus::Timeout, Some(EndReason::BudgetExhausted))),
                talk.last_text,
                true,
                None,
            ),
            Stop::Deadline => (
                Some((BranchStatus::Timeout, Some(EndReason::DeadlineExceeded))),
                talk.last_text,
                true,
                None,
            ),
            Stop::Ended | Stop::LeaseLost => (None, talk.last_text, true, None),
            Stop::Model(f) => (
                Some((BranchStatus::Failed, Some(EndReason::ReportedFailure))),
                talk.last_text,
                true,
                Some(("model_failed", f.to_string())),
            ),
        };
        let mut failure = failure;
        // A branch ended from outside says why in its own record.
        let reason = match end {
            Some((_, reason)) => reason,
            None => self.service.store().branch(tenant, branch.id).await?.and_then(|b| b.reason),
        };
        let why = cut.then_some(match (&failure, reason) {
            (Some(_), _) => "by a model failure",
            (None, Some(EndReason::DeadlineExceeded)) => "at its deadline",
            (None, Some(EndReason::BudgetExhausted)) => "at its token budget",
            (None, Some(EndReason::ReportedFailure)) => "because it was cancelled",
            (None, Some(EndReason::SessionEnded)) => "because its session ended",
            (None, Some(EndReason::ParentReturning)) => "because its parent returned",
            (None, None) => "when its branch ended",
        });
        let message = match self.scrub(&text, why) {
            Ok(message) => message,
            Err(()) => {
                failure = Some((
                    "scrubbing_failed",
                    "the finding could not be scrubbed of secrets; nothing was returned".into(),
                ));
                String::new()
            }
        };
        let tokens = self.service.tokens().count(&message);
        if let Some((mut status, mut reason)) = end {
            if failure.as_ref().is_some_and(|(why, _)| *why == "scrubbing_failed")
                && status == BranchStatus::Completed
            {
                (status, reason) = (BranchStatus::Failed, Some(EndReason::ReportedFailure));
            }
            let finish = Finish {
                status,
                reason,
                result: Some(message.clone()),
                // The finding is already in the context as the model counted it.
                result_tokens: 0,
                returned_tokens: Some(tokens),
                at: self.service.clock().now(),
            };
            self.service.end_run(tenant, branch.id, finish).await?;
        }
        let store = self.service.store();
        let ended = store.branch(tenant, branch.id).await?.ok_or(FoldError::BranchNotFound)?;
        if end.is_none() && failure.is_none() && ended.reason == Some(EndReason::ReportedFailure) {
            // Only `tasks/cancel` ends a gateway-run branch that way.
            failure = Some(("cancelled", "the run was cancelled".into()));
        }
        let run = store.run(tenant, branch.id).await?.unwrap_or_else(|| run.clone());
        // A branch ended from outside keeps no result: the caller still gets
        // what was produced.
        let message = ended.result.clone().unwrap_or(message);
        let outcome = RunOutcome::of(&ended, &run, message, tokens, cut, failure);
        let json = serde_json::to_string(&outcome).unwrap_or_default();
        let now = self.service.clock().now();
        if store
            .finish_run(tenant, branch.id, &self.owner, &json, outcome.tokens_returned, now)
            .await?
        {
            self.metrics.ended(tenant.as_str(), &run.model, &outcome.status);
            tracing::info!(%tenant, branch_id = %branch.id, status = %outcome.status,
                reason = outcome.reason.as_deref().unwrap_or(""), tokens_used = outcome.tokens_used,
                tokens_returned = outcome.tokens_returned, steps = outcome.steps, "run ended");
        }
        self.notify(branch.id, run.steps);
        Ok(())
    }

    /// The finding as the caller gets it: scrubbed (fail closed), and
    /// marked when the run was cut.
    fn scrub(&self, text: &str, cut: Option<&str>) -> Result<String, ()> {
        let scrubbed = self.service.scrubber().scrub(text).map_err(|e| {
            tracing::error!(error = %e, "scrubbing a run's finding failed; it was withheld");
        })?;
        self.service.redacted(&scrubbed.by_rule);
        let mut message = scrubbed.text;
        if let Some(why) = cut {
            if !message.is_empty() {
                message.push('\n');
            }
            message.push_str(&format!(
                "[foldgate: the run was cut {why}; this is what it had produced]"
            ));
        }
        Ok(message)
    }
}

impl Conversation {
    /// The conversation as the written steps left it.
    fn replay(branch: &Branch, steps: &[RunStep]) -> Self {
        let mut talk = Self { turns: vec![Turn::User(task_text(branch))], ..Self::default() };
        for step in steps {
            match step.kind {
                StepKind::Model => {
                    if talk.final_text.take().is_some() {
                        // A final answer followed by another call: the
                        // finding was too long and the model was asked to
                        // shorten it.
                        talk.compress_asked = true;
                        talk.turns.push(Turn::User(compress_text(branch.return_tier)));
                    }
                    let body: ModelBody = serde_json::from_str(&step.body)
                        .unwrap_or(ModelBody { text: String::new(), calls: Vec::new() });
                    talk.apply(body);
                }
                StepKind::Tool => {
                    if let Ok(body) = serde_json::from_str::<ToolBody>(&step.body) {
                        talk.answer(body);
                    } else {
                        talk.seq += 1;
                    }
                }
            }
        }
        talk
    }

    fn apply(&mut self, body: ModelBody) {
        self.seq += 1;
        self.model_calls += 1;
        if !body.text.trim().is_empty() {
            self.last_text.clone_from(&body.text);
        }
        if body.calls.is_empty() {
            self.final_text = Some(body.text.clone());
        }
        self.pending.clone_from(&body.calls);
        self.turns.push(Turn::Assistant { text: body.text, calls: body.calls });
    }

    fn answer(&mut self, body: ToolBody) {
        self.seq += 1;
        self.pending.retain(|c| c.id != body.call_id);
        self.turns.push(Turn::ToolResult { call_id: body.call_id, content: body.content });
    }
}

fn task_text(branch: &Branch) -> String {
    if branch.prompt.is_empty() {
        format!("Task: {}", branch.description)
    } else {
        format!("Task: {}\n\n{}", branch.description, branch.prompt)
    }
}

/// The gateway's system text for a run.
fn system_text(tier: ReturnTier) -> String {
    format!(
        "You are working on one sub-task on behalf of another agent, which sees none of your work \
         except your final answer. Use the tools you are given to investigate. When you are done, \
         answer with the finding alone: what the other agent needs to go on, in at most {} tokens, \
         with no preamble. If the task cannot be done, say what you found and what stopped you.",
        tier.max_tokens()
    )
}

fn compress_text(tier: ReturnTier) -> String {
    format!(
        "Your answer is longer than the {} tokens allowed. Rewrite it as the finding alone, in at \
         most {} tokens.",
        tier.max_tokens(),
        tier.max_tokens()
    )
}

fn spec(tool: &UpstreamTool) -> ToolSpec {
    ToolSpec {
        name: tool.tool.name.to_string(),
        description: tool.tool.description.as_deref().unwrap_or_default().to_owned(),
        input_schema: Value::Object((*tool.tool.input_schema).clone()),
    }
}

fn specs_json(specs: &[ToolSpec]) -> Value {
    Value::Array(
        specs
            .iter()
            .map(|s| json!({"name": s.name, "description": s.description, "parameters": s.input_schema}))
            .collect(),
    )
}

/// What a model reads of a tool result: its text items, anything else as
/// JSON; the structured content when there is no content.
fn result_text(result: &Value) -> String {
    let items = result.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
    let texts: Vec<String> = items
        .iter()
        .map(|item| match item.get("type").and_then(Value::as_str) {
            Some("text") => item.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
            _ => item.to_string(),
        })
        .collect();
    if texts.is_empty() {
        return result.get("structuredContent").map(Value::to_string).unwrap_or_default();
    }
    texts.join("\n")
}

#[cfg(test)]
mod tests {
    use foldgate_domain::{BranchKind, Ledger, SessionId, Subject};

    use super::*;

    fn branch(tier: ReturnTier) -> Branch {
        Branch {
            id: BranchId::generate(),
            tenant: TenantId::parse("acme").unwrap(),
            session_id: SessionId::parse("s").unwrap(),
            owner: Subject::parse("u").unwrap(),
            parent: None,
            depth: 1,
            description: "find the flush handler".into(),
            prompt: "look in src/".into(),
            ledger: Ledger::new(1_000),
            status: BranchStatus::Active,
            reason: None,
            created_at: DateTime::<Utc>::UNIX_EPOCH,
            deadline_at: DateTime::<Utc>::UNIX_EPOCH,
            completed_at: None,
            warned_at: None,
            result: None,
            kind: BranchKind::Gateway,
            return_tier: tier,
            returned_tokens: None,
        }
    }

    fn step(seq: u32, kind: StepKind, body: Value) -> RunStep {
        RunStep {
            seq,
            kind,
            body: body.to_string(),
            input_tokens: 0,
            output_tokens: 0,
            duration: Duration::ZERO,
            repeated: false,
            at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_run_is_replayed_from_its_steps() {
        let b = branch(ReturnTier::Phase);
        let calls = json!([{"id": "c1", "name": "files__read", "arguments": {"path": "a"}},
                           {"id": "c2", "name": "files__read", "arguments": {"path": "b"}}]);
        let steps = [
            step(0, StepKind::Model, json!({"text": "reading", "calls": calls})),
            step(
                1,
                StepKind::Tool,
                json!({"call_id": "c1", "name": "files__read", "content": "A", "error": false}),
            ),
        ];
        let talk = Conversation::replay(&b, &steps);
        assert_eq!(talk.seq, 2);
        assert_eq!(talk.turns.len(), 3, "task, answer, one result");
        assert!(
            matches!(&talk.turns[0], Turn::User(t) if t.contains("find the flush handler") && t.contains("src/"))
        );
        assert_eq!(talk.pending.len(), 1, "the second call was in flight");
        assert_eq!(talk.pending[0].id, "c2");
        assert_eq!(talk.last_text, "reading");
        assert!(talk.final_text.is_none());

        // A final answer, then another model call: the shortening was asked.
        let steps = [
            step(0, StepKind::Model, json!({"text": "long finding", "calls": []})),
            step(1, StepKind::Model, json!({"text": "short", "calls": []})),
        ];
        let talk = Conversation::replay(&b, &steps);
        assert!(talk.compress_asked);
        assert_eq!(talk.final_text.as_deref(), Some("short"));
        assert!(matches!(&talk.turns[2], Turn::User(t) if t.contains("300 tokens")));
    }

    #[test]
    fn tool_results_read_as_a_model_reads_them() {
        assert_eq!(
            result_text(
                &json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
            ),
            "a\nb"
        );
        assert_eq!(
            result_text(&json!({"content": [], "structuredContent": {"x": 1}})),
            "{\"x\":1}"
        );
        let image =
            json!({"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]});
        assert!(result_text(&image).contains("image/png"));
    }
}
