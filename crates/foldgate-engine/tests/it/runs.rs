//! The books of gateway-run branches in the store, on Postgres and SQLite:
//! steps written once and only by the holder of the run's lease, the
//! context measured into the ledger, runs taken over exactly once.

use std::time::Duration;

use chrono::{DateTime, Utc};
use foldgate_domain::{BranchKind, BranchStatus};
use foldgate_engine::{Clock, CreateBranch, FoldError, FoldingService};
use foldgate_store::{
    DistillOutcome, DistillationEnd, Finish, ModelUsage, NewMemory, NewRun, NewStep, RunEnd,
    RunState, StepKind, StepWritten,
};
use foldgate_testkit::{Backend, on_both_backends, principal};

use crate::env;

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    steps_are_written_once_in_order_by_the_lease_holder,
    a_model_step_measures_the_context_into_the_ledger,
    lapsed_runs_are_taken_over_once,
    a_gateway_run_branch_stays_out_of_the_agents_stack,
    distillations_are_queued_at_the_end_and_claimed_once,
    distilled_lessons_are_stored_once_and_their_model_calls_billed,
);

fn req(service: &FoldingService, session: &str, budget: i64) -> CreateBranch {
    CreateBranch::parse(service.config(), session, "run it", None, Some(budget), None, None, None)
        .unwrap()
}

fn run(owner: &str, until: DateTime<Utc>) -> NewRun {
    NewRun {
        model: "default".into(),
        tools: vec!["files__read".into()],
        scopes: vec!["fold:write".into()],
        lease_owner: owner.into(),
        lease_until: until,
        lessons: None,
    }
}

fn end<'a>(
    owner: &'a str,
    outcome: &'a str,
    returned_tokens: u64,
    distill: bool,
    at: DateTime<Utc>,
) -> RunEnd<'a> {
    RunEnd { owner, outcome, returned_tokens, distill, at }
}

/// An attempt at a distillation that ends as `outcome`, billed nothing.
fn ended(outcome: DistillOutcome, lessons: &[NewMemory], attempts: u32) -> DistillationEnd<'_> {
    DistillationEnd { outcome, lessons, usage: ModelUsage::default(), attempts }
}

fn step(seq: u32, kind: StepKind, usage: (u64, u64), at: DateTime<Utc>) -> NewStep {
    NewStep {
        seq,
        kind,
        body: format!("{{\"seq\": {seq}}}"),
        input_tokens: usage.0,
        output_tokens: usage.1,
        context_tokens: (kind == StepKind::Model).then_some(usage.0 + usage.1),
        duration: Duration::from_millis(5),
        repeated: false,
        at,
    }
}

