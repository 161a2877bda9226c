//! The bench against a real gateway in process, in one binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod runs;
mod smoke;
