//! Signing in to the console with the deployment's OpenID Connect provider
//! (`[console]`): the settings, their checks, what the gateway tells the
//! page about them (`/console/config.json`) and the origins the page may
//! then reach (`connect-src`).
//!
//! The page runs the Authorization Code flow with PKCE itself, as a public
//! client: it reads the provider's discovery document, sends the operator
//! there, and exchanges the code at the token endpoint, all from the
//! browser. The gateway holds no client secret and keeps no session; the
//! token the page receives is used exactly as a pasted one.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use url::Url;

/// What the console asks for when `oidc_scopes` is not set: an OpenID
/// Connect sign-in, and either admin scope the provider grants the user.
pub const DEFAULT_SCOPES: &[&str] = &["openid", "foldgate:admin", "tenant:admin"];

/// Which of the provider's tokens the console sends to the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OidcToken {
    /// The access token (a JWT for the gateway's audience).
    #[default]
    AccessToken,
    /// The ID token, for providers that put the tenant and scopes there;
    /// its audience is the console's client id.
    IdToken,
}

impl OidcToken {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AccessToken => "access_token",
            Self::IdToken => "id_token",
        }
    }
}

/// The `[console]` settings. Without `oidc_client_id` the console signs in
/// with a pasted token only, and every other setting here must be unset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// The console's client id at the provider: a public client (no secret)
    /// whose redirect URI is `<public base>/console/callback`.
    pub oidc_client_id: Option<String>,
    /// The provider's issuer identifier; its discovery document is at
    /// `<issuer>/.well-known/openid-configuration`. Default: `auth.issuer`,
    /// or the first of `[[auth.issuers]]`.
    pub oidc_issuer: Option<String>,
    /// Scopes requested. Default: [`DEFAULT_SCOPES`]; `openid` is required.
    pub oidc_scopes: Option<Vec<String>>,
    /// Which token is sent to the admin API. Default: the access token.
    pub oidc_token: Option<OidcToken>,
    /// An RFC 8707 resource indicator sent with the authorization request
    /// and the code exchange (the gateway's audience, for providers that
    /// issue access tokens per resource). Default: none is sent.
    pub oidc_resource: Option<String>,
    /// Origins besides the issuer's that the page must reach during
    /// sign-in: the token endpoint's, when the provider serves it from
    /// another origin. Added to the policy's `connect-src`.
    pub oidc_connect_origins: Vec<String>,
}

/// The sign-in with the provider, as the page receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OidcSignIn {
    pub issuer: String,
    pub client_id: String,
    pub scopes: Vec<String>,
    pub token: OidcToken,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The origins the page may connect to besides its own: the issuer's
    /// and `oidc_connect_origins`, without repeats.
    pub connect_origins: Vec<String>,
}

impl ConsoleConfig {
    /// Checks the settings and resolves them, `default_issuer` being
    /// `auth.issuer`: `None` when the console signs in with pasted tokens
    /// only. Errors name the setting.
    pub fn sign_in(&self, default_issuer: Option<&str>) -> Result<Option<OidcSignIn>, String> {
        self.sign_in_defaulting(default_issuer, "auth.issuer")
    }

