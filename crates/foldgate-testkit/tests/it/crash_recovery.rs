//! A process using the engine is killed with SIGKILL; a new process on the
//! same database fires on startup every deadline that passed meanwhile.

use std::{
    collections::HashMap,
    process::Stdio,
    time::{Duration, Instant},
};

use foldgate_domain::{BranchId, BranchStatus, EndReason};
use foldgate_testkit::{Backend, TestDb, active_counters};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
};

const DRILL: &str = env!("CARGO_BIN_EXE_foldgate-drill");

async fn crash_and_recover(backend: Backend) {
    let db = TestDb::new(backend).await;

    let mut victim = Command::new(DRILL)
        .args(["--database-url", &db.url, "create", "--sessions", "3"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(victim.stdout.take().unwrap()).lines();
    let mut trees = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line == "ready" {
            break;
        }
        let ids: Vec<BranchId> = line.split(' ').map(|s| BranchId::parse(s).unwrap()).collect();
        trees.push((ids[0], ids[1], ids[2]));
    }
    assert_eq!(trees.len(), 3, "the drill created its branches");
    let killed_at = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(victim.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    victim.wait().await.unwrap();

    // Let the 1 s deadlines pass while no process runs.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let output =
        Command::new(DRILL).args(["--database-url", &db.url, "supervise"]).output().await.unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let recovered_in = killed_at.elapsed();
    let fired: HashMap<BranchId, String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (id, reason) = l.split_once(' ').unwrap();
            (BranchId::parse(id).unwrap(), reason.to_owned())
        })
        .collect();

    let store = db.connect().await;
    let tenant = foldgate_domain::TenantId::parse("acme").unwrap();
    for (a, b, c) in &trees {
        assert_eq!(
            fired.get(a).map(String::as_str),
            Some("deadline_exceeded"),
            "A fired on startup"
        );
        assert_eq!(
            fired.get(c).map(String::as_str),
            Some("budget_exhausted"),
            "C finished on startup"
        );
        assert_eq!(
            fired.get(b).map(String::as_str),
            Some("deadline_exceeded"),
            "B shares A's deadline"
        );
        let a = store.branch(&tenant, *a).await.unwrap().unwrap();
        let b = store.branch(&tenant, *b).await.unwrap().unwrap();
        let c = store.branch(&tenant, *c).await.unwrap().unwrap();
        assert_eq!(
            (a.status, a.reason),
            (BranchStatus::Timeout, Some(EndReason::DeadlineExceeded))
        );
        assert_eq!(
            (b.status, b.reason),
            (BranchStatus::Timeout, Some(EndReason::DeadlineExceeded))
        );
        assert_eq!((c.status, c.reason), (BranchStatus::Timeout, Some(EndReason::BudgetExhausted)));
        assert!(b.completed_at <= a.completed_at, "the child ended first");
    }
    assert_eq!(active_counters(&db, "acme").await, (0, 0));
    println!("{backend:?}: recovered {} branches {recovered_in:?} after the kill", fired.len());
    store.close().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_recovery() {
    crash_and_recover(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_crash_recovery() {
    crash_and_recover(Backend::Sqlite).await;
}
