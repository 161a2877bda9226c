//! Bearer-token authentication, end to end: real signatures with the three
//! key sources, a real JWKS server on a random port, and the middleware in
//! front of a real axum router.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::{
    io::Write,
    sync::{
        Arc, LazyLock, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::from_fn_with_state,
    response::IntoResponse,
    routing::{get, post},
};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use foldgate_api::auth::{
    AuthConfig, AuthError, AuthMode, AuthSetupError, AuthState, Authenticated, Authenticator,
    MintError, ProtectedResourceMetadata, SCOPE_READ, SCOPE_WRITE, Secret, auth_error_response,
    authenticate_request, insufficient_scope_response, mint_hs256, resource_metadata_url,
};
use foldgate_domain::{Subject, TenantId};
use foldgate_engine::{Clock, ManualClock};
use http_body_util::BodyExt as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header, jwk::Jwk};
use serde_json::{Value, json};
use tower::ServiceExt as _;

const SECRET: &str = "test-only-secret-0123456789abcdef-0123456789";
const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "https://gw.test/mcp";
const METADATA_URL: &str = "https://gw.test/.well-known/oauth-protected-resource/mcp";

// ---------------------------------------------------------------------------
// Helpers

fn clock() -> ManualClock {
    ManualClock::starting_now()
}

fn now(clock: &ManualClock) -> i64 {
    clock.now().timestamp()
}

/// Claims every valid token in these tests starts from.
fn claims(clock: &ManualClock) -> Value {
    json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice@acme.test",
        "tenant": "acme",
        "exp": now(clock) + 600,
        "iat": now(clock),
        "scope": "fold:read fold:write",
    })
}

/// `base` with the given members replaced (`null` removes one).
fn patch(mut base: Value, changes: &Value) -> Value {
    for (k, v) in changes.as_object().unwrap() {
        if v.is_null() {
            base.as_object_mut().unwrap().remove(k);
        } else {
            base[k] = v.clone();
        }
    }
    base
}

fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn sign_hs256(claims: &Value, secret: &str) -> String {
    sign(Algorithm::HS256, None, claims, &EncodingKey::from_secret(secret.as_bytes()))
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

/// Replaces the payload of a signed token, keeping its signature.
fn with_payload(token: &str, claims: &Value) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    format!("{}.{}.{}", parts[0], b64(claims), parts[2])
}

/// Changes one character in the middle of the signature.
fn with_flipped_signature(token: &str) -> String {
    let (head, signature) = token.rsplit_once('.').unwrap();
    let mut signature: Vec<char> = signature.chars().collect();
    let i = signature.len() / 2;
    signature[i] = if signature[i] == 'A' { 'B' } else { 'A' };
    format!("{head}.{}", signature.into_iter().collect::<String>())
}

fn hs_config() -> AuthConfig {
    AuthConfig {
        jwt_secret: Some(Secret::new(SECRET)),
        issuer: Some(ISSUER.into()),
        audience: Some(AUDIENCE.into()),
        ..AuthConfig::default()
    }
}

async fn authenticator(config: &AuthConfig, clock: &ManualClock) -> Authenticator {
    Authenticator::with_clock(config, Arc::new(clock.clone())).await.unwrap()
}

fn kind<T>(result: &Result<T, AuthError>) -> Result<(), &'static str> {
    result.as_ref().map(|_| ()).map_err(AuthError::kind)
}

/// A generated key pair and the algorithm its public key is configured for.
struct TestKey {
    alg: Algorithm,
    private_pem: String,
    public_pem: String,
    /// Ed25519 only: the raw public key, for its JWK (`jsonwebtoken` derives
    /// JWKs only from PKCS#8 v1 Ed25519 keys, and `ed25519-dalek` writes v2).
    ed25519_public: Option<[u8; 32]>,
}

impl TestKey {
    fn rsa() -> Self {
        use rsa::{
            RsaPrivateKey,
            pkcs1::EncodeRsaPrivateKey,
            pkcs8::{EncodePublicKey, LineEnding},
        };
        let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
        Self {
            alg: Algorithm::RS256,
            private_pem: key.to_pkcs1_pem(LineEnding::LF).unwrap().to_string(),
            public_pem: key.to_public_key().to_public_key_pem(LineEnding::LF).unwrap(),
            ed25519_public: None,
        }
    }

    fn p256() -> Self {
        use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
        let key = p256::SecretKey::random(&mut rand_core::OsRng);
        Self {
            alg: Algorithm::ES256,
            private_pem: key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
            public_pem: key.public_key().to_public_key_pem(LineEnding::LF).unwrap(),
            ed25519_public: None,
        }
    }

