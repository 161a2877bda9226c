//! The folding engine against real databases, in one binary: the tests
//! that run on Postgres and on SQLite run on both, each with a fresh
//! database.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod budget;
mod deadlines;
mod extract;
mod isolation;
mod limits;
mod metering;
mod metrics;
mod runs;
mod sessions;
mod tree;
use std::sync::Arc;
use std::time::Duration;

use foldgate_domain::{BranchId, Limits, Message, Outcome, Principal, SessionId};
use foldgate_engine::{
    CallOutcome, CallRecord, Clock, CreateBranch, FoldingConfig, FoldingService, ManualClock,
    ReturnBranch, StatusQuery,
};
use foldgate_testkit::{Backend, ServiceBuilder, TestDb, principal};

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
        extract_memory: false,
    }
}

async fn branch(env: &Env, id: BranchId) -> foldgate_domain::Branch {
    env.service.status(&env.alice, StatusQuery::Branch(id)).await.unwrap().unwrap()
}

async fn session_pool(env: &Env, session: &str) -> foldgate_domain::Ledger {
    let id = SessionId::parse(session).unwrap();
    env.service.store().session(&env.alice.tenant, &id).await.unwrap().unwrap().ledger
}

fn roomy(limits: Limits) -> FoldingConfig {
    FoldingConfig { max_depth: 1_000, limits, ..FoldingConfig::default() }
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
