//! W3C Trace Context across HTTP: the `traceparent` (and `tracestate`) of
//! the current span for requests the gateway sends, and the remote parent
//! of requests it receives. Without exported traces there is no span
//! context, and these do nothing.

use opentelemetry::{
    Context,
    propagation::{Extractor, Injector, TextMapPropagator},
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Adds the current span's trace context to the headers of an outgoing
/// request, so that the server it goes to continues the same trace.
pub fn inject_current_context(headers: &mut http::HeaderMap) {
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
}

/// The trace context a request arrived with (empty if it had none).
pub fn extract_context(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Makes the trace context a request arrived with the parent of `span`.
/// Call it right after creating the span, before it is entered.
pub fn set_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    let context = extract_context(headers);
    // Fails only when no span is exported (no OpenTelemetry layer), or the
    // span has already started: either way there is nothing to link.
    if span.set_parent(context).is_err() {
        tracing::trace!("no trace to continue");
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) =
            (http::HeaderName::from_bytes(key.as_bytes()), http::HeaderValue::from_str(&value))
        {
            self.0.insert(name, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}
