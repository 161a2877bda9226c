//! Finding an issuer's key set from its discovery document: OpenID Connect
//! Discovery 1.0 (`<issuer>/.well-known/openid-configuration`), else RFC 8414
//! authorization server metadata (`/.well-known/oauth-authorization-server`
//! inserted before the issuer's path), when the first answers 404.
//!
//! Both specifications require the document's `issuer` to be identical to
//! the issuer it was fetched for; a document that names another is refused,
//! since its keys would belong to someone else. Its `jwks_uri` must satisfy
//! the same https rule as a configured `jwks_url`.

use http::StatusCode;
use reqwest::Url;
use serde::Deserialize;

use super::{
    KeySourceError,
    config::{check_issuer_url, check_key_url},
    jwks::{Fetch, get_limited},
};

/// Largest discovery document read; real ones are a few kilobytes.
const MAX_DISCOVERY_BYTES: usize = 256 * 1024;

/// The two places a discovery document may be, in the order they are tried:
/// OpenID Connect's (the issuer, without a trailing `/`, followed by the
/// well-known path) and RFC 8414's (the well-known path between the host and
/// the issuer's path).
pub(crate) fn discovery_urls(issuer: &str) -> Result<[String; 2], String> {
    // Checked when the configuration was; again here, as it makes the URLs.
    let url: Url = check_issuer_url(issuer, true, "issuer")?;
    let openid = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
    let path = url.path().trim_end_matches('/');
    let oauth = format!(
        "{}/.well-known/oauth-authorization-server{path}",
        url.origin().ascii_serialization()
    );
    Ok([openid, oauth])
}

/// Reads the issuer's discovery document and returns its `jwks_uri`, once
/// the document is known to be the issuer's.
pub(crate) async fn discover(
    client: &reqwest::Client,
    issuer: &str,
    allow_http: bool,
) -> Result<String, KeySourceError> {
    let [openid, oauth] =
        discovery_urls(issuer).map_err(|reason| KeySourceError::BadIssuer { reason })?;
    let (url, body) = match get_limited(client, &openid, MAX_DISCOVERY_BYTES).await {
        Ok(body) => (openid, body),
        Err(Fetch::Status(StatusCode::NOT_FOUND)) => {
            match get_limited(client, &oauth, MAX_DISCOVERY_BYTES).await {
                Ok(body) => (oauth, body),
                Err(Fetch::Status(StatusCode::NOT_FOUND)) => {
                    return Err(KeySourceError::DiscoveryNotFound { openid, oauth });
                }
                Err(e) => return Err(fetch_error(oauth, e)),
            }
        }
        Err(e) => return Err(fetch_error(openid, e)),
    };
    jwks_uri_of(&url, &body, issuer, allow_http)
}

fn fetch_error(url: String, error: Fetch) -> KeySourceError {
    match error {
        Fetch::Http(source) => KeySourceError::DiscoveryHttp { url, source },
        Fetch::Status(status) => KeySourceError::DiscoveryStatus { url, status },
        Fetch::TooLarge => KeySourceError::DiscoveryTooLarge { url, limit: MAX_DISCOVERY_BYTES },
    }
}

/// The members of a discovery document that matter here; the others are
/// ignored.
#[derive(Deserialize)]
struct Metadata {
    issuer: String,
    jwks_uri: Option<String>,
}

