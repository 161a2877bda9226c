//! The `foldgate` command as a process: `migrate` against real databases, and `serve` stopping on SIGTERM.

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

#[test]
fn migrates_the_database_the_configuration_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("from-file.db");
    let file = dir.path().join("foldgate.toml");
    // An upstream whose credential is not set here: `migrate` calls no
    // upstream, so it does not need it.
    std::fs::write(
        &file,
        format!(
            "database_url = \"sqlite://{}\"\n[[upstreams]]\nname = \"files\"\n\
             url = \"http://127.0.0.1:1/mcp\"\n[upstreams.headers]\n\
             Authorization = \"Bearer ${{FOLDGATE_TEST_UNSET_TOKEN}}\"\n",
            db.display()
        ),
    )
    .unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(FOLDGATE)
        .args(["migrate", "--config"])
        .arg(&file)
        .current_dir(cwd.path())
        .env_remove("DATABASE_URL")
        .env_remove("FOLDGATE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(db.exists(), "the file's database is migrated");
    assert!(!cwd.path().join("foldgate.db").exists(), "not ./foldgate.db");

    // The flag wins over the file; a bad file is an error naming it.
    let flagged = dir.path().join("flag.db");
    let out = Command::new(FOLDGATE)
        .args(["migrate", "--config"])
        .arg(&file)
        .arg("--database-url")
        .arg(format!("sqlite://{}", flagged.display()))
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(flagged.exists());
    std::fs::write(&file, "database_url = 5\n").unwrap();
    let out = Command::new(FOLDGATE)
        .args(["migrate", "--config"])
        .arg(&file)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("database_url"), "{stderr}");
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

#[test]
fn serve_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, first, _output) = crate::spawn_serve(|c| {
        c.current_dir(dir.path());
    });
    assert!(first.starts_with("foldgate is serving MCP at http://127.0.0.1:"), "{first}");
    assert!(dir.path().join("foldgate.db").exists(), "zero-config uses ./foldgate.db");

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(15), "did not stop");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
}
