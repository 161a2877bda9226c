//! Why a token was refused, why the authenticator could not be built, and why
//! a token could not be minted.

use std::{path::PathBuf, sync::Arc, time::Duration};

use http::StatusCode;

/// Why a request was not authenticated.
///
/// `Display` (and [`reason`](AuthError::reason)) is written for the client:
/// it never contains the token or internal details. The cause of
/// [`Unavailable`](AuthError::Unavailable) is kept as the error's `source`,
/// for the server's logs only.
///
/// [`AuthErrorKind`] is the variant alone; its `VARIANTS` lists every
/// kind, so that the rejection counter can start each at zero.
#[derive(Debug, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(AuthErrorKind), derive(strum::VariantArray))]
pub enum AuthError {
    #[error("authentication required: send `Authorization: Bearer <token>`")]
    MissingToken,
    /// The credentials are not a well-formed JWT; the text says which part.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    #[error("the token signature is invalid")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token was not issued by an accepted issuer")]
    WrongIssuer,
    #[error("the token is not meant for this server (audience mismatch)")]
    WrongAudience,
    /// `alg: none`, an algorithm of another key type than the configured
    /// one, or an algorithm this server does not implement.
    #[error("the token's signing algorithm is not accepted by this server")]
    UnsupportedAlgorithm,
    /// No configured key matches the token's `kid` (or, without a `kid`,
    /// its algorithm), even after refreshing the key set when allowed.
    #[error("the token was signed with an unknown key")]
    UnknownKey,
    /// A required claim is missing or has an invalid value.
    #[error("invalid token claims: {0}")]
    BadClaims(String),
    /// The keys needed to check the token could not be fetched. Not the
    /// client's fault: answer 503 and let it retry.
    #[error("the token signing keys are temporarily unavailable; retry later")]
    Unavailable {
        /// When fetching the keys will next be attempted.
        retry_after: Duration,
        #[source]
        source: Arc<KeySourceError>,
    },
}

impl AuthError {
    /// Text safe to send to the client.
    pub fn reason(&self) -> String {
        self.to_string()
    }

    /// Whether the key source, not the token, is at fault (HTTP 503).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the request carried no bearer token at all. RFC 6750 §3.1:
    /// such a challenge carries no `error` attribute.
    pub fn is_missing_token(&self) -> bool {
        matches!(self, Self::MissingToken)
    }

    pub fn status(&self) -> StatusCode {
        if self.is_unavailable() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::UNAUTHORIZED
        }
    }

    /// A short, stable label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        AuthErrorKind::from(self).as_str()
    }
}

impl AuthErrorKind {
    /// The label of [`AuthError::kind`].
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MissingToken => "missing_token",
            Self::Malformed => "malformed",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongIssuer => "wrong_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::UnsupportedAlgorithm => "unsupported_algorithm",
            Self::UnknownKey => "unknown_key",
            Self::BadClaims => "bad_claims",
            Self::Unavailable => "key_source_unavailable",
        }
    }
}

/// Why the JWKS could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeySourceError {
    #[error("fetching the JWKS failed")]
    Http(#[source] reqwest::Error),
    #[error("the JWKS endpoint answered HTTP {0}")]
    Status(StatusCode),
    #[error("the JWKS document is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the JWKS document is not a JSON key set")]
    Json(#[source] serde_json::Error),
    #[error("the JWKS holds no usable signing key (RSA, P-256, P-384 or Ed25519)")]
    NoUsableKeys,
    #[error("the issuer cannot be used for discovery: {reason}")]
    BadIssuer { reason: String },
    #[error("fetching the discovery document {url} failed")]
    DiscoveryHttp {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the discovery document {url} answered HTTP {status}")]
    DiscoveryStatus { url: String, status: StatusCode },
    #[error("no discovery document: {openid} and {oauth} both answered HTTP 404")]
    DiscoveryNotFound { openid: String, oauth: String },
    #[error("the discovery document {url} is larger than {limit} bytes")]
    DiscoveryTooLarge { url: String, limit: usize },
    #[error("the discovery document {url} is not a JSON object with a string `issuer`")]
    DiscoveryJson {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    /// OpenID Connect Discovery §4.3 and RFC 8414 §3.3: the document's
    /// `issuer` must be identical to the issuer it was fetched for.
    #[error(
        "the discovery document {url} names the issuer {found:?}, not {expected:?}: set issuer \
         to exactly the provider's issuer identifier"
    )]
    IssuerMismatch { url: String, expected: String, found: String },
    #[error("the discovery document {url} names no usable jwks_uri: {reason}")]
    BadJwksUri { url: String, reason: String },
}

/// Why an [`Authenticator`](super::Authenticator) could not be built: a
/// startup error.
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("invalid auth configuration: {0}")]
    Config(foldgate_domain::ConfigError),
    #[error("cannot read public_key_file {}", path.display())]
    ReadKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("public_key_file {} holds no usable public key: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error("cannot build the HTTP client for the JWKS")]
    HttpClient(#[source] reqwest::Error),
}

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("the signing secret must be at least {min} bytes long", min = super::MIN_SECRET_BYTES)]
    WeakSecret,
    #[error("invalid scope {0:?}: scopes are non-empty and made of printable ASCII without spaces")]
    InvalidScope(String),
    #[error("the token lifetime must be between 1 s and 366 days")]
    InvalidTtl,
    #[error("signing the token failed")]
    Sign(#[source] jsonwebtoken::errors::Error),
}
