//! The processes a run measures: starting the gateway and the echo server
//! as child processes, and sampling a process' memory, file descriptors,
//! TCP sockets and threads from `/proc`.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// One reading of a process' resources.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcSample {
    /// Seconds since the sampler started.
    pub t_s: f64,
    /// Resident set size (`VmRSS`), KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// The process' TCP sockets by state (`ESTABLISHED`, `LISTEN`, …).
    pub tcp: BTreeMap<String, u64>,
    /// Established connections accepted on one of its listening ports
    /// (clients), as opposed to those it opened (its database pool).
    pub inbound: u64,
    /// OS threads.
    pub threads: u64,
}

impl ProcSample {
    /// Reads `/proc/<pid>` now.
    pub fn read(pid: u32, t_s: f64) -> std::io::Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let mut fds = 0;
        let mut sockets = HashSet::new();
        for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
            // An fd closed between the listing and the readlink is skipped.
            let Ok(entry) = entry else { continue };
            fds += 1;
            if let Ok(target) = std::fs::read_link(entry.path()) {
                let target = target.to_string_lossy();
                if let Some(inode) =
                    target.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']'))
                {
                    sockets.insert(inode.to_owned());
                }
            }
        }
        // Columns: sl, local address:port, remote, state, …, inode (10th).
        let mut mine = Vec::new();
        for table in ["tcp", "tcp6"] {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split_whitespace().collect();
                if cols.len() > 9 && sockets.contains(cols[9]) {
                    let port = cols[1].rsplit(':').next().unwrap_or_default().to_owned();
                    mine.push((tcp_state(cols[3]), port));
                }
            }
        }
        let listening: HashSet<&str> =
            mine.iter().filter(|(state, _)| *state == "LISTEN").map(|(_, p)| p.as_str()).collect();
        let mut tcp = BTreeMap::new();
        let mut inbound = 0;
        for (state, port) in &mine {
            *tcp.entry((*state).to_owned()).or_default() += 1;
            if *state == "ESTABLISHED" && listening.contains(port.as_str()) {
                inbound += 1;
            }
        }
        Ok(Self { t_s, rss_kib: field("VmRSS:"), fds, tcp, inbound, threads: field("Threads:") })
    }
}

/// CPU time a process has used so far (user and system), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its ')'.
    // utime and stime are fields 14 and 15, the 12th and 13th after it.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / CLOCK_TICKS_PER_SECOND)
}

/// `USER_HZ`, the unit of `/proc` CPU times: 100 on every Linux platform
/// this runs on.
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// The whole machine's CPU time so far: (busy, total) in clock ticks.
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = cpu.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal …
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    let total: u64 = ticks.iter().take(8).sum();
    Some((total - idle, total))
}

/// Who used the CPU while a load ran.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CpuUse {
    /// The target process, in cores (CPU seconds per second).
    pub target_cores: Option<f64>,
    /// The target's CPU time per successful call, microseconds.
    pub target_us_per_call: Option<f64>,
    /// The load generator itself, in cores.
    pub bench_cores: Option<f64>,
    /// The whole machine: busy share of all its cores, percent.
    pub machine_busy_pct: Option<f64>,
}

/// CPU counters at one instant, to be subtracted.
#[derive(Debug, Clone, Copy)]
pub struct CpuMark {
    target: Option<f64>,
    bench: Option<f64>,
    machine: Option<(u64, u64)>,
}

impl CpuMark {
    pub fn now(target: Option<u32>) -> Self {
        Self {
            target: target.and_then(cpu_seconds),
            bench: cpu_seconds(std::process::id()),
            machine: machine_ticks(),
        }
    }

    /// What was used from `self` to `later`, over `seconds`, for `calls`.
    pub fn until(&self, later: &Self, seconds: f64, calls: u64) -> CpuUse {
        let per_s = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / seconds.max(f64::EPSILON));
        let target = later.target.zip(self.target).map(|(b, a)| b - a);
        CpuUse {
            target_cores: per_s(self.target, later.target),
            target_us_per_call: target.filter(|_| calls > 0).map(|t| t * 1e6 / calls as f64),
            bench_cores: per_s(self.bench, later.bench),
            machine_busy_pct: self.machine.zip(later.machine).and_then(|((b0, t0), (b1, t1))| {
                (t1 > t0).then(|| (b1 - b0) as f64 * 100.0 / (t1 - t0) as f64)
            }),
        }
    }
}

/// The names of the kernel's TCP states (`include/net/tcp_states.h`).
fn tcp_state(hex: &str) -> &'static str {
    match hex {
        "01" => "ESTABLISHED",
        "02" => "SYN_SENT",
        "03" => "SYN_RECV",
        "04" => "FIN_WAIT1",
        "05" => "FIN_WAIT2",
        "06" => "TIME_WAIT",
        "07" => "CLOSE",
        "08" => "CLOSE_WAIT",
        "09" => "LAST_ACK",
        "0A" => "LISTEN",
        "0B" => "CLOSING",
        _ => "OTHER",
    }
}

