//! foldgate's MCP front end.
//!
//! The router stacks, in order: request id and trace span, body limit
//! (413), Host and Origin allow-lists (403), JWT authentication (401/403),
//! a per-principal rate limit (429), and the exchange layer — the span and
//! duration metric of each MCP operation, the MCP guard that validates
//! JSON-RPC and tool arguments (400), and the mapping of limits and database
//! outages to 429 and 503 — before rmcp's Streamable HTTP service hands the
//! call to [`tools::FoldingTools`]: a folding tool, or an upstream's tool
//! forwarded and metered by [`proxy`]. Each message is read once
//! ([`call`]): what the guard checked reaches the tools parsed, in the
//! request's extensions; each tool's answer is a type ([`answers`]) whose
//! schema is its `outputSchema`.

pub mod answers;
pub mod args;
mod call;
mod config;
pub mod error;
mod exchange;
#[cfg(fuzzing)]
pub mod fuzzing;
mod guard;
mod host;
mod limit;
pub mod memory;
pub mod metrics;
mod observe;
pub mod proxy;
mod router;
pub mod tools;

/// Authentication and federation, re-exported for the binary and the tests.
pub use foldgate_auth as auth;
pub use foldgate_upstream as upstream;

/// The names clients use: the folding tools, the `_meta` keys and the
/// header foldgate reads and writes. For the tests and the benchmark.
pub mod names {
    use crate::args::FoldingTool;

    pub const BRANCH_CREATE: &str = FoldingTool::BranchCreate.name();
    pub const BRANCH_RETURN: &str = FoldingTool::BranchReturn.name();
    pub const BRANCH_RUN: &str = FoldingTool::BranchRun.name();
    pub const BRANCH_STATUS: &str = FoldingTool::BranchStatus.name();
    pub const SESSION_END: &str = FoldingTool::SessionEnd.name();
    pub const MEMORY_SEARCH: &str = FoldingTool::MemorySearch.name();
    pub const MEMORY_RECORD: &str = FoldingTool::MemoryRecord.name();
    pub const MEMORY_FEEDBACK: &str = FoldingTool::MemoryFeedback.name();
    pub const TOOL_SEARCH: &str = FoldingTool::ToolSearch.name();
    pub use crate::call::BRANCH_HEADER;
    pub use foldgate_upstream::meter::{BRANCH_META_KEY, METERING_META_KEY};
}

pub use config::ApiConfig;
pub use guard::HostOriginPolicy;
pub use limit::RateLimitConfig;
pub use router::{Gateway, ops_router, router};
