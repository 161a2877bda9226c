//! Who calls, told to upstreams: a token the gateway mints and the
//! upstream verifies with the key set the gateway serves, or the
//! `Foldgate-*` headers; and a session per user, never shared.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Mutex, OnceLock},
};

use axum::{
    extract::{Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use foldgate_api::upstream::identity::IdentityConfig;
use jsonwebtoken::{DecodingKey, Validation, jwk::JwkSet};
use rmcp::{
    ServerHandler,
    model::{
        CallToolResponse, CallToolResult, ContentBlock, ErrorData, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    },
    service::{RequestContext, RoleServer},
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};

use super::*;

/// The audience the token upstream expects.
const AUDIENCE: &str = "urn:foldgate-test:whoami";

/// One request the upstream saw: whose (by its verified token or its
/// headers) and in which MCP session.
#[derive(Debug, Clone)]
struct Seen {
    tenant: Option<String>,
    sub: Option<String>,
    session: Option<String>,
}

/// A tenant and subject, as an upstream saw them (none for the gateway's
/// own requests in headers).
type User = (Option<String>, Option<String>);

/// What the upstream's front door knows: where the gateway's key set is
/// (set once the gateway runs), and what it let in.
#[derive(Default)]
struct Door {
    jwks_url: OnceLock<String>,
    seen: Mutex<Vec<Seen>>,
}

/// Who the caller is, as the front door established it.
#[derive(Debug, Clone)]
struct Who(Value);

/// Lets in a request whose bearer token verifies with the gateway's served
/// key set (for [`AUDIENCE`], from issuer `foldgate`), or one without a
/// token, taking who calls from its `Foldgate-*` headers; refuses any other
/// with 401.
async fn front_door(State(door): State<Arc<Door>>, mut req: Request, next: Next) -> Response {
    let (bearer, session, told) = {
        let header =
            |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bearer =
            header("authorization").and_then(|v| v.strip_prefix("Bearer ").map(str::to_owned));
        let told = json!({
            "tenant": header("foldgate-tenant"),
            "sub": header("foldgate-subject"),
            "scope": header("foldgate-scope"),
            "foldgate_branch": header("foldgate-branch"),
        });
        (bearer, header("mcp-session-id"), told)
    };
    let who = match bearer {
        Some(token) => match verify(&door, &token).await {
            Ok(claims) => claims,
            Err(why) => return (StatusCode::UNAUTHORIZED, why).into_response(),
        },
        None => told,
    };
    let (tenant, sub) = (who["tenant"].as_str(), who["sub"].as_str());
    let seen = Seen { tenant: tenant.map(str::to_owned), sub: sub.map(str::to_owned), session };
    door.seen.lock().unwrap().push(seen);
    req.extensions_mut().insert(Who(who));
    next.run(req).await
}

async fn verify(door: &Door, token: &str) -> Result<Value, String> {
    let url = door.jwks_url.get().ok_or("the key set is not known yet")?;
    let keys: JwkSet = reqwest::get(url)
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let header = jsonwebtoken::decode_header(token).map_err(|e| e.to_string())?;
    let jwk = keys.find(header.kid.as_deref().ok_or("no kid")?).ok_or("unknown kid")?;
    let key = DecodingKey::from_jwk(jwk).map_err(|e| e.to_string())?;
    let mut validation = Validation::new(header.alg);
    validation.set_audience(&[AUDIENCE]);
    validation.set_issuer(&["foldgate"]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let data =
        jsonwebtoken::decode::<Value>(token, &key, &validation).map_err(|e| e.to_string())?;
    Ok(data.claims)
}

/// An MCP server whose one tool answers who called it.
#[derive(Clone)]
struct Whoami;

impl ServerHandler for Whoami {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = foldgate_testkit::upstream::schema(json!({"type": "object"}));
        Ok(ListToolsResult::with_all_items(vec![Tool::new("whoami", "Who calls", schema)]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let who = parts.and_then(|p| p.extensions.get::<Who>()).map(|w| w.0.clone());
        let who = who.ok_or_else(|| ErrorData::internal_error("no caller", None))?;
        let answer = json!({
            "tenant": who["tenant"], "sub": who["sub"], "scope": who["scope"],
            "branch": who["foldgate_branch"],
        });
        Ok(CallToolResult::success(vec![ContentBlock::text(answer.to_string())]).into())
    }
}

/// The server on a free loopback port, with sessions (as stateful MCP
/// servers keep them); its URL.
async fn whoami_server(door: Arc<Door>) -> String {
    let mcp = StreamableHttpService::new(
        || Ok(Whoami),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_json_response(true)
            .with_sse_keep_alive(None)
            .disable_allowed_hosts(),
    );
    let app = Router::new()
        .route_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(door, front_door));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/mcp")
}

/// An RSA private key in a file, the gateway's signing key.
fn signing_key() -> (tempfile::TempDir, std::path::PathBuf) {
    use rsa::{
        RsaPrivateKey,
        pkcs8::{EncodePrivateKey, LineEnding},
    };
    let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("signing.pem");
    std::fs::write(&path, key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes()).unwrap();
    (dir, path)
}

fn whoami_of(result: &CallToolResult) -> Value {
    serde_json::from_str(&text_of(result)).unwrap_or_else(|e| panic!("{e}: {result:?}"))
}

#[tokio::test]
async fn upstreams_learn_who_calls_from_a_minted_token_or_headers() {
    let door = Arc::new(Door::default());
    let url = whoami_server(Arc::clone(&door)).await;
    let (_dir, key_file) = signing_key();
    let upstreams = vec![
        upstream_config(&format!(
            "[[upstreams]]\nname = \"minted\"\nurl = \"{url}\"\nidentity = \"token\"\n\
             identity_audience = \"{AUDIENCE}\"\nrefresh_interval = 1\n"
        )),
        upstream_config(&format!(
            "[[upstreams]]\nname = \"told\"\nurl = \"{url}\"\nidentity = \"headers\"\n\
             refresh_interval = 1\n"
        )),
    ];
    let gw = TestGateway::start_with(Backend::Sqlite, move |c| {
        c.upstreams = upstreams;
        c.identity = IdentityConfig { signing_key_file: Some(key_file), ..Default::default() };
    })
    .await;

    // The served key set: the configured RSA key, public half only, with
    // the thumbprint as its kid.
    let jwks_url = format!("{}/.well-known/jwks.json", gw.base);
    let served = reqwest::get(&jwks_url).await.unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["content-type"], "application/json");
    let served: Value = served.json().await.unwrap();
    let keys = served["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{served}");
    assert_eq!(
        (&keys[0]["kty"], &keys[0]["alg"], &keys[0]["use"]),
        (&json!("RSA"), &json!("RS256"), &json!("sig"))
    );
    assert!(keys[0]["kid"].as_str().is_some_and(|k| k.len() == 43), "{served}");
    assert!(keys[0].get("d").is_none(), "no private part");

    // Until the upstream can fetch the key set it refuses the gateway's
    // listings; then the tools appear.
    door.jwks_url.set(jwks_url).unwrap();
    let alice = gw.agent(Era::Legacy).await;
    tools_until(&alice, |n| {
        n.iter().any(|t| t == "minted__whoami") && n.iter().any(|t| t == "told__whoami")
    })
    .await;
    let bob = client(&gw.url, &gw.token("globex", "bob", &["fold:write"]), Era::Legacy).await;
    let carol = client(&gw.url, &gw.token("acme", "carol", &["fold:write"]), Era::Legacy).await;

    // Each caller is answered as itself.
    let seen = whoami_of(&call(&alice, "minted__whoami", json!({})).await);
    assert_eq!((&seen["tenant"], &seen["sub"]), (&json!("acme"), &json!("alice")), "{seen}");
    assert_eq!(seen["scope"], "fold:read fold:write memory:read memory:write");
    assert_eq!(seen["branch"], Value::Null, "outside any branch");
    let seen = whoami_of(&call(&bob, "minted__whoami", json!({})).await);
    assert_eq!(
        (&seen["tenant"], &seen["sub"], &seen["scope"]),
        (&json!("globex"), &json!("bob"), &json!("fold:write"))
    );
    let seen = whoami_of(&call(&carol, "minted__whoami", json!({})).await);
    assert_eq!((&seen["tenant"], &seen["sub"]), (&json!("acme"), &json!("carol")));

    // Inside a branch, the token names it.
    let created = ok(&call(
        &alice,
        "branch_create",
        json!({"session_id": "who", "description": "ask who", "budget": 4000}),
    )
    .await);
    let branch = created["branch_id"].as_str().unwrap();
    let seen = whoami_of(&call_in(&alice, branch, "minted__whoami", json!({})).await);
    assert_eq!(seen["branch"], branch);

    // The same in headers.
    let seen = whoami_of(&call_in(&alice, branch, "told__whoami", json!({})).await);
    let expected = json!({"tenant": "acme", "sub": "alice",
        "scope": "fold:read fold:write memory:read memory:write", "branch": branch});
    assert_eq!(seen, expected);
    let seen = whoami_of(&call(&bob, "told__whoami", json!({})).await);
    assert_eq!((&seen["tenant"], &seen["branch"]), (&json!("globex"), &Value::Null));
    let seen = whoami_of(&call(&carol, "told__whoami", json!({})).await);
    assert_eq!((&seen["tenant"], &seen["sub"]), (&json!("acme"), &json!("carol")));

    // A session per user (the upstreams are told who calls, and may bind
    // a session to the user who opened it), and one for the gateway's own
    // listings: no session is used by two of them.
    let mut owners: HashMap<String, BTreeSet<User>> = HashMap::new();
    for s in door.seen.lock().unwrap().iter() {
        if let Some(session) = &s.session {
            owners.entry(session.clone()).or_default().insert((s.tenant.clone(), s.sub.clone()));
        }
    }
    for (session, users) in &owners {
        assert_eq!(users.len(), 1, "session {session} is shared by {users:?}");
    }
    let users: BTreeSet<_> = owners.values().flatten().cloned().collect();
    let user = |t: &str, s: &str| (Some(t.to_owned()), Some(s.to_owned()));
    let expected: BTreeSet<_> = [
        (None, None),                        // the headers upstream's listings
        (None, Some("foldgate".to_owned())), // the token upstream's listings
        user("acme", "alice"),
        user("acme", "carol"),
        user("globex", "bob"),
    ]
    .into();
    assert_eq!(users, expected);
    // Two upstreams, each with four sessions: alice's, carol's, bob's and its own.
    assert_eq!(owners.len(), 8, "{owners:?}");
    gw.stop().await;
}

/// Counts the requests it gets and answers each with `status`, pointing
/// (`Location`) at `to`; its URL.
async fn counting(hits: Arc<AtomicUsize>, status: StatusCode, to: String) -> String {
    let app = Router::new().fallback(move || {
        let (hits, to) = (Arc::clone(&hits), to.clone());
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            (status, [(axum::http::header::LOCATION, to)], "")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/mcp")
}

#[tokio::test]
async fn an_upstreams_redirect_is_not_followed() {
    // An upstream that redirects elsewhere would have the gateway send the
    // caller's identity (and its credentials) there, over any scheme.
    let elsewhere = Arc::new(AtomicUsize::new(0));
    let target = counting(Arc::clone(&elsewhere), StatusCode::NOT_FOUND, String::new()).await;
    let redirected = Arc::new(AtomicUsize::new(0));
    let url = counting(Arc::clone(&redirected), StatusCode::TEMPORARY_REDIRECT, target).await;
    let config = upstream_config(&format!(
        "[[upstreams]]\nname = \"moved\"\nurl = \"{url}\"\nidentity = \"headers\"\n\
         refresh_interval = 1\n[upstreams.headers]\nAuthorization = \"Bearer moved-secret\"\n"
    ));
    let gw = TestGateway::with_upstreams(Backend::Sqlite, vec![config]).await;
    // The gateway tries to list its tools, and retries.
    for _ in 0..100 {
        if redirected.load(Ordering::SeqCst) >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(redirected.load(Ordering::SeqCst) >= 3, "the upstream was asked again and again");
    assert_eq!(elsewhere.load(Ordering::SeqCst), 0, "nothing went where it pointed");
    gw.stop().await;
}
