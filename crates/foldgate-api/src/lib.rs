//! foldgate's MCP front end.
//!
//! The router stacks, in order: request id and trace span, body limit
//! (413), Host and Origin allow-lists (403), JWT authentication (401/403),
//! a per-principal rate limit (429), and the exchange layer — the span and
//! duration metric of each MCP operation, the MCP guard that validates
//! JSON-RPC and tool arguments (400), and the mapping of limits and database
//! outages to 429 and 503 — before rmcp's Streamable HTTP service hands the
//! call to [`tools::FoldingTools`]: a folding tool, or an upstream's tool
//! forwarded and metered by [`proxy`].

pub mod args;
pub mod auth;
mod config;
pub mod error;
mod exchange;
mod guard;
mod limit;
pub mod metrics;
mod observe;
pub mod proxy;
mod router;
pub mod tools;

/// Federation, re-exported for the binary and the tests.
pub use foldgate_upstream as upstream;

pub use config::ApiConfig;
pub use guard::HostOriginPolicy;
pub use limit::RateLimitConfig;
pub use router::{Gateway, ops_router, router};
