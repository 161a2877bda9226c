//! The folding engine against real databases: every test runs on Postgres
//! and on SQLite, each with a fresh database.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::{sync::Arc, time::Duration};

use foldgate_background::Driver;
use foldgate_domain::{
    BranchId, BranchStatus, EndReason, LimitKind, Limits, Message, Outcome, Principal, SessionId,
};
use foldgate_engine::{
    CallOutcome, CallRecord, Clock, CreateBranch, FoldError, FoldingConfig, FoldingService,
    ManualClock, ReturnBranch, StatusQuery, SupervisorConfig,
    supervisor::{self, DeadlineReconciler, IdleSessionReconciler},
};
use foldgate_store::DueBranch;
use foldgate_testkit::{
    Backend, FailingScrubber, HeldWrite, ServiceBuilder, TestDb, active_counters, principal,
};

/// Runs each listed test on both backends.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(foldgate_testkit::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(foldgate_testkit::Backend::Sqlite).await;
                }
            )*
        }
    };
}

on_both_backends!(
    nesting_reaches_depth_3_and_refuses_depth_4,
    explicit_parent_makes_siblings,
    concurrent_implicit_creates_stack_up,
    budget_is_deducted_at_creation_and_the_unspent_part_refunded,
    exhaustion_force_returns_and_refunds_the_parent,
    tokens_lent_to_children_cut_charges_short_without_exhausting,
    warning_at_80_percent_is_recorded_once,
    return_force_returns_active_children_deepest_first,
    second_return_is_refused,
    return_deadline_and_exhaustion_race_and_exactly_one_wins,
    concurrent_consumption_never_overspends,
    metered_calls_are_charged_by_the_ledgers_rule,
    concurrent_metered_calls_never_overspend_and_are_all_recorded,
    a_metered_call_waits_for_a_concurrent_writer_and_charges_what_it_left,
    session_concurrency_limit_holds_under_concurrent_creates,
    tenant_and_deployment_limits_hold_under_concurrent_creates,
    creation_rate_limit_holds_under_concurrent_creates,
    session_end_fails_every_branch_and_refunds_the_pool,
    other_tenants_and_owners_see_nothing_and_change_nothing,
    scrubber_failure_leaves_the_branch_active_and_stores_nothing,
    returned_message_is_scrubbed_before_it_is_stored,
    deadline_fires_children_first_with_their_reasons,
    due_branches_end_together_and_the_books_balance,
    supervisor_fires_a_deadline_within_a_second,
    idle_sessions_are_ended,
    activity_is_recorded_to_the_second_and_no_session_is_ended_early,
    two_engines_fire_each_deadline_exactly_once,
    refusals_for_budget_and_prompt_size,
);

struct Env {
    db: TestDb,
    service: Arc<FoldingService>,
    clock: ManualClock,
    alice: Principal,
}

async fn env(backend: Backend) -> Env {
    env_with(backend, FoldingConfig::default()).await
}

async fn env_with(backend: Backend, config: FoldingConfig) -> Env {
    let db = TestDb::new(backend).await;
    let clock = ManualClock::starting_now();
    let service = ServiceBuilder::new(db.connect().await)
        .config(config)
        .clock(Arc::new(clock.clone()))
        .build();
    Env { db, service, clock, alice: principal("acme", "alice") }
}

fn create_req(service: &FoldingService, session: &str, budget: Option<i64>) -> CreateBranch {
    CreateBranch::parse(service.config(), session, "look into it", None, budget, None, None, None)
        .unwrap()
}

async fn create(
    service: &FoldingService,
    who: &Principal,
    session: &str,
    budget: Option<i64>,
) -> foldgate_domain::Branch {
    service.create(who, create_req(service, session, budget)).await.unwrap().branch
}

async fn create_under(
    service: &FoldingService,
    who: &Principal,
    session: &str,
    parent: BranchId,
    budget: i64,
) -> foldgate_domain::Branch {
    let mut req = create_req(service, session, Some(budget));
    req.parent = Some(parent);
    service.create(who, req).await.unwrap().branch
}

fn ret(id: BranchId, message: &str) -> ReturnBranch {
    ReturnBranch {
        branch_id: id,
        message: Message::parse(message).unwrap(),
        outcome: Outcome::Success,
    }
}

async fn branch(env: &Env, id: BranchId) -> foldgate_domain::Branch {
    env.service.status(&env.alice, StatusQuery::Branch(id)).await.unwrap().unwrap()
}

async fn session_pool(env: &Env, session: &str) -> foldgate_domain::Ledger {
    let id = SessionId::parse(session).unwrap();
    env.service.store().session(&env.alice.tenant, &id).await.unwrap().unwrap().ledger
}

async fn nesting_reaches_depth_3_and_refuses_depth_4(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b1 = create(s, &env.alice, "s", None).await;
    let b2 = create(s, &env.alice, "s", None).await;
    let b3 = create(s, &env.alice, "s", None).await;
    assert_eq!((b1.depth, b2.depth, b3.depth), (1, 2, 3));
    assert_eq!(b1.parent, None, "the first branch hangs off the session root");
    assert_eq!(b2.parent, Some(b1.id));
    assert_eq!(b3.parent, Some(b2.id));

    let err = s.create(&env.alice, create_req(s, "s", None)).await.unwrap_err();
    assert!(matches!(err, FoldError::MaxDepthExceeded { max_depth: 3 }), "{err:?}");
    assert_eq!(err.code().as_str(), "max_depth_exceeded");

    // The active branch is the deepest: after returning it, its parent is.
    let active = s.status(&env.alice, StatusQuery::Session(b1.session_id.clone())).await.unwrap();
    assert_eq!(active.unwrap().id, b3.id);
    s.return_branch(&env.alice, ret(b3.id, "done")).await.unwrap();
    let active = s.status(&env.alice, StatusQuery::Session(b1.session_id.clone())).await.unwrap();
    assert_eq!(active.unwrap().id, b2.id);
    env.db.cleanup().await;
}

