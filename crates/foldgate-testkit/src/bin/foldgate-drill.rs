//! A process that uses the folding engine and can be killed, for crash
//! recovery tests.
//!
//! `create` opens, per session, a branch `A` (1 s deadline) with a child `B`
//! (asking for 600 s, capped at its parent's deadline), plus a branch `C` whose budget is recorded as exhausted without
//! the forced return that normally follows — as if the process died in
//! between. It prints `A B C` ids per session, then `ready`, and waits to be
//! killed. `supervise` runs the deadline reconciler's first pass (what the
//! supervisor does at startup), prints each branch it fired, and exits.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::print_stdout, reason = "test tool")]

use std::{sync::Arc, time::Duration};

use clap::{Parser, Subcommand};
use foldgate_engine::{
    CreateBranch, FoldingService, SupervisorConfig, SystemClock, supervisor::DeadlineReconciler,
};
use foldgate_store::{ConnectOptions, Store};
use foldgate_testkit::{ServiceBuilder, principal};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Create {
        #[arg(long, default_value_t = 3)]
        sessions: usize,
    },
    Supervise,
}

async fn create(service: &FoldingService, session: &str, timeout: i64) -> foldgate_domain::Branch {
    let req = CreateBranch::parse(
        service.config(),
        session,
        "crash drill",
        None,
        Some(1024),
        Some(timeout),
        None,
        None,
    )
    .unwrap();
    service.create(&principal("acme", "drill"), req).await.unwrap().branch
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let store: Arc<dyn Store> =
        foldgate_store::connect(&ConnectOptions::new(args.database_url), true).await?;
    let service = ServiceBuilder::new(Arc::clone(&store)).clock(Arc::new(SystemClock)).build();
    match args.command {
        Command::Create { sessions } => {
            for i in 0..sessions {
                let a = create(&service, &format!("drill-{i}"), 1).await;
                let b = create(&service, &format!("drill-{i}"), 600).await;
                let c = create(&service, &format!("drill-c-{i}"), 600).await;
                let now = service.clock().now();
                let exhausted =
                    store.consume(&a.tenant, c.id, 1_000_000, now).await?.expect("C is active");
                assert!(exhausted.exhausted);
                println!("{} {} {}", a.id, b.id, c.id);
            }
            println!("ready");
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Command::Supervise => {
            // The deadline reconciler's first pass, as the driver runs it
            // at startup.
            let pass =
                DeadlineReconciler::new(service, SupervisorConfig::default()).activate().await;
            for (id, reason) in pass.fired {
                println!("{id} {reason}");
            }
        }
    }
    Ok(())
}
