//! The shipped dashboard and alert rules query only metrics the gateway
//! exports.

use super::*;

pub(super) fn deploy_file(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `expr` of a dashboard's panels (nested rows included) and every
/// query of its template variables.
pub(super) fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                // The data source is the dashboard's variable, never a fixed uid.
                assert_eq!(target["datasource"]["uid"], "${datasource}", "{}", panel["title"]);
                out.push(target["expr"].as_str().expect("every target has an expr").to_owned());
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] == "query" {
            let query = &variable["query"];
            let query = query.as_str().or_else(|| query["query"].as_str()).unwrap();
            out.push(query.to_owned());
        }
    }
    out
}

/// The metric names a PromQL expression (or a Grafana `label_values`
/// query) selects.
pub(super) fn metric_names(expr: &str) -> BTreeSet<String> {
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"#).unwrap();
    let matchers = regex::Regex::new(r"\{[^}]*\}|\[[^\]]*\]").unwrap();
    let grouping =
        regex::Regex::new(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
            .unwrap();
    let label_values = regex::Regex::new(r"label_values\(\s*([^,()]+?)\s*,[^)]*\)").unwrap();
    let identifier = regex::Regex::new(r"\$\{?\w+\}?|[0-9][\w.]*|[A-Za-z_:][\w:]*").unwrap();
    const KEYWORDS: &[&str] =
        &["and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"];

    let expr = strings.replace_all(expr, "");
    let expr = matchers.replace_all(&expr, "");
    let expr = grouping.replace_all(&expr, "");
    let expr = label_values.replace_all(&expr, "$1");
    let mut names = BTreeSet::new();
    for m in identifier.find_iter(&expr) {
        let token = m.as_str();
        let is_call = expr[m.end()..].trim_start().starts_with('(');
        if token.starts_with('$') || token.starts_with(|c: char| c.is_ascii_digit()) || is_call {
            continue;
        }
        if !KEYWORDS.contains(&token.to_ascii_lowercase().as_str()) {
            names.insert(token.to_owned());
        }
    }
    names
}

/// The labels an expression's selectors match on, with their metrics:
/// `rate(a{x="1", y!=""}[5m])` gives `(a, x)` and `(a, y)`.
fn selector_labels(expr: &str) -> Vec<(String, String)> {
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"#).unwrap();
    let selector = regex::Regex::new(r"([A-Za-z_:][\w:]*)\{([^}]*)\}").unwrap();
    let matcher = regex::Regex::new(r"(\w+)\s*(?:=~|!~|!=|=)").unwrap();
    let expr = strings.replace_all(expr, "\"\"");
    let mut found = Vec::new();
    for s in selector.captures_iter(&expr) {
        for m in matcher.captures_iter(&s[2]) {
            found.push((s[1].to_owned(), m[1].to_owned()));
        }
    }
    found
}

/// Every metric the shipped dashboard (its panels and variables) and alert
/// rules select, read from the files as they are now, but Prometheus's own
/// (`up`).
pub(super) fn queried_metrics() -> BTreeSet<String> {
    let dashboard: Value = serde_json::from_str(&deploy_file("grafana/foldgate.json")).unwrap();
    let mut queries = dashboard_queries(&dashboard);
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&deploy_file("prometheus/alerts.yaml")).unwrap();
    for group in alerts["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            queries.push(rule["expr"].as_str().unwrap().to_owned());
        }
    }
    queries
        .iter()
        .flat_map(|q| metric_names(q))
        .filter(|name| !PROMETHEUS_SERIES.contains(&name.as_str()))
        .collect()
}

#[test]
fn metric_names_are_extracted_from_promql() {
    let cases: &[(&str, &[&str])] = &[
        (
            r#"sum by (tenant) (rate(foldgate_branches_created_total{tenant=~"$tenant"}[$__rate_interval]))"#,
            &["foldgate_branches_created_total"],
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0.5 and on() b offset 1h",
            &["a_bucket", "b"],
        ),
        (
            "label_values(foldgate_branches_created_total, tenant)",
            &["foldgate_branches_created_total"],
        ),
        ("up{job=\"foldgate\"} == 0", &["up"]),
        ("sum(x) / clamp_min(sum(y), 1) * 100", &["x", "y"]),
    ];
    for (expr, expected) in cases {
        let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(metric_names(expr), expected, "{expr}");
    }
    let labels = selector_labels(
        r#"sum by (a) (rate(m_count{instance=~"$i", error_type!="", x="a=b{c}"}[5m])) / n"#,
    );
    let pairs: Vec<(&str, &str)> = labels.iter().map(|(m, l)| (m.as_str(), l.as_str())).collect();
    assert_eq!(pairs, [("m_count", "instance"), ("m_count", "error_type"), ("m_count", "x")]);
}

