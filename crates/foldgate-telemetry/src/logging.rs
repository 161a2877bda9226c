//! The process-wide `tracing` subscriber: log lines on standard error, and
//! spans into the tracer provider when traces are exported.

use std::fmt;

use tracing::{Subscriber, span::Record};
use tracing_subscriber::{
    EnvFilter, Layer,
    field::{RecordFields, VisitOutput},
    fmt::{
        FormatFields, FormattedFields,
        format::{JsonFields, JsonVisitor, Writer},
    },
    layer::SubscriberExt,
    registry::LookupSpan,
};

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
    let logs = if format.is_json() {
        logs.json().fmt_fields(SpanJsonFields::default()).boxed()
    } else {
        logs.boxed()
    };
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

/// The JSON formatting of span fields, as `tracing-subscriber`'s own
/// [`JsonFields`] does it, except that a value recorded on a span after its
/// creation is appended to the span's JSON object instead of parsing and
/// re-writing the whole object. The gateway's spans record several values
/// as a request goes on (status, tokens, outcome), and re-writing was a
/// tenth of the CPU time of a proxied call. A key recorded twice appears
/// twice in the stored text; whoever reads it back as JSON (the event
/// formatter does) keeps the later value.
#[derive(Debug, Default)]
pub struct SpanJsonFields {
    inner: JsonFields,
}

impl<'writer> FormatFields<'writer> for SpanJsonFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        self.inner.format_fields(writer, fields)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &Record<'_>,
    ) -> fmt::Result {
        let mut added = String::new();
        let mut visitor = JsonVisitor::new(&mut added);
        fields.record(&mut visitor);
        visitor.finish()?;
        // `{"a":1}` and `{"b":2}` make `{"a":1,"b":2}`.
        let Some(members) = added.strip_prefix('{').and_then(|a| a.strip_suffix('}')) else {
            return Err(fmt::Error);
        };
        if members.is_empty() {
            return Ok(());
        }
        let stored = &mut current.fields;
        if stored.is_empty() || stored == "{}" {
            stored.clear();
            stored.push_str(&added);
            return Ok(());
        }
        if !stored.ends_with('}') {
            return Err(fmt::Error);
        }
        stored.pop();
        stored.push(',');
        stored.push_str(members);
        stored.push('}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use serde_json::Value;
    use tracing::field::Empty;
    use tracing_subscriber::{fmt::MakeWriter, layer::SubscriberExt as _};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Self;

        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    #[test]
    fn fields_recorded_later_reach_the_log_line() {
        let buffer = Buffer::default();
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .fmt_fields(SpanJsonFields::default())
            .with_writer(buffer.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("request", request_id = "r-1", status = Empty);
            let _outer = outer.enter();
            let span = tracing::info_span!(
                "call",
                tenant = "acme",
                tokens = Empty,
                outcome = Empty,
                note = Empty
            );
            let _entered = span.enter();
            span.record("tokens", 42);
            span.record("outcome", "ok \"quoted\"");
            span.record("tokens", 43);
            outer.record("status", 200);
            tracing::info!(answer = 1, "done");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["fields"]["message"], "done");
        let span = &line["span"];
        assert_eq!(span["name"], "call");
        assert_eq!(span["tenant"], "acme");
        assert_eq!(span["tokens"], 43, "the later value wins");
        assert_eq!(span["outcome"], "ok \"quoted\"");
        assert!(span.get("note").is_none(), "an unrecorded field is absent");
        let outer = &line["spans"][0];
        assert_eq!(outer["name"], "request");
        assert_eq!(outer["request_id"], "r-1");
        assert_eq!(outer["status"], 200, "a span with one field recorded later");
    }
}