    fn ed25519() -> Self {
        use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey, spki::der::pem::LineEnding};
        let key = ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng);
        Self {
            alg: Algorithm::EdDSA,
            private_pem: key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
            public_pem: key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap(),
            ed25519_public: Some(key.verifying_key().to_bytes()),
        }
    }

    fn encoding_key(&self) -> EncodingKey {
        let pem = self.private_pem.as_bytes();
        match self.alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(pem),
            Algorithm::ES256 => EncodingKey::from_ec_pem(pem),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(pem),
            other => panic!("no test keys for {other:?}"),
        }
        .unwrap()
    }

    fn sign(&self, kid: Option<&str>, claims: &Value) -> String {
        sign(self.alg, kid, claims, &self.encoding_key())
    }

    fn jwk(&self, kid: Option<&str>) -> Value {
        if let Some(public) = self.ed25519_public {
            let mut jwk =
                json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(public)});
            if let Some(kid) = kid {
                jwk["kid"] = kid.into();
            }
            return jwk;
        }
        let mut jwk = Jwk::from_encoding_key(&self.encoding_key(), self.alg).unwrap();
        jwk.common.key_id = kid.map(str::to_owned);
        serde_json::to_value(jwk).unwrap()
    }

    fn public_key_file(&self) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(self.public_pem.as_bytes()).unwrap();
        file
    }
}

/// RSA key generation is slow; one key serves the whole test binary.
static RSA: LazyLock<TestKey> = LazyLock::new(TestKey::rsa);

// ---------------------------------------------------------------------------
// HS256

#[tokio::test]
async fn hs256_tokens() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let t = now(&clock);
    let base = claims(&clock);
    let valid = sign_hs256(&base, SECRET);
    let none_token = format!("{}.{}.", b64(&json!({"alg": "none", "typ": "JWT"})), b64(&base));
    let none_with_signature = format!("{}.{}.{}", b64(&json!({"alg": "none"})), b64(&base), "c2ln");
    let other_tenant = patch(base.clone(), &json!({"tenant": "globex"}));

    let cases: Vec<(&str, String, Result<(), &str>)> = vec![
        ("valid", valid.clone(), Ok(())),
        ("empty token", String::new(), Err("malformed")),
        ("not a JWT", "opaque-token".into(), Err("malformed")),
        (
            "expired",
            sign_hs256(&patch(base.clone(), &json!({"exp": t - 3600})), SECRET),
            Err("expired"),
        ),
        (
            "not yet valid",
            sign_hs256(&patch(base.clone(), &json!({"nbf": t + 3600})), SECRET),
            Err("not_yet_valid"),
        ),
        (
            "no exp",
            sign_hs256(&patch(base.clone(), &json!({"exp": null})), SECRET),
            Err("bad_claims"),
        ),
        (
            "wrong issuer",
            sign_hs256(&patch(base.clone(), &json!({"iss": "https://evil.test"})), SECRET),
            Err("wrong_issuer"),
        ),
        (
            "wrong audience",
            sign_hs256(&patch(base.clone(), &json!({"aud": "https://other.test/mcp"})), SECRET),
            Err("wrong_audience"),
        ),
        ("alg none", none_token, Err("unsupported_algorithm")),
        ("alg none with a signature", none_with_signature, Err("unsupported_algorithm")),
        (
            "HS512 with the right secret",
            sign(Algorithm::HS512, None, &base, &EncodingKey::from_secret(SECRET.as_bytes())),
            Err("unsupported_algorithm"),
        ),
        ("tampered payload", with_payload(&valid, &other_tenant), Err("bad_signature")),
        ("tampered signature", with_flipped_signature(&valid), Err("bad_signature")),
        (
            "signature removed",
            with_payload(&valid, &base).rsplit_once('.').unwrap().0.to_owned() + ".",
            Err("bad_signature"),
        ),
        (
            "wrong secret",
            sign_hs256(&base, "another-secret-of-sufficient-length-000"),
            Err("bad_signature"),
        ),
        (
            "no tenant",
            sign_hs256(&patch(base.clone(), &json!({"tenant": null})), SECRET),
            Err("bad_claims"),
        ),
        (
            "invalid tenant",
            sign_hs256(&patch(base.clone(), &json!({"tenant": "acme/../globex"})), SECRET),
            Err("bad_claims"),
        ),
        (
            "no sub",
            sign_hs256(&patch(base.clone(), &json!({"sub": null})), SECRET),
            Err("bad_claims"),
        ),
        (
            "invalid sub",
            sign_hs256(&patch(base.clone(), &json!({"sub": "a\u{0}b"})), SECRET),
            Err("bad_claims"),
        ),
    ];
    for (why, token, expected) in cases {
        // Act
        let result = auth.authenticate(&token).await;
        // Assert
        assert_eq!(kind(&result), expected, "{why}");
        if let Err(e) = &result {
            assert!(!e.is_unavailable(), "{why}: a bad token is never a key-source outage");
            if !token.is_empty() {
                assert!(!e.reason().contains(&token), "{why}: the reason must not echo the token");
            }
        }
    }

    let ok = auth.authenticate(&valid).await.unwrap();
    assert_eq!(ok.principal.tenant.as_str(), "acme");
    assert_eq!(ok.principal.subject.as_str(), "alice@acme.test");
    assert!(ok.has_scope(SCOPE_READ) && ok.has_scope(SCOPE_WRITE));
    assert_eq!(ok.expires_at.map(|e| e.timestamp()), Some(t + 600));
}

