//! Reading a token: its header (before any key is chosen), its signature,
//! and the claims that make a principal.

use std::{collections::BTreeSet, str::FromStr, sync::Arc};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use chrono::{DateTime, TimeDelta, Utc};
use foldgate_domain::{Principal, Subject, TenantId};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{AuthError, Authenticated};

/// Longest token accepted. Real access tokens are a few kilobytes; this
/// bounds the work an unauthenticated client can ask for.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// What the header says about how the token was signed. Not trusted: it
/// only selects among the keys and algorithms the configuration allows.
#[derive(Debug)]
pub(crate) struct TokenHeader {
    pub alg: Algorithm,
    pub kid: Option<String>,
}

#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    kid: Option<String>,
    crit: Option<Value>,
}

/// Reads the header of a compact JWS without verifying anything.
pub(crate) fn parse_header(token: &str) -> Result<TokenHeader, AuthError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AuthError::Malformed("the token is too long"));
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, _signature] = parts.as_slice() else {
        return Err(AuthError::Malformed("a JWT has three dot-separated parts"));
    };
    if header.is_empty() || payload.is_empty() {
        return Err(AuthError::Malformed("the token header or payload is empty"));
    }
    let bytes = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| AuthError::Malformed("the token header is not base64url"))?;
    let raw: RawHeader = serde_json::from_slice(&bytes).map_err(|_| {
        AuthError::Malformed("the token header is not a JSON object with a string `alg`")
    })?;
    // RFC 7515 §4.1.11: a recipient that does not understand a listed
    // critical extension must reject the token. We understand none.
    if raw.crit.is_some() {
        return Err(AuthError::Malformed("the token header lists unsupported critical extensions"));
    }
    // `none`, and any name this server does not implement, ends here.
    let alg = Algorithm::from_str(&raw.alg).map_err(|_| AuthError::UnsupportedAlgorithm)?;
    Ok(TokenHeader { alg, kid: raw.kid })
}

/// The `iss` claim of a token whose signature has not been checked yet: only
/// to pick which trusted issuer's keys check it. `None` when the payload has
/// no string `iss`.
pub(crate) fn unverified_issuer(token: &str) -> Result<Option<String>, AuthError> {
    let payload = token
        .split('.')
        .nth(1)
        .ok_or(AuthError::Malformed("a JWT has three dot-separated parts"))?;
    let bytes = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| AuthError::Malformed("the token is not base64url-encoded JSON"))?;
    let mut payload: Map<String, Value> = serde_json::from_slice(&bytes)
        .map_err(|_| AuthError::Malformed("the token payload is not a JSON object"))?;
    Ok(match payload.remove("iss") {
        Some(Value::String(iss)) => Some(iss),
        _ => None,
    })
}

/// Checks the signature with each candidate key and returns the payload of
/// the first that verifies. Claims are only read after that.
pub(crate) fn verify_signature(
    token: &str,
    alg: Algorithm,
    keys: &[Arc<DecodingKey>],
) -> Result<Map<String, Value>, AuthError> {
    // Only the signature is checked here; `ClaimRules` checks the claims
    // against the injected clock.
    let mut validation = Validation::new(alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    for key in keys {
        match jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) => match e.kind() {
                ErrorKind::InvalidAlgorithm | ErrorKind::UnsupportedAlgorithm => {
                    return Err(AuthError::UnsupportedAlgorithm);
                }
                ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Utf8(_) => {
                    return Err(AuthError::Malformed("the token is not base64url-encoded JSON"));
                }
                ErrorKind::Json(_) => {
                    return Err(AuthError::Malformed("the token payload is not a JSON object"));
                }
                // A wrong signature, or a key that cannot check this one:
                // try the next candidate.
                _ => {}
            },
        }
    }
    Err(AuthError::BadSignature)
}

/// What the claims of a validly signed token must satisfy.
#[derive(Debug)]
pub(crate) struct ClaimRules {
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub tenant_claim: String,
    pub leeway: TimeDelta,
}

