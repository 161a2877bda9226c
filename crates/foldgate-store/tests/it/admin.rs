//! The admin reads and the audit log, on each backend: tenants at a glance
//! with their tokens since an instant, a tenant's sessions page by page, a
//! session's tree with each branch's calls, a branch's own calls and its
//! run's steps page by page, and audit entries newest first.

use std::time::Duration;

use chrono::{DateTime, Utc};
use foldgate_domain::{
    BranchId, BranchKind, BudgetPolicy, BudgetRequest, Limits, Principal, ReturnTier, SessionId,
    Subject, TenantId, TenantSettings,
};
use foldgate_store::{
    AuditEntry, AuditPage, CallOutcome, CallRecord, CreateRules, NewBranch, NewRun, NewStep,
    ParentChoice, RunState, SessionPage, StepKind, StepWritten, Store, TracePage, UsageKind,
    UsageLine,
};
use foldgate_testkit::{Backend, TestDb, on_both_backends};
use serde_json::json;
use uuid::Uuid;

use crate::Pool;

fn t0() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_700_000_000_000).unwrap()
}

fn at(seconds: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::seconds(seconds)
}

/// Creates a branch of 2,000 tokens in `session` of `tenant` at
/// `at(seconds)`, under the session's active branch.
async fn branch(store: &dyn Store, tenant: &str, session: &str, seconds: i64) -> BranchId {
    create(store, tenant, session, seconds, false).await
}

/// The same, or run by the gateway (`gateway`): on the model `model`, its
/// run held by the replica `replica`.
async fn create(
    store: &dyn Store,
    tenant: &str,
    session: &str,
    seconds: i64,
    gateway: bool,
) -> BranchId {
    let policy = BudgetPolicy::default();
    let new = NewBranch {
        id: BranchId::generate(),
        session_id: SessionId::parse(session).unwrap(),
        owner: Subject::parse("alice").unwrap(),
        parent: ParentChoice::Active,
        description: format!("{session} at {seconds}"),
        prompt: "p".into(),
        budget: BudgetRequest::parse(Some(2_000), &policy).unwrap(),
        prompt_tokens: 0,
        lessons_tokens: 0,
        created_at: at(seconds),
        deadline_at: at(seconds) + chrono::Duration::hours(1),
        rules: CreateRules { budget: policy, max_depth: 4, limits: Limits::default() },
        kind: if gateway { BranchKind::Gateway } else { BranchKind::Agent },
        return_tier: ReturnTier::default(),
        run: gateway.then(|| NewRun {
            model: "model".into(),
            tools: vec!["files__read".into()],
            scopes: vec!["fold:write".into()],
            lease_owner: "replica".into(),
            lease_until: at(seconds) + chrono::Duration::minutes(5),
            lessons: None,
        }),
    };
    store.create_branch(&TenantId::parse(tenant).unwrap(), new).await.unwrap().unwrap().id
}

async fn call(store: &dyn Store, tenant: &str, id: BranchId, tokens: (u64, u64), seconds: i64) {
    call_of(store, tenant, id, "read", tokens, seconds, CallOutcome::Ok).await;
}

async fn call_of(
    store: &dyn Store,
    tenant: &str,
    id: BranchId,
    tool: &str,
    tokens: (u64, u64),
    seconds: i64,
    outcome: CallOutcome,
) {
    let call = CallRecord {
        upstream: "files".into(),
        tool: tool.into(),
        tokens_in: tokens.0,
        tokens_out: tokens.1,
        duration: Duration::from_millis(2),
        outcome,
        at: at(seconds),
    };
    store.meter_call(&TenantId::parse(tenant).unwrap(), id, &call).await.unwrap().unwrap();
}

