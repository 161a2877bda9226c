//! The admin API over HTTP, on each backend: who sees what (a tenant admin
//! finds no other tenant), each endpoint, bad input, operator ends as the
//! agent then sees them, an audit row for every change, and a branch's
//! calls and a gateway run's steps.

use foldgate_testkit::{
    Backend,
    gateway::{Era, TestGateway, call, client, ok, refusal},
    on_both_backends,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// An admin API client with one token.
pub(crate) struct Admin {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Admin {
    pub(crate) fn new(gw: &TestGateway, token: Option<String>) -> Self {
        Self::at(&gw.base, token)
    }

    /// The admin API of the gateway at `base` (its URL without `/mcp`).
    pub(crate) fn at(base: &str, token: Option<String>) -> Self {
        Self { http: reqwest::Client::new(), base: format!("{base}/admin/v1"), token }
    }

    /// A deployment admin of `gw`.
    pub(crate) fn deployment(gw: &TestGateway) -> Self {
        Self::new(gw, Some(gw.token("ops", "root", &["foldgate:admin"])))
    }

    async fn send(&self, method: Method, path: &str) -> (StatusCode, Value) {
        self.send_json(method, path, None).await
    }

    pub(crate) async fn send_json(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    pub(crate) async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path).await
    }

    async fn post(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::POST, path).await
    }

    pub(crate) async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send_json(Method::PUT, path, Some(body)).await
    }

    /// A successful GET's body.
    pub(crate) async fn read(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }
}

pub(crate) fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error body: {body}"))
}

