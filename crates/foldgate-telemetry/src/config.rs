//! The `[telemetry]` settings of the gateway's configuration. Where metrics
//! and traces are exported is not here: the standard `OTEL_*` variables say
//! it (see [`OtelSettings`](crate::OtelSettings)).

use std::{io::IsTerminal, time::Duration};

use foldgate_domain::duration;
use serde::Deserialize;

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable when standard error is a terminal, JSON otherwise.
    #[default]
    Auto,
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    /// Whether lines are written as JSON, deciding `Auto` by looking at
    /// standard error.
    pub fn is_json(self) -> bool {
        match self {
            Self::Auto => !std::io::stderr().is_terminal(),
            Self::Text => false,
            Self::Json => true,
        }
    }
}

/// Logging and metric collection settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// How log lines are written (`auto`, `text` or `json`). Which lines is
    /// decided by `RUST_LOG` (default `info,rmcp=warn,genai=error`).
    pub log_format: LogFormat,
    /// How often the gauges read from the database (active branches per
    /// tenant) are refreshed. Scrapes and pushes in between report the last
    /// reading. A bare number counts milliseconds.
    #[serde(deserialize_with = "duration::millis")]
    pub store_poll_interval: Duration,
    /// One `info` line per MCP request (target `foldgate_access`): method,
    /// tool, outcome, duration, with the request's tenant, session and
    /// branch. Off by default: then a successful request writes no line.
    pub access_log: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Auto,
            store_poll_interval: Duration::from_secs(10),
            access_log: false,
        }
    }
}

impl TelemetryConfig {
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        duration::check_range(
            "store_poll_interval",
            self.store_poll_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        )
    }
}
