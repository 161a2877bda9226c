//! A fresh deployment's dashboard and alerts have data from the start: the
//! counters and gauges they query exist at zero before their first event,
//! for every label set known then, and those are the very series later
//! events add to.

use foldgate_runner::{ModelConfig, Provider};
use foldgate_testkit::{model_server::ModelServer, on_both_backends};
use reqwest::Method;

use super::{
    dashboard::{exercise_everything, queried_metrics},
    *,
};
use crate::admin::Admin;

/// Queried series that only an event a single fold does not cause creates:
/// histograms, which the exporter cannot show empty. Each with why.
const AFTER_THEIR_EVENT: &[(&str, &str)] = &[(
    "foldgate_supervisor_lag_seconds_bucket",
    "observed when the supervisor force-returns a branch after its deadline; a fold returns its \
     branch itself (the dashboard's lag panels show no data and the lag alert has nothing to \
     evaluate until a deadline fires, which is the truth)",
)];

/// Every value of `foldgate.auth.rejections`' `reason`.
const AUTH_REASONS: &[&str] = &[
    "missing_token",
    "malformed",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "wrong_issuer",
    "wrong_audience",
    "unsupported_algorithm",
    "unknown_key",
    "bad_claims",
    "key_source_unavailable",
];

/// Every way a branch ends, as `foldgate.branches.completed` labels it.
const ENDINGS: &[(&str, &str)] = &[
    ("completed", "returned"),
    ("failed", "reported_failure"),
    ("timeout", "deadline_exceeded"),
    ("timeout", "budget_exhausted"),
    ("failed", "parent_returning"),
    ("failed", "session_ended"),
    ("failed", "ended_by_operator"),
];

/// Every refusal reason of `branch_create`.
const REFUSALS: &[&str] = &[
    "session_not_found",
    "branch_not_found",
    "gateway_run_branch",
    "branch_not_active",
    "max_depth_exceeded",
    "budget_exhausted",
    "session_active_branches",
    "tenant_active_branches",
    "deployment_active_branches",
    "session_creation_rate",
];

/// The `# TYPE` of a sample's family (`_bucket`, `_count` and `_sum` are
/// their histogram's).
fn kind_of<'a>(types: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    types.get(name).map(String::as_str).or_else(|| {
        ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).and_then(|base| types.get(base)))
            .map(String::as_str)
    })
}

/// The label sets of `name`'s samples.
fn label_sets(samples: &[Sample], name: &str) -> BTreeSet<BTreeMap<String, String>> {
    samples.iter().filter(|s| s.name == name).map(|s| s.labels.clone()).collect()
}

/// The value of the one sample of `name` with exactly `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<String, String> =
        labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    samples.iter().find(|s| s.name == name && s.labels == wanted).map(|s| s.value)
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    every_queried_series_exists_after_one_fold
);

