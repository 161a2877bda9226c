//! The front end's settings.

use std::time::Duration;

use foldgate_domain::duration;
use serde::Deserialize;

use crate::{guard::HostOriginPolicy, host::HostPattern, limit::RateLimitConfig};

/// How the MCP endpoint is exposed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// The canonical URL of the MCP endpoint as clients reach it (through any
    /// load balancer), e.g. `https://foldgate.example.com/mcp`. It is the
    /// expected token audience by default and is published in the RFC 9728
    /// metadata. Default: `http://<listen>/mcp`.
    pub public_url: Option<String>,
    /// Accepted `Host` values: names, IP addresses, either with `:port`;
    /// `*.example.com` accepts every name below `example.com`, `*` any host.
    /// Default: loopback names, plus the host of `public_url`.
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` values (`scheme://host[:port]`, the host as in
    /// `allowed_hosts`; `*` accepts any); a request with any other `Origin`
    /// is refused. Default: none (requests without `Origin`,
    /// i.e. non-browser clients, are unaffected).
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Per-principal request rate.
    pub rate_limit: RateLimitConfig,
    /// Longest a request may take before it is answered 503. A bare number
    /// counts seconds.
    #[serde(deserialize_with = "duration::seconds")]
    pub request_timeout: Duration,
    /// On shutdown, how long in-flight requests may take to finish. A bare
    /// number counts seconds.
    #[serde(deserialize_with = "duration::seconds")]
    pub shutdown_grace: Duration,
    /// How long an HTTP/1 connection may take to send a complete request
    /// head, counted from when it opens or its previous response was sent;
    /// then it is closed. Bounds half-sent requests and idle keep-alive
    /// connections alike. Keep it above the idle timeout of a load balancer
    /// that keeps connections to the gateway open, or the balancer may send
    /// a request on a connection the gateway is closing. A bare number
    /// counts seconds.
    #[serde(deserialize_with = "duration::seconds")]
    pub header_read_timeout: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            public_url: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: 1024 * 1024,
            rate_limit: RateLimitConfig::default(),
            request_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(75),
        }
    }
}

impl ApiConfig {
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        self.rate_limit.validate()?;
        if self.max_body_bytes < 1024 {
            return Err("max_body_bytes must be at least 1024".into());
        }
        if let Some(url) = &self.public_url {
            let authority = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"))
                .and_then(|rest| rest.split(['/', '?', '#']).next())
                .ok_or_else(|| format!("public_url {url:?} must be an http(s) URL"))?;
            if authority.contains('*') {
                return Err(format!("public_url {url:?} has a wildcard for its host").into());
            }
            HostPattern::parse(authority)
                .map_err(|why| format!("public_url {url:?}: its host {authority:?} {why}"))?;
        }
        HostOriginPolicy::new(&self.allowed_hosts, &self.allowed_origins)?;
        if self.request_timeout.is_zero() {
            return Err("request_timeout must be above 0s".into());
        }
        if self.header_read_timeout.is_zero() {
            return Err("header_read_timeout must be above 0s".into());
        }
        Ok(())
    }
}