/// Runs everything the dashboard and the alerts look at, so that each of
/// their series exists: a fold, a fold through an upstream (calls inside
/// and outside a branch, a tool error), a call of a tool nobody offers, a
/// refused create, a deadline fired by the supervisor, a request refused by
/// authentication and one by the rate limit.
pub(super) async fn exercise_everything(gw: &TestGateway) {
    fold_cycle(gw, "acme", "conv-1").await;
    federated_fold(gw, "acme", "fed-1").await;
    let agent = client(&gw.url, &gw.write_token("acme", "bob"), Era::Discover).await;
    // Too deep (the test gateway allows depth 2).
    let mut parent = None;
    for depth in 1..=2 {
        let mut args = json!({"session_id": "deep", "description": format!("level {depth}")});
        if let Some(id) = &parent {
            args["parent_branch_id"] = json!(id);
        }
        parent = Some(ok(&call(&agent, "branch_create", args).await)["branch_id"].clone());
    }
    let refused = call(
        &agent,
        "branch_create",
        json!({"session_id": "deep", "description": "level 3", "parent_branch_id": parent}),
    )
    .await;
    assert_eq!(refusal(&refused).0, "max_depth_exceeded");
    // A return that gives a secret away, which is redacted.
    let leaky =
        ok(&call(&agent, "branch_create", json!({"session_id": "leak", "description": "d"})).await);
    let token = format!("ghp_{}", "Zq8vN2kLp4Rt6Wx9Yb1Cd3Ef5Gh7Jk0Mn2Pq");
    let returned = ok(&call(
        &agent,
        "branch_return",
        json!({"branch_id": leaky["branch_id"], "message": format!("the token is {token}")}),
    )
    .await);
    assert!(!returned["message"].as_str().unwrap().contains(&token));
    // A deadline the supervisor fires.
    let short = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "short", "description": "quick look", "timeout_seconds": 1}),
    )
    .await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let status =
            ok(&call(&agent, "branch_status", json!({"branch_id": short["branch_id"]})).await);
        if status["status"] == "timeout" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the deadline never fired: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.cancel().await.unwrap();

    let http = reqwest::Client::new();
    let unknown = http
        .post(&gw.url)
        .bearer_auth(gw.write_token("acme", "dave"))
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "made_up__tool", "arguments": {}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let unauthenticated = http.post(&gw.url).json(&ping).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    let token = gw.write_token("acme", "mallory");
    let mut limited = false;
    for _ in 0..50 {
        let response = http
            .post(&gw.url)
            .bearer_auth(&token)
            .header(header::ACCEPT, "application/json, text/event-stream")
            .json(&ping)
            .send()
            .await
            .unwrap();
        if response.status() == 429 {
            limited = true;
            break;
        }
    }
    assert!(limited, "the request rate limit never applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_query_only_exported_metrics() {
    let (_upstream, upstream_entry) = upstream().await;
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.telemetry.store_poll_interval = Duration::from_millis(20);
        c.folding.max_depth = 2;
        c.supervisor.deadline_poll_interval = Duration::from_millis(50);
        c.api.rate_limit.per_second = 1;
        c.api.rate_limit.burst = 30;
        c.upstreams = vec![upstream_entry];
    })
    .await;
    exercise_everything(&gw).await;
    let (samples, _) =
        scrape_until(&gw, "foldgate_branches_active", &[("tenant", "acme")], 2.0).await;
    gw.stop().await;
    let exported: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();

    // The federation and MCP series, as Prometheus names them.
    let files = ("upstream", "files");
    let acme = ("tenant", "acme");
    // The call of a tool nobody offers.
    let refused = [("mcp_method_name", "tools/call"), ("error_type", "-32602")];
    let cases: &[Expected<'_>] = &[
        ("foldgate_upstream_up", &[files], 1.0),
        ("foldgate_upstream_tools", &[files], 2.0),
        ("foldgate_upstream_calls_outside_branches_total", &[acme, files], 1.0),
        (
            "mcp_client_operation_duration_seconds_count",
            &[files, ("gen_ai_tool_name", "fail"), ("error_type", "tool_error")],
            1.0,
        ),
        (
            "mcp_server_operation_duration_seconds_count",
            &[("gen_ai_tool_name", "files__echo"), ("network_transport", "tcp")],
            2.0,
        ),
        ("mcp_server_operation_duration_seconds_count", &refused, 1.0),
    ];
    for (name, wanted, value) in cases {
        let found = sample(&samples, name, wanted).unwrap_or_else(|| panic!("{name} {wanted:?}"));
        assert_eq!(found.value, *value, "{name} {wanted:?}");
    }
    let refused =
        sample(&samples, "mcp_server_operation_duration_seconds_count", &refused).unwrap();
    assert!(!refused.labels.contains_key("gen_ai_tool_name"), "an unknown tool is not named");
    assert!(
        samples.iter().all(|s| s.labels.values().all(|v| !v.contains("made_up"))),
        "a client's free text makes no series"
    );
    // rmcp answers the 2026-07-28 client's discovery itself; it is counted.
    let discovered = sample(
        &samples,
        "mcp_server_operation_duration_seconds_count",
        &[("mcp_method_name", "server/discover"), ("mcp_protocol_version", "2026-07-28")],
    );
    assert!(discovered.is_some_and(|s| s.value >= 1.0), "{discovered:?}");
    assert!(
        sample(&samples, "foldgate_upstream_tokens_total", &[acme, files, ("direction", "out")])
            .unwrap()
            .value
            > 0.0
    );
    assert!(
        sample(
            &samples,
            "foldgate_db_operation_duration_seconds_count",
            &[("db_operation_name", "meter_call"), ("db_system_name", "sqlite")]
        )
        .unwrap()
        .value
            >= 2.0
    );

    let dashboard: Value = serde_json::from_str(&deploy_file("grafana/foldgate.json")).unwrap();
    let mut queries: Vec<(String, String)> = dashboard_queries(&dashboard)
        .into_iter()
        .map(|q| ("grafana/foldgate.json".to_owned(), q))
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&deploy_file("prometheus/alerts.yaml")).unwrap();
    let mut alert_names = Vec::new();
    for group in alerts["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().expect("alerting rules only");
            assert!(rule["for"].as_str().is_some(), "{name}: a `for` duration");
            assert!(rule["labels"]["severity"].as_str().is_some(), "{name}: a severity");
            assert!(rule["annotations"]["summary"].as_str().is_some(), "{name}: a summary");
            alert_names.push(name.to_owned());
            queries.push((name.to_owned(), rule["expr"].as_str().unwrap().to_owned()));
        }
    }
    assert!(alert_names.len() >= 5, "{alert_names:?}");

    let mut unknown = Vec::new();
    for (origin, query) in &queries {
        for name in metric_names(query) {
            let known =
                exported.contains(name.as_str()) || PROMETHEUS_SERIES.contains(&name.as_str());
            if !known {
                unknown.push(format!("{origin}: {name} (in {query})"));
            }
        }
        // Selectors match on labels the metric has (Prometheus adds
        // `instance` and `job` to every series it scrapes, and the
        // Prometheus Operator `namespace` and `service`).
        for (name, label) in selector_labels(query) {
            if PROMETHEUS_SERIES.contains(&name.as_str())
                || ["instance", "job", "namespace", "service"].contains(&label.as_str())
                || FAILURE_ONLY_LABELS.contains(&(name.as_str(), label.as_str()))
            {
                continue;
            }
            if !samples.iter().any(|s| s.name == name && s.labels.contains_key(&label)) {
                unknown.push(format!("{origin}: {name} has no label {label} (in {query})"));
            }
        }
    }
    assert!(unknown.is_empty(), "queried but not exported:\n{}", unknown.join("\n"));
}