async fn admins_reach_their_tenants_and_no_other(backend: Backend) {
    let gw = TestGateway::start(backend).await;
    let acme_agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    let globex_agent = client(&gw.url, &gw.write_token("globex", "gina"), Era::Discover).await;
    let create = json!({"session_id": "s1", "description": "look into it"});
    let root = ok(&call(&acme_agent, "branch_create", create.clone()).await);
    let child = ok(&call(&acme_agent, "branch_create", create).await);
    let theirs = ok(&call(
        &globex_agent,
        "branch_create",
        json!({"session_id": "g1", "description": "theirs"}),
    )
    .await);
    let (root_id, child_id) =
        (root["branch_id"].as_str().unwrap(), child["branch_id"].as_str().unwrap());
    let their_id = theirs["branch_id"].as_str().unwrap();

    let deployment = Admin::deployment(&gw);
    let acme = Admin::new(&gw, Some(gw.token("acme", "lead", &["tenant:admin"])));

    // Who may call at all.
    let (status, body) = Admin::new(&gw, None).get("/tenants").await;
    assert_eq!((status, error_code(&body)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let agent_token = Admin::new(&gw, Some(gw.write_token("acme", "alice")));
    let (status, body) = agent_token.get("/tenants").await;
    assert_eq!((status, error_code(&body)), (StatusCode::FORBIDDEN, "forbidden"), "no admin scope");

    // Tenants at a glance: all of them, or one's own.
    let tenants = deployment.read("/tenants").await;
    let seen: Vec<_> = tenants["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["tenant"].as_str().unwrap(),
                t["open_sessions"].as_u64(),
                t["active_branches"].as_u64(),
            )
        })
        .collect();
    assert_eq!(seen, [("acme", Some(1), Some(2)), ("globex", Some(1), Some(1))]);
    let own = acme.read("/tenants").await;
    assert_eq!(own["tenants"].as_array().unwrap().len(), 1);
    assert_eq!(own["tenants"][0]["tenant"], "acme");

    // Another tenant's resources are not found, exactly as missing ones.
    for path in
        ["/tenants/globex/sessions", "/tenants/globex/sessions/g1", "/tenants/nobody/sessions"]
    {
        let (status, body) = acme.get(path).await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"), "{path}");
    }
    let (status, _) = acme.post(&format!("/tenants/globex/branches/{their_id}/end")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "ending another tenant's branch");
    let (status, _) = acme.get("/tenants/acme/sessions/g1").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's session under one's own");

    // Sessions, and a session's tree.
    let sessions = acme.read("/tenants/acme/sessions").await;
    assert_eq!(sessions["sessions"][0]["session_id"], "s1");
    assert_eq!(sessions["sessions"][0]["owner"], "alice");
    assert_eq!(sessions["sessions"][0]["active_branches"], 2);
    let tree = acme.read("/tenants/acme/sessions/s1").await;
    assert_eq!(tree["status"], "open");
    assert_eq!(tree["branches"].as_array().unwrap().len(), 1, "one depth-1 branch");
    assert_eq!(tree["branches"][0]["branch_id"], root_id);
    assert_eq!(tree["branches"][0]["children"][0]["branch_id"], child_id);
    assert_eq!(tree["branches"][0]["children"][0]["depth"], 2);
    assert_eq!(tree["branches"][0]["status"], "active");
    let budget = &tree["branches"][0]["budget"];
    assert_eq!(
        budget["reserved"], tree["branches"][0]["children"][0]["budget"]["total"],
        "lent to the child"
    );

    // Bad input is a 400 that says what is wrong.
    for path in [
        "/tenants/acme/sessions?limit=0",
        "/tenants/acme/sessions?limit=lots",
        "/tenants/acme/sessions?status=sleeping",
        "/tenants/acme/sessions?after=yesterday",
        "/tenants/acme/sessions?colour=blue",
        "/audit?before=not-a-uuid",
    ] {
        let (status, body) = acme.get(path).await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{path}"
        );
    }
    let (status, body) = acme.post("/tenants/acme/branches/not-a-branch/end").await;
    assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "invalid_request"));
    let (status, body) = acme.get("/no/such/route").await;
    assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"));

    // Ending the root ends its child first; the agent finds both ended.
    let (status, ended) = acme.post(&format!("/tenants/acme/branches/{root_id}/end")).await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert_eq!(ended["branch"]["status"], "failed");
    assert_eq!(ended["branch"]["reason"], "ended_by_operator");
    let tree = acme.read("/tenants/acme/sessions/s1").await;
    assert_eq!(tree["branches"][0]["children"][0]["reason"], "parent_returning");
    let returned =
        call(&acme_agent, "branch_return", json!({"branch_id": root_id, "message": "done"})).await;
    assert_eq!(refusal(&returned).0, "branch_not_active");
    let (status, body) = acme.post(&format!("/tenants/acme/branches/{root_id}/end")).await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "branch_not_active"));

    // Ending a session ends its active branches.
    ok(&call(&acme_agent, "branch_create", json!({"session_id": "s1", "description": "again"}))
        .await);
    let (status, ended) = deployment.post("/tenants/acme/sessions/s1/end").await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert_eq!(
        (ended["branches_ended"].as_u64(), ended["session_ended"].as_bool()),
        (Some(1), Some(true))
    );
    let (status, body) = deployment.post("/tenants/acme/sessions/s1/end").await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "session_not_open"));
    let open = acme.read("/tenants/acme/sessions").await;
    assert!(open["sessions"].as_array().unwrap().is_empty(), "no open session left");
    let all = acme.read("/tenants/acme/sessions?status=all").await;
    assert_eq!(all["sessions"][0]["status"], "ended");

    // Every change, who made it, newest first; a tenant admin reads its own.
    let audit = deployment.read("/audit").await;
    let rows: Vec<_> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["actor"]["subject"].as_str().unwrap(),
                e["tenant"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, [("session.end", "root", "acme"), ("branch.end", "lead", "acme")]);
    assert_eq!(audit["entries"][1]["target"], root_id);
    assert_eq!(acme.read("/audit").await["entries"].as_array().unwrap().len(), 2);
    let globex = Admin::new(&gw, Some(gw.token("globex", "lead", &["tenant:admin"])));
    assert!(globex.read("/audit").await["entries"].as_array().unwrap().is_empty());
    let (status, _) = globex.get("/audit?tenant=acme").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let paged = deployment.read("/audit?limit=1").await;
    let next = paged["next"].as_str().expect("a next page");
    let second = deployment.read(&format!("/audit?limit=1&before={next}")).await;
    assert_eq!(second["entries"][0]["action"], "branch.end");

    acme_agent.cancel().await.unwrap();
    globex_agent.cancel().await.unwrap();
    gw.stop().await;
}

/// The fields every call of a branch has.
fn assert_call_fields(call: &Value) {
    for field in ["tokens_in", "tokens_out", "tokens_charged", "duration_ms"] {
        assert!(call[field].is_u64(), "{field} in {call}");
    }
    assert_eq!(
        call["tokens_charged"].as_u64(),
        Some(call["tokens_in"].as_u64().unwrap() + call["tokens_out"].as_u64().unwrap()),
        "charged in full: {call}"
    );
    assert_eq!(call["upstream"], "files");
    assert!(uuid::Uuid::parse_str(call["id"].as_str().unwrap()).is_ok(), "{call}");
    assert!(call["called_at"].as_str().unwrap().contains('T'), "{call}");
}

