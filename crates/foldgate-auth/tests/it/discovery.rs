//! Key sets found through an issuer's discovery document, served with the
//! keys by an identity provider on a random port.

use super::*;

/// An identity provider on a random port: its OpenID Connect discovery
/// document, its RFC 8414 metadata (each served only once set), and key
/// sets at `/jwks` and `/jwks-2`. It records the path of every request.
pub(super) struct Idp {
    /// `http://127.0.0.1:<port>/realms/<realm>`.
    pub(super) issuer: String,
    /// `http://127.0.0.1:<port>`.
    pub(super) base: String,
    state: IdpState,
}

#[derive(Clone, Default)]
struct IdpState {
    openid: Arc<Mutex<Option<Value>>>,
    oauth: Arc<Mutex<Option<Value>>>,
    jwks: Arc<Mutex<Vec<Value>>>,
    jwks_2: Arc<Mutex<Vec<Value>>>,
    requests: Arc<Mutex<Vec<String>>>,
    healthy: Arc<AtomicBool>,
}

impl Idp {
    /// A provider whose discovery document names itself and `/jwks`, which
    /// holds `keys`.
    pub(super) async fn start(realm: &str, keys: Vec<Value>) -> Self {
        let state = IdpState { healthy: Arc::new(AtomicBool::new(true)), ..IdpState::default() };
        async fn serve(
            State(state): State<IdpState>,
            request: Request,
        ) -> axum::response::Response {
            let path = request.uri().path().to_owned();
            state.requests.lock().unwrap().push(path.clone());
            if !state.healthy.load(Ordering::SeqCst) {
                return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
            }
            let document = |doc: &Arc<Mutex<Option<Value>>>| match doc.lock().unwrap().clone() {
                Some(doc) => Json(doc).into_response(),
                None => StatusCode::NOT_FOUND.into_response(),
            };
            match path.as_str() {
                "/jwks" => Json(json!({"keys": *state.jwks.lock().unwrap()})).into_response(),
                "/jwks-2" => Json(json!({"keys": *state.jwks_2.lock().unwrap()})).into_response(),
                p if p.ends_with("/.well-known/openid-configuration") => document(&state.openid),
                p if p.starts_with("/.well-known/oauth-authorization-server/") => {
                    document(&state.oauth)
                }
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
        let app = Router::new().fallback(serve).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let issuer = format!("{base}/realms/{realm}");
        *state.jwks.lock().unwrap() = keys;
        *state.openid.lock().unwrap() =
            Some(json!({"issuer": issuer, "jwks_uri": format!("{base}/jwks")}));
        Self { issuer, base, state }
    }

    pub(super) fn openid_path(&self) -> String {
        format!("{}/.well-known/openid-configuration", self.issuer.trim_start_matches(&self.base))
    }

    /// The paths requested so far.
    pub(super) fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    fn set_openid(&self, document: Option<Value>) {
        *self.state.openid.lock().unwrap() = document;
    }

    fn set_oauth(&self, document: Option<Value>) {
        *self.state.oauth.lock().unwrap() = document;
    }

    fn set_jwks_2(&self, keys: Vec<Value>) {
        *self.state.jwks_2.lock().unwrap() = keys;
    }
}

/// The single-issuer form with discovery from `issuer`.
pub(super) fn discovery_config(issuer: &str) -> AuthConfig {
    AuthConfig { jwt_secret: None, issuer: Some(issuer.to_owned()), discovery: true, ..hs_config() }
}

fn claims_of(idp: &Idp, clock: &ManualClock) -> Value {
    patch(claims(clock), &json!({"iss": idp.issuer}))
}

#[tokio::test]
async fn discovery_finds_the_key_set_and_its_tokens_verify() {
    // Arrange
    let clock = clock();
    let key = TestKey::p256();
    let idp = Idp::start("agents", vec![key.jwk(Some("k1"))]).await;

    // Act
    let auth = authenticator(&discovery_config(&idp.issuer), &clock).await;

    // Assert
    assert_eq!(idp.requests(), [idp.openid_path(), "/jwks".to_owned()], "discovery, then keys");
    let base = claims_of(&idp, &clock);
    let cases = [
        ("the issuer's token", key.sign(Some("k1"), &base), Ok(())),
        ("another key", TestKey::p256().sign(Some("k1"), &base), Err("bad_signature")),
        (
            "another issuer",
            key.sign(Some("k1"), &patch(base.clone(), &json!({"iss": ISSUER}))),
            Err("wrong_issuer"),
        ),
        (
            "another audience",
            key.sign(Some("k1"), &patch(base.clone(), &json!({"aud": "https://other/mcp"}))),
            Err("wrong_audience"),
        ),
    ];
    for (why, token, expected) in cases {
        assert_eq!(kind(&auth.authenticate(&token).await), expected, "{why}");
    }
    let caller = auth.authenticate(&key.sign(Some("k1"), &base)).await.unwrap();
    assert_eq!(caller.principal.tenant.as_str(), "acme");
    assert_eq!(idp.requests().len(), 2, "known keys are served from the cache");
}

#[tokio::test]
async fn a_discovery_document_naming_another_issuer_is_refused() {
    // Arrange: the document names the issuer with a trailing slash, which
    // is another issuer identifier.
    let clock = clock();
    let key = TestKey::p256();
    let idp = Idp::start("agents", vec![key.jwk(Some("k1"))]).await;
    idp.set_openid(Some(
        json!({"issuer": format!("{}/", idp.issuer), "jwks_uri": format!("{}/jwks", idp.base)}),
    ));

    // Act: startup goes on; the keys are not taken from it.
    let auth = authenticator(&discovery_config(&idp.issuer), &clock).await;
    let err = auth.authenticate(&key.sign(Some("k1"), &claims_of(&idp, &clock))).await.unwrap_err();

    // Assert
    assert!(err.is_unavailable(), "{err:?}");
    let AuthError::Unavailable { source, .. } = &err else { unreachable!() };
    let cause = source.to_string();
    assert!(cause.contains(&format!("names the issuer \"{}/\"", idp.issuer)), "{cause}");
    assert_eq!(idp.requests(), [idp.openid_path()], "the key set it names is never fetched");

    let checks = check_key_sources(&discovery_config(&idp.issuer), true).await.unwrap();
    let outcome = checks[0].outcome.as_ref().unwrap_err();
    assert!(
        outcome.contains("set issuer to exactly the provider's issuer identifier"),
        "{outcome}"
    );
}

#[tokio::test]
async fn rfc_8414_metadata_serves_when_there_is_no_openid_configuration() {
    // Arrange
    let clock = clock();
    let key = TestKey::ed25519();
    let idp = Idp::start("plain-oauth", vec![key.jwk(Some("ed"))]).await;
    idp.set_openid(None);
    idp.set_oauth(Some(json!({"issuer": idp.issuer, "jwks_uri": format!("{}/jwks", idp.base)})));

    // Act
    let auth = authenticator(&discovery_config(&idp.issuer), &clock).await;

    // Assert
    assert_eq!(
        idp.requests(),
        [
            idp.openid_path(),
            "/.well-known/oauth-authorization-server/realms/plain-oauth".to_owned(),
            "/jwks".to_owned()
        ]
    );
    assert!(auth.authenticate(&key.sign(Some("ed"), &claims_of(&idp, &clock))).await.is_ok());

    // Neither document: both places are named.
    idp.set_oauth(None);
    let checks = check_key_sources(&discovery_config(&idp.issuer), true).await.unwrap();
    let outcome = checks[0].outcome.as_ref().unwrap_err();
    assert!(
        outcome.contains("no discovery document") && outcome.contains("both answered HTTP 404")
    );
}

#[tokio::test]
async fn a_moved_key_set_is_followed_when_the_keys_are_refreshed_for_their_age() {
    // Arrange
    let clock = clock();
    let (old, new) = (TestKey::p256(), TestKey::p256());
    let idp = Idp::start("agents", vec![old.jwk(Some("old"))]).await;
    let config = AuthConfig { token_cache_entries: 0, ..discovery_config(&idp.issuer) };
    let auth = authenticator(&config, &clock).await;
    let mut driver = foldgate_background::Driver::default();
    auth.register(&mut driver);
    let background = driver.start();
    let long_lived = patch(claims_of(&idp, &clock), &json!({"exp": now(&clock) + 7200}));
    let (old_token, new_token) =
        (old.sign(Some("old"), &long_lived), new.sign(Some("new"), &long_lived));
    assert!(auth.authenticate(&old_token).await.is_ok());

    // The provider moves its key set; the old address still answers.
    idp.set_jwks_2(vec![new.jwk(Some("new"))]);
    idp.set_openid(Some(json!({"issuer": idp.issuer, "jwks_uri": format!("{}/jwks-2", idp.base)})));
    clock.advance(Duration::from_secs(30));
    assert_eq!(
        kind(&auth.authenticate(&new_token).await),
        Err("unknown_key"),
        "an unknown kid refetches the known key set, without discovery"
    );
    assert_eq!(idp.requests().last().map(String::as_str), Some("/jwks"));

    // Act: past the maximum age, the refresh reads the document again.
    clock.advance(Duration::from_secs(600));
    assert!(auth.authenticate(&old_token).await.is_ok(), "stale keys keep serving meanwhile");
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match auth.authenticate(&old_token).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("the background refresh completes");

    // Assert
    assert_eq!(refused.kind(), "unknown_key", "the old set is no longer used");
    assert!(auth.authenticate(&new_token).await.is_ok());
    let requests = idp.requests();
    assert_eq!(requests[requests.len() - 2..], [idp.openid_path(), "/jwks-2".to_owned()]);
    background.shutdown().await;
}

#[tokio::test]
async fn discovery_failing_at_startup_is_retried_when_a_token_needs_the_keys() {
    // Arrange: the provider is down while the gateway starts.
    let clock = clock();
    let key = TestKey::p256();
    let idp = Idp::start("agents", vec![key.jwk(Some("k1"))]).await;
    idp.state.healthy.store(false, Ordering::SeqCst);
    let auth = authenticator(&discovery_config(&idp.issuer), &clock).await;
    let token = key.sign(Some("k1"), &claims_of(&idp, &clock));

    // Act and assert: unavailable, not unauthorized, until a later fetch.
    let err = auth.authenticate(&token).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.to_string().contains("retry later"), "{err}");
    assert_eq!(idp.requests().len(), 1, "no retry within the interval");
    idp.state.healthy.store(true, Ordering::SeqCst);
    clock.advance(Duration::from_secs(30));
    assert!(auth.authenticate(&token).await.is_ok());
    assert_eq!(idp.requests()[1..], [idp.openid_path(), "/jwks".to_owned()]);
}

#[tokio::test]
async fn the_https_rule_applies_to_the_issuer_and_the_jwks_uri() {
    let idp = Idp::start("agents", vec![TestKey::p256().jwk(Some("k1"))]).await;
    idp.set_openid(Some(
        json!({"issuer": idp.issuer, "jwks_uri": "http://keys.example.test/jwks"}),
    ));

    // A plain-http key set on a remote host is refused before any fetch.
    let checks = check_key_sources(&discovery_config(&idp.issuer), true).await.unwrap();
    let outcome = checks[0].outcome.as_ref().unwrap_err();
    assert!(outcome.contains("jwks_uri must use https"), "{outcome}");

    // A plain-http issuer on a remote host needs jwks_allow_http.
    let remote = discovery_config("http://keycloak.identity.svc:8080/realms/agents");
    let err = Authenticator::new(&remote).await.unwrap_err();
    assert!(err.to_string().contains("issuer must use https"), "{err}");
    let allowed = AuthConfig { jwks_allow_http: true, ..remote };
    let checks = check_key_sources(&allowed, false).await.unwrap();
    assert_eq!(
        checks[0].outcome.as_deref(),
        Ok("the JWKS of http://keycloak.identity.svc:8080/realms/agents (by discovery) (not \
            fetched; --connect fetches the discovery document and the JWKS)")
    );
}
