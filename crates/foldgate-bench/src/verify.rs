//! Checks a run's outcome against the database (Postgres): no branch the
//! clients saw created is missing, none ended twice, every deadline fired
//! in time, and the books (pools and concurrency counters) balance.
//!
//! A branch that ended twice would release its parent's loan and its
//! tenant's slot twice, so the pool and counter checks catch a double
//! termination even where no log line would; the gateway's own log lines
//! (one per return and per forced return) are counted too when given.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    time::Duration,
};

use anyhow::Context;
use chrono::{DateTime, Utc};
use foldgate_store::inspect::{BranchEnd as Row, Inspector, LoanMismatch};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::stats::Spread;

/// How many example ids a failed check lists.
const EXAMPLES: usize = 5;

/// What to check.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub database_url: String,
    /// Branches of tenants whose id starts with `<run_id>-` are checked.
    pub run_id: String,
    /// The JSON-lines record written by the load run (`--record`).
    pub record: Option<PathBuf>,
    /// Branches whose deadline falls within this time are waited for (up
    /// to it, plus `max_late`) before the checks.
    pub settle: Duration,
    /// Latest a deadline may fire.
    pub max_late: Duration,
    /// Periods when no gateway ran (`start`, `end` = when the replacement
    /// was ready): deadlines that fell inside must fire within
    /// `restart_slack` of `end`.
    pub outages: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    pub restart_slack: Duration,
    /// Gateway log files (JSON lines) to look for duplicate terminal events.
    pub logs: Vec<PathBuf>,
    /// The database holds nothing but this run: also check the
    /// deployment-wide counter.
    pub whole_database: bool,
}

/// The outcome of the checks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verification {
    pub branches_in_db: u64,
    pub by_status: BTreeMap<String, u64>,
    pub recorded_created: usize,
    pub lost: usize,
    pub lost_examples: Vec<String>,
    pub recorded_returned: usize,
    /// Returns the client saw succeed whose branch is not `completed`.
    pub returns_not_kept: usize,
    pub returns_not_kept_examples: Vec<String>,
    /// Active branches whose deadline passed more than `max_late` ago.
    pub overdue_active: u64,
    /// Deadlines fired (reason `deadline_exceeded`).
    pub fired: usize,
    /// Lateness of branches that ended at or after their deadline (fired,
    /// or ended with an ancestor that was), while a gateway ran,
    /// milliseconds.
    pub lateness_ms: Option<Spread>,
    pub late: usize,
    pub late_examples: Vec<String>,
    /// Fired before their deadline.
    pub early: usize,
    /// Deadlines that fell inside an outage, and how long after the
    /// replacement was ready they fired (milliseconds).
    pub fired_after_outage: usize,
    pub after_outage_ms: Option<Spread>,
    pub late_after_outage: usize,
    /// Tenants whose active-branch counter differs from their active
    /// branches.
    pub tenant_counter_mismatches: Vec<String>,
    /// (counter, active branches) of the whole deployment, when checked.
    pub deployment_counter: Option<(i64, i64)>,
    /// Branches and sessions whose `reserved` differs from the budgets of
    /// their active children.
    pub pool_mismatches: Vec<String>,
    /// Branches with more than one terminal event in the logs.
    pub duplicate_terminal_events: usize,
    pub duplicate_examples: Vec<String>,
    pub terminal_events_in_logs: usize,
    pub failures: Vec<String>,
}

