//! Replaying runs and reading tool results.

use foldgate_domain::{BranchKind, Ledger, SessionId, Subject};

use super::*;

fn branch(tier: ReturnTier) -> Branch {
    Branch {
        id: BranchId::generate(),
        tenant: TenantId::parse("acme").unwrap(),
        session_id: SessionId::parse("s").unwrap(),
        owner: Subject::parse("u").unwrap(),
        parent: None,
        depth: 1,
        description: "find the flush handler".into(),
        prompt: "look in src/".into(),
        ledger: Ledger::new(1_000),
        status: BranchStatus::Active,
        reason: None,
        created_at: DateTime::<Utc>::UNIX_EPOCH,
        deadline_at: DateTime::<Utc>::UNIX_EPOCH,
        completed_at: None,
        warned_at: None,
        result: None,
        kind: BranchKind::Gateway,
        return_tier: tier,
        returned_tokens: None,
    }
}

fn step(seq: u32, kind: StepKind, body: Value) -> RunStep {
    RunStep {
        seq,
        kind,
        body: body.to_string(),
        input_tokens: 0,
        output_tokens: 0,
        duration: Duration::ZERO,
        repeated: false,
        at: DateTime::<Utc>::UNIX_EPOCH,
    }
}

#[test]
fn a_run_is_replayed_from_its_steps() {
    let b = branch(ReturnTier::Phase);
    let calls = json!([{"id": "c1", "name": "files__read", "arguments": {"path": "a"}},
                       {"id": "c2", "name": "files__read", "arguments": {"path": "b"}}]);
    let steps = [
        step(0, StepKind::Model, json!({"text": "reading", "calls": calls})),
        step(
            1,
            StepKind::Tool,
            json!({"call_id": "c1", "name": "files__read", "content": "A", "error": false}),
        ),
    ];
    let talk = Conversation::replay(&b, &steps);
    assert_eq!(talk.seq, 2);
    assert_eq!(talk.turns.len(), 3, "task, answer, one result");
    assert!(
        matches!(&talk.turns[0], Turn::User(t) if t.contains("find the flush handler") && t.contains("src/"))
    );
    assert_eq!(talk.pending.len(), 1, "the second call was in flight");
    assert_eq!(talk.pending[0].id, "c2");
    assert_eq!(talk.last_text, "reading");
    assert!(talk.final_text.is_none());

    // A final answer, then another model call: the shortening was asked.
    let steps = [
        step(0, StepKind::Model, json!({"text": "long finding", "calls": []})),
        step(1, StepKind::Model, json!({"text": "short", "calls": []})),
    ];
    let talk = Conversation::replay(&b, &steps);
    assert!(talk.compress_asked);
    assert_eq!(talk.final_text.as_deref(), Some("short"));
    assert!(matches!(&talk.turns[2], Turn::User(t) if t.contains("300 tokens")));
}

#[test]
fn tool_results_read_as_a_model_reads_them() {
    assert_eq!(
        result_text(
            &json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
        ),
        "a\nb"
    );
    assert_eq!(result_text(&json!({"content": [], "structuredContent": {"x": 1}})), "{\"x\":1}");
    let image = json!({"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]});
    assert!(result_text(&image).contains("image/png"));
}
