//! One server process: started with a clean environment and its limits,
//! its stdout read line by line for answers and for the server's own
//! requests and notifications, its stderr logged, and stopped in order.

use std::{
    collections::HashMap,
    process::Stdio,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    process::{Child, ChildStderr, ChildStdin, ChildStdout, Command},
    sync::oneshot,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use foldgate_background::Activator;

use super::Spec;
use crate::{
    client::{CallError, PROTOCOL_VERSION, result_of},
    notice::Listener,
};

/// How long a process has to exit once its stdin is closed before it is
/// killed.
const GRACE: Duration = Duration::from_secs(2);
/// The longest line of stderr logged; the rest of a longer one is dropped.
const STDERR_LINE: usize = 4096;
/// The most of a stray stdout line (not JSON-RPC) that is logged.
const STRAY_SHOWN: usize = 200;

/// A running server process.
#[derive(Debug)]
pub(super) struct Process {
    pid: Option<u32>,
    tenant: Option<String>,
    shared: Arc<Shared>,
    started: Instant,
    /// Asks the watcher to stop the process in order.
    stop: CancellationToken,
    /// Cancelled once the process is gone and its requests have failed.
    gone: CancellationToken,
}

/// What the process's tasks and its requests share.
#[derive(Debug)]
struct Shared {
    upstream: String,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    state: Mutex<State>,
    next_id: AtomicU64,
    in_flight: AtomicUsize,
    /// Cancelled when the process's stdio is of no more use (stdout ended
    /// or unreadable, stdin unwritable): the watcher stops it.
    unusable: CancellationToken,
    /// Set off when the server says its tool list changed.
    list_changed: Activator,
}

#[derive(Debug)]
struct State {
    /// Requests waiting for their answers, by id.
    pending: HashMap<u64, oneshot::Sender<Value>>,
    /// Where the notifications about a request go, by its id.
    listeners: HashMap<u64, Listener>,
    /// Why no request can be made any more.
    closed: Option<String>,
    last_used: Instant,
}

impl Process {
    /// Starts the server and does the MCP handshake.
    pub async fn start(
        spec: &Spec,
        tenant: Option<&str>,
        live: &Arc<AtomicUsize>,
    ) -> Result<Arc<Self>, CallError> {
        let mut child = command(spec).spawn().map_err(|e| {
            CallError::Unavailable(format!("could not start {:?}: {e}", spec.program))
        })?;
        let pid = child.id();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(CallError::Unavailable("the server process has no stdio pipes".into()));
        };
        live.fetch_add(1, Ordering::Relaxed);
        let unusable = CancellationToken::new();
        let shared = Arc::new(Shared {
            upstream: spec.upstream.clone(),
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            state: Mutex::new(State {
                pending: HashMap::new(),
                listeners: HashMap::new(),
                closed: None,
                last_used: Instant::now(),
            }),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            unusable: unusable.clone(),
            list_changed: spec.list_changed.clone(),
        });
        let stop = CancellationToken::new();
        let gone = CancellationToken::new();
        let tenant_shown = tenant.unwrap_or("-").to_owned();
        tokio::spawn(read_stdout(Arc::clone(&shared), stdout, spec.max_bytes));
        tokio::spawn(log_stderr(spec.upstream.clone(), tenant_shown.clone(), pid, stderr));
        tokio::spawn(watch(
            child,
            Arc::clone(&shared),
            [stop.clone(), unusable],
            gone.clone(),
            Arc::clone(live),
        ));
        tracing::info!(upstream = %spec.upstream, tenant = %tenant_shown, pid,
            "started a stdio upstream process");
        let process = Arc::new(Self {
            pid,
            tenant: tenant.map(str::to_owned),
            shared,
            started: Instant::now(),
            stop,
            gone,
        });
        // Dropped on failure: the watcher stops it.
        process.initialize().await.map_err(|e| match e {
            CallError::Unavailable(why) => {
                CallError::Unavailable(format!("the MCP handshake failed: {why}"))
            }
            CallError::Rpc { code, message, .. } => {
                CallError::Unavailable(format!("the MCP handshake failed: error {code}: {message}"))
            }
        })?;
        Ok(process)
    }

    async fn initialize(&self) -> Result<(), CallError> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "foldgate", "version": env!("CARGO_PKG_VERSION")},
        });
        let result = self.request("initialize", params).await?;
        if result.get("protocolVersion").and_then(Value::as_str).is_none() {
            return Err(CallError::Unavailable(
                "initialize answered without a protocol version".into(),
            ));
        }
        self.shared.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await
    }

    /// Sends a request and waits for its answer (or for the process to go
    /// away); the `result`.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, CallError> {
        self.try_request(method, params, None).await.map_err(Failed::into_error)
    }

    /// As [`Process::request`], telling a request that never reached the
    /// process (it had gone already) from one that did; the server's
    /// notifications about it go to `listener`.
    pub async fn try_request(
        &self,
        method: &str,
        params: Value,
        listener: Option<&Listener>,
    ) -> Result<Value, Failed> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        // MCP forbids cancelling `initialize`.
        let _busy = Busy::new(&self.shared, id, method != "initialize");
        {
            let mut state = self.shared.state();
            if let Some(why) = &state.closed {
                return Err(Failed::NotSent(CallError::Unavailable(why.clone())));
            }
            state.pending.insert(id, answer);
            if let Some(listener) = listener {
                state.listeners.insert(id, listener.clone());
            }
        }
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.shared.send(&message).await.map_err(Failed::NotSent)?;
        match answered.await {
            Ok(response) => result_of(response, id).map_err(Failed::Sent),
            Err(_) => Err(Failed::Sent(CallError::Unavailable(
                self.exited().unwrap_or_else(|| "the server process went away".to_owned()),
            ))),
        }
    }

    /// Why the process can take no more requests, once it cannot.
    pub fn exited(&self) -> Option<String> {
        self.shared.state().closed.clone()
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or("-")
    }

    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// How long since it last answered or was sent a request.
    pub fn idle(&self) -> Duration {
        self.shared.state().last_used.elapsed()
    }

    pub fn lived(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops the process in order and waits until it is gone.
    pub async fn stop(&self) {
        self.stop.cancel();
        self.gone.cancelled().await;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Why a request failed.
#[derive(Debug)]
pub(super) enum Failed {
    /// It was not written: the process had gone (or was going) already.
    NotSent(CallError),
    /// It was written; no answer came, or an error did.
    Sent(CallError),
}

impl Failed {
    pub fn into_error(self) -> CallError {
        match self {
            Self::NotSent(e) | Self::Sent(e) => e,
        }
    }
}

/// A request in flight: counted, and its waiter removed when it ends
/// (answered, failed or abandoned at the timeout). One abandoned
/// unanswered is cancelled (`notifications/cancelled`), so that the server
/// stops working on it and says nothing more of it that could be taken for
/// another request's.
struct Busy {
    shared: Arc<Shared>,
    id: u64,
    cancellable: bool,
}

impl Busy {
    fn new(shared: &Arc<Shared>, id: u64, cancellable: bool) -> Self {
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        Self { shared: Arc::clone(shared), id, cancellable }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        let unanswered = state.pending.remove(&self.id).is_some() && state.closed.is_none();
        state.listeners.remove(&self.id);
        state.last_used = Instant::now();
        drop(state);
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        if unanswered
            && self.cancellable
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let shared = Arc::clone(&self.shared);
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": self.id, "reason": "the gateway stopped waiting"}});
            runtime.spawn(async move {
                if let Err(e) = shared.send(&cancel).await {
                    tracing::debug!(upstream = %shared.upstream, error = %e,
                        "could not cancel a request to a stdio upstream");
                }
            });
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes one message, as a line, to the process's stdin.
    async fn send(&self, message: &Value) -> Result<(), CallError> {
        let mut line = serde_json::to_vec(message)
            .map_err(|e| CallError::Unavailable(format!("unwritable request: {e}")))?;
        line.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(CallError::Unavailable("the server process is stopping".into()));
        };
        let written = async {
            pipe.write_all(&line).await?;
            pipe.flush().await
        };
        written.await.map_err(|e| {
            let why = format!("could not write to the server process: {e}");
            self.close(why.clone());
            self.unusable.cancel();
            CallError::Unavailable(why)
        })
    }

    /// No more requests: every waiting one fails with `why`.
    fn close(&self, why: String) {
        let mut state = self.state();
        state.closed.get_or_insert(why);
        // Dropping the senders wakes the waiters, which read `closed`.
        state.pending.clear();
        state.listeners.clear();
    }

    /// One line of the process's stdout.
    fn receive(self: &Arc<Self>, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(line) else {
            let shown = String::from_utf8_lossy(&line[..line.len().min(STRAY_SHOWN)]).into_owned();
            tracing::warn!(upstream = %self.upstream, line = %shown,
                "a stdio upstream wrote a line that is not a JSON-RPC message; it was ignored");
            return;
        };
        let method = message.get("method").and_then(Value::as_str);
        match (method, message.get("id")) {
            (Some(method), Some(id)) => self.answer_request(method, id.clone()),
            (Some(method), None) => self.notified(method, message.get("params")),
            (None, Some(id)) => {
                let waiting = id.as_u64().and_then(|id| {
                    let mut state = self.state();
                    // Nothing more is told of an answered request.
                    state.listeners.remove(&id);
                    state.pending.remove(&id)
                });
                match waiting {
                    // The waiter may have given up (timeout): nothing to do.
                    Some(waiter) => drop(waiter.send(Value::Object(message))),
                    None => tracing::debug!(upstream = %self.upstream, %id,
                        "a stdio upstream answered a request that no longer waits"),
                }
            }
            (None, None) => tracing::warn!(upstream = %self.upstream,
                "a stdio upstream wrote a message that is neither a request nor an answer"),
        }
    }

    /// Answers a request of the server's: `ping`, and nothing else. The
    /// answer is written by a task of its own, so that reading goes on
    /// while the process's stdin is busy.
    fn answer_request(self: &Arc<Self>, method: &str, id: Value) {
        let reply = if method == "ping" {
            json!({"jsonrpc": "2.0", "id": id, "result": {}})
        } else {
            json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32601,
                "message": format!("foldgate does not answer {method:?} from an upstream"),
            }})
        };
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = shared.send(&reply).await {
                tracing::debug!(upstream = %shared.upstream, error = %e,
                    "could not answer a stdio upstream's request");
            }
        });
    }

    /// Where the server's notifications arrive. A tool list change sets
    /// off the refresher; progress goes to the request whose token it
    /// names; a log message, which names no request, goes to the request in
    /// flight if there is only one (the process serves one tenant, but not
    /// one agent); anything else is only traced.
    fn notified(&self, method: &str, params: Option<&Value>) {
        tracing::trace!(upstream = %self.upstream, method, ?params,
            "a stdio upstream's notification");
        let listener = {
            let state = self.state();
            match method {
                "notifications/progress" => {
                    state.listeners.values().find(|l| l.is_mine(method, params)).cloned()
                }
                // The one request still waiting for its answer, not one
                // answered whose caller has not yet woken.
                "notifications/message" if state.pending.len() == 1 => {
                    state.pending.keys().next().and_then(|id| state.listeners.get(id)).cloned()
                }
                _ => None,
            }
        };
        if method == "notifications/tools/list_changed" {
            self.list_changed.activate();
        } else if let Some(listener) = listener {
            listener.offer(method, params);
        }
    }
}

