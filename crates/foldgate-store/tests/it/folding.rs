//! The folding operations on Postgres (one statement each, server-side
//! functions) against the same operations on SQLite (the Rust rules in
//! `ops.rs`, statement by statement): random sequences of creates, ends of
//! trees and supervisor batches run on both, and every answer and the state
//! they leave (ledgers, statuses, deadlines, warnings, counters) must be the
//! same.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
};

use chrono::{DateTime, Duration, Utc};
use foldgate_domain::{
    Branch, BranchId, BranchKind, BranchStatus, BudgetPolicy, BudgetRequest, EndReason, Limits,
    ReturnTier, SessionId, Subject, TenantId, Tokens,
};
use foldgate_store::{BatchFinish, CreateRules, Finish, NewBranch, NewRun, ParentChoice, Store};
use foldgate_testkit::{Backend, TestDb, active_counters};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use uuid::Uuid;

/// Sequences per run; each has up to `OPS` operations.
const CASES: u32 = 40;
const OPS: usize = 24;

#[derive(Debug, Clone)]
enum Parent {
    Active,
    /// One of the branches created so far (by index), if any.
    Created(usize),
    /// A branch that does not exist.
    Unknown,
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        session: u8,
        owner: u8,
        parent: Parent,
        budget: Tokens,
        prompt: Tokens,
        lessons: Tokens,
        gateway: bool,
        timeout_s: i64,
    },
    /// Ends a created branch (by index) after its descendants.
    /// `by`: nobody (the gateway's own end), or the agent returning it
    /// (alice, bob), which the end checks.
    EndTree { pick: usize, status: u8, result_tokens: Tokens, extract: bool, by: u8 },
    /// The supervisor's batch over created branches (by index).
    Batch { picks: Vec<usize>, exhausted: bool },
}

/// One sequence: its rules and its operations, each after some time.
#[derive(Debug, Clone)]
struct Case {
    policy: BudgetPolicy,
    max_depth: u32,
    limits: Limits,
    ops: Vec<(u32, Op)>,
}

fn op() -> impl Strategy<Value = Op> {
    let parent = prop_oneof![
        4 => Just(Parent::Active),
        4 => (0..OPS).prop_map(Parent::Created),
        1 => Just(Parent::Unknown),
    ];
    prop_oneof![
        6 => (
            (0..2u8, prop::bool::weighted(0.9).prop_map(|same| u8::from(!same)), parent),
            (prop_oneof![1..=40u64, 1..=4_000u64], 0..=60u64, prop_oneof![Just(0u64), 0..=40u64]),
            (prop::bool::weighted(0.15), 1..=90i64),
        )
            .prop_map(|((session, owner, parent), (budget, prompt, lessons), (gateway, t))| {
                Op::Create {
                    session,
                    owner,
                    parent,
                    budget,
                    prompt,
                    lessons,
                    gateway,
                    timeout_s: t,
                }
            }),
        3 => (0..OPS, 0..4u8, 0..=80u64, any::<bool>(), 0..3u8).prop_map(
            |(pick, status, result_tokens, extract, by)| Op::EndTree {
                pick,
                status,
                result_tokens,
                extract,
                by,
            }
        ),
        1 => (prop::collection::vec(0..OPS, 1..5), any::<bool>())
            .prop_map(|(picks, exhausted)| Op::Batch { picks, exhausted }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1..=6_000u64, 1..=30u64, 1..=4u32),
        (1..=5u32, 1..=8u32, 1..=10u32, 1..=12u32),
        prop::collection::vec((0..40_000u32, op()), 1..=OPS),
    )
        .prop_map(|((session_budget, min, max_depth), (session, tenant, total, rate), ops)| {
            Case {
                policy: BudgetPolicy {
                    default_budget: 100,
                    max_budget: 10_000,
                    min_branch_budget: min,
                    session_budget,
                },
                max_depth,
                limits: Limits {
                    max_active_per_session: session,
                    max_active_per_tenant: tenant,
                    max_active_total: total,
                    creations_per_minute: rate,
                },
                ops,
            }
        })
}

