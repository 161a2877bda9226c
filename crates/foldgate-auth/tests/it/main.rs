//! Bearer-token authentication, end to end: real signatures with every key
//! source, real JWKS and discovery servers on random ports, several trusted
//! issuers, and the middleware in front of a real axum router.
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
use foldgate_auth::{
    AuthConfig, AuthError, AuthMode, AuthSetupError, AuthState, Authenticated, Authenticator,
    MintError, ProtectedResourceMetadata, SCOPE_READ, SCOPE_WRITE, Secret, auth_error_response,
    authenticate_request, check_key_sources, insufficient_scope_response, mint_hs256,
    resource_metadata_url,
};
use foldgate_domain::{Clock, ManualClock, Subject, TenantId};
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

mod discovery;
mod hs256;
mod issuers;
mod jwks;
mod middleware;
mod pem;
