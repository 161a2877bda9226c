//! Authentication: bad tokens, algorithm confusion, scopes, smuggled members.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_with_a_challenge() {
    let gw =
        TestGateway::start_with(Backend::Sqlite, |c| c.auth.issuer = Some(ISSUER.into())).await;
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    let secret = foldgate_testkit::gateway::SECRET.as_bytes();
    let good = sign_hs256(&valid_claims(&gw), secret);

    // The control: the same claims, correctly signed, pass.
    let reply = post_raw(&gw, Some(&good), body.clone()).await;
    assert_eq!(reply.tool_result("valid token")["branch_id"], Value::Null);

    let claims = |changes: Value| patched(valid_claims(&gw), &changes);
    let cases: Vec<(Option<String>, &str)> = vec![
        (None, "no token"),
        (Some(sign_hs256(&claims(json!({"exp": now() - 120})), secret)), "expired"),
        (
            Some(sign_hs256(&claims(json!({"nbf": now() + 120})), secret)),
            "not yet valid (beyond the leeway)",
        ),
        (
            Some(sign_hs256(&claims(json!({"iss": "https://other-idp.example"})), secret)),
            "wrong issuer",
        ),
        (Some(sign_hs256(&claims(json!({"iss": null})), secret)), "no issuer"),
        (
            Some(sign_hs256(&claims(json!({"aud": "https://other.example/mcp"})), secret)),
            "wrong audience",
        ),
        (Some(sign_hs256(&claims(json!({"aud": null})), secret)), "no audience"),
        (Some(unsigned(&valid_claims(&gw), "")), "alg none, empty signature"),
        (Some(unsigned(&valid_claims(&gw), signature_of(&good))), "alg none, a real signature"),
        (
            Some(with_payload(&good, &claims(json!({"tenant": "globex"})))),
            "tampered payload (tenant changed)",
        ),
        (
            Some(with_payload(&good, &claims(json!({"exp": now() + 86_400 * 365})))),
            "tampered payload (expiry extended)",
        ),
        (
            Some(sign_hs256(&valid_claims(&gw), b"another-secret-that-is-long-enough-0123456789")),
            "wrong secret",
        ),
        (Some("not-a-jwt".to_owned()), "not a JWT"),
    ];
    for (token, why) in cases {
        let reply = post_raw(&gw, token.as_deref(), body.clone()).await;
        assert_unauthorized(&reply, &gw, token.is_some(), why);
    }

    // Another scheme is no bearer token.
    let http = reqwest::Client::new();
    let reply = send(
        mcp_request(&http, &gw.url, None, Wire::Legacy)
            .header("Authorization", "Basic YWxpY2U6c2VjcmV0")
            .body(body.clone()),
    )
    .await;
    assert_unauthorized(&reply, &gw, false, "basic auth");
    gw.stop().await;
}

