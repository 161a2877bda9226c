//! The authentication settings, and the secret wrapper that keeps the HS256
//! key out of logs.
//!
//! Two forms: the single-issuer settings at the top of `[auth]` (one key
//! source, one optional `issuer`, one `audience`, one `tenant_claim`), or a
//! list of trusted issuers (`[[auth.issuers]]`), each with its own key
//! source, audience and tenant claim. Both resolve to [`TrustedIssuer`]s.

use std::{
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

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
/// Either the single-issuer form, with exactly one key source
/// (`jwt_secret`, `public_key_file`, `jwks_url`, or `discovery` from
/// `issuer`), or `issuers`, a list of trusted issuers, never both. The
/// server fills the audiences left empty with its canonical MCP URL, and,
/// when no key source is configured at all, generates an ephemeral
/// `jwt_secret` before calling [`validate`].
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
    /// Find the key set from `issuer`: its discovery document
    /// (`<issuer>/.well-known/openid-configuration`, else RFC 8414's
    /// `/.well-known/oauth-authorization-server`) must name `issuer`
    /// exactly, and its `jwks_uri` is then used as `jwks_url` would be. The
    /// document is fetched again whenever the keys are refreshed for their
    /// age, so a provider that moves its key set is followed. A key source:
    /// not with `jwt_secret`, `jwks_url` or `public_key_file`.
    pub discovery: bool,
    /// Required `aud` value (`FOLDGATE_JWT_AUDIENCE`); a token passes when
    /// its `aud` is this string or an array containing it. Unset: `aud` is
    /// not checked.
    pub audience: Option<String>,
    /// Several trusted issuers (`[[auth.issuers]]`, config file only),
    /// instead of the single-issuer settings above. A token goes to the
    /// entry whose `issuer` is its (unverified) `iss` claim and is verified
    /// with that entry's keys, audience and tenant claim only; a token
    /// naming no listed issuer is refused without fetching anything. The
    /// durations and cache settings below apply to every entry.
    pub issuers: Vec<IssuerConfig>,
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
            discovery: false,
            audience: None,
            issuers: Vec::new(),
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
        if self.issuers.is_empty() {
            self.validate_single()?;
        } else {
            self.validate_issuers()?;
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

    /// Whether a key source is configured, in either form.
    pub fn has_key_source(&self) -> bool {
        self.jwt_secret.is_some()
            || self.jwks_url.is_some()
            || self.public_key_file.is_some()
            || self.discovery
            || !self.issuers.is_empty()
    }

    /// The issuers published as authorization servers in the protected
    /// resource metadata: every listed issuer, or the single `issuer`.
    pub fn authorization_servers(&self) -> Vec<String> {
        if self.issuers.is_empty() {
            self.issuer.iter().cloned().collect()
        } else {
            self.issuers.iter().map(|i| i.issuer.clone()).collect()
        }
    }

    /// The audience tokens of `issuer` must carry: the listed issuer's, or
    /// the single `audience` when that form is used and `issuer` is its
    /// issuer or it has none. `None` when `issuer` is not trusted.
    pub fn audience_of(&self, issuer: &str) -> Option<&str> {
        if self.issuers.is_empty() {
            match &self.issuer {
                Some(own) if own != issuer => None,
                _ => self.audience.as_deref(),
            }
        } else {
            self.issuers.iter().find(|i| i.issuer == issuer)?.audience.as_deref()
        }
    }

    /// The trusted issuers of a validated configuration, in order: one for
    /// the single-issuer form, one per `[[auth.issuers]]` entry.
    pub(crate) fn trusted(&self) -> Vec<TrustedIssuer<'_>> {
        if self.issuers.is_empty() {
            let source = if let Some(secret) = &self.jwt_secret {
                Some(SourceConfig::Secret(secret))
            } else if let Some(path) = &self.public_key_file {
                Some(SourceConfig::PublicKey(path))
            } else if let Some(url) = &self.jwks_url {
                Some(SourceConfig::JwksUrl(url))
            } else if self.discovery {
                self.issuer.as_deref().map(SourceConfig::Discovery)
            } else {
                None
            };
            return source
                .map(|source| TrustedIssuer {
                    issuer: self.issuer.as_deref(),
                    source,
                    audience: self.audience.as_deref(),
                    tenant_claim: &self.tenant_claim,
                    allow_http: self.jwks_allow_http,
                })
                .into_iter()
                .collect();
        }
        self.issuers
            .iter()
            .filter_map(|entry| {
                let source = if let Some(path) = &entry.public_key_file {
                    SourceConfig::PublicKey(path)
                } else if let Some(url) = &entry.jwks_url {
                    SourceConfig::JwksUrl(url)
                } else if entry.discovery {
                    SourceConfig::Discovery(&entry.issuer)
                } else {
                    return None;
                };
                Some(TrustedIssuer {
                    issuer: Some(&entry.issuer),
                    source,
                    audience: entry.audience.as_deref(),
                    tenant_claim: &entry.tenant_claim,
                    allow_http: entry.jwks_allow_http,
                })
            })
            .collect()
    }

    /// The single-issuer form: exactly one key source.
    fn validate_single(&self) -> Result<(), String> {
        let sources: Vec<&str> = [
            self.jwt_secret.as_ref().map(|_| "jwt_secret"),
            self.jwks_url.as_ref().map(|_| "jwks_url"),
            self.public_key_file.as_ref().map(|_| "public_key_file"),
            self.discovery.then_some("discovery"),
        ]
        .into_iter()
        .flatten()
        .collect();
        match sources.as_slice() {
            [] => {
                return Err("no JWT key source configured: set one of jwt_secret, jwks_url, \
                            public_key_file or discovery = true (with issuer), or list the \
                            trusted issuers as [[auth.issuers]]"
                    .into());
            }
            [_] => {}
            several => {
                return Err(format!(
                    "more than one JWT key source configured ({}): set exactly one",
                    several.join(", ")
                ));
            }
        }
        if let Some(secret) = &self.jwt_secret
            && secret.expose().len() < MIN_SECRET_BYTES
        {
            return Err(format!(
                "jwt_secret must be at least {MIN_SECRET_BYTES} bytes long (it is an HS256 key); \
                 generate one with `openssl rand -base64 32`"
            ));
        }
        if let Some(url) = &self.jwks_url {
            check_key_url(url, self.jwks_allow_http, "jwks_url")?;
        }
        if let Some(path) = &self.public_key_file
            && path.as_os_str().is_empty()
        {
            return Err("public_key_file must not be empty".into());
        }
        for (name, value) in [("issuer", &self.issuer), ("audience", &self.audience)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(format!("{name} must not be empty when set"));
            }
        }
        if self.discovery {
            let issuer = self.issuer.as_deref().ok_or(
                "discovery = true needs issuer: the discovery document is found from the issuer \
                 identifier",
            )?;
            check_issuer_url(issuer, self.jwks_allow_http, "issuer")?;
        }
        Ok(())
    }

    /// The list form: every entry complete, no issuer twice, and none of the
    /// single-issuer settings beside it.
    fn validate_issuers(&self) -> Result<(), String> {
        let single: Vec<&str> = [
            self.jwt_secret.as_ref().map(|_| "jwt_secret"),
            self.jwks_url.as_ref().map(|_| "jwks_url"),
            self.public_key_file.as_ref().map(|_| "public_key_file"),
            self.issuer.as_ref().map(|_| "issuer"),
            self.discovery.then_some("discovery"),
            self.audience.as_ref().map(|_| "audience"),
            (self.tenant_claim != DEFAULT_TENANT_CLAIM).then_some("tenant_claim"),
            self.jwks_allow_http.then_some("jwks_allow_http"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !single.is_empty() {
            return Err(format!(
                "[[auth.issuers]] is set, and so is the single-issuer form ({}): use one form; \
                 with several issuers, each entry has its own key source, audience and \
                 tenant_claim (the HS256 jwt_secret exists in the single form only)",
                single.join(", ")
            ));
        }
        for (i, entry) in self.issuers.iter().enumerate() {
            let at = |e: String| {
                format!("issuers[{i}] {:?}: {e}", foldgate_domain::redact_url(&entry.issuer))
            };
            entry.validate().map_err(at)?;
            if self.issuers[..i].iter().any(|other| other.issuer == entry.issuer) {
                return Err(at("the issuer is listed twice".into()));
            }
        }
        Ok(())
    }
}

/// The `tenant_claim` of a token when nothing else is configured.
const DEFAULT_TENANT_CLAIM: &str = "tenant";

fn default_tenant_claim() -> String {
    DEFAULT_TENANT_CLAIM.to_owned()
}

/// One trusted issuer of `[[auth.issuers]]`: whose tokens are accepted,
/// how their signatures are checked and what their claims must say.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// The issuer identifier, compared exactly with each token's `iss`.
    /// Published in the protected resource metadata.
    pub issuer: String,
    /// Find the key set through the issuer's discovery document (see
    /// [`AuthConfig::discovery`]). One key source of three.
    #[serde(default)]
    pub discovery: bool,
    /// The issuer's JSON Web Key Set. One key source of three.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// A PEM file with the issuer's one public key. One key source of three.
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
    /// Accept plain `http` for this issuer's discovery document and key set
    /// on any host (see [`AuthConfig::jwks_allow_http`]).
    #[serde(default)]
    pub jwks_allow_http: bool,
    /// Required `aud` of this issuer's tokens. Unset: the server's canonical
    /// MCP URL.
    #[serde(default)]
    pub audience: Option<String>,
    /// The claim of this issuer's tokens that holds the tenant id.
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
}