    /// [`sign_in`](Self::sign_in), with the issuer `oidc_issuer` defaults to
    /// named `default_name` in errors (the first of `[[auth.issuers]]`, when
    /// the gateway trusts several).
    pub fn sign_in_defaulting(
        &self,
        default_issuer: Option<&str>,
        default_name: &str,
    ) -> Result<Option<OidcSignIn>, String> {
        let Some(client_id) = &self.oidc_client_id else {
            let stray = [
                self.oidc_issuer.as_ref().map(|_| "oidc_issuer"),
                self.oidc_scopes.as_ref().map(|_| "oidc_scopes"),
                self.oidc_token.as_ref().map(|_| "oidc_token"),
                self.oidc_resource.as_ref().map(|_| "oidc_resource"),
                (!self.oidc_connect_origins.is_empty()).then_some("oidc_connect_origins"),
            ];
            let stray: Vec<&str> = stray.into_iter().flatten().collect();
            if !stray.is_empty() {
                return Err(format!(
                    "{} set without oidc_client_id: set the console's client id to sign in with \
                     the identity provider, or remove {}",
                    stray.join(", "),
                    if stray.len() == 1 { "it" } else { "them" }
                ));
            }
            return Ok(None);
        };
        if client_id.trim().is_empty() {
            return Err("oidc_client_id must not be empty when set".into());
        }
        if client_id.chars().any(char::is_control) {
            return Err("oidc_client_id must not contain control characters".into());
        }
        let (issuer, from): (&str, &str) = match (&self.oidc_issuer, default_issuer) {
            (Some(issuer), _) => (issuer, "oidc_issuer"),
            (None, Some(issuer)) => (issuer, default_name),
            (None, None) => {
                return Err("oidc_client_id is set but there is no issuer to sign in with: set \
                            oidc_issuer (or auth.issuer, which it defaults to)"
                    .into());
            }
        };
        let issuer_url = check_issuer(issuer, from)?;

        let scopes = match &self.oidc_scopes {
            Some(scopes) => scopes.clone(),
            None => DEFAULT_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
        };
        check_scopes(&scopes)?;

        if let Some(resource) = &self.oidc_resource {
            let url = Url::parse(resource)
                .map_err(|e| format!("oidc_resource is not an absolute URI: {e}"))?;
            if url.fragment().is_some() {
                return Err("oidc_resource must not have a fragment (RFC 8707)".into());
            }
        }

        let mut connect_origins = vec![origin_of(&issuer_url)];
        for raw in &self.oidc_connect_origins {
            let origin = check_origin(raw)?;
            if !connect_origins.contains(&origin) {
                connect_origins.push(origin);
            }
        }

        Ok(Some(OidcSignIn {
            issuer: issuer.to_owned(),
            client_id: client_id.clone(),
            scopes,
            token: self.oidc_token.unwrap_or_default(),
            resource: self.oidc_resource.clone(),
            connect_origins,
        }))
    }
}

/// An issuer identifier: an https URL (plain http on a loopback host only)
/// without a query or fragment (OpenID Connect Discovery §2).
fn check_issuer(raw: &str, name: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| format!("{name} is not a valid URL: {e}"))?;
    check_scheme(&url, name)?;
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

