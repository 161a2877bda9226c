//! Stdio upstreams: the gateway's upstream registry running a real MCP
//! server (`foldgate-stdio-upstream`, rmcp over stdio) as child processes,
//! calls made through the one metered path.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use foldgate_background::{Driver, Running};
use foldgate_domain::{Caller, Principal, TenantId};
use foldgate_engine::{CallTarget, CreateBranch, FoldingService};
use foldgate_testkit::{ServiceBuilder, TestDb, principal, upstream::LEAKED};
use foldgate_upstream::{
    Lookup, UpstreamConfig, UpstreamMetrics, Upstreams,
    meter::{self, Answer, METERING_META_KEY, UpstreamCall},
    notice::{self, Notice, Relay},
};
use nix::{sys::signal, unistd::Pid};
use serde_json::{Value, json};

const SERVER: &str = env!("CARGO_BIN_EXE_foldgate-stdio-upstream");

/// An agent of a tenant with every scope.
struct Agent(Principal);

impl Caller for Agent {
    fn tenant(&self) -> &TenantId {
        &self.0.tenant
    }

    fn has_scope(&self, _scope: &str) -> bool {
        true
    }
}

fn agent(tenant: &str) -> Agent {
    Agent(principal(tenant, "alice"))
}

/// The probe server as upstream `probe`, with `extra` settings.
fn probe(extra: &str) -> UpstreamConfig {
    parse(&format!("name = \"probe\"\ncommand = [{SERVER:?}]\nrefresh_interval = 1\n{extra}"))
}

fn parse(src: &str) -> UpstreamConfig {
    #[derive(serde::Deserialize)]
    struct One {
        upstreams: Vec<UpstreamConfig>,
    }
    let one: One = toml::from_str(&format!("[[upstreams]]\n{src}")).unwrap();
    one.upstreams.into_iter().next().unwrap()
}

struct Gateway {
    upstreams: Arc<Upstreams>,
    service: Arc<FoldingService>,
    driver: Running,
    db: TestDb,
}

impl Gateway {
    /// The registry with `config`, its background tasks running, once the
    /// tools are listed; `${VAR}`s resolve from `vars`.
    async fn start(config: UpstreamConfig, vars: &'static [(&'static str, &'static str)]) -> Self {
        let env = |var: &str| vars.iter().find(|(k, _)| *k == var).map(|(_, v)| (*v).to_owned());
        let upstreams = Upstreams::new(&[config], env, &UpstreamMetrics::noop(), None).unwrap();
        let mut driver = Driver::new(&opentelemetry::global::meter("stdio-test"));
        upstreams.register(&mut driver);
        let driver = driver.start();
        let db = TestDb::sqlite().await;
        let service = ServiceBuilder::new(db.connect().await).build();
        let gateway = Self { upstreams, service, driver, db };
        gateway.until(|g| g.upstreams.tools_for(&agent("acme")).len() == 11, "tools listed").await;
        gateway
    }