async fn admin_reads_see_one_tenant_at_a_time(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let acme = TenantId::parse("acme").unwrap();
    let root = branch(&*store, "acme", "s1", 0).await;
    let child = branch(&*store, "acme", "s1", 1).await;
    let s2 = branch(&*store, "acme", "s2", 2).await;
    branch(&*store, "acme", "s3", 3).await;
    let other = branch(&*store, "globex", "g1", 4).await;
    call(&*store, "acme", child, (10, 20), 5).await;
    call(&*store, "acme", s2, (100, 200), 100).await;
    call(&*store, "globex", other, (1, 1), 100).await;

    // Tokens today are the day's usage as written, returns left out.
    let today = at(0).date_naive();
    let yesterday = today.pred_opt().unwrap();
    let day = |d: chrono::NaiveDate| d.to_string();
    store
        .add_usage(&[
            line("acme", &day(today), UsageKind::BranchCall, "files", (100, 200)),
            line("acme", &day(today), UsageKind::Return, "", (5000, 50)),
            line("acme", &day(yesterday), UsageKind::OutsideCall, "files", (30, 0)),
            line("globex", &day(today), UsageKind::Model, "gpt", (1, 1)),
        ])
        .await
        .unwrap();
    let tenants = store.tenants(None, today).await.unwrap();
    let seen: Vec<_> = tenants
        .iter()
        .map(|t| (t.tenant.as_str(), t.open_sessions, t.active_branches, t.tokens_today))
        .collect();
    assert_eq!(seen, [("acme", 3, 4, 300), ("globex", 1, 1, 2)]);
    let early = store.tenants(Some(&acme), yesterday).await.unwrap();
    assert_eq!(early.len(), 1, "only the tenant asked for");
    assert_eq!(early[0].tokens_today, 30);

    // Newest first, two at a time, each page after the last one's cursor.
    let first = SessionPage { open_only: true, limit: 2, after: None };
    let page = store.sessions(&acme, &first).await.unwrap();
    let ids: Vec<_> = page.iter().map(|l| l.session.id.as_str().to_owned()).collect();
    assert_eq!(ids, ["s3", "s2"]);
    let last = &page[1].session;
    let second = SessionPage { after: Some((last.created_at, last.id.clone())), ..first };
    let page = store.sessions(&acme, &second).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].session.id.as_str(), "s1");
    assert_eq!((page[0].branches, page[0].active_branches), (2, 2));

    let s1 = SessionId::parse("s1").unwrap();
    let (session, tree) = store.session_tree(&acme, &s1).await.unwrap().expect("found");
    assert_eq!(session.id, s1);
    let rows: Vec<_> = tree.iter().map(|t| (t.branch.id, t.branch.parent, t.calls)).collect();
    assert_eq!(rows, [(root, None, 0), (child, Some(root), 1)]);
    assert_eq!(tree[1].call_tokens, 30, "tokens charged");
    assert!(tree.iter().all(|t| t.model.is_none()), "agent-run branches have no model bill");

    let globex = TenantId::parse("globex").unwrap();
    assert!(store.session_tree(&globex, &s1).await.unwrap().is_none(), "another tenant's");
    assert!(
        store.sessions(&globex, &first).await.unwrap().iter().all(|l| l.session.tenant == globex)
    );
    store.close().await;
    db.cleanup().await;
}