/// The process to start: the program (under `/bin/sh`, which sets the
/// resource limits first and then becomes it, if limits are set), with
/// nothing of the gateway's environment but `PATH`, in a process group of
/// its own.
fn command(spec: &Spec) -> Command {
    let mut limits = Vec::new();
    if let Some(bytes) = spec.max_memory {
        // KiB, for `ulimit -v`.
        limits.push(format!("ulimit -v {}", bytes / 1024));
    }
    if let Some(seconds) = spec.max_cpu {
        limits.push(format!("ulimit -t {seconds}"));
    }
    let mut command = if limits.is_empty() {
        let mut command = Command::new(&spec.program);
        command.args(&spec.args);
        command
    } else {
        // `$0` is the program, `$@` its arguments: nothing is interpreted.
        let script = format!("{} || exit 126; exec \"$0\" \"$@\"", limits.join(" && "));
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(script).arg(&spec.program).args(&spec.args);
        command
    };
    command.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    command.envs(spec.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    command
}

/// Reads answers, requests and notifications until stdout closes or a line
/// is too long; then has the process stopped (`unusable`).
async fn read_stdout(shared: Arc<Shared>, stdout: ChildStdout, max_bytes: usize) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        match read_line(&mut reader, &mut line, max_bytes).await {
            Ok(Some(false)) => shared.receive(&line),
            Ok(Some(true)) => {
                shared.close(format!(
                    "the server process wrote a message longer than max_response_bytes \
                     ({max_bytes}); it is stopped"
                ));
                break;
            }
            // The watcher gives the reason (the exit status).
            Ok(None) => break,
            Err(e) => {
                shared.close(format!("could not read the server process's stdout: {e}"));
                break;
            }
        }
    }
    shared.unusable.cancel();
}

