//! The Prometheus text exposition of the gateway's metrics, pulled on each
//! scrape from the meter provider (OpenTelemetry names translated the
//! Prometheus way: dots become underscores, the unit is appended as a
//! suffix, counters end in `_total`).

use prometheus::{Encoder, TextEncoder};

use crate::TelemetryError;

/// Renders the current metrics for a scrape. Cheap to clone.
#[derive(Clone)]
pub struct Prometheus {
    registry: prometheus::Registry,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus").finish_non_exhaustive()
    }
}

impl Prometheus {
    /// The `Content-Type` of [`Prometheus::render`]'s output.
    pub const CONTENT_TYPE: &'static str = "text/plain; version=0.0.4; charset=utf-8";

    pub(crate) fn new(registry: prometheus::Registry) -> Self {
        Self { registry }
    }

    /// An exposition with no metrics (telemetry disabled).
    pub(crate) fn empty() -> Self {
        Self { registry: prometheus::Registry::new() }
    }

    /// Collects every instrument (running the observable gauges' callbacks)
    /// and encodes the result in the text format, version 0.0.4.
    pub fn render(&self) -> Result<String, TelemetryError> {
        let families = self.registry.gather();
        let mut text = Vec::new();
        TextEncoder::new().encode(&families, &mut text).map_err(TelemetryError::Encoding)?;
        String::from_utf8(text)
            .map_err(|e| TelemetryError::Encoding(prometheus::Error::Msg(e.to_string())))
    }
}
