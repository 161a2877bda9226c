//! The HTTP side of authentication: the axum middleware, and the 401, 403
//! and 503 answers (RFC 6750 §3, RFC 9728 §5.1) with JSON-RPC error bodies.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http::{
    HeaderMap, HeaderValue, StatusCode,
    header::{AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE},
};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, MeterProvider as _, noop::NoopMeterProvider},
};
use serde_json::json;

use super::{AuthError, AuthErrorKind, Authenticated, Authenticator};

/// JSON-RPC error code of a 401 answer.
pub const JSONRPC_UNAUTHORIZED: i64 = -32001;
/// JSON-RPC error code of a 403 (missing scope) answer.
pub const JSONRPC_FORBIDDEN: i64 = -32003;
/// JSON-RPC error code of a 503 answer (token keys unavailable).
pub const JSONRPC_UNAVAILABLE: i64 = -32004;

/// How requests are authenticated.
#[derive(Debug, Clone)]
pub enum AuthMode {
    /// Verify the bearer token of every request.
    Jwt(Authenticator),
    /// `--auth none`: every request acts as [`Authenticated::local`]. The
    /// server allows this only when it listens on loopback.
    None,
}

/// What [`authenticate_request`] needs: the mode, and where clients find
/// the protected resource metadata.
#[derive(Debug, Clone)]
pub struct AuthState {
    mode: AuthMode,
    resource_metadata_url: Arc<str>,
    /// Refusals, by [`AuthError::kind`].
    rejections: Counter<u64>,
}

impl AuthState {
    /// `resource_metadata_url` is the absolute URL of this server's RFC 9728
    /// document (see [`resource_metadata_url`](super::resource_metadata_url)).
    pub fn new(mode: AuthMode, resource_metadata_url: impl Into<String>) -> Self {
        Self {
            mode,
            resource_metadata_url: resource_metadata_url.into().into(),
            rejections: NoopMeterProvider::new()
                .meter("foldgate")
                .u64_counter("foldgate.auth.rejections")
                .build(),
        }
    }

    /// Counts refused requests in `rejections` (`reason` attribute), whose
    /// series start at zero for every reason.
    pub fn with_rejections(mut self, rejections: Counter<u64>) -> Self {
        for kind in <AuthErrorKind as strum::VariantArray>::VARIANTS {
            rejections.add(0, &[rejection_reason(kind.as_str())]);
        }
        self.rejections = rejections;
        self
    }

    pub fn mode(&self) -> &AuthMode {
        &self.mode
    }

    pub fn resource_metadata_url(&self) -> &str {
        &self.resource_metadata_url
    }
}

/// Authenticates the request; on success puts an [`Authenticated`] into its
/// extensions and passes it on, always without its `Authorization` header.
///
/// Use with `axum::middleware::from_fn_with_state(state, authenticate_request)`.
pub async fn authenticate_request(
    State(state): State<AuthState>,
    mut request: Request,
    next: Next,
) -> Response {
    match state.authenticate(request.headers_mut()).await {
        Ok(authenticated) => {
            request.extensions_mut().insert(authenticated);
            next.run(request).await
        }
        Err(error) => auth_error_response(&error, &state.resource_metadata_url),
    }
}

impl AuthState {
    /// Authenticates the bearer token in `headers` and removes it from
    /// them, whatever the outcome: the client's credentials go no further.
    /// A refusal is counted and logged at debug level (a key-source failure
    /// was logged where it happened).
    pub async fn authenticate(&self, headers: &mut HeaderMap) -> Result<Authenticated, AuthError> {
        let token = bearer_token(headers);
        headers.remove(AUTHORIZATION);
        let outcome = match (&self.mode, token) {
            (AuthMode::None, _) => Ok(Authenticated::local()),
            (AuthMode::Jwt(authenticator), Ok(token)) => authenticator.authenticate(&token).await,
            (AuthMode::Jwt(_), Err(e)) => Err(e),
        };
        if let Err(error) = &outcome {
            tracing::debug!(reason = error.kind(), "request not authenticated");
            self.rejections.add(1, &[rejection_reason(error.kind())]);
        }
        outcome
    }
}

/// The attribute of a counted rejection.
fn rejection_reason(kind: &'static str) -> KeyValue {
    KeyValue::new("reason", kind)
}

/// The bearer token of a request (RFC 6750 §2.1; the scheme is
/// case-insensitive). Another scheme counts as no token.
pub fn bearer_token(headers: &HeaderMap) -> Result<String, AuthError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else { return Err(AuthError::MissingToken) };
    if values.next().is_some() {
        return Err(AuthError::Malformed("more than one Authorization header"));
    }
    let value = value
        .to_str()
        .map_err(|_| AuthError::Malformed("the Authorization header is not ASCII"))?
        .trim();
    let (scheme, token) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::MissingToken);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(AuthError::Malformed("the bearer token is empty"));
    }
    if token.contains(char::is_whitespace) {
        return Err(AuthError::Malformed("the bearer token contains spaces"));
    }
    Ok(token.to_owned())
}

