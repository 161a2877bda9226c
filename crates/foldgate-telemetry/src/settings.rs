//! What the standard `OTEL_*` environment variables ask for, read from an
//! explicit list of variables so that tests (and several gateways in one
//! process) never depend on the process environment.
//!
//! Supported, with the OpenTelemetry specification's meaning:
//! `OTEL_SDK_DISABLED`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL`,
//! `OTEL_TRACES_EXPORTER`, `OTEL_METRICS_EXPORTER` and
//! `OTEL_METRIC_EXPORT_INTERVAL`. The exporter's own variables (headers,
//! timeout, compression, TLS) are read by the exporter from the process
//! environment.

use std::{collections::HashMap, time::Duration};

/// The service name when neither `OTEL_SERVICE_NAME` nor
/// `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const DEFAULT_SERVICE_NAME: &str = "foldgate";

/// How often metrics are pushed over OTLP unless `OTEL_METRIC_EXPORT_INTERVAL`
/// says otherwise (the specification's default).
pub const DEFAULT_METRIC_EXPORT_INTERVAL: Duration = Duration::from_secs(60);

/// The OTLP wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (collector port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (collector port 4318). The
    /// specification's default.
    HttpProtobuf,
}

impl Protocol {
    fn parse(variable: &str, value: &str) -> Result<Self, SettingsError> {
        match value {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            _ => Err(SettingsError::new(
                variable,
                value,
                "expected `grpc` or `http/protobuf` (`http/json` is not supported)",
            )),
        }
    }
}

/// Where one signal is exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpTarget {
    /// The full URL requests go to: for OTLP/HTTP including the signal's
    /// path (`/v1/traces`, `/v1/metrics`).
    pub endpoint: String,
    pub protocol: Protocol,
}

/// The telemetry a process produces, as the `OTEL_*` variables configure it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// `OTEL_SDK_DISABLED=true`: no metrics and no traces at all (the
    /// Prometheus endpoint answers with an empty exposition).
    pub sdk_disabled: bool,
    /// `OTEL_SERVICE_NAME`; it wins over a `service.name` in the resource
    /// attributes.
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in the order given; they win over the
    /// gateway's own (`service.version`, `service.instance.id`).
    pub resource_attributes: Vec<(String, String)>,
    /// Where spans go; `None`: no span leaves the process.
    pub traces: Option<OtlpTarget>,
    /// Where metrics are pushed; `None`: metrics are only served to
    /// Prometheus.
    pub metrics: Option<OtlpTarget>,
    /// Between two metric pushes.
    pub metric_export_interval: Duration,
}

impl Default for OtelSettings {
    /// Nothing exported; metrics served to Prometheus only.
    fn default() -> Self {
        Self {
            sdk_disabled: false,
            service_name: None,
            resource_attributes: Vec::new(),
            traces: None,
            metrics: None,
            metric_export_interval: DEFAULT_METRIC_EXPORT_INTERVAL,
        }
    }
}

/// An `OTEL_*` variable with a value this process cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {reason}")]
pub struct SettingsError {
    pub variable: String,
    pub value: String,
    pub reason: String,
}

impl SettingsError {
    fn new(variable: &str, value: &str, reason: impl Into<String>) -> Self {
        Self { variable: variable.to_owned(), value: value.to_owned(), reason: reason.into() }
    }
}

/// The two exported signals, with the names of their variables.
struct Signal {
    exporter: &'static str,
    endpoint: &'static str,
    protocol: &'static str,
    /// Appended to `OTEL_EXPORTER_OTLP_ENDPOINT` for OTLP/HTTP.
    path: &'static str,
    /// Exporter names besides `otlp` and `none` that mean "not over OTLP".
    other_exporters: &'static [&'static str],
}

const TRACES: Signal = Signal {
    exporter: "OTEL_TRACES_EXPORTER",
    endpoint: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    protocol: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    path: "v1/traces",
    other_exporters: &[],
};

const METRICS: Signal = Signal {
    exporter: "OTEL_METRICS_EXPORTER",
    endpoint: "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    protocol: "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    path: "v1/metrics",
    // Metrics are always served to Prometheus.
    other_exporters: &["prometheus"],
};