impl Verification {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs every check.
pub async fn verify(options: &VerifyOptions) -> anyhow::Result<Verification> {
    let db = Inspector::connect(&options.database_url)
        .await
        .context("connecting to the database to verify")?;
    let run = options.run_id.as_str();

    // Let the branches that fall due within the settle time end first (the
    // supervisor may still be working through a burst), then count those
    // still active past their deadline.
    let max_late = options.max_late.as_secs_f64();
    let bound = Utc::now() + chrono::Duration::from_std(options.settle).unwrap_or_default();
    let give_up = tokio::time::Instant::now() + options.settle + options.max_late;
    loop {
        let pending = db.active_due(run, bound).await?;
        if pending == 0 || tokio::time::Instant::now() >= give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let overdue = db.active_overdue(run, options.max_late).await?;
    let overdue_active = u64::try_from(overdue).unwrap_or(0);

    let rows = db.branch_ends(run).await?;
    let mut by_status = BTreeMap::new();
    let mut status_of = HashMap::with_capacity(rows.len());
    for row in &rows {
        let key = match &row.reason {
            Some(reason) => format!("{}/{reason}", row.status),
            None => row.status.clone(),
        };
        *by_status.entry(key).or_insert(0) += 1;
        status_of.insert(row.id, row.status.as_str());
    }

    let mut v = Verification {
        branches_in_db: rows.len() as u64,
        by_status,
        overdue_active,
        ..Verification::default()
    };

    if let Some(path) = &options.record {
        check_record(&mut v, path, &status_of)?;
    }
    check_deadlines(&mut v, &rows, options);
    check_books(&mut v, &db, run, options.whole_database).await?;
    if !options.logs.is_empty() {
        check_logs(&mut v, &options.logs)?;
    }

    if v.lost > 0 {
        v.failures
            .push(format!("{} branches the clients saw created are not in the database", v.lost));
    }
    if v.returns_not_kept > 0 {
        v.failures.push(format!(
            "{} branches the clients returned successfully are not completed",
            v.returns_not_kept
        ));
    }
    if v.overdue_active > 0 {
        v.failures.push(format!(
            "{} branches are still active more than {} s after their deadline",
            v.overdue_active, max_late
        ));
    }
    if v.late > 0 {
        v.failures.push(format!("{} deadlines fired more than {} s late", v.late, max_late));
    }
    if v.early > 0 {
        v.failures.push(format!("{} deadlines fired early", v.early));
    }
    if v.late_after_outage > 0 {
        v.failures.push(format!(
            "{} deadlines that passed during an outage fired more than {} s after the restart",
            v.late_after_outage,
            options.restart_slack.as_secs_f64()
        ));
    }
    if !v.tenant_counter_mismatches.is_empty() {
        v.failures.push(format!(
            "tenant counters disagree with active branches: {:?}",
            v.tenant_counter_mismatches
        ));
    }
    if let Some((counter, active)) = v.deployment_counter
        && counter != active
    {
        v.failures.push(format!("deployment counter {counter} but {active} active branches"));
    }
    if !v.pool_mismatches.is_empty() {
        v.failures.push(format!("token pools out of balance: {:?}", v.pool_mismatches));
    }
    if v.duplicate_terminal_events > 0 {
        v.failures.push(format!(
            "{} branches were ended more than once in the logs",
            v.duplicate_terminal_events
        ));
    }
    db.close().await;
    Ok(v)
}

fn parse_branch_id(raw: &str) -> Option<Uuid> {
    raw.strip_prefix("br_").and_then(|u| Uuid::parse_str(u).ok())
}

/// Every branch the clients saw created exists; every branch they saw
/// returned is `completed`.
fn check_record(
    v: &mut Verification,
    path: &PathBuf,
    status_of: &HashMap<Uuid, &str>,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut created = HashSet::new();
    let mut returned = HashSet::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let event: Value = serde_json::from_str(line)
            .with_context(|| format!("{}: not a JSON line: {line}", path.display()))?;
        let Some(id) = event.get("branch_id").and_then(Value::as_str).and_then(parse_branch_id)
        else {
            continue;
        };
        match event.get("event").and_then(Value::as_str) {
            Some("created") => {
                created.insert(id);
            }
            Some("returned")
                if event.get("status").and_then(Value::as_str) == Some("completed") =>
            {
                returned.insert(id);
            }
            _ => {}
        }
    }
    v.recorded_created = created.len();
    v.recorded_returned = returned.len();
    let mut lost: Vec<String> = created
        .iter()
        .filter(|id| !status_of.contains_key(id))
        .map(|id| format!("br_{id}"))
        .collect();
    lost.sort();
    v.lost = lost.len();
    v.lost_examples = lost.into_iter().take(EXAMPLES).collect();
    let mut not_kept: Vec<String> = returned
        .iter()
        .filter(|id| status_of.get(id).is_some_and(|s| *s != "completed"))
        .map(|id| format!("br_{id} ({})", status_of.get(id).copied().unwrap_or("?")))
        .collect();
    not_kept.sort();
    v.returns_not_kept = not_kept.len();
    v.returns_not_kept_examples = not_kept.into_iter().take(EXAMPLES).collect();
    Ok(())
}

/// Deadlines fired in time: within `max_late` while a gateway ran, within
/// `restart_slack` of the restart for those that fell in an outage.
fn check_deadlines(v: &mut Verification, rows: &[Row], options: &VerifyOptions) {
    let max_late_ms = options.max_late.as_secs_f64() * 1000.0;
    let slack_ms = options.restart_slack.as_secs_f64() * 1000.0;
    let mut lateness = Vec::new();
    let mut after_outage = Vec::new();
    let mut late = Vec::new();
    // A branch that ended after its deadline, for whatever reason, was due
    // and must have ended in time; one the deadline ended must not have
    // ended early.
    for row in rows {
        let Some(completed) = row.completed_at else { continue };
        let fired = row.reason.as_deref() == Some("deadline_exceeded");
        if !fired && completed <= row.deadline_at {
            continue;
        }
        v.fired += usize::from(fired);
        let late_ms =
            (completed - row.deadline_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
        // A deadline just before an outage may not have fired when the
        // gateway died: it counts as one of the outage's.
        let outage = options.outages.iter().find(|(start, end)| {
            row.deadline_at >= *start - chrono::Duration::milliseconds(max_late_ms as i64)
                && row.deadline_at <= *end
        });
        if let Some((_, end)) = outage {
            let since_ms =
                (completed - *end).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
            after_outage.push(since_ms);
            if since_ms > slack_ms {
                v.late_after_outage += 1;
            }
            continue;
        }
        lateness.push(late_ms);
        if fired && late_ms < -1.0 {
            v.early += 1;
        }
        if late_ms > max_late_ms {
            late.push(format!("br_{} {late_ms:.0} ms", row.id));
        }
    }
    v.lateness_ms = Spread::of(&lateness);
    v.fired_after_outage = after_outage.len();
    v.after_outage_ms = Spread::of(&after_outage);
    v.late = late.len();
    v.late_examples = late.into_iter().take(EXAMPLES).collect();
}

/// Pools and concurrency counters agree with the active branches.
async fn check_books(
    v: &mut Verification,
    db: &Inspector,
    run: &str,
    whole_database: bool,
) -> anyhow::Result<()> {
    v.tenant_counter_mismatches = db
        .tenant_counters(run)
        .await?
        .into_iter()
        .filter(|(_, counter, active)| counter != active)
        .map(|(tenant, counter, active)| format!("{tenant}: counter {counter}, active {active}"))
        .collect();
    if whole_database {
        v.deployment_counter = Some(db.deployment_counter().await?);
    }
    v.pool_mismatches = db
        .loan_mismatches(run)
        .await?
        .into_iter()
        .map(|mismatch| match mismatch {
            LoanMismatch::Branch { id, reserved, lent } => {
                format!("branch br_{id}: reserved {reserved}, lent {lent}")
            }
            LoanMismatch::Session { tenant, session, reserved, lent } => {
                format!("session {tenant}/{session}: reserved {reserved}, lent {lent}")
            }
        })
        .collect();
    Ok(())
}

/// Counts the gateway's terminal log events per branch ("branch returned",
/// "branch force-returned"): each branch ends at most once.
fn check_logs(v: &mut Verification, logs: &[PathBuf]) -> anyhow::Result<()> {
    let mut seen: HashMap<String, u32> = HashMap::new();
    for path in logs {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines() {
            // Only JSON log lines carry fields; anything else is skipped.
            let Ok(event) = serde_json::from_str::<Value>(line) else { continue };
            let fields = event.get("fields");
            let message = fields.and_then(|f| f.get("message")).and_then(Value::as_str);
            if !matches!(message, Some("branch returned" | "branch force-returned")) {
                continue;
            }
            if let Some(id) = fields.and_then(|f| f.get("branch_id")).and_then(Value::as_str) {
                *seen.entry(id.to_owned()).or_default() += 1;
            }
        }
    }
    v.terminal_events_in_logs = seen.values().map(|n| *n as usize).sum();
    let mut dups: Vec<String> =
        seen.into_iter().filter(|(_, n)| *n > 1).map(|(id, n)| format!("{id} ×{n}")).collect();
    dups.sort();
    v.duplicate_terminal_events = dups.len();
    v.duplicate_examples = dups.into_iter().take(EXAMPLES).collect();
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn row(deadline_ms: i64, completed_ms: i64) -> Row {
        let t = |ms| DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
        Row {
            id: Uuid::nil(),
            status: "timeout".into(),
            reason: Some("deadline_exceeded".into()),
            deadline_at: t(deadline_ms),
            completed_at: Some(t(completed_ms)),
        }
    }

    #[test]
    fn deadlines_are_judged_against_outages() {
        let t = |ms| DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
        let options = VerifyOptions {
            database_url: String::new(),
            run_id: "r".into(),
            record: None,
            settle: Duration::ZERO,
            max_late: Duration::from_secs(1),
            outages: vec![(t(10_000), t(20_000))],
            restart_slack: Duration::from_secs(5),
            logs: vec![],
            whole_database: false,
        };
        let rows = [
            row(1_000, 1_200),   // on time
            row(2_000, 3_500),   // 1.5 s late
            row(5_000, 4_000),   // early
            row(12_000, 21_000), // in the outage, 1 s after the restart
            row(15_000, 27_000), // in the outage, 7 s after the restart
        ];
        let mut v = Verification::default();
        check_deadlines(&mut v, &rows, &options);
        assert_eq!((v.fired, v.late, v.early), (5, 1, 1));
        assert_eq!((v.fired_after_outage, v.late_after_outage), (2, 1));
    }

    #[test]
    fn duplicate_terminal_events_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        let line = |msg: &str, id: &str| {
            format!(r#"{{"level":"INFO","fields":{{"message":"{msg}","branch_id":"{id}"}}}}"#)
        };
        std::fs::write(
            &log,
            [
                line("branch created", "br_1"),
                line("branch returned", "br_1"),
                line("branch force-returned", "br_2"),
                line("branch force-returned", "br_2"),
                "not json".into(),
            ]
            .join("\n"),
        )
        .unwrap();
        let mut v = Verification::default();
        check_logs(&mut v, &[log]).unwrap();
        assert_eq!((v.terminal_events_in_logs, v.duplicate_terminal_events), (3, 1));
        assert_eq!(v.duplicate_examples, vec!["br_2 ×2"]);
    }
}