/// Checks a discovery document fetched from `url` for `issuer` and returns
/// its `jwks_uri`.
fn jwks_uri_of(
    url: &str,
    body: &[u8],
    issuer: &str,
    allow_http: bool,
) -> Result<String, KeySourceError> {
    let document: Metadata = serde_json::from_slice(body)
        .map_err(|source| KeySourceError::DiscoveryJson { url: url.to_owned(), source })?;
    if document.issuer != issuer {
        return Err(KeySourceError::IssuerMismatch {
            url: url.to_owned(),
            expected: issuer.to_owned(),
            found: document.issuer,
        });
    }
    let bad = |reason: String| KeySourceError::BadJwksUri { url: url.to_owned(), reason };
    let jwks_uri = document.jwks_uri.ok_or_else(|| bad("the document has none".to_owned()))?;
    check_key_url(&jwks_uri, allow_http, "jwks_uri").map_err(bad)?;
    Ok(jwks_uri)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn where_the_documents_are() {
        let cases = [
            (
                "https://idp.example",
                "https://idp.example/.well-known/openid-configuration",
                "https://idp.example/.well-known/oauth-authorization-server",
                "no path",
            ),
            (
                "https://idp.example/",
                "https://idp.example/.well-known/openid-configuration",
                "https://idp.example/.well-known/oauth-authorization-server",
                "trailing slash",
            ),
            (
                "https://idp.example/realms/agents",
                "https://idp.example/realms/agents/.well-known/openid-configuration",
                "https://idp.example/.well-known/oauth-authorization-server/realms/agents",
                "path",
            ),
            (
                "https://login.example.com/tenant-id/v2.0/",
                "https://login.example.com/tenant-id/v2.0/.well-known/openid-configuration",
                "https://login.example.com/.well-known/oauth-authorization-server/tenant-id/v2.0",
                "path with a trailing slash",
            ),
            (
                "http://127.0.0.1:8080",
                "http://127.0.0.1:8080/.well-known/openid-configuration",
                "http://127.0.0.1:8080/.well-known/oauth-authorization-server",
                "loopback with a port",
            ),
        ];
        for (issuer, openid, oauth, why) in cases {
            assert_eq!(discovery_urls(issuer), Ok([openid.to_owned(), oauth.to_owned()]), "{why}");
        }
        assert!(discovery_urls("https://idp.example/?tenant=a").is_err(), "query");
        assert!(discovery_urls("not a url").is_err(), "garbage");
    }

    #[test]
    fn the_document_must_be_the_issuers() {
        const URL: &str = "https://idp.example/.well-known/openid-configuration";
        let issuer = "https://idp.example";
        let doc = |value: serde_json::Value| value.to_string().into_bytes();
        /// The document, `jwks_allow_http`, the `jwks_uri` or a part of
        /// the error, and why.
        type Case<'a> = (Vec<u8>, bool, Result<&'a str, &'a str>, &'a str);
        let cases: Vec<Case<'_>> = vec![
            (
                doc(json!({"issuer": issuer, "jwks_uri": "https://idp.example/certs"})),
                false,
                Ok("https://idp.example/certs"),
                "the issuer's own",
            ),
            (
                doc(json!({"issuer": "https://idp.example/", "jwks_uri": "https://idp.example/c"})),
                false,
                Err("names the issuer \"https://idp.example/\", not \"https://idp.example\""),
                "a trailing slash is another issuer",
            ),
            (
                doc(
                    json!({"issuer": "https://evil.example", "jwks_uri": "https://evil.example/c"}),
                ),
                false,
                Err("names the issuer \"https://evil.example\""),
                "another issuer",
            ),
            (doc(json!({"issuer": issuer})), false, Err("has none"), "no jwks_uri"),
            (
                doc(json!({"issuer": issuer, "jwks_uri": "http://idp.example/certs"})),
                false,
                Err("jwks_uri must use https"),
                "plain http on a remote host",
            ),
            (
                doc(json!({"issuer": issuer, "jwks_uri": "http://idp.example/certs"})),
                true,
                Ok("http://idp.example/certs"),
                "plain http allowed",
            ),
            (
                doc(json!({"issuer": issuer, "jwks_uri": "http://127.0.0.1:9/certs"})),
                false,
                Ok("http://127.0.0.1:9/certs"),
                "plain http on loopback",
            ),
            (
                doc(json!({"jwks_uri": "https://idp.example/c"})),
                false,
                Err("not a JSON"),
                "no issuer",
            ),
            (b"<html>".to_vec(), false, Err("not a JSON"), "not JSON"),
        ];
        for (body, allow_http, expected, why) in cases {
            let got = jwks_uri_of(URL, &body, issuer, allow_http);
            match expected {
                Ok(uri) => assert_eq!(got.ok().as_deref(), Some(uri), "{why}"),
                Err(needle) => {
                    let message = got.expect_err(why).to_string();
                    assert!(message.contains(needle), "{why}: {message:?} lacks {needle:?}");
                }
            }
        }
    }
}
