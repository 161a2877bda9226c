//! The store's integration tests, in one binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod admin;
mod charging;
mod extract;
mod folding;
mod memory;
mod metrics;
mod vectors;
