//! A body posted to `/mcp`, as the exchange layer reads it and the MCP guard
//! checks it, from a caller holding every scope.
//!
//! Invariants:
//! - a refusal is a 400 carrying a JSON-RPC error (parse error, invalid
//!   request or invalid params) or a 403; nothing else;
//! - arguments the guard lets through satisfy the tool's published
//!   `inputSchema` (the limits its documentation states), and what they
//!   parse to stays within the configured budget and timeout caps;
//! - arguments that satisfy the published schema are refused only for a
//!   rule the schema cannot state (the form of a branch id, text that is
//!   empty once control characters are stripped).
#![no_main]

use std::sync::LazyLock;

use foldgate_api::{
    args::{FoldingTool, Parsed, input_schema},
    fuzzing::{Guard, Verdict},
};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

static GUARD: LazyLock<Guard> = LazyLock::new(Guard::default);

static SCHEMAS: LazyLock<Vec<(FoldingTool, jsonschema::Validator)>> = LazyLock::new(|| {
    FoldingTool::ALL
        .into_iter()
        .map(|tool| {
            let schema = Value::Object(input_schema(tool));
            let validator =
                jsonschema::validator_for(&schema).expect("a published schema compiles");
            (tool, validator)
        })
        .collect()
});

/// Fields whose rules go beyond what a JSON Schema says.
const SEMANTIC_FIELDS: &[&str] = &[
    "branch_id",
    "parent_branch_id",
    "description",
    "message",
    "query",
    "content",
    "lesson_id",
    "tools",
    "model",
];

fn schema(tool: FoldingTool) -> &'static jsonschema::Validator {
    &SCHEMAS.iter().find(|(t, _)| *t == tool).expect("every tool has a schema").1
}

fuzz_target!(|body: &[u8]| {
    let message = serde_json::from_slice::<Value>(body).ok();
    let arguments = message
        .as_ref()
        .and_then(|m| m.get("params"))
        .and_then(|p| p.get("arguments"))
        .filter(|a| !a.is_null())
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    let tool = message
        .as_ref()
        .filter(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"))
        .and_then(|m| m.get("params")?.get("name")?.as_str())
        .and_then(FoldingTool::from_name);
    match GUARD.check(body) {
        Verdict::Refused { status, body: answer } => {
            assert!(status == 400 || status == 403, "refused with {status}");
            if status == 403 {
                return;
            }
            let answer: Value = serde_json::from_slice(&answer).expect("a 400 is JSON");
            assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
            let code = answer["error"]["code"].as_i64().expect("a 400 has an error code");
            assert!(matches!(code, -32700 | -32600 | -32602), "code {code}");
            if code == -32602
                && let Some(tool) = tool
                && arguments.is_object()
                && schema(tool).is_valid(&arguments)
            {
                let field = answer["error"]["data"]["field"].as_str().unwrap_or_default();
                assert!(
                    SEMANTIC_FIELDS.contains(&field),
                    "{}: arguments within the published schema refused: {answer}",
                    tool.name()
                );
            }
        }
        Verdict::Passed(Some(parsed)) => {
            let tool = parsed.tool();
            let errors: Vec<String> =
                schema(tool).iter_errors(&arguments).map(|e| e.to_string()).collect();
            assert!(
                errors.is_empty(),
                "{}: arguments outside the published schema accepted: {errors:?}",
                tool.name()
            );
            let config = GUARD.config();
            let create = match &parsed {
                Parsed::Create(create) => Some(create),
                Parsed::Run(run) => Some(&run.create),
                _ => None,
            };
            if let Some(create) = create {
                let budget = create.budget.tokens();
                assert!(budget >= config.budget.min_branch_budget, "budget {budget}");
                assert!(budget <= config.budget.max_budget, "budget {budget}");
                let timeout = create.timeout.seconds();
                assert!(
                    (1..=config.timeout.max.as_secs()).contains(&u64::from(timeout)),
                    "timeout {timeout}"
                );
            }
        }
        Verdict::Passed(None) => {}
    }
});