    async fn until(&self, done: impl Fn(&Self) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(self) {
            assert!(Instant::now() < deadline, "{what}: not within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Calls `probe__<tool>` for `tenant` outside branches; the result's
    /// text and whether it is an error.
    async fn call(&self, tenant: &str, tool: &str, args: Value) -> (String, bool) {
        self.call_in(tenant, tool, args, &CallTarget::Outside(None)).await
    }

    async fn call_in(
        &self,
        tenant: &str,
        tool: &str,
        args: Value,
        target: &CallTarget,
    ) -> (String, bool) {
        let result = self.call_raw(tenant, tool, args, target).await;
        let text = result["content"][0]["text"].as_str().unwrap_or_default().to_owned();
        (text, result["isError"] == json!(true))
    }

    async fn call_raw(&self, tenant: &str, tool: &str, args: Value, target: &CallTarget) -> Value {
        let who = agent(tenant);
        let Lookup::Found(upstream, tool) = self.upstreams.lookup(&who, &format!("probe__{tool}"))
        else {
            panic!("probe__{tool} is not found");
        };
        let call = UpstreamCall {
            upstream: &upstream,
            tool: &tool,
            arguments: args.as_object(),
            scopes: &BTreeSet::new(),
            meta: None,
            relay: None,
        };
        match meter::call(&self.service, &who.0, target, call).await.unwrap() {
            Answer::Result(result) => serde_json::to_value(result).unwrap(),
            Answer::Error(e) => panic!("a JSON-RPC error: {e:?}"),
        }
    }

    /// Calls `probe__report` for `tenant` asking for progress and for log
    /// messages at `debug` or above; the result and the notices relayed.
    async fn report(&self, tenant: &str) -> (Value, Vec<Notice>) {
        let who = agent(tenant);
        let Lookup::Found(upstream, tool) = self.upstreams.lookup(&who, "probe__report") else {
            panic!("probe__report is not found");
        };
        let (sink, mut notices) = tokio::sync::mpsc::channel(notice::QUEUE);
        let call = UpstreamCall {
            upstream: &upstream,
            tool: &tool,
            arguments: None,
            scopes: &BTreeSet::new(),
            meta: None,
            relay: Some(Relay { sink: &sink, progress: true, min_log: Some("info") }),
        };
        let outside = CallTarget::Outside(None);
        let Answer::Result(result) =
            meter::call(&self.service, &who.0, &outside, call).await.unwrap()
        else {
            panic!("a JSON-RPC error");
        };
        let got = std::iter::from_fn(|| notices.try_recv().ok()).collect();
        (serde_json::to_value(result).unwrap(), got)
    }

    async fn whoami(&self, tenant: &str) -> (u32, u64) {
        let (text, error) = self.call(tenant, "whoami", json!({})).await;
        assert!(!error, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        (v["pid"].as_u64().unwrap() as u32, v["calls"].as_u64().unwrap())
    }

    /// Waits until the gateway no longer counts `pid` among acme's live
    /// processes.
    async fn until_gone(&self, pid: u32) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.pids(Some("acme")).await.contains(&pid) {
            assert!(Instant::now() < deadline, "the gateway still counts {pid} after 20 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn pids(&self, tenant: Option<&str>) -> Vec<u32> {
        let upstream = self.upstreams.snapshot()[0].clone();
        let tenant = tenant.map(|t| TenantId::parse(t).unwrap());
        upstream.process_ids(tenant.as_ref()).await
    }

    async fn stop(self) {
        self.driver.shutdown().await;
        self.upstreams.stop_processes().await;
        assert_eq!(self.upstreams.processes(), vec![("probe".to_owned(), 0)]);
        self.db.cleanup().await;
    }
}

/// Whether a process of this id exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's closing parenthesis.
    stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
}

fn kill(pid: u32) {
    signal::kill(Pid::from_raw(pid as i32), signal::SIGKILL).unwrap();
}

#[tokio::test]
async fn a_stdio_upstream_is_listed_called_and_metered_into_a_branch() {
    let gw = Gateway::start(probe(""), &[]).await;
    let names: Vec<String> =
        gw.upstreams.tools_for(&agent("acme")).iter().map(|t| t.name.to_string()).collect();
    assert!(names.contains(&"probe__echo".to_owned()) && names.contains(&"probe__exit".to_owned()));
    assert_eq!(gw.call("acme", "echo", json!({"text": "hello"})).await, ("hello".into(), false));

    // Charged to a branch of the caller's.
    let who = principal("acme", "alice");
    let req =
        CreateBranch::parse(gw.service.config(), "s1", "look", None, Some(5000), None, None, None)
            .unwrap();
    let branch = gw.service.create(&who, req).await.unwrap().branch;
    let target = gw.service.call_target(&who, Some(branch.id)).await.unwrap();
    let text = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let result = gw.call_raw("acme", "echo", json!({"text": text}), &target).await;
    assert_eq!(result["content"][0]["text"], json!(text));
    let report = &result["_meta"][METERING_META_KEY];
    assert_eq!(report["branch_id"], json!(branch.id.to_string()), "{report}");
    let tokens_out = report["tokens_out"].as_u64().unwrap();
    assert!(tokens_out >= 180, "{report}");
    let store = gw.db.connect().await;
    let stored = store.branch(&who.tenant, branch.id).await.unwrap().unwrap();
    assert!(stored.ledger.used >= tokens_out, "{:?}", stored.ledger);

    // The server's own requests are answered: ping, and an error for
    // anything else; its notifications are read and set aside.
    let (asked, error) = gw.call("acme", "ask", json!({})).await;
    assert!(!error, "{asked}");
    assert!(asked.starts_with("ping answered; roots refused"), "{asked}");
    let (_, calls) = gw.whoami("acme").await;
    assert_eq!(calls, 4, "one process served the tenant's calls");
    gw.stop().await;
}

#[tokio::test]
async fn each_tenant_has_processes_of_its_own() {
    let gw = Gateway::start(probe("max_processes = 2"), &[]).await;
    let discovery = gw.pids(None).await;
    assert_eq!(discovery.len(), 1, "the listing's own process");
    let (acme, n) = gw.whoami("acme").await;
    assert_eq!(n, 1);
    let (globex, n) = gw.whoami("globex").await;
    assert_eq!(n, 1, "a process that served no other tenant");
    assert!(acme != globex && !discovery.contains(&acme) && !discovery.contains(&globex));
    assert_eq!(gw.whoami("acme").await, (acme, 2));
    assert_eq!(gw.pids(Some("acme")).await, vec![acme]);
    assert_eq!(gw.pids(Some("globex")).await, vec![globex]);

    // Concurrent calls of one tenant: a second process, up to the pool's
    // size, and never another tenant's.
    let calls = (0..4).map(|_| gw.call("acme", "sleep", json!({"ms": 400})));
    for (text, error) in futures::future::join_all(calls).await {
        assert_eq!((text.as_str(), error), ("slept", false));
    }
    let acme_pids = gw.pids(Some("acme")).await;
    assert_eq!(acme_pids.len(), 2, "{acme_pids:?}");
    assert!(!acme_pids.contains(&globex) && !acme_pids.iter().any(|p| discovery.contains(p)));
    assert_eq!(gw.upstreams.processes(), vec![("probe".to_owned(), 4)]);
    gw.stop().await;
    for pid in acme_pids.iter().chain([&globex]).chain(&discovery) {
        assert!(!alive(*pid), "{pid} is stopped at shutdown");
    }
}

#[tokio::test]
async fn a_process_that_dies_is_restarted_and_its_calls_fail_at_once() {
    let gw = Gateway::start(probe("timeout = 60"), &[]).await;
    let (first, _) = gw.whoami("acme").await;
    kill(first);
    // Once the gateway has seen it die, the next call starts another
    // process (a call made before that is in flight on the dead one, and
    // fails, as below).
    gw.until(|_| !alive(first), "the killed process is gone").await;
    gw.until_gone(first).await;
    let (second, calls) = gw.whoami("acme").await;
    assert_ne!(first, second);
    assert_eq!(calls, 1, "a fresh process");

    // A call in flight when its process dies fails with why, at once.
    let started = Instant::now();
    let (sleeping, killing) =
        tokio::join!(gw.call("acme", "sleep", json!({"ms": 30_000})), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            kill(second);
        });
    let (text, error) = sleeping;
    assert!(error, "{text}");
    assert!(text.contains("unavailable") && text.contains("signal: 9"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let () = killing;

    // A second failure in a row: the restart waits, and calls meanwhile
    // fail at once.
    let (text, error) = gw.call("acme", "echo", json!({"text": "soon"})).await;
    assert!(error && text.contains("started again in"), "{text}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    gw.until(|g| g.upstreams.health()[0].1, "the upstream is up again").await;
    assert_eq!(gw.call("acme", "echo", json!({"text": "back"})).await, ("back".into(), false));

    // A process that exits during a call.
    let (text, error) = gw.call("acme", "exit", json!({})).await;
    assert!(error && text.contains("exit status: 3"), "{text}");
    gw.stop().await;
}

#[tokio::test]
async fn idle_processes_are_stopped() {
    let gw = Gateway::start(probe("idle_timeout = 1"), &[]).await;
    let (pid, _) = gw.whoami("acme").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) || !gw.pids(Some("acme")).await.is_empty() {
        assert!(Instant::now() < deadline, "the idle process is still running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (again, calls) = gw.whoami("acme").await;
    assert!(again != pid && calls == 1, "started again on use");
    gw.stop().await;
}

#[tokio::test]
async fn the_environment_is_only_path_and_what_is_configured() {
    let cwd = tempfile::tempdir().unwrap();
    let config = probe(&format!(
        "cwd = {:?}\n[upstreams.env]\nPROBE_GREETING = \"hello ${{PROBE_NAME}}\"\n",
        cwd.path().display().to_string()
    ));
    let gw = Gateway::start(config, &[("PROBE_NAME", "world")]).await;
    let env = |name: &'static str| gw.call("acme", "env", json!({"name": name}));
    assert_eq!(env("PROBE_GREETING").await.0, "hello world");
    assert_eq!(env("PATH").await.0, std::env::var("PATH").unwrap());
    // Nothing else of the test's own environment is inherited.
    let mine: Vec<String> = std::env::vars().map(|(k, _)| k).filter(|k| k != "PATH").collect();
    assert!(!mine.is_empty(), "the test runs with an environment");
    for name in mine.iter().take(20) {
        let (value, _) = gw.call("acme", "env", json!({"name": name})).await;
        assert_eq!(value, "(unset)", "{name}");
    }
    assert_eq!(env("HOME").await.0, "(unset)");
    let (shown, _) = gw.call("acme", "cwd", json!({})).await;
    assert_eq!(std::fs::canonicalize(shown).unwrap(), std::fs::canonicalize(cwd.path()).unwrap());
    gw.stop().await;
}

#[tokio::test]
async fn limits_are_set_on_the_processes() {
    let gw = Gateway::start(probe("max_memory = \"256MiB\"\nmax_cpu = \"2m\""), &[]).await;
    let (pid, _) = gw.whoami("acme").await;
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = |name: &str| {
        limits.lines().find(|l| l.starts_with(name)).unwrap().split_whitespace().collect::<Vec<_>>()
    };
    assert_eq!(line("Max address space")[3..5], ["268435456", "268435456"], "{limits}");
    assert_eq!(line("Max cpu time")[3..5], ["120", "120"], "{limits}");
    let (text, error) = gw.call("acme", "allocate", json!({"mib": 512})).await;
    assert!(error && text == "could not allocate", "{text}");
    let (text, error) = gw.call("acme", "allocate", json!({"mib": 16})).await;
    assert!(!error && text == format!("allocated {}", 16 << 20), "{text}");
    gw.stop().await;
}

#[tokio::test]
async fn a_line_over_max_response_bytes_fails_the_call_and_the_process_is_replaced() {
    let gw = Gateway::start(probe("max_response_bytes = 4096"), &[]).await;
    let (pid, _) = gw.whoami("acme").await;
    let (text, error) = gw.call("acme", "big", json!({"bytes": 100_000})).await;
    assert!(error && text.contains("max_response_bytes (4096)"), "{text}");
    gw.until(|_| !alive(pid), "the process is stopped").await;
    assert_eq!(gw.call("acme", "big", json!({"bytes": 10})).await, ("x".repeat(10), false));
    gw.stop().await;
}

#[tokio::test]
async fn a_command_that_cannot_run_is_reported() {
    let config = parse(
        "name = \"probe\"\ncommand = [\"/nonexistent/mcp-server\", \"--flag\"]\nrefresh_interval = 1",
    );
    let upstreams = Upstreams::new(&[config], |_| None, &UpstreamMetrics::noop(), None).unwrap();
    let mut driver = Driver::new(&opentelemetry::global::meter("stdio-test"));
    upstreams.register(&mut driver);
    let driver = driver.start();
    let deadline = Instant::now() + Duration::from_secs(20);
    let error = loop {
        if let Some(error) = upstreams.health()[0].3.clone() {
            break error;
        }
        assert!(Instant::now() < deadline, "no error reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        error.contains("could not start \"/nonexistent/mcp-server\"")
            && error.contains("No such file"),
        "{error}"
    );
    assert!(upstreams.tools_for(&agent("acme")).is_empty());
    driver.shutdown().await;

    // A `${VAR}` of `env` that is not set stops the gateway from starting.
    let unset = probe("[upstreams.env]\nTOKEN = \"${PROBE_UNSET}\"");
    let error = Upstreams::new(&[unset], |_| None, &UpstreamMetrics::noop(), None).unwrap_err();
    assert!(error.contains("env.TOKEN") && error.contains("PROBE_UNSET"), "{error}");

    // The admin API may not register one.
    let none = Upstreams::none();
    let errors = none.apply(&[probe("")], |_| None);
    assert!(errors[0].1.contains("only the configuration file"), "{errors:?}");
    assert!(none.is_empty());
}

#[tokio::test]
async fn progress_and_log_messages_of_a_call_reach_its_caller_scrubbed() {
    let gw = Gateway::start(probe(""), &[]).await;
    let (result, got) = gw.report("acme").await;
    assert_eq!(result["content"][0]["text"], "reported");

    // Before the answer, in order: the call's own progress (not the stray
    // token's), and the warning (not the debug message), scrubbed.
    assert_eq!(got.len(), 3, "{got:?}");
    let reading =
        Notice::Progress { progress: 1.0, total: Some(3.0), message: Some("reading".into()) };
    assert_eq!(got[0], reading);
    let Notice::Progress { progress: 2.0, message: Some(found), .. } = &got[1] else {
        panic!("{got:?}")
    };
    assert!(found.contains("REDACTED") && !found.contains(LEAKED), "{found}");
    let Notice::Log { level: "warning", logger: Some(logger), data } = &got[2] else {
        panic!("{got:?}")
    };
    assert_eq!(logger, "probe");
    let detail = data["detail"].as_str().unwrap();
    assert!(detail.contains("REDACTED") && !detail.contains(LEAKED), "{detail}");

    // A caller that wants nothing of it gets the same answer.
    assert_eq!(gw.call("acme", "report", json!({})).await, ("reported".into(), false));
    gw.stop().await;
}

#[tokio::test]
async fn a_log_message_is_relayed_only_while_its_call_is_alone_in_its_process() {
    let gw = Gateway::start(probe(""), &[]).await;
    // Another call of the tenant's holds its one process meanwhile: a log
    // message, which names no request, could be that call's.
    let slow = gw.call("acme", "sleep", json!({"ms": 1500}));
    let report = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        gw.report("acme").await
    };
    let ((slept, _), (result, got)) = tokio::join!(slow, report);
    assert_eq!(slept, "slept");
    assert_eq!(result["content"][0]["text"], "reported");
    assert_eq!(gw.pids(Some("acme")).await.len(), 1, "both calls went to one process");
    assert!(
        got.len() == 2 && got.iter().all(|n| matches!(n, Notice::Progress { .. })),
        "progress only: {got:?}"
    );
    gw.stop().await;
}
