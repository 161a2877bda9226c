//! The authentication settings, and the secret wrapper that keeps the HS256
//! key out of logs.

use std::{fmt, net::IpAddr, path::PathBuf, time::Duration};

use foldgate_domain::duration::{self, Renamed};
use reqwest::Url;
use serde::Deserialize;

/// Shortest HS256 secret accepted, in bytes. RFC 7518 §3.2 asks for a key at
/// least as long as the hash output; shorter secrets are guessable offline
/// from a single token.
pub const MIN_SECRET_BYTES: usize = 32;

/// Largest clock-skew allowance accepted: anything longer turns `exp` into a
/// suggestion.
const MAX_LEEWAY: Duration = Duration::from_secs(300);

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
    /// `jwks_min_refresh_interval`. Must be `https`, except on a
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
    /// Clock skew tolerated when checking `exp` and `nbf` (at most 5
    /// minutes). A bare number counts seconds, as in every duration here.
    #[serde(alias = "leeway_seconds", deserialize_with = "duration::seconds")]
    pub leeway: Duration,
    /// Shortest time between two JWKS fetches, so that tokens with made-up
    /// `kid`s cannot make the gateway hammer the identity provider. A key
    /// rotated in at the provider is accepted at most this long after its
    /// first use.
    #[serde(alias = "jwks_min_refresh_interval_seconds", deserialize_with = "duration::seconds")]
    pub jwks_min_refresh_interval: Duration,
    /// Longest wait for the JWKS endpoint, connection included.
    #[serde(alias = "jwks_timeout_seconds", deserialize_with = "duration::seconds")]
    pub jwks_timeout: Duration,
    /// Age after which cached JWKS keys are refreshed in the background
    /// even if every token names a known `kid`, so that a key the provider
    /// withdrew stops being accepted.
    #[serde(alias = "jwks_max_age_seconds", deserialize_with = "duration::seconds")]
    pub jwks_max_age: Duration,
    /// How many verified tokens each replica remembers (by their SHA-256,
    /// never the token itself), so that the next request with the same
    /// token skips verification. 0 turns the cache off.
    pub token_cache_entries: usize,
    /// Longest time a verified token is remembered (at most an hour);
    /// never past its `exp`. A token whose key was withdrawn from the JWKS
    /// is accepted at most this long after it was last verified.
    #[serde(alias = "token_cache_seconds", deserialize_with = "duration::seconds")]
    pub token_cache_ttl: Duration,
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
            leeway: Duration::from_secs(30),
            jwks_min_refresh_interval: Duration::from_secs(30),
            jwks_timeout: Duration::from_secs(5),
            jwks_max_age: Duration::from_secs(600),
            token_cache_entries: 10_000,
            token_cache_ttl: Duration::from_secs(60),
        }
    }
}

impl AuthConfig {
    /// The former names of its duration settings.
    pub const RENAMED: &'static [Renamed] = &[
        Renamed::new("leeway_seconds", "leeway"),
        Renamed::new("jwks_min_refresh_interval_seconds", "jwks_min_refresh_interval"),
        Renamed::new("jwks_timeout_seconds", "jwks_timeout"),
        Renamed::new("jwks_max_age_seconds", "jwks_max_age"),
        Renamed::new("token_cache_seconds", "token_cache_ttl"),
    ];

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
        let second = Duration::from_secs(1);
        duration::check_range("leeway", self.leeway, Duration::ZERO, MAX_LEEWAY)?;
        duration::check_range(
            "jwks_min_refresh_interval",
            self.jwks_min_refresh_interval,
            second,
            Duration::from_secs(3600),
        )?;
        duration::check_range("jwks_timeout", self.jwks_timeout, second, Duration::from_secs(60))?;
        if self.jwks_max_age < self.jwks_min_refresh_interval
            || self.jwks_max_age > Duration::from_secs(7 * 24 * 3600)
        {
            return Err(format!(
                "jwks_max_age must be at least jwks_min_refresh_interval ({}) and at most 7d, \
                 got {}",
                duration::show(self.jwks_min_refresh_interval),
                duration::show(self.jwks_max_age)
            )
            .into());
        }
        duration::check_range(
            "token_cache_ttl",
            self.token_cache_ttl,
            Duration::ZERO,
            Duration::from_secs(3600),
        )?;
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
                AuthConfig { leeway: Duration::from_secs(301), ..with_secret() },
                Some("leeway must be from 0s to 5m, got 5m 1s"),
                "huge leeway",
            ),
            (
                AuthConfig { jwks_min_refresh_interval: Duration::ZERO, ..with_secret() },
                Some("jwks_min_refresh_interval must be from 1s to 1h, got 0s"),
                "refresh limit disabled",
            ),
            (
                AuthConfig { jwks_timeout: Duration::ZERO, ..with_secret() },
                Some("jwks_timeout must be from 1s to 1m, got 0s"),
                "no timeout",
            ),
            (
                AuthConfig { jwks_max_age: Duration::from_secs(10), ..with_secret() },
                Some("jwks_max_age must be at least jwks_min_refresh_interval (30s)"),
                "max age below the refresh interval",
            ),
            (
                AuthConfig { token_cache_ttl: Duration::from_secs(3601), ..with_secret() },
                Some("token_cache_ttl must be from 0s to 1h, got 1h 1s"),
                "a long cache",
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
        assert_eq!(config.leeway, Duration::from_secs(30));
        assert_eq!(config.jwks_min_refresh_interval, Duration::from_secs(30));
        assert_eq!(config.jwks_timeout, Duration::from_secs(5));
        assert_eq!(config.jwt_secret.map(|s| s.expose().len()), Some(32));

        let unknown = serde_json::from_str::<AuthConfig>(r#"{"jwt_secert": "x"}"#);
        assert!(unknown.is_err(), "a misspelt field is an error, not ignored");
    }

    #[test]
    fn durations_take_units_and_former_names() {
        let config: AuthConfig = serde_json::from_str(
            r#"{"leeway": "1m", "jwks_timeout_seconds": 7, "jwks_max_age": "1h30m",
                "token_cache_ttl": "1500ms"}"#,
        )
        .expect("parses");
        assert_eq!(config.leeway, Duration::from_secs(60));
        assert_eq!(config.jwks_timeout, Duration::from_secs(7), "a former name, in seconds");
        assert_eq!(config.jwks_max_age, Duration::from_secs(5400));
        assert_eq!(config.token_cache_ttl, Duration::from_millis(1500));
        let bad = serde_json::from_str::<AuthConfig>(r#"{"jwks_timeout": "5 parsecs"}"#)
            .expect_err("not a duration")
            .to_string();
        assert!(
            bad.contains(
                r#"expected a duration such as "30s", "500ms" or "5m", or a whole number of seconds; got "5 parsecs""#
            ),
            "{bad}"
        );
    }
}