/// Logs each line of stderr, tagged with the upstream and tenant.
async fn log_stderr(upstream: String, tenant: String, pid: Option<u32>, stderr: ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    while let Ok(Some(cut)) = read_line(&mut reader, &mut line, STDERR_LINE).await {
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\r');
        tracing::info!(target: "foldgate::upstream::stderr", upstream = %upstream,
            tenant = %tenant, pid, cut, "{text}");
    }
}

/// Waits for the process to exit, or stops it when asked (`stop`) or when
/// its stdout is of no more use (`unusable`): closes its stdin, gives it
/// [`GRACE`] to exit, then kills it. Then kills whatever it left in its
/// process group and fails the requests still waiting.
async fn watch(
    mut child: Child,
    shared: Arc<Shared>,
    [stop, unusable]: [CancellationToken; 2],
    gone: CancellationToken,
    live: Arc<AtomicUsize>,
) {
    let pid = child.id();
    let exited = tokio::select! {
        status = child.wait() => Some(status),
        () = stop.cancelled() => None,
        () = unusable.cancelled() => None,
    };
    let status = match exited {
        Some(status) => status,
        None => stop_in_order(&mut child, &shared, pid).await,
    };
    kill_group(pid);
    let why = match status {
        Ok(status) if stop.is_cancelled() => format!("the server process was stopped ({status})"),
        Ok(status) => format!("the server process exited ({status})"),
        Err(e) => format!("the server process could not be waited for: {e}"),
    };
    shared.close(why);
    live.fetch_sub(1, Ordering::Relaxed);
    gone.cancel();
}

