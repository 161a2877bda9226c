//! Bearer tokens, as `/mcp` and the admin API verify them, against each key
//! kind a gateway can be configured with: an HS256 secret, and RSA, P-256
//! and Ed25519 public keys.
//!
//! Input: one byte, whose low bit picks the mode and whose next bits pick
//! the key kind, then
//! - raw mode: the token, as sent;
//! - signed mode: a header, a NUL byte and claims (any bytes), which are
//!   encoded and signed with the key, so that the claim rules are reached
//!   behind a valid signature.
//!
//! Invariants: a token that verifies
//! - names the key's own algorithm in its header;
//! - has every required claim: `exp` in the future (within the leeway),
//!   `nbf` if present not in the future, the configured issuer and audience,
//!   a subject and a tenant that are what the caller is taken for;
//! - grants only scopes its `scope` or `scp` claim names.
#![no_main]

use std::{
    collections::BTreeSet,
    io::Write as _,
    sync::{Arc, LazyLock},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use chrono::DateTime;
use foldgate_auth::{AuthConfig, Authenticator, Secret};
use foldgate_domain::ManualClock;
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

const NOW: i64 = 1_800_000_000;
const LEEWAY: i64 = 30;
const ISSUER: &str = "https://idp.example.com";
const AUDIENCE: &str = "https://gateway.example.com/mcp";
const SECRET: &str = "a shared secret of more than thirty-two bytes";

struct Kind {
    alg: Algorithm,
    signing: EncodingKey,
    auth: Authenticator,
    /// Holds the public key file for as long as the authenticator lives.
    _file: Option<tempfile::NamedTempFile>,
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
    });
    &RUNTIME
}

fn authenticator(config: AuthConfig) -> Authenticator {
    let config = AuthConfig {
        issuer: Some(ISSUER.into()),
        audience: Some(AUDIENCE.into()),
        token_cache_entries: 0,
        ..config
    };
    let clock = Arc::new(ManualClock::new(DateTime::from_timestamp(NOW, 0).expect("a time")));
    runtime().block_on(Authenticator::with_clock(&config, clock)).expect("the authenticator")
}

fn with_public_key(alg: Algorithm, signing: EncodingKey, public_pem: &str) -> Kind {
    let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
    file.write_all(public_pem.as_bytes()).expect("write the key");
    let auth = authenticator(AuthConfig {
        public_key_file: Some(file.path().to_owned()),
        ..AuthConfig::default()
    });
    Kind { alg, signing, auth, _file: Some(file) }
}

static KINDS: LazyLock<Vec<Kind>> = LazyLock::new(|| {
    let hs = Kind {
        alg: Algorithm::HS256,
        signing: EncodingKey::from_secret(SECRET.as_bytes()),
        auth: authenticator(AuthConfig {
            jwt_secret: Some(Secret::new(SECRET)),
            ..AuthConfig::default()
        }),
        _file: None,
    };
    let rsa = {
        use rsa::{
            RsaPrivateKey,
            pkcs1::EncodeRsaPrivateKey,
            pkcs8::{EncodePublicKey, LineEnding},
        };
        let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).expect("an RSA key");
        let private = key.to_pkcs1_pem(LineEnding::LF).expect("PEM");
        let public = key.to_public_key().to_public_key_pem(LineEnding::LF).expect("PEM");
        let signing = EncodingKey::from_rsa_pem(private.as_bytes()).expect("RSA signing key");
        with_public_key(Algorithm::RS256, signing, &public)
    };
    let p256 = {
        use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
        let key = p256::SecretKey::from_slice(&[0x42; 32]).expect("a P-256 key");
        let private = key.to_pkcs8_pem(LineEnding::LF).expect("PEM");
        let public = key.public_key().to_public_key_pem(LineEnding::LF).expect("PEM");
        let signing = EncodingKey::from_ec_pem(private.as_bytes()).expect("P-256 signing key");
        with_public_key(Algorithm::ES256, signing, &public)
    };
    let ed = {
        use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey, spki::der::pem::LineEnding};
        let key = ed25519_dalek::SigningKey::from_bytes(&[0x42; 32]);
        let private = key.to_pkcs8_pem(LineEnding::LF).expect("PEM");
        let public = key.verifying_key().to_public_key_pem(LineEnding::LF).expect("PEM");
        let signing = EncodingKey::from_ed_pem(private.as_bytes()).expect("Ed25519 signing key");
        with_public_key(Algorithm::EdDSA, signing, &public)
    };
    vec![hs, rsa, p256, ed]
});

fn decoded(part: Option<&str>) -> Option<Map<String, Value>> {
    let bytes = URL_SAFE_NO_PAD.decode(part?).ok()?;
    serde_json::from_slice::<Value>(&bytes).ok()?.as_object().cloned()
}

fn words(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        Some(Value::Array(items)) => {
            items.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        _ => Vec::new(),
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else { return };
    let kind = &KINDS[usize::from(mode >> 1) % KINDS.len()];
    let token = if mode & 1 == 0 {
        match std::str::from_utf8(rest) {
            Ok(token) => token.to_owned(),
            Err(_) => return,
        }
    } else {
        let (header, claims) = match rest.iter().position(|&b| b == 0) {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &b""[..]),
        };
        let signed =
            format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
        let Ok(signature) = jsonwebtoken::crypto::sign(signed.as_bytes(), &kind.signing, kind.alg)
        else {
            return;
        };
        format!("{signed}.{signature}")
    };
    let Ok(caller) = runtime().block_on(kind.auth.authenticate(&token)) else { return };

    let mut parts = token.split('.');
    let header = decoded(parts.next()).expect("a verified token has a JSON header");
    let claims = decoded(parts.next()).expect("a verified token has JSON claims");
    assert_eq!(header.get("alg").and_then(Value::as_str), Some(format!("{:?}", kind.alg).as_str()));
    let exp = claims.get("exp").and_then(Value::as_f64).expect("a verified token has `exp`");
    assert!((NOW as f64) < exp + LEEWAY as f64, "expired token accepted: exp {exp}");
    if let Some(nbf) = claims.get("nbf") {
        let nbf = nbf.as_f64().expect("`nbf` is a number");
        assert!(nbf <= (NOW + LEEWAY) as f64, "token not yet valid accepted: nbf {nbf}");
    }
    assert_eq!(claims.get("iss").and_then(Value::as_str), Some(ISSUER));
    let audience = Value::String(AUDIENCE.into());
    let aud = claims.get("aud").expect("a verified token has `aud`");
    assert!(
        *aud == audience || aud.as_array().is_some_and(|a| a.contains(&audience)),
        "wrong audience accepted: {aud}"
    );
    assert_eq!(claims.get("sub").and_then(Value::as_str), Some(caller.principal.subject.as_str()));
    assert_eq!(
        claims.get("tenant").and_then(Value::as_str),
        Some(caller.principal.tenant.as_str())
    );
    let named: BTreeSet<String> =
        words(claims.get("scope")).into_iter().chain(words(claims.get("scp"))).collect();
    assert!(caller.scopes.is_subset(&named), "scopes {:?} beyond {named:?}", caller.scopes);
});
