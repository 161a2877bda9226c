//! The authentication settings, and the secret wrapper that keeps the HS256
//! key out of logs.

use std::{fmt, net::IpAddr, path::PathBuf};

use reqwest::Url;
use serde::Deserialize;

/// Shortest HS256 secret accepted, in bytes. RFC 7518 §3.2 asks for a key at
/// least as long as the hash output; shorter secrets are guessable offline
/// from a single token.
pub const MIN_SECRET_BYTES: usize = 32;

/// Largest clock-skew allowance accepted: anything longer turns `exp` into a
/// suggestion.
const MAX_LEEWAY_SECONDS: u64 = 300;

/// A value that must never be printed: `Debug` shows `***`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that signs or verifies with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

/// How bearer tokens on `/mcp` are verified.
///
/// Exactly one key source is set: `jwt_secret`, `public_key_file` or
/// `jwks_url`. The server fills `audience` with its canonical MCP URL when
/// the operator leaves it empty, and, when no key source is configured at
/// all, generates an ephemeral `jwt_secret` before calling [`validate`].
///
/// [`validate`]: AuthConfig::validate
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// HS256 shared secret (`FOLDGATE_JWT_SECRET`), at least 32 bytes. For
    /// development and tests: whoever holds it can mint tokens for any
    /// tenant. `foldgate token` signs with it.
    pub jwt_secret: Option<Secret>,
    /// URL of the identity provider's JSON Web Key Set
    /// (`FOLDGATE_JWKS_URL`). Keys are cached; a token naming an unknown
    /// `kid` triggers a refetch, at most once per
    /// `jwks_min_refresh_interval_seconds`. Must be `https`, except on a
    /// loopback host or with `jwks_allow_http`.
    pub jwks_url: Option<String>,
    /// Accept a plain `http` `jwks_url` on any host: for an identity
    /// provider inside the cluster, reached over a network the operator
    /// trusts (a service mesh with mutual TLS, a namespace a NetworkPolicy
    /// closes). Keys fetched over plain HTTP can be swapped by anyone on the
    /// path, who could then sign tokens for every tenant.
    pub jwks_allow_http: bool,
    /// PEM file holding one public key (`FOLDGATE_JWT_PUBLIC_KEY_FILE`):
    /// RSA (tokens must be RS256), P-256 (ES256), P-384 (ES384) or Ed25519
    /// (EdDSA). Read once at startup; an unreadable file stops startup.
    pub public_key_file: Option<PathBuf>,
    /// Required `iss` claim (`FOLDGATE_JWT_ISSUER`). Also published as the
    /// authorization server in the protected resource metadata. Unset: any
    /// issuer is accepted.
    pub issuer: Option<String>,
    /// Required `aud` value (`FOLDGATE_JWT_AUDIENCE`); a token passes when
    /// its `aud` is this string or an array containing it. Unset: `aud` is
    /// not checked.
    pub audience: Option<String>,
    /// Claim holding the tenant id (`FOLDGATE_TENANT_CLAIM`). Its value must
    /// be a valid tenant id; the tenant scopes every stored record.
    pub tenant_claim: String,
    /// Clock skew tolerated when checking `exp` and `nbf`, in seconds
    /// (at most 300).
    pub leeway_seconds: u64,
    /// Shortest time between two JWKS fetches, in seconds, so that tokens
    /// with made-up `kid`s cannot make the gateway hammer the identity
    /// provider. A key rotated in at the provider is accepted at most this
    /// long after its first use.
    pub jwks_min_refresh_interval_seconds: u64,
    /// Longest wait for the JWKS endpoint, in seconds, connection included.
    pub jwks_timeout_seconds: u64,
    /// Age after which cached JWKS keys are refreshed in the background
    /// even if every token names a known `kid`, so that a key the provider
    /// withdrew stops being accepted. In seconds.
    pub jwks_max_age_seconds: u64,
    /// How many verified tokens each replica remembers (by their SHA-256,
    /// never the token itself), so that the next request with the same
    /// token skips verification. 0 turns the cache off.
    pub token_cache_entries: usize,
    /// Longest time a verified token is remembered, in seconds (at most
    /// 3600); never past its `exp`. A token whose key was withdrawn from the
    /// JWKS is accepted at most this long after it was last verified.
    pub token_cache_seconds: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_secret: None,
            jwks_url: None,
            jwks_allow_http: false,
            public_key_file: None,
            issuer: None,
            audience: None,
            tenant_claim: "tenant".to_owned(),
            leeway_seconds: 30,
            jwks_min_refresh_interval_seconds: 30,
            jwks_timeout_seconds: 5,
            jwks_max_age_seconds: 600,
            token_cache_entries: 10_000,
            token_cache_seconds: 60,
        }
    }
}

