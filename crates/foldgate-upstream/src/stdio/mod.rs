//! Upstreams run as child processes that speak MCP over stdio
//! (newline-delimited JSON-RPC on their stdin and stdout).
//!
//! Each tenant has processes of its own, never shared with another tenant:
//! a pool of at most `max_processes` per tenant, started on first use, with
//! requests multiplexed over each process by their ids. Tool discovery has
//! a process of its own, which serves no tenant's calls. A process unused
//! for `idle_timeout` is stopped ([`StdioClient::reap_idle`]); one that
//! died is started again by the next call, at once the first time and then
//! after a wait that doubles with each failure in a row (calls during the
//! wait fail at once). At shutdown every process is stopped
//! ([`StdioClient::stop_all`]): its stdin is closed, and it is killed if it
//! has not exited a little later.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use foldgate_background::Activator;
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::{
    client::{CallError, call_params, list_pages},
    notice::Listener,
};

mod process;

use process::{Failed, Process};

/// The wait before the second start in a row of a process that failed;
/// it doubles with each further failure.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait before a process is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A process that ran this long before it died is restarted without a wait.
const STABLE: Duration = Duration::from_secs(30);

/// How to run an upstream's server, resolved from its configuration.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The upstream's name (for the log).
    pub upstream: String,
    pub program: String,
    pub args: Vec<String>,
    /// The whole environment of the process.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// `RLIMIT_AS`, bytes.
    pub max_memory: Option<u64>,
    /// `RLIMIT_CPU`, whole seconds.
    pub max_cpu: Option<u64>,
    /// Bounds each request, the start of a process included.
    pub timeout: Duration,
    /// The longest line read from the process's stdout.
    pub max_bytes: usize,
    pub idle_timeout: Duration,
    pub max_processes: usize,
    /// Set off when a process says the tool list changed.
    pub list_changed: Activator,
}

/// One stdio upstream's processes.
#[derive(Debug)]
pub(crate) struct StdioClient {
    spec: Arc<Spec>,
    /// Lists the tools; serves no tenant.
    discovery: Arc<Pool>,
    /// Each tenant's own processes.
    tenants: Mutex<HashMap<String, Arc<Pool>>>,
    /// Processes running now.
    live: Arc<AtomicUsize>,
}

impl StdioClient {
    pub fn new(spec: Spec) -> Self {
        Self {
            spec: Arc::new(spec),
            discovery: Arc::new(Pool::new(None, 1)),
            tenants: Mutex::default(),
            live: Arc::default(),
        }
    }

    /// Every tool the server lists, from the discovery process.
    pub async fn list_tools(&self) -> Result<Vec<Value>, CallError> {
        list_pages(|params| self.request(&self.discovery, "tools/list", params, None)).await
    }

    /// Calls a tool in one of `tenant`'s processes; the raw `result`. The
    /// process's notifications about the call go to `listener`.
    pub async fn call_tool(
        &self,
        tenant: &str,
        name: &str,
        arguments: Option<&Map<String, Value>>,
        meta: Option<&Map<String, Value>>,
        listener: Option<&Listener>,
    ) -> Result<Value, CallError> {
        let pool = self.pool(tenant);
        self.request(&pool, "tools/call", call_params(name, arguments, meta), listener).await
    }

    /// A request to a process of `pool` (started if need be), within the
    /// upstream's `timeout`.
    async fn request(
        &self,
        pool: &Pool,
        method: &str,
        params: Value,
        listener: Option<&Listener>,
    ) -> Result<Value, CallError> {
        let work = async {
            let process = pool.acquire(&self.spec, &self.live).await?;
            match process.try_request(method, params.clone(), listener).await {
                // The process died before the request left, unnoticed yet:
                // once more, on another (nothing reached the server).
                Err(Failed::NotSent(_)) => {
                    let process = pool.acquire(&self.spec, &self.live).await?;
                    process.try_request(method, params, listener).await.map_err(Failed::into_error)
                }
                answered => answered.map_err(Failed::into_error),
            }
        };
        tokio::time::timeout(self.spec.timeout, work).await.unwrap_or_else(|_| {
            Err(CallError::Unavailable(format!(
                "no answer within {} s",
                self.spec.timeout.as_secs_f64()
            )))
        })
    }

    fn pool(&self, tenant: &str) -> Arc<Pool> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let pool = tenants.entry(tenant.to_owned()).or_insert_with(|| {
            Arc::new(Pool::new(Some(tenant.to_owned()), self.spec.max_processes))
        });
        Arc::clone(pool)
    }

    fn pools(&self) -> Vec<Arc<Pool>> {
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        std::iter::once(Arc::clone(&self.discovery)).chain(tenants.values().cloned()).collect()
    }

    /// Stops the processes unused for `idle_timeout` (and forgets those
    /// that died); how many run afterwards.
    pub async fn reap_idle(&self) -> usize {
        let mut idle = Vec::new();
        for pool in self.pools() {
            idle.extend(pool.take(Some(self.spec.idle_timeout)).await);
        }
        for process in &idle {
            tracing::info!(upstream = %self.spec.upstream, tenant = process.tenant(),
                pid = process.pid(), "stopping an idle stdio upstream process");
        }
        stop_each(idle).await;
        self.live()
    }

    /// Stops every process, each in order (stdin closed, killed if it
    /// lingers), all at once.
    pub async fn stop_all(&self) {
        let mut all = Vec::new();
        for pool in self.pools() {
            all.extend(pool.take(None).await);
        }
        stop_each(all).await;
    }

    /// Processes running now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The pids of `tenant`'s processes (`None`: the discovery process).
    pub async fn pids(&self, tenant: Option<&str>) -> Vec<u32> {
        let pool = match tenant {
            None => Arc::clone(&self.discovery),
            Some(t) => match self.tenants.lock().unwrap_or_else(PoisonError::into_inner).get(t) {
                Some(pool) => Arc::clone(pool),
                None => return Vec::new(),
            },
        };
        pool.slots
            .lock()
            .await
            .iter()
            .filter_map(|s| s.process.as_ref())
            .filter(|p| p.exited().is_none())
            .filter_map(|p| p.pid())
            .collect()
    }
}