async fn steps_are_written_once_in_order_by_the_lease_holder(backend: Backend) {
    let env = env(backend).await;
    let now = env.clock.now();
    let lease = now + chrono::Duration::seconds(30);
    let branch = env
        .service
        .create_run(&env.alice, req(&env.service, "s", 4_000), run("a", lease))
        .await
        .unwrap()
        .branch;
    assert_eq!(branch.kind, BranchKind::Gateway);
    let store = env.service.store();
    let tenant = &env.alice.tenant;
    let cases = [
        (step(1, StepKind::Model, (10, 1), now), "a", false, "a step out of order"),
        (step(0, StepKind::Model, (100, 10), now), "b", false, "another replica"),
        (step(0, StepKind::Model, (100, 10), now), "a", true, "the holder's first step"),
        (step(0, StepKind::Model, (100, 10), now), "a", false, "the same step again"),
        (step(1, StepKind::Tool, (0, 0), now), "a", true, "the next step"),
        (step(2, StepKind::Model, (300, 20), now), "a", true, "and the next"),
    ];
    for (step, owner, written, why) in cases {
        let got = store.record_step(tenant, branch.id, owner, &step).await.unwrap();
        assert_eq!(matches!(got, StepWritten::Written(_)), written, "{why}: {got:?}");
    }
    let steps = store.run_steps(tenant, branch.id).await.unwrap();
    assert_eq!(steps.iter().map(|s| s.seq).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(steps[1].kind, StepKind::Tool);
    let stored = store.run(tenant, branch.id).await.unwrap().unwrap();
    assert_eq!(stored.steps, 3);
    assert_eq!(
        (stored.usage.calls, stored.usage.input_tokens, stored.usage.output_tokens),
        (2, 400, 30),
        "each model step booked once"
    );
    let billed = store.model_usage(tenant).await.unwrap();
    assert_eq!(billed.len(), 1);
    let total = billed[0].total();
    assert_eq!((billed[0].model.as_str(), total.calls, total.input_tokens), ("default", 2, 400));
    assert_eq!(billed[0].distillation, ModelUsage::default(), "nothing distilled yet");
    assert!(store.model_usage(&principal("globex", "x").tenant).await.unwrap().is_empty());

    // Only the holder finishes it, once.
    assert!(!store.finish_run(tenant, branch.id, &end("b", "{}", 0, false, now)).await.unwrap());
    assert!(
        store
            .finish_run(tenant, branch.id, &end("a", "{\"done\": true}", 7, false, now))
            .await
            .unwrap()
    );
    assert!(!store.finish_run(tenant, branch.id, &end("a", "{}", 0, false, now)).await.unwrap());
    let done = store.run(tenant, branch.id).await.unwrap().unwrap();
    assert_eq!(done.state, RunState::Done);
    assert_eq!(done.outcome.as_deref(), Some("{\"done\": true}"));
    let returned = store.branch(tenant, branch.id).await.unwrap().unwrap().returned_tokens;
    assert_eq!(returned, Some(7), "what the caller got of a run is recorded as returned");
    let late = step(3, StepKind::Model, (1, 1), now);
    assert_eq!(
        store.record_step(tenant, branch.id, "a", &late).await.unwrap(),
        StepWritten::NotOwner
    );
    // Another tenant sees none of it.
    let other = principal("globex", "alice").tenant;
    assert!(store.run(&other, branch.id).await.unwrap().is_none());
    assert!(store.run_steps(&other, branch.id).await.unwrap().is_empty());
    env.db.cleanup().await;
}

async fn a_model_step_measures_the_context_into_the_ledger(backend: Backend) {
    let env = env(backend).await;
    let now = env.clock.now();
    let lease = now + chrono::Duration::seconds(30);
    let branch = env
        .service
        .create_run(&env.alice, req(&env.service, "s", 1_000), run("a", lease))
        .await
        .unwrap()
        .branch;
    let store = env.service.store();
    let tenant = &env.alice.tenant;
    // (input, output) of each model call, and the ledger's `used` after it.
    let calls = [((300, 50), 350, false), ((600, 100), 700, false), ((780, 30), 810, true)];
    for (seq, (usage, used, warned)) in calls.into_iter().enumerate() {
        let seq = u32::try_from(seq).unwrap();
        let written = store
            .record_step(tenant, branch.id, "a", &step(seq, StepKind::Model, usage, now))
            .await;
        let StepWritten::Written(Some(c)) = written.unwrap() else { panic!("measured") };
        assert_eq!(c.ledger.used, used, "the context as the provider counted it");
        assert_eq!(c.warning, warned, "the 80% warning at {used}");
        assert!(!c.exhausted);
    }
    let over = step(3, StepKind::Model, (990, 60), now);
    let written = store.record_step(tenant, branch.id, "a", &over).await.unwrap();
    let StepWritten::Written(Some(c)) = written else { panic!("measured") };
    assert_eq!((c.ledger.used, c.exhausted), (1_000, true), "never past the budget");
    let stored = store.branch(tenant, branch.id).await.unwrap().unwrap();
    assert_eq!(stored.ledger.used, 1_000);

    // The run's finding ends it, recorded as returned and not charged.
    let finish = Finish {
        status: BranchStatus::Completed,
        reason: None,
        result: Some("the finding".into()),
        result_tokens: 0,
        returned_tokens: Some(3),
        extract: false,
        at: now,
        by: None,
    };
    let ended = env.service.end_run(tenant, branch.id, finish).await.unwrap().unwrap();
    assert_eq!(
        (ended.status, ended.returned_tokens, ended.ledger.used),
        (BranchStatus::Completed, Some(3), 1_000)
    );
    let session = env.service.session_returned_tokens(&env.alice, &ended.session_id).await.unwrap();
    assert_eq!(session, 3, "what the fold added to the caller's context");
    let bob = principal("acme", "bob");
    assert_eq!(env.service.session_returned_tokens(&bob, &ended.session_id).await.unwrap(), 0);
    env.db.cleanup().await;
}

async fn lapsed_runs_are_taken_over_once(backend: Backend) {
    let env = env(backend).await;
    let now = env.clock.now();
    let store = env.service.store();
    let soon = now + chrono::Duration::seconds(3);
    let later = now + chrono::Duration::seconds(60);
    let live = env
        .service
        .create_run(&env.alice, req(&env.service, "s1", 1_000), run("a", later))
        .await
        .unwrap()
        .branch;
    let lapsing = env
        .service
        .create_run(&env.alice, req(&env.service, "s2", 1_000), run("a", soon))
        .await
        .unwrap()
        .branch;
    let done = env
        .service
        .create_run(&env.alice, req(&env.service, "s3", 1_000), run("a", soon))
        .await
        .unwrap()
        .branch;
    assert!(
        store.finish_run(&env.alice.tenant, done.id, &end("a", "{}", 0, false, now)).await.unwrap()
    );

    assert!(
        store.claim_lapsed_runs("b", now, later, 10).await.unwrap().is_empty(),
        "no lease has lapsed"
    );
    let after = soon + chrono::Duration::seconds(1);
    let (first, second) = tokio::join!(
        store.claim_lapsed_runs("b", after, later, 10),
        store.claim_lapsed_runs("c", after, later, 10),
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.len() + second.len(), 1, "taken over once: {first:?} {second:?}");
    let (tenant, id) = first.into_iter().chain(second).next().unwrap();
    assert_eq!((tenant, id), (env.alice.tenant.clone(), lapsing.id));
    let taken = store.run(&env.alice.tenant, lapsing.id).await.unwrap().unwrap();
    assert_eq!(taken.resumes, 1);
    assert!(matches!(taken.lease_owner.as_deref(), Some("b" | "c")));
    // The former holder can no longer write or renew.
    let stale = step(0, StepKind::Model, (1, 1), after);
    assert_eq!(
        store.record_step(&env.alice.tenant, lapsing.id, "a", &stale).await.unwrap(),
        StepWritten::NotOwner
    );
    assert!(!store.renew_run_lease(&env.alice.tenant, lapsing.id, "a", later).await.unwrap());
    assert!(store.renew_run_lease(&env.alice.tenant, live.id, "a", later).await.unwrap());

    // A branch ended from outside is found among its holder's runs.
    assert!(store.ended_runs("a").await.unwrap().is_empty(), "every branch is active");
    env.service
        .force_return(&env.alice.tenant, live.id, foldgate_domain::EndReason::SessionEnded)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.ended_runs("a").await.unwrap(), [live.id]);
    assert!(store.ended_runs("b").await.unwrap().is_empty(), "not b's run");
    env.db.cleanup().await;
}