/// The answer to a failed authentication: 401 with a `WWW-Authenticate`
/// challenge pointing at the metadata (plus `error="invalid_token"` when a
/// token was sent), or 503 with `Retry-After` when the keys are unavailable.
pub fn auth_error_response(error: &AuthError, resource_metadata_url: &str) -> Response {
    let code = if error.is_unavailable() { JSONRPC_UNAVAILABLE } else { JSONRPC_UNAUTHORIZED };
    let mut response = jsonrpc_error(error.status(), code, &error.reason());
    response.headers_mut().extend(auth_error_headers(error, resource_metadata_url));
    response
}

/// The headers of the answer to a failed authentication, whatever its body:
/// `Retry-After` when the keys are unavailable (503), else the 401's
/// `WWW-Authenticate` challenge.
pub fn auth_error_headers(error: &AuthError, resource_metadata_url: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let AuthError::Unavailable { retry_after, .. } = error {
        let seconds = (retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1);
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        return headers;
    }
    let mut challenge = format!("Bearer resource_metadata=\"{}\"", quotable(resource_metadata_url));
    if !error.is_missing_token() {
        challenge.push_str(&format!(
            ", error=\"invalid_token\", error_description=\"{}\"",
            quotable(&error.reason())
        ));
    }
    insert_challenge(&mut headers, &challenge);
    headers
}

/// The answer to a valid token that lacks the scope a call needs: 403 with
/// `WWW-Authenticate: Bearer error="insufficient_scope", scope="…"`, so that
/// the client can ask its authorization server for more.
pub fn insufficient_scope_response(required_scope: &str, resource_metadata_url: &str) -> Response {
    let challenge = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{}\"",
        quotable(required_scope),
        quotable(resource_metadata_url)
    );
    let message = format!("this call needs the `{required_scope}` scope");
    let mut response = jsonrpc_error(StatusCode::FORBIDDEN, JSONRPC_FORBIDDEN, &message);
    insert_challenge(response.headers_mut(), &challenge);
    response
}

fn jsonrpc_error(status: StatusCode, code: i64, message: &str) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message },
    });
    (status, Json(body)).into_response()
}

fn insert_challenge(headers: &mut HeaderMap, challenge: &str) {
    // `quotable` leaves only visible ASCII and spaces, which always form a
    // valid header value.
    if let Ok(value) = HeaderValue::from_str(challenge) {
        headers.insert(WWW_AUTHENTICATE, value);
    }
}

/// Keeps the characters RFC 6750 §3 allows inside a quoted attribute
/// (`%x20-21 / %x23-5B / %x5D-7E`): no quotes, backslashes or controls, so
/// no value can break out of its quotes.
fn quotable(text: &str) -> String {
    text.chars().filter(|c| matches!(c, ' '..='~') && *c != '"' && *c != '\\').collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(AUTHORIZATION, HeaderValue::from_str(v).expect("header value"));
        }
        map
    }

    #[test]
    fn bearer_tokens() {
        let cases: Vec<(Vec<&str>, Result<&str, &str>, &str)> = vec![
            (vec!["Bearer abc.def.ghi"], Ok("abc.def.ghi"), "canonical"),
            (vec!["bearer abc"], Ok("abc"), "lower-case scheme"),
            (vec!["BEARER   abc  "], Ok("abc"), "upper-case scheme, extra spaces"),
            (vec![], Err("missing_token"), "no header"),
            (vec!["Basic dXNlcjpwYXNz"], Err("missing_token"), "other scheme"),
            (vec!["Bearer"], Err("malformed"), "scheme only"),
            (vec!["Bearer "], Err("malformed"), "empty token"),
            (vec!["Bearer a b"], Err("malformed"), "space inside"),
            (vec!["Bearer a", "Bearer b"], Err("malformed"), "two headers"),
        ];
        for (values, expected, why) in cases {
            let got = bearer_token(&headers(&values));
            assert_eq!(got.as_deref().map_err(AuthError::kind), expected, "{why}");
        }
    }

    #[test]
    fn quoted_values_cannot_break_out() {
        assert_eq!(quotable(r#"a"b\c"#), "abc");
        assert_eq!(quotable("tab\there\u{7f}é"), "tabhere");
        assert_eq!(
            quotable("https://gw.example/.well-known/x?y=1"),
            "https://gw.example/.well-known/x?y=1"
        );
    }
}
