//! Postgres over TLS with a CA of the deployment's own, as a managed
//! Postgres has: a throwaway Postgres cluster on loopback whose server
//! certificate a test CA signed, reached with `sslmode=verify-full` by the
//! `foldgate` command — trusted through `sslrootcert` in the URL, or
//! through the system's trust store (`SSL_CERT_FILE`), and refused with
//! neither.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

const FOLDGATE: &str = env!("CARGO_BIN_EXE_foldgate");

/// Runs a command, failing the test with its output if it fails.
fn run(command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl").args(args).current_dir(dir));
}

/// A test CA, and a server certificate it signed for `localhost` and
/// 127.0.0.1.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=foldgate test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

/// A Postgres cluster of its own, stopped when dropped. `initdb` refuses
/// to run as root, so the cluster is the `postgres` user's.
struct Cluster {
    data: PathBuf,
    port: u16,
}

impl Cluster {
    fn start(dir: &Path) -> Self {
        let as_postgres = |program: &str| {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(pg_bin(program));
            command
        };
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir));
        run(Command::new("chmod").arg("600").arg(dir.join("server.key")));
        let data = dir.join("data");
        run(as_postgres("initdb").args(["-A", "trust", "-U", "postgres", "-D"]).arg(&data));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let settings = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            dir.display(),
            dir.join("server.pem").display(),
            dir.join("server.key").display(),
        );
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str(&settings);
        std::fs::write(&conf, text).unwrap();
        run(as_postgres("pg_ctl")
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(dir.join("postgres.log")));
        Self { data, port }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_bin("pg_ctl"))
            .args(["stop", "-m", "immediate", "-D"])
            .arg(&self.data)
            .output();
    }
}

/// A Postgres server program: on the `PATH`, else in the newest
/// `/usr/lib/postgresql/<version>/bin` (where Debian's packages put them).
fn pg_bin(program: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file());
    if let Some(found) = on_path {
        return found;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin").join(program)))
        })
        .filter(|(_, path)| path.is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, path)| path).unwrap_or_else(|| panic!("no {program}: install Postgres"))
}

fn foldgate(args: &[&str], env: &[(&str, &Path)]) -> Output {
    Command::new(FOLDGATE)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("FOLDGATE_CONFIG")
        .env_remove("SSL_CERT_FILE")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn postgres_with_its_own_ca_is_reached_with_verify_full() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let cluster = Cluster::start(dir.path());
    let url =
        format!("postgres://postgres@localhost:{}/postgres?sslmode=verify-full", cluster.port);
    let ca = dir.path().join("ca.pem");

    // Neither the URL nor the trust store knows the CA: refused.
    let out = foldgate(&["migrate", "--database-url", &url], &[]);
    assert!(!out.status.success(), "an unknown CA was trusted");
    assert!(stderr(&out).to_lowercase().contains("certificate"), "{}", stderr(&out));

    // The CA named in the URL (`sslrootcert`).
    let with_root = format!("{url}&sslrootcert={}", ca.display());
    let out = foldgate(&["migrate", "--database-url", &with_root], &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    // The CA in the system's trust store: here, the bundle `SSL_CERT_FILE`
    // names, as a pod with the deployment's CA mounted would have.
    std::fs::write(dir.path().join("foldgate.toml"), format!("database_url = \"{url}\"\n"))
        .unwrap();
    let config = dir.path().join("foldgate.toml");
    let config = config.to_str().unwrap();
    let out =
        foldgate(&["check-config", "--config", config, "--connect"], &[("SSL_CERT_FILE", &ca)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("reachable, schema current"), "{stdout}");

    drop(cluster);
}
