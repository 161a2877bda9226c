//! The reasoning memory's tool arguments: their schemas and their parsing.

use foldgate_domain::{MemoryId, MemoryKind};
use foldgate_engine::RecordMemory;
use schemars::JsonSchema;

use super::{ArgError, Args, FoldingTool};

/// The most items one `memory_search` answers with.
pub const MAX_SEARCH_LIMIT: u32 = 50;
/// Items a `memory_search` answers with when it names no limit.
const DEFAULT_SEARCH_LIMIT: u32 = 10;
/// The longest search query, in characters.
const MAX_QUERY_CHARS: usize = 2_000;

/// `memory_search` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct MemorySearchArgs {
    /// What you are about to do or are stuck on, in words (at most 2,000 characters).
    #[schemars(length(min = 1, max = 2000))]
    query: String,
    /// Only strategies (what worked) or only pitfalls (what failed).
    kind: Option<KindArg>,
    /// At most this many items (default 10, at most 50).
    #[schemars(range(min = 1, max = 50))]
    limit: Option<i64>,
}

/// `memory_record` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct MemoryRecordArgs {
    /// A short title (at most 120 characters).
    #[schemars(length(min = 1, max = 120))]
    title: String,
    /// The lesson itself, concrete enough to act on: the commands, files or errors involved
    /// (at most 2,000 characters; secrets are redacted).
    #[schemars(length(min = 1, max = 2000))]
    content: String,
    /// `strategy` (an approach that worked) or `pitfall` (one that failed, and why).
    kind: KindArg,
    /// One sentence on when it applies (at most 300 characters).
    #[schemars(length(max = 300))]
    description: Option<String>,
}

/// `memory_feedback` arguments.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[expect(dead_code, reason = "read through the JSON object; the struct is the schema")]
pub struct MemoryFeedbackArgs {
    /// The item (`mem_…`, from injected_context or memory_search).
    id: String,
    /// Whether following it helped.
    helpful: bool,
}

#[derive(Debug, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[expect(dead_code, reason = "the schema of `kind`")]
enum KindArg {
    Strategy,
    Pitfall,
}

/// A memory tool's arguments, parsed.
#[derive(Debug, Clone)]
pub enum MemoryCall {
    Search { query: String, kind: Option<MemoryKind>, limit: u32 },
    Record(RecordMemory),
    Feedback { id: MemoryId, helpful: bool },
}

impl MemoryCall {
    pub fn tool(&self) -> FoldingTool {
        match self {
            Self::Search { .. } => FoldingTool::MemorySearch,
            Self::Record(_) => FoldingTool::MemoryRecord,
            Self::Feedback { .. } => FoldingTool::MemoryFeedback,
        }
    }
}

impl Args<'_> {
    pub(super) fn memory(&self, tool: FoldingTool) -> Result<MemoryCall, ArgError> {
        Ok(match tool {
            FoldingTool::MemorySearch => {
                let query = self.query(MAX_QUERY_CHARS)?;
                let limit = self.limit(DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT)?;
                let kind = self.optional_str("kind")?.map(str::parse).transpose()?;
                MemoryCall::Search { query: query.to_owned(), kind, limit }
            }
            FoldingTool::MemoryRecord => MemoryCall::Record(RecordMemory::recorded(
                self.required_str("title")?,
                self.required_str("content")?,
                self.required_str("kind")?,
                self.optional_str("description")?,
            )?),
            _ => MemoryCall::Feedback {
                id: MemoryId::parse(self.required_str("id")?)?,
                helpful: self
                    .optional_bool("helpful")?
                    .ok_or_else(|| ArgError::new("helpful", "is required"))?,
            },
        })
    }
}
