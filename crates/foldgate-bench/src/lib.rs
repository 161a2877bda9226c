//! foldgate-bench: a load generator, benchmarks and fault checks for
//! foldgate.
//!
//! Simulated agents ([`load`]) speak MCP over Streamable HTTP
//! ([`client`]) with their own JWTs, against a gateway and, in the same
//! run, against a bare rmcp echo server ([`echo`]) that serves as the
//! baseline. [`deadlines`] measures the supervisor at scale, [`verify`]
//! checks a run's branches in the database, [`slow`] measures what
//! stalled and abandoned connections cost the server, and [`runs`]
//! measures gateway-run branches against a scripted model provider.

pub mod cli;
pub mod client;
pub mod deadlines;
pub mod echo;
pub mod load;
pub mod process;
pub mod report;
pub mod runs;
pub mod slow;
pub mod stats;
pub mod verify;

/// What `foldgate-bench echo-server` prints before its URL.
pub const ECHO_ANNOUNCEMENT: &str = "echo server at ";
