//! Tool arguments: their JSON schemas, and their parsing into the engine's
//! validated requests. The MCP guard and the tool handlers share this code,
//! so that what the guard lets through is exactly what the tools accept.

use foldgate_domain::{BranchId, InvalidInput, Message, Outcome, SessionId};
use foldgate_engine::{CreateBranch, FoldingConfig, ReturnBranch, StatusQuery};
use schemars::JsonSchema;
use serde_json::{Map, Value};

/// An argument that is missing, of the wrong type, unknown or invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid argument `{field}`: {reason}")]
pub struct ArgError {
    /// The argument's name, as the client spelled it (`data.field`).
    pub field: String,
    pub reason: String,
}

impl ArgError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }
}

impl From<InvalidInput> for ArgError {
    fn from(e: InvalidInput) -> Self {
        Self::new(e.field, e.reason)
    }
}

/// The folding tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldingTool {
    BranchCreate,
    BranchReturn,
    BranchStatus,
    SessionEnd,
}

impl FoldingTool {
    pub const ALL: [Self; 4] =
        [Self::BranchCreate, Self::BranchReturn, Self::BranchStatus, Self::SessionEnd];

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::BranchCreate => "branch_create",
            Self::BranchReturn => "branch_return",
            Self::BranchStatus => "branch_status",
            Self::SessionEnd => "session_end",
        }
    }

    /// The scope a token needs to call the tool.
    pub const fn scope(self) -> &'static str {
        match self {
            Self::BranchStatus => "fold:read",
            _ => "fold:write",
        }
    }
}

/// `branch_create` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct BranchCreateArgs {
    /// The folding session: any id you choose (1-128 characters of letters, digits, `.`, `_`,
    /// `:`, `-`), the same for the whole conversation. The first branch_create opens it.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    session_id: String,
    /// One sentence: what this branch is for (at most 500 characters). It is all the branch
    /// knows of its parent's context besides `prompt`.
    #[schemars(length(min = 1, max = 500))]
    description: String,
    /// Detailed instructions for the sub-task (at most 10,000 characters).
    #[schemars(length(max = 10000))]
    prompt: Option<String>,
    /// Token budget for the branch (default 8192, at most 32768, at least 256). Everything the
    /// branch does is counted by the gateway; at the budget the branch is ended.
    #[schemars(range(min = 256))]
    budget: Option<i64>,
    /// Seconds before the branch is ended (default 300, at most 600).
    #[schemars(range(min = 1))]
    timeout_seconds: Option<i64>,
    /// Open the branch under this branch instead of the current one, to run siblings side by
    /// side (e.g. one branch per approach).
    parent_branch_id: Option<String>,
}

/// `branch_return` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct BranchReturnArgs {
    /// The branch to finish (`br_…`, from branch_create).
    branch_id: String,
    /// The result for the parent context: a short summary of what was found or done, not the
    /// raw material (at most 50,000 characters; secrets are redacted).
    #[schemars(length(max = 50000))]
    message: String,
    /// `success` (default) or `failure`: a failed branch's message tells the parent what went
    /// wrong.
    outcome: Option<OutcomeArg>,
}

#[derive(Debug, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[expect(dead_code, reason = "the schema of `outcome`")]
enum OutcomeArg {
    Success,
    Failure,
}

/// `branch_status` arguments: one of them is required.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct BranchStatusArgs {
    /// A branch to look at.
    branch_id: Option<String>,
    /// A session, to see its current (innermost active) branch.
    session_id: Option<String>,
}

/// `session_end` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct SessionEndArgs {
    /// The session to end: every active branch in it is ended.
    session_id: String,
}

/// The arguments of a folding tool, parsed.
#[derive(Debug, Clone)]
pub enum Parsed {
    Create(CreateBranch),
    Return(ReturnBranch),
    Status(StatusQuery),
    End(SessionId),
}

