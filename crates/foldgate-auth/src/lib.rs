//! foldgate's authentication: who is calling `/mcp`.
//!
//! Every request carries a JWT. Its signature is checked against the key
//! source of a trusted issuer (an HS256 secret, a PEM public key, or a JWKS
//! at a configured URL or found through the issuer's discovery document),
//! and the algorithm a token may use is fixed by that key, never chosen by
//! the token. With several trusted issuers, the token's `iss` picks the one
//! whose keys, audience and tenant claim apply. Its claims become an
//! [`Authenticated`]: the [`Principal`] (tenant and subject) that scopes
//! every stored record, and the granted scopes.
//!
//! [`authenticate_request`] is the axum middleware: it verifies the token,
//! puts the [`Authenticated`] into the request extensions, and removes the
//! `Authorization` header so that the client's token never travels further.
//! Failures are answered here, in the shape RFC 6750 and RFC 9728 describe,
//! with a JSON-RPC error body that MCP clients can read.

mod cache;
mod claims;
mod config;
mod discovery;
mod error;
#[cfg(fuzzing)]
pub mod fuzzing;
mod jwks;
mod keys;
mod metadata;
mod middleware;
mod mint;

use std::{collections::BTreeSet, sync::Arc};

use chrono::{DateTime, TimeDelta, Utc};
use foldgate_domain::{Caller, Clock, Principal, Subject, SystemClock, TenantId};

pub use self::keys::{KeySourceCheck, check_key_sources};
use self::{cache::TokenCache, claims::ClaimRules, keys::KeySource};
pub use self::{
    config::{AuthConfig, IssuerConfig, MIN_SECRET_BYTES, Secret},
    error::{AuthError, AuthErrorKind, AuthSetupError, KeySourceError, MintError},
    metadata::{ProtectedResourceMetadata, resource_metadata_url},
    middleware::{
        AuthMode, AuthState, JSONRPC_FORBIDDEN, JSONRPC_UNAUTHORIZED, JSONRPC_UNAVAILABLE,
        auth_error_headers, auth_error_response, authenticate_request, bearer_token,
        insufficient_scope_response,
    },
    mint::mint_hs256,
};

/// Scope for reading folding state (`branch_status`).
pub const SCOPE_READ: &str = "fold:read";
/// Scope for changing folding state (`branch_create`, `branch_return`,
/// `session_end`).
pub const SCOPE_WRITE: &str = "fold:write";
/// Scope for searching the reasoning memory (`memory_search`).
pub const SCOPE_MEMORY_READ: &str = "memory:read";
/// Scope for adding to the reasoning memory (`memory_record`,
/// `memory_feedback`).
pub const SCOPE_MEMORY_WRITE: &str = "memory:write";
/// Every scope this server knows, as published in its metadata.
pub const SCOPES_SUPPORTED: [&str; 4] =
    [SCOPE_READ, SCOPE_WRITE, SCOPE_MEMORY_READ, SCOPE_MEMORY_WRITE];

/// Scope for operating the whole deployment through the admin API.
pub const SCOPE_ADMIN: &str = "foldgate:admin";
/// Scope for operating the token's own tenant through the admin API.
pub const SCOPE_TENANT_ADMIN: &str = "tenant:admin";

/// Every scope, the admin API's too: what the zero-configuration
/// development token and `--auth none` grant.
pub const EVERY_SCOPE: [&str; 6] = [
    SCOPE_READ,
    SCOPE_WRITE,
    SCOPE_MEMORY_READ,
    SCOPE_MEMORY_WRITE,
    SCOPE_ADMIN,
    SCOPE_TENANT_ADMIN,
];

/// A verified caller, as the middleware leaves it in the request extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    pub principal: Principal,
    /// Scopes granted by the token (`scope` and `scp`).
    pub scopes: BTreeSet<String>,
    /// The token's `exp`; `None` for unauthenticated local mode.
    pub expires_at: Option<DateTime<Utc>>,
}

impl Authenticated {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }

    /// The fixed caller of `--auth none` (loopback only): tenant `local`,
    /// subject `anonymous`, every scope.
    pub fn local() -> Self {
        #[expect(clippy::expect_used, reason = "constant identifiers that are valid")]
        let principal = Principal::new(
            TenantId::parse("local").expect("`local` is a valid tenant id"),
            Subject::parse("anonymous").expect("`anonymous` is a valid subject"),
        );
        Self {
            principal,
            scopes: EVERY_SCOPE.iter().map(|s| (*s).to_owned()).collect(),
            expires_at: None,
        }
    }
}

/// Verifies bearer tokens. Cheap to clone; clones share the key cache.
#[derive(Debug, Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The trusted issuers, in the configured order: exactly one in the
    /// single-issuer form.
    issuers: Vec<Trusted>,
    /// Whether a token is matched to its issuer by its `iss` claim
    /// (`[[auth.issuers]]`); otherwise the one issuer takes every token.
    by_iss: bool,
    clock: Arc<dyn Clock>,
    /// Verified tokens by their hash. A token's `iss` is part of what is
    /// hashed, so an entry belongs to the issuer that verified it.
    verified: TokenCache,
}