async fn a_branch_trace_pages_its_calls_and_steps(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let acme = TenantId::parse("acme").unwrap();
    let globex = TenantId::parse("globex").unwrap();
    let root = branch(&*store, "acme", "s1", 0).await;
    // Five calls, two of them at the same instant; then a child (which
    // takes what the root has left) with a call of its own.
    let calls = [
        ("read", (10, 20), 2, CallOutcome::Ok),
        ("grep", (5, 0), 3, CallOutcome::Refused),
        ("read", (1, 2), 4, CallOutcome::ToolError),
        ("list", (3, 4), 4, CallOutcome::Ok),
        ("read", (7, 8), 5, CallOutcome::UpstreamError),
    ];
    for (tool, tokens, seconds, outcome) in calls {
        call_of(&*store, "acme", root, tool, tokens, seconds, outcome).await;
    }
    let child = branch(&*store, "acme", "s1", 1).await;
    call(&*store, "acme", child, (100, 100), 6).await;

    let all = TracePage { calls: 10, steps: 10, ..TracePage::default() };
    let trace = store.branch_trace(&acme, root, &all).await.unwrap().expect("found");
    assert_eq!(trace.branch.branch.id, root);
    assert_eq!((trace.branch.calls, trace.branch.call_tokens), (5, 60));
    let kids: Vec<_> = trace.children.iter().map(|c| (c.branch.id, c.calls)).collect();
    assert_eq!(kids, [(child, 1)], "its child, with its own calls added up");
    assert!(trace.run.is_none() && trace.steps.is_empty(), "an agent-run branch has no run");
    let seen: Vec<_> = trace
        .calls
        .iter()
        .map(|c| (c.tool.as_str(), c.tokens_in, c.tokens_out, c.tokens_charged, c.outcome))
        .collect();
    assert_eq!(seen[0], ("read", 7, 8, 15, CallOutcome::UpstreamError), "newest first");
    assert_eq!(seen[4], ("read", 10, 20, 30, CallOutcome::Ok));
    assert_eq!(seen[3], ("grep", 5, 0, 5, CallOutcome::Refused));
    assert!(trace.calls.iter().all(|c| c.upstream == "files" && c.duration.as_millis() == 2));
    assert_eq!(trace.calls[0].called_at, at(5));

    // Two at a time, each page after the last one's time and id; the two
    // calls of one instant are split between pages without being lost.
    let mut paged = Vec::new();
    let mut page = TracePage { calls: 2, steps: 0, ..TracePage::default() };
    loop {
        let got = store.branch_trace(&acme, root, &page).await.unwrap().unwrap().calls;
        assert!(got.len() <= 2);
        let Some(last) = got.last() else { break };
        page.calls_before = Some((last.called_at, last.id));
        paged.extend(got.iter().map(|c| c.id));
    }
    let ids: Vec<_> = trace.calls.iter().map(|c| c.id).collect();
    assert_eq!(paged, ids, "the pages add up to the whole trace, in order");
    let none = TracePage { calls: 0, steps: 0, ..TracePage::default() };
    assert!(store.branch_trace(&acme, root, &none).await.unwrap().unwrap().calls.is_empty());

    // A gateway-run branch: its run and its steps, newest first.
    let run = create(&*store, "acme", "s2", 10, true).await;
    let steps = [
        (
            StepKind::Model,
            r#"{"text":"reading","calls":[{"id":"c1","name":"files__read","arguments":{"path":"a"}}]}"#,
            (400, 40),
        ),
        (
            StepKind::Tool,
            r#"{"call_id":"c1","name":"files__read","content":"fn a() {}","error":false}"#,
            (0, 0),
        ),
        (StepKind::Model, r#"{"text":"It is in a.","calls":[]}"#, (500, 10)),
    ];
    for (seq, (kind, body, tokens)) in (0..).zip(steps) {
        let step = NewStep {
            seq,
            kind,
            body: body.into(),
            input_tokens: tokens.0,
            output_tokens: tokens.1,
            context_tokens: None,
            duration: Duration::from_millis(u64::from(seq) + 5),
            repeated: seq == 2,
            at: at(11 + i64::from(seq)),
        };
        let written = store.record_step(&acme, run, "replica", &step).await.unwrap();
        assert!(matches!(written, StepWritten::Written(_)), "{written:?}");
    }
    call(&*store, "acme", run, (3, 30), 12).await;
    let trace = store.branch_trace(&acme, run, &all).await.unwrap().expect("found");
    let bill = trace.branch.model.clone().expect("a model bill");
    assert_eq!((bill.0.as_str(), bill.1.calls, bill.1.input_tokens), ("model", 2, 900));
    let stored = trace.run.expect("its run");
    assert_eq!((stored.state, stored.steps, stored.resumes), (RunState::Running, 3, 0));
    assert_eq!((stored.usage.input_tokens, stored.usage.output_tokens), (900, 50));
    let seqs: Vec<_> = trace.steps.iter().map(|s| (s.seq, s.kind, s.repeated)).collect();
    assert_eq!(
        seqs,
        [(2, StepKind::Model, true), (1, StepKind::Tool, false), (0, StepKind::Model, false)]
    );
    assert_eq!(trace.steps[1].body, steps[1].1, "the body as written");
    assert_eq!(trace.steps[2].duration, Duration::from_millis(5));
    assert_eq!(trace.steps[0].at, at(13));
    assert_eq!(trace.calls.len(), 1, "the run's upstream calls are the branch's");
    let page = TracePage { steps: 2, steps_before: Some(1), ..all };
    let older = store.branch_trace(&acme, run, &page).await.unwrap().unwrap().steps;
    assert_eq!(older.iter().map(|s| s.seq).collect::<Vec<_>>(), [0]);

    // Another tenant's branch, and one that does not exist, are not found.
    assert!(store.branch_trace(&globex, root, &all).await.unwrap().is_none());
    assert!(store.branch_trace(&globex, run, &all).await.unwrap().is_none());
    assert!(store.branch_trace(&acme, BranchId::generate(), &all).await.unwrap().is_none());
    store.close().await;
    db.cleanup().await;
}

async fn the_audit_log_reads_newest_first(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let actor = Principal::new(TenantId::parse("ops").unwrap(), Subject::parse("root").unwrap());
    let mut written = Vec::new();
    for (i, tenant) in ["acme", "globex", "acme"].into_iter().enumerate() {
        let entry = AuditEntry {
            id: Uuid::now_v7(),
            at: at(i64::try_from(i).unwrap()),
            actor: actor.clone(),
            tenant: Some(TenantId::parse(tenant).unwrap()),
            action: "branch.end".into(),
            target: format!("target {i}"),
            detail: json!({"n": i}),
        };
        store.record_audit(&entry).await.unwrap();
        written.push(entry);
    }
    let all = store.audit(&AuditPage { tenant: None, limit: 10, before: None }).await.unwrap();
    let newest_first: Vec<_> = written.iter().rev().cloned().collect();
    assert_eq!(all, newest_first, "read back as written, newest first");

    let acme = Some(TenantId::parse("acme").unwrap());
    let page = AuditPage { tenant: acme, limit: 1, before: None };
    let first = store.audit(&page).await.unwrap();
    assert_eq!(first, [written[2].clone()]);
    let next = AuditPage { before: Some(first[0].id), ..page };
    assert_eq!(store.audit(&next).await.unwrap(), [written[0].clone()]);
    let after_last = AuditPage { before: Some(written[0].id), ..next };
    assert!(store.audit(&after_last).await.unwrap().is_empty());
    store.close().await;
    db.cleanup().await;
}

fn line(tenant: &str, day: &str, kind: UsageKind, name: &str, tokens: (u64, u64)) -> UsageLine {
    UsageLine {
        tenant: TenantId::parse(tenant).unwrap(),
        day: day.parse().unwrap(),
        kind,
        name: name.into(),
        calls: 1,
        tokens_in: tokens.0,
        tokens_out: tokens.1,
    }
}

async fn settings_and_usage_add_up_per_tenant_and_day(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let acme = TenantId::parse("acme").unwrap();
    let actor = Principal::new(TenantId::parse("ops").unwrap(), Subject::parse("root").unwrap());
    let settings = TenantSettings { tokens_per_day: Some(100), ..TenantSettings::default() };
    let entry = AuditEntry {
        id: Uuid::now_v7(),
        at: t0(),
        actor: actor.clone(),
        tenant: Some(acme.clone()),
        action: "limits.update".into(),
        target: "acme".into(),
        detail: json!({"tokens_per_day": 100}),
    };
    store.put_tenant_settings(&acme, &settings, &entry).await.unwrap();
    let stored = store.tenant_settings(&acme).await.unwrap().expect("stored");
    assert_eq!((stored.settings.clone(), stored.updated_by.clone()), (settings.clone(), actor));
    assert_eq!(store.all_tenant_settings().await.unwrap(), [(acme.clone(), settings)]);
    let audit = store.audit(&AuditPage { tenant: None, limit: 5, before: None }).await.unwrap();
    assert_eq!(audit, [entry], "written with the change");

    // Lines for the same key add up, whichever replica wrote them.
    let writes = [
        vec![
            line("acme", "2026-11-01", UsageKind::BranchCall, "files", (10, 20)),
            line("acme", "2026-11-25", UsageKind::OutsideCall, "files", (1, 2)),
            line("acme", "2026-11-25", UsageKind::Return, "", (500, 40)),
            line("globex", "2026-11-25", UsageKind::Model, "gpt", (7, 7)),
        ],
        vec![
            line("acme", "2026-11-25", UsageKind::OutsideCall, "files", (3, 4)),
            line("acme", "2026-10-31", UsageKind::Model, "gpt", (1000, 1000)),
        ],
    ];
    for lines in &writes {
        store.add_usage(lines).await.unwrap();
    }
    let today: chrono::NaiveDate = "2026-11-25".parse().unwrap();
    let month: chrono::NaiveDate = "2026-11-01".parse().unwrap();
    let got = store.usage(&acme, month, today).await.unwrap();
    let outside = got.iter().find(|l| l.kind == UsageKind::OutsideCall).unwrap();
    assert_eq!((outside.calls, outside.tokens_in, outside.tokens_out), (2, 4, 6));
    assert_eq!(got.len(), 3, "October's line is outside the span: {got:?}");
    // Spending leaves returns out, and tenants without settings.
    let spend = store.spending(today, month).await.unwrap();
    assert_eq!(spend.len(), 1, "{spend:?}");
    assert_eq!((spend[0].today, spend[0].this_month), (10, 40));
    store.close().await;
    db.cleanup().await;
}

/// Runs `query` with `$1` the instant `at(seconds)`, as the store writes
/// instants (SQLite: fixed-width text in UTC), and `$2` `text`.
async fn run_at(pool: &Pool, query: &str, seconds: i64, text: Option<&str>) {
    let instant = at(seconds);
    match pool {
        Pool::Postgres(p) => {
            sqlx::query(sqlx::AssertSqlSafe(query.to_owned()))
                .bind(instant)
                .bind(text)
                .execute(p)
                .await
                .unwrap();
        }
        Pool::Sqlite(p) => {
            let stamp = instant.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            sqlx::query(sqlx::AssertSqlSafe(query.to_owned()))
                .bind(stamp)
                .bind(text)
                .execute(p)
                .await
                .unwrap();
        }
    }
}

/// Ends `id` at `at(seconds)` directly: what retention sees of an old tree.
async fn end_at(pool: &Pool, id: BranchId, seconds: i64, extract: Option<&str>) {
    let query = format!(
        "UPDATE branches SET status = 'completed', completed_at = $1, extract = $2 \
         WHERE id = {}",
        match pool {
            Pool::Postgres(_) => format!("'{}'", id.as_uuid()),
            Pool::Sqlite(_) => format!("X'{}'", id.as_uuid().simple()),
        }
    );
    run_at(pool, &query, seconds, extract).await;
}

async fn retention_deletes_whole_old_trees_in_batches(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let pool = Pool::connect(&db).await;
    let acme = TenantId::parse("acme").unwrap();
    let old_root = branch(&*store, "acme", "old", 0).await;
    let old_child = branch(&*store, "acme", "old", 1).await;
    call(&*store, "acme", old_child, (5, 5), 2).await;
    let older_root = branch(&*store, "acme", "older", 0).await;
    let pending = branch(&*store, "acme", "pending", 0).await;
    let recent = branch(&*store, "acme", "recent", 0).await;
    let active = branch(&*store, "acme", "active", 0).await;
    end_at(&pool, old_child, 3600, None).await;
    end_at(&pool, old_root, 3600, None).await;
    end_at(&pool, older_root, 1800, None).await;
    end_at(&pool, pending, 3600, Some("pending")).await;
    end_at(&pool, recent, 10 * 86_400, None).await;
    let cutoff = at(2 * 86_400);

    // Oldest first, one tree a batch, with its descendants and calls.
    let first = store.prune_trees(cutoff, 1).await.unwrap();
    assert_eq!((first.trees, first.branches, first.calls), (1, 1, 0), "the older tree");
    assert!(store.branch(&acme, older_root).await.unwrap().is_none());
    let second = store.prune_trees(cutoff, 1).await.unwrap();
    assert_eq!((second.branches, second.calls), (2, 1), "the old tree, child and call");
    assert!(store.branch(&acme, old_child).await.unwrap().is_none());
    let none = store.prune_trees(cutoff, 10).await.unwrap();
    assert_eq!(none.branches, 0, "a queued lesson, a recent tree and an active one stay");
    for kept in [pending, recent, active] {
        assert!(store.branch(&acme, kept).await.unwrap().is_some());
    }

    // The tools sessions called: the owner's open sessions' are read, the
    // first used first, each once, at most as many as asked.
    let alice = Subject::parse("alice").unwrap();
    let tools = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    let session = |s: &str| SessionId::parse(s).unwrap();
    store.add_session_tools(&acme, &session("old"), &tools(&["files__read"]), at(0)).await.unwrap();
    store
        .add_session_tools(&acme, &session("recent"), &tools(&["git__log", "files__read"]), at(60))
        .await
        .unwrap();
    // Again: the first use stays.
    store
        .add_session_tools(&acme, &session("old"), &tools(&["files__read"]), at(90))
        .await
        .unwrap();
    let read = store.session_tools_of(&acme, &alice, 10).await.unwrap();
    assert_eq!(read, ["files__read", "git__log"]);
    assert_eq!(store.session_tools_of(&acme, &alice, 1).await.unwrap(), ["files__read"]);
    let bob = Subject::parse("bob").unwrap();
    assert!(store.session_tools_of(&acme, &bob, 10).await.unwrap().is_empty(), "alice's own");
    let globex = TenantId::parse("globex").unwrap();
    assert!(store.session_tools_of(&globex, &alice, 10).await.unwrap().is_empty());

    // A session goes once it ended and has no branch left, with its tools.
    let end_session = "UPDATE sessions SET status = 'ended', ended_at = $1 WHERE session_id = $2";
    for session in ["old", "older", "recent"] {
        run_at(&pool, end_session, 3600, Some(session)).await;
    }
    assert!(store.session_tools_of(&acme, &alice, 10).await.unwrap().is_empty(), "ended");
    assert_eq!(store.prune_sessions(cutoff, 10).await.unwrap(), 2, "old and older");
    let left: Vec<String> = with_pool!(&pool, |p| sqlx::query_scalar(
        "SELECT session_id FROM session_tools ORDER BY session_id, tool"
    )
    .fetch_all(p)
    .await
    .unwrap());
    assert_eq!(left, ["recent", "recent"], "the kept session's tools stay");
    let recent_session = SessionId::parse("recent").unwrap();
    assert!(store.session(&acme, &recent_session).await.unwrap().is_some(), "it has a branch");

    // Audit entries and daily usage by age.
    let actor = Principal::new(acme.clone(), Subject::parse("root").unwrap());
    for seconds in [0, 10 * 86_400] {
        let entry = AuditEntry {
            id: Uuid::now_v7(),
            at: at(seconds),
            actor: actor.clone(),
            tenant: None,
            action: "session.end".into(),
            target: "x".into(),
            detail: json!({}),
        };
        store.record_audit(&entry).await.unwrap();
    }
    assert_eq!(store.prune_audit(cutoff, 10).await.unwrap(), 1);
    let day = |seconds: i64| at(seconds).date_naive().to_string();
    let lines = [
        line("acme", &day(0), UsageKind::BranchCall, "files", (1, 1)),
        line("acme", &day(10 * 86_400), UsageKind::BranchCall, "files", (1, 1)),
    ];
    store.add_usage(&lines).await.unwrap();
    assert_eq!(store.prune_usage(cutoff.date_naive(), 10).await.unwrap(), 1);
    store.close().await;
    with_pool!(&pool, |p| p.close().await);
    db.cleanup().await;
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    retention_deletes_whole_old_trees_in_batches,
    admin_reads_see_one_tenant_at_a_time,
    a_branch_trace_pages_its_calls_and_steps,
    the_audit_log_reads_newest_first,
    settings_and_usage_add_up_per_tenant_and_day
);