/// How the samples of a series moved.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Drift {
    /// Samples taken after the warm-up.
    pub samples: usize,
    pub first_rss_kib: u64,
    pub last_rss_kib: u64,
    pub min_rss_kib: u64,
    pub max_rss_kib: u64,
    /// `(last - first) / first`, percent.
    pub last_vs_first_pct: f64,
    /// `(max - min) / min`, percent.
    pub max_vs_min_pct: f64,
    pub first_fds: u64,
    pub last_fds: u64,
    pub max_fds: u64,
    /// Client connections.
    pub first_inbound: u64,
    pub last_inbound: u64,
    pub max_inbound: u64,
}

impl Drift {
    /// The drift of the samples taken at or after `after_s`.
    pub fn of(samples: &[ProcSample], after_s: f64) -> Option<Self> {
        let kept: Vec<&ProcSample> = samples.iter().filter(|s| s.t_s >= after_s).collect();
        let (first, last) = (kept.first()?, kept.last()?);
        let rss = kept.iter().map(|s| s.rss_kib);
        let (min, max) = (rss.clone().min()?, rss.max()?);
        let pct =
            |a: u64, b: u64| if b == 0 { 0.0 } else { (a as f64 - b as f64) * 100.0 / b as f64 };
        Some(Self {
            samples: kept.len(),
            first_rss_kib: first.rss_kib,
            last_rss_kib: last.rss_kib,
            min_rss_kib: min,
            max_rss_kib: max,
            last_vs_first_pct: pct(last.rss_kib, first.rss_kib),
            max_vs_min_pct: pct(max, min),
            first_fds: first.fds,
            last_fds: last.fds,
            max_fds: kept.iter().map(|s| s.fds).max().unwrap_or(0),
            first_inbound: first.inbound,
            last_inbound: last.inbound,
            max_inbound: kept.iter().map(|s| s.inbound).max().unwrap_or(0),
        })
    }
}

/// Samples a process every `interval` until `stop` is cancelled; returns
/// the series (the first sample is taken at once, the last when stopped).
pub async fn sample_until(
    pid: u32,
    interval: Duration,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<ProcSample> {
    let started = Instant::now();
    let mut series = Vec::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = ticker.tick() => false,
            () = stop.cancelled() => true,
        };
        // A process that is gone (killed by a fault scenario) has no sample.
        if let Ok(sample) = ProcSample::read(pid, started.elapsed().as_secs_f64()) {
            series.push(sample);
        }
        if stopping {
            return series;
        }
    }
}

/// A child process started by the bench; killed when dropped.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    /// The URL the process announced on its standard output.
    pub url: String,
    pub pid: u32,
    /// Kept alive for as long as the process runs (its config file).
    _dir: Option<tempfile::TempDir>,
}

impl Spawned {
    /// Stops the process with SIGKILL and waits for it.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("stopping a child process")
    }
}

/// Settings of a gateway started by the bench.
#[derive(Debug, Clone)]
pub struct GatewaySpawn {
    /// The `foldgate` binary.
    pub binary: PathBuf,
    pub database_url: String,
    pub jwt_secret: String,
    /// A configuration file to use instead of the bench's own. It must not
    /// set `listen`, `database_url` or the JWT key, which the bench passes.
    pub config: Option<PathBuf>,
    /// TOML added to the bench's own configuration (e.g. `[[upstreams]]`).
    pub extra_toml: String,
    /// Where the gateway's logs (standard error) go.
    pub log: Option<PathBuf>,
    /// The operations listener (`/metrics`); default: any free loopback
    /// port.
    pub ops_listen: Option<String>,
}

/// The configuration the bench gives a gateway it starts: limits high
/// enough that a run measures speed, not limits.
pub const BENCH_GATEWAY_CONFIG: &str = "\
[api.rate_limit]
per_second = 1000000
burst = 1000000

[folding.limits]
max_active_per_session = 1000
max_active_per_tenant = 1000000
max_active_total = 1000000
creations_per_minute = 1000000
";

/// Starts `foldgate serve` on a free loopback port, migrating the database.
pub async fn spawn_gateway(spec: &GatewaySpawn) -> anyhow::Result<Spawned> {
    let dir = tempfile::tempdir()?;
    let config = match &spec.config {
        Some(path) => path.clone(),
        None => {
            let path = dir.path().join("foldgate.toml");
            std::fs::write(&path, format!("{BENCH_GATEWAY_CONFIG}\n{}", spec.extra_toml))?;
            path
        }
    };
    let mut command = Command::new(&spec.binary);
    command
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--ops-listen"])
        .arg(spec.ops_listen.as_deref().unwrap_or("127.0.0.1:0"))
        .arg("--migrate")
        .arg("--database-url")
        .arg(&spec.database_url)
        .arg("--config")
        .arg(&config);
    clear_gateway_environment(&mut command);
    command.env("FOLDGATE_JWT_SECRET", &spec.jwt_secret);
    let stderr = match &spec.log {
        Some(path) => Stdio::from(std::fs::File::create(path)?),
        None => Stdio::null(),
    };
    let mut spawned =
        spawn_announcing(command, stderr, "foldgate is serving MCP at ", &spec.binary).await?;
    spawned._dir = Some(dir);
    Ok(spawned)
}

