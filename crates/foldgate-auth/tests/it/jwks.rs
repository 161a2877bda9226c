//! Tokens verified against a JSON Web Key Set served on a random port.

use super::*;

/// A JWKS endpoint on a random port that counts the requests it serves.
pub(super) struct JwksServer {
    pub(super) url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    requests: Arc<AtomicUsize>,
    pub(super) healthy: Arc<AtomicBool>,
}

#[derive(Clone)]
struct JwksServerState {
    keys: Arc<Mutex<Vec<Value>>>,
    requests: Arc<AtomicUsize>,
    healthy: Arc<AtomicBool>,
}

impl JwksServer {
    pub(super) async fn start(keys: Vec<Value>) -> Self {
        let state = JwksServerState {
            keys: Arc::new(Mutex::new(keys)),
            requests: Arc::new(AtomicUsize::new(0)),
            healthy: Arc::new(AtomicBool::new(true)),
        };
        async fn serve(State(state): State<JwksServerState>) -> axum::response::Response {
            state.requests.fetch_add(1, Ordering::SeqCst);
            if !state.healthy.load(Ordering::SeqCst) {
                return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
            }
            let keys = state.keys.lock().unwrap().clone();
            Json(json!({ "keys": keys })).into_response()
        }
        let app = Router::new().route("/jwks", get(serve)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, keys: state.keys, requests: state.requests, healthy: state.healthy }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn publish(&self, jwk: Value) {
        self.keys.lock().unwrap().push(jwk);
    }

    fn withdraw(&self, kid: &str) {
        self.keys.lock().unwrap().retain(|k| k["kid"] != kid);
    }
}

fn jwks_config(url: &str) -> AuthConfig {
    AuthConfig { jwks_url: Some(url.to_owned()), ..hs_config() }
}

pub(super) fn jwks_only(url: &str) -> AuthConfig {
    AuthConfig { jwt_secret: None, ..jwks_config(url) }
}

#[tokio::test]
async fn jwks_tokens_are_verified_by_kid() {
    // Arrange
    let clock = clock();
    let ec = TestKey::p256();
    let ed = TestKey::ed25519();
    let server = JwksServer::start(vec![
        RSA.jwk(Some("rsa-1")),
        ec.jwk(Some("ec-1")),
        ed.jwk(Some("ed-1")),
        // A symmetric key in a published set must never be used.
        json!({"kty": "oct", "kid": "hmac-1", "k": URL_SAFE_NO_PAD.encode(SECRET)}),
    ])
    .await;
    let auth = authenticator(&jwks_only(&server.url), &clock).await;
    assert_eq!(server.requests(), 1, "the key set is fetched once at startup");
    let base = claims(&clock);

    let cases: Vec<(&str, String, Result<(), &str>)> = vec![
        ("RS256 by kid", RSA.sign(Some("rsa-1"), &base), Ok(())),
        ("ES256 by kid", ec.sign(Some("ec-1"), &base), Ok(())),
        ("EdDSA by kid", ed.sign(Some("ed-1"), &base), Ok(())),
        ("ES256 without kid", ec.sign(None, &base), Ok(())),
        ("kid of another key type", ec.sign(Some("rsa-1"), &base), Err("unsupported_algorithm")),
        ("right kid, wrong key", TestKey::p256().sign(Some("ec-1"), &base), Err("bad_signature")),
        (
            "HS256 with the published symmetric key",
            sign(
                Algorithm::HS256,
                Some("hmac-1"),
                &base,
                &EncodingKey::from_secret(SECRET.as_bytes()),
            ),
            Err("unsupported_algorithm"),
        ),
        (
            "HS256 keyed with an RSA public key",
            sign(
                Algorithm::HS256,
                Some("rsa-1"),
                &base,
                &EncodingKey::from_secret(RSA.public_pem.as_bytes()),
            ),
            Err("unsupported_algorithm"),
        ),
        (
            "alg none",
            format!("{}.{}.", b64(&json!({"alg": "none", "kid": "rsa-1"})), b64(&base)),
            Err("unsupported_algorithm"),
        ),
        (
            "expired",
            ec.sign(Some("ec-1"), &patch(base.clone(), &json!({"exp": now(&clock) - 3600}))),
            Err("expired"),
        ),
    ];
    for (why, token, expected) in cases {
        // Act
        let result = auth.authenticate(&token).await;
        // Assert
        assert_eq!(kind(&result), expected, "{why}");
    }
    assert_eq!(server.requests(), 1, "known keys are served from the cache");
}

#[tokio::test]
async fn an_unknown_kid_refetches_once_and_a_rotated_key_is_accepted() {
    // Arrange
    let clock = clock();
    let old = TestKey::p256();
    let new = TestKey::ed25519();
    let server = JwksServer::start(vec![old.jwk(Some("old"))]).await;
    let auth = authenticator(&jwks_only(&server.url), &clock).await;
    let base = claims(&clock);
    let rotated = new.sign(Some("new"), &base);
    server.publish(new.jwk(Some("new")));

    // Within the interval of the startup fetch the new key is not fetched.
    let err = auth.authenticate(&rotated).await.unwrap_err();
    assert_eq!(err.kind(), "unknown_key");
    assert_eq!(server.requests(), 1, "no refetch within the interval");

    // Act: the interval has passed; many clients present the new key at
    // once.
    clock.advance(Duration::from_secs(30));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let auth = auth.clone();
            let token = rotated.clone();
            tokio::spawn(async move { auth.authenticate(&token).await })
        })
        .collect();

    // Assert
    for task in tasks {
        let ok = task.await.unwrap();
        assert!(ok.is_ok(), "the rotated key is fetched and accepted by every waiter: {ok:?}");
    }
    assert_eq!(server.requests(), 2, "exactly one refetch");
    assert!(auth.authenticate(&rotated).await.is_ok());
    assert!(auth.authenticate(&old.sign(Some("old"), &base)).await.is_ok());
    assert_eq!(server.requests(), 2, "the refreshed set is cached");
}