async fn explicit_parent_makes_siblings(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let root = create(s, &env.alice, "s", Some(30_000)).await;
    let a = create_under(s, &env.alice, "s", root.id, 1_000).await;
    let b = create_under(s, &env.alice, "s", root.id, 1_000).await;
    let c = create_under(s, &env.alice, "s", root.id, 1_000).await;
    for child in [&a, &b, &c] {
        assert_eq!(child.parent, Some(root.id));
        assert_eq!(child.depth, 2);
    }
    assert_eq!(branch(&env, root.id).await.ledger.reserved, 3_000);
    // Returning one sibling leaves the others alone.
    s.return_branch(&env.alice, ret(a.id, "tried approach A")).await.unwrap();
    assert_eq!(branch(&env, b.id).await.status, BranchStatus::Active);
    assert_eq!(branch(&env, c.id).await.status, BranchStatus::Active);
    env.db.cleanup().await;
}

async fn concurrent_implicit_creates_stack_up(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let root = create(s, &env.alice, "s", Some(30_000)).await;
    let (a, b) = tokio::join!(
        s.create(&env.alice, create_req(s, "s", Some(2_000))),
        s.create(&env.alice, create_req(s, "s", Some(1_000))),
    );
    let (a, b) = (a.unwrap().branch, b.unwrap().branch);
    let (upper, lower) = if a.depth < b.depth { (a, b) } else { (b, a) };
    assert_eq!(upper.parent, Some(root.id));
    assert_eq!(lower.parent, Some(upper.id), "the later create nests under the earlier one");
    assert_eq!((upper.depth, lower.depth), (2, 3));
    env.db.cleanup().await;
}

async fn budget_is_deducted_at_creation_and_the_unspent_part_refunded(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let parent = create(s, &env.alice, "s", Some(20_000)).await;
    assert_eq!(session_pool(&env, "s").await.reserved, 20_000);
    let parent_used_at_start = parent.ledger.used;
    assert!(parent_used_at_start > 0, "the description is charged at creation");

    let child = create(s, &env.alice, "s", Some(5_000)).await;
    let p = branch(&env, parent.id).await;
    assert_eq!(p.ledger.reserved, 5_000, "lent to the child");
    assert_eq!(p.ledger.remaining(), 20_000 - 5_000 - parent_used_at_start);

    s.consume(&env.alice, child.id, 1_000).await.unwrap();
    let returned = s.return_branch(&env.alice, ret(child.id, "found it")).await.unwrap();
    let child_used = returned.branch.ledger.used;
    assert!(child_used >= 1_000 + child.ledger.used, "prompt, calls and message are charged");

    let p = branch(&env, parent.id).await;
    assert_eq!(p.ledger.reserved, 0, "the loan is released");
    assert_eq!(p.ledger.used, parent_used_at_start + child_used, "only what was spent stays spent");

    let returned = s.return_branch(&env.alice, ret(parent.id, "summary")).await.unwrap();
    let pool = session_pool(&env, "s").await;
    assert_eq!(pool.reserved, 0);
    assert_eq!(pool.used, returned.branch.ledger.used);
    assert_eq!(pool.remaining(), 1_000_000 - returned.branch.ledger.used);
    env.db.cleanup().await;
}

async fn exhaustion_force_returns_and_refunds_the_parent(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let parent = create(s, &env.alice, "s", Some(10_000)).await;
    let child = create(s, &env.alice, "s", Some(1_000)).await;

    let consumed = s.consume(&env.alice, child.id, 5_000).await.unwrap();
    assert!(consumed.consumption.exhausted);
    assert!(consumed.forced_return);
    assert_eq!(consumed.consumption.granted, 1_000 - child.ledger.used, "cut at the budget");

    let c = branch(&env, child.id).await;
    assert_eq!((c.status, c.reason), (BranchStatus::Timeout, Some(EndReason::BudgetExhausted)));
    assert_eq!(c.ledger.used, 1_000, "the child's whole budget is spent");
    let p = branch(&env, parent.id).await;
    assert_eq!(p.status, BranchStatus::Active);
    assert_eq!(p.ledger.reserved, 0);
    assert_eq!(p.ledger.used, parent.ledger.used + 1_000);

    let err = s.consume(&env.alice, child.id, 1).await.unwrap_err();
    assert!(matches!(err, FoldError::BranchNotActive { status: BranchStatus::Timeout }));
    env.db.cleanup().await;
}

async fn tokens_lent_to_children_cut_charges_short_without_exhausting(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let parent = create(s, &env.alice, "s", Some(1_000)).await;
    let child = create(s, &env.alice, "s", Some(600)).await;
    let left = 1_000 - 600 - parent.ledger.used;

    // The parent spends all it has not lent: cut short, not exhausted.
    let consumed = s.consume(&env.alice, parent.id, 5_000).await.unwrap();
    assert_eq!(consumed.consumption.granted, left);
    assert!(!consumed.consumption.exhausted && !consumed.forced_return);
    assert_eq!(branch(&env, parent.id).await.status, BranchStatus::Active);

    // The child spends its whole budget; settling it fills the parent, which
    // the supervisor then force-returns.
    let forced = s.consume(&env.alice, child.id, 5_000).await.unwrap();
    assert!(forced.forced_return);
    let p = branch(&env, parent.id).await;
    assert_eq!((p.ledger.used, p.ledger.reserved), (1_000, 0));
    let reconciler = DeadlineReconciler::new(Arc::clone(s), SupervisorConfig::default());
    let pass = reconciler.activate().await;
    assert_eq!(pass.fired, vec![(parent.id, EndReason::BudgetExhausted)]);
    let p = branch(&env, parent.id).await;
    assert_eq!((p.status, p.reason), (BranchStatus::Timeout, Some(EndReason::BudgetExhausted)));
    env.db.cleanup().await;
}

async fn warning_at_80_percent_is_recorded_once(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", Some(1_000)).await;
    let start = b.ledger.used;
    let first = s.consume(&env.alice, b.id, 790 - start).await.unwrap();
    assert!(!first.consumption.warning, "79%");
    assert_eq!(branch(&env, b.id).await.warned_at, None);
    let second = s.consume(&env.alice, b.id, 20).await.unwrap();
    assert!(second.consumption.warning, "81%");
    let warned_at = branch(&env, b.id).await.warned_at;
    assert!(warned_at.is_some());
    env.clock.advance(Duration::from_secs(1));
    let third = s.consume(&env.alice, b.id, 10).await.unwrap();
    assert!(!third.consumption.warning, "only once");
    assert_eq!(branch(&env, b.id).await.warned_at, warned_at, "first crossing is kept");
    env.db.cleanup().await;
}

