//! One simulated agent: its clients, its sessions, its loop of calls.

use super::*;

/// One simulated agent.
pub(super) struct Agent {
    pub(super) index: usize,
    pub(super) clients: Vec<McpClient>,
    pub(super) next_client: usize,
    /// Until when each URL is skipped after a transport failure.
    pub(super) ejected: Vec<Option<Instant>>,
    /// Transport failures in a row, per URL.
    pub(super) strikes: Vec<u32>,
    pub(super) shared: Arc<Shared>,
    pub(super) recorder: Recorder,
    /// Sessions opened so far; names the next one.
    pub(super) sessions: u64,
    pub(super) session: String,
}

impl Agent {
    pub(super) fn new_session(&mut self) {
        self.sessions += 1;
        self.session =
            format!("{}-a{}-s{}", self.shared.workload.run_id, self.index, self.sessions);
    }

    /// The client for the next request: round robin over the URLs (or
    /// always the agent's own), skipping one that just refused a
    /// connection, as a load balancer's passive health check would.
    fn pick(&mut self) -> usize {
        let n = self.clients.len();
        if self.shared.workload.balance == Balance::Agent {
            return self.index % n;
        }
        let now = Instant::now();
        for _ in 0..n {
            self.next_client = (self.next_client + 1) % n;
            if self.ejected[self.next_client].is_none_or(|until| until <= now) {
                return self.next_client;
            }
        }
        // Every URL failed lately: try the next one anyway.
        self.next_client
    }

    /// Makes one call, timing and recording it.
    async fn call(
        &mut self,
        tool: &str,
        args: Value,
        meta: Option<Value>,
    ) -> Option<Result<Value, CallError>> {
        let shared = Arc::clone(&self.shared);
        let due = match &shared.pacer {
            Some(pacer) => Some(pacer.next(&shared.stop).await?),
            None => None,
        };
        let slot = self.pick();
        let started = Instant::now();
        let result = self.clients[slot].call_tool(tool, args, meta).await;
        if self.clients.len() > 1 {
            if result.as_ref().is_err_and(CallError::is_transport) {
                // Each failure in a row doubles the time the URL is skipped.
                let strikes = &mut self.strikes[slot];
                *strikes = (*strikes + 1).min(MAX_STRIKES);
                self.ejected[slot] = Some(started + EJECTION * (1 << (*strikes - 1)));
            } else {
                self.strikes[slot] = 0;
            }
        }
        let latency = started.elapsed()
            + due.map_or(Duration::ZERO, |d| started.saturating_duration_since(d));
        let counted = started >= shared.measure_from;
        match &result {
            Ok(_) => {
                if counted {
                    self.recorder.ok(tool, latency);
                }
                shared.live.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if counted {
                    self.recorder.error(tool, e);
                }
                shared.live.errors.fetch_add(1, Ordering::Relaxed);
                if e.is_transport() || matches!(e, CallError::Http { status: 503 | 502, .. }) {
                    tokio::time::sleep(shared.workload.error_backoff).await;
                }
            }
        }
        Some(result)
    }

    fn record(&self, event: &str, branch: &Value, extra: Value) {
        let Some(tx) = &self.shared.record else { return };
        let mut line = json!({
            "event": event,
            "branch_id": branch.get("branch_id"),
            "session_id": self.session,
            "at_ms": chrono::Utc::now().timestamp_millis(),
        });
        if let (Value::Object(line), Value::Object(extra)) = (&mut line, extra) {
            line.extend(extra);
        }
        let _ = tx.send(line.to_string());
    }

    async fn create(
        &mut self,
        description: &str,
        parent: Option<&str>,
    ) -> Option<Result<String, CallError>> {
        let mut args = json!({
            "session_id": self.session,
            "description": description,
            "prompt": "Find where HTTP retries are configured and report the setting.",
            "timeout_seconds": self.shared.workload.branch_timeout,
        });
        if let Some(parent) = parent {
            args["parent_branch_id"] = parent.into();
        }
        if self.shared.workload.inject_memories.is_some() {
            args["inject_memories"] = true.into();
        }
        let created = self.call(BRANCH_CREATE, args, None).await?;
        Some(created.and_then(|v| {
            let id = v.get("branch_id").and_then(Value::as_str).map(str::to_owned);
            match id {
                Some(id) => {
                    self.record(
                        "created",
                        &v,
                        json!({"deadline_at": v.get("deadline_at"), "depth": v.get("depth")}),
                    );
                    Ok(id)
                }
                None => Err(CallError::Protocol(format!(
                    "branch_create answered without a branch_id: {v}"
                ))),
            }
        }))
    }