/// A gateway configured with an RSA public key refuses an HS256 token
/// signed with that key's PEM text as the HMAC secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithm_confusion_is_refused() {
    use rsa::{
        RsaPrivateKey,
        pkcs1::EncodeRsaPrivateKey,
        pkcs8::{EncodePublicKey, LineEnding},
    };
    let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
    let private_pem = key.to_pkcs1_pem(LineEnding::LF).unwrap().to_string();
    let public_pem = key.to_public_key().to_public_key_pem(LineEnding::LF).unwrap();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(public_pem.as_bytes()).unwrap();
    let path = file.path().to_owned();

    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.auth.jwt_secret = None;
        c.auth.public_key_file = Some(path);
        c.auth.issuer = Some(ISSUER.into());
    })
    .await;
    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();

    let rsa_key = EncodingKey::from_rsa_pem(private_pem.as_bytes()).unwrap();
    let good = sign(Algorithm::RS256, &valid_claims(&gw), &rsa_key);
    let reply = post_raw(&gw, Some(&good), body.clone()).await;
    assert_eq!(reply.tool_result("RS256 control")["branch_id"], Value::Null);

    let cases = [
        (sign_hs256(&valid_claims(&gw), public_pem.as_bytes()), "HS256 with the PEM as secret"),
        (
            sign_hs256(&valid_claims(&gw), public_pem.trim_end().as_bytes()),
            "HS256 with the trimmed PEM as secret",
        ),
        (
            sign(
                Algorithm::HS384,
                &valid_claims(&gw),
                &EncodingKey::from_secret(public_pem.as_bytes()),
            ),
            "HS384 with the PEM as secret",
        ),
        (
            sign_hs256(&valid_claims(&gw), foldgate_testkit::gateway::SECRET.as_bytes()),
            "HS256 with the test secret",
        ),
        (unsigned(&valid_claims(&gw), ""), "alg none"),
        (
            with_payload(&good, &patched(valid_claims(&gw), &json!({"tenant": "globex"}))),
            "RS256 with a tampered payload",
        ),
    ];
    for (token, why) in cases {
        let reply = post_raw(&gw, Some(&token), body.clone()).await;
        assert_unauthorized(&reply, &gw, true, why);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_scopes_are_refused_with_insufficient_scope() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let read_only = gw.token("acme", "alice", &["fold:read"]);
    let write_only = gw.token("acme", "alice", &["fold:write"]);
    let no_scope = gw.token("acme", "alice", &[]);
    let create = json!({"session_id": "s", "description": "d"});
    let ret = json!({"branch_id": UNKNOWN_BRANCH, "message": "m"});
    let status = json!({"session_id": "s"});
    let end = json!({"session_id": "s"});
    let cases = [
        (&read_only, "branch_create", &create, "fold:write", "read-only creates"),
        (&read_only, "branch_return", &ret, "fold:write", "read-only returns"),
        (&read_only, "session_end", &end, "fold:write", "read-only ends a session"),
        (&write_only, "branch_status", &status, "fold:read", "write-only reads status"),
        (&no_scope, "branch_status", &status, "fold:read", "no scope reads status"),
        (&no_scope, "branch_create", &create, "fold:write", "no scope creates"),
    ];
    for (token, tool, args, scope, why) in cases {
        let reply = post_tool(&gw, token, tool, args.clone()).await;
        reply.jsonrpc_error(StatusCode::FORBIDDEN, -32003, why);
        let challenge = reply.header(WWW_AUTHENTICATE).unwrap_or_else(|| panic!("{why}"));
        assert!(
            challenge
                .starts_with(&format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\"")),
            "{why}: {challenge}"
        );
        assert!(
            challenge.contains(&format!("resource_metadata=\"{}\"", metadata_url(&gw))),
            "{why}: {challenge}"
        );
    }
    // Nothing was created by the refused calls.
    let full = gw.write_token("acme", "alice");
    let reply = post_tool(&gw, &full, "branch_status", status.clone()).await;
    assert_eq!(reply.tool_result("after refusals")["branch_id"], Value::Null);

    // The controls: each scope is enough for its own tools.
    let reply = post_tool(&gw, &read_only, "branch_status", status).await;
    assert_eq!(reply.tool_result("read-only reads")["branch_id"], Value::Null);
    let reply = post_tool(&gw, &write_only, "branch_create", create).await;
    assert_eq!(reply.tool_result("write-only creates")["depth"], 1);
    gw.stop().await;
}

/// JSON objects with repeated members, where the checks in front of rmcp
/// and rmcp itself might read different values: none may let a read-only
/// token create a branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_members_cannot_smuggle_a_call_past_the_checks() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let read_only = gw.token("acme", "alice", &["fold:read"]);
    let args = r#"{"session_id": "smuggled", "description": "d"}"#;
    let cases = [
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {{"name": "branch_create", "arguments": {args}}}, "method": "ping"}}"#
            ),
            "method repeated",
        ),
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "tools/call",
                    "params": {{"name": "branch_create", "arguments": {args}}}}}"#
            ),
            "method repeated, tools/call last",
        ),
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {{"name": "branch_create", "name": "branch_status", "arguments": {args}}}}}"#
            ),
            "name repeated, read tool last",
        ),
        (
            format!(
                r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {{"name": "branch_create", "arguments": {args}}},
                    "params": {{"name": "branch_status", "arguments": {{"session_id": "s"}}}}}}"#
            ),
            "params repeated, read call last",
        ),
    ];
    for (body, why) in cases {
        let reply = post_raw(&gw, Some(&read_only), body).await;
        assert!(
            matches!(reply.status, StatusCode::BAD_REQUEST | StatusCode::FORBIDDEN),
            "{why}: {reply:?}"
        );
        assert!(reply.body["error"]["code"].is_i64(), "{why}: a JSON-RPC error: {reply:?}");
    }
    let full = gw.write_token("acme", "alice");
    let reply = post_tool(&gw, &full, "branch_status", json!({"session_id": "smuggled"})).await;
    assert_eq!(reply.tool_result("nothing was created")["branch_id"], Value::Null);
    gw.stop().await;
}

/// An RSA key pair: the private key signs, the public one is published.
struct RsaKey {
    encoding: EncodingKey,
    public_pem: String,
}

impl RsaKey {
    fn generate() -> Self {
        use rsa::{
            RsaPrivateKey,
            pkcs1::EncodeRsaPrivateKey,
            pkcs8::{EncodePublicKey, LineEnding},
        };
        let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
        let private_pem = key.to_pkcs1_pem(LineEnding::LF).unwrap();
        Self {
            encoding: EncodingKey::from_rsa_pem(private_pem.as_bytes()).unwrap(),
            public_pem: key.to_public_key().to_public_key_pem(LineEnding::LF).unwrap(),
        }
    }

    fn jwk(&self, kid: &str) -> Value {
        let mut jwk =
            jsonwebtoken::jwk::Jwk::from_encoding_key(&self.encoding, Algorithm::RS256).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        serde_json::to_value(jwk).unwrap()
    }

