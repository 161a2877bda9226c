//! The middleware in front of a real axum router, and its HTTP answers.

use super::{
    jwks::{JwksServer, jwks_only},
    *,
};

/// The inner handler reports what reached it.
async fn echo(request: Request) -> Json<Value> {
    let auth = request.extensions().get::<Authenticated>();
    Json(json!({
        "saw_authorization": request.headers().contains_key(header::AUTHORIZATION),
        "tenant": auth.map(|a| a.principal.tenant.to_string()),
        "sub": auth.map(|a| a.principal.subject.to_string()),
        "scopes": auth.map(|a| a.scopes.iter().cloned().collect::<Vec<_>>()),
    }))
}

fn app(mode: AuthMode) -> Router {
    let state = AuthState::new(mode, METADATA_URL);
    Router::new().route("/mcp", post(echo)).layer(from_fn_with_state(state, authenticate_request))
}

async fn call(app: Router, authorization: Option<&str>) -> (StatusCode, HeaderMap, Value) {
    let mut request = Request::post("/mcp").header(header::CONTENT_TYPE, "application/json");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let response = app.oneshot(request.body(Body::from("{}")).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, serde_json::from_slice(&bytes).unwrap())
}

fn challenge(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::WWW_AUTHENTICATE).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn middleware_refusals() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let expired = sign_hs256(&patch(claims(&clock), &json!({"exp": now(&clock) - 3600})), SECRET);
    let plain = format!("Bearer resource_metadata=\"{METADATA_URL}\"");
    let cases: Vec<(&str, Option<String>, String, &str)> = vec![
        ("no Authorization header", None, plain.clone(), "authentication required"),
        (
            "Basic credentials",
            Some("Basic dXNlcjpwYXNz".into()),
            plain.clone(),
            "authentication required",
        ),
        (
            "expired token",
            Some(format!("Bearer {expired}")),
            format!(
                "{plain}, error=\"invalid_token\", error_description=\"the token has expired\""
            ),
            "the token has expired",
        ),
        (
            "garbage token",
            Some("Bearer not-a-jwt".into()),
            format!(
                "{plain}, error=\"invalid_token\", error_description=\"malformed token: a JWT has \
                 three dot-separated parts\""
            ),
            "malformed token",
        ),
    ];
    for (why, authorization, expected_challenge, message) in cases {
        // Act
        let (status, headers, body) =
            call(app(AuthMode::Jwt(auth.clone())), authorization.as_deref()).await;
        // Assert
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}");
        assert_eq!(challenge(&headers), Some(expected_challenge.as_str()), "{why}");
        assert_eq!(
            headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap()),
            Some("application/json"),
            "{why}"
        );
        assert_eq!(body["jsonrpc"], "2.0", "{why}");
        assert_eq!(body["id"], Value::Null, "{why}");
        assert_eq!(body["error"]["code"], -32001, "{why}");
        let text = body["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{why}: {text:?}");
        assert!(!text.contains(&expired), "{why}: the token is never echoed");
    }
}

#[tokio::test]
async fn middleware_passes_the_principal_and_strips_the_token() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let token = sign_hs256(&patch(claims(&clock), &json!({"scope": "fold:read"})), SECRET);
    let cases =
        [("Bearer", "canonical scheme"), ("bearer", "lower-case scheme"), ("BEARER", "upper-case")];
    for (scheme, why) in cases {
        // Act
        let (status, _, body) =
            call(app(AuthMode::Jwt(auth.clone())), Some(&format!("{scheme} {token}"))).await;
        // Assert
        assert_eq!(status, StatusCode::OK, "{why}: {body}");
        assert_eq!(body["saw_authorization"], false, "{why}: the token must not reach the handler");
        assert_eq!(body["tenant"], "acme", "{why}");
        assert_eq!(body["sub"], "alice@acme.test", "{why}");
        assert_eq!(body["scopes"], json!(["fold:read"]), "{why}");
    }
}

#[tokio::test]
async fn auth_none_is_the_local_principal() {
    let cases = [(None, "no header"), (Some("Bearer whatever"), "a token is ignored and stripped")];
    for (authorization, why) in cases {
        let (status, _, body) = call(app(AuthMode::None), authorization).await;
        assert_eq!(status, StatusCode::OK, "{why}");
        assert_eq!(body["saw_authorization"], false, "{why}");
        assert_eq!(body["tenant"], "local", "{why}");
        assert_eq!(body["sub"], "anonymous", "{why}");
        assert_eq!(
            body["scopes"],
            json!([
                "fold:read",
                "fold:write",
                "foldgate:admin",
                "memory:read",
                "memory:write",
                "tenant:admin"
            ]),
            "{why}"
        );
    }
}

#[tokio::test]
async fn middleware_answers_503_when_the_keys_are_unavailable() {
    let clock = clock();
    let key = TestKey::p256();
    let server = JwksServer::start(vec![]).await;
    server.healthy.store(false, Ordering::SeqCst);
    let auth = authenticator(&jwks_only(&server.url), &clock).await;
    let token = key.sign(Some("k"), &claims(&clock));

    let (status, headers, body) =
        call(app(AuthMode::Jwt(auth)), Some(&format!("Bearer {token}"))).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers.get(header::RETRY_AFTER).map(|v| v.to_str().unwrap()), Some("30"));
    assert_eq!(challenge(&headers), None, "the client's token is not at fault");
    assert_eq!(body["error"]["code"], -32004);
}

#[tokio::test]
async fn insufficient_scope_is_a_403_challenge() {
    let response = insufficient_scope_response(SCOPE_WRITE, METADATA_URL);
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        challenge(response.headers()),
        Some(
            format!(
                "Bearer error=\"insufficient_scope\", scope=\"fold:write\", \
                 resource_metadata=\"{METADATA_URL}\""
            )
            .as_str()
        )
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], Value::Null);
    assert_eq!(body["error"]["code"], -32003);
    assert!(body["error"]["message"].as_str().unwrap().contains("fold:write"));
}

#[tokio::test]
async fn error_descriptions_cannot_break_the_challenge() {
    let err =
        AuthError::BadClaims("the `tenant` claim is not a valid tenant id: contains '\"'\\".into());
    let response = auth_error_response(&err, "https://gw.test/\"x");
    let value = challenge(response.headers()).unwrap();
    assert_eq!(value.matches('"').count(), 6, "three quoted attributes, nothing more: {value}");
    assert!(!value.contains('\\'), "{value}");
}

#[test]
fn protected_resource_metadata() {
    let url = resource_metadata_url(AUDIENCE).unwrap();
    assert_eq!(url, METADATA_URL);
    let doc = serde_json::to_value(ProtectedResourceMetadata::new(AUDIENCE, &[ISSUER.to_owned()]))
        .unwrap();
    assert_eq!(
        doc,
        json!({
            "resource": AUDIENCE,
            "authorization_servers": [ISSUER],
            "scopes_supported": ["fold:read", "fold:write", "memory:read", "memory:write"],
            "bearer_methods_supported": ["header"],
        })
    );
}