impl OtelSettings {
    /// Reads the settings from environment variables (pass
    /// `std::env::vars()` in a process). An empty value counts as unset, as
    /// the specification says.
    pub fn from_env(
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let env: HashMap<String, String> = env
            .into_iter()
            .filter(|(name, value)| name.starts_with("OTEL_") && !value.trim().is_empty())
            .map(|(name, value)| (name, value.trim().to_owned()))
            .collect();
        let get = |name: &str| env.get(name).map(String::as_str);

        let sdk_disabled = match get("OTEL_SDK_DISABLED").map(str::to_ascii_lowercase).as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(SettingsError::new(
                    "OTEL_SDK_DISABLED",
                    other,
                    "expected true or false",
                ));
            }
        };
        let resource_attributes = match get("OTEL_RESOURCE_ATTRIBUTES") {
            Some(raw) => parse_resource_attributes(raw)?,
            None => Vec::new(),
        };
        let metric_export_interval = match get("OTEL_METRIC_EXPORT_INTERVAL") {
            Some(raw) => match raw.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    return Err(SettingsError::new(
                        "OTEL_METRIC_EXPORT_INTERVAL",
                        raw,
                        "expected a positive number of milliseconds",
                    ));
                }
            },
            None => DEFAULT_METRIC_EXPORT_INTERVAL,
        };
        let traces = target(&TRACES, &get)?;
        let metrics = target(&METRICS, &get)?;
        Ok(Self {
            sdk_disabled,
            service_name: get("OTEL_SERVICE_NAME").map(str::to_owned),
            resource_attributes,
            traces: traces.filter(|_| !sdk_disabled),
            metrics: metrics.filter(|_| !sdk_disabled),
            metric_export_interval,
        })
    }
}

/// Where a signal goes: enabled by its endpoint (or the common one) unless
/// its exporter is `none`.
fn target<'a>(
    signal: &Signal,
    get: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<OtlpTarget>, SettingsError> {
    let mut otlp = true;
    if let Some(exporters) = get(signal.exporter) {
        otlp = false;
        for exporter in exporters.split(',').map(str::trim) {
            match exporter {
                "otlp" => otlp = true,
                "none" => {}
                other if signal.other_exporters.contains(&other) => {}
                _ => {
                    let mut expected = vec!["otlp", "none"];
                    expected.extend(signal.other_exporters);
                    return Err(SettingsError::new(
                        signal.exporter,
                        exporters,
                        format!("supported exporters: {}", expected.join(", ")),
                    ));
                }
            }
        }
    }
    let protocol = match get(signal.protocol)
        .map(|v| (signal.protocol, v))
        .or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL").map(|v| ("OTEL_EXPORTER_OTLP_PROTOCOL", v)))
    {
        Some((variable, value)) => Protocol::parse(variable, value)?,
        None => Protocol::HttpProtobuf,
    };
    let endpoint = if let Some(url) = get(signal.endpoint) {
        check_url(signal.endpoint, url)?;
        // A signal's own endpoint is used as it is.
        url.to_owned()
    } else if let Some(url) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
        check_url("OTEL_EXPORTER_OTLP_ENDPOINT", url)?;
        match protocol {
            // gRPC services are found by name, not by path.
            Protocol::Grpc => url.to_owned(),
            Protocol::HttpProtobuf => {
                format!("{}/{}", url.trim_end_matches('/'), signal.path)
            }
        }
    } else {
        return Ok(None);
    };
    Ok(otlp.then_some(OtlpTarget { endpoint, protocol }))
}

fn check_url(variable: &str, url: &str) -> Result<(), SettingsError> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => Err(SettingsError::new(variable, url, "expected an http:// or https:// URL")),
    }
}