async fn return_force_returns_active_children_deepest_first(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b1 = create(s, &env.alice, "s", Some(20_000)).await;
    let b2 = create(s, &env.alice, "s", Some(5_000)).await;
    let b3 = create(s, &env.alice, "s", Some(1_000)).await;
    let side = create_under(s, &env.alice, "s", b1.id, 1_000).await;

    let returned = s.return_branch(&env.alice, ret(b1.id, "all done")).await.unwrap();
    assert_eq!(returned.branch.status, BranchStatus::Completed);
    assert_eq!(returned.message, "all done");
    let order = &returned.children_ended;
    assert_eq!(order.len(), 3);
    assert_eq!(order[0], b3.id, "the deepest goes first");
    assert!(order[1..].contains(&b2.id) && order[1..].contains(&side.id));

    for id in [b2.id, b3.id, side.id] {
        let b = branch(&env, id).await;
        assert_eq!((b.status, b.reason), (BranchStatus::Failed, Some(EndReason::ParentReturning)));
        assert!(b.completed_at.unwrap() <= returned.branch.completed_at.unwrap());
    }
    let pool = session_pool(&env, "s").await;
    assert_eq!((pool.reserved, pool.used), (0, returned.branch.ledger.used));
    assert_eq!(active_counters(&env.db, "acme").await, (0, 0));
    env.db.cleanup().await;
}

async fn second_return_is_refused(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", None).await;
    s.return_branch(&env.alice, ret(b.id, "first")).await.unwrap();
    let err = s.return_branch(&env.alice, ret(b.id, "second")).await.unwrap_err();
    assert!(matches!(err, FoldError::BranchNotActive { status: BranchStatus::Completed }));
    assert_eq!(err.code().as_str(), "branch_not_active");
    assert_eq!(branch(&env, b.id).await.result.as_deref(), Some("first"), "unchanged");

    // A failure outcome ends the branch `failed`, with the message as context.
    let f = create(s, &env.alice, "s", None).await;
    let req = ReturnBranch {
        branch_id: f.id,
        message: Message::parse("could not reproduce").unwrap(),
        outcome: Outcome::Failure,
    };
    let returned = s.return_branch(&env.alice, req).await.unwrap();
    assert_eq!(returned.branch.status, BranchStatus::Failed);
    assert_eq!(returned.branch.reason, Some(EndReason::ReportedFailure));
    assert_eq!(returned.branch.result.as_deref(), Some("could not reproduce"));
    env.db.cleanup().await;
}

async fn return_deadline_and_exhaustion_race_and_exactly_one_wins(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let reconciler = DeadlineReconciler::new(Arc::clone(s), SupervisorConfig::default());
    let mut winners = std::collections::HashMap::new();
    for round in 0..25 {
        let session = format!("race-{round}");
        let mut req = create_req(s, &session, Some(1_000));
        req.timeout = foldgate_domain::TimeoutRequest::parse(Some(1), &s.config().timeout).unwrap();
        let b = s.create(&env.alice, req).await.unwrap().branch;
        env.clock.advance(Duration::from_secs(2));

        let (returned, pass, consumed) = tokio::join!(
            s.return_branch(&env.alice, ret(b.id, "racing")),
            reconciler.activate(),
            s.consume(&env.alice, b.id, 10_000),
        );
        let mut wins = 0;
        match returned {
            Ok(_) => wins += 1,
            Err(FoldError::BranchNotActive { .. }) => {}
            Err(e) => panic!("round {round}: return failed: {e:?}"),
        }
        assert_eq!(pass.error, None);
        wins += pass.fired.iter().filter(|(id, _)| *id == b.id).count();
        match consumed {
            Ok(c) if c.forced_return => wins += 1,
            Ok(_) | Err(FoldError::BranchNotActive { .. }) => {}
            Err(e) => panic!("round {round}: consume failed: {e:?}"),
        }
        let end = branch(&env, b.id).await;
        assert_eq!(wins, 1, "round {round}: exactly one transition, ended as {end:?}");
        *winners.entry((end.status, end.reason)).or_insert(0) += 1;
        let pool = session_pool(&env, &session).await;
        assert_eq!(pool.reserved, 0, "round {round}");
        assert_eq!(pool.used, end.ledger.used, "round {round}");
    }
    assert_eq!(active_counters(&env.db, "acme").await, (0, 0));
    println!("race winners over 25 rounds: {winners:?}");
    env.db.cleanup().await;
}

async fn concurrent_consumption_never_overspends(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", Some(2_000)).await;
    let start = b.ledger.used;
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let (s, who) = (Arc::clone(s), env.alice.clone());
            tokio::spawn(async move { s.consume(&who, b.id, 100).await })
        })
        .collect();
    let mut granted = 0;
    let mut forced = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(c) => {
                granted += c.consumption.granted;
                forced += usize::from(c.forced_return);
            }
            Err(FoldError::BranchNotActive { .. }) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    let end = branch(&env, b.id).await;
    assert_eq!(granted, 2_000 - start, "exactly the budget was granted");
    assert_eq!(end.ledger.used, 2_000, "and recorded");
    assert_eq!(forced, 1, "one forced return");
    assert_eq!((end.status, end.reason), (BranchStatus::Timeout, Some(EndReason::BudgetExhausted)));
    env.db.cleanup().await;
}

/// An upstream call of `tokens` in all, made now.
fn upstream_call(env: &Env, tokens: u64) -> CallRecord {
    CallRecord {
        upstream: "files".into(),
        tool: "read_file".into(),
        tokens_in: tokens / 3,
        tokens_out: tokens - tokens / 3,
        duration: Duration::from_millis(3),
        outcome: CallOutcome::Ok,
        at: env.clock.now(),
    }
}