async fn a_gateway_run_branch_stays_out_of_the_agents_stack(backend: Backend) {
    let env = env(backend).await;
    let now = env.clock.now();
    let gateway = env
        .service
        .create_run(
            &env.alice,
            req(&env.service, "s", 4_000),
            run("a", now + chrono::Duration::seconds(30)),
        )
        .await
        .unwrap()
        .branch;
    assert_eq!(gateway.depth, 1);
    let mine = env.service.create(&env.alice, req(&env.service, "s", 1_000)).await.unwrap().branch;
    assert_eq!((mine.depth, mine.parent), (1, None), "not nested under the gateway's branch");
    let mut under = req(&env.service, "s", 1_000);
    under.parent = Some(gateway.id);
    assert!(matches!(
        env.service.create(&env.alice, under).await,
        Err(FoldError::GatewayRunBranch)
    ));
    let active =
        env.service.store().active_branch(&env.alice.tenant, &gateway.session_id).await.unwrap();
    assert_eq!(active.map(|b| b.id), Some(mine.id));
    assert!(matches!(
        env.service.call_target(&env.alice, Some(gateway.id)).await,
        Err(FoldError::GatewayRunBranch)
    ));
    env.db.cleanup().await;
}

/// A run that ends asking for distillation is queued; concurrent claims
/// take it once; a claim held past its time is taken again; ended, it is
/// gone from the queue. A run that ends without it is never queued.
async fn distillations_are_queued_at_the_end_and_claimed_once(backend: Backend) {
    let env = env(backend).await;
    let store = env.service.store();
    let tenant = &env.alice.tenant;
    let now = env.service.clock().now();
    let later = now + chrono::Duration::seconds(60);
    let mut branches = Vec::new();
    for (session, distill) in [("s1", true), ("s2", false), ("s3", true)] {
        let branch = env
            .service
            .create_run(&env.alice, req(&env.service, session, 1_000), run("a", later))
            .await
            .unwrap()
            .branch;
        assert!(
            store.finish_run(tenant, branch.id, &end("a", "{}", 0, distill, now)).await.unwrap()
        );
        branches.push(branch.id);
    }
    let hold = now + chrono::Duration::seconds(30);
    let (first, second) = tokio::join!(
        store.claim_distillations(now, hold, 10),
        store.claim_distillations(now, hold, 10)
    );
    let mut claimed: Vec<_> =
        first.unwrap().into_iter().chain(second.unwrap()).map(|d| (d.branch, d.attempts)).collect();
    claimed.sort();
    let mut expected = vec![(branches[0], 1), (branches[2], 1)];
    expected.sort();
    assert_eq!(claimed, expected, "each pending distillation once, not the other run");
    assert!(store.claim_distillations(now, hold, 10).await.unwrap().is_empty(), "held");

    store.end_distillation(tenant, branches[0], ended(DistillOutcome::Done, &[], 1)).await.unwrap();
    let after = hold + chrono::Duration::seconds(1);
    let again = store.claim_distillations(after, after + chrono::Duration::seconds(30), 10);
    let again: Vec<_> = again.await.unwrap().into_iter().map(|d| (d.branch, d.attempts)).collect();
    assert_eq!(again, [(branches[2], 2)], "the one still pending, after its hold");
    let given_up = ended(DistillOutcome::Failed, &[], 2);
    store.end_distillation(tenant, branches[2], given_up).await.unwrap();
    let later = after + chrono::Duration::seconds(60);
    assert!(store.claim_distillations(later, later, 10).await.unwrap().is_empty());
}

