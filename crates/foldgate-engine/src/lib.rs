//! The folding use cases.
//!
//! [`FoldingService`] is what the MCP tools call: create a branch, return
//! it, query it, charge tokens to it, end a session. It owns the rules that
//! span several store operations — children are force-returned deepest first
//! before their parent ends, the return message is scrubbed (fail closed)
//! before anything is written, tokens are counted here and never taken from
//! the agent. The [`supervisor`] runs the background reconcilers that fire
//! deadlines, finish exhausted branches and end idle sessions.

mod config;
mod error;
mod memory;
mod metrics;
mod retention;
mod scrub;
mod service;
pub mod supervisor;
mod tenants;
mod tokens;

pub use config::{FoldingConfig, SupervisorConfig};
pub use error::FoldError;
pub use foldgate_domain::{Clock, ManualClock, SystemClock};
pub use foldgate_store::{
    CallOutcome, CallRecord, CallSummary, OutsideUsage, ToolCalls, UsageKind,
};
pub use memory::{
    BACKFILL_BATCH, EmbedError, Embedder, EmbeddingFailed, ExtractPass, Found, Injection,
    MemoryBank, MemoryConfig, MemoryEmbedding, MemoryExtract, MemoryMetrics, MemoryRetention,
    MemoryUses, RRF_K, RecordMemory, Screen, ScreenSetupError, reciprocal_rank_fusion,
};
pub use metrics::{EngineMetrics, StoreGauges, TenantSeries};
pub use retention::{Pruned, RetentionConfig};
pub use scrub::{
    INLINE_TEXT_BYTES, ScrubFailure, Scrubbed, ScrubbedValue, Scrubber, default_scrubber,
    scrubber_from_config,
};
pub use service::{
    CallTarget, Consumed, CreateBranch, Created, FoldingService, MeteredCall, ReturnBranch,
    Returned, SessionEnded, StatusQuery,
};
pub use tenants::{Rules, TENANT_SYNC_INTERVAL, TenantRules, UsageBook};
pub use tokens::{Encoding, TokenCounter};
