//! The charging rule, as the store applies it to metered calls: for many
//! ledgers and calls, [`Store::meter_call`] grants, reports and writes what
//! [`Ledger::consume`] says, on each backend (Postgres in one statement,
//! SQLite in a transaction of several); and what a branch's calls add up to,
//! as [`Store::branch_report`] reads them with the branch.

use std::time::Duration;

use chrono::{DateTime, Utc};
use foldgate_domain::{
    BranchId, BranchKind, BudgetPolicy, BudgetRequest, Consumption, Ledger, Limits, ReturnTier,
    SessionId, Subject, TenantId, Tokens,
};
use foldgate_store::{CallOutcome, CallRecord, CreateRules, NewBranch, ParentChoice, Store};
use foldgate_testkit::{Backend, TestDb, on_both_backends};

use crate::Pool;
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};

/// Cases per backend: enough to reach the edges (nothing left, exactly
/// what is left, 80%, lent tokens) many times over, in a few seconds.
const CASES: u32 = 200;

/// A branch's ledger and state before a call, and the call.
#[derive(Debug, Clone)]
struct Case {
    budget: i64,
    used: i64,
    reserved: i64,
    /// The 80% warning was already recorded.
    warned: bool,
    /// Exhaustion was already recorded (the forced return has not run yet).
    exhausted: bool,
    /// The branch is still active; otherwise it has ended.
    active: bool,
    tokens_in: Tokens,
    tokens_out: Tokens,
    outcome: CallOutcome,
    /// When the call is made, after the session's last recorded activity.
    after: Duration,
}

fn outcome() -> impl Strategy<Value = CallOutcome> {
    prop_oneof![
        Just(CallOutcome::Ok),
        Just(CallOutcome::ToolError),
        Just(CallOutcome::UpstreamError),
        Just(CallOutcome::Truncated),
        Just(CallOutcome::Refused),
    ]
}

/// Tokens up to twice `budget`, often none and often exactly `exact`.
fn tokens(budget: i64, exact: i64) -> impl Strategy<Value = Tokens> {
    let budget = u64::try_from(budget).unwrap();
    let exact = u64::try_from(exact).unwrap();
    prop_oneof![Just(0), Just(exact), 0..=budget * 2]
}

fn case() -> impl Strategy<Value = Case> {
    // Small budgets put every edge within reach of a few tokens.
    prop_oneof![1..=12i64, 1..=50_000i64]
        .prop_flat_map(|budget| (Just(budget), 0..=budget))
        .prop_flat_map(|(budget, used)| (Just(budget), Just(used), 0..=budget - used))
        .prop_flat_map(|(budget, used, reserved)| {
            let remaining = budget - used - reserved;
            (
                (Just(budget), Just(used), Just(reserved)),
                (any::<bool>(), any::<bool>(), prop::bool::weighted(0.85)),
                (tokens(budget, 0), tokens(budget, remaining)),
                outcome(),
                0..3_000u64,
            )
        })
        .prop_map(
            |(
                (budget, used, reserved),
                (warned, exhausted, active),
                (tokens_in, tokens_out),
                outcome,
                after_ms,
            )| Case {
                budget,
                used,
                reserved,
                warned,
                exhausted,
                active,
                tokens_in,
                tokens_out,
                outcome,
                after: Duration::from_millis(after_ms),
            },
        )
}

/// One branch, charged case after case: each case first sets the
/// branch's row, its session's activity and its trace to the case's.
struct Fixture {
    db: TestDb,
    store: std::sync::Arc<dyn Store>,
    pool: Pool,
    tenant: TenantId,
    branch: BranchId,
    /// When the branch and its session were created.
    t0: DateTime<Utc>,
}

impl Fixture {
    async fn new(backend: Backend) -> Self {
        let db = TestDb::new(backend).await;
        let store = db.connect().await;
        let pool = match backend {
            Backend::Postgres => Pool::Postgres(sqlx::PgPool::connect(&db.url).await.unwrap()),
            Backend::Sqlite => Pool::Sqlite(sqlx::SqlitePool::connect(&db.url).await.unwrap()),
        };
        let tenant = TenantId::parse("acme").unwrap();
        let t0 = DateTime::<Utc>::from_timestamp_millis(1_700_000_000_000).unwrap();
        let policy = BudgetPolicy::default();
        let new = NewBranch {
            id: BranchId::generate(),
            session_id: SessionId::parse("charging").unwrap(),
            owner: Subject::parse("alice").unwrap(),
            parent: ParentChoice::Active,
            description: "charged".into(),
            prompt: "charged".into(),
            budget: BudgetRequest::parse(None, &policy).unwrap(),
            prompt_tokens: 0,
            lessons_tokens: 0,
            created_at: t0,
            deadline_at: t0 + chrono::Duration::hours(1),
            rules: CreateRules { budget: policy, max_depth: 4, limits: Limits::default() },
            kind: BranchKind::Agent,
            return_tier: ReturnTier::default(),
            run: None,
        };
        let branch = store.create_branch(&tenant, new).await.unwrap().unwrap().id;
        Self { db, store, pool, tenant, branch, t0 }
    }