/// A distilled lesson of `branch`, ready to store.
fn lesson(tenant: &str, branch: foldgate_domain::BranchId, title: &str) -> NewMemory {
    use foldgate_domain::{Confidence, MemoryId, MemoryKind, MemorySource, Provenance, Subject};
    NewMemory {
        id: MemoryId::generate(),
        kind: MemoryKind::Strategy,
        title: title.to_owned(),
        description: String::new(),
        content: format!("{title}: check the drain before the listener."),
        prior: Confidence::new(0.8).unwrap(),
        provenance: Provenance {
            tenant: foldgate_domain::TenantId::parse(tenant).unwrap(),
            subject: Subject::parse("alice").unwrap(),
            session: None,
            branch: Some(branch),
            source: MemorySource::Distilled,
        },
        flagged: Vec::new(),
        at: Utc::now(),
    }
}

/// A distillation whose hold lapsed is finished by two replicas: the first
/// to finish stores the lessons, the other none; both attempts' model calls
/// are billed to the tenant, apart from the runs'. A stale holder cannot
/// give up an entry another replica claimed since; a retry books its usage
/// and leaves the entry pending.
async fn distilled_lessons_are_stored_once_and_their_model_calls_billed(backend: Backend) {
    let env = env(backend).await;
    let store = env.service.store();
    let tenant = &env.alice.tenant;
    let now = env.service.clock().now();
    let lease = now + chrono::Duration::seconds(60);
    let mut branches = Vec::new();
    for session in ["s1", "s2"] {
        let req = req(&env.service, session, 4_000);
        let branch = env.service.create_run(&env.alice, req, run("a", lease)).await.unwrap().branch;
        let first = step(0, StepKind::Model, (600, 20), now);
        assert!(matches!(
            store.record_step(tenant, branch.id, "a", &first).await.unwrap(),
            StepWritten::Written(_)
        ));
        assert!(store.finish_run(tenant, branch.id, &end("a", "{}", 0, true, now)).await.unwrap());
        branches.push(branch.id);
    }
    let (done, given_up) = (branches[0], branches[1]);
    let hold = |at: DateTime<Utc>| at + chrono::Duration::seconds(30);
    let claim = |at| store.claim_distillations(at, hold(at), 10);
    assert_eq!(claim(now).await.unwrap().len(), 2);
    let after = hold(now) + chrono::Duration::seconds(1);
    let again: Vec<_> =
        claim(after).await.unwrap().iter().map(|d| (d.branch, d.attempts)).collect();
    assert_eq!(again.len(), 2, "both taken over: {again:?}");

    let billed = ModelUsage { calls: 1, input_tokens: 900, output_tokens: 80 };
    let second = [lesson("acme", done, "Drain first"), lesson("acme", done, "Then close")];
    let end = DistillationEnd {
        outcome: DistillOutcome::Done,
        lessons: &second,
        usage: billed,
        attempts: 2,
    };
    assert_eq!(store.end_distillation(tenant, done, end).await.unwrap().len(), 2);
    // The first holder finishes late, with lessons of its own.
    let first = [lesson("acme", done, "Drain first, again")];
    let end = DistillationEnd {
        outcome: DistillOutcome::Done,
        lessons: &first,
        usage: billed,
        attempts: 1,
    };
    assert!(store.end_distillation(tenant, done, end).await.unwrap().is_empty(), "stored once");
    let kept = store.list_memories(tenant, None, 10).await.unwrap();
    let mut titles: Vec<&str> = kept.iter().map(|m| m.title.as_str()).collect();
    titles.sort_unstable();
    assert_eq!(titles, ["Drain first", "Then close"]);

    // A retry books its model call and leaves the entry pending; the stale
    // holder cannot give it up, the last one can.
    let retry = DistillationEnd {
        outcome: DistillOutcome::Retry,
        lessons: &[],
        usage: billed,
        attempts: 2,
    };
    assert!(store.end_distillation(tenant, given_up, retry).await.unwrap().is_empty());
    store.end_distillation(tenant, given_up, ended(DistillOutcome::Failed, &[], 1)).await.unwrap();
    let later = hold(after) + chrono::Duration::seconds(1);
    let pending: Vec<_> =
        claim(later).await.unwrap().iter().map(|d| (d.branch, d.attempts)).collect();
    assert_eq!(pending, [(given_up, 3)], "still pending after the stale give-up");
    store.end_distillation(tenant, given_up, ended(DistillOutcome::Failed, &[], 3)).await.unwrap();
    let last = hold(later) + chrono::Duration::seconds(1);
    assert!(claim(last).await.unwrap().is_empty(), "given up");
    assert_eq!(store.list_memories(tenant, None, 10).await.unwrap().len(), 2);

    // The tenant was billed for both runs' calls and the three calls of
    // distillation, which are told apart.
    let bills = store.model_usage(tenant).await.unwrap();
    assert_eq!(bills.len(), 1, "{bills:?}");
    let bill = &bills[0];
    assert_eq!(bill.runs, ModelUsage { calls: 2, input_tokens: 1_200, output_tokens: 40 });
    assert_eq!(bill.distillation, ModelUsage { calls: 3, input_tokens: 2_700, output_tokens: 240 });
    assert_eq!(bill.total(), ModelUsage { calls: 5, input_tokens: 3_900, output_tokens: 280 });
    env.db.cleanup().await;
}
