//! Upstream calls charged to branches and recorded in their traces.
use std::sync::Arc;
use std::time::Duration;

use foldgate_domain::{BranchStatus, EndReason};
use foldgate_engine::{CallOutcome, CallRecord};
use foldgate_testkit::{Backend, HeldWrite, on_both_backends};

use crate::{branch, create, create_under, env, ret, upstream_call};

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    metered_calls_are_charged_by_the_ledgers_rule,
    concurrent_metered_calls_never_overspend_and_are_all_recorded,
    a_metered_call_waits_for_a_concurrent_writer_and_charges_what_it_left,
);

/// A metered call is charged by the rule of every consumption
/// (`Ledger::consume`), whatever state the ledger is in, and lands in the
/// branch's trace with what it was charged.
async fn metered_calls_are_charged_by_the_ledgers_rule(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    // (spent before the call, lent to a child, the call's tokens), of a
    // budget of 1,000 (creation has spent a few on the prompt).
    let cases: &[(u64, u64, u64)] = &[
        (0, 0, 0),
        (0, 0, 1),
        (0, 0, 400),
        (0, 0, 5_000),
        (700, 0, 50),
        (700, 0, 150),
        (850, 0, 20),
        (850, 0, 5_000),
        (0, 600, 300),
        (0, 600, 5_000),
        (300, 600, 5_000),
        // Everything not lent is spent: nothing to grant, nothing exhausted.
        (5_000, 600, 50),
    ];
    for (i, &(spent, lent, tokens)) in cases.iter().enumerate() {
        let session = format!("rule-{i}");
        let b = create(s, &env.alice, &session, Some(1_000)).await;
        if lent > 0 {
            create_under(s, &env.alice, &session, b.id, i64::try_from(lent).unwrap()).await;
        }
        if spent > 0 {
            s.consume(&env.alice, b.id, spent).await.unwrap();
        }
        let before = branch(&env, b.id).await;
        let want = before.ledger.consume(tokens, before.warned_at.is_some());

        let call = upstream_call(&env, tokens);
        let metered = s.meter_call(&env.alice.tenant, b.id, &call).await.unwrap();
        let case = format!("case {i}: {:?}", cases[i]);
        assert_eq!(metered.consumption, Some(want), "{case}");
        assert_eq!(metered.forced_return, want.exhausted, "{case}");
        let after = branch(&env, b.id).await;
        assert_eq!(after.ledger, want.ledger, "{case}");
        assert_eq!(after.warned_at.is_some(), before.warned_at.is_some() || want.warning, "{case}");
        let status = if want.exhausted { BranchStatus::Timeout } else { BranchStatus::Active };
        assert_eq!(after.status, status, "{case}");
        let trace = s.call_summary(&env.alice, b.id).await.unwrap();
        assert_eq!((trace.calls, trace.tokens_charged), (1, want.granted), "{case}");
        // Recorded as received: a result the grant does not cover is cut.
        let (received, outcome) = call.received(want.granted);
        assert_eq!((trace.tokens_in, trace.tokens_out), (call.tokens_in, received), "{case}");
        assert_eq!(trace.truncated, u64::from(outcome == CallOutcome::Truncated), "{case}");
    }

    // Every outcome, cut short by a grant: a result is recorded cut, a call
    // without one as it was.
    let outcomes = [
        (CallOutcome::ToolError, 50, 600, CallOutcome::Truncated),
        (CallOutcome::Truncated, 50, 600, CallOutcome::Truncated),
        (CallOutcome::Refused, 200, 0, CallOutcome::Refused),
        (CallOutcome::UpstreamError, 200, 0, CallOutcome::UpstreamError),
    ];
    for (i, (outcome, tokens_in, tokens_out, recorded)) in outcomes.into_iter().enumerate() {
        let b = create(s, &env.alice, &format!("outcome-{i}"), Some(1_000)).await;
        s.consume(&env.alice, b.id, 850).await.unwrap();
        let call = CallRecord { tokens_in, tokens_out, outcome, ..upstream_call(&env, 0) };
        let granted = s.meter_call(&env.alice.tenant, b.id, &call).await.unwrap();
        let granted = granted.consumption.unwrap().granted;
        assert!(granted < call.tokens(), "{outcome:?}");
        let trace = s.call_summary(&env.alice, b.id).await.unwrap();
        let cut = recorded == CallOutcome::Truncated;
        let want_out = if cut { granted - tokens_in } else { tokens_out };
        assert!(!cut || want_out > 0, "a result cut short, not to nothing");
        assert_eq!((trace.tokens_in, trace.tokens_out), (tokens_in, want_out), "{outcome:?}");
        assert_eq!(trace.truncated, u64::from(cut), "{outcome:?}");
        assert_eq!(trace.errors, u64::from(!cut), "{outcome:?}");
    }

    // A call that finishes after its branch ended is recorded, charged
    // nothing, and received as nothing.
    let b = create(s, &env.alice, "ended", Some(1_000)).await;
    let ended = s.return_branch(&env.alice, ret(b.id, "done")).await.unwrap().branch;
    let call = upstream_call(&env, 80);
    let metered = s.meter_call(&env.alice.tenant, b.id, &call).await.unwrap();
    assert_eq!((metered.consumption, metered.forced_return), (None, false));
    let trace = s.call_summary(&env.alice, b.id).await.unwrap();
    assert_eq!((trace.calls, trace.tokens_in, trace.tokens_out), (1, call.tokens_in, 0));
    assert_eq!((trace.tokens_charged, trace.truncated), (0, 1));
    assert_eq!(branch(&env, b.id).await.ledger, ended.ledger, "the ended branch is unchanged");
    env.db.cleanup().await;
}

