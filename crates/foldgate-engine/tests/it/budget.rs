//! Token pools: lent at creation, charged, warned at 80%, exhausted, refunded.
use std::sync::Arc;
use std::time::Duration;

use foldgate_domain::{BranchStatus, EndReason, SessionId};
use foldgate_engine::supervisor::DeadlineReconciler;
use foldgate_engine::{CreateBranch, FoldError, FoldingConfig, SupervisorConfig};
use foldgate_testkit::{Backend, active_counters, on_both_backends};

use crate::{branch, create, create_req, env, env_with, ret, session_pool};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    budget_is_deducted_at_creation_and_the_unspent_part_refunded,
    exhaustion_force_returns_and_refunds_the_parent,
    tokens_lent_to_children_cut_charges_short_without_exhausting,
    warning_at_80_percent_is_recorded_once,
    return_deadline_and_exhaustion_race_and_exactly_one_wins,
    concurrent_consumption_never_overspends,
    refusals_for_budget_and_prompt_size,
);

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
