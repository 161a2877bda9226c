//! RFC 9728 protected resource metadata: how an MCP client learns which
//! authorization server grants tokens for this server and which scopes to
//! ask for. The 401 challenge points at it.

use reqwest::Url;
use serde::Serialize;

use super::SCOPES_SUPPORTED;

/// The path RFC 9728 §3 registers for the metadata document.
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The metadata document, served as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProtectedResourceMetadata {
    /// The canonical MCP URL; tokens must carry it as `aud`.
    pub resource: String,
    /// Issuers whose tokens are accepted: every trusted issuer (empty when
    /// none is configured, e.g. with the development HS256 secret).
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
    /// Tokens are accepted only in the `Authorization` header.
    pub bearer_methods_supported: Vec<String>,
}

impl ProtectedResourceMetadata {
    /// `resource` is the canonical MCP URL (e.g. `https://gw.example/mcp`),
    /// `issuers` the trusted token issuers (see
    /// [`AuthConfig::authorization_servers`](super::AuthConfig::authorization_servers)).
    pub fn new(resource: &str, issuers: &[String]) -> Self {
        Self {
            resource: resource.to_owned(),
            authorization_servers: issuers.to_vec(),
            scopes_supported: SCOPES_SUPPORTED.iter().map(|s| (*s).to_owned()).collect(),
            bearer_methods_supported: vec!["header".to_owned()],
        }
    }
}

/// Where the metadata of `resource` is served (RFC 9728 §3.1): the
/// well-known path goes between the host and the resource's path, so
/// `https://gw.example/mcp` has its metadata at
/// `https://gw.example/.well-known/oauth-protected-resource/mcp`.
pub fn resource_metadata_url(resource: &str) -> Result<String, String> {
    let url = Url::parse(resource)
        .map_err(|e| format!("the resource URL {resource:?} is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("the resource URL {resource:?} must be an http(s) URL with a host"));
    }
    if url.fragment().is_some() {
        return Err(format!("the resource URL {resource:?} must not have a fragment"));
    }
    let path = url.path().trim_end_matches('/');
    let mut metadata = format!("{}{WELL_KNOWN}{path}", url.origin().ascii_serialization());
    if let Some(query) = url.query() {
        metadata.push('?');
        metadata.push_str(query);
    }
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls() {
        let cases = [
            (
                "https://gw.example/mcp",
                Ok("https://gw.example/.well-known/oauth-protected-resource/mcp"),
                "path",
            ),
            (
                "https://gw.example",
                Ok("https://gw.example/.well-known/oauth-protected-resource"),
                "no path",
            ),
            (
                "https://gw.example/",
                Ok("https://gw.example/.well-known/oauth-protected-resource"),
                "root",
            ),
            (
                "http://127.0.0.1:8080/mcp",
                Ok("http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"),
                "port kept",
            ),
            (
                "https://gw.example:443/t/a/mcp",
                Ok("https://gw.example/.well-known/oauth-protected-resource/t/a/mcp"),
                "default port dropped",
            ),
            ("https://gw.example/mcp#x", Err(()), "fragment"),
            ("mailto:a@b", Err(()), "not http"),
            ("/mcp", Err(()), "relative"),
        ];
        for (resource, expected, why) in cases {
            let got = resource_metadata_url(resource);
            assert_eq!(got.as_deref().map_err(|_| ()), expected, "{why}");
        }
    }

    #[test]
    fn document_shape() {
        let doc = ProtectedResourceMetadata::new(
            "https://gw.example/mcp",
            &["https://idp.example".to_owned(), "https://login.example/t/v2.0".to_owned()],
        );
        let json = serde_json::to_value(&doc).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "resource": "https://gw.example/mcp",
                "authorization_servers": ["https://idp.example", "https://login.example/t/v2.0"],
                "scopes_supported": ["fold:read", "fold:write", "memory:read", "memory:write"],
                "bearer_methods_supported": ["header"],
            })
        );
        let without_issuer = ProtectedResourceMetadata::new("https://gw.example/mcp", &[]);
        assert!(without_issuer.authorization_servers.is_empty());
    }
}
