//! The `foldgate` command.

use anyhow::Context;
use clap::{Parser, Subcommand};
use foldgate_store::{ConnectOptions, redact_url};

/// A multi-tenant MCP gateway for context folding.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply pending database migrations, then exit.
    Migrate {
        /// The database: `postgres://…` or `sqlite://PATH` (created if missing).
        #[arg(long, env = "DATABASE_URL", default_value = "sqlite://foldgate.db")]
        database_url: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Migrate { database_url } => {
            let shown = redact_url(&database_url);
            foldgate_store::migrate(&ConnectOptions::new(database_url))
                .await
                .with_context(|| format!("migrating {shown}"))?;
            tracing::info!(database = %shown, "database is migrated");
        }
    }
    Ok(())
}
