//! Deadlines: fired children first, in batches, on time, once across engines.
use std::sync::Arc;
use std::time::Duration;

use foldgate_background::Driver;
use foldgate_domain::{BranchId, BranchStatus, EndReason, Limits, SessionId};
use foldgate_engine::supervisor::{self, DeadlineReconciler};
use foldgate_engine::{CreateBranch, FoldError, ManualClock, StatusQuery, SupervisorConfig};
use foldgate_store::DueBranch;
use foldgate_testkit::{
    Backend, ServiceBuilder, TestDb, active_counters, on_both_backends, principal,
};

use crate::{branch, create, create_req, env, env_with, ret, roomy};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    deadline_fires_children_first_with_their_reasons,
    due_branches_end_together_and_the_books_balance,
    supervisor_fires_a_deadline_within_a_second,
    two_engines_fire_each_deadline_exactly_once,
);

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