/// One trusted issuer: its keys and what its tokens' claims must say.
#[derive(Debug)]
struct Trusted {
    /// The required `iss`; `None` in the single-issuer form without one.
    issuer: Option<String>,
    source: KeySource,
    rules: ClaimRules,
}

impl Authenticator {
    /// Builds the authenticator of a configuration, on the system clock.
    pub async fn new(config: &AuthConfig) -> Result<Self, AuthSetupError> {
        Self::with_clock(config, Arc::new(SystemClock)).await
    }

    /// Builds the authenticator with an injected clock, which decides token
    /// expiry and the JWKS refresh interval.
    ///
    /// The key sets (at a JWKS URL or found through discovery) are fetched
    /// once, all at the same time, each request waiting at most
    /// `jwks_timeout`; a failure is logged and the fetch retried
    /// when a token needs it. A PEM file that cannot be read or parsed is an
    /// error.
    pub async fn with_clock(
        config: &AuthConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthSetupError> {
        config.validate().map_err(AuthSetupError::Config)?;
        let leeway = TimeDelta::from_std(config.leeway).unwrap_or_default();
        let mut issuers = Vec::new();
        for trusted in config.trusted() {
            issuers.push(Trusted {
                issuer: trusted.issuer.map(str::to_owned),
                source: KeySource::new(&trusted, config, Arc::clone(&clock)).await?,
                rules: ClaimRules {
                    issuer: trusted.issuer.map(str::to_owned),
                    audience: trusted.audience.map(str::to_owned),
                    tenant_claim: trusted.tenant_claim.to_owned(),
                    leeway,
                },
            });
        }
        if issuers.is_empty() {
            return Err(AuthSetupError::Config("no JWT key source configured".into()));
        }
        futures::future::join_all(issuers.iter().map(|t| t.source.warm_up())).await;
        let verified = TokenCache::new(
            config.token_cache_entries,
            TimeDelta::from_std(config.token_cache_ttl).unwrap_or_default(),
        );
        let by_iss = !config.issuers.is_empty();
        Ok(Self { inner: Arc::new(Inner { issuers, by_iss, clock, verified }) })
    }

    /// Registers the background work of the key sources on the driver: the
    /// refresh of each stale key set, `jwks_refresh` (one per issuer with
    /// several, `jwks_refresh:<issuer>`). Other sources have none.
    pub fn register(&self, driver: &mut foldgate_background::Driver) {
        for trusted in &self.inner.issuers {
            let name = match (&trusted.issuer, self.inner.by_iss) {
                (Some(issuer), true) => format!("jwks_refresh:{issuer}"),
                _ => "jwks_refresh".to_owned(),
            };
            trusted.source.register(driver, name);
        }
    }

    /// Verifies a bearer token (without the `Bearer ` prefix). A token
    /// verified recently is taken from the cache (see
    /// [`AuthConfig::token_cache_entries`]); only verified tokens are kept.
    ///
    /// With several issuers, the token's unverified `iss` picks the issuer
    /// whose keys and rules apply; a token naming no trusted issuer is
    /// refused before any key is looked up, so it cannot make the gateway
    /// fetch anything.
    pub async fn authenticate(&self, token: &str) -> Result<Authenticated, AuthError> {
        let now = self.inner.clock.now();
        let hash = cache::hash(token);
        if let Some(caller) = self.inner.verified.get(&hash, now) {
            return Ok(caller);
        }
        let header = claims::parse_header(token)?;
        let trusted = self.issuer_of(token)?;
        let keys = trusted.source.keys_for(header.alg, header.kid.as_deref()).await?;
        let payload = claims::verify_signature(token, header.alg, &keys)?;
        let caller = trusted.rules.check(payload, now)?;
        self.inner.verified.put(hash, &caller, now);
        Ok(caller)
    }

    /// The trusted issuer whose keys and rules apply to a token.
    fn issuer_of(&self, token: &str) -> Result<&Trusted, AuthError> {
        if !self.inner.by_iss {
            return self.inner.issuers.first().ok_or(AuthError::WrongIssuer);
        }
        let iss = claims::unverified_issuer(token)?.ok_or(AuthError::WrongIssuer)?;
        self.inner
            .issuers
            .iter()
            .find(|t| t.issuer.as_deref() == Some(iss.as_str()))
            .ok_or(AuthError::WrongIssuer)
    }
}

impl Caller for Authenticated {
    fn tenant(&self) -> &TenantId {
        &self.principal.tenant
    }

    fn has_scope(&self, scope: &str) -> bool {
        Authenticated::has_scope(self, scope)
    }
}
