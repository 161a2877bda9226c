//! The `foldgate` command.

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    foldgate::cli::run(foldgate::cli::Cli::parse()).await
}