    /// Puts the branch in the case's state; forgets its trace.
    async fn set_up(&self, case: &Case) {
        let id = self.branch.as_uuid();
        with_pool!(&self.pool, |p| {
            sqlx::query(
                "UPDATE branches SET budget = $1, used = $2, reserved = $3, \
                 status = CASE WHEN $4 THEN 'active' ELSE 'completed' END, \
                 completed_at = CASE WHEN $4 THEN NULL ELSE created_at END, \
                 warned_at = CASE WHEN $5 THEN created_at END, \
                 exhausted_at = CASE WHEN $6 THEN created_at END WHERE id = $7",
            )
            .bind(case.budget)
            .bind(case.used)
            .bind(case.reserved)
            .bind(case.active)
            .bind(case.warned)
            .bind(case.exhausted)
            .bind(id)
            .execute(p)
            .await
            .unwrap();
            sqlx::query("UPDATE sessions SET last_activity_at = created_at")
                .execute(p)
                .await
                .unwrap();
            sqlx::query("DELETE FROM branch_calls").execute(p).await.unwrap();
        });
    }

    /// The branch's ledger and its recorded warning and exhaustion.
    async fn branch_row(&self) -> (Ledger, Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
        let query = "SELECT budget, used, reserved, warned_at, exhausted_at FROM branches \
                     WHERE id = $1";
        type Row = (i64, i64, i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
        let (budget, used, reserved, warned_at, exhausted_at): Row = with_pool!(&self.pool, |p| {
            sqlx::query_as(query).bind(self.branch.as_uuid()).fetch_one(p).await.unwrap()
        });
        let n = |v: i64| Tokens::try_from(v).unwrap();
        let ledger = Ledger { budget: n(budget), used: n(used), reserved: n(reserved) };
        (ledger, warned_at, exhausted_at)
    }

    /// The trace: (charged, tokens in, tokens out, outcome, called at) of
    /// each line.
    async fn trace(&self) -> Vec<(i64, i64, i64, String, DateTime<Utc>)> {
        let query = "SELECT tokens_charged, tokens_in, tokens_out, outcome, called_at \
                     FROM branch_calls WHERE branch_id = $1";
        with_pool!(&self.pool, |p| {
            sqlx::query_as(query).bind(self.branch.as_uuid()).fetch_all(p).await.unwrap()
        })
    }

    async fn last_activity(&self) -> DateTime<Utc> {
        let session = SessionId::parse("charging").unwrap();
        self.store.session(&self.tenant, &session).await.unwrap().unwrap().last_activity_at
    }
}

/// Meters the case's call and checks it against the rule.
async fn check(fx: &Fixture, case: &Case) -> Result<(), TestCaseError> {
    fx.set_up(case).await;
    let at = fx.t0 + chrono::Duration::from_std(case.after).unwrap();
    let call = CallRecord {
        upstream: "files".into(),
        tool: "read".into(),
        tokens_in: case.tokens_in,
        tokens_out: case.tokens_out,
        duration: Duration::from_millis(7),
        outcome: case.outcome,
        at,
    };
    let n = |v: i64| Tokens::try_from(v).unwrap();
    let before = Ledger { budget: n(case.budget), used: n(case.used), reserved: n(case.reserved) };

    // The rule: an active branch is charged as `Ledger::consume` says; an
    // ended one is charged nothing.
    let expected: Option<Consumption> =
        case.active.then(|| before.consume(call.tokens(), case.warned));
    let got = fx.store.meter_call(&fx.tenant, fx.branch, &call).await.unwrap();
    prop_assert_eq!(got, expected, "what the store reports");

    // The ledger as the rule leaves it; the warning and exhaustion
    // recorded once, at the call, and only with a write (something granted
    // or run out).
    let (ledger, warned_at, exhausted_at) = fx.branch_row().await;
    let wrote = expected.filter(|c| c.granted > 0 || c.exhausted);
    prop_assert_eq!(ledger, expected.map_or(before, |c| c.ledger), "the ledger written");
    let recorded = |already: bool, now: bool| match (already, now) {
        (true, _) => Some(fx.t0),
        (false, true) => Some(at),
        (false, false) => None,
    };
    prop_assert_eq!(
        warned_at,
        recorded(case.warned, wrote.is_some_and(|c| c.warning)),
        "the warning recorded"
    );
    prop_assert_eq!(
        exhausted_at,
        recorded(case.exhausted, wrote.is_some_and(|c| c.exhausted)),
        "the exhaustion recorded"
    );

    // A charge is activity in the session, recorded to the resolution.
    let stale = at - chrono::Duration::from_std(foldgate_store::ACTIVITY_RESOLUTION).unwrap();
    let touched = case.active && fx.t0 < stale;
    prop_assert_eq!(fx.last_activity().await, if touched { at } else { fx.t0 }, "activity");

    // The trace line: the call as the agent received it, cut at the grant.
    let granted = expected.map_or(0, |c| c.granted);
    let (tokens_out, outcome) = call.received(granted);
    let line = (
        i64::try_from(granted).unwrap(),
        i64::try_from(call.tokens_in).unwrap(),
        i64::try_from(tokens_out).unwrap(),
        outcome.as_str().to_owned(),
        at,
    );
    prop_assert_eq!(fx.trace().await, vec![line], "the trace");
    Ok(())
}

async fn meter_call_follows_the_charging_rule(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let config = Config { cases: CASES, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::block_in_place(|| {
        runner.run(&case(), |case| handle.block_on(check(&fx, &case)))
    });
    fx.store.close().await;
    with_pool!(&fx.pool, |p| p.close().await);
    fx.db.cleanup().await;
    if let Err(e) = result {
        panic!("{backend:?}: {e}");
    }
}

/// `branch_report` reads in one statement what `branch` and `call_summary`
/// read in two, with calls and without, and nothing of another tenant.
async fn a_branch_report_is_the_branch_and_its_calls(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let (store, tenant, id) = (&fx.store, &fx.tenant, fx.branch);
    let report = store.branch_report(tenant, id).await.unwrap().expect("found");
    assert_eq!(report.0, store.branch(tenant, id).await.unwrap().unwrap());
    assert_eq!(report.1, foldgate_store::CallSummary::default(), "no calls yet");

    let calls = [
        ("files", "read", 10, 30, CallOutcome::Ok),
        ("files", "read", 5, 7, CallOutcome::ToolError),
        ("git", "log", 100, 200, CallOutcome::Truncated),
        ("files", "write", 1, 1, CallOutcome::Refused),
    ];
    for (i, (upstream, tool, tokens_in, tokens_out, outcome)) in calls.into_iter().enumerate() {
        let call = CallRecord {
            upstream: upstream.into(),
            tool: tool.into(),
            tokens_in,
            tokens_out,
            duration: Duration::from_millis(3),
            outcome,
            at: fx.t0 + chrono::Duration::seconds(i64::try_from(i).unwrap() + 1),
        };
        store.meter_call(tenant, id, &call).await.unwrap().expect("active");
    }
    let (branch, summary) = store.branch_report(tenant, id).await.unwrap().expect("found");
    assert_eq!(branch, store.branch(tenant, id).await.unwrap().unwrap());
    assert_eq!(summary, store.call_summary(tenant, id).await.unwrap());
    assert_eq!(summary.calls, 4);
    assert_eq!((summary.errors, summary.truncated), (2, 1));
    assert_eq!(summary.last_call_at, Some(fx.t0 + chrono::Duration::seconds(4)));
    let tools: Vec<_> =
        summary.by_tool.iter().map(|t| (t.upstream.as_str(), t.tool.as_str(), t.calls)).collect();
    assert_eq!(tools, [("git", "log", 1), ("files", "read", 2), ("files", "write", 1)]);

    let other = TenantId::parse("globex").unwrap();
    assert!(store.branch_report(&other, id).await.unwrap().is_none(), "another tenant's");
    assert!(store.branch_report(tenant, BranchId::generate()).await.unwrap().is_none());
    fx.store.close().await;
    with_pool!(&fx.pool, |p| p.close().await);
    fx.db.cleanup().await;
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    meter_call_follows_the_charging_rule,
    a_branch_report_is_the_branch_and_its_calls
);
