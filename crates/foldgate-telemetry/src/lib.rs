//! foldgate's telemetry: logs, traces and metrics.
//!
//! - **Logs**: a `tracing` subscriber writing to standard error, filtered by
//!   `RUST_LOG` (default `info,rmcp=warn,genai=error`), human-readable on a terminal and JSON
//!   otherwise ([`LogFormat`]).
//! - **Traces**: `tracing` spans become OpenTelemetry spans exported over
//!   OTLP (gRPC or HTTP/protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` (or the
//!   traces endpoint) is set. W3C Trace Context is continued from incoming
//!   requests and passed on to upstream servers ([`inject_current_context`]).
//! - **Metrics**: one meter provider; its metrics are always served in the
//!   Prometheus text format ([`Prometheus`], on the operations port) and
//!   also pushed over OTLP when an endpoint is set.
//!
//! [`Telemetry`] owns the providers and is passed explicitly to whoever
//! records: nothing but [`install`] (called once by `main`) touches global
//! state. Without OTLP settings callers still get a working [`Meter`]
//! (recording for Prometheus), and with `OTEL_SDK_DISABLED=true` a no-op
//! one, so instrumented code never asks whether telemetry is on.
//!
//! [`Meter`]: opentelemetry::metrics::Meter

mod config;
mod logging;
mod prometheus;
mod propagation;
mod providers;
mod settings;

pub use config::{LogFormat, TelemetryConfig};
pub use logging::{ACCESS_LOG_TARGET, install, subscriber};
pub use prometheus::Prometheus;
pub use propagation::{extract_context, inject_current_context, set_remote_parent};
pub use providers::{PER_TENANT_METRICS, TENANT_SERIES_LIMIT, Telemetry, TelemetryError, VERSION};
pub use settings::{
    DEFAULT_METRIC_EXPORT_INTERVAL, DEFAULT_SERVICE_NAME, OtelSettings, OtlpTarget, Protocol,
    SettingsError,
};