impl IssuerConfig {
    fn validate(&self) -> Result<(), String> {
        if self.issuer.trim().is_empty() {
            return Err("issuer must not be empty".into());
        }
        let sources: Vec<&str> = [
            self.discovery.then_some("discovery"),
            self.jwks_url.as_ref().map(|_| "jwks_url"),
            self.public_key_file.as_ref().map(|_| "public_key_file"),
        ]
        .into_iter()
        .flatten()
        .collect();
        match sources.as_slice() {
            [] => {
                return Err("no key source: set one of discovery = true, jwks_url or \
                            public_key_file"
                    .into());
            }
            [_] => {}
            several => {
                return Err(format!(
                    "more than one key source ({}): set exactly one",
                    several.join(", ")
                ));
            }
        }
        if self.discovery {
            check_issuer_url(&self.issuer, self.jwks_allow_http, "issuer")?;
        }
        if let Some(url) = &self.jwks_url {
            check_key_url(url, self.jwks_allow_http, "jwks_url")?;
        }
        if let Some(path) = &self.public_key_file
            && path.as_os_str().is_empty()
        {
            return Err("public_key_file must not be empty".into());
        }
        if self.audience.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err("audience must not be empty when set".into());
        }
        if self.tenant_claim.trim().is_empty() {
            return Err("tenant_claim must name a claim".into());
        }
        Ok(())
    }
}

