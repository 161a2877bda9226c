//! Retention: the reconciler that deletes what ended long ago, in bounded
//! batches, so that the database stops growing without stalling folding.

use std::{future::Future, time::Duration};

use chrono::{DateTime, Utc};
use foldgate_domain::duration::{self, Renamed};
use foldgate_store::StoreError;
use serde::{Deserialize, Serialize};

use crate::{FoldError, FoldingService};

/// How long what has ended is kept (`[retention]`); zero keeps it forever.
/// A bare number counts days.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// How long an ended branch tree is kept (from when its depth-1 branch
    /// ended), with its call traces, run and steps.
    #[serde(alias = "branches_days", deserialize_with = "duration::days")]
    pub branches: Duration,
    /// How long an ended session with no branch left is kept.
    #[serde(alias = "sessions_days", deserialize_with = "duration::days")]
    pub sessions: Duration,
    /// How long an audit entry is kept.
    #[serde(alias = "audit_days", deserialize_with = "duration::days")]
    pub audit: Duration,
    /// How long daily usage is kept (the usage reports' source).
    #[serde(alias = "usage_days", deserialize_with = "duration::days")]
    pub usage: Duration,
    /// Rows (for branches: trees) deleted per statement.
    pub batch_size: u32,
    /// Most batches of each kind per pass; the rest waits for the next.
    pub max_batches: u32,
    /// Time between two passes. A bare number counts seconds.
    #[serde(alias = "interval_seconds", deserialize_with = "duration::seconds")]
    pub interval: Duration,
}

const DAY: Duration = Duration::from_secs(24 * 3600);

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            branches: 30 * DAY,
            sessions: 30 * DAY,
            audit: 365 * DAY,
            usage: Duration::ZERO,
            batch_size: 500,
            max_batches: 200,
            interval: Duration::from_secs(300),
        }
    }
}

/// The longest a retention may be, short of forever: longer cannot be
/// subtracted from a date.
const LONGEST_KEPT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl RetentionConfig {
    /// The former names of its settings.
    pub const RENAMED: &'static [Renamed] = &[
        Renamed::new("branches_days", "branches"),
        Renamed::new("sessions_days", "sessions"),
        Renamed::new("audit_days", "audit"),
        Renamed::new("usage_days", "usage"),
        Renamed::new("interval_seconds", "interval"),
    ];

    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        for (name, kept) in [
            ("branches", self.branches),
            ("sessions", self.sessions),
            ("audit", self.audit),
            ("usage", self.usage),
        ] {
            duration::check_range(
                &format!("retention {name}"),
                kept,
                Duration::ZERO,
                LONGEST_KEPT,
            )?;
        }
        if !(1..=10_000).contains(&self.batch_size) {
            return Err("retention batch_size must be between 1 and 10000".into());
        }
        if self.max_batches == 0 {
            return Err("retention max_batches must be at least 1".into());
        }
        duration::check_range(
            "retention interval",
            self.interval,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )?;
        Ok(())
    }
}

/// The shortest pause between two batches, so that the folding path's
/// transactions (on SQLite, its one writer) get the database in between;
/// the pause is otherwise as long as the batch took.
const MIN_PAUSE: Duration = Duration::from_millis(20);

/// What one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub trees: u64,
    pub branches: u64,
    pub calls: u64,
    pub runs: u64,
    pub steps: u64,
    pub sessions: u64,
    pub audit_entries: u64,
    pub usage_lines: u64,
}

/// Before when what ended is deleted; `None`: kept forever.
fn cutoff(now: DateTime<Utc>, kept: Duration) -> Option<DateTime<Utc>> {
    if kept.is_zero() {
        return None;
    }
    // A validated retention is at most a century; a longer one keeps all.
    let kept = chrono::Duration::from_std(kept).ok()?;
    now.checked_sub_signed(kept)
}

/// Runs `step` (one batch) until a batch deletes fewer than `batch_size`
/// rows (`size` says how many it deleted) or `max_batches` ran, pausing
/// between batches as long as the batch took; returns each batch's result.
async fn in_batches<T, Fut>(
    config: &RetentionConfig,
    mut step: impl FnMut() -> Fut,
    size: impl Fn(&T) -> u64,
) -> Result<Vec<T>, FoldError>
where
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut done = Vec::new();
    for _ in 0..config.max_batches {
        let started = tokio::time::Instant::now();
        let result = step().await?;
        let full = size(&result) >= u64::from(config.batch_size);
        done.push(result);
        if !full {
            break;
        }
        // As long as the batch took: retention keeps the database busy at
        // most half the time, leaving the rest to folding.
        tokio::time::sleep(started.elapsed().max(MIN_PAUSE)).await;
    }
    Ok(done)
}

impl FoldingService {
    /// One retention pass: each kind batch by batch, oldest first, until
    /// a batch comes back short or `max_batches` ran.
    pub async fn prune(&self, config: &RetentionConfig) -> Result<Pruned, FoldError> {
        let store = self.store();
        let now = self.clock().now();
        let batch = config.batch_size;
        let mut pruned = Pruned::default();
        if let Some(before) = cutoff(now, config.branches) {
            let step = || store.prune_trees(before, batch);
            for trees in in_batches(config, step, |t| t.trees).await? {
                pruned.trees += trees.trees;
                pruned.branches += trees.branches;
                pruned.calls += trees.calls;
                pruned.runs += trees.runs;
                pruned.steps += trees.steps;
            }
        }
        let rows = |n: &u64| *n;
        if let Some(before) = cutoff(now, config.sessions) {
            let step = || store.prune_sessions(before, batch);
            pruned.sessions = in_batches(config, step, rows).await?.iter().sum();
        }
        if let Some(before) = cutoff(now, config.audit) {
            let step = || store.prune_audit(before, batch);
            pruned.audit_entries = in_batches(config, step, rows).await?.iter().sum();
        }
        if let Some(before) = cutoff(now, config.usage) {
            let step = || store.prune_usage(before.date_naive(), batch);
            pruned.usage_lines = in_batches(config, step, rows).await?.iter().sum();
        }
        if pruned != Pruned::default() {
            tracing::info!(?pruned, "retention deleted what ended long ago");
        }
        Ok(pruned)
    }
}