impl ClaimRules {
    pub(crate) fn check(
        &self,
        claims: Map<String, Value>,
        now: DateTime<Utc>,
    ) -> Result<Authenticated, AuthError> {
        let now = now.timestamp();
        let leeway = self.leeway.num_seconds();
        let exp = numeric_date(&claims, "exp")?
            .ok_or_else(|| AuthError::BadClaims("the `exp` claim is required".into()))?;
        // RFC 7519 §4.1.4: the token is valid strictly before `exp`.
        if now >= exp.saturating_add(leeway) {
            return Err(AuthError::Expired);
        }
        if let Some(nbf) = numeric_date(&claims, "nbf")?
            && nbf > now.saturating_add(leeway)
        {
            return Err(AuthError::NotYetValid);
        }
        if let Some(expected) = &self.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(expected.as_str())
        {
            return Err(AuthError::WrongIssuer);
        }
        if let Some(expected) = &self.audience
            && !audience_contains(claims.get("aud"), expected)
        {
            return Err(AuthError::WrongAudience);
        }
        let subject = string_claim(&claims, "sub")?;
        let subject = Subject::parse(subject).map_err(|e| {
            AuthError::BadClaims(format!("the `sub` claim is not a valid subject: {}", e.reason))
        })?;
        let tenant = string_claim(&claims, &self.tenant_claim)?;
        let tenant = TenantId::parse(tenant).map_err(|e| {
            AuthError::BadClaims(format!(
                "the `{}` claim is not a valid tenant id: {}",
                self.tenant_claim, e.reason
            ))
        })?;
        let mut scopes = BTreeSet::new();
        for name in ["scope", "scp"] {
            add_scopes(&mut scopes, &claims, name)?;
        }
        let expires_at = DateTime::from_timestamp(exp, 0)
            .ok_or_else(|| AuthError::BadClaims("the `exp` claim is out of range".into()))?;
        Ok(Authenticated {
            principal: Principal::new(tenant, subject),
            scopes,
            expires_at: Some(expires_at),
        })
    }
}

/// A NumericDate claim (RFC 7519 §2), in whole seconds; fractions are
/// dropped.
fn numeric_date(claims: &Map<String, Value>, name: &str) -> Result<Option<i64>, AuthError> {
    let not_a_date = || AuthError::BadClaims(format!("the `{name}` claim must be a number"));
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(secs) => Ok(Some(secs)),
            // `as` saturates: absurd values stay absurd and are refused below.
            None => n.as_f64().map(|secs| Some(secs.floor() as i64)).ok_or_else(not_a_date),
        },
        Some(_) => Err(not_a_date()),
    }
}

fn audience_contains(aud: Option<&Value>, expected: &str) -> bool {
    match aud {
        Some(Value::String(aud)) => aud == expected,
        Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(expected)),
        _ => false,
    }
}

fn string_claim<'a>(claims: &'a Map<String, Value>, name: &str) -> Result<&'a str, AuthError> {
    match claims.get(name) {
        Some(Value::String(value)) => Ok(value),
        Some(_) => Err(AuthError::BadClaims(format!("the `{name}` claim must be a string"))),
        None => Err(AuthError::BadClaims(format!("the `{name}` claim is required"))),
    }
}

