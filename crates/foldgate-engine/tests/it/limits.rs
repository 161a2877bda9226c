//! Concurrency and rate limits under concurrent creates.
use std::sync::Arc;
use std::time::Duration;

use foldgate_domain::{BranchId, LimitKind, Limits, Principal};
use foldgate_engine::{FoldError, FoldingService};
use foldgate_testkit::{Backend, active_counters, on_both_backends, principal};

use crate::{create, create_req, create_under, env_with, roomy};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    session_concurrency_limit_holds_under_concurrent_creates,
    tenant_and_deployment_limits_hold_under_concurrent_creates,
    creation_rate_limit_holds_under_concurrent_creates,
);

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