#[tokio::test]
async fn bad_claims_say_which_claim() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let cases = [
        (json!({"tenant": null}), "`tenant` claim is required"),
        (json!({"tenant": "has space"}), "`tenant` claim is not a valid tenant id"),
        (json!({"sub": 7}), "`sub` claim must be a string"),
        (json!({"scope": {"a": 1}}), "`scope` claim must be"),
    ];
    for (changes, needle) in cases {
        let token = sign_hs256(&patch(claims(&clock), &changes), SECRET);
        let err = auth.authenticate(&token).await.unwrap_err();
        assert!(err.reason().contains(needle), "{changes}: {:?} lacks {needle:?}", err.reason());
    }
}

#[tokio::test]
async fn custom_tenant_claim() {
    let clock = clock();
    let config = AuthConfig { tenant_claim: "https://acme.test/org".into(), ..hs_config() };
    let auth = authenticator(&config, &clock).await;
    let custom = patch(claims(&clock), &json!({"tenant": null, "https://acme.test/org": "org-42"}));
    let default_only = claims(&clock);

    let ok = auth.authenticate(&sign_hs256(&custom, SECRET)).await.unwrap();
    assert_eq!(
        ok.principal.tenant.as_str(),
        "org-42",
        "the tenant comes from the configured claim"
    );

    let err = auth.authenticate(&sign_hs256(&default_only, SECRET)).await.unwrap_err();
    assert_eq!(err.kind(), "bad_claims", "the default `tenant` claim is not consulted");
}

#[tokio::test]
async fn scopes_from_scope_and_scp() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let cases: Vec<(Value, Vec<&str>, &str)> = vec![
        (json!({"scope": "fold:read"}), vec!["fold:read"], "scope string"),
        (json!({"scope": "fold:read fold:write"}), vec!["fold:read", "fold:write"], "two in scope"),
        (json!({"scope": null, "scp": ["fold:write"]}), vec!["fold:write"], "scp array"),
        (
            json!({"scope": null, "scp": "fold:read fold:write"}),
            vec!["fold:read", "fold:write"],
            "scp string",
        ),
        (
            json!({"scope": "fold:read", "scp": ["fold:write"]}),
            vec!["fold:read", "fold:write"],
            "both",
        ),
        (json!({"scope": null}), vec![], "none"),
        (json!({"scope": ""}), vec![], "empty string"),
    ];
    for (changes, expected, why) in cases {
        let token = sign_hs256(&patch(claims(&clock), &changes), SECRET);
        let auth = auth.authenticate(&token).await.unwrap();
        assert_eq!(auth.scopes.iter().map(String::as_str).collect::<Vec<_>>(), expected, "{why}");
    }
}

#[tokio::test]
async fn leeway_is_honoured_on_the_injected_clock() {
    let clock = clock();
    let config = AuthConfig { leeway_seconds: 30, ..hs_config() };
    let auth = authenticator(&config, &clock).await;
    let t = now(&clock);
    let expiring = sign_hs256(&patch(claims(&clock), &json!({"exp": t + 10})), SECRET);
    let future = sign_hs256(&patch(claims(&clock), &json!({"nbf": t + 20})), SECRET);

    assert!(auth.authenticate(&future).await.is_ok(), "nbf 20 s ahead is within 30 s of leeway");
    assert!(auth.authenticate(&expiring).await.is_ok(), "fresh token");

    clock.advance(Duration::from_secs(35));
    assert!(auth.authenticate(&expiring).await.is_ok(), "expired 25 s ago: within the leeway");

    clock.advance(Duration::from_secs(6));
    let err = auth.authenticate(&expiring).await.unwrap_err();
    assert_eq!(err.kind(), "expired", "expired 31 s ago: beyond the leeway");

    let strict = authenticator(&AuthConfig { leeway_seconds: 0, ..hs_config() }, &clock).await;
    let err = strict.authenticate(&future).await;
    assert!(err.is_ok(), "nbf has passed by now");
    let ahead = sign_hs256(&patch(claims(&clock), &json!({"nbf": now(&clock) + 1})), SECRET);
    assert_eq!(kind(&strict.authenticate(&ahead).await), Err("not_yet_valid"), "no leeway");
}

