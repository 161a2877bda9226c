//! The folding use cases.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
    },
};

use chrono::{DateTime, Utc};
use foldgate_background::Activator;
use foldgate_domain::{
    Branch, BranchId, BranchKind, BranchStatus, BudgetRequest, Consumption, Description, EndReason,
    Message, Outcome, Principal, Prompt, ReturnTier, SessionId, TenantId, TimeoutRequest, Tokens,
};
use foldgate_store::{
    BatchFinish, CallRecord, CallSummary, CreateRules, DueBranch, Finish, Finished, NewBranch,
    NewRun, OutsideUsage, ParentChoice, Store, UsageKind,
};

use crate::{
    Clock, EngineMetrics, FoldError, FoldingConfig, INLINE_TEXT_BYTES, Injection, MemoryBank,
    ScrubFailure, Scrubber, TenantRules, TokenCounter,
};

mod calls;
mod memory;
mod requests;

pub use self::requests::{
    CallTarget, Consumed, CreateBranch, Created, MeteredCall, ReturnBranch, Returned, SessionEnded,
    StatusQuery,
};

/// The folding service. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct FoldingService {
    store: Arc<dyn Store>,
    tokens: TokenCounter,
    scrubber: Arc<dyn Scrubber>,
    clock: Arc<dyn Clock>,
    config: FoldingConfig,
    /// Wakes the deadline reconciler when a branch gets a deadline earlier
    /// than its planned wake-up (its trigger on the background driver).
    deadline_wake: Activator,
    /// The reconciler's planned wake-up, in Unix milliseconds.
    planned_wake_ms: AtomicI64,
    metrics: EngineMetrics,
    /// Upstream calls outside branches, added up until the next flush.
    outside: Mutex<HashMap<(TenantId, Option<SessionId>), OutsideUsage>>,
    /// The upstream tools sessions called, until the next flush.
    session_tools: Mutex<calls::SessionTools>,
    /// The reasoning memory, when it is on.
    memory: Option<Arc<MemoryBank>>,
    /// Each tenant's rules and quotas, and the usage counted towards them.
    tenants: Arc<TenantRules>,
}

impl FoldingService {
    pub fn new(
        store: Arc<dyn Store>,
        tokens: TokenCounter,
        scrubber: Arc<dyn Scrubber>,
        clock: Arc<dyn Clock>,
        config: FoldingConfig,
    ) -> Self {
        let tenants = Arc::new(TenantRules::new(&config));
        Self {
            store,
            tokens,
            scrubber,
            clock,
            config,
            deadline_wake: Activator::new(),
            planned_wake_ms: AtomicI64::new(i64::MIN),
            metrics: EngineMetrics::noop(),
            outside: Mutex::new(HashMap::new()),
            session_tools: Mutex::default(),
            memory: None,
            tenants,
        }
    }

    /// Injects lessons from this memory into new branches (as their
    /// requests and the memory's settings say).
    pub fn with_memory(mut self, memory: Arc<MemoryBank>) -> Self {
        self.memory = Some(memory);
        self
    }

    /// The reasoning memory, when it is on.
    pub fn memory(&self) -> Option<&Arc<MemoryBank>> {
        self.memory.as_ref()
    }

    /// Records into these instruments instead of nowhere; the redaction
    /// count of every rule of the scrubber starts at zero.
    pub fn with_metrics(mut self, metrics: EngineMetrics) -> Self {
        metrics.start_rules(&self.scrubber.rules());
        self.metrics = metrics;
        self
    }

