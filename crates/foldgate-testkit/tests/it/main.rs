//! The testkit's integration tests, in one binary: crash recovery across
//! processes, and the model server against a real client library.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod crash_recovery;
mod model_server;
