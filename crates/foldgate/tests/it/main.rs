//! The gateway's integration tests, in one binary: the real gateway started
//! by `foldgate_testkit::gateway`, the `foldgate` command as a process, and
//! upstream and model servers on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod check_config;
mod lifecycle;
mod mcp;
mod migrate;
mod runs;
mod security;
mod telemetry;
mod upstream;
