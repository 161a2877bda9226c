//! Tool arguments: their JSON schemas, and their parsing into the engine's
//! validated requests. The MCP guard and the tool handlers share this code,
//! so that what the guard lets through is exactly what the tools accept.

use foldgate_auth as auth;
use foldgate_domain::{
    BranchId, BudgetPolicy, BudgetRequest, InvalidInput, Message, Outcome, SessionId,
};
use foldgate_engine::{CreateBranch, FoldingConfig, ReturnBranch, StatusQuery};

mod memory;
use foldgate_runner::RunBranch;
pub use memory::{MemoryCall, MemoryFeedbackArgs, MemoryRecordArgs, MemorySearchArgs};
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
    MemorySearch,
    MemoryRecord,
    MemoryFeedback,
    ToolSearch,
}

impl FoldingTool {
    pub const ALL: [Self; 9] = [
        Self::BranchCreate,
        Self::BranchReturn,
        Self::BranchRun,
        Self::BranchStatus,
        Self::SessionEnd,
        Self::MemorySearch,
        Self::MemoryRecord,
        Self::MemoryFeedback,
        Self::ToolSearch,
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
            Self::MemorySearch => "memory_search",
            Self::MemoryRecord => "memory_record",
            Self::MemoryFeedback => "memory_feedback",
            Self::ToolSearch => "tool_search",
        }
    }

    /// Whether it is one of the reasoning memory's tools.
    pub const fn is_memory(self) -> bool {
        matches!(self, Self::MemorySearch | Self::MemoryRecord | Self::MemoryFeedback)
    }

    /// The scope a token needs to call the tool.
    pub const fn scope(self) -> &'static str {
        match self {
            Self::BranchStatus | Self::ToolSearch => auth::SCOPE_READ,
            Self::MemorySearch => auth::SCOPE_MEMORY_READ,
            Self::MemoryRecord | Self::MemoryFeedback => auth::SCOPE_MEMORY_WRITE,
            _ => auth::SCOPE_WRITE,
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
    /// Start the branch with lessons from your team's memory that match the description and
    /// prompt (returned as `injected_context`, charged to the branch, at most a fifth of its
    /// budget). Default: as the operator configured.
    inject_memories: Option<bool>,
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
    /// Give the model lessons from your team's memory that match the task (at most a fifth of
    /// the budget). Default: as the operator configured.
    inject_memories: Option<bool>,
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
    /// Keep the message in your team's memory as a lesson (a strategy on success, a pitfall on
    /// failure), for later branches; it is queued with the return and written in the
    /// background. Ignored when the gateway's memory is off. Default false.
    extract_memory: Option<bool>,
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
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    session_id: Option<String>,
}

/// `session_end` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct SessionEndArgs {
    /// The session to end: every active branch in it is ended.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    session_id: String,
}

/// The most tools one `tool_search` answers with.
pub const MAX_TOOL_SEARCH_LIMIT: u32 = 20;
/// Tools a `tool_search` answers with when it names no limit.
const DEFAULT_TOOL_SEARCH_LIMIT: u32 = 5;
/// The longest `tool_search` query, in characters.
const MAX_TOOL_QUERY_CHARS: usize = 500;

/// `tool_search` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct ToolSearchArgs {
    /// What you need a tool for, in words: the action, what it acts on, and the service if you
    /// know it (at most 500 characters).
    #[schemars(length(min = 1, max = 500))]
    query: String,
    /// At most this many tools (default 5, at most 20).
    #[schemars(range(min = 1, max = 20))]
    limit: Option<i64>,
}

/// The arguments of a folding tool, parsed.
#[derive(Debug, Clone)]
pub enum Parsed {
    Create(CreateBranch),
    Run(RunBranch),
    Return(ReturnBranch),
    Status(StatusQuery),
    End(SessionId),
    Memory(MemoryCall),
    ToolSearch { query: String, limit: u32 },
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
            Self::Memory(call) => call.tool(),
            Self::ToolSearch { .. } => FoldingTool::ToolSearch,
        }
    }

    /// A scope these arguments need beyond the tool's own: asking for
    /// lessons (`inject_memories: true`) reads the memory, keeping one
    /// (`extract_memory: true`) writes it.
    pub fn extra_scope(&self) -> Option<&'static str> {
        match self {
            Self::Create(create) | Self::Run(RunBranch { create, .. })
                if create.inject_memories == Some(true) =>
            {
                Some(auth::SCOPE_MEMORY_READ)
            }
            Self::Return(req) if req.extract_memory => Some(auth::SCOPE_MEMORY_WRITE),
            _ => None,
        }
    }
}

