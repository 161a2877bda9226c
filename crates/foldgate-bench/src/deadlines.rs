//! Deadline scale: many active branches with short deadlines at once, then
//! a check in the database that the supervisor fired every one of them
//! within the allowed lateness, while the gateway's memory is sampled.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use foldgate_store::inspect::Inspector;
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    client::McpClient,
    load::{BRANCH_CREATE, Target, Workload, agent_token},
    process::{ProcSample, sample_until},
    stats::{Measured, Recorder},
    verify::{Verification, VerifyOptions, verify},
};

/// What the deadline-scale run does.
#[derive(Debug, Clone)]
pub struct DeadlineSpec {
    /// Branches to create.
    pub branches: u64,
    /// Branches per session, nested (1 to the gateway's `max_depth`).
    pub chain: u32,
    /// `timeout_seconds` of every branch. Long enough that all branches
    /// are created before the first deadline, so that they are all active
    /// at once.
    pub timeout_seconds: u32,
    /// Concurrent creators.
    pub agents: usize,
    /// Latest a deadline may fire.
    pub max_late: Duration,
    /// How long after the last deadline to wait before checking.
    pub grace: Duration,
    /// The Postgres database the gateway uses, for the checks.
    pub database_url: String,
    /// Resource sample interval.
    pub sample_interval: Duration,
}

/// The outcome.
#[derive(Debug, Clone, Serialize)]
pub struct DeadlineReport {
    pub created: u64,
    pub create_errors: u64,
    pub create_seconds: f64,
    pub creates_per_s: f64,
    pub create: Measured,
    /// Active branches of the run right after the last create.
    pub active_after_creation: i64,
    /// Active branches of the run, sampled while deadlines fire.
    pub active_series: Vec<(f64, i64)>,
    pub verification: Verification,
    pub process: Vec<ProcSample>,
    pub max_rss_kib: Option<u64>,
}

/// Creates the branches, waits for their deadlines, and checks.
pub async fn run(
    target: &Target,
    workload: &Workload,
    spec: &DeadlineSpec,
) -> anyhow::Result<DeadlineReport> {
    let auth = target.auth.as_ref().context("the deadline run needs a JWT secret")?;
    let url = target.urls.first().context("no gateway URL")?;
    let sessions = spec.branches.div_ceil(u64::from(spec.chain.max(1)));
    let next_session = Arc::new(AtomicU64::new(0));
    let created = Arc::new(AtomicU64::new(0));

    let sampler_stop = CancellationToken::new();
    let sampler = target
        .pid
        .map(|pid| tokio::spawn(sample_until(pid, spec.sample_interval, sampler_stop.clone())));

    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..spec.agents.max(1) {
        let token = agent_token(auth, workload, i, url)?;
        let mut client = McpClient::new(url, Some(&token), &workload.client)?;
        let next_session = Arc::clone(&next_session);
        let created = Arc::clone(&created);
        let (run_id, chain, timeout, total) =
            (workload.run_id.clone(), spec.chain.max(1), spec.timeout_seconds, spec.branches);
        tasks.push(tokio::spawn(async move {
            let mut recorder = Recorder::default();
            loop {
                let k = next_session.fetch_add(1, Ordering::Relaxed);
                if k >= sessions {
                    return recorder;
                }
                let session = format!("{run_id}-d{k}");
                for depth in 1..=chain {
                    if created.load(Ordering::Relaxed) >= total {
                        return recorder;
                    }
                    let args = json!({
                        "session_id": session,
                        "description": format!("deadline scale, depth {depth}"),
                        "timeout_seconds": timeout,
                        "budget": 2048,
                    });
                    let at = Instant::now();
                    match client.call_tool(BRANCH_CREATE, args, None).await {
                        Ok(v) if v.get("branch_id").is_some_and(Value::is_string) => {
                            recorder.ok(BRANCH_CREATE, at.elapsed());
                            created.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(v) => {
                            let e =
                                crate::client::CallError::Protocol(format!("no branch_id: {v}"));
                            recorder.error(BRANCH_CREATE, &e);
                            break;
                        }
                        Err(e) => {
                            recorder.error(BRANCH_CREATE, &e);
                            break;
                        }
                    }
                }
            }
        }));
    }
    let mut recorder = Recorder::default();
    for task in tasks {
        recorder.merge(&task.await.context("a creator task failed")?);
    }
    let create_elapsed = started.elapsed();
    let create = recorder.summary(create_elapsed);

    let run = workload.run_id.as_str();
    let db = Inspector::connect(&spec.database_url).await.context("connecting to the database")?;
    let active_after_creation = db.active(run).await?;
    let last_deadline = db.last_deadline(run).await?;
    eprintln!(
        "created {} branches in {:.1} s ({:.0}/s), {active_after_creation} active; waiting for their deadlines",
        create.ok_calls,
        create_elapsed.as_secs_f64(),
        create.calls_per_s
    );

    // Follow the drain until the last deadline plus the grace period.
    let mut active_series = Vec::new();
    let until = last_deadline.unwrap_or_else(chrono::Utc::now)
        + chrono::Duration::from_std(spec.grace).unwrap_or_default();
    loop {
        let active = db.active(run).await?;
        active_series.push((started.elapsed().as_secs_f64(), active));
        if chrono::Utc::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    db.close().await;
    sampler_stop.cancel();
    let process = match sampler {
        Some(task) => task.await.unwrap_or_default(),
        None => Vec::new(),
    };

    let verification = verify(&VerifyOptions {
        database_url: spec.database_url.clone(),
        run_id: workload.run_id.clone(),
        record: None,
        settle: Duration::ZERO,
        max_late: spec.max_late,
        outages: Vec::new(),
        restart_slack: Duration::ZERO,
        logs: Vec::new(),
        whole_database: false,
    })
    .await?;
    Ok(DeadlineReport {
        created: create.ok_calls,
        create_errors: create.error_calls,
        create_seconds: create_elapsed.as_secs_f64(),
        creates_per_s: create.calls_per_s,
        create,
        active_after_creation,
        active_series,
        verification,
        max_rss_kib: process.iter().map(|s| s.rss_kib).max(),
        process,
    })
}
