//! The gateway's integration tests, in one binary: the real gateway started
//! by `foldgate_testkit::gateway`, the `foldgate` command as a process, and
//! upstream and model servers on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod admin;
mod check_config;
mod lifecycle;
mod mcp;
mod memory;
mod migrate;
mod registrations;
mod runs;
mod security;
mod telemetry;
mod tls;
mod upstream;

use std::{
    io::{BufRead, BufReader, Lines},
    process::{Child, ChildStdout, Command, Stdio},
};

/// `foldgate serve` as a child process on free loopback ports, with no
/// database URL or signing secret from the environment and `configure`
/// adding to its command line: the child, the first line it printed, and
/// the rest of its output (dropping it closes the pipe).
fn spawn_serve(
    configure: impl FnOnce(&mut Command),
) -> (Child, String, Lines<BufReader<ChildStdout>>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_foldgate"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0"])
        .env_remove("DATABASE_URL")
        .env_remove("FOLDGATE_JWT_SECRET")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    configure(&mut command);
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    (child, first, lines)
}
