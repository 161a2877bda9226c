//! The process-wide `tracing` subscriber: log lines on standard error, and
//! spans into the tracer provider when traces are exported.

use tracing::Subscriber;
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, registry::LookupSpan};

use crate::{LogFormat, Telemetry, TelemetryError};

/// What is logged when `RUST_LOG` is not set: `info`, except rmcp's
/// per-request lines (three for every stateless request), which only
/// `RUST_LOG=rmcp=info` shows.
pub const DEFAULT_FILTER: &str = "info,rmcp=warn";

/// The subscriber: logs filtered by `RUST_LOG` (default [`DEFAULT_FILTER`]) in
/// `format`, plus `telemetry`'s trace layer when it exports spans (at level
/// `INFO` and above, whatever `RUST_LOG` says).
pub fn subscriber(
    telemetry: &Telemetry,
    format: LogFormat,
) -> impl Subscriber + for<'span> LookupSpan<'span> + Send + Sync {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if format.is_json() { logs.json().boxed() } else { logs.boxed() };
    tracing_subscriber::registry().with(logs.with_filter(filter)).with(telemetry.trace_layer())
}

/// Installs [`subscriber`] for the whole process, and the W3C Trace Context
/// propagator as the global one (for libraries that use it). Call it once,
/// from `main`; libraries and tests pass [`Telemetry`] around instead.
pub fn install(telemetry: &Telemetry, format: LogFormat) -> Result<(), TelemetryError> {
    tracing::subscriber::set_global_default(subscriber(telemetry, format))
        .map_err(TelemetryError::SubscriberInstalled)?;
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    Ok(())
}
