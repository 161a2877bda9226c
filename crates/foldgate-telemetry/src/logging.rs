//! The process-wide `tracing` subscriber: log lines on standard error, and
//! spans into the tracer provider when traces are exported.

use std::fmt;

use tracing::{
    Subscriber,
    field::{Field, Visit},
    span::Record,
};
use tracing_subscriber::{
    EnvFilter, Layer,
    field::RecordFields,
    fmt::{FormatFields, FormattedFields, format::Writer},
    layer::SubscriberExt,
    registry::LookupSpan,
};

use crate::{LogFormat, Telemetry, TelemetryError};

/// What is logged when `RUST_LOG` is not set: `info`, except rmcp's
/// per-request lines (three for every stateless request), which only
/// `RUST_LOG=rmcp=info` shows.
pub const DEFAULT_FILTER: &str = "info,rmcp=warn,genai=error";

/// The target of the access log: one `info` line per MCP request, written
/// only when `telemetry.access_log` is on, whatever `RUST_LOG` says.
pub const ACCESS_LOG_TARGET: &str = "foldgate_access";

/// The subscriber: logs filtered by `RUST_LOG` (default [`DEFAULT_FILTER`]) in
/// `format`, with the access log ([`ACCESS_LOG_TARGET`]) on or off as
/// `access_log` says, plus `telemetry`'s trace layer when it exports spans
/// (at level `INFO` and above, whatever `RUST_LOG` says).
pub fn subscriber(
    telemetry: &Telemetry,
    format: LogFormat,
    access_log: bool,
) -> impl Subscriber + for<'span> LookupSpan<'span> + Send + Sync {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let access = if access_log { "info" } else { "off" };
    let filter = match format!("{ACCESS_LOG_TARGET}={access}").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if format.is_json() {
        logs.json().fmt_fields(SpanJsonFields).boxed()
    } else {
        logs.boxed()
    };
    tracing_subscriber::registry().with(logs.with_filter(filter)).with(telemetry.trace_layer())
}

/// Installs [`subscriber`] for the whole process, and the W3C Trace Context
/// propagator as the global one (for libraries that use it). Call it once,
/// from `main`; libraries and tests pass [`Telemetry`] around instead.
pub fn install(
    telemetry: &Telemetry,
    format: LogFormat,
    access_log: bool,
) -> Result<(), TelemetryError> {
    tracing::subscriber::set_global_default(subscriber(telemetry, format, access_log))
        .map_err(TelemetryError::SubscriberInstalled)?;
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    Ok(())
}

/// The JSON formatting of span fields: a JSON object of the fields, as
/// `tracing-subscriber`'s own `JsonFields` writes it, but cheaper, because
/// every span of every request pays for it (the fmt layer formats a span's
/// fields when the span is created, whether or not a line is ever logged
/// inside it):
///
/// - Members are written straight into the span's text, where `JsonFields`
///   builds a map of `serde_json` values and serialises it.
/// - A value recorded on a span after its creation is appended to the
///   span's object, where `JsonFields` parses and re-writes the whole object.
///   The gateway's spans record several values as a request goes on (status,
///   tokens, outcome).
///
/// A key recorded twice appears twice in the stored text; whoever reads it
/// back as JSON (the event formatter does) keeps the later value.
#[derive(Debug, Default)]
pub struct SpanJsonFields;

impl<'writer> FormatFields<'writer> for SpanJsonFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        writer.write_char('{')?;
        let mut members = JsonMembers::new(&mut writer, true);
        fields.record(&mut members);
        members.finish()?;
        writer.write_char('}')
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &Record<'_>,
    ) -> fmt::Result {
        let stored = &mut current.fields;
        let was_empty = stored.is_empty();
        // `{"a":1}` plus `"b":2` makes `{"a":1,"b":2}`.
        if was_empty {
            stored.push('{');
        } else if stored.ends_with('}') {
            stored.pop();
        } else {
            return Err(fmt::Error);
        }
        let open = stored.len();
        let mut members = JsonMembers::new(stored, open == 1);
        fields.record(&mut members);
        let written = members.finish();
        if written.is_err() {
            // A value that failed to format leaves the span as it was,
            // not with half a member in it.
            stored.truncate(if was_empty { 0 } else { open });
            if !was_empty {
                stored.push('}');
            }
            return written;
        }
        stored.push('}');
        Ok(())
    }
}

/// Writes the fields it visits as the members of a JSON object (without the
/// braces), the way `JsonFields` renders each kind of value.
struct JsonMembers<'a, W: fmt::Write> {
    out: &'a mut W,
    /// No member written yet: the next needs no comma.
    first: bool,
    result: fmt::Result,
}

impl<'a, W: fmt::Write> JsonMembers<'a, W> {
    fn new(out: &'a mut W, first: bool) -> Self {
        Self { out, first, result: Ok(()) }
    }

