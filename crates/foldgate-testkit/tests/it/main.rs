//! The testkit's integration tests, in one binary: crash recovery across
//! processes, the model server against a real client library, and stdio
//! upstreams run by the gateway's upstream registry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod crash_recovery;
mod model_server;
mod stdio;