async fn concurrent_metered_calls_never_overspend_and_are_all_recorded(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", Some(2_000)).await;
    let start = b.ledger.used;
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let (s, tenant, call) =
                (Arc::clone(s), env.alice.tenant.clone(), upstream_call(&env, 100));
            tokio::spawn(async move { s.meter_call(&tenant, b.id, &call).await })
        })
        .collect();
    let (mut granted, mut forced, mut too_late) = (0, 0, 0);
    for t in tasks {
        let metered = t.await.unwrap().unwrap();
        match metered.consumption {
            Some(c) => granted += c.granted,
            None => too_late += 1,
        }
        forced += usize::from(metered.forced_return);
    }
    let end = branch(&env, b.id).await;
    assert_eq!(granted, 2_000 - start, "exactly the budget was granted");
    assert_eq!(end.ledger.used, 2_000, "and recorded");
    assert_eq!(forced, 1, "one forced return");
    assert_eq!((end.status, end.reason), (BranchStatus::Timeout, Some(EndReason::BudgetExhausted)));
    let trace = s.call_summary(&env.alice, b.id).await.unwrap();
    assert_eq!(trace.calls, 40, "every call is in the trace ({too_late} after the end)");
    assert_eq!(trace.tokens_charged, granted);
    env.db.cleanup().await;
}

/// A call charged while another writer holds its branch waits for that
/// writer and is charged against the branch as the writer left it.
async fn a_metered_call_waits_for_a_concurrent_writer_and_charges_what_it_left(backend: Backend) {
    let env = env(backend).await;
    let s = &env.service;
    let b = create(s, &env.alice, "s", Some(1_000)).await;
    let held = HeldWrite::spend(&env.db, b.id.as_uuid(), 500).await;

    let call = upstream_call(&env, 600);
    let charging = {
        let (s, tenant) = (Arc::clone(s), env.alice.tenant.clone());
        tokio::spawn(async move { s.meter_call(&tenant, b.id, &call).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!charging.is_finished(), "the charge waits for the other writer");
    held.commit().await;

    let metered = charging.await.unwrap().unwrap();
    let left_by_the_writer = foldgate_domain::Ledger { used: b.ledger.used + 500, ..b.ledger };
    let want = left_by_the_writer.consume(600, false);
    assert!(want.exhausted && want.granted == 500 - b.ledger.used, "{want:?}");
    assert_eq!(metered.consumption, Some(want));
    assert!(metered.forced_return);
    let end = branch(&env, b.id).await;
    assert_eq!(end.ledger.used, 1_000, "the writer's 500 and the call's rest");
    assert_eq!(end.status, BranchStatus::Timeout);
    env.db.cleanup().await;
}
