//! Federation: the upstream MCP servers foldgate fronts, and the one way a
//! call of their tools is made and metered.
//!
//! Teams declare their upstream servers in the configuration; agents see
//! their tools as `<upstream>__<tool>` next to the folding tools. Every call
//! of an upstream tool, whether an agent made it through the gateway's MCP
//! endpoint or the gateway's own runner made it for a gateway-run branch,
//! goes through [`meter::call`]: forwarded with foldgate's credentials (a
//! static header or an OAuth client-credentials token, never the agent's),
//! scrubbed, counted, charged to the branch it belongs to, and cut at what
//! the branch grants. What the upstream says while the call runs (its
//! progress and log messages) is handed back to the caller on the way
//! ([`notice`]).

mod client;
mod config;
pub mod identity;
pub mod meter;
pub mod metrics;
pub mod notice;
mod oauth;
mod registry;
pub mod search;
mod stdio;

pub(crate) use client::CallError;
pub use config::{
    DEFAULT_UPSTREAM_SCOPE, NAMESPACE_SEPARATOR, OAuthClientCredentials, UpstreamConfig,
    check_credential, expand_env,
};
pub use foldgate_domain::Caller;
pub use metrics::UpstreamMetrics;
pub use registry::{Lookup, Origin, SchemaMismatch, Upstream, UpstreamTool, Upstreams};
