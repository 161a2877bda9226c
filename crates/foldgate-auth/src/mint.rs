//! Minting HS256 tokens, for `foldgate token` and for tests.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use foldgate_domain::{Subject, TenantId};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Map, Value};

use super::{MIN_SECRET_BYTES, MintError, Secret};

/// Longest lifetime a minted token may have.
const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// Signs a token for `tenant` and `subject` with the shared secret.
///
/// The tenant goes into the `tenant` claim (the default `tenant_claim`),
/// the scopes into `scope` as one space-separated string; `iat` is now and
/// `exp` is now plus `ttl`. `issuer` and `audience` must match the server's
/// `issuer` and `audience` settings when those are set.
pub fn mint_hs256<S: AsRef<str>>(
    secret: &Secret,
    tenant: &TenantId,
    subject: &Subject,
    scopes: impl IntoIterator<Item = S>,
    ttl: Duration,
    issuer: Option<&str>,
    audience: Option<&str>,
) -> Result<String, MintError> {
    if secret.expose().len() < MIN_SECRET_BYTES {
        return Err(MintError::WeakSecret);
    }
    if ttl < Duration::from_secs(1) || ttl > MAX_TTL {
        return Err(MintError::InvalidTtl);
    }
    let ttl = TimeDelta::from_std(ttl).map_err(|_| MintError::InvalidTtl)?;
    let mut scope = Vec::new();
    for s in scopes {
        let s = s.as_ref();
        // RFC 6749 §3.3 scope-token: %x21 / %x23-5B / %x5D-7E.
        if s.is_empty() || !s.chars().all(|c| matches!(c, '!'..='~') && c != '"' && c != '\\') {
            return Err(MintError::InvalidScope(s.to_owned()));
        }
        scope.push(s.to_owned());
    }

    let now = Utc::now().timestamp();
    let mut claims = Map::new();
    claims.insert("sub".into(), subject.as_str().into());
    claims.insert("tenant".into(), tenant.as_str().into());
    claims.insert("scope".into(), scope.join(" ").into());
    claims.insert("iat".into(), now.into());
    claims.insert("exp".into(), (now + ttl.num_seconds()).into());
    if let Some(issuer) = issuer {
        claims.insert("iss".into(), issuer.into());
    }
    if let Some(audience) = audience {
        claims.insert("aud".into(), audience.into());
    }
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &Value::Object(claims),
        &EncodingKey::from_secret(secret.expose().as_bytes()),
    )
    .map_err(MintError::Sign)
}