/// Closes the process's stdin, gives it [`GRACE`] to exit, then kills it.
async fn stop_in_order(
    child: &mut Child,
    shared: &Shared,
    pid: Option<u32>,
) -> std::io::Result<std::process::ExitStatus> {
    {
        if let Ok(mut stdin) = tokio::time::timeout(GRACE, shared.stdin.lock()).await {
            stdin.take();
        }
    }
    match tokio::time::timeout(GRACE, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            kill_group(pid);
            child.wait().await
        }
    }
}

/// Kills the process group `pid` leads (the process and what it started).
fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else { return };
    // It may be gone already (ESRCH): nothing to kill.
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
}

/// Reads one line into `line` (without its end), keeping at most `max`
/// bytes of it; `Some(true)` if it was longer, `None` at the end of the
/// stream.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut cut = false;
    let mut any = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let (take, consumed, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(at) => (at, at + 1, true),
            None => (chunk.len(), chunk.len(), false),
        };
        let room = max.saturating_sub(line.len());
        if take > room {
            cut = true;
        }
        line.extend_from_slice(&chunk[..take.min(room)]);
        reader.consume(consumed);
        if done {
            return Ok(Some(cut));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_read_within_a_bound() {
        let input: &[u8] = b"short\n0123456789abcdef\r\nlast";
        let mut reader = BufReader::with_capacity(4, input);
        let mut line = Vec::new();
        assert_eq!(read_line(&mut reader, &mut line, 10).await.unwrap(), Some(false));
        assert_eq!(line, b"short");
        assert_eq!(read_line(&mut reader, &mut line, 10).await.unwrap(), Some(true));
        assert_eq!(line, b"0123456789", "the first bytes of a long line");
        assert_eq!(read_line(&mut reader, &mut line, 10).await.unwrap(), Some(false));
        assert_eq!(line, b"last", "the last line needs no end");
        assert_eq!(read_line(&mut reader, &mut line, 10).await.unwrap(), None);
    }
}