/// A metered call is charged by the rule of every consumption
/// (`Ledger::consume`), whatever state the ledger is in, and lands in the
/// branch's trace with what it was charged.
async fn metered_calls_are_charged_by_the_ledgers_rule(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    // (spent before the call, lent to a child, the call's tokens), of a
    // budget of 1,000 (creation has spent a few on the prompt).
    let cases: &[(u64, u64, u64)] = &[
        (0, 0, 0),
        (0, 0, 1),
        (0, 0, 400),
        (0, 0, 5_000),
        (700, 0, 50),
        (700, 0, 150),
        (850, 0, 20),
        (850, 0, 5_000),
        (0, 600, 300),
        (0, 600, 5_000),
        (300, 600, 5_000),
        // Everything not lent is spent: nothing to grant, nothing exhausted.
        (5_000, 600, 50),
    ];
    for (i, &(spent, lent, tokens)) in cases.iter().enumerate() {
        let session = format!("rule-{i}");
        let b = create(s, &env.alice, &session, Some(1_000)).await;
        if lent > 0 {
            create_under(s, &env.alice, &session, b.id, i64::try_from(lent).unwrap()).await;
        }
        if spent > 0 {
            s.consume(&env.alice, b.id, spent).await.unwrap();
        }
        let before = branch(&env, b.id).await;
        let want = before.ledger.consume(tokens, before.warned_at.is_some());

        let call = upstream_call(&env, tokens);
        let metered = s.meter_call(&env.alice.tenant, b.id, &call).await.unwrap();
        let case = format!("case {i}: {:?}", cases[i]);
        assert_eq!(metered.consumption, Some(want), "{case}");
        assert_eq!(metered.forced_return, want.exhausted, "{case}");
        let after = branch(&env, b.id).await;
        assert_eq!(after.ledger, want.ledger, "{case}");
        assert_eq!(after.warned_at.is_some(), before.warned_at.is_some() || want.warning, "{case}");
        let status = if want.exhausted { BranchStatus::Timeout } else { BranchStatus::Active };
        assert_eq!(after.status, status, "{case}");
        let trace = s.call_summary(&env.alice, b.id).await.unwrap();
        assert_eq!((trace.calls, trace.tokens_charged), (1, want.granted), "{case}");
        // Recorded as received: a result the grant does not cover is cut.
        let (received, outcome) = call.received(want.granted);
        assert_eq!((trace.tokens_in, trace.tokens_out), (call.tokens_in, received), "{case}");
        assert_eq!(trace.truncated, u64::from(outcome == CallOutcome::Truncated), "{case}");
    }

    // Every outcome, cut short by a grant: a result is recorded cut, a call
    // without one as it was.
    let outcomes = [
        (CallOutcome::ToolError, 50, 600, CallOutcome::Truncated),
        (CallOutcome::Truncated, 50, 600, CallOutcome::Truncated),
        (CallOutcome::Refused, 200, 0, CallOutcome::Refused),
        (CallOutcome::UpstreamError, 200, 0, CallOutcome::UpstreamError),
    ];
    for (i, (outcome, tokens_in, tokens_out, recorded)) in outcomes.into_iter().enumerate() {
        let b = create(s, &env.alice, &format!("outcome-{i}"), Some(1_000)).await;
        s.consume(&env.alice, b.id, 850).await.unwrap();
        let call = CallRecord { tokens_in, tokens_out, outcome, ..upstream_call(&env, 0) };
        let granted = s.meter_call(&env.alice.tenant, b.id, &call).await.unwrap();
        let granted = granted.consumption.unwrap().granted;
        assert!(granted < call.tokens(), "{outcome:?}");
        let trace = s.call_summary(&env.alice, b.id).await.unwrap();
        let cut = recorded == CallOutcome::Truncated;
        let want_out = if cut { granted - tokens_in } else { tokens_out };
        assert!(!cut || want_out > 0, "a result cut short, not to nothing");
        assert_eq!((trace.tokens_in, trace.tokens_out), (tokens_in, want_out), "{outcome:?}");
        assert_eq!(trace.truncated, u64::from(cut), "{outcome:?}");
        assert_eq!(trace.errors, u64::from(!cut), "{outcome:?}");
    }

    // A call that finishes after its branch ended is recorded, charged
    // nothing, and received as nothing.
    let b = create(s, &env.alice, "ended", Some(1_000)).await;
    let ended = s.return_branch(&env.alice, ret(b.id, "done")).await.unwrap().branch;
    let call = upstream_call(&env, 80);
    let metered = s.meter_call(&env.alice.tenant, b.id, &call).await.unwrap();
    assert_eq!((metered.consumption, metered.forced_return), (None, false));
    let trace = s.call_summary(&env.alice, b.id).await.unwrap();
    assert_eq!((trace.calls, trace.tokens_in, trace.tokens_out), (1, call.tokens_in, 0));
    assert_eq!((trace.tokens_charged, trace.truncated), (0, 1));
    assert_eq!(branch(&env, b.id).await.ledger, ended.ledger, "the ended branch is unchanged");
    env.db.cleanup().await;
}

async fn concurrent_metered_calls_never_overspend_and_are_all_recorded(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", Some(2_000)).await;
    let start = b.ledger.used;
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let (s, tenant, call) =
                (Arc::clone(s), env.alice.tenant.clone(), upstream_call(&env, 100));
            tokio::spawn(async move { s.meter_call(&tenant, b.id, &call).await })
        })
        .collect();
    let (mut granted, mut forced, mut too_late) = (0, 0, 0);
    for t in tasks {
        let metered = t.await.unwrap().unwrap();
        match metered.consumption {
            Some(c) => granted += c.granted,
            None => too_late += 1,
        }
        forced += usize::from(metered.forced_return);
    }
    let end = branch(&env, b.id).await;
    assert_eq!(granted, 2_000 - start, "exactly the budget was granted");
    assert_eq!(end.ledger.used, 2_000, "and recorded");
    assert_eq!(forced, 1, "one forced return");
    assert_eq!((end.status, end.reason), (BranchStatus::Timeout, Some(EndReason::BudgetExhausted)));
    let trace = s.call_summary(&env.alice, b.id).await.unwrap();
    assert_eq!(trace.calls, 40, "every call is in the trace ({too_late} after the end)");
    assert_eq!(trace.tokens_charged, granted);
    env.db.cleanup().await;
}

