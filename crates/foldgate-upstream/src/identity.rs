//! Who a call is made for, told to the upstream.
//!
//! Each HTTP upstream says how (`identity`):
//! - `none`: the upstream learns nothing of the caller;
//! - `headers`: the tenant, subject, scopes and branch go in the
//!   `Foldgate-Tenant`, `Foldgate-Subject`, `Foldgate-Scope` and
//!   `Foldgate-Branch` headers (only to an `https` or loopback URL, since
//!   anyone on the path could read or forge them);
//! - `token`: a short-lived JWT minted for the upstream's audience and
//!   signed by the gateway's key, whose public half the gateway serves at
//!   `/.well-known/jwks.json`. The agent's own token is never passed on.
//!
//! Requests the gateway makes for itself (listing tools) carry no caller:
//! no identity headers, and a token whose subject is the issuer, with no
//! tenant.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use foldgate_domain::{BranchId, Principal, duration};
use http::{HeaderMap, HeaderName, HeaderValue, header};
use jsonwebtoken::{
    Algorithm, DecodingKey, EncodingKey, Header,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, PublicKeyUse, ThumbprintHash},
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The tenant a call is made for (`identity = "headers"`).
pub const TENANT_HEADER: HeaderName = HeaderName::from_static("foldgate-tenant");
/// The subject (the token's `sub`) a call is made for.
pub const SUBJECT_HEADER: HeaderName = HeaderName::from_static("foldgate-subject");
/// The caller's scopes, space-separated.
pub const SCOPE_HEADER: HeaderName = HeaderName::from_static("foldgate-scope");
/// The branch the call is charged to, when it is charged to one.
pub const IDENTITY_BRANCH_HEADER: HeaderName = HeaderName::from_static("foldgate-branch");

/// The claim of a minted token that names the branch.
pub const BRANCH_CLAIM: &str = "foldgate_branch";

/// How far in the past a minted token's `iat` and `nbf` are put, so that an
/// upstream whose clock is behind the gateway's still accepts it.
const CLOCK_SKEW: i64 = 30;

/// How an upstream learns who a call is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum IdentityMode {
    /// It does not.
    #[default]
    None,
    /// From the `Foldgate-*` headers.
    Headers,
    /// From a JWT the gateway mints for it.
    Token,
}

/// The gateway's signing key for minted tokens (`[identity]`): paths and
/// names only, nothing secret.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentityConfig {
    /// A PEM private key (Ed25519, P-256 or RSA) that signs minted tokens.
    /// Without one, a key made at start-up signs them (see the docs).
    pub signing_key_file: Option<PathBuf>,
    /// The key that signed before the current one (a PEM private or public
    /// key): published in the key set, never used to sign, so that tokens
    /// minted before a key rotation still verify until they expire.
    pub previous_key_file: Option<PathBuf>,
    /// The `iss` of minted tokens.
    pub issuer: String,
    /// How long a minted token is valid: text with units (`"5m"`) or a
    /// whole number of seconds.
    #[serde(deserialize_with = "duration::seconds")]
    pub token_ttl: Duration,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            signing_key_file: None,
            previous_key_file: None,
            issuer: "foldgate".to_owned(),
            token_ttl: Duration::from_secs(300),
        }
    }
}

impl IdentityConfig {
    /// Checks the settings (the key files are read by [`Signer::load`]).
    pub fn validate(&self) -> Result<(), String> {
        if self.issuer.trim().is_empty() {
            return Err("issuer is empty".into());
        }
        if self.previous_key_file.is_some() && self.signing_key_file.is_none() {
            return Err("previous_key_file is set without signing_key_file".into());
        }
        duration::check_range(
            "token_ttl",
            self.token_ttl,
            Duration::from_secs(10),
            Duration::from_secs(3600),
        )
        .map_err(|e| e.to_string())
    }
}

/// The caller a request to an upstream is made for.
#[derive(Debug, Clone, Copy)]
pub struct OnBehalf<'a> {
    pub principal: &'a Principal,
    /// The scopes of the caller's token (of the grant, for a gateway-run
    /// branch).
    pub scopes: &'a BTreeSet<String>,
    /// The branch the call is charged to, if any.
    pub branch: Option<BranchId>,
}

/// Signs the tokens minted for upstreams, and publishes its public keys.
#[derive(Debug)]
pub struct Signer {
    key: EncodingKey,
    header: Header,
    keys: JwkSet,
    issuer: String,
    ttl: Duration,
    /// Made at start-up rather than configured.
    ephemeral: bool,
    warned: AtomicBool,
}

/// The PKCS #8 prefix of an Ed25519 private key (RFC 8410 §10.3), before
/// its 32 bytes.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

