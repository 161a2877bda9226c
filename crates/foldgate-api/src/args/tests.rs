use serde_json::json;

use super::*;

fn parse_json(tool: FoldingTool, args: Value) -> Result<Parsed, ArgError> {
    let config = FoldingConfig::default();
    parse(tool, args.as_object(), &config, &config.budget)
}

#[test]
fn every_invalid_argument_is_named() {
    use FoldingTool::*;
    let id = "br_01234567-89ab-7cde-8f01-23456789abcd";
    let cases = [
        (BranchCreate, json!({"description": "d"}), "session_id", "missing"),
        (BranchCreate, json!({"session_id": "s"}), "description", "missing"),
        (BranchCreate, json!({"session_id": 5, "description": "d"}), "session_id", "type"),
        (BranchCreate, json!({"session_id": "a b", "description": "d"}), "session_id", "format"),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "x".repeat(501)}),
            "description",
            "length",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "prompt": "x".repeat(10_001)}),
            "prompt",
            "length",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "budget": "big"}),
            "budget",
            "type",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "budget": 1.5}),
            "budget",
            "fraction",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "budget": 10}),
            "budget",
            "range",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "timeout_seconds": 0}),
            "timeout_seconds",
            "range",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "parent_branch_id": "x"}),
            "parent_branch_id",
            "id format",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "tenant": "other"}),
            "tenant",
            "unknown",
        ),
        (
            BranchCreate,
            json!({"session_id": "s", "description": "d", "return_tier": "huge"}),
            "return_tier",
            "enum",
        ),
        (BranchRun, json!({"session_id": "s"}), "description", "missing"),
        (
            BranchRun,
            json!({"session_id": "s", "description": "d", "tools": "files__read"}),
            "tools",
            "type",
        ),
        (
            BranchRun,
            json!({"session_id": "s", "description": "d", "tools": [""]}),
            "tools",
            "empty name",
        ),
        (
            BranchRun,
            json!({"session_id": "s", "description": "d", "tools": vec!["t"; 257]}),
            "tools",
            "too many",
        ),
        (BranchRun, json!({"session_id": "s", "description": "d", "model": 3}), "model", "type"),
        (BranchRun, json!({"session_id": "s", "description": "d", "budget": 5}), "budget", "range"),
        (BranchReturn, json!({"message": "m"}), "branch_id", "missing"),
        (BranchReturn, json!({"branch_id": "nope", "message": "m"}), "branch_id", "format"),
        (BranchReturn, json!({"branch_id": id}), "message", "missing"),
        (
            BranchReturn,
            json!({"branch_id": id, "message": "x".repeat(50_001)}),
            "message",
            "length",
        ),
        (
            BranchReturn,
            json!({"branch_id": id, "message": "m", "outcome": "meh"}),
            "outcome",
            "enum",
        ),
        (BranchStatus, json!({}), "branch_id", "neither"),
        (BranchStatus, json!({"session_id": ""}), "session_id", "empty"),
        (SessionEnd, json!({}), "session_id", "missing"),
    ];
    for (tool, args, field, why) in cases {
        let err = parse_json(tool, args).expect_err(why);
        assert_eq!(err.field, field, "{why}: {err}");
    }
}

#[test]
fn valid_arguments_parse() {
    let created = parse_json(
        FoldingTool::BranchCreate,
        json!({"session_id": "s", "description": "d\u{7}", "budget": 8192.0, "timeout_seconds": null}),
    )
    .unwrap();
    let Parsed::Create(c) = created else { panic!("a create") };
    assert_eq!(c.description.as_str(), "d", "control characters stripped");
    assert_eq!(c.budget.tokens(), 8192);
    let run = parse_json(
        FoldingTool::BranchRun,
        json!({"session_id": "s", "description": "d", "return_tier": "micro",
               "model": "m", "tools": ["files__read"]}),
    )
    .unwrap();
    let Parsed::Run(r) = run else { panic!("a run") };
    assert_eq!(r.create.return_tier, foldgate_domain::ReturnTier::Micro);
    assert_eq!(r.model.as_deref(), Some("m"));
    assert_eq!(r.tools, Some(vec!["files__read".to_owned()]));
    assert!(matches!(
        parse_json(FoldingTool::BranchStatus, json!({"session_id": "s"})).unwrap(),
        Parsed::Status(StatusQuery::Session(_))
    ));
}

#[test]
fn schemas_name_every_argument_and_refuse_others() {
    for tool in FoldingTool::ALL {
        let schema = input_schema(tool);
        assert_eq!(schema["type"], "object", "{tool:?}");
        assert_eq!(schema["additionalProperties"], false, "{tool:?}");
        assert!(schema["properties"].as_object().is_some_and(|p| !p.is_empty()));
    }
    let create = input_schema(FoldingTool::BranchCreate);
    assert_eq!(create["required"], json!(["session_id", "description"]));
}

/// Found by the `mcp_message` fuzz target: `branch_status` and `session_end`
/// enforced the session id's form without their schemas saying so.
#[test]
fn every_session_id_states_its_rules() {
    let mut seen = 0;
    for tool in FoldingTool::ALL {
        let schema = input_schema(tool);
        let Some(session) = schema["properties"].get("session_id") else { continue };
        seen += 1;
        assert_eq!(session["pattern"], "^[A-Za-z0-9._:-]+$", "{tool:?}");
        assert_eq!(session["minLength"], 1, "{tool:?}");
        assert_eq!(session["maxLength"], 128, "{tool:?}");
    }
    assert!(seen >= 4, "{seen}");
}

/// Found by the `mcp_message` fuzz target: an integral number too large for
/// an i64 (`1e16` as a float, `2^64`) satisfies the published schema
/// (`"type": "integer"`, `"minimum": 256`) but was refused as not an integer.
#[test]
fn integers_beyond_i64_are_capped_like_any_large_one() {
    let config = FoldingConfig::default();
    for budget in [json!(1e16), json!(18_446_744_073_709_551_615_u64), json!(1e300)] {
        let args = json!({"session_id": "s", "description": "d", "budget": budget, "timeout_seconds": 1e20});
        let Parsed::Create(create) = parse_json(FoldingTool::BranchCreate, args).unwrap() else {
            panic!("a create")
        };
        assert_eq!(create.budget.tokens(), config.budget.max_budget, "{budget}");
        assert_eq!(u64::from(create.timeout.seconds()), config.timeout.max.as_secs());
    }
    let e = parse_json(
        FoldingTool::BranchCreate,
        json!({"session_id": "s", "description": "d", "budget": -1e20}),
    )
    .unwrap_err();
    assert_eq!(e.field, "budget");
    assert!(e.reason.contains("at least"), "{e}");
}
