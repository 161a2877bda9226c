//! The `foldgate` gateway process: configuration, startup and shutdown.
//! `main.rs` only parses the command line and calls into here, so tests
//! start the same gateway on `127.0.0.1:0`.

mod background;
mod check;
pub mod cli;
pub mod config;
pub mod http;
mod memory_cli;
pub mod serve;
