//! The tool loop: model calls, tool calls through the metered path, and the conclusion.

use super::*;

impl Runner {
    /// The tool loop.
    pub(super) async fn drive(
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
        let mut system = system_text(branch.return_tier);
        if let Some(lessons) = &run.lessons {
            system.push_str("\n\n");
            system.push_str(lessons);
        }
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
            self.service.tenant_rules().usage().add(
                tenant,
                step.at,
                UsageKind::Model,
                &model.config.name,
                1,
                (completion.input_tokens, completion.output_tokens),
            );
            self.metrics.billed(
                tenant.as_str(),
                &model.config,
                completion.input_tokens,
                completion.output_tokens,
                crate::metrics::Purpose::Run,
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
    pub(super) fn tools_of(
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
    pub(super) async fn call_tools(
        &self,
        branch: &Branch,
        run: &Run,
        tools: &HashMap<String, (Arc<Upstream>, Arc<UpstreamTool>)>,
        calls: Vec<Call>,
        talk: &mut Conversation,
        repeated: bool,
    ) -> Result<bool, Stop> {
        let principal = Principal::new(branch.tenant.clone(), branch.owner.clone());
        let scopes: BTreeSet<String> = run.scopes.iter().cloned().collect();
        let target = CallTarget::Branch(Box::new(branch.clone()));
        // Each call's step is written as soon as it is answered, so that a
        // replica dying meanwhile repeats only the calls still in flight.
        // The calls and the writes run side by side: a call left unpolled
        // while a step is written could be holding the database (its charge
        // in a transaction) that the write waits for.
        let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
        let calling = futures::future::join_all(calls.iter().enumerate().map(|(i, call)| {
            let span = tracing::info_span!("run.step", kind = "tool", tool = %call.name);
            let (principal, scopes, target) = (&principal, &scopes, &target);
            let answered = answered.clone();
            async move {
                let started = Instant::now();
                let (content, error, exhausted) = if i >= MAX_CALLS_PER_ANSWER {
                    (
                        format!("error: at most {MAX_CALLS_PER_ANSWER} tool calls per answer"),
                        true,
                        false,
                    )
                } else {
                    self.call_tool(principal, scopes, target, tools, call).await
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
    pub(super) async fn call_tool(
        &self,
        principal: &Principal,
        scopes: &BTreeSet<String>,
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
        let call = UpstreamCall { upstream, tool, arguments, scopes, meta: None, relay: None };
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
    pub(super) async fn conclude(
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
            (None, Some(EndReason::EndedByOperator)) => "by an operator",
            (None, None) => "when its branch ended",
        });
        let message = match self.scrub(&text, why) {
            Ok(message) => message,
            Err(e) => {
                tracing::error!(error = %e, "scrubbing a run's finding failed; it was withheld");
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
                // Its lessons are distilled instead (`branch_runs.distill`).
                extract: false,
                at: self.service.clock().now(),
                by: None,
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
        let end = RunEnd {
            owner: &self.owner,
            outcome: &json,
            returned_tokens: outcome.tokens_returned,
            distill: self.distills(tenant),
            at: now,
        };
        if store.finish_run(tenant, branch.id, &end).await? {
            self.metrics.ended(tenant.as_str(), &run.model, &outcome.status);
            tracing::debug!(%tenant, branch_id = %branch.id, status = %outcome.status,
                reason = outcome.reason.as_deref().unwrap_or(""), tokens_used = outcome.tokens_used,
                tokens_returned = outcome.tokens_returned, steps = outcome.steps, "run ended");
        }
        self.notify(branch.id, run.steps);
        Ok(())
    }

    /// The finding as the caller gets it: scrubbed (fail closed), and
    /// marked when the run was cut.
    pub(super) fn scrub(&self, text: &str, cut: Option<&str>) -> Result<String, ScrubFailure> {
        let scrubbed = self.service.scrubber().scrub(text)?;
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