/// https, or http on a loopback host: the page must not learn where to
/// send the operator, or receive tokens, over a connection anyone on the
/// path could change.
fn check_scheme(url: &Url, name: &str) -> Result<(), String> {
    match url.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(url) => Ok(()),
        "http" => {
            Err(format!("{name} must use https (plain http is accepted only for a loopback host)"))
        }
        other => Err(format!("{name} must be an https URL, not {other}:")),
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

/// Scope tokens as RFC 6749 §3.3 defines them, `openid` among them.
fn check_scopes(scopes: &[String]) -> Result<(), String> {
    for scope in scopes {
        if scope.is_empty() {
            return Err("oidc_scopes must not contain an empty scope".into());
        }
        if scope.chars().any(char::is_whitespace) {
            return Err(format!(
                "oidc_scopes: {scope:?} contains a space: list each scope on its own (in the \
                 environment, separated by commas)"
            ));
        }
        if let Some(bad) = scope.chars().find(|c| !matches!(c, '!' | '#'..='[' | ']'..='~')) {
            return Err(format!("oidc_scopes: {scope:?} contains {bad:?}, not allowed in a scope"));
        }
    }
    if !scopes.iter().any(|s| s == "openid") {
        return Err(
            "oidc_scopes must include openid: the console signs in with OpenID Connect".into()
        );
    }
    Ok(())
}

/// An origin (`scheme://host[:port]`), as the policy names it.
fn check_origin(raw: &str) -> Result<String, String> {
    let name = "oidc_connect_origins";
    let url = Url::parse(raw).map_err(|e| format!("{name}: {raw:?} is not a valid URL: {e}"))?;
    check_scheme(&url, name)?;
    if url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
    {
        return Err(format!(
            "{name}: {raw:?} is not an origin: give scheme://host[:port] alone, such as {}",
            origin_of(&url)
        ));
    }
    Ok(origin_of(&url))
}

fn origin_of(url: &Url) -> String {
    url.origin().ascii_serialization()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_client() -> ConsoleConfig {
        ConsoleConfig {
            oidc_client_id: Some("foldgate-console".into()),
            ..ConsoleConfig::default()
        }
    }

    fn issuer(config: ConsoleConfig, issuer: &str) -> ConsoleConfig {
        ConsoleConfig { oidc_issuer: Some(issuer.into()), ..config }
    }

    #[test]
    fn without_a_client_id_the_console_takes_pasted_tokens_only() {
        assert_eq!(ConsoleConfig::default().sign_in(None), Ok(None));
        assert_eq!(ConsoleConfig::default().sign_in(Some("https://idp.example")), Ok(None));
    }

    #[test]
    fn the_issuer_defaults_to_the_tokens_issuer_and_the_scopes_to_openid_and_the_admin_scopes() {
        let sign_in =
            with_client().sign_in(Some("https://idp.example/realms/ops")).unwrap().unwrap();
        assert_eq!(sign_in.issuer, "https://idp.example/realms/ops");
        assert_eq!(sign_in.client_id, "foldgate-console");
        assert_eq!(sign_in.scopes, ["openid", "foldgate:admin", "tenant:admin"]);
        assert_eq!(sign_in.token, OidcToken::AccessToken);
        assert_eq!(sign_in.resource, None);
        assert_eq!(sign_in.connect_origins, ["https://idp.example"]);

        let own = issuer(with_client(), "http://127.0.0.1:4000")
            .sign_in(Some("https://idp.example/"))
            .unwrap()
            .unwrap();
        assert_eq!(own.issuer, "http://127.0.0.1:4000", "oidc_issuer wins over auth.issuer");
        assert_eq!(own.connect_origins, ["http://127.0.0.1:4000"]);
    }

    #[test]
    fn every_setting_is_taken() {
        let config = ConsoleConfig {
            oidc_client_id: Some("0oa1console".into()),
            oidc_issuer: Some("https://accounts.example.com".into()),
            oidc_scopes: Some(vec!["openid".into(), "api://foldgate/tenant:admin".into()]),
            oidc_token: Some(OidcToken::IdToken),
            oidc_resource: Some("https://foldgate.example.com/mcp".into()),
            oidc_connect_origins: vec![
                "https://oauth2.example.com".into(),
                "https://accounts.example.com:443/".into(),
                "https://oauth2.example.com:8443".into(),
            ],
        };
        let sign_in = config.sign_in(None).unwrap().unwrap();
        assert_eq!(sign_in.scopes, ["openid", "api://foldgate/tenant:admin"]);
        assert_eq!(sign_in.token, OidcToken::IdToken);
        assert_eq!(sign_in.resource.as_deref(), Some("https://foldgate.example.com/mcp"));
        assert_eq!(
            sign_in.connect_origins,
            [
                "https://accounts.example.com",
                "https://oauth2.example.com",
                "https://oauth2.example.com:8443"
            ],
            "origins once each, default ports left out"
        );
    }

    #[test]
    fn validation_names_the_wrong_setting() {
        let cases: Vec<(ConsoleConfig, Option<&str>, &str)> = vec![
            (with_client(), Some("no issuer to sign in with: set oidc_issuer"), "no issuer"),
            (
                ConsoleConfig { oidc_client_id: Some(" ".into()), ..ConsoleConfig::default() },
                Some("oidc_client_id must not be empty"),
                "blank client id",
            ),
            (
                ConsoleConfig {
                    oidc_issuer: Some("https://idp.example".into()),
                    ..ConsoleConfig::default()
                },
                Some("oidc_issuer set without oidc_client_id"),
                "issuer without a client",
            ),
            (
                ConsoleConfig {
                    oidc_scopes: Some(vec!["openid".into()]),
                    oidc_token: Some(OidcToken::IdToken),
                    ..ConsoleConfig::default()
                },
                Some("oidc_scopes, oidc_token set without oidc_client_id"),
                "two settings without a client",
            ),
            (
                issuer(with_client(), "http://idp.example"),
                Some("oidc_issuer must use https"),
                "plain http to a remote issuer",
            ),
            (
                issuer(with_client(), "idp.example"),
                Some("oidc_issuer is not a valid URL"),
                "no scheme",
            ),
            (
                issuer(with_client(), "ftp://idp.example"),
                Some("https URL, not ftp:"),
                "another scheme",
            ),
            (
                issuer(with_client(), "https://idp.example/?tenant=1"),
                Some("must not have a query"),
                "a query",
            ),
            (
                issuer(with_client(), "https://user:pw@idp.example/"),
                Some("user information"),
                "credentials in the issuer",
            ),
            (issuer(with_client(), "http://localhost:4000/oidc"), None, "http on localhost"),
            (issuer(with_client(), "http://[::1]:4000"), None, "http on IPv6 loopback"),
            (
                ConsoleConfig {
                    oidc_scopes: Some(vec!["foldgate:admin".into()]),
                    ..issuer(with_client(), "https://idp.example")
                },
                Some("must include openid"),
                "no openid",
            ),
            (
                ConsoleConfig {
                    oidc_scopes: Some(vec!["openid foldgate:admin".into()]),
                    ..issuer(with_client(), "https://idp.example")
                },
                Some("contains a space"),
                "scopes in one string",
            ),
            (
                ConsoleConfig {
                    oidc_scopes: Some(vec!["openid".into(), "a\"b".into()]),
                    ..issuer(with_client(), "https://idp.example")
                },
                Some("not allowed in a scope"),
                "a quote in a scope",
            ),
            (
                ConsoleConfig {
                    oidc_scopes: Some(vec!["openid".into(), String::new()]),
                    ..issuer(with_client(), "https://idp.example")
                },
                Some("empty scope"),
                "an empty scope",
            ),
            (
                ConsoleConfig {
                    oidc_resource: Some("foldgate".into()),
                    ..issuer(with_client(), "https://idp.example")
                },
                Some("oidc_resource is not an absolute URI"),
                "a relative resource",
            ),
            (
                ConsoleConfig {
                    oidc_resource: Some("https://foldgate.example/mcp#x".into()),
                    ..issuer(with_client(), "https://idp.example")
                },
                Some("oidc_resource must not have a fragment"),
                "a resource with a fragment",
            ),
            (
                ConsoleConfig {
                    oidc_connect_origins: vec!["https://oauth2.example.com/token".into()],
                    ..issuer(with_client(), "https://idp.example")
                },
                Some(
                    "is not an origin: give scheme://host[:port] alone, such as https://oauth2.example.com",
                ),
                "a URL for an origin",
            ),
            (
                ConsoleConfig {
                    oidc_connect_origins: vec!["http://oauth2.example.com".into()],
                    ..issuer(with_client(), "https://idp.example")
                },
                Some("oidc_connect_origins must use https"),
                "a plain http origin",
            ),
        ];
        for (config, expected, why) in cases {
            let result = config.sign_in(None);
            match expected {
                None => assert!(matches!(result, Ok(Some(_))), "{why}: {result:?}"),
                Some(needle) => {
                    let message = result.expect_err(why);
                    assert!(message.contains(needle), "{why}: {message:?} lacks {needle:?}");
                }
            }
        }
    }

    #[test]
    fn settings_deserialize_and_unknown_ones_are_refused() {
        let config: ConsoleConfig = serde_json::from_str(
            r#"{"oidc_client_id": "c", "oidc_token": "id_token", "oidc_scopes": ["openid"]}"#,
        )
        .unwrap();
        assert_eq!(config.oidc_token, Some(OidcToken::IdToken));
        assert!(
            serde_json::from_str::<ConsoleConfig>(r#"{"oidc_token": "refresh_token"}"#).is_err()
        );
        assert!(serde_json::from_str::<ConsoleConfig>(r#"{"oidc_clientid": "c"}"#).is_err());
    }
}