#[tokio::test]
async fn minted_tokens_verify() {
    let clock = ManualClock::starting_now();
    let auth = authenticator(&hs_config(), &clock).await;
    let secret = Secret::new(SECRET);
    let tenant = TenantId::parse("acme").unwrap();
    let subject = Subject::parse("dev").unwrap();

    let token = mint_hs256(
        &secret,
        &tenant,
        &subject,
        [SCOPE_READ],
        Duration::from_secs(3600),
        Some(ISSUER),
        Some(AUDIENCE),
    )
    .unwrap();
    let ok = auth.authenticate(&token).await.unwrap();
    assert_eq!(ok.principal.tenant, tenant);
    assert_eq!(ok.principal.subject, subject);
    assert!(ok.has_scope(SCOPE_READ) && !ok.has_scope(SCOPE_WRITE));

    let no_audience = mint_hs256(
        &secret,
        &tenant,
        &subject,
        [SCOPE_READ],
        Duration::from_secs(60),
        Some(ISSUER),
        None,
    )
    .unwrap();
    assert_eq!(kind(&auth.authenticate(&no_audience).await), Err("wrong_audience"));

    let refusals: Vec<(Result<String, MintError>, &str)> = vec![
        (
            mint_hs256(
                &Secret::new("short"),
                &tenant,
                &subject,
                [SCOPE_READ],
                Duration::from_secs(60),
                None,
                None,
            ),
            "weak secret",
        ),
        (
            mint_hs256(
                &secret,
                &tenant,
                &subject,
                ["fold:read fold:write"],
                Duration::from_secs(60),
                None,
                None,
            ),
            "scope with a space",
        ),
        (
            mint_hs256(&secret, &tenant, &subject, [""], Duration::from_secs(60), None, None),
            "empty scope",
        ),
        (
            mint_hs256(&secret, &tenant, &subject, [SCOPE_READ], Duration::ZERO, None, None),
            "zero ttl",
        ),
    ];
    for (result, why) in refusals {
        assert!(result.is_err(), "{why}");
    }
}

// ---------------------------------------------------------------------------
// PEM public keys

#[tokio::test]
async fn pem_public_keys() {
    let clock = clock();
    let base = claims(&clock);
    let keys = [
        ("RS256", &*RSA, None),
        ("ES256", &TestKey::p256(), Some(TestKey::p256())),
        ("EdDSA", &TestKey::ed25519(), Some(TestKey::ed25519())),
    ];
    for (name, key, other_key_of_same_type) in keys {
        // Arrange
        let file = key.public_key_file();
        let config = AuthConfig { public_key_file: Some(file.path().to_owned()), ..hs_config() };
        let config = AuthConfig { jwt_secret: None, ..config };
        let auth = authenticator(&config, &clock).await;
        let valid = key.sign(None, &base);
        let foreign_alg =
            if key.alg == Algorithm::ES256 { TestKey::ed25519() } else { TestKey::p256() };

        let mut cases: Vec<(&str, String, Result<(), &str>)> = vec![
            ("valid", valid.clone(), Ok(())),
            ("valid with a kid", key.sign(Some("any"), &base), Ok(())),
            (
                "tampered payload",
                with_payload(&valid, &patch(base.clone(), &json!({"tenant": "globex"}))),
                Err("bad_signature"),
            ),
            ("tampered signature", with_flipped_signature(&valid), Err("bad_signature")),
            (
                "expired",
                key.sign(None, &patch(base.clone(), &json!({"exp": now(&clock) - 3600}))),
                Err("expired"),
            ),
            ("another key type", foreign_alg.sign(None, &base), Err("unsupported_algorithm")),
            // Algorithm confusion: the public key, which anyone can read,
            // used as an HMAC secret.
            (
                "HS256 keyed with the public PEM",
                sign_hs256(&base, &key.public_pem),
                Err("unsupported_algorithm"),
            ),
            (
                "alg none",
                format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&base)),
                Err("unsupported_algorithm"),
            ),
        ];
        if let Some(other) = &other_key_of_same_type {
            cases.push((
                "another key of the same type",
                other.sign(None, &base),
                Err("bad_signature"),
            ));
        }
        if key.alg == Algorithm::RS256 {
            let enc = key.encoding_key();
            cases.push((
                "RS384 with the same key",
                sign(Algorithm::RS384, None, &base, &enc),
                Err("unsupported_algorithm"),
            ));
            cases.push((
                "PS256 with the same key",
                sign(Algorithm::PS256, None, &base, &enc),
                Err("unsupported_algorithm"),
            ));
        }
        for (why, token, expected) in cases {
            // Act
            let result = auth.authenticate(&token).await;
            // Assert
            assert_eq!(kind(&result), expected, "{name}: {why}");
        }
    }
}