/// A call charged while another writer holds its branch waits for that
/// writer and is charged against the branch as the writer left it.
async fn a_metered_call_waits_for_a_concurrent_writer_and_charges_what_it_left(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", Some(1_000)).await;
    let held = HeldWrite::spend(&env.db, b.id.as_uuid(), 500).await;

    let call = upstream_call(&env, 600);
    let charging = {
        let (s, tenant) = (Arc::clone(s), env.alice.tenant.clone());
        tokio::spawn(async move { s.meter_call(&tenant, b.id, &call).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!charging.is_finished(), "the charge waits for the other writer");
    held.commit().await;

    let metered = charging.await.unwrap().unwrap();
    let left_by_the_writer = foldgate_domain::Ledger { used: b.ledger.used + 500, ..b.ledger };
    let want = left_by_the_writer.consume(600, false);
    assert!(want.exhausted && want.granted == 500 - b.ledger.used, "{want:?}");
    assert_eq!(metered.consumption, Some(want));
    assert!(metered.forced_return);
    let end = branch(&env, b.id).await;
    assert_eq!(end.ledger.used, 1_000, "the writer's 500 and the call's rest");
    assert_eq!(end.status, BranchStatus::Timeout);
    env.db.cleanup().await;
}

/// Creates concurrently (under `parent`, if given), returning the successes
/// and the limits hit.
async fn create_concurrently(
    service: &Arc<FoldingService>,
    calls: Vec<(Principal, String)>,
    parent: Option<BranchId>,
) -> (usize, Vec<(LimitKind, Duration)>) {
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|(who, session)| {
            let s = Arc::clone(service);
            tokio::spawn(async move {
                let mut req = create_req(&s, &session, Some(256));
                req.parent = parent;
                s.create(&who, req).await
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(FoldError::RateLimited { limit, retry_after }) => {
                limited.push((limit, retry_after))
            }
            Err(e) => panic!("unexpected refusal {e:?}"),
        }
    }
    (ok, limited)
}

fn roomy(limits: Limits) -> FoldingConfig {
    FoldingConfig { max_depth: 1_000, limits, ..FoldingConfig::default() }
}

async fn session_concurrency_limit_holds_under_concurrent_creates(backend: Backend) {
    let limits = Limits { creations_per_minute: 1_000, ..Limits::default() };
    let env = env_with(backend, roomy(limits)).await;
    let root = create(&env.service, &env.alice, "s", Some(32_768)).await;
    let calls = (0..25).map(|_| (env.alice.clone(), "s".to_owned())).collect();
    let (ok, limited) = create_concurrently(&env.service, calls, Some(root.id)).await;
    assert_eq!(ok, 9, "the root is the tenth");
    assert_eq!(limited.len(), 16);
    assert!(
        limited.iter().all(|(l, r)| *l == LimitKind::SessionActive && *r >= Duration::from_secs(1))
    );
    assert_eq!(active_counters(&env.db, "acme").await, (10, 10));
    env.db.cleanup().await;
}

async fn tenant_and_deployment_limits_hold_under_concurrent_creates(backend: Backend) {
    let limits = Limits { max_active_per_tenant: 5, max_active_total: 8, ..Limits::default() };
    let env = env_with(backend, roomy(limits)).await;
    let calls = (0..12).map(|i| (env.alice.clone(), format!("s{i}"))).collect();
    let (ok, limited) = create_concurrently(&env.service, calls, None).await;
    assert_eq!(ok, 5, "tenant limit");
    assert!(limited.iter().all(|(l, _)| *l == LimitKind::TenantActive));

    let bob = principal("globex", "bob");
    let calls = (0..12).map(|i| (bob.clone(), format!("s{i}"))).collect();
    let (ok, limited) = create_concurrently(&env.service, calls, None).await;
    assert_eq!(ok, 3, "deployment limit: 8 in all");
    assert!(
        limited
            .iter()
            .all(|(l, _)| matches!(l, LimitKind::DeploymentActive | LimitKind::TenantActive))
    );
    assert!(limited.iter().any(|(l, _)| *l == LimitKind::DeploymentActive));
    assert_eq!(active_counters(&env.db, "acme").await, (5, 8));
    assert_eq!(active_counters(&env.db, "globex").await, (3, 8));
    env.db.cleanup().await;
}

async fn creation_rate_limit_holds_under_concurrent_creates(backend: Backend) {
    let env = env_with(backend, roomy(Limits::default())).await;
    let root = create(&env.service, &env.alice, "s", Some(32_768)).await;
    let calls = (0..12).map(|_| (env.alice.clone(), "s".to_owned())).collect();
    let (ok, limited) = create_concurrently(&env.service, calls, Some(root.id)).await;
    assert_eq!(ok, 4, "the root was the first of five");
    assert_eq!(limited.len(), 8);
    for (limit, retry_after) in &limited {
        assert_eq!(*limit, LimitKind::SessionCreationRate);
        assert!(*retry_after <= Duration::from_secs(60) && *retry_after >= Duration::from_secs(59));
    }
    // The window slides: a minute later creation works again.
    env.clock.advance(Duration::from_secs(61));
    create_under(&env.service, &env.alice, "s", root.id, 256).await;
    env.db.cleanup().await;
}

async fn session_end_fails_every_branch_and_refunds_the_pool(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b1 = create(s, &env.alice, "s", Some(20_000)).await;
    let b2 = create(s, &env.alice, "s", Some(5_000)).await;
    let b3 = create_under(s, &env.alice, "s", b1.id, 2_000).await;
    let other = create(s, &env.alice, "other", None).await;
    s.consume(&env.alice, b2.id, 700).await.unwrap();

    let sid = SessionId::parse("s").unwrap();
    let ended = s.end_session(&env.alice, &sid).await.unwrap();
    assert_eq!(ended.branches_ended, 3);
    assert!(!ended.bulk_failed);
    let mut total = 0;
    for id in [b1.id, b2.id, b3.id] {
        let b = branch(&env, id).await;
        assert_eq!((b.status, b.reason), (BranchStatus::Failed, Some(EndReason::SessionEnded)));
        if b.depth == 1 {
            total += b.ledger.used;
        }
    }
    let stored = s.store().session(&env.alice.tenant, &sid).await.unwrap().unwrap();
    assert_eq!(stored.status, foldgate_domain::SessionStatus::Ended);
    assert_eq!((stored.ledger.reserved, stored.ledger.used), (0, total));
    assert!(total >= 700);
    assert!(s.status(&env.alice, StatusQuery::Session(sid.clone())).await.unwrap().is_none());
    assert_eq!(
        branch(&env, other.id).await.status,
        BranchStatus::Active,
        "other sessions untouched"
    );

    // Ending again is harmless; a new create reopens the session with a fresh pool.
    assert_eq!(s.end_session(&env.alice, &sid).await.unwrap().branches_ended, 0);
    let again = create(s, &env.alice, "s", None).await;
    assert_eq!(again.depth, 1);
    let reopened = s.store().session(&env.alice.tenant, &sid).await.unwrap().unwrap();
    assert_eq!(reopened.status, foldgate_domain::SessionStatus::Open);
    assert_eq!(reopened.ledger.used, 0);
    env.db.cleanup().await;
}

async fn other_tenants_and_owners_see_nothing_and_change_nothing(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let mine = create(s, &env.alice, "s", None).await;
    let before = branch(&env, mine.id).await;
    let sid = SessionId::parse("s").unwrap();

    for (who, why) in [
        (principal("globex", "alice"), "another tenant"),
        (principal("acme", "mallory"), "another owner"),
    ] {
        let err = s.status(&who, StatusQuery::Branch(mine.id)).await.unwrap_err();
        assert!(matches!(err, FoldError::BranchNotFound), "{why}: status {err:?}");
        assert!(
            s.status(&who, StatusQuery::Session(sid.clone())).await.unwrap().is_none(),
            "{why}"
        );
        let err = s.return_branch(&who, ret(mine.id, "hijack")).await.unwrap_err();
        assert!(matches!(err, FoldError::BranchNotFound), "{why}: return {err:?}");
        let err = s.consume(&who, mine.id, 100).await.unwrap_err();
        assert!(matches!(err, FoldError::BranchNotFound), "{why}: consume {err:?}");
        let mut req = create_req(s, "s", None);
        req.parent = Some(mine.id);
        let err = s.create(&who, req).await.unwrap_err();
        assert!(matches!(err, FoldError::BranchNotFound), "{why}: explicit parent {err:?}");
        let err = s.end_session(&who, &sid).await.unwrap_err();
        assert!(matches!(err, FoldError::SessionNotFound), "{why}: end {err:?}");
    }
    // Same tenant, same session id, other owner: refused as not found.
    let err = s.create(&principal("acme", "mallory"), create_req(s, "s", None)).await.unwrap_err();
    assert!(matches!(err, FoldError::SessionNotFound), "{err:?}");
    // Another tenant may use the same session id for its own session.
    let theirs = create(s, &principal("globex", "alice"), "s", None).await;
    assert_eq!(theirs.depth, 1, "a separate tree");

    assert_eq!(branch(&env, mine.id).await, before, "nothing changed");
    env.db.cleanup().await;
}

async fn scrubber_failure_leaves_the_branch_active_and_stores_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let s = ServiceBuilder::new(db.connect().await).scrubber(Arc::new(FailingScrubber)).build();
    let alice = principal("acme", "alice");
    let parent = create(&s, &alice, "s", Some(10_000)).await;
    let child = create(&s, &alice, "s", None).await;
    let before = s.status(&alice, StatusQuery::Branch(parent.id)).await.unwrap().unwrap();

    let err = s.return_branch(&alice, ret(parent.id, "AKIAIOSFODNN7REALKEY")).await.unwrap_err();
    assert!(matches!(err, FoldError::ScrubbingFailed), "{err:?}");
    assert_eq!(err.code().as_str(), "scrubbing_failed");
    assert!(!err.to_string().contains("AKIA"), "the error does not echo the message");

    let after = s.status(&alice, StatusQuery::Branch(parent.id)).await.unwrap().unwrap();
    assert_eq!(after, before, "still active, no result stored");
    let c = s.status(&alice, StatusQuery::Branch(child.id)).await.unwrap().unwrap();
    assert_eq!(c.status, BranchStatus::Active, "children are not touched either");
    db.cleanup().await;
}

async fn returned_message_is_scrubbed_before_it_is_stored(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", None).await;
    let key = format!("ghp_{}", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8");
    let message = format!("Found the bug in auth.rs. The CI token was {key}; rotate it.");
    let returned = s.return_branch(&env.alice, ret(b.id, &message)).await.unwrap();
    assert!(!returned.message.contains(&key), "{}", returned.message);
    assert!(returned.message.contains("[REDACTED:"), "{}", returned.message);
    assert!(returned.message.starts_with("Found the bug in auth.rs."));
    assert_eq!(returned.redactions, 1);
    let stored = branch(&env, b.id).await.result.unwrap();
    assert_eq!(stored, returned.message, "only the scrubbed text is stored");
    env.db.cleanup().await;
}

async fn deadline_fires_children_first_with_their_reasons(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let mut req = create_req(s, "s", Some(10_000));
    req.timeout = foldgate_domain::TimeoutRequest::parse(Some(10), &s.config().timeout).unwrap();
    let parent = s.create(&env.alice, req).await.unwrap().branch;
    let child = create(s, &env.alice, "s", None).await; // asks for the default 300 s
    assert_eq!(child.deadline_at, parent.deadline_at, "a child never outlives its parent");
    let reconciler = DeadlineReconciler::new(Arc::clone(s), SupervisorConfig::default());

    env.clock.advance(Duration::from_secs(9));
    assert!(reconciler.activate().await.fired.is_empty(), "not yet due");
    env.clock.advance(Duration::from_secs(2));
    let err = s.create(&env.alice, create_req(s, "s", None)).await.unwrap_err();
    assert!(
        matches!(err, FoldError::BranchNotActive { status: BranchStatus::Timeout }),
        "no child under a branch past its deadline: {err:?}"
    );

    let pass = reconciler.activate().await;
    assert_eq!(
        pass.fired,
        vec![(child.id, EndReason::DeadlineExceeded), (parent.id, EndReason::DeadlineExceeded)],
        "deepest first"
    );
    let p = branch(&env, parent.id).await;
    assert_eq!((p.status, p.reason), (BranchStatus::Timeout, Some(EndReason::DeadlineExceeded)));
    let c = branch(&env, child.id).await;
    assert_eq!((c.status, c.reason), (BranchStatus::Timeout, Some(EndReason::DeadlineExceeded)));
    assert!(c.completed_at <= p.completed_at);
    assert!(reconciler.activate().await.fired.is_empty(), "idempotent");

    // A parent force-returned for its deadline takes children that are not
    // yet due (here: exhausted ones are not; a branch with a longer
    // deadline cannot exist) with it, as `parent_returning`.
    let mut req = create_req(s, "t", Some(10_000));
    req.timeout = foldgate_domain::TimeoutRequest::parse(Some(10), &s.config().timeout).unwrap();
    let parent = s.create(&env.alice, req).await.unwrap().branch;
    let child = create(s, &env.alice, "t", None).await;
    s.force_return(&env.alice.tenant, parent.id, EndReason::DeadlineExceeded).await.unwrap();
    let c = branch(&env, child.id).await;
    assert_eq!((c.status, c.reason), (BranchStatus::Failed, Some(EndReason::ParentReturning)));
    env.db.cleanup().await;
}

async fn due_branches_end_together_and_the_books_balance(backend: Backend) {
    let env = env_with(backend, roomy(Limits::default())).await;
    let s = &env.service;
    let bob = principal("globex", "bob");
    let due_entry = |b: &foldgate_domain::Branch| DueBranch {
        tenant: b.tenant.clone(),
        id: b.id,
        depth: b.depth,
        reason: EndReason::DeadlineExceeded,
    };
    // Twenty sessions over two tenants, each with a branch and its child.
    let mut due = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..10 {
        for who in [&env.alice, &bob] {
            let session = format!("s{i}");
            let parent = create(s, who, &session, Some(4_000)).await;
            let child = create(s, who, &session, Some(1_000)).await;
            due.extend([due_entry(&parent), due_entry(&child)]);
            sessions.push((who.clone(), session));
        }
    }
    // A parent listed without its child, and a branch returned meanwhile.
    let lone = create(s, &env.alice, "x", Some(4_000)).await;
    let lone_child = create(s, &env.alice, "x", Some(1_000)).await;
    let returned = create(s, &env.alice, "y", None).await;
    s.return_branch(&env.alice, ret(returned.id, "done")).await.unwrap();
    due.extend([due_entry(&lone), due_entry(&returned)]);
    sessions.extend([(env.alice.clone(), "x".to_owned()), (env.alice.clone(), "y".to_owned())]);
    due.sort_by_key(|b| std::cmp::Reverse(b.depth));

    let fired = s.force_return_due(&due).await.unwrap();
    let fired_ids: Vec<BranchId> = fired.iter().map(|(b, _)| b.id).collect();
    assert_eq!(fired.len(), 41, "every due branch but the returned one");
    assert!(!fired_ids.contains(&returned.id));
    for (b, reason) in &fired {
        assert_eq!(*reason, EndReason::DeadlineExceeded);
        assert_eq!((b.status, b.reason), (BranchStatus::Timeout, Some(*reason)));
    }
    // Children end before their parents.
    for entry in due.iter().filter(|e| e.depth == 2) {
        let child = s.store().branch(&entry.tenant, entry.id).await.unwrap().unwrap();
        let parent = child.parent.unwrap();
        let at = |id| fired_ids.iter().position(|f| *f == id).unwrap();
        assert!(at(child.id) < at(parent), "child first");
    }
    let c = branch(&env, lone_child.id).await;
    assert_eq!((c.status, c.reason), (BranchStatus::Failed, Some(EndReason::ParentReturning)));
    assert_eq!(branch(&env, returned.id).await.status, BranchStatus::Completed);

    // Every loan is settled and every slot given back.
    for (who, session) in &sessions {
        let id = SessionId::parse(session).unwrap();
        let pool = s.store().session(&who.tenant, &id).await.unwrap().unwrap().ledger;
        assert_eq!(pool.reserved, 0, "{session}");
    }
    assert_eq!(active_counters(&env.db, "acme").await, (0, 0));
    assert_eq!(active_counters(&env.db, "globex").await, (0, 0));
    assert!(s.force_return_due(&due).await.unwrap().is_empty(), "idempotent");
    env.db.cleanup().await;
}

async fn supervisor_fires_a_deadline_within_a_second(backend: Backend) {
    let db = TestDb::new(backend).await;
    let s = ServiceBuilder::new(db.connect().await).build();
    let alice = principal("acme", "alice");
    let mut driver = Driver::default();
    supervisor::register(&mut driver, Arc::clone(&s), SupervisorConfig::default());
    let supervisor = driver.start();
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut req = create_req(&s, &format!("s{i}"), None);
        req.timeout = foldgate_domain::TimeoutRequest::parse(Some(1), &s.config().timeout).unwrap();
        ids.push(s.create(&alice, req).await.unwrap().branch.id);
    }
    let mut ended = Vec::new();
    for id in ids {
        let b = loop {
            let b = s.status(&alice, StatusQuery::Branch(id)).await.unwrap().unwrap();
            if b.status.is_terminal() {
                break b;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            (b.status, b.reason),
            (BranchStatus::Timeout, Some(EndReason::DeadlineExceeded))
        );
        let late = b.completed_at.unwrap() - b.deadline_at;
        assert!(late >= chrono::Duration::zero(), "never early");
        assert!(late < chrono::Duration::seconds(1), "fired {late} after the deadline");
        ended.push(late);
    }
    println!("deadline lateness: {ended:?}");
    supervisor.shutdown().await;
    db.cleanup().await;
}

async fn idle_sessions_are_ended(backend: Backend) {
    let config = FoldingConfig {
        session_idle_timeout: Duration::from_secs(3600),
        ..FoldingConfig::default()
    };
    let env = env_with(backend, config).await;
    let s = &env.service;
    let idle = create(s, &env.alice, "idle", None).await;
    s.return_branch(&env.alice, ret(idle.id, "done")).await.unwrap();
    env.clock.advance(Duration::from_secs(1800));
    let busy = create(s, &env.alice, "busy", None).await;
    let reconciler = IdleSessionReconciler::new(Arc::clone(s), SupervisorConfig::default());

    assert_eq!(reconciler.activate().await.sessions_ended, 0, "30 minutes is not idle");
    env.clock.advance(Duration::from_secs(1801));
    let pass = reconciler.activate().await;
    assert_eq!(pass.sessions_ended, 1, "{pass:?}");
    let sid = SessionId::parse("idle").unwrap();
    let stored = s.store().session(&env.alice.tenant, &sid).await.unwrap().unwrap();
    assert_eq!(stored.status, foldgate_domain::SessionStatus::Ended);
    let busy_sid = SessionId::parse("busy").unwrap();
    let stored = s.store().session(&env.alice.tenant, &busy_sid).await.unwrap().unwrap();
    assert_eq!(stored.status, foldgate_domain::SessionStatus::Open);
    assert_eq!(branch(&env, busy.id).await.status, BranchStatus::Active);

    // A session found idle but used before it is ended stays open.
    let stale = env.clock.now() - chrono::Duration::seconds(10);
    let back = create(s, &env.alice, "idle", None).await;
    let sid = SessionId::parse("idle").unwrap();
    let ended = s.end_session_of(&env.alice.tenant, &sid, Some(stale)).await.unwrap();
    assert!(!ended.session_ended);
    assert_eq!(branch(&env, back.id).await.status, BranchStatus::Active, "its branch lives");
    env.db.cleanup().await;
}

/// Activity is written at most once per `ACTIVITY_RESOLUTION` (metered
/// calls are frequent), and the idle-session queries allow for that, so that a
/// session is ended as idle at most that late and never early.
async fn activity_is_recorded_to_the_second_and_no_session_is_ended_early(backend: Backend) {
    let config =
        FoldingConfig { session_idle_timeout: Duration::from_secs(60), ..FoldingConfig::default() };
    let env = env_with(backend, config).await;
    let s = &env.service;
    let sid = SessionId::parse("busy").unwrap();
    let recorded = || async {
        s.store().session(&env.alice.tenant, &sid).await.unwrap().unwrap().last_activity_at
    };
    let started = env.clock.now();
    let b = create(s, &env.alice, "busy", None).await;
    assert_eq!(recorded().await, started);

    env.clock.advance(Duration::from_millis(600));
    s.meter_call(&env.alice.tenant, b.id, &upstream_call(&env, 30)).await.unwrap();
    assert_eq!(recorded().await, started, "0.6 s later: not written");
    env.clock.advance(Duration::from_millis(600));
    let second = env.clock.now();
    s.meter_call(&env.alice.tenant, b.id, &upstream_call(&env, 30)).await.unwrap();
    assert_eq!(recorded().await, second, "1.2 s later: written");
    env.clock.advance(Duration::from_millis(500));
    let last_activity = env.clock.now();
    s.return_branch(&env.alice, ret(b.id, "done")).await.unwrap();
    assert_eq!(recorded().await, second, "the return, 0.5 s later: not written");

    let reconciler = IdleSessionReconciler::new(Arc::clone(s), SupervisorConfig::default());
    // 59.8 s after the last activity, 60.3 s after the record of it.
    env.clock.advance(Duration::from_millis(59_800));
    assert_eq!(reconciler.activate().await.sessions_ended, 0, "not idle for 60 s yet");
    let open = s.store().session(&env.alice.tenant, &sid).await.unwrap().unwrap();
    assert_eq!(open.status, foldgate_domain::SessionStatus::Open);
    env.clock.advance(Duration::from_millis(1_300));
    assert!(env.clock.now() - last_activity < chrono::Duration::seconds(62));
    let pass = reconciler.activate().await;
    assert_eq!(pass.sessions_ended, 1, "idle for 61.1 s: ended, {pass:?}");
    env.db.cleanup().await;
}

async fn two_engines_fire_each_deadline_exactly_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let clock = ManualClock::starting_now();
    let engines: Vec<_> = futures::future::join_all((0..2).map(|_| async {
        ServiceBuilder::new(db.connect().await).clock(Arc::new(clock.clone())).build()
    }))
    .await;
    let config = SupervisorConfig { batch_size: 7, ..SupervisorConfig::default() };
    let alice = principal("acme", "alice");
    let mut created = std::collections::HashSet::new();
    for i in 0..40 {
        let s = &engines[i % 2];
        let req =
            CreateBranch::parse(s.config(), &format!("s{i}"), "x", None, None, Some(5), None, None)
                .unwrap();
        let b = s.create(&alice, req).await.unwrap().branch;
        created.insert(b.id);
    }
    clock.advance(Duration::from_secs(6));
    let first = DeadlineReconciler::new(Arc::clone(&engines[0]), config.clone());
    let second = DeadlineReconciler::new(Arc::clone(&engines[1]), config);
    let (a, b) = tokio::join!(first.activate(), second.activate());
    assert_eq!((a.error.clone(), b.error.clone()), (None, None));
    let fired_a: std::collections::HashSet<_> = a.fired.iter().map(|(id, _)| *id).collect();
    let fired_b: std::collections::HashSet<_> = b.fired.iter().map(|(id, _)| *id).collect();
    assert_eq!(fired_a.len() + fired_b.len(), 40, "a: {}, b: {}", a.fired.len(), b.fired.len());
    assert!(fired_a.is_disjoint(&fired_b), "no branch fired twice");
    let all: std::collections::HashSet<_> = fired_a.union(&fired_b).copied().collect();
    assert_eq!(all, created);
    println!("engine A fired {}, engine B fired {}", fired_a.len(), fired_b.len());
    for s in &engines {
        s.store().close().await;
    }
    db.cleanup().await;
}

async fn refusals_for_budget_and_prompt_size(backend: Backend) {
    let config = FoldingConfig {
        budget: foldgate_domain::BudgetPolicy { session_budget: 10_000, ..Default::default() },
        ..FoldingConfig::default()
    };
    let env = env_with(backend, config).await;
    let s = &env.service;
    let big = create(s, &env.alice, "s", Some(32_768)).await;
    assert_eq!(big.ledger.budget, 10_000, "the parent gives what it has");
    let other = s.create(&env.alice, create_req(s, "s2", Some(100_000))).await.unwrap();
    assert_eq!(other.branch.ledger.budget, 10_000, "capped at the session pool");
    assert_eq!(other.budget_requested, 32_768, "and at max_budget first");

    s.consume(&env.alice, big.id, 9_800).await.unwrap();
    let err = s.create(&env.alice, create_req(s, "s", None)).await.unwrap_err();
    assert!(matches!(err, FoldError::BudgetExhausted { available } if available < 256), "{err:?}");
    assert_eq!(err.code().as_str(), "budget_exhausted");

    let prompt = "word ".repeat(2_000);
    let req =
        CreateBranch::parse(s.config(), "s3", "x", Some(&prompt), Some(256), None, None, None)
            .unwrap();
    let err = s.create(&env.alice, req).await.unwrap_err();
    assert!(matches!(err, FoldError::PromptOverBudget { .. }), "{err:?}");
    assert_eq!(active_counters(&env.db, "acme").await, (2, 2), "refusals wrote nothing");
    let s3 = SessionId::parse("s3").unwrap();
    assert!(
        s.store().session(&env.alice.tenant, &s3).await.unwrap().is_none(),
        "no session either"
    );
    env.db.cleanup().await;
}