/// A gateway with an upstream for every tenant, one for another tenant only
/// and a model, started on an empty database, its gauges read from the
/// database at startup only (nothing here waits for a reading; no queried
/// series is per model): at startup every queried counter and gauge
/// without a tenant exists, as it does after the fold; after one
/// fold (`branch_create`, `branch_return`) of tenant acme every queried
/// series does, but the histograms of `AFTER_THEIR_EVENT`, and acme's
/// counters cover every value of their labels, at zero where the fold did
/// not count; an upstream registered later has acme's counts at once.
async fn every_queried_series_exists_after_one_fold(backend: Backend) {
    let (server, files) = upstream().await;
    let mut globex_only = files.clone();
    globex_only.name = "globex-files".into();
    globex_only.tenants = Some(vec!["globex".into()]);
    let model = ModelServer::start().await;
    let chat = ModelConfig {
        name: "default".into(),
        provider: Provider::Openai,
        base_url: model.base_url(),
        model: "test-model".into(),
        api_key: Some("sk-test".into()),
        tenants: None,
        max_output_tokens: 256,
        timeout: Duration::from_secs(5),
        stream: false,
        embeddings: false,
    };
    let gw = TestGateway::start_with(backend, |c| {
        c.upstreams = vec![files, globex_only];
        c.models = vec![chat];
        c.telemetry.store_poll_interval = Duration::from_secs(3600);
    })
    .await;
    let queried = queried_metrics();
    assert!(queried.len() >= 20, "{queried:?}");
    for (name, why) in AFTER_THEIR_EVENT {
        assert!(queried.contains(*name), "{name} is no longer queried; drop it ({why})");
    }

    // Arrange: a scrape before anything happened.
    let (at_start, _) = scrape(&gw).await;

    // Act: one fold.
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    // The upstream's tools were listed once (`mcp.client.operation.duration`).
    upstream_tools_listed(&agent).await;
    let branch = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "first", "description": "Find the retry settings",
               "prompt": "Look in the HTTP client.", "budget": 4000}),
    )
    .await);
    let returned = ok(&call(
        &agent,
        "branch_return",
        json!({"branch_id": branch["branch_id"], "message": "config/http.rs: max 3 retries."}),
    )
    .await);
    assert_eq!(returned["status"], "completed");
    agent.cancel().await.unwrap();
    let (after_fold, types) = scrape(&gw).await;

    // Assert: every queried series exists, but those that need an event a
    // fold does not cause, which do not (the list stays true).
    let exported: BTreeSet<&str> = after_fold.iter().map(|s| s.name.as_str()).collect();
    let mut missing = Vec::new();
    for name in &queried {
        let excused = AFTER_THEIR_EVENT.iter().any(|(n, _)| n == name);
        match (exported.contains(name.as_str()), excused) {
            (false, false) => missing.push(name.clone()),
            (true, true) => missing.push(format!("{name} exists: take it off AFTER_THEIR_EVENT")),
            _ => {}
        }
    }
    assert!(missing.is_empty(), "after one fold:\n{}", missing.join("\n"));

    // The queried counters and gauges without a tenant existed from the
    // start; those with one exist for acme.
    for name in &queried {
        let kind = kind_of(&types, name);
        if !matches!(kind, Some("counter" | "gauge")) {
            continue;
        }
        let per_tenant =
            after_fold.iter().any(|s| &s.name == name && s.labels.contains_key("tenant"));
        if per_tenant {
            assert!(
                sample(&after_fold, name, &[("tenant", "acme")]).is_some(),
                "{name} has no series for acme"
            );
            // Its series for every tenant fit under the raised limit.
            assert!(
                foldgate_telemetry::PER_TENANT_METRICS
                    .iter()
                    .any(|metric| name.starts_with(&metric.replace('.', "_"))),
                "{name} starts at zero per tenant: list it in PER_TENANT_METRICS"
            );
        } else {
            assert_eq!(
                label_sets(&at_start, name),
                label_sets(&after_fold, name),
                "{name}: the same series at startup as after the fold"
            );
        }
    }

    // Every value of the closed labels, at zero where nothing happened.
    let acme = ("tenant", "acme");
    let auth = label_sets(&at_start, "foldgate_auth_rejections_total");
    let reasons: BTreeSet<&str> = auth.iter().map(|l| l["reason"].as_str()).collect();
    assert_eq!(reasons, AUTH_REASONS.iter().copied().collect(), "auth rejection reasons");
    for reason in AUTH_REASONS {
        assert_eq!(
            value(&after_fold, "foldgate_auth_rejections_total", &[("reason", reason)]),
            Some(0.0)
        );
    }
    assert_eq!(
        value(&at_start, "foldgate_rate_limit_rejections_total", &[("reason", "request_rate")]),
        Some(0.0)
    );
    let rules = label_sets(&at_start, "foldgate_secrets_redacted_total");
    assert!(rules.len() > 100, "every built-in scrubbing rule: {}", rules.len());
    assert!(
        after_fold
            .iter()
            .filter(|s| s.name == "foldgate_secrets_redacted_total")
            .all(|s| s.value == 0.0),
        "nothing was redacted"
    );
    for (status, reason) in ENDINGS {
        let ended = [acme, ("status", status), ("reason", reason)];
        let expected = if *reason == "returned" { 1.0 } else { 0.0 };
        assert_eq!(
            value(&after_fold, "foldgate_branches_completed_total", &ended),
            Some(expected),
            "{ended:?}"
        );
        if !["returned", "reported_failure"].contains(reason) {
            let forced = [acme, ("reason", reason)];
            assert_eq!(
                value(&after_fold, "foldgate_branches_forced_returns_total", &forced),
                Some(0.0),
                "{forced:?}"
            );
        }
    }
    assert_eq!(label_sets(&after_fold, "foldgate_branches_completed_total").len(), ENDINGS.len());
    assert_eq!(label_sets(&after_fold, "foldgate_branches_forced_returns_total").len(), 5);
    let refused = label_sets(&after_fold, "foldgate_branches_refused_total");
    let reasons: BTreeSet<&str> = refused.iter().map(|l| l["reason"].as_str()).collect();
    assert_eq!(reasons, REFUSALS.iter().copied().collect(), "refusal reasons");
    assert!(
        after_fold
            .iter()
            .filter(|s| s.name == "foldgate_branches_refused_total")
            .all(|s| s.value == 0.0)
    );
    assert_eq!(value(&after_fold, "foldgate_branches_created_total", &[acme]), Some(1.0));
    // The last reading of the database: 0 or 1, as a reading may have come
    // while the branch was open.
    let active = value(&after_fold, "foldgate_branches_active", &[acme]);
    assert!(matches!(active, Some(v) if v == 0.0 || v == 1.0), "{active:?}");
    // acme's calls to the upstream serving it, at zero; none to the one
    // serving globex alone.
    for direction in ["in", "out"] {
        let tokens = [acme, ("upstream", "files"), ("direction", direction)];
        assert_eq!(value(&after_fold, "foldgate_upstream_tokens_total", &tokens), Some(0.0));
    }
    let outside = [acme, ("upstream", "files")];
    assert_eq!(
        value(&after_fold, "foldgate_upstream_calls_outside_branches_total", &outside),
        Some(0.0)
    );
    assert!(
        !after_fold.iter().any(|s| {
            s.labels.get("upstream").is_some_and(|u| u == "globex-files")
                && s.labels.contains_key("tenant")
        }),
        "acme has no series of an upstream that does not serve it"
    );
    assert!(value(&after_fold, "foldgate_upstream_up", &[("upstream", "globex-files")]).is_some());

    // An upstream registered now has acme's counts at once.
    let (status, body) = Admin::deployment(&gw)
        .send_json(
            Method::POST,
            "/upstreams",
            Some(json!({"name": "team", "url": server.url(), "refresh_seconds": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let team = [acme, ("upstream", "team")];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (samples, _) = scrape(&gw).await;
        if value(&samples, "foldgate_upstream_up", &[("upstream", "team")]).is_some() {
            assert_eq!(
                value(&samples, "foldgate_upstream_calls_outside_branches_total", &team),
                Some(0.0),
                "a registered upstream's counts start with it"
            );
            for direction in ["in", "out"] {
                let tokens = [acme, ("upstream", "team"), ("direction", direction)];
                assert_eq!(value(&samples, "foldgate_upstream_tokens_total", &tokens), Some(0.0));
            }
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the registered upstream never showed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.stop().await;
}

/// Every event the dashboard and the alerts look at, after the tenant's
/// series were started: none of them makes a series of a queried counter
/// or gauge that was not there (at zero) before, so that no panel shows a
/// series twice; and the events did count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_add_to_the_series_started_at_zero() {
    let (_upstream, upstream_entry) = upstream().await;
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.folding.max_depth = 2;
        c.supervisor.deadline_poll_interval = Duration::from_millis(50);
        c.api.rate_limit.per_second = 1;
        c.api.rate_limit.burst = 30;
        c.upstreams = vec![upstream_entry];
    })
    .await;
    let agent = client(&gw.url, &gw.write_token("acme", "zed"), Era::Legacy).await;
    upstream_tools_listed(&agent).await;
    ok(&call(&agent, "branch_create", json!({"session_id": "start", "description": "d"})).await);
    agent.cancel().await.unwrap();
    let (started, _) = scrape(&gw).await;

    exercise_everything(&gw).await;
    let (after, types) = scrape(&gw).await;

    let mut new_series = Vec::new();
    for name in queried_metrics() {
        if !matches!(kind_of(&types, &name), Some("counter" | "gauge")) {
            continue;
        }
        let before = label_sets(&started, &name);
        assert!(!before.is_empty(), "{name} had started");
        for labels in label_sets(&after, &name).difference(&before) {
            new_series.push(format!("{name}{labels:?}"));
        }
    }
    assert!(new_series.is_empty(), "series that did not start at zero:\n{}", new_series.join("\n"));

    let acme = ("tenant", "acme");
    let counted: &[Expected<'_>] = &[
        ("foldgate_branches_refused_total", &[acme, ("reason", "max_depth_exceeded")], 1.0),
        ("foldgate_branches_forced_returns_total", &[acme, ("reason", "deadline_exceeded")], 1.0),
        ("foldgate_branches_forced_returns_total", &[acme, ("reason", "parent_returning")], 1.0),
        (
            "foldgate_branches_completed_total",
            &[acme, ("status", "timeout"), ("reason", "deadline_exceeded")],
            1.0,
        ),
        ("foldgate_upstream_calls_outside_branches_total", &[acme, ("upstream", "files")], 1.0),
        ("foldgate_auth_rejections_total", &[("reason", "missing_token")], 1.0),
        ("foldgate_rate_limit_rejections_total", &[("reason", "request_rate")], 1.0),
    ];
    for (name, labels, expected) in counted {
        assert_eq!(value(&after, name, labels), Some(*expected), "{name} {labels:?}");
    }
    let redacted: f64 =
        after.iter().filter(|s| s.name == "foldgate_secrets_redacted_total").map(|s| s.value).sum();
    assert!(redacted >= 1.0, "the leaked token was counted");
    gw.stop().await;
}