    fn sign(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

/// An identity provider on loopback that serves its discovery document
/// and key set; returns its issuer.
async fn discoverable_issuer(jwk: Value) -> String {
    use axum::{Json, Router, routing::get};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let issuer = format!("{base}/realms/agents");
    let document = json!({"issuer": issuer, "jwks_uri": format!("{base}/certs")});
    let app = Router::new()
        .route(
            "/realms/agents/.well-known/openid-configuration",
            get(move || async move { Json(document) }),
        )
        .route("/certs", get(move || async move { Json(json!({"keys": [jwk]})) }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    issuer
}

/// Two trusted issuers: tokens of each are verified with its own keys,
/// audience and tenant claim; the metadata lists both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_trusted_issuers_each_with_its_own_audience_and_tenant_claim() {
    // Arrange: issuer A found by discovery (the gateway's URL as audience,
    // the tenant in `tenant`), issuer B by a PEM key (its own audience, the
    // tenant in `org`).
    let (key_a, key_b) = (RsaKey::generate(), RsaKey::generate());
    let issuer_a = discoverable_issuer(key_a.jwk("a-1")).await;
    let issuer_b = "https://login.example.com/tenant-id/v2.0";
    let mut pem = tempfile::NamedTempFile::new().unwrap();
    pem.write_all(key_b.public_pem.as_bytes()).unwrap();
    let pem_path = pem.path().to_owned();
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        use foldgate_api::auth::IssuerConfig;
        c.auth.jwt_secret = None;
        c.auth.issuers = vec![
            IssuerConfig {
                issuer: issuer_a.clone(),
                discovery: true,
                jwks_url: None,
                public_key_file: None,
                jwks_allow_http: false,
                audience: None,
                tenant_claim: "tenant".into(),
            },
            IssuerConfig {
                issuer: issuer_b.into(),
                discovery: false,
                jwks_url: None,
                public_key_file: Some(pem_path),
                jwks_allow_http: false,
                audience: Some("api://foldgate".into()),
                tenant_claim: "org".into(),
            },
        ];
    })
    .await;
    let claims_a =
        |tenant: &str| patched(valid_claims(&gw), &json!({"iss": issuer_a, "tenant": tenant}));
    let claims_b = |org: &str| {
        json!({
            "iss": issuer_b, "aud": "api://foldgate", "sub": "alice", "org": org,
            "scope": "fold:read fold:write", "exp": now() + 600,
        })
    };

    // Act and assert: the metadata names both authorization servers.
    let metadata = send(reqwest::Client::new().get(metadata_url(&gw))).await;
    assert_eq!(metadata.body["authorization_servers"], json!([issuer_a, issuer_b]));

    // Alice's agent with A's token (tenant acme from `tenant`) creates a
    // branch...
    let agent_a = client(&gw.url, &key_a.sign("a-1", &claims_a("acme")), Era::Legacy).await;
    let created = ok(&call(
        &agent_a,
        "branch_create",
        json!({"session_id": "two-issuers", "description": "issuer A's work", "budget": 1024}),
    )
    .await);
    let branch = created["branch_id"].clone();
    // ...that she sees with B's token naming the same tenant (in `org`),
    // and not with B's token naming another.
    let acme_b = client(&gw.url, &key_b.sign("b-1", &claims_b("acme")), Era::Legacy).await;
    let status = ok(&call(&acme_b, "branch_status", json!({"branch_id": branch})).await);
    assert_eq!(status["status"], "active");
    let globex_b = client(&gw.url, &key_b.sign("b-1", &claims_b("globex")), Era::Legacy).await;
    let refused = call(&globex_b, "branch_status", json!({"branch_id": branch})).await;
    assert_eq!(refusal(&refused).0, "branch_not_found");

    let body = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"})).to_string();
    let cases = [
        (
            key_a.sign("a-1", &patched(claims_a("acme"), &json!({"aud": "api://foldgate"}))),
            "issuer A's token with issuer B's audience",
        ),
        (
            key_b.sign("b-1", &patched(claims_b("acme"), &json!({"aud": gw.url}))),
            "issuer B's token with issuer A's audience",
        ),
        (
            key_b.sign("b-1", &patched(claims_b("acme"), &json!({"org": null, "tenant": "acme"}))),
            "issuer B's token with the tenant in issuer A's claim",
        ),
        (
            key_b.sign("b-1", &patched(claims_a("acme"), &json!({"iss": issuer_b}))),
            "issuer B's name and key with issuer A's audience and tenant claim",
        ),
        (key_a.sign("a-1", &claims_b("acme")), "issuer B's claims signed by issuer A's key"),
        (
            key_a.sign("a-1", &patched(claims_a("acme"), &json!({"iss": "https://idp.example"}))),
            "an issuer the gateway does not trust",
        ),
    ];
    for (token, why) in cases {
        let reply = post_raw(&gw, Some(&token), body.clone()).await;
        assert_unauthorized(&reply, &gw, true, why);
    }
    gw.stop().await;
}