#[tokio::test]
async fn hs256_keyed_with_the_rsa_public_key_is_refused() {
    // Arrange: the configured source is the RSA public key; the attacker
    // knows its PEM and uses it as an HMAC secret.
    let clock = clock();
    let file = RSA.public_key_file();
    let config =
        AuthConfig { public_key_file: Some(file.path().to_owned()), ..AuthConfig::default() };
    let auth = authenticator(&config, &clock).await;
    let forged = claims(&clock);
    let variants = [
        ("PEM text", RSA.public_pem.clone()),
        ("PEM text without trailing newline", RSA.public_pem.trim_end().to_owned()),
    ];
    for (why, secret) in variants {
        let token = sign_hs256(&forged, &secret);
        // Act
        let result = auth.authenticate(&token).await;
        // Assert
        assert_eq!(kind(&result), Err("unsupported_algorithm"), "{why}");
    }
    // The same claims signed with the real key pass, so the refusal above is
    // about the algorithm and nothing else.
    assert!(auth.authenticate(&RSA.sign(None, &forged)).await.is_ok());
}

#[tokio::test]
async fn unusable_pem_files_stop_startup() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let private = TestKey::p256().private_pem;
    let cases = [
        (dir.path().join("missing.pem"), "cannot read public_key_file"),
        (write("garbage.pem", "not a key"), "no PEM block"),
        (write("private.pem", &private), "private key"),
        (
            write("cert.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
            "expected a PUBLIC KEY",
        ),
        (
            write("broken.pem", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
            "expected an RSA",
        ),
    ];
    for (path, needle) in cases {
        let config = AuthConfig { public_key_file: Some(path.clone()), ..AuthConfig::default() };
        let err = Authenticator::new(&config).await.unwrap_err();
        assert!(
            matches!(err, AuthSetupError::ReadKey { .. } | AuthSetupError::BadKey { .. }),
            "{}: {err:?}",
            path.display()
        );
        assert!(err.to_string().contains(needle), "{}: {err} lacks {needle:?}", path.display());
    }
    let err = Authenticator::new(&AuthConfig::default()).await.unwrap_err();
    assert!(matches!(err, AuthSetupError::Config(_)), "no key source is a configuration error");
}

// ---------------------------------------------------------------------------
// JWKS

/// A JWKS endpoint on a random port that counts the requests it serves.
struct JwksServer {
    url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    requests: Arc<AtomicUsize>,
    healthy: Arc<AtomicBool>,
}

#[derive(Clone)]
struct JwksServerState {
    keys: Arc<Mutex<Vec<Value>>>,
    requests: Arc<AtomicUsize>,
    healthy: Arc<AtomicBool>,
}

impl JwksServer {
    async fn start(keys: Vec<Value>) -> Self {
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

fn jwks_only(url: &str) -> AuthConfig {
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
    let auth = authenticator(&jwks_only(&server.url), &clock).await;
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
    let config = AuthConfig { jwks_timeout_seconds: 1, ..jwks_only(&hanging) };
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

// ---------------------------------------------------------------------------
// Middleware and HTTP answers

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
        assert_eq!(body["scopes"], json!(["fold:read", "fold:write"]), "{why}");
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
    let doc = serde_json::to_value(ProtectedResourceMetadata::new(AUDIENCE, Some(ISSUER))).unwrap();
    assert_eq!(
        doc,
        json!({
            "resource": AUDIENCE,
            "authorization_servers": [ISSUER],
            "scopes_supported": ["fold:read", "fold:write"],
            "bearer_methods_supported": ["header"],
        })
    );
}
