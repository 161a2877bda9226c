//! Sessions: ended with their branches, ended when idle, never early.
use std::sync::Arc;
use std::time::Duration;

use foldgate_domain::{BranchStatus, EndReason, SessionId};
use foldgate_engine::supervisor::IdleSessionReconciler;
use foldgate_engine::{Clock, FoldingConfig, StatusQuery, SupervisorConfig};
use foldgate_testkit::{Backend, on_both_backends};

use crate::{branch, create, create_under, env, env_with, ret, upstream_call};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    session_end_fails_every_branch_and_refunds_the_pool,
    idle_sessions_are_ended,
    activity_is_recorded_to_the_second_and_no_session_is_ended_early,
);

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