impl Signer {
    /// The signer the settings describe: the configured key, or else an
    /// Ed25519 key made now.
    pub fn load(config: &IdentityConfig) -> Result<Self, String> {
        config.validate()?;
        let Some(path) = &config.signing_key_file else {
            return Self::ephemeral(config);
        };
        let pem = read(path, "signing_key_file")?;
        let (alg, key, jwk) =
            private_key(&pem).map_err(|e| format!("signing_key_file {}: {e}", path.display()))?;
        let mut keys = vec![jwk];
        if let Some(previous) = &config.previous_key_file {
            let pem = read(previous, "previous_key_file")?;
            let jwk = private_key(&pem)
                .map(|(_, _, jwk)| jwk)
                .or_else(|_| public_key(&pem))
                .map_err(|e| format!("previous_key_file {}: {e}", previous.display()))?;
            if jwk.common.key_id == keys[0].common.key_id {
                return Err("previous_key_file holds the same key as signing_key_file".into());
            }
            keys.push(jwk);
        }
        Ok(Self::new(config, alg, key, keys, false))
    }

    fn ephemeral(config: &IdentityConfig) -> Result<Self, String> {
        use rand_core::RngCore as _;
        let mut seed = [0u8; 32];
        rand_core::OsRng
            .try_fill_bytes(&mut seed)
            .map_err(|e| format!("making a signing key: {e}"))?;
        let key = EncodingKey::from_ed_der(&ed25519_v1(&seed));
        let jwk = published(&key, Algorithm::EdDSA).map_err(|e| format!("making a key: {e}"))?;
        Ok(Self::new(config, Algorithm::EdDSA, key, vec![jwk], true))
    }

    fn new(
        config: &IdentityConfig,
        alg: Algorithm,
        key: EncodingKey,
        keys: Vec<Jwk>,
        ephemeral: bool,
    ) -> Self {
        let mut header = Header::new(alg);
        header.kid = keys[0].common.key_id.clone();
        Self {
            key,
            header,
            keys: JwkSet { keys },
            issuer: config.issuer.clone(),
            ttl: config.token_ttl,
            ephemeral,
            warned: AtomicBool::new(false),
        }
    }

    /// The public keys, as `/.well-known/jwks.json` serves them: the
    /// signing key first, then the previous one.
    pub fn key_set(&self) -> &JwkSet {
        &self.keys
    }

    /// The `kid` of the signing key (its RFC 7638 thumbprint).
    pub fn key_id(&self) -> &str {
        self.header.kid.as_deref().unwrap_or_default()
    }

    /// The algorithm it signs with.
    pub fn algorithm(&self) -> Algorithm {
        self.header.alg
    }

    /// Whether the key was made at start-up.
    pub fn is_ephemeral(&self) -> bool {
        self.ephemeral
    }

    /// A token for `audience`, for `caller` (or for the gateway itself).
    ///
    /// Claims: `iss`, `aud`, `sub`, `iat` and `nbf` (30 s ago, against
    /// clock skew), `exp` (now plus the lifetime), `jti`, and for a caller
    /// `tenant`, `scope` (space-separated) and, when the call is charged to
    /// a branch, `foldgate_branch`.
    pub fn mint(&self, audience: &str, caller: Option<&OnBehalf<'_>>) -> Result<String, String> {
        if self.ephemeral && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "minting upstream tokens with a key made at start-up: they stop verifying when \
                 this process restarts, and other replicas publish other keys; set \
                 [identity] signing_key_file"
            );
        }
        let now = chrono::Utc::now().timestamp();
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(300);
        let mut claims = Map::new();
        claims.insert("iss".into(), self.issuer.clone().into());
        claims.insert("aud".into(), audience.into());
        claims.insert("iat".into(), (now - CLOCK_SKEW).into());
        claims.insert("nbf".into(), (now - CLOCK_SKEW).into());
        claims.insert("exp".into(), (now + ttl).into());
        claims.insert("jti".into(), uuid::Uuid::new_v4().to_string().into());
        match caller {
            Some(caller) => {
                claims.insert("sub".into(), caller.principal.subject.as_str().into());
                claims.insert("tenant".into(), caller.principal.tenant.as_str().into());
                let scope = caller.scopes.iter().map(String::as_str).collect::<Vec<_>>().join(" ");
                claims.insert("scope".into(), scope.into());
                if let Some(branch) = caller.branch {
                    claims.insert(BRANCH_CLAIM.into(), branch.to_string().into());
                }
            }
            None => {
                claims.insert("sub".into(), self.issuer.clone().into());
            }
        }
        jsonwebtoken::encode(&self.header, &Value::Object(claims), &self.key)
            .map_err(|e| format!("signing a token for the upstream: {e}"))
    }
}

fn read(path: &Path, setting: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{setting} {}: {e}", path.display()))
}

