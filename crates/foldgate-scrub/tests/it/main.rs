//! The scrubber's integration tests, in one binary: its API, the built-in
//! rules against their samples, a generated corpus, gitleaks configs, and
//! prompt-injection screening.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod api;
mod builtin_rules;
mod common;
mod corpus;
mod gitleaks_config;
mod injection;