/// One backend's store, in a database of its own.
struct Side {
    db: TestDb,
    store: Arc<dyn Store>,
}

impl Side {
    async fn new(db: TestDb) -> Self {
        let store = db.connect().await;
        Self { db, store }
    }
}

/// Empties a database between sequences: the deployment's counter is
/// shared by all tenants, so a sequence starts from nothing.
async fn reset(db: &TestDb) {
    use sqlx::Connection;
    const RESET: [&str; 7] = [
        "DELETE FROM run_steps",
        "DELETE FROM branch_runs",
        "DELETE FROM branch_calls",
        "DELETE FROM branches",
        "DELETE FROM sessions",
        "DELETE FROM tenant_usage",
        "UPDATE deployment_usage SET active_branches = 0",
    ];
    match db.backend {
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            for statement in RESET {
                sqlx::query(statement).execute(&mut c).await.unwrap();
            }
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            for statement in RESET {
                sqlx::query(statement).execute(&mut c).await.unwrap();
            }
        }
    }
}

/// What an operation answered, comparable across backends.
fn answer(result: &impl std::fmt::Debug) -> String {
    format!("{result:?}")
}

/// Runs a case's operations on one backend; returns every answer and the
/// state after each operation.
async fn play(side: &Side, case: &Case, number: u32) -> Vec<String> {
    reset(&side.db).await;
    let tenant = TenantId::parse(&format!("t{number}")).unwrap();
    let owners = [Subject::parse("alice").unwrap(), Subject::parse("bob").unwrap()];
    let sessions = [SessionId::parse("s0").unwrap(), SessionId::parse("s1").unwrap()];
    // Whole milliseconds: both backends keep them exactly.
    let mut at = DateTime::<Utc>::from_timestamp_millis(1_700_000_000_000).unwrap();
    let mut created: Vec<Branch> = Vec::new();
    let mut log = Vec::new();
    for (index, (after_ms, op)) in case.ops.iter().enumerate() {
        at += Duration::milliseconds(i64::from(*after_ms));
        let id_of = |pick: usize| created.get(pick % created.len().max(1)).map(|b| b.id);
        match op {
            Op::Create { session, owner, parent, budget, prompt, lessons, gateway, timeout_s } => {
                let parent = match parent {
                    Parent::Active => ParentChoice::Active,
                    Parent::Created(pick) => match id_of(*pick) {
                        Some(id) => ParentChoice::Explicit(id),
                        None => ParentChoice::Active,
                    },
                    Parent::Unknown => ParentChoice::Explicit(BranchId::from_uuid(Uuid::nil())),
                };
                let id = Uuid::from_u128((u128::from(number) << 64) | index as u128);
                // A request below the minimum is refused before the store.
                let budget = i64::try_from((*budget).max(case.policy.min_branch_budget)).unwrap();
                let new = NewBranch {
                    id: BranchId::from_uuid(id),
                    session_id: sessions[usize::from(*session)].clone(),
                    owner: owners[usize::from(*owner)].clone(),
                    parent,
                    description: format!("branch {index}"),
                    prompt: "prompt".into(),
                    budget: BudgetRequest::parse(Some(budget), &case.policy).unwrap(),
                    prompt_tokens: *prompt,
                    lessons_tokens: *lessons,
                    created_at: at,
                    deadline_at: at + Duration::seconds(*timeout_s),
                    rules: CreateRules {
                        budget: case.policy,
                        max_depth: case.max_depth,
                        limits: case.limits,
                    },
                    kind: if *gateway { BranchKind::Gateway } else { BranchKind::Agent },
                    return_tier: ReturnTier::default(),
                    run: gateway.then(|| NewRun {
                        model: "model".into(),
                        tools: vec!["files__read".into()],
                        scopes: vec!["fold:write".into()],
                        lease_owner: "replica".into(),
                        lease_until: at + Duration::seconds(30),
                        lessons: None,
                    }),
                };
                let result = side.store.create_branch(&tenant, new).await.unwrap();
                if let Ok(branch) = &result {
                    created.push(branch.clone());
                }
                log.push(answer(&result));
            }
            Op::EndTree { pick, status, result_tokens, extract, by } => {
                let Some(id) = id_of(*pick) else { continue };
                let (status, reason) = match status {
                    0 => (BranchStatus::Completed, None),
                    1 => (BranchStatus::Failed, Some(EndReason::ReportedFailure)),
                    2 => (BranchStatus::Timeout, Some(EndReason::DeadlineExceeded)),
                    _ => (BranchStatus::Failed, Some(EndReason::SessionEnded)),
                };
                let finish = Finish {
                    status,
                    reason,
                    result: Some(format!("result of {id}")),
                    result_tokens: *result_tokens,
                    returned_tokens: Some(*result_tokens),
                    extract: *extract,
                    at,
                    by: by.checked_sub(1).map(|owner| owners[usize::from(owner)].clone()),
                };
                let child_reason = match reason {
                    Some(EndReason::SessionEnded) => EndReason::SessionEnded,
                    _ => EndReason::ParentReturning,
                };
                let ended = side.store.end_tree(&tenant, id, finish, child_reason).await.unwrap();
                log.push(answer(&ended));
            }
            Op::Batch { picks, exhausted } => {
                let mut chosen: Vec<&Branch> = picks
                    .iter()
                    .filter_map(|pick| created.get(pick % created.len().max(1)))
                    .collect();
                // As the supervisor claims them: deepest first.
                chosen.sort_by_key(|b| (std::cmp::Reverse(b.depth), b.id));
                chosen.dedup_by_key(|b| b.id);
                let reason = if *exhausted {
                    EndReason::BudgetExhausted
                } else {
                    EndReason::DeadlineExceeded
                };
                let batch: Vec<BatchFinish> = chosen
                    .iter()
                    .map(|b| BatchFinish {
                        tenant: tenant.clone(),
                        id: b.id,
                        finish: Finish::forced(reason, at),
                    })
                    .collect();
                let ended = side.store.finish_batch(&batch).await.unwrap();
                log.push(answer(&ended));
            }
        }
        // The state the operation left.
        let mut state = Vec::new();
        for branch in &created {
            state.push(answer(&side.store.branch(&tenant, branch.id).await.unwrap()));
        }
        for session in &sessions {
            state.push(answer(&side.store.session(&tenant, session).await.unwrap()));
        }
        state.push(answer(&active_counters(&side.db, tenant.as_str()).await));
        log.push(state.join("\n"));
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_functions_follow_the_rust_rules() {
    let sqlite = Side::new(TestDb::sqlite().await).await;
    let postgres = Side::new(TestDb::postgres().await).await;
    let config = Config { cases: CASES, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let handle = tokio::runtime::Handle::current();
    let number = AtomicU32::new(0);
    let outcomes: Mutex<HashMap<String, usize>> = Mutex::default();
    let result = tokio::task::block_in_place(|| {
        runner.run(&case(), |case| {
            let number = number.fetch_add(1, Ordering::Relaxed) + 1;
            handle.block_on(async {
                let rust = play(&sqlite, &case, number).await;
                let functions = play(&postgres, &case, number).await;
                for line in rust.iter().step_by(2) {
                    let kind = line.split([' ', '{', ',']).next().unwrap_or_default().to_owned();
                    *outcomes.lock().unwrap().entry(kind).or_default() += 1;
                }
                for (step, (r, f)) in rust.iter().zip(&functions).enumerate() {
                    if r != f {
                        return Err(TestCaseError::fail(format!(
                            "step {step} differs:\nSQLite (Rust rules):\n{r}\nPostgres (functions):\n{f}"
                        )));
                    }
                }
                prop_assert_eq!(rust.len(), functions.len());
                Ok(())
            })
        })
    });
    for side in [sqlite, postgres] {
        side.store.close().await;
        side.db.cleanup().await;
    }
    if let Err(e) = result {
        panic!("{e}");
    }
    // The sequences reached refusals and ends, not only creates.
    eprintln!("answers by kind: {:?}", outcomes.lock().unwrap());
}
