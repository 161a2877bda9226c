//! `foldgate migrate` against real databases.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::process::Command;

use foldgate_testkit::{Backend, TestDb};

const FOLDGATE: &str = env!("CARGO_BIN_EXE_foldgate");

fn migrate(url: &str) -> std::process::Output {
    Command::new(FOLDGATE).args(["migrate", "--database-url", url]).output().unwrap()
}

#[tokio::test]
async fn migrates_a_new_sqlite_file_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("new.db").display());
    for run in 0..2 {
        let out = migrate(&url);
        assert!(out.status.success(), "run {run}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(dir.path().join("new.db").exists());
}

#[tokio::test]
async fn migrates_postgres_and_the_store_is_ready() {
    let db = TestDb::new(Backend::Postgres).await;
    let out = migrate(&db.url);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let store = db.connect().await;
    store.ready().await.unwrap();
    store.close().await;
    db.cleanup().await;
}

#[test]
fn refuses_an_unknown_database_without_printing_its_password() {
    let out = migrate("mysql://root:hunter2@localhost/db");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unsupported database URL"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[test]
fn reports_an_unreachable_database() {
    let out = migrate("postgres://postgres@127.0.0.1:1/nothing");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("migrating postgres://postgres@127.0.0.1:1/nothing"), "{stderr}");
}