/// Reads a tool's arguments. `None` is treated as `{}`. A branch's budget
/// follows `budget`, the caller's tenant's policy.
pub fn parse(
    tool: FoldingTool,
    args: Option<&Map<String, Value>>,
    config: &FoldingConfig,
    budget: &BudgetPolicy,
) -> Result<Parsed, ArgError> {
    let empty = Map::new();
    let args = Args::new(args.unwrap_or(&empty), tool)?;
    Ok(match tool {
        FoldingTool::BranchCreate => Parsed::Create(args.create(config, budget)?),
        FoldingTool::BranchRun => Parsed::Run(RunBranch {
            create: args.create(config, budget)?,
            model: args.optional_name("model")?,
            tools: args.optional_names("tools")?,
        }),
        FoldingTool::BranchReturn => Parsed::Return(ReturnBranch {
            branch_id: BranchId::parse(args.required_str("branch_id")?)?,
            message: Message::parse(args.required_str("message")?)?,
            outcome: Outcome::parse(args.optional_str("outcome")?)?,
            extract_memory: args.optional_bool("extract_memory")?.unwrap_or(false),
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
        FoldingTool::MemorySearch | FoldingTool::MemoryRecord | FoldingTool::MemoryFeedback => {
            Parsed::Memory(args.memory(tool)?)
        }
        FoldingTool::ToolSearch => Parsed::ToolSearch {
            query: args.query(MAX_TOOL_QUERY_CHARS)?.to_owned(),
            limit: args.limit(DEFAULT_TOOL_SEARCH_LIMIT, MAX_TOOL_SEARCH_LIMIT)?,
        },
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
                "inject_memories",
            ],
            FoldingTool::BranchRun => &[
                "session_id",
                "description",
                "prompt",
                "budget",
                "timeout_seconds",
                "parent_branch_id",
                "return_tier",
                "inject_memories",
                "model",
                "tools",
            ],
            FoldingTool::BranchReturn => &["branch_id", "message", "outcome", "extract_memory"],
            FoldingTool::BranchStatus => &["branch_id", "session_id"],
            FoldingTool::SessionEnd => &["session_id"],
            FoldingTool::MemorySearch => &["query", "kind", "limit"],
            FoldingTool::MemoryRecord => &["title", "content", "kind", "description"],
            FoldingTool::MemoryFeedback => &["id", "helpful"],
            FoldingTool::ToolSearch => &["query", "limit"],
        };
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ArgError::new(unknown.as_str(), "unknown argument"));
        }
        Ok(Self { map })
    }

    /// The arguments `branch_create` and `branch_run` share.
    fn create(
        &self,
        config: &FoldingConfig,
        budget: &BudgetPolicy,
    ) -> Result<CreateBranch, ArgError> {
        let session_id = self.required_str("session_id")?;
        let description = self.required_str("description")?;
        let inject_memories = self.optional_bool("inject_memories")?;
        let mut create = CreateBranch::parse(
            config,
            session_id,
            description,
            self.optional_str("prompt")?,
            self.optional_int("budget")?,
            self.optional_int("timeout_seconds")?,
            self.optional_str("parent_branch_id")?,
            self.optional_str("return_tier")?,
        )?;
        create.inject_memories = inject_memories;
        // The tenant's own default and cap, where it has them.
        create.budget = BudgetRequest::parse(self.optional_int("budget")?, budget)?;
        Ok(create)
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

    /// A search's `query`: 1 to `max_chars` characters, not only blanks.
    fn query(&self, max_chars: usize) -> Result<&'a str, ArgError> {
        let query = self.required_str("query")?;
        if query.trim().is_empty() || query.chars().count() > max_chars {
            return Err(ArgError::new("query", format!("must be 1-{max_chars} characters")));
        }
        Ok(query)
    }

    /// A search's `limit`: 1 to `max`, `default` when absent.
    fn limit(&self, default: u32, max: u32) -> Result<u32, ArgError> {
        match self.optional_int("limit")? {
            None => Ok(default),
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| ArgError::new("limit", format!("must be 1-{max}"))),
        }
    }

    fn optional_str(&self, field: &'static str) -> Result<Option<&'a str>, ArgError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ArgError::new(field, "must be a string")),
        }
    }

    fn optional_bool(&self, field: &'static str) -> Result<Option<bool>, ArgError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ArgError::new(field, "must be true or false")),
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
                // 8192.0 is an integer in JSON Schema terms, and so are 1e30
                // and 2^64, which stand for "as much as there is" (a float
                // cast saturates at the ends of i64).
                (None, Some(f)) if f.fract() == 0.0 =>
                {
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "integral; beyond i64 saturates, which every limit caps or refuses"
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
        FoldingTool::MemorySearch => schemars::schema_for!(MemorySearchArgs),
        FoldingTool::MemoryRecord => schemars::schema_for!(MemoryRecordArgs),
        FoldingTool::MemoryFeedback => schemars::schema_for!(MemoryFeedbackArgs),
        FoldingTool::ToolSearch => schemars::schema_for!(ToolSearchArgs),
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
    for value in map.values_mut() {
        drop_foreign_formats(value);
    }
    map
}

/// The `format`s JSON Schema defines; schemars also writes Rust's integer
/// types (`uint64`, `int32`, …), which validators warn about on every call
/// (and the `minimum` beside them already says what they mean).
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

fn drop_foreign_formats(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let foreign = map
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| !STANDARD_FORMATS.contains(&f));
            if foreign {
                map.remove("format");
            }
            map.values_mut().for_each(drop_foreign_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_foreign_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