/// Starts this program's `echo-server` on a free loopback port.
pub async fn spawn_echo_server() -> anyhow::Result<Spawned> {
    let binary = std::env::current_exe().context("locating foldgate-bench")?;
    let mut command = Command::new(&binary);
    command.args(["echo-server", "--listen", "127.0.0.1:0"]);
    spawn_announcing(command, Stdio::null(), crate::ECHO_ANNOUNCEMENT, &binary).await
}

/// The gateway reads every `FOLDGATE_*` variable as a setting and refuses
/// unknown ones, so the child gets none of the caller's (a fault script's
/// own switches, a developer's shell) and only what the bench sets.
fn clear_gateway_environment(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if name_text.starts_with("FOLDGATE_") || name_text == "DATABASE_URL" {
            command.env_remove(&name);
        }
    }
}

/// Spawns `command` and waits (60 s at most) for the line on its standard
/// output that starts with `prefix` and carries the URL.
async fn spawn_announcing(
    mut command: Command,
    stderr: Stdio,
    prefix: &str,
    binary: &Path,
) -> anyhow::Result<Spawned> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr).kill_on_drop(true);
    let mut child = command.spawn().with_context(|| format!("starting {}", binary.display()))?;
    let pid = child.id().context("the child exited at once")?;
    let stdout = child.stdout.take().context("the child's standard output")?;
    let mut lines = BufReader::new(stdout).lines();
    let announced = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(url) = line.strip_prefix(prefix) {
                return Ok::<_, std::io::Error>(Some(url.trim().to_owned()));
            }
        }
        Ok(None)
    })
    .await;
    let url = match announced {
        Ok(Ok(Some(url))) => url,
        Ok(Ok(None)) => {
            let status = child.wait().await?;
            bail!("{} exited ({status}) before it was serving", binary.display());
        }
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => bail!("{} did not start serving within 60 s", binary.display()),
    };
    // Keep draining standard output so the child never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Spawned { child, url, pid, _dir: None })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn this_process_can_be_sampled() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let sample = ProcSample::read(std::process::id(), 0.0).unwrap();
        assert!(sample.rss_kib > 0 && sample.fds > 0 && sample.threads > 0, "{sample:?}");
        assert!(sample.tcp.get("LISTEN").copied().unwrap_or(0) >= 1, "{sample:?}");
        // Both ends are this process': one accepted, one opened.
        assert!(sample.tcp.get("ESTABLISHED").copied().unwrap_or(0) >= 2, "{sample:?}");
        assert!(sample.inbound >= 1, "{sample:?}");
        drop((client, accepted, listener));
    }

    #[test]
    fn cpu_is_accounted() {
        // Spin until /proc shows a tenth of a second of CPU, however busy
        // the machine is.
        let pid = std::process::id();
        let start = CpuMark::now(Some(pid));
        let began = cpu_seconds(pid).unwrap();
        let spin = Instant::now();
        let mut x = 0_u64;
        while cpu_seconds(pid).unwrap() - began < 0.1 && spin.elapsed() < Duration::from_secs(20) {
            for _ in 0..100_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
        }
        assert_ne!(x, 1);
        let seconds = spin.elapsed().as_secs_f64();
        let used = start.until(&CpuMark::now(Some(pid)), seconds, 10);
        let cpu = used.target_cores.unwrap() * seconds;
        assert!(cpu >= 0.09, "{used:?} over {seconds} s");
        let per_call = used.target_us_per_call.unwrap();
        assert!((per_call - cpu * 1e6 / 10.0).abs() < 1.0, "{used:?}");
        assert!(used.machine_busy_pct.is_some_and(|p| p > 0.0), "{used:?}");
    }

    #[test]
    fn drift_after_warm_up() {
        let at = |t_s: f64, rss_kib: u64| ProcSample {
            t_s,
            rss_kib,
            fds: 10,
            tcp: BTreeMap::new(),
            inbound: 0,
            threads: 3,
        };
        let series = [at(0.0, 1000), at(10.0, 2000), at(20.0, 2100), at(30.0, 2200)];
        let d = Drift::of(&series, 10.0).unwrap();
        assert_eq!((d.samples, d.first_rss_kib, d.last_rss_kib), (3, 2000, 2200));
        assert!((d.last_vs_first_pct - 10.0).abs() < 1e-9);
        assert!(Drift::of(&series, 40.0).is_none());
    }
}
