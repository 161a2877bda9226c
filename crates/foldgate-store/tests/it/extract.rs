//! The queue of lessons to keep from returns (`branches.extract`), on each
//! backend: written by the transaction that ends the branch, so a return
//! that is rolled back queues nothing and a second return cannot queue
//! again; dropped by a tenant's data-deletion request.

use chrono::{DateTime, Utc};
use foldgate_domain::{
    BranchId, BranchKind, BranchStatus, BudgetPolicy, BudgetRequest, Confidence, Limits, MemoryId,
    MemoryKind, MemorySource, Provenance, ReturnTier, SessionId, Subject, TenantId,
};
use foldgate_store::{
    CreateRules, Finish, Finished, NewBranch, NewMemory, ParentChoice, Store, StoreError,
};
use foldgate_testkit::{Backend, TestDb, on_both_backends};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_return_queues_its_lesson_in_its_own_transaction,
);

const MESSAGE: &str = "Stream rows with a server-side cursor.";

async fn open(store: &dyn Store, tenant: &TenantId, session: &str, at: DateTime<Utc>) -> BranchId {
    let policy = BudgetPolicy::default();
    let new = NewBranch {
        id: BranchId::generate(),
        session_id: SessionId::parse(session).unwrap(),
        owner: Subject::parse("alice").unwrap(),
        parent: ParentChoice::Active,
        description: "Find why the export times out".into(),
        prompt: "look".into(),
        budget: BudgetRequest::parse(None, &policy).unwrap(),
        prompt_tokens: 0,
        lessons_tokens: 0,
        created_at: at,
        deadline_at: at + chrono::Duration::hours(1),
        rules: CreateRules { budget: policy, max_depth: 4, limits: Limits::default() },
        kind: BranchKind::Agent,
        return_tier: ReturnTier::default(),
        run: None,
    };
    store.create_branch(tenant, new).await.unwrap().unwrap().id
}

fn returned(extract: bool, at: DateTime<Utc>) -> Finish {
    Finish {
        status: BranchStatus::Completed,
        reason: None,
        result: Some(MESSAGE.into()),
        result_tokens: 8,
        returned_tokens: Some(8),
        extract,
        at,
        by: None,
    }
}

/// Makes every change to a session fail, as a database that fails in the
/// middle of a return would: the return's transaction updates its session
/// after ending the branch.
async fn refuse_session_updates(db: &TestDb, refuse: bool) {
    let statements: &[&'static str] = match (db.backend, refuse) {
        (Backend::Postgres, true) => &[
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused'; END $$",
            "CREATE TRIGGER refuse BEFORE UPDATE ON sessions FOR EACH ROW EXECUTE FUNCTION refuse()",
        ],
        (Backend::Postgres, false) => &["DROP TRIGGER refuse ON sessions"],
        (Backend::Sqlite, true) => &[
            "CREATE TRIGGER refuse BEFORE UPDATE ON sessions BEGIN SELECT RAISE(ABORT, 'refused'); END",
        ],
        (Backend::Sqlite, false) => &["DROP TRIGGER refuse"],
    };
    for statement in statements {
        match db.backend {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                sqlx::query(*statement).execute(&pool).await.unwrap();
                pool.close().await;
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
                sqlx::query(*statement).execute(&pool).await.unwrap();
                pool.close().await;
            }
        }
    }
}

fn lesson(tenant: &TenantId, branch: BranchId) -> NewMemory {
    NewMemory {
        id: MemoryId::generate(),
        kind: MemoryKind::Strategy,
        title: "Find why the export times out".into(),
        description: String::new(),
        content: MESSAGE.into(),
        prior: Confidence::new(0.5).unwrap(),
        provenance: Provenance {
            tenant: tenant.clone(),
            subject: Subject::parse("alice").unwrap(),
            session: None,
            branch: Some(branch),
            source: MemorySource::Recorded,
        },
        flagged: Vec::new(),
        at: Utc::now(),
    }
}

async fn a_return_queues_its_lesson_in_its_own_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let tenant = TenantId::parse("acme").unwrap();
    let now = Utc::now();
    let hold = |at: DateTime<Utc>| at + chrono::Duration::seconds(60);
    let (kept, plain) =
        (open(&*store, &tenant, "s1", now).await, open(&*store, &tenant, "s2", now).await);

    // A return whose transaction fails after the branch's row changed:
    // nothing of it stays, the queue entry included.
    refuse_session_updates(&db, true).await;
    let failed = store.finish(&tenant, kept, returned(true, now)).await;
    assert!(matches!(failed, Err(StoreError::Database(_))), "{failed:?}");
    refuse_session_updates(&db, false).await;
    let branch = store.branch(&tenant, kept).await.unwrap().unwrap();
    assert_eq!(branch.status, BranchStatus::Active, "rolled back");
    assert!(store.claim_extractions(now, hold(now), 10).await.unwrap().is_empty());

    // Returned for good, once with the request and once without; a second
    // return changes nothing.
    assert!(matches!(
        store.finish(&tenant, kept, returned(true, now)).await.unwrap(),
        Finished::Done(_)
    ));
    assert!(matches!(
        store.finish(&tenant, plain, returned(false, now)).await.unwrap(),
        Finished::Done(_)
    ));
    assert!(matches!(
        store.finish(&tenant, kept, returned(true, now)).await.unwrap(),
        Finished::NotActive(BranchStatus::Completed)
    ));
    let claimed = store.claim_extractions(now, hold(now), 10).await.unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let entry = &claimed[0];
    assert_eq!((entry.branch, entry.attempts, entry.status), (kept, 1, BranchStatus::Completed));
    assert_eq!((entry.message.as_str(), entry.owner.as_str()), (MESSAGE, "alice"));
    assert_eq!((entry.tenant.as_str(), entry.session.as_str()), ("acme", "s1"));
    assert_eq!(entry.description, "Find why the export times out");

    // A data-deletion request drops what was queued: the holder that
    // finishes afterwards stores nothing, and nothing is left to claim.
    let other = open(&*store, &tenant, "s3", now).await;
    store.finish(&tenant, other, returned(true, now)).await.unwrap();
    store.delete_memories(&tenant).await.unwrap();
    let late = store.end_extraction(&tenant, kept, 1, Some(&lesson(&tenant, kept))).await;
    assert_eq!(late.unwrap(), None);
    let after = hold(now) + chrono::Duration::seconds(1);
    assert!(store.claim_extractions(after, hold(after), 10).await.unwrap().is_empty());
    assert!(store.list_memories(&tenant, None, 10).await.unwrap().is_empty());
    store.close().await;
    db.cleanup().await;
}