/// Reads a tool's arguments. `None` is treated as `{}`.
pub fn parse(
    tool: FoldingTool,
    args: Option<&Map<String, Value>>,
    config: &FoldingConfig,
) -> Result<Parsed, ArgError> {
    let empty = Map::new();
    let args = Args::new(args.unwrap_or(&empty), tool)?;
    Ok(match tool {
        FoldingTool::BranchCreate => {
            let session_id = args.required_str("session_id")?;
            let description = args.required_str("description")?;
            let create = CreateBranch::parse(
                config,
                session_id,
                description,
                args.optional_str("prompt")?,
                args.optional_int("budget")?,
                args.optional_int("timeout_seconds")?,
                args.optional_str("parent_branch_id")?,
            )?;
            Parsed::Create(create)
        }
        FoldingTool::BranchReturn => Parsed::Return(ReturnBranch {
            branch_id: BranchId::parse(args.required_str("branch_id")?)?,
            message: Message::parse(args.required_str("message")?)?,
            outcome: Outcome::parse(args.optional_str("outcome")?)?,
        }),
        FoldingTool::BranchStatus => {
            match (args.optional_str("branch_id")?, args.optional_str("session_id")?) {
                (Some(id), _) => Parsed::Status(StatusQuery::Branch(BranchId::parse(id)?)),
                (None, Some(session)) => {
                    Parsed::Status(StatusQuery::Session(SessionId::parse(session)?))
                }
                (None, None) => {
                    return Err(ArgError::new(
                        "branch_id",
                        "one of branch_id or session_id is required",
                    ));
                }
            }
        }
        FoldingTool::SessionEnd => Parsed::End(SessionId::parse(args.required_str("session_id")?)?),
    })
}

/// A tool's argument object, checked against the tool's argument names.
struct Args<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    fn new(map: &'a Map<String, Value>, tool: FoldingTool) -> Result<Self, ArgError> {
        let known: &[&str] = match tool {
            FoldingTool::BranchCreate => &[
                "session_id",
                "description",
                "prompt",
                "budget",
                "timeout_seconds",
                "parent_branch_id",
            ],
            FoldingTool::BranchReturn => &["branch_id", "message", "outcome"],
            FoldingTool::BranchStatus => &["branch_id", "session_id"],
            FoldingTool::SessionEnd => &["session_id"],
        };
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ArgError::new(unknown.as_str(), "unknown argument"));
        }
        Ok(Self { map })
    }

    fn optional_str(&self, field: &'static str) -> Result<Option<&'a str>, ArgError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ArgError::new(field, "must be a string")),
        }
    }

    fn required_str(&self, field: &'static str) -> Result<&'a str, ArgError> {
        self.optional_str(field)?.ok_or_else(|| ArgError::new(field, "is required"))
    }

    fn optional_int(&self, field: &'static str) -> Result<Option<i64>, ArgError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Ok(Some(i)),
                // 8192.0 is an integer in JSON Schema terms.
                (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 =>
                {
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "checked integral and in range"
                    )]
                    Ok(Some(f as i64))
                }
                _ => Err(ArgError::new(field, "must be an integer")),
            },
            Some(_) => Err(ArgError::new(field, "must be an integer")),
        }
    }
}

/// The JSON schema of a tool's arguments.
pub fn input_schema(tool: FoldingTool) -> Map<String, Value> {
    let schema = match tool {
        FoldingTool::BranchCreate => schemars::schema_for!(BranchCreateArgs),
        FoldingTool::BranchReturn => schemars::schema_for!(BranchReturnArgs),
        FoldingTool::BranchStatus => schemars::schema_for!(BranchStatusArgs),
        FoldingTool::SessionEnd => schemars::schema_for!(SessionEndArgs),
    };
    let mut map = match schema.to_value() {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    map.remove("$schema");
    map.remove("title");
    map.remove("description");
    map
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse_json(tool: FoldingTool, args: Value) -> Result<Parsed, ArgError> {
        parse(tool, args.as_object(), &FoldingConfig::default())
    }

    #[test]
    fn every_invalid_argument_is_named() {
        use FoldingTool::*;
        let id = "br_01234567-89ab-7cde-8f01-23456789abcd";
        let cases = [
            (BranchCreate, json!({"description": "d"}), "session_id", "missing"),
            (BranchCreate, json!({"session_id": "s"}), "description", "missing"),
            (BranchCreate, json!({"session_id": 5, "description": "d"}), "session_id", "type"),
            (
                BranchCreate,
                json!({"session_id": "a b", "description": "d"}),
                "session_id",
                "format",
            ),
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
}
