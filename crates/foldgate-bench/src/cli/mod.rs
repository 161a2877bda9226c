//! The `foldgate-bench` command line.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use crate::{
    client::ClientOptions,
    deadlines::{self, DeadlineSpec},
    echo,
    load::{self, Auth, Balance, Mode, Stop, Target, Workload},
    process::{self, GatewaySpawn, Spawned},
    report::{self, RunReport},
    runs::{self, ConcurrentSpec, ModelApi, RunTarget, RunsReport, SequentialSpec},
    slow::{self, SlowKind, SlowSpec},
    verify::{self, VerifyOptions},
};

mod args;
mod commands;

use self::{args::*, commands::*};

/// Load generator, benchmarks and fault checks for foldgate.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive simulated agents against a gateway, and against the baseline
    /// echo server in the same run; print and save the figures.
    Run(Box<RunArgs>),
    /// Create many branches with short deadlines and check in the database
    /// that every one fired in time.
    Deadlines(Box<DeadlineArgs>),
    /// Check a run's branches in the database: none lost, none ended twice,
    /// deadlines in time, the books balanced. Exits 1 on a failed check.
    Verify(VerifyArgs),
    /// Open connections that stall or abandon their requests, and sample
    /// what they cost the server.
    SlowClients(SlowArgs),
    /// Gateway-run branches (`branch_run`) against a scripted model server
    /// and the echo server as upstream: the gateway's overhead per step
    /// (runs one at a time), then many runs in flight at once.
    Runs(Box<RunsArgs>),
    /// Serve the baseline: a bare rmcp server with one `echo` tool
    /// (Streamable HTTP, stateless, JSON responses). Prints its URL.
    EchoServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
}

/// `500ms`, `30s`, `30m`, `2h`, or plain seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let n: f64 = number.parse().map_err(|_| format!("{raw:?}: expected e.g. 500ms, 30s, 30m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{raw:?}: the unit must be ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{raw:?}: {e}"))
}

fn parse_outage(raw: &str) -> Result<(f64, f64), String> {
    let (start, end) = raw.split_once(',').ok_or("expected START,END")?;
    let parse = |s: &str| s.trim().parse::<f64>().map_err(|e| format!("{s:?}: {e}"));
    let (start, end) = (parse(start)?, parse(end)?);
    if end < start {
        return Err("the outage ends before it starts".into());
    }
    Ok((start, end))
}

fn random_id() -> String {
    // Short, and a valid prefix of tenant and session ids.
    format!("b{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

fn random_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Runs the command line.
pub async fn main() -> ExitCode {
    match run_cli(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("foldgate-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_cli(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Deadlines(args) => run_deadlines(*args).await,
        Command::Verify(args) => run_verify(args).await,
        Command::SlowClients(args) => run_slow(args).await,
        Command::Runs(args) => run_runs(*args).await,
        Command::EchoServer { listen } => {
            let server = echo::EchoServer::start(&listen).await?;
            println!("{}{}", crate::ECHO_ANNOUNCEMENT, server.url());
            shutdown_signal().await?;
            server.stop().await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("500ms", Some(Duration::from_millis(500))),
            ("30s", Some(Duration::from_secs(30))),
            ("30", Some(Duration::from_secs(30))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("30m", Some(Duration::from_secs(1800))),
            ("2h", Some(Duration::from_secs(7200))),
            ("3d", None),
            ("s", None),
        ];
        for (raw, expected) in cases {
            assert_eq!(parse_duration(raw).ok(), expected, "{raw}");
        }
        assert_eq!(parse_outage("10.5,12"), Ok((10.5, 12.0)));
        assert!(parse_outage("12,10").is_err());
    }
}