#[tokio::test]
async fn a_flood_of_unknown_kids_fetches_at_most_once_per_interval() {
    // Arrange
    let clock = clock();
    let known = TestKey::p256();
    let attacker = TestKey::p256();
    let server = JwksServer::start(vec![known.jwk(Some("known"))]).await;
    let auth = authenticator(&jwks_only(&server.url), &clock).await;
    let base = claims(&clock);
    clock.advance(Duration::from_secs(30));

    // Act: 50 concurrent tokens, each naming a different unknown key.
    let flood = |round: usize| {
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let auth = auth.clone();
                let token = attacker.sign(Some(&format!("bogus-{round}-{i}")), &base);
                tokio::spawn(async move { auth.authenticate(&token).await.map(|_| ()) })
            })
            .collect();
        async move {
            for task in tasks {
                let err = task.await.unwrap().unwrap_err();
                assert_eq!(err.kind(), "unknown_key");
            }
        }
    };
    flood(1).await;

    // Assert
    assert_eq!(server.requests(), 2, "startup fetch plus one refetch for the whole flood");

    clock.advance(Duration::from_secs(29));
    flood(2).await;
    assert_eq!(server.requests(), 2, "29 s later: still within the interval");

    clock.advance(Duration::from_secs(1));
    flood(3).await;
    assert_eq!(server.requests(), 3, "a full interval later: one more refetch");

    assert!(
        auth.authenticate(&known.sign(Some("known"), &base)).await.is_ok(),
        "known keys keep working"
    );
}

#[tokio::test]
async fn a_withdrawn_key_stops_working_once_the_cache_is_past_its_maximum_age() {
    // Arrange
    let clock = clock();
    let (leaving, staying) = (TestKey::p256(), TestKey::p256());
    let server =
        JwksServer::start(vec![leaving.jwk(Some("leaving")), staying.jwk(Some("staying"))]).await;
    // Verified tokens are not remembered here: this is about the keys.
    let config = AuthConfig { token_cache_entries: 0, ..jwks_only(&server.url) };
    let auth = authenticator(&config, &clock).await;
    let mut driver = foldgate_background::Driver::default();
    auth.register(&mut driver);
    let background = driver.start();
    let long_lived = patch(claims(&clock), &json!({"exp": now(&clock) + 7200}));
    let leaving_token = leaving.sign(Some("leaving"), &long_lived);
    let staying_token = staying.sign(Some("staying"), &long_lived);
    server.withdraw("leaving");

    clock.advance(Duration::from_secs(599));
    assert!(auth.authenticate(&leaving_token).await.is_ok(), "young cache: no refresh");
    assert_eq!(server.requests(), 1);

    // Act: past the maximum age, the cached key still answers while a
    // background refresh runs.
    clock.advance(Duration::from_secs(1));
    assert!(auth.authenticate(&leaving_token).await.is_ok(), "stale keys keep serving");

    // Assert: once the refresh lands, the withdrawn key is unknown.
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match auth.authenticate(&leaving_token).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("the background refresh completes");
    assert_eq!(refused.kind(), "unknown_key");
    assert_eq!(server.requests(), 2, "one background refresh");
    assert!(auth.authenticate(&staying_token).await.is_ok());
    background.shutdown().await;
}