async fn stop_each(processes: Vec<Arc<Process>>) {
    let mut stopping = tokio::task::JoinSet::new();
    for process in processes {
        stopping.spawn(async move { process.stop().await });
    }
    while stopping.join_next().await.is_some() {}
}

/// One tenant's processes (or the discovery process).
#[derive(Debug)]
struct Pool {
    tenant: Option<String>,
    /// One per process it may run; a start holds the lock (starts of one
    /// pool happen one at a time).
    slots: tokio::sync::Mutex<Vec<Slot>>,
}

#[derive(Debug, Default)]
struct Slot {
    process: Option<Arc<Process>>,
    /// Failures in a row (a start that failed, a process that died soon).
    failures: u32,
    /// No start before then.
    retry_at: Option<Instant>,
    last_error: Option<String>,
}

impl Slot {
    fn failed(&mut self, why: String, lived: Option<Duration>) {
        if lived.is_some_and(|l| l >= STABLE) {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        let wait = backoff(self.failures);
        self.retry_at = (!wait.is_zero()).then(|| Instant::now() + wait);
        self.last_error = Some(why);
        self.process = None;
    }
}

/// The wait before a start after `failures` failures in a row: none after
/// the first, then 1 s, 2 s, 4 s… up to [`MAX_BACKOFF`].
fn backoff(failures: u32) -> Duration {
    match failures {
        0 | 1 => Duration::ZERO,
        n => FIRST_BACKOFF.saturating_mul(1 << (n - 2).min(16)).min(MAX_BACKOFF),
    }
}

impl Pool {
    fn new(tenant: Option<String>, size: usize) -> Self {
        Self {
            tenant,
            slots: tokio::sync::Mutex::new((0..size.max(1)).map(|_| Slot::default()).collect()),
        }
    }

    /// A process to send a request to: an idle one, else a new one if the
    /// pool has room, else the least busy.
    async fn acquire(
        &self,
        spec: &Arc<Spec>,
        live: &Arc<AtomicUsize>,
    ) -> Result<Arc<Process>, CallError> {
        let mut slots = self.slots.lock().await;
        let tenant = self.tenant.as_deref().unwrap_or("-");
        for slot in slots.iter_mut() {
            if let Some(process) = &slot.process
                && let Some(why) = process.exited()
            {
                tracing::warn!(upstream = %spec.upstream, tenant, pid = process.pid(),
                    error = %why, "a stdio upstream process died; the next call starts another");
                let lived = process.lived();
                slot.failed(why, Some(lived));
            }
        }
        let least_busy =
            slots.iter().filter_map(|s| s.process.as_ref()).min_by_key(|p| p.in_flight()).cloned();
        if let Some(process) = &least_busy
            && process.in_flight() == 0
        {
            return Ok(Arc::clone(process));
        }
        let now = Instant::now();
        let free =
            slots.iter_mut().find(|s| s.process.is_none() && s.retry_at.is_none_or(|at| at <= now));
        if let Some(slot) = free {
            match Process::start(spec, self.tenant.as_deref(), live).await {
                Ok(process) => {
                    slot.process = Some(Arc::clone(&process));
                    slot.retry_at = None;
                    return Ok(process);
                }
                Err(e) => {
                    tracing::warn!(upstream = %spec.upstream, tenant, error = %e,
                        "a stdio upstream process could not be started");
                    slot.failed(e.to_string(), None);
                    if least_busy.is_none() {
                        return Err(e);
                    }
                }
            }
        }
        if let Some(process) = least_busy {
            return Ok(process);
        }
        let waiting = slots
            .iter()
            .filter_map(|s| s.retry_at.map(|at| (at, s.last_error.as_deref())))
            .min_by_key(|(at, _)| *at);
        let (at, why) = waiting.unwrap_or((now, None));
        Err(CallError::Unavailable(format!(
            "the server process failed ({}); it is started again in {:.1} s",
            why.unwrap_or("no reason given"),
            at.saturating_duration_since(now).as_secs_f64()
        )))
    }

    /// Takes the processes out of the pool: those idle for `idle` (and
    /// those that died), or all of them (`None`).
    async fn take(&self, idle: Option<Duration>) -> Vec<Arc<Process>> {
        let mut slots = self.slots.lock().await;
        let mut taken = Vec::new();
        for slot in slots.iter_mut() {
            let Some(process) = slot.process.clone() else { continue };
            if let Some(why) = process.exited() {
                slot.failed(why, Some(process.lived()));
                taken.push(process);
            } else if idle.is_none_or(|idle| process.in_flight() == 0 && process.idle() >= idle) {
                *slot = Slot::default();
                taken.push(process);
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_up_to_a_bound() {
        assert_eq!(backoff(1), Duration::ZERO, "the first restart is at once");
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(2));
        assert_eq!(backoff(6), Duration::from_secs(16));
        assert_eq!(backoff(7), Duration::from_secs(32));
        assert_eq!(backoff(8), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
        let mut slot = Slot::default();
        slot.failed("x".into(), None);
        slot.failed("y".into(), None);
        assert_eq!(slot.failures, 2);
        assert!(slot.retry_at.is_some());
        slot.failed("z".into(), Some(STABLE));
        assert_eq!(slot.failures, 1, "a process that ran long enough starts the count again");
        assert!(slot.retry_at.is_none());
    }
}
