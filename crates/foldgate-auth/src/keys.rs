//! Where verification keys come from, and which algorithms each source
//! accepts.
//!
//! The accepted algorithm is decided by the key, never by the token: a shared
//! secret accepts only HS256, a PEM key only the algorithm of its type, a
//! JWKS only asymmetric algorithms matching each key's type. That is what
//! defeats algorithm confusion (an HS256 token "signed" with the RSA public
//! key as HMAC secret) and `alg: none`.

use std::{path::Path, sync::Arc};

use foldgate_domain::{Clock, SystemClock};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};

use super::{
    AuthConfig, AuthError, AuthSetupError,
    config::{SourceConfig, TrustedIssuer},
    jwks::{Jwks, JwksSettings, Location},
};

/// A trusted issuer's key source.
#[derive(Debug)]
pub(crate) enum KeySource {
    /// HS256 with the shared secret.
    Secret(Arc<DecodingKey>),
    /// One public key read from a PEM file; `alg` follows from its type.
    Pem { alg: Algorithm, key: Arc<DecodingKey> },
    /// The identity provider's key set, at a configured URL or found
    /// through discovery.
    Jwks(Arc<Jwks>),
}

impl KeySource {
    /// Builds the source of one trusted issuer of a validated
    /// configuration; a key set is not fetched yet (see [`warm_up`]). An
    /// unreadable PEM file is an error.
    ///
    /// [`warm_up`]: Self::warm_up
    pub(crate) async fn new(
        trusted: &TrustedIssuer<'_>,
        config: &AuthConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthSetupError> {
        let location = match trusted.source {
            SourceConfig::Secret(secret) => {
                return Ok(Self::Secret(Arc::new(DecodingKey::from_secret(
                    secret.expose().as_bytes(),
                ))));
            }
            SourceConfig::PublicKey(path) => {
                let (alg, key) = read_public_key(path).await?;
                return Ok(Self::Pem { alg, key: Arc::new(key) });
            }
            SourceConfig::JwksUrl(url) => Location::Url(url.to_owned()),
            SourceConfig::Discovery(issuer) => {
                Location::Discovery { issuer: issuer.to_owned(), allow_http: trusted.allow_http }
            }
        };
        Ok(Self::Jwks(Jwks::new(JwksSettings::from_config(location, config), clock)?))
    }

    /// The first fetch of a key set (and of its discovery document), at
    /// startup. A failure is logged, not returned: the fetch is retried
    /// when a token needs the keys.
    pub(crate) async fn warm_up(&self) {
        if let Self::Jwks(jwks) = self {
            jwks.warm_up().await;
        }
    }

    /// Registers the background refresh of a key set under `name`. Other
    /// sources have none.
    pub(crate) fn register(&self, driver: &mut foldgate_background::Driver, name: String) {
        if let Self::Jwks(jwks) = self {
            jwks.register(driver, name);
        }
    }

    /// The keys that may have signed a token with this header, in the order
    /// to try them. Refuses algorithms the source does not accept.
    pub(crate) async fn keys_for(
        &self,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<Vec<Arc<DecodingKey>>, AuthError> {
        match self {
            Self::Secret(key) if alg == Algorithm::HS256 => Ok(vec![Arc::clone(key)]),
            Self::Pem { alg: expected, key } if alg == *expected => Ok(vec![Arc::clone(key)]),
            Self::Jwks(jwks) if alg.family() != AlgorithmFamily::Hmac => {
                jwks.keys_for(alg, kid).await
            }
            Self::Secret(_) | Self::Pem { .. } | Self::Jwks(_) => {
                Err(AuthError::UnsupportedAlgorithm)
            }
        }
    }
}

/// What `check-config` learned of one trusted issuer's key source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySourceCheck {
    /// The issuer, with several issuers (`[[auth.issuers]]`); `None` in the
    /// single-issuer form.
    pub issuer: Option<String>,
    /// A description of the source, or why it cannot be used.
    pub outcome: Result<String, String>,
}

/// What `check-config` learns of each trusted issuer's key source: without
/// contacting anything, a PEM file is read and parsed; with `connect`, a
/// discovery document and a JWKS are fetched once. An invalid configuration
/// is an error; otherwise one check per issuer, in the configured order.
pub async fn check_key_sources(
    config: &AuthConfig,
    connect: bool,
) -> Result<Vec<KeySourceCheck>, String> {
    config.validate().map_err(|e| e.to_string())?;
    let trusted = config.trusted();
    if trusted.is_empty() {
        return Err("no JWT key source configured".to_owned());
    }
    let listed = !config.issuers.is_empty();
    let mut checks = Vec::with_capacity(trusted.len());
    for issuer in &trusted {
        checks.push(KeySourceCheck {
            issuer: listed.then(|| issuer.issuer.unwrap_or_default().to_owned()),
            outcome: check_one(issuer, config, connect).await,
        });
    }
    Ok(checks)
}

async fn check_one(
    trusted: &TrustedIssuer<'_>,
    config: &AuthConfig,
    connect: bool,
) -> Result<String, String> {
    let location = match trusted.source {
        SourceConfig::Secret(_) => return Ok("a shared secret (HS256)".to_owned()),
        SourceConfig::PublicKey(path) => {
            let (alg, _) = read_public_key(path).await.map_err(|e| e.to_string())?;
            return Ok(format!("public_key_file {} ({alg:?})", path.display()));
        }
        SourceConfig::JwksUrl(url) => Location::Url(url.to_owned()),
        SourceConfig::Discovery(issuer) => {
            Location::Discovery { issuer: issuer.to_owned(), allow_http: trusted.allow_http }
        }
    };
    if !connect {
        let what = match &location {
            Location::Url(_) => "fetches it",
            Location::Discovery { .. } => "fetches the discovery document and the JWKS",
        };
        return Ok(format!("{location} (not fetched; --connect {what})"));
    }
    let settings = JwksSettings::from_config(location.clone(), config);
    let jwks = Jwks::new(settings, Arc::new(SystemClock)).map_err(|e| e.to_string())?;
    let (url, keys) =
        jwks.usable_keys().await.map_err(|e| format!("{location}: {}", ErrorText(&e)))?;
    Ok(match location {
        Location::Url(_) => format!("{location}: {keys} usable signing keys"),
        Location::Discovery { issuer, .. } => {
            format!("the JWKS of {issuer} at {url} (by discovery): {keys} usable signing keys")
        }
    })
}

/// An error with its sources, on one line.
struct ErrorText<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for ErrorText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

async fn read_public_key(path: &Path) -> Result<(Algorithm, DecodingKey), AuthSetupError> {
    let pem = tokio::fs::read(path)
        .await
        .map_err(|source| AuthSetupError::ReadKey { path: path.to_owned(), source })?;
    parse_public_pem(&pem)
        .map_err(|reason| AuthSetupError::BadKey { path: path.to_owned(), reason })
}

/// Reads one PEM public key and the one algorithm tokens signed by its owner
/// must use.
pub(crate) fn parse_public_pem(pem: &[u8]) -> Result<(Algorithm, DecodingKey), String> {
    let text = std::str::from_utf8(pem).map_err(|_| "the file is not PEM text".to_owned())?;
    let label = text
        .split_once("-----BEGIN ")
        .and_then(|(_, rest)| rest.split_once("-----"))
        .map(|(label, _)| label)
        .ok_or_else(|| "the file holds no PEM block".to_owned())?;
    if label.contains("PRIVATE KEY") {
        return Err("it holds a private key; configure the public key instead \
                    (`openssl pkey -in key.pem -pubout`)"
            .to_owned());
    }
    if label != "PUBLIC KEY" && label != "RSA PUBLIC KEY" {
        return Err(format!("expected a PUBLIC KEY block, found {label:?}"));
    }
    if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
        return Ok((Algorithm::RS256, key));
    }
    if let Ok(key) = DecodingKey::from_ec_pem(pem) {
        // The curve shows in the length of the SEC1 point (uncompressed or
        // compressed).
        let alg = match key.try_get_as_bytes().map(<[u8]>::len) {
            Ok(65 | 33) => Algorithm::ES256,
            Ok(97 | 49) => Algorithm::ES384,
            _ => return Err("unsupported elliptic curve: use P-256 or P-384".to_owned()),
        };
        return Ok((alg, key));
    }
    if let Ok(key) = DecodingKey::from_ed_pem(pem) {
        return Ok((Algorithm::EdDSA, key));
    }
    Err("expected an RSA, P-256, P-384 or Ed25519 public key".to_owned())
}
