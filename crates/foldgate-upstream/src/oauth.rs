//! Access tokens for upstreams, fetched with the OAuth 2.0
//! client-credentials grant and cached until shortly before they expire.

use std::time::Duration;

use serde::Deserialize;
use tokio::{sync::Mutex, time::Instant};

use super::client::CallError;

/// A token is renewed this long before it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(30);
/// Lifetime assumed when the token response gives none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// The resolved grant (environment references expanded).
#[derive(Clone)]
pub(crate) struct Grant {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: String,
    pub scope: Option<String>,
    pub resource: Option<String>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant").field("token_url", &self.token_url).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Cached {
    bearer: String,
    renew_at: Instant,
}

/// One upstream's token source.
#[derive(Debug)]
pub(crate) struct TokenSource {
    grant: Grant,
    // Held while fetching, so that concurrent calls wait for one fetch.
    cached: Mutex<Option<Cached>>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl TokenSource {
    pub fn new(grant: Grant) -> Self {
        Self { grant, cached: Mutex::new(None) }
    }

    /// A current access token, fetching one if needed.
    pub async fn bearer(
        &self,
        http: &reqwest::Client,
        timeout: Duration,
    ) -> Result<String, CallError> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref().filter(|c| Instant::now() < c.renew_at) {
            return Ok(c.bearer.clone());
        }
        let fresh = self.fetch(http, timeout).await?;
        let bearer = fresh.bearer.clone();
        *cached = Some(fresh);
        Ok(bearer)
    }

    /// Forgets the cached token (the upstream refused it).
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }

    async fn fetch(&self, http: &reqwest::Client, timeout: Duration) -> Result<Cached, CallError> {
        let g = &self.grant;
        let mut form = vec![("grant_type", "client_credentials")];
        if let Some(scope) = &g.scope {
            form.push(("scope", scope));
        }
        if let Some(resource) = &g.resource {
            form.push(("resource", resource));
        }
        let body = serde_urlencoded_form(&form);
        let request = http
            .post(&g.token_url)
            // RFC 6749 §2.3.1: the credentials are form-encoded first.
            .basic_auth(form_encode(&g.client_id), Some(form_encode(&g.client_secret)))
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .timeout(timeout);
        let unavailable = |why: String| CallError::Unavailable(format!("token endpoint: {why}"));
        let response =
            request.send().await.map_err(|e| unavailable(e.without_url().to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(unavailable(format!("HTTP {status}")));
        }
        let bytes = response.bytes().await.map_err(|e| unavailable(e.without_url().to_string()))?;
        let token: TokenResponse = serde_json::from_slice(&bytes)
            .map_err(|e| unavailable(format!("unreadable token response: {e}")))?;
        if token.token_type.as_deref().is_some_and(|t| !t.eq_ignore_ascii_case("bearer")) {
            return Err(unavailable("the token is not a bearer token".into()));
        }
        let lifetime = token.expires_in.map_or(DEFAULT_LIFETIME, Duration::from_secs);
        let renew_at = Instant::now() + lifetime.saturating_sub(RENEW_BEFORE).max(lifetime / 2);
        Ok(Cached { bearer: format!("Bearer {}", token.access_token), renew_at })
    }
}

/// `application/x-www-form-urlencoded` encoding.
fn serde_urlencoded_form(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(&form_encode(k));
        out.push('=');
        out.push_str(&form_encode(v));
    }
    out
}

fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        assert_eq!(
            serde_urlencoded_form(&[("grant_type", "client_credentials"), ("scope", "a b/c")]),
            "grant_type=client_credentials&scope=a+b%2Fc"
        );
    }
}