    async fn return_branch(&mut self, id: &str) -> Option<Result<Value, CallError>> {
        let args = json!({
            "branch_id": id,
            "message": "Retries are set in config/http.rs: 3 attempts with exponential backoff.",
        });
        let returned = self.call(BRANCH_RETURN, args, None).await?;
        if let Ok(v) = &returned {
            self.record("returned", v, json!({"status": v.get("status")}));
        }
        Some(returned)
    }

    pub(super) async fn run(mut self) -> Recorder {
        match self.shared.workload.mode {
            Mode::Fold => self.fold().await,
            Mode::Status => self.status().await,
            Mode::Proxy => self.proxy().await,
            Mode::ProxyOutside => {
                let tool = self.shared.workload.proxy_tool.clone();
                self.plain_calls(&tool).await;
            }
            Mode::Echo => {
                let tool = self.shared.workload.echo_tool.clone();
                self.plain_calls(&tool).await;
            }
        }
        self.recorder
    }

    async fn fold(&mut self) {
        let mut in_session = 0;
        while self.shared.claim() {
            let cycle = self.shared.cycles.fetch_add(1, Ordering::Relaxed) + 1;
            if in_session >= self.shared.workload.cycles_per_session {
                if self.call(SESSION_END, json!({"session_id": self.session}), None).await.is_none()
                {
                    return;
                }
                self.new_session();
                in_session = 0;
            }
            in_session += 1;
            match self.fold_cycle(cycle).await {
                None => return,
                Some(Ok(completed)) => {
                    if self.shared.measure_from <= Instant::now() {
                        if completed {
                            self.recorder.cycles += 1;
                        } else {
                            self.recorder.abandoned += 1;
                        }
                    }
                    if !completed {
                        self.new_session();
                        in_session = 0;
                    }
                }
                // A failed step leaves branches behind (their deadlines end
                // them); the next cycle starts in a clean session.
                Some(Err(_)) => {
                    self.new_session();
                    in_session = 0;
                }
            }
        }
    }

    /// One fold cycle; `Ok(false)` when it was deliberately abandoned.
    async fn fold_cycle(&mut self, cycle: u64) -> Option<Result<bool, CallError>> {
        let parent = match self.create("Investigate the retry configuration", None).await? {
            Ok(id) => id,
            Err(e) => return Some(Err(e)),
        };
        if let Err(e) = self.call(BRANCH_STATUS, json!({"branch_id": parent}), None).await? {
            return Some(Err(e));
        }
        let child = match self.create("Read config/http.rs", None).await? {
            Ok(id) => id,
            Err(e) => return Some(Err(e)),
        };
        if self
            .shared
            .workload
            .abandon_every
            .is_some_and(|n| n > 0 && cycle.is_multiple_of(u64::from(n)))
        {
            return Some(Ok(false));
        }
        if let Err(e) = self.return_branch(&child).await? {
            return Some(Err(e));
        }
        if let Err(e) = self.return_branch(&parent).await? {
            return Some(Err(e));
        }
        Some(Ok(true))
    }

    /// Opens the branch that status and proxy modes work against, retrying
    /// until it exists or the run is over.
    async fn open_branch(&mut self) -> Option<String> {
        while !self.shared.over() {
            self.new_session();
            match self.create("Long-running investigation", None).await? {
                Ok(id) => return Some(id),
                Err(_) => tokio::time::sleep(self.shared.workload.error_backoff).await,
            }
        }
        None
    }

    async fn status(&mut self) {
        let Some(branch) = self.open_branch().await else { return };
        while self.shared.claim() {
            if self.call(BRANCH_STATUS, json!({"branch_id": branch}), None).await.is_none() {
                return;
            }
        }
    }

    async fn proxy(&mut self) {
        let tool = self.shared.workload.proxy_tool.clone();
        let per_branch = self.shared.workload.calls_per_branch.max(1);
        let Some(mut branch) = self.open_branch().await else { return };
        let mut calls = 0;
        while self.shared.claim() {
            let meta = json!({ BRANCH_META_KEY: branch });
            let args = json!({"text": "GET /api/v1/config HTTP/1.1 — 200 OK, 412 bytes"});
            let Some(result) = self.call(&tool, args, Some(meta)).await else { return };
            calls += 1;
            // A refused call may mean the branch ran out of budget: start a
            // fresh one, as an agent would.
            if calls >= per_branch || result.is_err() {
                if result.is_ok() && self.return_branch(&branch).await.is_none() {
                    return;
                }
                let Some(next) = self.open_branch().await else { return };
                branch = next;
                calls = 0;
            }
        }
    }

    /// Calls `tool` with the echo arguments and no branch.
    async fn plain_calls(&mut self, tool: &str) {
        while self.shared.claim() {
            let args = json!({"text": "GET /api/v1/config HTTP/1.1 — 200 OK, 412 bytes"});
            if self.call(tool, args, None).await.is_none() {
                return;
            }
        }
    }
}