impl AuthConfig {
    /// Checks the settings, naming the first one that is wrong.
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        let sources: Vec<&str> = [
            self.jwt_secret.as_ref().map(|_| "jwt_secret"),
            self.jwks_url.as_ref().map(|_| "jwks_url"),
            self.public_key_file.as_ref().map(|_| "public_key_file"),
        ]
        .into_iter()
        .flatten()
        .collect();
        match sources.as_slice() {
            [] => {
                return Err("no JWT key source configured: set one of jwt_secret, jwks_url or \
                            public_key_file"
                    .into());
            }
            [_] => {}
            several => {
                return Err(format!(
                    "more than one JWT key source configured ({}): set exactly one",
                    several.join(", ")
                )
                .into());
            }
        }
        if let Some(secret) = &self.jwt_secret
            && secret.expose().len() < MIN_SECRET_BYTES
        {
            return Err(format!(
                "jwt_secret must be at least {MIN_SECRET_BYTES} bytes long (it is an HS256 key); \
                 generate one with `openssl rand -base64 32`"
            )
            .into());
        }
        if let Some(url) = &self.jwks_url {
            check_jwks_url(url, self.jwks_allow_http)?;
        }
        if let Some(path) = &self.public_key_file
            && path.as_os_str().is_empty()
        {
            return Err("public_key_file must not be empty".into());
        }
        for (name, value) in [("issuer", &self.issuer), ("audience", &self.audience)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(format!("{name} must not be empty when set").into());
            }
        }
        if self.tenant_claim.trim().is_empty() {
            return Err("tenant_claim must name a claim".into());
        }
        if self.leeway_seconds > MAX_LEEWAY_SECONDS {
            return Err(format!("leeway_seconds must be at most {MAX_LEEWAY_SECONDS}").into());
        }
        if !(1..=3600).contains(&self.jwks_min_refresh_interval_seconds) {
            return Err("jwks_min_refresh_interval_seconds must be between 1 and 3600".into());
        }
        if !(1..=60).contains(&self.jwks_timeout_seconds) {
            return Err("jwks_timeout_seconds must be between 1 and 60".into());
        }
        if self.jwks_max_age_seconds < self.jwks_min_refresh_interval_seconds
            || self.jwks_max_age_seconds > 7 * 24 * 3600
        {
            return Err("jwks_max_age_seconds must be at least \
                        jwks_min_refresh_interval_seconds and at most a week"
                .into());
        }
        if self.token_cache_seconds > 3600 {
            return Err("token_cache_seconds must be at most 3600".into());
        }
        if self.token_cache_entries > 10_000_000 {
            return Err("token_cache_entries must be at most 10000000".into());
        }
        Ok(())
    }
}

/// Keys fetched over plain HTTP could be swapped by anyone on the path, which
/// would let them sign tokens for every tenant.
fn check_jwks_url(raw: &str, allow_http: bool) -> Result<(), String> {
    let url = Url::parse(raw).map_err(|e| format!("jwks_url is not a valid URL: {e}"))?;
    match url.scheme() {
        "https" => Ok(()),
        "http" if allow_http || is_loopback(&url) => Ok(()),
        "http" => Err("jwks_url must use https (plain http is accepted for a loopback host, \
                       or anywhere with jwks_allow_http = true)"
            .into()),
        other => Err(format!("jwks_url must be an https URL, not {other}:")),
    }
}

fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else { return false };
    // IPv6 hosts keep their brackets in `host_str`.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_secret() -> AuthConfig {
        AuthConfig { jwt_secret: Some(Secret::new("s".repeat(32))), ..AuthConfig::default() }
    }

    #[test]
    fn validation_names_the_wrong_setting() {
        let cases: Vec<(AuthConfig, Option<&str>, &str)> = vec![
            (with_secret(), None, "secret only is valid"),
            (AuthConfig::default(), Some("no JWT key source"), "no source"),
            (
                AuthConfig { jwks_url: Some("https://idp.example/jwks".into()), ..with_secret() },
                Some("more than one JWT key source configured (jwt_secret, jwks_url)"),
                "two sources",
            ),
            (
                AuthConfig { jwt_secret: Some(Secret::new("short")), ..AuthConfig::default() },
                Some("at least 32 bytes"),
                "short secret",
            ),
            (
                AuthConfig {
                    jwks_url: Some("https://idp.example/.well-known/jwks.json".into()),
                    ..AuthConfig::default()
                },
                None,
                "https JWKS",
            ),
            (
                AuthConfig {
                    jwks_url: Some("http://127.0.0.1:8080/jwks".into()),
                    ..AuthConfig::default()
                },
                None,
                "http JWKS on loopback",
            ),
            (
                AuthConfig {
                    jwks_url: Some("http://localhost/jwks".into()),
                    ..AuthConfig::default()
                },
                None,
                "http JWKS on localhost",
            ),
            (
                AuthConfig {
                    jwks_url: Some("http://idp.example/jwks".into()),
                    ..AuthConfig::default()
                },
                Some("must use https"),
                "http JWKS on a remote host",
            ),
            (
                AuthConfig {
                    jwks_url: Some("http://keycloak.identity.svc:8080/certs".into()),
                    jwks_allow_http: true,
                    ..AuthConfig::default()
                },
                None,
                "http JWKS in the cluster, explicitly allowed",
            ),
            (
                AuthConfig { jwks_url: Some("not a url".into()), ..AuthConfig::default() },
                Some("not a valid URL"),
                "garbage JWKS URL",
            ),
            (
                AuthConfig { jwks_url: Some("ftp://idp/jwks".into()), ..AuthConfig::default() },
                Some("https URL, not ftp:"),
                "other scheme",
            ),
            (
                AuthConfig { public_key_file: Some(PathBuf::new()), ..AuthConfig::default() },
                Some("public_key_file must not be empty"),
                "empty key path",
            ),
            (
                AuthConfig { issuer: Some(" ".into()), ..with_secret() },
                Some("issuer must not be empty"),
                "blank issuer",
            ),
            (
                AuthConfig { audience: Some(String::new()), ..with_secret() },
                Some("audience must not be empty"),
                "blank audience",
            ),
            (
                AuthConfig { tenant_claim: String::new(), ..with_secret() },
                Some("tenant_claim"),
                "no tenant claim",
            ),
            (
                AuthConfig { leeway_seconds: 301, ..with_secret() },
                Some("leeway_seconds"),
                "huge leeway",
            ),
            (
                AuthConfig { jwks_min_refresh_interval_seconds: 0, ..with_secret() },
                Some("jwks_min_refresh_interval_seconds"),
                "refresh limit disabled",
            ),
            (
                AuthConfig { jwks_timeout_seconds: 0, ..with_secret() },
                Some("jwks_timeout_seconds"),
                "no timeout",
            ),
            (
                AuthConfig { jwks_max_age_seconds: 10, ..with_secret() },
                Some("jwks_max_age_seconds"),
                "max age below the refresh interval",
            ),
        ];
        for (config, expected, why) in cases {
            let result = config.validate();
            match expected {
                None => assert_eq!(result, Ok(()), "{why}"),
                Some(needle) => {
                    let message = result.expect_err(why);
                    assert!(
                        message.to_string().contains(needle),
                        "{why}: {message:?} lacks {needle:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn secrets_never_print() {
        let config = with_secret();
        let printed = format!("{config:?}");
        assert!(!printed.contains("ssss"), "{printed}");
        assert!(printed.contains("jwt_secret: Some(***)"), "{printed}");
    }

    #[test]
    fn deserializes_with_defaults_and_refuses_unknown_fields() {
        let config: AuthConfig =
            serde_json::from_str(r#"{"jwt_secret": "0123456789abcdef0123456789abcdef"}"#)
                .expect("parses");
        assert_eq!(config.tenant_claim, "tenant");
        assert_eq!(config.leeway_seconds, 30);
        assert_eq!(config.jwks_min_refresh_interval_seconds, 30);
        assert_eq!(config.jwks_timeout_seconds, 5);
        assert_eq!(config.jwt_secret.map(|s| s.expose().len()), Some(32));

        let unknown = serde_json::from_str::<AuthConfig>(r#"{"jwt_secert": "x"}"#);
        assert!(unknown.is_err(), "a misspelt field is an error, not ignored");
    }
}
