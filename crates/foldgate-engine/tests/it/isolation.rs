//! What other tenants and owners see, and what the scrubber lets through.
use std::sync::Arc;

use foldgate_domain::{BranchStatus, SessionId};
use foldgate_engine::{FoldError, StatusQuery};
use foldgate_testkit::{
    Backend, FailingScrubber, ServiceBuilder, TestDb, on_both_backends, principal,
};

use crate::{branch, create, create_req, env, ret};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    other_tenants_and_owners_see_nothing_and_change_nothing,
    scrubber_failure_leaves_the_branch_active_and_stores_nothing,
    returned_message_is_scrubbed_before_it_is_stored,
);

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