    fn finish(self) -> fmt::Result {
        self.result
    }

    /// Writes `"name":` and then the value, unless an earlier write failed.
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        let name = field.name();
        // The `log` crate's metadata, which the formatter shows elsewhere.
        if name.starts_with("log.") || self.result.is_err() {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let comma = if self.first { "" } else { "," };
        self.first = false;
        self.result = self
            .out
            .write_str(comma)
            .and_then(|()| json_string(self.out, format_args!("{name}")))
            .and_then(|()| self.out.write_char(':'))
            .and_then(|()| value(self.out));
    }
}

impl<W: fmt::Write> Visit for JsonMembers<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, |out| json_string(out, format_args!("{value}")));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, |out| json_string(out, format_args!("{value:?}")));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        // An array of numbers, as `serde_json` writes bytes.
        self.member(field, |out| {
            out.write_char('[')?;
            for (i, byte) in value.iter().enumerate() {
                let comma = if i == 0 { "" } else { "," };
                write!(out, "{comma}{byte}")?;
            }
            out.write_char(']')
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity; `serde_json` makes them null. Debug
        // keeps the fraction of a whole number (`2.0`), as `serde_json` does.
        if value.is_finite() {
            self.member(field, |out| write!(out, "{value:?}"));
        } else {
            self.member(field, |out| out.write_str("null"));
        }
    }
}

/// Writes `text` as a JSON string, escaping as it goes.
fn json_string(out: &mut impl fmt::Write, text: fmt::Arguments<'_>) -> fmt::Result {
    out.write_char('"')?;
    fmt::write(&mut JsonEscaped(out), text)?;
    out.write_char('"')
}

/// Escapes what passes through it for the inside of a JSON string.
struct JsonEscaped<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for JsonEscaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut plain = 0;
        for (i, byte) in s.bytes().enumerate() {
            let escaped = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x00..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escaped.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escaped)?;
            }
            plain = i + 1;
        }
        self.0.write_str(&s[plain..])
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

    /// The one line `emit` logs, with `fields` formatting span fields.
    fn log_line<F>(fields: F, emit: impl FnOnce()) -> Value
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let buffer = Buffer::default();
        let layer =
            tracing_subscriber::fmt::layer().json().fmt_fields(fields).with_writer(buffer.clone());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        serde_json::from_str(text.trim()).unwrap()
    }

    #[test]
    fn fields_recorded_later_reach_the_log_line() {
        let line = log_line(SpanJsonFields, || {
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

    /// A value whose formatting fails (which `std` forbids, and
    /// `tracing-subscriber`'s own JSON panics on).
    struct Unformattable;

    impl fmt::Debug for Unformattable {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("half")?;
            Err(fmt::Error)
        }
    }

    /// The span's fields as logged, with `fields` formatting them.
    fn logged_span<F>(fields: F) -> Value
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let line = log_line(fields, || {
            let span = tracing::info_span!(
                "call",
                quoted = "a \"b\" \\ c",
                lines = "one\ntwo\r\tthree\u{1}\u{1f}",
                unicode = "é ✓ 𝄞",
                debug = ?vec!["x", "y\""],
                display = %"shown \"as is\"",
                negative = -42_i64,
                big = u64::MAX,
                yes = true,
                ratio = 1.5_f64,
                whole = 2.0_f64,
                huge = 1e300_f64,
                tiny = -1e-7_f64,
                nan = f64::NAN,
                r#type = "raw",
                bytes = &b"ab\x00\xff"[..],
                later = Empty,
                empty = "",
            );
            let _entered = span.enter();
            span.record("later", "set \"later\"");
            tracing::info!("done");
        });
        line["span"].clone()
    }

    #[test]
    fn span_fields_read_back_as_tracing_subscribers_own_json_does() {
        let ours = logged_span(SpanJsonFields);
        let theirs = logged_span(tracing_subscriber::fmt::format::JsonFields::default());
        assert_eq!(ours, theirs);
        assert_eq!(ours["lines"], "one\ntwo\r\tthree\u{1}\u{1f}");
        assert_eq!(ours["later"], "set \"later\"");
        assert_eq!(ours["type"], "raw");
        assert_eq!(ours["bytes"], serde_json::json!([97, 98, 0, 255]));
    }

    #[test]
    fn a_value_that_fails_to_format_leaves_the_span_readable() {
        let line = log_line(SpanJsonFields, || {
            let span = tracing::info_span!("call", kept = 1, failing = Empty, later = Empty);
            let _entered = span.enter();
            span.record("failing", tracing::field::debug(Unformattable));
            span.record("later", 2);
            tracing::info!("done");
        });
        let span = &line["span"];
        assert_eq!((&span["kept"], &span["later"]), (&Value::from(1), &Value::from(2)), "{line}");
        assert!(span.get("failing").is_none() && line.get("field_error").is_none(), "{line}");
    }
}