/// Scopes come as a space-separated string (`scope`, RFC 8693 §4.2) or, from
/// some providers, as an array (`scp`); both forms are read from both claims.
fn add_scopes(
    scopes: &mut BTreeSet<String>,
    claims: &Map<String, Value>,
    name: &str,
) -> Result<(), AuthError> {
    let invalid = || {
        AuthError::BadClaims(format!(
            "the `{name}` claim must be a space-separated string or an array of strings"
        ))
    };
    match claims.get(name) {
        None | Some(Value::Null) => {}
        Some(Value::String(list)) => scopes.extend(list.split_whitespace().map(str::to_owned)),
        Some(Value::Array(items)) => {
            for item in items {
                let scope = item.as_str().ok_or_else(invalid)?;
                scopes.extend(scope.split_whitespace().map(str::to_owned));
            }
        }
        Some(_) => return Err(invalid()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn b64(value: &Value) -> String {
        URL_SAFE_NO_PAD.encode(value.to_string())
    }

    /// The algorithm and `kid` read, or the kind of error.
    type Expected<'a> = Result<(Algorithm, Option<&'a str>), &'a str>;

    #[test]
    fn headers() {
        let payload = b64(&json!({"sub": "x"}));
        let long = format!("{}.{payload}.sig", "a".repeat(MAX_TOKEN_BYTES));
        let cases: Vec<(String, Expected<'_>, &str)> = vec![
            (
                format!("{}.{payload}.sig", b64(&json!({"alg": "HS256"}))),
                Ok((Algorithm::HS256, None)),
                "plain",
            ),
            (
                format!(
                    "{}.{payload}.sig",
                    b64(&json!({"alg": "ES256", "kid": "k1", "typ": "JWT"}))
                ),
                Ok((Algorithm::ES256, Some("k1"))),
                "with kid",
            ),
            (
                format!("{}.{payload}.", b64(&json!({"alg": "none"}))),
                Err("unsupported_algorithm"),
                "alg none",
            ),
            (
                format!("{}.{payload}.", b64(&json!({"alg": "None"}))),
                Err("unsupported_algorithm"),
                "alg None",
            ),
            (
                format!("{}.{payload}.x", b64(&json!({"alg": "HS1"}))),
                Err("unsupported_algorithm"),
                "unknown alg",
            ),
            (format!("{}.{payload}.x", b64(&json!({"typ": "JWT"}))), Err("malformed"), "no alg"),
            (
                format!("{}.{payload}.x", b64(&json!({"alg": 256}))),
                Err("malformed"),
                "alg not a string",
            ),
            (
                format!("{}.{payload}.x", b64(&json!({"alg": "HS256", "crit": ["exp"]}))),
                Err("malformed"),
                "critical extension",
            ),
            ("abc".to_owned(), Err("malformed"), "one part"),
            (format!("{}.{payload}", b64(&json!({"alg": "HS256"}))), Err("malformed"), "two parts"),
            ("a.b.c.d.e".to_owned(), Err("malformed"), "JWE shape"),
            (format!(".{payload}.x"), Err("malformed"), "empty header"),
            ("!!!.e30.x".to_owned(), Err("malformed"), "header not base64url"),
            (
                format!("{}.{payload}.x", URL_SAFE_NO_PAD.encode("[1]")),
                Err("malformed"),
                "header not an object",
            ),
            (long, Err("malformed"), "too long"),
        ];
        for (token, expected, why) in cases {
            let got = parse_header(&token).map(|h| (h.alg, h.kid)).map_err(|e| e.kind());
            let expected = expected.map(|(alg, kid)| (alg, kid.map(str::to_owned)));
            assert_eq!(got, expected, "{why}");
        }
    }

    #[test]
    fn the_unverified_issuer() {
        let header = b64(&json!({"alg": "ES256"}));
        let token = |payload: &str| format!("{header}.{payload}.sig");
        /// The token, the issuer read or the kind of error, and why.
        type Case<'a> = (String, Result<Option<&'a str>, &'a str>, &'a str);
        let cases: Vec<Case<'_>> = vec![
            (token(&b64(&json!({"iss": "https://a"}))), Ok(Some("https://a")), "a string"),
            (token(&b64(&json!({"sub": "x"}))), Ok(None), "none"),
            (token(&b64(&json!({"iss": ["https://a"]}))), Ok(None), "an array"),
            (token(&b64(&json!({"iss": 7}))), Ok(None), "a number"),
            (token("!!!"), Err("malformed"), "not base64url"),
            (token(&URL_SAFE_NO_PAD.encode("[1]")), Err("malformed"), "not an object"),
        ];
        for (token, expected, why) in cases {
            let got = unverified_issuer(&token).map_err(|e| e.kind());
            assert_eq!(got, expected.map(|iss| iss.map(str::to_owned)), "{why}");
        }
    }

    fn rules() -> ClaimRules {
        ClaimRules {
            issuer: Some("https://idp.example".into()),
            audience: Some("https://gw.example/mcp".into()),
            tenant_claim: "tenant".into(),
            leeway: TimeDelta::seconds(30),
        }
    }

    const NOW: i64 = 1_700_000_000;

    fn valid() -> Value {
        json!({
            "iss": "https://idp.example",
            "aud": "https://gw.example/mcp",
            "sub": "alice",
            "tenant": "acme",
            "exp": NOW + 600,
            "scope": "fold:read",
        })
    }

    fn with(changes: Value) -> Map<String, Value> {
        let mut claims = valid();
        for (k, v) in changes.as_object().expect("object") {
            if v.is_null() {
                claims.as_object_mut().expect("object").remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        claims.as_object().expect("object").clone()
    }

    #[test]
    fn claim_rules() {
        let now = DateTime::from_timestamp(NOW, 0).expect("time");
        let cases: Vec<(Value, Result<(), &str>, &str)> = vec![
            (json!({}), Ok(()), "valid"),
            (json!({"exp": null}), Err("bad_claims"), "exp missing"),
            (json!({"exp": "tomorrow"}), Err("bad_claims"), "exp not a number"),
            (json!({"exp": NOW as f64 + 0.5}), Ok(()), "fractional exp"),
            (json!({"exp": NOW - 29}), Ok(()), "expired within leeway"),
            (json!({"exp": NOW - 30}), Err("expired"), "expired at the leeway"),
            (json!({"exp": NOW - 3600}), Err("expired"), "long expired"),
            (json!({"exp": 1e300}), Err("bad_claims"), "exp beyond any date"),
            (json!({"nbf": NOW + 30}), Ok(()), "nbf within leeway"),
            (json!({"nbf": NOW + 31}), Err("not_yet_valid"), "nbf beyond leeway"),
            (json!({"nbf": "soon"}), Err("bad_claims"), "nbf not a number"),
            (json!({"iss": "https://evil.example"}), Err("wrong_issuer"), "other issuer"),
            (json!({"iss": null}), Err("wrong_issuer"), "issuer missing"),
            (json!({"iss": ["https://idp.example"]}), Err("wrong_issuer"), "issuer as array"),
            (json!({"aud": ["other", "https://gw.example/mcp"]}), Ok(()), "audience in array"),
            (json!({"aud": "https://gw.example/mcp/"}), Err("wrong_audience"), "audience differs"),
            (json!({"aud": null}), Err("wrong_audience"), "audience missing"),
            (json!({"sub": null}), Err("bad_claims"), "sub missing"),
            (json!({"sub": 42}), Err("bad_claims"), "sub not a string"),
            (json!({"sub": ""}), Err("bad_claims"), "sub empty"),
            (json!({"tenant": null}), Err("bad_claims"), "tenant missing"),
            (json!({"tenant": "a b"}), Err("bad_claims"), "tenant invalid"),
            (json!({"tenant": 7}), Err("bad_claims"), "tenant not a string"),
            (json!({"scope": 1}), Err("bad_claims"), "scope not a string"),
            (json!({"scp": [1]}), Err("bad_claims"), "scp with a number"),
        ];
        for (changes, expected, why) in cases {
            let got = rules().check(with(changes), now).map(|_| ()).map_err(|e| e.kind());
            assert_eq!(got, expected, "{why}");
        }
    }

    #[test]
    fn principal_scopes_and_expiry() {
        let now = DateTime::from_timestamp(NOW, 0).expect("time");
        let claims = with(json!({"scope": "fold:read  extra", "scp": ["fold:write"]}));
        let auth = rules().check(claims, now).expect("valid");
        assert_eq!(auth.principal.tenant.as_str(), "acme");
        assert_eq!(auth.principal.subject.as_str(), "alice");
        assert_eq!(
            auth.scopes.iter().map(String::as_str).collect::<Vec<_>>(),
            ["extra", "fold:read", "fold:write"]
        );
        assert_eq!(auth.expires_at, DateTime::from_timestamp(NOW + 600, 0));
    }

    #[test]
    fn unset_issuer_and_audience_are_not_checked() {
        let now = DateTime::from_timestamp(NOW, 0).expect("time");
        let rules = ClaimRules { issuer: None, audience: None, ..rules() };
        let claims = with(json!({"iss": null, "aud": "anything"}));
        assert!(rules.check(claims, now).is_ok());
    }

    #[test]
    fn the_tenant_claim_is_configurable_and_named_in_errors() {
        let now = DateTime::from_timestamp(NOW, 0).expect("time");
        let rules = ClaimRules { tenant_claim: "org".into(), ..rules() };
        let ok = rules.check(with(json!({"tenant": null, "org": "acme"})), now).expect("valid");
        assert_eq!(ok.principal.tenant.as_str(), "acme");

        let err = rules.check(with(json!({"org": "a/b"})), now).expect_err("invalid");
        assert!(err.reason().contains("the `org` claim is not a valid tenant id"), "{err}");
    }
}
