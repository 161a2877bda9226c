//! Tool arguments: their JSON schemas, and their parsing into the engine's
//! validated requests. The MCP guard and the tool handlers share this code,
//! so that what the guard lets through is exactly what the tools accept.

use foldgate_domain::{BranchId, InvalidInput, Message, Outcome, SessionId};
use foldgate_engine::{CreateBranch, FoldingConfig, ReturnBranch, StatusQuery};
use foldgate_runner::RunBranch;
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
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
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
    BranchRun,
    BranchStatus,
    SessionEnd,
}

impl FoldingTool {
    pub const ALL: [Self; 5] = [
        Self::BranchCreate,
        Self::BranchReturn,
        Self::BranchRun,
        Self::BranchStatus,
        Self::SessionEnd,
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::BranchCreate => "branch_create",
            Self::BranchReturn => "branch_return",
            Self::BranchRun => "branch_run",
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
    /// How long the finding should be: `micro` (at most 50 tokens), `phase` (300, the
    /// default) or `macro` (800). Choose the smallest that serves.
    return_tier: Option<TierArg>,
}

#[derive(Debug, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[expect(dead_code, reason = "the schema of `return_tier`")]
enum TierArg {
    Micro,
    Phase,
    Macro,
}

/// `branch_run` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct BranchRunArgs {
    /// The folding session: any id you choose (1-128 characters of letters, digits, `.`, `_`,
    /// `:`, `-`), the same for the whole conversation.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    session_id: String,
    /// One sentence: the sub-task (at most 500 characters). With `prompt`, it is all the
    /// gateway's model knows of your context: say everything it needs.
    #[schemars(length(min = 1, max = 500))]
    description: String,
    /// Detailed instructions for the sub-task (at most 10,000 characters).
    #[schemars(length(max = 10000))]
    prompt: Option<String>,
    /// Token budget for the sub-task's whole context (default 8192, at most 32768, at least
    /// 256). The run stops at it.
    #[schemars(range(min = 256))]
    budget: Option<i64>,
    /// Seconds before the run is stopped (default 300, at most 600).
    #[schemars(range(min = 1))]
    timeout_seconds: Option<i64>,
    /// Open the branch under this branch instead of the current one.
    parent_branch_id: Option<String>,
    /// How long the finding should be: `micro` (at most 50 tokens), `phase` (300, the
    /// default) or `macro` (800).
    return_tier: Option<TierArg>,
    /// The model to run on, by the name the operator gave it (default: the first configured
    /// for your tenant).
    #[schemars(length(min = 1, max = 64))]
    model: Option<String>,
    /// The upstream tools the model may call, as `<upstream>__<tool>` (default: every
    /// upstream tool you may call).
    #[schemars(length(max = 256))]
    tools: Option<Vec<String>>,
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
    Run(RunBranch),
    Return(ReturnBranch),
    Status(StatusQuery),
    End(SessionId),
}

impl Parsed {
    /// The tool these are the arguments of.
    pub fn tool(&self) -> FoldingTool {
        match self {
            Self::Create(_) => FoldingTool::BranchCreate,
            Self::Run(_) => FoldingTool::BranchRun,
            Self::Return(_) => FoldingTool::BranchReturn,
            Self::Status(_) => FoldingTool::BranchStatus,
            Self::End(_) => FoldingTool::SessionEnd,
        }
    }
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
        FoldingTool::BranchCreate => Parsed::Create(args.create(config)?),
        FoldingTool::BranchRun => Parsed::Run(RunBranch {
            create: args.create(config)?,
            model: args.optional_name("model")?,
            tools: args.optional_names("tools")?,
        }),
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

/// The most tool names `branch_run` takes.
const MAX_TOOL_NAMES: usize = 256;

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
                "return_tier",
            ],
            FoldingTool::BranchRun => &[
                "session_id",
                "description",
                "prompt",
                "budget",
                "timeout_seconds",
                "parent_branch_id",
                "return_tier",
                "model",
                "tools",
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

    /// The arguments `branch_create` and `branch_run` share.
    fn create(&self, config: &FoldingConfig) -> Result<CreateBranch, ArgError> {
        let session_id = self.required_str("session_id")?;
        let description = self.required_str("description")?;
        Ok(CreateBranch::parse(
            config,
            session_id,
            description,
            self.optional_str("prompt")?,
            self.optional_int("budget")?,
            self.optional_int("timeout_seconds")?,
            self.optional_str("parent_branch_id")?,
            self.optional_str("return_tier")?,
        )?)
    }

    /// A model's name: 1-64 characters.
    fn optional_name(&self, field: &'static str) -> Result<Option<String>, ArgError> {
        match self.optional_str(field)? {
            Some(name) if !(1..=64).contains(&name.len()) => {
                Err(ArgError::new(field, "must be 1-64 characters"))
            }
            other => Ok(other.map(str::to_owned)),
        }
    }

    /// A list of tool names: at most [`MAX_TOOL_NAMES`], each 1-128
    /// characters.
    fn optional_names(&self, field: &'static str) -> Result<Option<Vec<String>>, ArgError> {
        let items = match self.map.get(field) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(_) => return Err(ArgError::new(field, "must be an array of tool names")),
        };
        if items.len() > MAX_TOOL_NAMES {
            return Err(ArgError::new(field, format!("at most {MAX_TOOL_NAMES} names")));
        }
        items
            .iter()
            .map(|item| match item.as_str() {
                Some(name) if (1..=128).contains(&name.len()) => Ok(name.to_owned()),
                _ => Err(ArgError::new(field, "each name must be a string of 1-128 characters")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
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
    schema_object(match tool {
        FoldingTool::BranchCreate => schemars::schema_for!(BranchCreateArgs),
        FoldingTool::BranchReturn => schemars::schema_for!(BranchReturnArgs),
        FoldingTool::BranchRun => schemars::schema_for!(BranchRunArgs),
        FoldingTool::BranchStatus => schemars::schema_for!(BranchStatusArgs),
        FoldingTool::SessionEnd => schemars::schema_for!(SessionEndArgs),
    })
}

/// A generated schema as a tool carries it: without the generator's title,
/// description and `$schema`, and an object at the root as MCP requires.
pub(crate) fn schema_object(schema: schemars::Schema) -> Map<String, Value> {
    let mut map = match schema.to_value() {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    map.remove("$schema");
    map.remove("title");
    map.remove("description");
    map.insert("type".to_owned(), Value::from("object"));
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
            (
                BranchRun,
                json!({"session_id": "s", "description": "d", "model": 3}),
                "model",
                "type",
            ),
            (
                BranchRun,
                json!({"session_id": "s", "description": "d", "budget": 5}),
                "budget",
                "range",
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
}
