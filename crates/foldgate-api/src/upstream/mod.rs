//! Federation: the upstream MCP servers foldgate fronts.
//!
//! Teams declare their upstream servers in the configuration; agents see
//! their tools as `<upstream>__<tool>` next to the folding tools, and every
//! call made inside a branch is metered against that branch's budget by the
//! gateway (see [`crate::proxy`]). foldgate talks to upstreams with its own
//! credentials — a static header or an OAuth client-credentials token —
//! never with the agent's.

mod client;
mod config;
mod oauth;
mod registry;

pub(crate) use client::CallError;
pub use config::{
    DEFAULT_UPSTREAM_SCOPE, NAMESPACE_SEPARATOR, OAuthClientCredentials, UpstreamConfig, expand_env,
};
pub use registry::{Lookup, SchemaMismatch, Upstream, UpstreamTool, Upstreams};
