//! The per-principal request rate limit (tower-governor, keyed by tenant
//! and subject), answering 429 with `Retry-After` and a JSON-RPC error.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{HeaderValue, Request, Response, StatusCode, header},
};
use foldgate_background::{Activation, BackgroundTask, BoxFuture, Driver, StopOrder, TaskDef};
use opentelemetry::{KeyValue, metrics::Counter};
use serde::Deserialize;
use serde_json::json;
use tower_governor::{
    GovernorError, GovernorLayer, governor::GovernorConfigBuilder, key_extractor::KeyExtractor,
};

use crate::{
    auth::Authenticated,
    error::{RATE_LIMITED, jsonrpc_error},
};

/// How many requests one principal may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests per second per principal (tenant and subject).
    pub per_second: u32,
    /// Requests a principal may make at once before the rate applies.
    pub burst: u32,
    /// How many replicas share the limit: each enforces `per_second /
    /// replicas` and `burst / replicas`, rounded up.
    pub replicas: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self { per_second: 50, burst: 100, replicas: 1 }
    }
}

impl RateLimitConfig {
    /// This replica's share of the rate and the burst: the whole divided
    /// by the replicas, rounded up.
    pub fn share(&self) -> (u32, u32) {
        let replicas = self.replicas.max(1);
        (self.per_second.div_ceil(replicas), self.burst.div_ceil(replicas))
    }

    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        if self.per_second == 0 || self.burst == 0 || self.replicas == 0 {
            return Err(
                "rate_limit.per_second, rate_limit.burst and rate_limit.replicas must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Keys requests by the authenticated principal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrincipalKey;

impl KeyExtractor for PrincipalKey {
    type Key = (String, String);

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, GovernorError> {
        req.extensions()
            .get::<Authenticated>()
            .map(|a| (a.principal.tenant.to_string(), a.principal.subject.to_string()))
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// How often the limiter forgets idle principals.
const CLEANUP_INTERVAL: Duration = Duration::from_secs(60);

/// Forgets idle principals, so that the limiter's memory stays bounded by
/// the active ones; returns how many it still tracks.
struct Cleanup<F>(F);

impl<F: FnMut() -> usize + Send + 'static> BackgroundTask for Cleanup<F> {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        let principals = (self.0)();
        Box::pin(async move { Activation::ok(json!({"principals": principals})) })
    }
}

/// The limit's layer: one limiter, whose budgets every route it wraps
/// shares.
pub(crate) type Limit = GovernorLayer<
    PrincipalKey,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
    Body,
>;

/// The layer, and its cleanup (`rate_limit_cleanup`, registered on
/// `driver`). Refusals are counted in `rejections` and answered as
/// JSON-RPC errors.
pub(crate) fn layer(
    config: RateLimitConfig,
    driver: &mut Driver,
    rejections: Counter<u64>,
) -> Result<Limit, String> {
    let (per_second, burst) = config.share();
    let period = Duration::from_secs(1) / per_second;
    let governor = GovernorConfigBuilder::default()
        .period(period.max(Duration::from_nanos(1)))
        .burst_size(burst)
        .key_extractor(PrincipalKey)
        .finish()
        .ok_or_else(|| "invalid rate limit".to_owned())?;
    let governor = Arc::new(governor);
    let limiter = Arc::clone(governor.limiter());
    let cleanup = TaskDef::new("rate_limit_cleanup", StopOrder::SERVING).period(CLEANUP_INTERVAL);
    driver.register(
        cleanup,
        Cleanup(move || {
            limiter.retain_recent();
            limiter.shrink_to_fit();
            limiter.len()
        }),
    );
    Ok(answering(GovernorLayer::new(governor), rejections, jsonrpc_too_many))
}

/// The same limiter as `layer`'s, answering its refusals with `answer`
/// (given the seconds to wait), each counted in `rejections`, whose series
/// starts at zero.
pub(crate) fn answering(
    layer: Limit,
    rejections: Counter<u64>,
    answer: fn(u64) -> Response<Body>,
) -> Limit {
    let reason = [KeyValue::new("reason", "request_rate")];
    rejections.add(0, &reason);
    layer.error_handler(move |error| match error {
        GovernorError::TooManyRequests { wait_time, .. } => {
            rejections.add(1, &reason);
            answer(wait_time.max(1))
        }
        // Every request reaching the limiter was authenticated.
        GovernorError::UnableToExtractKey | GovernorError::Other { .. } => {
            jsonrpc_error(StatusCode::INTERNAL_SERVER_ERROR, None, -32603, "internal error", None)
        }
    })
}

fn jsonrpc_too_many(secs: u64) -> Response<Body> {
    let mut response = jsonrpc_error(
        StatusCode::TOO_MANY_REQUESTS,
        None,
        RATE_LIMITED,
        "too many requests",
        Some(serde_json::json!({"code": "rate_limited", "retry_after": secs})),
    );
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_replica_enforces_its_share_rounded_up() {
        let cases = [
            (RateLimitConfig { per_second: 50, burst: 100, replicas: 1 }, (50, 100), "one"),
            (RateLimitConfig { per_second: 50, burst: 100, replicas: 4 }, (13, 25), "four"),
            (RateLimitConfig { per_second: 2, burst: 3, replicas: 10 }, (1, 1), "never zero"),
        ];
        for (config, share, why) in cases {
            assert_eq!(config.share(), share, "{why}");
        }
        let none = RateLimitConfig { replicas: 0, ..RateLimitConfig::default() };
        assert!(none.validate().is_err(), "zero replicas");
    }
}