/// `key1=value1,key2=value2`, values percent-encoded (W3C Baggage syntax,
/// as the specification prescribes).
fn parse_resource_attributes(raw: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let invalid = |why: &str| SettingsError::new("OTEL_RESOURCE_ATTRIBUTES", raw, why);
    let mut attributes = Vec::new();
    for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) =
            pair.split_once('=').ok_or_else(|| invalid("expected key=value pairs"))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(invalid("an attribute has an empty key"));
        }
        let value =
            percent_decode(value.trim()).ok_or_else(|| invalid("invalid percent-encoding"))?;
        attributes.push((key.to_owned(), value));
    }
    Ok(attributes)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<OtelSettings, SettingsError> {
        OtelSettings::from_env(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
    }

    fn target(endpoint: &str, protocol: Protocol) -> Option<OtlpTarget> {
        Some(OtlpTarget { endpoint: endpoint.to_owned(), protocol })
    }

    #[test]
    fn nothing_is_exported_without_an_endpoint() {
        let s = settings(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("HOME", "/root")]).unwrap();
        assert_eq!(s, OtelSettings::default());
    }

    #[test]
    fn endpoints_and_protocols_follow_the_specification() {
        use Protocol::{Grpc, HttpProtobuf};
        // Variables, then the traces and metrics targets they give.
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<OtlpTarget>, Option<OtlpTarget>, &'a str);
        let cases: &[Case<'_>] = &[
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
                target("http://collector:4318/v1/traces", HttpProtobuf),
                target("http://collector:4318/v1/metrics", HttpProtobuf),
                "HTTP is the default and the signal path is appended",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel.example/base/")],
                target("https://otel.example/base/v1/traces", HttpProtobuf),
                target("https://otel.example/base/v1/metrics", HttpProtobuf),
                "a base path is kept, without a double slash",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                target("http://collector:4317", Grpc),
                target("http://collector:4317", Grpc),
                "gRPC uses the endpoint as it is",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                    ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://metrics:9000/ingest"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
                ],
                target("http://collector:4318", Grpc),
                target("http://metrics:9000/ingest", HttpProtobuf),
                "per-signal settings win, and a signal's endpoint is used as it is",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4318/v1/traces")],
                target("http://tempo:4318/v1/traces", HttpProtobuf),
                None,
                "one signal alone",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                    ("OTEL_TRACES_EXPORTER", "none"),
                    ("OTEL_METRICS_EXPORTER", "prometheus"),
                ],
                None,
                None,
                "exporters switched off",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                    ("OTEL_SDK_DISABLED", "TRUE"),
                ],
                None,
                None,
                "the SDK is disabled",
            ),
        ];
        for (vars, traces, metrics, why) in cases {
            let s = settings(vars).unwrap();
            assert_eq!(&s.traces, traces, "traces: {why}");
            assert_eq!(&s.metrics, metrics, "metrics: {why}");
        }
    }

    #[test]
    fn resource_and_interval() {
        let s = settings(&[
            ("OTEL_SERVICE_NAME", "gateway-eu"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment.name=prod, k8s.pod.name=fg%2D1%20a,",
            ),
            ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
        ])
        .unwrap();
        assert_eq!(s.service_name.as_deref(), Some("gateway-eu"));
        assert_eq!(
            s.resource_attributes,
            vec![
                ("deployment.environment.name".to_owned(), "prod".to_owned()),
                ("k8s.pod.name".to_owned(), "fg-1 a".to_owned()),
            ]
        );
        assert_eq!(s.metric_export_interval, Duration::from_secs(15));
    }

    #[test]
    fn mistakes_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("OTEL_SDK_DISABLED", "yes")], "OTEL_SDK_DISABLED"),
            (&[("OTEL_METRIC_EXPORT_INTERVAL", "0")], "OTEL_METRIC_EXPORT_INTERVAL"),
            (&[("OTEL_METRIC_EXPORT_INTERVAL", "1m")], "OTEL_METRIC_EXPORT_INTERVAL"),
            (&[("OTEL_RESOURCE_ATTRIBUTES", "novalue")], "OTEL_RESOURCE_ATTRIBUTES"),
            (&[("OTEL_RESOURCE_ATTRIBUTES", "a=%zz")], "OTEL_RESOURCE_ATTRIBUTES"),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")], "OTEL_EXPORTER_OTLP_ENDPOINT"),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
        ];
        for (vars, variable) in cases {
            let err = settings(vars).unwrap_err();
            assert_eq!(err.variable, *variable, "{vars:?}: {err}");
        }
    }
}
