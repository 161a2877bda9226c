//! Branch trees: nesting, siblings, returns that take the children along.
use foldgate_domain::{BranchStatus, EndReason, Message, Outcome};
use foldgate_engine::{FoldError, ReturnBranch, StatusQuery};
use foldgate_testkit::{Backend, active_counters, on_both_backends};

use crate::{branch, create, create_req, create_under, env, ret, session_pool};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    nesting_reaches_depth_3_and_refuses_depth_4,
    explicit_parent_makes_siblings,
    concurrent_implicit_creates_stack_up,
    return_force_returns_active_children_deepest_first,
    second_return_is_refused,
);

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
        extract_memory: false,
    };
    let returned = s.return_branch(&env.alice, req).await.unwrap();
    assert_eq!(returned.branch.status, BranchStatus::Failed);
    assert_eq!(returned.branch.reason, Some(EndReason::ReportedFailure));
    assert_eq!(returned.branch.result.as_deref(), Some("could not reproduce"));
    env.db.cleanup().await;
}