/// One trusted issuer, whichever form configured it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrustedIssuer<'a> {
    /// The required `iss`; `None` in the single-issuer form without
    /// `issuer`, where any issuer is accepted.
    pub issuer: Option<&'a str>,
    pub source: SourceConfig<'a>,
    pub audience: Option<&'a str>,
    pub tenant_claim: &'a str,
    /// Plain `http` accepted on any host for the discovery document and
    /// the key set.
    pub allow_http: bool,
}

/// Where a trusted issuer's verification keys come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SourceConfig<'a> {
    Secret(&'a Secret),
    PublicKey(&'a Path),
    JwksUrl(&'a str),
    /// The issuer's discovery document names the key set.
    Discovery(&'a str),
}

/// Keys fetched over plain HTTP could be swapped by anyone on the path, which
/// would let them sign tokens for every tenant. `name` is the setting (or
/// document member) the URL comes from.
pub(crate) fn check_key_url(raw: &str, allow_http: bool, name: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| format!("{name} is not a valid URL: {e}"))?;
    match url.scheme() {
        "https" => Ok(url),
        "http" if allow_http || is_loopback(&url) => Ok(url),
        "http" => Err(format!(
            "{name} must use https (plain http is accepted for a loopback host, or anywhere \
             with jwks_allow_http = true)"
        )),
        other => Err(format!("{name} must be an https URL, not {other}:")),
    }
}

/// An issuer whose discovery document is fetched: a URL as [`check_key_url`]
/// accepts, without query, fragment or user information (OpenID Connect
/// Discovery §2, RFC 8414 §2).
pub(crate) fn check_issuer_url(raw: &str, allow_http: bool, name: &str) -> Result<Url, String> {
    let url = check_key_url(raw, allow_http, name)?;
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "{name} must not have a query or fragment: it is an issuer identifier"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{name} must not carry user information"));
    }
    Ok(url)
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

    fn entry(issuer: &str) -> IssuerConfig {
        IssuerConfig {
            issuer: issuer.to_owned(),
            discovery: true,
            jwks_url: None,
            public_key_file: None,
            jwks_allow_http: false,
            audience: None,
            tenant_claim: "tenant".to_owned(),
        }
    }

    fn listed(entries: Vec<IssuerConfig>) -> AuthConfig {
        AuthConfig { issuers: entries, ..AuthConfig::default() }
    }

    #[test]
    fn discovery_and_the_list_form_name_the_wrong_setting() {
        let a = "https://idp-a.example/realms/agents";
        let b = "https://login.example.com/tenant-id/v2.0";
        let twice = format!("issuers[1] \"{a}\": the issuer is listed twice");
        let no_source = format!("issuers[1] \"{b}\": no key source");
        let cases: Vec<(AuthConfig, Option<&str>, &str)> = vec![
            (
                AuthConfig { issuer: Some(a.into()), discovery: true, ..AuthConfig::default() },
                None,
                "discovery from the issuer",
            ),
            (
                AuthConfig { discovery: true, ..AuthConfig::default() },
                Some("discovery = true needs issuer"),
                "discovery without an issuer",
            ),
            (
                AuthConfig { issuer: Some(a.into()), discovery: true, ..with_secret() },
                Some("more than one JWT key source configured (jwt_secret, discovery)"),
                "discovery and a secret",
            ),
            (
                AuthConfig {
                    issuer: Some("http://keycloak.identity.svc/realms/a".into()),
                    discovery: true,
                    ..AuthConfig::default()
                },
                Some("issuer must use https"),
                "discovery over http on a remote host",
            ),
            (
                AuthConfig {
                    issuer: Some("http://keycloak.identity.svc/realms/a".into()),
                    discovery: true,
                    jwks_allow_http: true,
                    ..AuthConfig::default()
                },
                None,
                "discovery over http, explicitly allowed",
            ),
            (
                AuthConfig {
                    issuer: Some("https://idp.example/?tenant=a".into()),
                    discovery: true,
                    ..AuthConfig::default()
                },
                Some("issuer must not have a query"),
                "discovery from an issuer with a query",
            ),
            (listed(vec![entry(a), entry(b)]), None, "two issuers"),
            (
                listed(vec![entry(a), IssuerConfig { audience: Some("x".into()), ..entry(a) }]),
                Some(twice.as_str()),
                "the same issuer twice",
            ),
            (
                listed(vec![entry(a), IssuerConfig { discovery: false, ..entry(b) }]),
                Some(no_source.as_str()),
                "an issuer without a key source",
            ),
            (
                listed(vec![IssuerConfig {
                    jwks_url: Some("https://idp-a.example/certs".into()),
                    ..entry(a)
                }]),
                Some("more than one key source (discovery, jwks_url)"),
                "an issuer with two key sources",
            ),
            (
                listed(vec![IssuerConfig {
                    discovery: false,
                    jwks_url: Some("http://idp-a.example/certs".into()),
                    ..entry(a)
                }]),
                Some("issuers[0] \"https://idp-a.example/realms/agents\": jwks_url must use https"),
                "an issuer's http key set",
            ),
            (
                listed(vec![IssuerConfig {
                    discovery: false,
                    jwks_url: Some("http://keycloak.identity.svc:8080/certs".into()),
                    jwks_allow_http: true,
                    ..entry("agents-realm")
                }]),
                None,
                "an issuer's http key set, explicitly allowed, any issuer string",
            ),
            (
                listed(vec![IssuerConfig { tenant_claim: " ".into(), ..entry(a) }]),
                Some("tenant_claim must name a claim"),
                "an issuer without a tenant claim",
            ),
            (
                listed(vec![IssuerConfig { audience: Some(String::new()), ..entry(a) }]),
                Some("audience must not be empty"),
                "an issuer with a blank audience",
            ),
            (listed(vec![entry("")]), Some("issuer must not be empty"), "a blank issuer"),
            (
                AuthConfig {
                    jwt_secret: Some(Secret::new("s".repeat(32))),
                    ..listed(vec![entry(a)])
                },
                Some("so is the single-issuer form (jwt_secret)"),
                "the HS256 secret beside the list",
            ),
            (
                AuthConfig {
                    jwks_url: Some("https://idp.example/jwks".into()),
                    issuer: Some(a.into()),
                    tenant_claim: "org".into(),
                    ..listed(vec![entry(a)])
                },
                Some("so is the single-issuer form (jwks_url, issuer, tenant_claim)"),
                "single-issuer settings beside the list",
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
    fn issuers_and_their_audiences() {
        let single = AuthConfig {
            issuer: Some("https://a".into()),
            audience: Some("aud".into()),
            ..with_secret()
        };
        assert_eq!(single.authorization_servers(), ["https://a"]);
        assert_eq!(single.audience_of("https://a"), Some("aud"));
        assert_eq!(single.audience_of("https://b"), None);
        let anyone = AuthConfig { issuer: None, ..single };
        assert!(anyone.authorization_servers().is_empty());
        assert_eq!(anyone.audience_of("https://b"), Some("aud"));

        let list = listed(vec![
            IssuerConfig { audience: Some("aud-a".into()), ..entry("https://a") },
            entry("https://b"),
        ]);
        assert_eq!(list.authorization_servers(), ["https://a", "https://b"]);
        assert_eq!(list.audience_of("https://a"), Some("aud-a"));
        assert_eq!(list.audience_of("https://b"), None);
        assert_eq!(list.audience_of("https://c"), None);
        assert!(list.has_key_source());
        assert!(!AuthConfig::default().has_key_source());
    }

    #[test]
    fn the_list_form_deserializes_with_defaults() {
        let config: AuthConfig = serde_json::from_str(
            r#"{"issuers": [
                {"issuer": "https://a", "discovery": true},
                {"issuer": "https://b", "jwks_url": "https://b/certs", "tenant_claim": "org",
                 "audience": "api://foldgate"}
            ]}"#,
        )
        .expect("parses");
        assert_eq!(config.issuers[0], entry("https://a"));
        assert_eq!(config.issuers[1].tenant_claim, "org");
        assert_eq!(config.validate(), Ok(()));
        let unknown = serde_json::from_str::<AuthConfig>(
            r#"{"issuers": [{"issuer": "https://a", "discovery": true, "leeway_seconds": 5}]}"#,
        );
        assert!(unknown.is_err(), "durations are not per issuer");
        let nameless = serde_json::from_str::<AuthConfig>(r#"{"issuers": [{"discovery": true}]}"#);
        assert!(nameless.is_err(), "an entry names its issuer");
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