/// A PEM private key: the algorithm it signs with, the key, and its public
/// half as published.
fn private_key(pem: &[u8]) -> Result<(Algorithm, EncodingKey, Jwk), String> {
    let tried = [
        (Algorithm::EdDSA, EncodingKey::from_ed_pem(pem).map(ed25519_as_v1)),
        (Algorithm::ES256, EncodingKey::from_ec_pem(pem)),
        (Algorithm::RS256, EncodingKey::from_rsa_pem(pem)),
    ];
    for (alg, key) in tried {
        let Ok(key) = key else { continue };
        // An EC key of another curve fails here, as P-256 is the one taken.
        match published(&key, alg) {
            Ok(jwk) => return Ok((alg, key, jwk)),
            Err(e) if alg == Algorithm::ES256 => {
                return Err(format!("only P-256 EC keys are supported ({e})"));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("not a PEM private key of type Ed25519, P-256 or RSA".into())
}

/// The PKCS #8 v1 form of an Ed25519 private key of 32 bytes.
fn ed25519_v1(seed: &[u8; 32]) -> Vec<u8> {
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    der.extend_from_slice(seed);
    der
}

/// An Ed25519 key in PKCS #8 v2 (with its public key, as OpenSSL 3 and
/// most libraries write it) as v1, the form whose public key `jsonwebtoken`
/// can derive; other keys as they are.
fn ed25519_as_v1(key: EncodingKey) -> EncodingKey {
    let der = key.as_bytes();
    // v2: the same start but for the version (1) and the length.
    let v2 = der.len() > 48
        && der[0] == 0x30
        && der[2..5] == [0x02, 0x01, 0x01]
        && der[5..16] == ED25519_PKCS8_PREFIX[5..];
    match der.get(16..48).and_then(|seed| <&[u8; 32]>::try_from(seed).ok()) {
        Some(seed) if v2 => EncodingKey::from_ed_der(&ed25519_v1(seed)),
        _ => key,
    }
}

/// A PEM public key, as published.
fn public_key(pem: &[u8]) -> Result<Jwk, String> {
    let tried = [
        (Algorithm::EdDSA, DecodingKey::from_ed_pem(pem)),
        (Algorithm::ES256, DecodingKey::from_ec_pem(pem)),
        (Algorithm::RS256, DecodingKey::from_rsa_pem(pem)),
    ];
    for (alg, key) in tried {
        let Ok(key) = key else { continue };
        let mut jwk = Jwk::from_decoding_key(&key, Some(alg)).map_err(|e| e.to_string())?;
        if let AlgorithmParameters::EllipticCurve(ec) = &jwk.algorithm
            && ec.curve != EllipticCurve::P256
        {
            return Err(format!("only P-256 EC keys are supported, not {:?}", ec.curve));
        }
        identify(&mut jwk)?;
        return Ok(jwk);
    }
    Err("not a PEM key of type Ed25519, P-256 or RSA".into())
}

/// The public JWK of a private key, with its `kid` and `use`.
fn published(key: &EncodingKey, alg: Algorithm) -> Result<Jwk, String> {
    let mut jwk = Jwk::from_encoding_key(key, alg).map_err(|e| e.to_string())?;
    identify(&mut jwk)?;
    Ok(jwk)
}

fn identify(jwk: &mut Jwk) -> Result<(), String> {
    jwk.common.key_id = Some(jwk.thumbprint(ThumbprintHash::SHA256).map_err(|e| e.to_string())?);
    jwk.common.public_key_use = Some(PublicKeyUse::Signature);
    Ok(())
}

/// How one upstream is told who calls: its mode, its audience and the
/// gateway's signer.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub mode: IdentityMode,
    pub audience: String,
    pub signer: Option<std::sync::Arc<Signer>>,
}

impl Identity {
    /// The headers that tell the upstream who `caller` is.
    pub fn headers(&self, caller: Option<&OnBehalf<'_>>) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        match self.mode {
            IdentityMode::None => {}
            IdentityMode::Headers => {
                let Some(caller) = caller else { return Ok(headers) };
                // Each scope encoded, then joined by spaces.
                let scope =
                    caller.scopes.iter().map(|s| encoded_text(s)).collect::<Vec<_>>().join(" ");
                headers.insert(TENANT_HEADER, encoded(caller.principal.tenant.as_str()));
                headers.insert(SUBJECT_HEADER, encoded(caller.principal.subject.as_str()));
                headers.insert(
                    SCOPE_HEADER,
                    HeaderValue::try_from(scope).unwrap_or_else(|_| HeaderValue::from_static("")),
                );
                if let Some(branch) = caller.branch {
                    headers.insert(IDENTITY_BRANCH_HEADER, encoded(&branch.to_string()));
                }
            }
            IdentityMode::Token => {
                let signer = self.signer.as_ref().ok_or("the gateway has no signing key")?;
                let token = signer.mint(&self.audience, caller)?;
                let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                    .map_err(|e| format!("a minted token is not a header value: {e}"))?;
                value.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, value);
            }
        }
        Ok(headers)
    }
}

/// A header value of any text: visible ASCII other than `%` as it is, every
/// other byte of its UTF-8 (spaces too) percent-encoded.
fn encoded(text: &str) -> HeaderValue {
    // Only visible ASCII is left, which every header value may hold.
    HeaderValue::try_from(encoded_text(text)).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn encoded_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (b'!'..=b'~').contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Whether identity headers may go to `url`: over TLS, or to this host.
pub(crate) fn private_path(url: &reqwest::Url) -> bool {
    if url.scheme() == "https" {
        return true;
    }
    let Some(host) = url.host_str() else { return false };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests;