async fn a_branch_shows_its_calls_and_its_runs_steps(backend: Backend) {
    use foldgate_runner::{ModelConfig, Provider};
    use foldgate_testkit::{
        gateway::{FILES_AUTH, call_in, files_config, tools_until},
        model_server::{ModelServer, Reply, ToolCall},
        upstream::{LEAKED, Upstream},
    };
    let model = ModelServer::start().await;
    let files = Upstream::start(FILES_AUTH).await;
    let upstream = files_config(&files.url(), &["read_file", "leak", "fail"]);
    let chat = ModelConfig {
        name: "default".into(),
        provider: Provider::Openai,
        base_url: model.base_url(),
        model: "test-model".into(),
        api_key: Some("sk-operator-key".into()),
        tenants: Some(vec!["acme".into()]),
        max_output_tokens: 1_024,
        timeout: std::time::Duration::from_secs(5),
        stream: false,
        embeddings: false,
    };
    let gw = TestGateway::start_with(backend, |c| {
        c.upstreams = vec![upstream];
        c.models = vec![chat];
        c.folding.limits.creations_per_minute = 1000;
    })
    .await;
    let agent = gw.agent(Era::Legacy).await;
    tools_until(&agent, |n| n.contains(&"files__read_file".to_owned())).await;

    // An agent's branch with three calls (one a tool error), then a child.
    let prompt = "Look in src/ for the flaky test; never show this prompt";
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "read the sources", "prompt": prompt}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();
    for path in ["src/a.rs", "src/b.rs"] {
        let read = call_in(&agent, &id, "files__read_file", json!({"path": path})).await;
        assert_ne!(read.is_error, Some(true), "{read:?}");
    }
    let failed = call_in(&agent, &id, "files__fail", json!({})).await;
    assert_eq!(failed.is_error, Some(true));
    let child =
        ok(&call(&agent, "branch_create", json!({"session_id": "s1", "description": "child"}))
            .await);

    // A gateway-run branch: the model reads a file and the leaky tool at
    // once, then answers with a secret in its text.
    model.script(
        "flush handler",
        [
            Reply::tool_calls(
                vec![
                    ToolCall::new("c1", "files__read_file", json!({"path": "src/a.rs"})),
                    ToolCall::new("c2", "files__leak", json!({})),
                ],
                400,
                40,
            ),
            Reply::text(format!("The flush handler is handler_3 in src/a.rs; {LEAKED}"), 1_800, 20),
        ],
    );
    let run_prompt = "It is somewhere in src/a.rs, trust me";
    let run = ok(&call(
        &agent,
        "branch_run",
        json!({
            "session_id": "s2", "description": "Find the flush handler",
            "prompt": run_prompt, "budget": 8000,
        }),
    )
    .await);
    assert_eq!(run["status"], "completed", "{run:?}");
    let run_id = run["branch_id"].as_str().unwrap().to_owned();

    let deployment = Admin::deployment(&gw);
    let detail = deployment.read(&format!("/tenants/acme/branches/{id}")).await;
    assert_eq!((detail["session_id"].as_str(), &detail["parent_id"]), (Some("s1"), &Value::Null));
    let node = &detail["branch"];
    assert_eq!(node["branch_id"], id.as_str());
    assert_eq!((node["kind"].as_str(), node["status"].as_str()), (Some("agent"), Some("active")));
    assert_eq!((node["depth"].as_u64(), node["calls"].as_u64()), (Some(1), Some(3)));
    assert_eq!(node["description"], "read the sources");
    assert_eq!(node["model_usage"], Value::Null);
    assert_eq!(node["children"][0]["branch_id"], child["branch_id"]);
    assert_eq!(node["children"][0]["children"], json!([]), "its children without theirs");
    assert_eq!(node["budget"]["reserved"], node["children"][0]["budget"]["total"]);
    assert!(node.get("prompt").is_none() && !detail.to_string().contains(prompt), "no prompt");
    let calls = detail["calls"].as_array().unwrap();
    let seen: Vec<_> = calls
        .iter()
        .map(|c| (c["tool"].as_str().unwrap(), c["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [("fail", "tool_error"), ("read_file", "ok"), ("read_file", "ok")],
        "newest first"
    );
    calls.iter().for_each(assert_call_fields);
    let charged: u64 = calls.iter().map(|c| c["tokens_charged"].as_u64().unwrap()).sum();
    assert_eq!(node["call_tokens"].as_u64(), Some(charged));
    assert_eq!(detail["calls_next"], Value::Null);
    assert_eq!((&detail["run"], &detail["steps"]), (&Value::Null, &json!([])));
    assert_eq!(detail["steps_next"], Value::Null);

    // Calls a page at a time.
    let first = deployment.read(&format!("/tenants/acme/branches/{id}?calls_limit=2")).await;
    assert_eq!(first["calls"].as_array().unwrap().len(), 2);
    let next = first["calls_next"].as_str().expect("a next page");
    let rest = deployment
        .read(&format!("/tenants/acme/branches/{id}?calls_limit=2&calls_before={next}"))
        .await;
    assert_eq!(rest["calls"].as_array().unwrap().len(), 1);
    assert_eq!(rest["calls"][0]["id"], calls[2]["id"], "the oldest");
    assert_eq!(rest["calls_next"], Value::Null);

    // The gateway-run branch: its run, its steps newest first, its calls.
    let detail = deployment.read(&format!("/tenants/acme/branches/{run_id}")).await;
    let node = &detail["branch"];
    assert_eq!(
        (node["kind"].as_str(), node["status"].as_str()),
        (Some("gateway"), Some("completed"))
    );
    assert_eq!(
        node["model_usage"],
        json!({"model": "default", "calls": 2, "input_tokens": 2_200, "output_tokens": 60})
    );
    let ran = &detail["run"];
    assert_eq!((ran["model"].as_str(), ran["state"].as_str()), (Some("default"), Some("done")));
    assert_eq!((ran["steps"].as_u64(), ran["model_calls"].as_u64()), (Some(4), Some(2)));
    assert_eq!(
        (ran["input_tokens"].as_u64(), ran["output_tokens"].as_u64()),
        (Some(2_200), Some(60))
    );
    assert_eq!(ran["resumes"], 0);
    assert!(ran["tools"].as_array().unwrap().contains(&json!("files__read_file")), "{ran}");
    for field in ["created_at", "updated_at"] {
        assert!(ran[field].is_string(), "{field} in {ran}");
    }
    let steps = detail["steps"].as_array().unwrap();
    let kinds: Vec<_> =
        steps.iter().map(|s| (s["seq"].as_u64().unwrap(), s["kind"].as_str().unwrap())).collect();
    assert_eq!(kinds, [(3, "model"), (2, "tool"), (1, "tool"), (0, "model")]);
    for step in steps {
        for field in ["input_tokens", "output_tokens", "duration_ms"] {
            assert!(step[field].is_u64(), "{field} in {step}");
        }
        assert_eq!(
            (step["repeated"].as_bool(), step["truncated"].as_bool()),
            (Some(false), Some(false))
        );
        assert!(step["at"].is_string(), "{step}");
    }
    let asked = &steps[3];
    assert_eq!(
        (asked["input_tokens"].as_u64(), asked["output_tokens"].as_u64()),
        (Some(400), Some(40))
    );
    let asked_for: Vec<_> = asked["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), c["name"].as_str().unwrap()))
        .collect();
    assert_eq!(asked_for, [("c1", "files__read_file"), ("c2", "files__leak")]);
    assert_eq!(asked["tool_calls"][0]["arguments"], r#"{"path":"src/a.rs"}"#);
    assert_eq!((&asked["tool"], &asked["result"]), (&Value::Null, &Value::Null));
    let answered = &steps[0];
    let text = answered["text"].as_str().unwrap();
    assert!(text.starts_with("The flush handler is handler_3 in src/a.rs"), "{text}");
    assert!(!text.contains(LEAKED), "a model's text is scrubbed: {text}");
    assert_eq!(answered["tool_calls"], json!([]));
    for tool_step in &steps[1..3] {
        let tool = tool_step["tool"].as_str().unwrap();
        let result = tool_step["result"].as_str().unwrap();
        let call_id = if tool == "files__read_file" { "c1" } else { "c2" };
        assert_eq!(tool_step["call_id"], call_id, "{tool_step}");
        assert_eq!(tool_step["error"], false);
        assert_eq!(tool_step["text"], Value::Null);
        match tool {
            "files__read_file" => assert!(result.contains("handler_3"), "{result}"),
            _ => assert!(
                result.contains("[REDACTED:github-pat]") && !result.contains(LEAKED),
                "{result}"
            ),
        }
    }
    let run_calls: Vec<_> =
        detail["calls"].as_array().unwrap().iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(run_calls.len(), 2, "the run's upstream calls are its branch's");
    assert!(run_calls.contains(&"read_file") && run_calls.contains(&"leak"));
    detail["calls"].as_array().unwrap().iter().for_each(assert_call_fields);
    assert!(!detail.to_string().contains(run_prompt), "never the prompt");

    // Steps a page at a time; none at all.
    let first = deployment.read(&format!("/tenants/acme/branches/{run_id}?steps_limit=3")).await;
    assert_eq!(first["steps"].as_array().unwrap().len(), 3);
    assert_eq!(first["steps_next"], 1);
    let rest = deployment
        .read(&format!("/tenants/acme/branches/{run_id}?steps_limit=3&steps_before=1"))
        .await;
    assert_eq!(rest["steps"][0]["seq"], 0);
    assert_eq!((rest["steps"].as_array().unwrap().len(), &rest["steps_next"]), (1, &Value::Null));
    let bare = deployment
        .read(&format!("/tenants/acme/branches/{run_id}?steps_limit=0&calls_limit=0"))
        .await;
    assert_eq!((&bare["steps"], &bare["calls"]), (&json!([]), &json!([])));
    assert_eq!(bare["run"]["steps"], 4);

    // A tenant admin reads its own tenant's branches, and no other's.
    let acme = Admin::new(&gw, Some(gw.token("acme", "lead", &["tenant:admin"])));
    assert_eq!(
        acme.read(&format!("/tenants/acme/branches/{run_id}")).await["run"]["state"],
        "done"
    );
    let globex = Admin::new(&gw, Some(gw.token("globex", "lead", &["tenant:admin"])));
    for path in [format!("/tenants/acme/branches/{id}"), format!("/tenants/globex/branches/{id}")] {
        let (status, body) = globex.get(&path).await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"), "{path}");
    }
    let (status, body) = deployment.get(&format!("/tenants/globex/branches/{id}")).await;
    assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"), "another's");
    let missing = format!("/tenants/acme/branches/br_{}", uuid::Uuid::now_v7());
    let (status, body) = deployment.get(&missing).await;
    assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"));

    // Bad input is a 400 that says what is wrong.
    for query in [
        "",
        "?calls_limit=501",
        "?steps_limit=-1",
        "?calls_before=yesterday",
        "?steps_before=first",
        "?colour=blue",
    ] {
        let path = if query.is_empty() {
            "/tenants/acme/branches/not-a-branch".to_owned()
        } else {
            format!("/tenants/acme/branches/{id}{query}")
        };
        let (status, body) = acme.get(&path).await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{path}: {body}"
        );
    }

    agent.cancel().await.unwrap();
    gw.stop().await;
    files.down().await;
}

async fn the_openapi_document_describes_every_route(backend: Backend) {
    let gw = TestGateway::start(backend).await;
    let doc = Admin::new(&gw, None).read("/openapi.json").await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths: Vec<&str> = doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
    for path in [
        "/tenants",
        "/tenants/{tenant}/sessions",
        "/tenants/{tenant}/sessions/{session_id}",
        "/tenants/{tenant}/sessions/{session_id}/end",
        "/tenants/{tenant}/branches/{branch_id}",
        "/tenants/{tenant}/branches/{branch_id}/end",
        "/tenants/{tenant}/limits",
        "/tenants/{tenant}/usage",
        "/upstreams",
        "/upstreams/{name}",
        "/models",
        "/models/{name}",
        "/audit",
    ] {
        assert!(paths.contains(&path), "{path} missing from {paths:?}");
    }
    let schemas = &doc["components"]["schemas"];
    assert!(schemas["BranchNode"]["properties"]["children"].is_object());
    // A registration's body is the configuration file's declaration.
    assert!(schemas["UpstreamConfig"]["properties"]["headers"].is_object());
    assert!(schemas["ModelConfig"]["properties"]["provider"].is_object());
    assert!(doc["paths"]["/upstreams"]["post"]["requestBody"].is_object());
    assert!(schemas["BranchDetail"]["properties"]["steps"].is_object());
    assert!(schemas["StepView"]["properties"]["tool_calls"].is_object());
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    gw.stop().await;
}

/// Creates a branch on `url` and answers its allocated budget.
async fn allocated(url: &str, token: &str, budget: Option<u64>) -> u64 {
    let agent = client(url, token, Era::Discover).await;
    let mut args = json!({"session_id": format!("s{}", uuid::Uuid::new_v4()), "description": "d"});
    if let Some(budget) = budget {
        args["budget"] = json!(budget);
    }
    let created = ok(&call(&agent, "branch_create", args).await);
    agent.cancel().await.unwrap();
    created["budget_allocated"].as_u64().unwrap()
}

async fn limits_apply_on_every_replica_without_a_restart(backend: Backend) {
    let gw = TestGateway::start(backend).await;
    let audience = gw.audience.clone();
    let replica = gw.replica(|c| c.auth.audience = Some(audience)).await;
    let token = gw.write_token("acme", "alice");
    let deployment = Admin::deployment(&gw);
    let acme = Admin::new(&gw, Some(gw.token("acme", "lead", &["tenant:admin"])));

    let before = acme.read("/tenants/acme/limits").await;
    assert_eq!(before["overrides"], json!({}));
    let default_budget = before["effective"]["default_budget"].as_u64().unwrap();
    assert_eq!(allocated(&replica.url, &token, None).await, default_budget);

    // Only a deployment admin changes limits; bad values change nothing.
    let wanted = json!({"default_budget": 500, "max_budget": 1000, "creations_per_minute": 50});
    let (status, body) = acme.put("/tenants/acme/limits", wanted.clone()).await;
    assert_eq!((status, error_code(&body)), (StatusCode::FORBIDDEN, "forbidden"), "a tenant admin");
    for (bad, why) in [
        (json!({"max_depth": 0}), "max_depth"),
        (json!({"default_budget": 5000, "max_budget": 1000}), "budget"),
        (json!({"colour": "blue"}), "colour"),
        (json!("not an object"), "invalid type"),
    ] {
        let (status, body) = deployment.put("/tenants/acme/limits", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{why}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(why), "{why}: {body}");
    }
    assert_eq!(acme.read("/tenants/acme/limits").await["overrides"], json!({}), "unchanged");

    let (status, set) = deployment.put("/tenants/acme/limits", wanted.clone()).await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["overrides"], wanted);
    assert_eq!(set["effective"]["max_budget"], 1000);
    assert_eq!(set["deployment"], before["deployment"], "the deployment's own stay");
    assert_eq!(set["deployment"]["default_budget"].as_u64(), Some(default_budget));
    assert_eq!(set["updated_by"]["subject"], "root");

    // The other replica applies them within seconds.
    let mut applied = false;
    for _ in 0..50 {
        if allocated(&replica.url, &token, None).await == 500 {
            applied = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(applied, "the replica never applied the new default budget");
    assert_eq!(allocated(&replica.url, &token, Some(5000)).await, 1000, "capped at max_budget");
    let other = gw.write_token("globex", "gina");
    assert_eq!(allocated(&replica.url, &other, None).await, default_budget, "another tenant");

    let audit = deployment.read("/audit").await;
    assert_eq!(audit["entries"][0]["action"], "limits.update");
    assert_eq!(audit["entries"][0]["detail"], wanted);
    replica.stop().await;
    gw.stop().await;
}

async fn upstreams_and_models_are_listed_with_their_health(backend: Backend) {
    use foldgate_runner::{ModelConfig, Provider};
    use foldgate_testkit::gateway::{FILES_AUTH, files_config};
    let files = foldgate_testkit::upstream::Upstream::start(FILES_AUTH).await;
    let upstream = files_config(&files.url(), &["read_file"]);
    let model = ModelConfig {
        name: "chat".into(),
        provider: Provider::Anthropic,
        base_url: "https://user:secret@models.example/v1?key=k".into(),
        model: "claude-x".into(),
        api_key: Some("sk-test".into()),
        tenants: Some(vec!["acme".into()]),
        max_output_tokens: 1_024,
        timeout: std::time::Duration::from_secs(5),
        stream: false,
        embeddings: false,
    };
    let gw = TestGateway::start_with(backend, |c| {
        c.upstreams = vec![upstream];
        c.models = vec![model];
    })
    .await;
    let deployment = Admin::deployment(&gw);
    // The upstream's first listing is in the background.
    let mut listed = Value::Null;
    for _ in 0..50 {
        listed = deployment.read("/upstreams").await;
        if listed["upstreams"][0]["up"] == true {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let files_view = &listed["upstreams"][0];
    assert_eq!(files_view["name"], "files", "{listed}");
    assert_eq!((files_view["up"].as_bool(), files_view["tools"].as_u64()), (Some(true), Some(1)));
    assert_eq!(files_view["tools_allowed"], json!(["read_file"]));
    assert_eq!(files_view["source"], "config");
    let models = deployment.read("/models").await;
    assert_eq!(models["models"][0]["name"], "chat");
    assert_eq!(models["models"][0]["provider"], "anthropic");
    assert_eq!(models["models"][0]["base_url"], "https://models.example/v1", "no credentials");
    assert!(!models.to_string().contains("sk-test"), "never the key");

    // A tenant admin sees what serves its tenant, as its settings allow.
    let globex = Admin::new(&gw, Some(gw.token("globex", "lead", &["tenant:admin"])));
    assert_eq!(globex.read("/upstreams").await, json!({"upstreams": []}));
    assert_eq!(globex.read("/models").await, json!({"models": []}));
    let acme = Admin::new(&gw, Some(gw.token("acme", "lead", &["tenant:admin"])));
    assert_eq!(acme.read("/models").await["models"].as_array().unwrap().len(), 1);
    let (status, _) = deployment.put("/tenants/acme/limits", json!({"models": []})).await;
    assert_eq!(status, StatusCode::OK);
    let mut hidden = false;
    for _ in 0..50 {
        if acme.read("/models").await["models"].as_array().unwrap().is_empty() {
            hidden = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(hidden, "an empty allow-list of models hides them");
    gw.stop().await;
    files.down().await;
}

async fn retention_deletes_old_trees_while_the_gateway_runs(backend: Backend) {
    let gw = TestGateway::start_with(backend, |c| {
        c.retention.interval = std::time::Duration::from_secs(1)
    })
    .await;
    let agent = client(&gw.url, &gw.write_token("acme", "alice"), Era::Discover).await;
    for session in ["old", "new"] {
        let created =
            ok(&call(&agent, "branch_create", json!({"session_id": session, "description": "d"}))
                .await);
        let id = created["branch_id"].as_str().unwrap();
        ok(&call(&agent, "branch_return", json!({"branch_id": id, "message": "done"})).await);
        ok(&call(&agent, "session_end", json!({"session_id": session})).await);
    }
    let admin = Admin::deployment(&gw);
    assert_eq!(admin.get("/tenants/acme/sessions/old").await.0, StatusCode::OK);
    foldgate_testkit::age_session(&gw.db, "old", 40).await;

    // Within a pass or two, the old tree and then its session are gone.
    let mut gone = false;
    for _ in 0..50 {
        if admin.get("/tenants/acme/sessions/old").await.0 == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "retention never deleted the old session");
    let new = admin.read("/tenants/acme/sessions/new").await;
    assert_eq!(new["branches"].as_array().unwrap().len(), 1, "a recent tree stays");
    let ops = format!("http://{}/background", gw.running.ops_addr);
    let tasks: Value = reqwest::get(ops).await.unwrap().json().await.unwrap();
    let retention = tasks["tasks"].as_array().unwrap().iter().find(|t| t["name"] == "retention");
    assert!(retention.is_some(), "the retention task runs: {tasks}");
    // The usage of the deleted branch outlives it (each replica writes
    // what it counted every second, so it may land after the deletion).
    let mut usage = Value::Null;
    for _ in 0..50 {
        usage = admin.read("/tenants/acme/usage").await;
        if usage["total"]["returns"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(usage["total"]["returns"], 2, "{usage}");
    agent.cancel().await.unwrap();
    gw.stop().await;
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    retention_deletes_old_trees_while_the_gateway_runs,
    upstreams_and_models_are_listed_with_their_health,
    admins_reach_their_tenants_and_no_other,
    a_branch_shows_its_calls_and_its_runs_steps,
    the_openapi_document_describes_every_route,
    limits_apply_on_every_replica_without_a_restart
);