    pub(crate) fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Each tenant's rules (the configuration with the tenant's overrides)
    /// and quotas.
    pub fn tenant_rules(&self) -> &Arc<TenantRules> {
        &self.tenants
    }

    pub fn config(&self) -> &FoldingConfig {
        &self.config
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn tokens(&self) -> &TokenCounter {
        &self.tokens
    }

    pub fn scrubber(&self) -> &Arc<dyn Scrubber> {
        &self.scrubber
    }

    /// Opens a branch under the session's active branch (or the named
    /// parent), lending it its budget from the parent's pool.
    #[tracing::instrument(name = "branch.create", skip_all,
        fields(tenant = %who.tenant, session.id = %req.session_id, branch.id))]
    pub async fn create(&self, who: &Principal, req: CreateBranch) -> Result<Created, FoldError> {
        self.open(who, req, None).await
    }

    /// Opens a gateway-run branch exactly as [`FoldingService::create`]
    /// opens any branch (limits, depth, budget lending, deadline), with its
    /// run, in one transaction.
    #[tracing::instrument(name = "branch.create_run", skip_all,
        fields(tenant = %who.tenant, session.id = %req.session_id, branch.id))]
    pub async fn create_run(
        &self,
        who: &Principal,
        req: CreateBranch,
        run: NewRun,
    ) -> Result<Created, FoldError> {
        self.open(who, req, Some(run)).await
    }

    async fn open(
        &self,
        who: &Principal,
        req: CreateBranch,
        mut run: Option<NewRun>,
    ) -> Result<Created, FoldError> {
        let now = self.clock.now();
        self.tenants.check_quota(&who.tenant, now)?;
        let rules = self.tenants.of(&who.tenant);
        let gateway_run = run.is_some();
        let deadline_at =
            now + chrono::Duration::from_std(req.timeout.duration()).unwrap_or_default();
        let task = format!("{}\n{}", req.description.as_str(), req.prompt.as_str());
        let inject = self.memory.as_ref().filter(|m| {
            m.config().enabled && req.inject_memories.unwrap_or(m.config().inject_by_default)
        });
        // The branch's starting context is its description and prompt.
        let prompt_tokens =
            self.tokens.count(req.description.as_str()) + self.tokens.count(req.prompt.as_str());
        // Lessons are chosen before the branch exists, against the budget
        // asked for, so that a create costs one search and no more. A
        // gateway-run branch's go into its model's system text, stored with
        // the run (a replica that resumes it gives the same), and are
        // charged as its model reads them; an agent-run branch's are
        // charged with its prompt, in the create's own transaction.
        let mut injection = Injection::default();
        let asked = req.budget;
        if let Some(memory) = inject {
            let room = if gateway_run {
                Tokens::MAX
            } else {
                asked.tokens().saturating_sub(prompt_tokens).saturating_sub(1)
            };
            injection = memory::lessons(who, memory, &task, asked.tokens(), room).await;
        }
        if let Some(run) = run.as_mut() {
            run.lessons = (!injection.is_empty()).then(|| injection.text.clone());
        }
        let new = NewBranch {
            id: BranchId::generate(),
            session_id: req.session_id,
            owner: who.subject.clone(),
            parent: req.parent.map_or(ParentChoice::Active, ParentChoice::Explicit),
            description: req.description.into_string(),
            prompt: req.prompt.into_string(),
            budget: req.budget,
            prompt_tokens,
            lessons_tokens: if gateway_run { 0 } else { injection.tokens },
            created_at: now,
            deadline_at,
            rules: CreateRules {
                budget: rules.budget,
                max_depth: rules.max_depth,
                limits: rules.limits,
            },
            kind: if gateway_run { BranchKind::Gateway } else { BranchKind::Agent },
            return_tier: req.return_tier,
            run,
        };
        tracing::Span::current().record("branch.id", tracing::field::display(new.id));
        let branch = match self.store.create_branch(&who.tenant, new).await? {
            Ok(branch) => branch,
            Err(refusal) => {
                self.metrics.refused(&who.tenant, refusal);
                return Err(FoldError::from(refusal));
            }
        };
        self.metrics.created(&branch);
        self.signal_deadline(branch.deadline_at);
        let mut branch = branch;
        match inject {
            Some(memory) if gateway_run => memory.used(who, &injection, BranchKind::Gateway),
            Some(memory)
                if asked.fits_lessons(branch.ledger.budget, prompt_tokens, injection.tokens) =>
            {
                memory.used(who, &injection, BranchKind::Agent);
            }
            // Its parent lent it less than it asked for (or the lessons
            // did not fit): chosen again against what it got.
            Some(memory) if !injection.is_empty() => {
                injection = self.inject(who, memory, &mut branch, &task).await;
            }
            Some(_) | None => {}
        }
        // Per request: at `debug`, so that a successful request writes no
        // line at the default filter (the access log has one if asked for).
        tracing::debug!(
            tenant = %who.tenant, branch_id = %branch.id, session_id = %branch.session_id,
            depth = branch.depth, budget = branch.ledger.budget,
            injected_memories = injection.items.len(), "branch created"
        );
        Ok(Created { branch, injection, budget_requested: req.budget.tokens() })
    }

    /// Returns a branch: scrubs the message (failing closed), force-returns
    /// the branch's active descendants deepest first, then completes it.
    #[tracing::instrument(name = "branch.return", skip_all,
        fields(tenant = %who.tenant, branch.id = %req.branch_id, session.id))]
    pub async fn return_branch(
        &self,
        who: &Principal,
        req: ReturnBranch,
    ) -> Result<Returned, FoldError> {
        // Queued by the statement that ends the branch (see `MemoryBank::extracts`).
        let memory = self.memory.as_ref().filter(|_| req.extract_memory);
        // The memory judges the branch before it ends, so then it is read
        // first; otherwise the statement that ends it checks the owner, the
        // kind and the state (`Finish::by`), and a return is one statement.
        let known = match memory {
            Some(_) => {
                let branch = self.owned_branch(who, req.branch_id).await?;
                if branch.kind == BranchKind::Gateway {
                    return Err(FoldError::GatewayRunBranch);
                }
                if branch.status != BranchStatus::Active {
                    return Err(FoldError::BranchNotActive { status: branch.status });
                }
                Some(branch)
            }
            None => None,
        };
        // Scrub before anything changes, so that a scrubbing failure leaves
        // the whole tree as it was. Scrubbing and counting 50,000 characters
        // take milliseconds of CPU: off the async workers, unless the message
        // is short.
        let message = req.message.into_string();
        let scrub = |scrubber: &dyn Scrubber, tokens: &TokenCounter, message: &str| {
            let scrubbed = scrubber.scrub(message)?;
            let count = tokens.count(&scrubbed.text);
            Ok::<_, ScrubFailure>((scrubbed, count))
        };
        let scrubbed = if message.len() <= INLINE_TEXT_BYTES {
            scrub(self.scrubber.as_ref(), &self.tokens, &message)
        } else {
            let scrubber = Arc::clone(&self.scrubber);
            let tokens = self.tokens.clone();
            tokio::task::spawn_blocking(move || scrub(scrubber.as_ref(), &tokens, &message))
                .await
                .unwrap_or_else(|_panicked| Err(ScrubFailure("the scrubber panicked".into())))
        };
        let (scrubbed, result_tokens) = scrubbed.map_err(|e| {
            tracing::error!(tenant = %who.tenant, branch_id = %req.branch_id, error = %e,
                "scrubbing failed; the return was refused");
            FoldError::ScrubbingFailed
        })?;
        let (status, reason) = req.outcome.end();
        let extract = memory
            .zip(known.as_ref())
            .is_some_and(|(m, branch)| m.extracts(branch, status, &scrubbed.text));
        let finish = Finish {
            status,
            reason,
            result_tokens,
            returned_tokens: Some(result_tokens),
            result: Some(scrubbed.text.clone()),
            extract,
            at: self.clock.now(),
            by: Some(who.subject.clone()),
        };
        let (branch, children_ended) =
            self.end_tree(&who.tenant, req.branch_id, finish, EndReason::ParentReturning).await?;
        tracing::Span::current().record("session.id", tracing::field::display(&branch.session_id));
        if let Some(memory) = memory.filter(|_| extract) {
            memory.extraction_queued();
        }
        self.metrics.redacted(&scrubbed.by_rule);
        // The charge is capped at what remained of the budget.
        self.metrics.returned(&branch, result_tokens, result_tokens.min(branch.ledger.used));
        self.count_return(&branch);
        tracing::debug!(
            tenant = %who.tenant, branch_id = %branch.id, status = %branch.status,
            tokens_used = branch.ledger.used, redactions = scrubbed.redactions,
            children_ended = children_ended.len(), "branch returned"
        );
        Ok(Returned {
            branch,
            message: scrubbed.text,
            redactions: scrubbed.redactions,
            children_ended,
            tokens_returned: result_tokens,
            memory_queued: extract,
        })
    }

    /// A branch, or the session's active branch (`None` if it has none).
    #[tracing::instrument(name = "branch.status", skip_all, fields(tenant = %who.tenant))]
    pub async fn status(
        &self,
        who: &Principal,
        query: StatusQuery,
    ) -> Result<Option<Branch>, FoldError> {
        self.find(who, query).await
    }

    /// What `branch_status` shows: the branch, or the session's active
    /// branch, with what its upstream calls add up to (`None` if the session
    /// has no active branch). A branch asked for by id is read in one
    /// statement.
    #[tracing::instrument(name = "branch.status", skip_all, fields(tenant = %who.tenant))]
    pub async fn report(
        &self,
        who: &Principal,
        query: StatusQuery,
    ) -> Result<Option<(Branch, CallSummary)>, FoldError> {
        match query {
            StatusQuery::Branch(id) => match self.store.branch_report(&who.tenant, id).await? {
                Some((branch, calls)) if branch.owner == who.subject => Ok(Some((branch, calls))),
                _ => Err(FoldError::BranchNotFound),
            },
            StatusQuery::Session(_) => {
                let Some(branch) = self.find(who, query).await? else { return Ok(None) };
                let calls = self.store.call_summary(&who.tenant, branch.id).await?;
                Ok(Some((branch, calls)))
            }
        }
    }

    async fn find(&self, who: &Principal, query: StatusQuery) -> Result<Option<Branch>, FoldError> {
        match query {
            StatusQuery::Branch(id) => self.owned_branch(who, id).await.map(Some),
            StatusQuery::Session(session) => {
                // Another principal's session looks exactly like an empty one.
                let Some(found) = self.store.session(&who.tenant, &session).await? else {
                    return Ok(None);
                };
                if found.owner != who.subject {
                    return Ok(None);
                }
                Ok(self.store.active_branch(&who.tenant, &session).await?)
            }
        }
    }

    /// Charges tokens to a branch, as metered by the gateway. A charge that
    /// uses up the budget force-returns the branch (`timeout`,
    /// `budget_exhausted`).
    #[tracing::instrument(name = "branch.consume", skip_all,
        fields(tenant = %who.tenant, branch.id = %id, tokens = tokens))]
    pub async fn consume(
        &self,
        who: &Principal,
        id: BranchId,
        tokens: Tokens,
    ) -> Result<Consumed, FoldError> {
        self.owned_branch(who, id).await?;
        let now = self.clock.now();
        let Some(consumption) = self.store.consume(&who.tenant, id, tokens, now).await? else {
            let status = self.owned_branch(who, id).await?.status;
            return Err(FoldError::BranchNotActive { status });
        };
        self.metrics.consumed(&who.tenant, consumption.granted);
        if consumption.warning {
            tracing::warn!(
                tenant = %who.tenant, branch_id = %id, used = consumption.ledger.used,
                budget = consumption.ledger.budget, "branch has used 80% of its budget"
            );
        }
        let mut forced_return = false;
        if consumption.exhausted {
            forced_return =
                self.force_return(&who.tenant, id, EndReason::BudgetExhausted).await?.is_some();
        }
        Ok(Consumed { consumption, forced_return })
    }

    /// Ends a session: force-returns every active branch deepest first,
    /// within `session_end_timeout`; whatever is left then is failed at once.
    pub async fn end_session(
        &self,
        who: &Principal,
        session: &SessionId,
    ) -> Result<SessionEnded, FoldError> {
        let found = self.store.session(&who.tenant, session).await?;
        if found.is_none_or(|s| s.owner != who.subject) {
            return Err(FoldError::SessionNotFound);
        }
        self.end_session_of(&who.tenant, session, None).await
    }

    /// Ends a session on behalf of the gateway. With `idle_since` (the idle
    /// reconciler), a session used again after that instant stays open.
    #[tracing::instrument(name = "session.end", skip_all,
        fields(tenant = %tenant, session.id = %session, idle = idle_since.is_some()))]
    pub async fn end_session_of(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        idle_since: Option<DateTime<Utc>>,
    ) -> Result<SessionEnded, FoldError> {
        // The bound is checked between branches rather than by cancelling a
        // store call halfway, which would leave its transaction to be rolled
        // back later while holding locks the fallback needs.
        let give_up_at = tokio::time::Instant::now() + self.config.session_end_timeout;
        let mut ended = 0;
        let mut bulk_failed = false;
        // A session with no active branch (nothing lent from its pool) ends
        // with one conditional update, which a concurrent use of the session
        // wins; an idle session has none (their deadlines are far shorter
        // than the idle timeout). Most sessions end so: their agents returned
        // their branches.
        let now = self.clock.now();
        if idle_since.is_some() || self.store.end_session(tenant, session, now, None).await? {
            let session_ended = idle_since.is_none()
                || self.store.end_session(tenant, session, now, idle_since).await?;
            return Ok(self.session_ended(tenant, session, 0, false, session_ended));
        }
        let active = self.store.active_in_session(tenant, session).await?;
        for id in active {
            if tokio::time::Instant::now() >= give_up_at {
                tracing::warn!(%tenant, %session, "session end timed out; failing the rest");
                let now = self.clock.now();
                let failed = self.store.fail_session_branches(tenant, session, now).await?;
                self.metrics.bulk_failed(tenant, failed);
                ended += failed;
                bulk_failed = true;
                break;
            }
            if self.force_return(tenant, id, EndReason::SessionEnded).await?.is_some() {
                ended += 1;
            }
        }
        let now = self.clock.now();
        let session_ended = self.store.end_session(tenant, session, now, idle_since).await?;
        Ok(self.session_ended(tenant, session, ended, bulk_failed, session_ended))
    }

    fn session_ended(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        ended: u64,
        bulk_failed: bool,
        session_ended: bool,
    ) -> SessionEnded {
        if !session_ended {
            // A branch was created (or, for an idle session, there was
            // activity) meanwhile: a new use of the session, which stays open.
            tracing::info!(%tenant, %session, "session stays open: it was used meanwhile");
        }
        tracing::debug!(%tenant, %session, branches_ended = ended, bulk_failed, session_ended,
            "session end");
        SessionEnded { branches_ended: ended, bulk_failed, session_ended }
    }

    /// Force-returns a branch and, first, its active descendants (deepest
    /// first, `parent_returning`). `None` if it had already ended.
    #[tracing::instrument(name = "branch.force_return", skip_all,
        fields(tenant = %tenant, branch.id = %id, reason = %reason))]
    pub async fn force_return(
        &self,
        tenant: &TenantId,
        id: BranchId,
        reason: EndReason,
    ) -> Result<Option<Branch>, FoldError> {
        let finish = Finish::forced(reason, self.clock.now());
        let child_reason = match reason {
            EndReason::SessionEnded => EndReason::SessionEnded,
            _ => EndReason::ParentReturning,
        };
        match self.end_tree(tenant, id, finish, child_reason).await {
            Ok((branch, _)) => {
                tracing::info!(%tenant, branch_id = %id, %reason, "branch force-returned");
                Ok(Some(branch))
            }
            Err(FoldError::BranchNotActive { .. } | FoldError::BranchNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ends a gateway-run branch as its run ended: with its finding (already
    /// scrubbed; `finish` says what of it is charged: nothing, for a run,
    /// whose finding is already in the context its model counted), after
    /// its active descendants. `None` if it had already ended.
    pub async fn end_run(
        &self,
        tenant: &TenantId,
        id: BranchId,
        finish: Finish,
    ) -> Result<Option<Branch>, FoldError> {
        match self.end_tree(tenant, id, finish, EndReason::ParentReturning).await {
            Ok((branch, _)) => {
                // The finding is already in the context the model counted.
                self.metrics.returned(&branch, branch.returned_tokens.unwrap_or(0), 0);
                self.count_return(&branch);
                Ok(Some(branch))
            }
            Err(FoldError::BranchNotActive { .. } | FoldError::BranchNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Counts a returned branch of depth 1 in its tenant's daily usage:
    /// what it spent, and what of it entered the caller's context.
    fn count_return(&self, branch: &Branch) {
        if branch.depth != 1 {
            return;
        }
        let at = branch.completed_at.unwrap_or_else(|| self.clock.now());
        let returned = branch.returned_tokens.unwrap_or(0);
        let tokens = (branch.ledger.used, returned);
        self.tenants.usage().add(&branch.tenant, at, UsageKind::Return, "", 1, tokens);
    }

    /// Counts secrets redacted from a finding the gateway returns (a run's,
    /// scrubbed by the runner), by the rule that found them.
    pub fn redacted(&self, by_rule: &[(String, u64)]) {
        self.metrics.redacted(by_rule);
    }

    /// Tokens the session's depth-1 branches handed back to the caller's own
    /// context: what folding added to it. Another principal's session looks
    /// exactly like one that does not exist: nothing was returned.
    pub async fn session_returned_tokens(
        &self,
        who: &Principal,
        session: &SessionId,
    ) -> Result<Tokens, FoldError> {
        match self.store.session(&who.tenant, session).await? {
            Some(found) if found.owner == who.subject => {
                Ok(self.store.session_returned_tokens(&who.tenant, session).await?)
            }
            _ => Ok(0),
        }
    }

    /// Force-returns branches that fell due, listed deepest first: those
    /// with no active child all in one transaction, then each of the others
    /// after its descendants, as [`FoldingService::force_return`] does.
    /// Returns the branches ended, with their reasons; branches that had
    /// already ended are left out.
    pub async fn force_return_due(
        &self,
        due: &[DueBranch],
    ) -> Result<Vec<(Branch, EndReason)>, FoldError> {
        let at = self.clock.now();
        let batch: Vec<BatchFinish> = due
            .iter()
            .map(|b| BatchFinish {
                tenant: b.tenant.clone(),
                id: b.id,
                finish: Finish::forced(b.reason, at),
            })
            .collect();
        let ended = match self.store.finish_batch(&batch).await {
            Ok(ended) => ended,
            Err(e) => {
                // One by one, the failing branch holds up only itself.
                tracing::warn!(error = %e, branches = due.len(),
                    "ending due branches together failed; ending them one by one");
                Vec::new()
            }
        };
        let mut fired = Vec::with_capacity(due.len());
        let mut done = std::collections::HashSet::with_capacity(ended.len());
        for branch in ended {
            let reason = branch.reason.unwrap_or(EndReason::DeadlineExceeded);
            self.metrics.ended(&branch);
            tracing::info!(tenant = %branch.tenant, branch_id = %branch.id, %reason,
                "branch force-returned");
            done.insert(branch.id);
            fired.push((branch, reason));
        }
        for b in due.iter().filter(|b| !done.contains(&b.id)) {
            if let Some(branch) = self.force_return(&b.tenant, b.id, b.reason).await? {
                fired.push((branch, b.reason));
            }
        }
        Ok(fired)
    }

    /// Ends a branch after ending its active descendants, deepest first, in
    /// one store call.
    async fn end_tree(
        &self,
        tenant: &TenantId,
        id: BranchId,
        finish: Finish,
        child_reason: EndReason,
    ) -> Result<(Branch, Vec<BranchId>), FoldError> {
        let ended = self.store.end_tree(tenant, id, finish, child_reason).await?;
        for child in &ended.children {
            self.metrics.ended(child);
        }
        let children_ended = ended.children.iter().map(|child| child.id).collect();
        match ended.outcome {
            Finished::Done(branch) => {
                self.metrics.ended(&branch);
                Ok((*branch, children_ended))
            }
            Finished::NotFound => Err(FoldError::BranchNotFound),
            Finished::NotActive(status) => Err(FoldError::BranchNotActive { status }),
            // Children kept appearing faster than they could be ended.
            Finished::HasActiveChildren => Err(FoldError::Busy),
            Finished::GatewayRun => Err(FoldError::GatewayRunBranch),
        }
    }

    /// A branch the principal may see: another tenant's or another owner's
    /// branch is not found.
    async fn owned_branch(&self, who: &Principal, id: BranchId) -> Result<Branch, FoldError> {
        match self.store.branch(&who.tenant, id).await? {
            Some(branch) if branch.owner == who.subject => Ok(branch),
            _ => Err(FoldError::BranchNotFound),
        }
    }

    /// Tells the deadline reconciler about a deadline, if it is earlier than
    /// its planned wake-up.
    fn signal_deadline(&self, deadline: DateTime<Utc>) {
        if deadline.timestamp_millis() < self.planned_wake_ms.load(Ordering::Acquire) {
            self.deadline_wake.activate();
        }
    }

    /// Used by the deadline reconciler: records its planned wake-up.
    pub(crate) fn plan_wake(&self, at: DateTime<Utc>) {
        self.planned_wake_ms.store(at.timestamp_millis(), Ordering::Release);
    }

    /// What wakes the deadline reconciler before its planned wake-up: a
    /// create with an earlier deadline. Its trigger on the driver.
    pub fn deadline_activator(&self) -> Activator {
        self.deadline_wake.clone()
    }
}