#[tokio::test]
async fn a_remembered_token_is_verified_again_after_token_cache_ttl() {
    // Arrange: a token verified once, then its key withdrawn.
    let clock = clock();
    let (key, other) = (TestKey::p256(), TestKey::p256());
    let server = JwksServer::start(vec![key.jwk(Some("k")), other.jwk(Some("other"))]).await;
    let config = AuthConfig { token_cache_ttl: Duration::from_secs(60), ..jwks_only(&server.url) };
    let auth = authenticator(&config, &clock).await;
    let mut driver = foldgate_background::Driver::default();
    auth.register(&mut driver);
    let background = driver.start();
    // Valid far longer than the clock moves below.
    let exp = now(&clock) + 30 * 24 * 3600;
    let token = key.sign(Some("k"), &patch(claims(&clock), &json!({"exp": exp})));
    assert!(auth.authenticate(&token).await.is_ok());
    server.withdraw("k");

    // Act and assert: remembered, the token is taken as verified...
    clock.advance(Duration::from_secs(59));
    assert!(auth.authenticate(&token).await.is_ok());
    // ...but not another token that differs from it in its signature only.
    let forged = with_flipped_signature(&token);
    assert_eq!(kind(&auth.authenticate(&forged).await), Err("bad_signature"));

    // Each verification after the cache's time reads the keys, which are
    // past their maximum age and refreshed: the withdrawn key is unknown.
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            clock.advance(Duration::from_secs(61));
            match auth.authenticate(&token).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("the token is verified again and refused");
    assert_eq!(refused.kind(), "unknown_key");
    background.shutdown().await;
}

#[tokio::test]
async fn a_jwks_that_is_down_means_unavailable_not_unauthorized() {
    // Arrange: the provider fails at startup; startup goes on.
    let clock = clock();
    let key = TestKey::p256();
    let server = JwksServer::start(vec![key.jwk(Some("k"))]).await;
    server.healthy.store(false, Ordering::SeqCst);
    let auth = authenticator(&jwks_only(&server.url), &clock).await;
    let token = key.sign(Some("k"), &claims(&clock));

    // Act
    let err = auth.authenticate(&token).await.unwrap_err();

    // Assert
    assert!(err.is_unavailable(), "{err:?}");
    assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!err.reason().contains("500"), "internal details stay out of the reason");
    let AuthError::Unavailable { retry_after, .. } = &err else { unreachable!() };
    assert_eq!(
        *retry_after,
        Duration::from_secs(30),
        "the next fetch is one interval after startup"
    );
    assert_eq!(server.requests(), 1, "no refetch within the interval, even while down");

    // The provider recovers; the next allowed fetch picks the keys up.
    server.healthy.store(true, Ordering::SeqCst);
    clock.advance(Duration::from_secs(30));
    assert!(auth.authenticate(&token).await.is_ok());
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn an_unreachable_or_hanging_jwks_is_unavailable() {
    let clock = clock();
    let token = TestKey::p256().sign(Some("k"), &claims(&clock));

    // Nothing listens on the port any more.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}/jwks", listener.local_addr().unwrap());
    drop(listener);
    let auth = authenticator(&jwks_only(&closed), &clock).await;
    let err = auth.authenticate(&token).await.unwrap_err();
    assert!(err.is_unavailable(), "connection refused: {err:?}");

    // A server that accepts and never answers: the fetch times out.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hanging = format!("http://{}/jwks", listener.local_addr().unwrap());
    let _holder = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let config = AuthConfig { jwks_timeout: Duration::from_secs(1), ..jwks_only(&hanging) };
    let started = std::time::Instant::now();
    let auth = authenticator(&config, &clock).await;
    assert!(started.elapsed() < Duration::from_secs(5), "startup waits at most the JWKS timeout");
    let err = auth.authenticate(&token).await.unwrap_err();
    assert!(err.is_unavailable(), "timeout: {err:?}");
}

#[tokio::test]
async fn keys_without_kid() {
    let clock = clock();
    let key = TestKey::ed25519();
    let server = JwksServer::start(vec![key.jwk(None)]).await;
    let auth = authenticator(&jwks_only(&server.url), &clock).await;
    let base = claims(&clock);
    let cases = [
        ("token without kid", key.sign(None, &base), Ok(())),
        ("token with a kid the provider does not publish", key.sign(Some("x"), &base), Ok(())),
        ("other key", TestKey::ed25519().sign(None, &base), Err("bad_signature")),
    ];
    for (why, token, expected) in cases {
        assert_eq!(kind(&auth.authenticate(&token).await), expected, "{why}");
    }
}
