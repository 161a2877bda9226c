//! The admin API's one error type and its JSON answer:
//! `{"error": {"code": "...", "message": "..."}}` with the matching status.

use axum::{
    Json,
    response::{IntoResponse, Response},
};
use foldgate_auth::{AuthError, SCOPE_ADMIN, SCOPE_TENANT_ADMIN};
use foldgate_engine::FoldError;
use foldgate_store::StoreError;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Serialize;
use utoipa::ToSchema;

/// Why an admin request was refused or failed.
#[derive(Debug)]
pub enum AdminError {
    /// No valid token (401), or the token keys are unavailable (503), with
    /// the headers of the answer (boxed: errors are rare, results common).
    Unauthenticated(Box<(AuthError, HeaderMap)>),
    /// A valid token without an admin scope.
    Forbidden,
    /// A path or query value that does not parse, with what is wrong.
    BadRequest(String),
    /// Not there, or another tenant's (which looks the same).
    NotFound(&'static str),
    /// The resource is not in a state the request applies to.
    Conflict { code: &'static str, message: String },
    /// The database is unavailable: try again.
    Unavailable,
    /// Anything else; logged once here, never shown.
    Internal(String),
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, for programs: `unauthorized`, `forbidden`, `invalid_request`,
    /// `not_found`, `branch_not_active`, `session_not_open`,
    /// `unavailable`, `internal`, `rate_limited`.
    pub code: String,
    /// For people.
    pub message: String,
}

impl AdminError {
    fn parts(&self) -> (StatusCode, &str, String) {
        match self {
            Self::Unauthenticated(refusal) => {
                let error = &refusal.0;
                let code = if error.is_unavailable() { "unavailable" } else { "unauthorized" };
                (error.status(), code, error.reason())
            }
            Self::Forbidden => (
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("this call needs the `{SCOPE_ADMIN}` or the `{SCOPE_TENANT_ADMIN}` scope"),
            ),
            Self::BadRequest(message) => {
                (StatusCode::BAD_REQUEST, "invalid_request", message.clone())
            }
            Self::NotFound(what) => (StatusCode::NOT_FOUND, "not_found", format!("no such {what}")),
            Self::Conflict { code, message } => (StatusCode::CONFLICT, code, message.clone()),
            Self::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the database is unavailable; try again shortly".to_owned(),
            ),
            Self::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error".to_owned())
            }
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        if let Self::Internal(detail) = &self {
            tracing::error!(error = %detail, "admin request failed");
        }
        let (status, code, message) = self.parts();
        let body = ErrorBody { error: ErrorDetail { code: code.to_owned(), message } };
        let mut response = (status, Json(body)).into_response();
        match self {
            Self::Unauthenticated(refusal) => response.headers_mut().extend(refusal.1),
            Self::Unavailable => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Forbidden => {
                let challenge = format!(
                    "Bearer error=\"insufficient_scope\", scope=\"{SCOPE_ADMIN} {SCOPE_TENANT_ADMIN}\""
                );
                if let Ok(value) = HeaderValue::from_str(&challenge) {
                    response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
                }
            }
            _ => {}
        }
        response
    }
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        if e.is_unavailable() { Self::Unavailable } else { Self::Internal(e.to_string()) }
    }
}

impl From<FoldError> for AdminError {
    fn from(e: FoldError) -> Self {
        match e {
            FoldError::Store(e) => e.into(),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// The 429 of the per-principal request limit, in the admin API's shape.
pub fn too_many_requests(retry_after_secs: u64) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: "rate_limited".to_owned(),
            message: format!("too many requests; retry after {retry_after_secs} s"),
        },
    };
    let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    response
}
