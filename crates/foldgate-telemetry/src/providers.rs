//! The meter and tracer providers of one gateway, built from explicit
//! settings and handed to whoever needs them: nothing here is global, so
//! several gateways can run in one process (tests do).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use opentelemetry::{
    InstrumentationScope, KeyValue,
    metrics::{Meter, MeterProvider as _, noop::NoopMeterProvider},
    trace::TracerProvider as _,
};
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::{
    Resource,
    metrics::{Instrument, PeriodicReader, SdkMeterProvider, Stream},
    resource::TelemetryResourceDetector,
    trace::{SdkTracer, SdkTracerProvider},
};
use tracing::{Level, Subscriber};
use tracing_subscriber::{Layer, filter::Targets, registry::LookupSpan};

use crate::{DEFAULT_SERVICE_NAME, OtelSettings, OtlpTarget, Prometheus, Protocol};

/// The version reported as `service.version` and as the instrumentation
/// scope's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The instrumentation scope of every foldgate instrument and span.
const SCOPE: &str = "foldgate";

/// The metrics whose series start at zero for every tenant the process
/// knows (and each upstream serving it, or each value of a closed label).
/// The SDK keeps 2000 label sets per metric; past that it adds new ones up
/// in a single `otel_metric_overflow` series. With 10 refusal reasons a
/// tenant, `foldgate.branches.refused` would reach it at 200 tenants, so
/// these keep up to [`TENANT_SERIES_LIMIT`] each.
pub const PER_TENANT_METRICS: &[&str] = &[
    "foldgate.branches.active",
    "foldgate.branches.completed",
    "foldgate.branches.created",
    "foldgate.branches.forced_returns",
    "foldgate.branches.refused",
    "foldgate.tokens.consumed",
    "foldgate.upstream.calls_outside_branches",
    "foldgate.upstream.tokens",
];

/// Label sets each of [`PER_TENANT_METRICS`] keeps: 2000 tenants' worth of
/// refusals. The SDK sets aside room for them up front (about a megabyte a
/// metric and reader).
pub const TENANT_SERIES_LIMIT: usize = 20_000;

/// The view that raises the series limit of [`PER_TENANT_METRICS`].
fn per_tenant_limit(instrument: &Instrument) -> Option<Stream> {
    if !PER_TENANT_METRICS.contains(&instrument.name()) {
        return None;
    }
    Stream::builder().with_cardinality_limit(TENANT_SERIES_LIMIT).build().ok()
}

/// Why telemetry could not be set up or shut down.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("building the OTLP {signal} exporter")]
    Exporter {
        signal: &'static str,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("setting up the Prometheus exporter")]
    Prometheus(#[source] opentelemetry_sdk::error::OTelSdkError),
    #[error("encoding the Prometheus exposition")]
    Encoding(#[source] prometheus::Error),
    #[error("flushing or shutting down telemetry: {0}")]
    Shutdown(String),
    #[error("a global tracing subscriber is already installed")]
    SubscriberInstalled(#[source] tracing::subscriber::SetGlobalDefaultError),
}

/// The gateway's telemetry: a meter provider whose metrics are served to
/// Prometheus (always) and pushed over OTLP (when configured), and a tracer
/// provider exporting spans over OTLP (when configured).
///
/// Cheap to clone; clones share the providers. It is also the guard that
/// flushes them: call [`Telemetry::shutdown`] once the gateway has stopped.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    meters: Meters,
    /// `None` when spans are not exported: `tracing` spans then stay in the
    /// process (logs only).
    tracer: Option<SdkTracerProvider>,
    prometheus: Prometheus,
    resource: Resource,
    shut_down: AtomicBool,
}

enum Meters {
    Sdk(SdkMeterProvider),
    /// `OTEL_SDK_DISABLED=true`.
    Disabled(NoopMeterProvider),
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("metrics", &matches!(self.inner.meters, Meters::Sdk(_)))
            .field("traces", &self.inner.tracer.is_some())
            .field("resource", &self.inner.resource)
            .finish()
    }
}

impl Telemetry {
    /// Builds the providers the settings ask for. With an OTLP/gRPC target
    /// this must run inside a Tokio runtime (the gRPC channel lives on it).
    pub fn new(settings: &OtelSettings) -> Result<Self, TelemetryError> {
        if settings.sdk_disabled {
            return Ok(Self::disabled());
        }
        let resource = resource(settings);
        let registry = prometheus::Registry::new();
        let prometheus_reader = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            // Instrument scope labels on every series would only repeat
            // `foldgate`; the resource is in `target_info`.
            .scope_info_enabled(false)
            .build()
            .map_err(TelemetryError::Prometheus)?;
        let mut meters = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_view(per_tenant_limit)
            .with_reader(prometheus_reader);
        if let Some(target) = &settings.metrics {
            let exporter = metric_exporter(target)
                .map_err(|source| TelemetryError::Exporter { signal: "metrics", source })?;
            meters = meters.with_reader(
                PeriodicReader::builder(exporter)
                    .with_interval(settings.metric_export_interval)
                    .build(),
            );
        }
        let tracer = match &settings.traces {
            Some(target) => {
                let exporter = span_exporter(target)
                    .map_err(|source| TelemetryError::Exporter { signal: "traces", source })?;
                Some(
                    SdkTracerProvider::builder()
                        .with_resource(resource.clone())
                        .with_batch_exporter(exporter)
                        .build(),
                )
            }
            None => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                meters: Meters::Sdk(meters.build()),
                tracer,
                prometheus: Prometheus::new(registry),
                resource,
                shut_down: AtomicBool::new(false),
            }),
        })
    }

    /// Metrics served to Prometheus only, no traces: what a gateway without
    /// OTLP settings gets.
    pub fn local() -> Self {
        // Building the Prometheus reader only fails on a registry that
        // already holds it; a fresh registry never does.
        match Self::new(&OtelSettings::default()) {
            Ok(telemetry) => telemetry,
            Err(e) => {
                tracing::error!(error = %e, "metrics are disabled");
                Self::disabled()
            }
        }
    }

    /// No metrics and no traces (`OTEL_SDK_DISABLED=true`).
    pub fn disabled() -> Self {
        Self {
            inner: Arc::new(Inner {
                meters: Meters::Disabled(NoopMeterProvider::new()),
                tracer: None,
                prometheus: Prometheus::empty(),
                resource: Resource::builder_empty().build(),
                shut_down: AtomicBool::new(false),
            }),
        }
    }

    /// The meter every foldgate instrument is created from.
    pub fn meter(&self) -> Meter {
        let scope = InstrumentationScope::builder(SCOPE).with_version(VERSION).build();
        match &self.inner.meters {
            Meters::Sdk(provider) => provider.meter_with_scope(scope),
            Meters::Disabled(provider) => provider.meter_with_scope(scope),
        }
    }

    /// The Prometheus text exposition of this telemetry's metrics.
    pub fn prometheus(&self) -> Prometheus {
        self.inner.prometheus.clone()
    }

    /// The resource describing this process (`service.name`, …).
    pub fn resource(&self) -> &Resource {
        &self.inner.resource
    }

    /// A `tracing` layer that turns spans at level `INFO` and above into
    /// OpenTelemetry spans, or `None` when spans are not exported.
    pub fn trace_layer<S>(&self) -> Option<impl Layer<S> + Send + Sync + 'static>
    where
        S: Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        let provider = self.inner.tracer.as_ref()?;
        let scope = InstrumentationScope::builder(SCOPE).with_version(VERSION).build();
        let tracer: SdkTracer = provider.tracer_with_scope(scope);
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(Targets::new().with_default(Level::INFO)),
        )
    }

    /// Exports whatever is buffered now.
    pub fn force_flush(&self) -> Result<(), TelemetryError> {
        let metrics = match &self.inner.meters {
            Meters::Sdk(provider) => provider.force_flush(),
            Meters::Disabled(_) => Ok(()),
        };
        let traces = self.inner.tracer.as_ref().map_or(Ok(()), SdkTracerProvider::force_flush);
        combine(metrics, traces)
    }

    /// Exports what is buffered and stops the exporters. Later calls do
    /// nothing; instruments keep working but record into nothing. Blocks
    /// until the exporters are done (at most their timeouts): call it off
    /// the async workers.
    pub fn shutdown(&self) -> Result<(), TelemetryError> {
        if self.inner.shut_down.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let traces = self.inner.tracer.as_ref().map_or(Ok(()), SdkTracerProvider::shutdown);
        let metrics = match &self.inner.meters {
            Meters::Sdk(provider) => provider.shutdown(),
            Meters::Disabled(_) => Ok(()),
        };
        combine(metrics, traces)
    }
}

fn combine(
    metrics: opentelemetry_sdk::error::OTelSdkResult,
    traces: opentelemetry_sdk::error::OTelSdkResult,
) -> Result<(), TelemetryError> {
    match (metrics, traces) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(m), Ok(())) => Err(TelemetryError::Shutdown(format!("metrics: {m}"))),
        (Ok(()), Err(t)) => Err(TelemetryError::Shutdown(format!("traces: {t}"))),
        (Err(m), Err(t)) => Err(TelemetryError::Shutdown(format!("metrics: {m}; traces: {t}"))),
    }
}

/// `service.*` and `telemetry.sdk.*`, then `OTEL_RESOURCE_ATTRIBUTES`, then
/// `OTEL_SERVICE_NAME`: later ones win.
fn resource(settings: &OtelSettings) -> Resource {
    let mut builder = Resource::builder_empty()
        .with_detector(Box::new(TelemetryResourceDetector))
        .with_attributes([
            KeyValue::new("service.name", DEFAULT_SERVICE_NAME),
            KeyValue::new("service.version", VERSION),
            // Tells replicas (and restarts) apart.
            KeyValue::new("service.instance.id", uuid::Uuid::new_v4().to_string()),
        ])
        .with_attributes(
            settings.resource_attributes.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
    if let Some(name) = &settings.service_name {
        builder = builder.with_service_name(name.clone());
    }
    builder.build()
}

fn span_exporter(
    target: &OtlpTarget,
) -> Result<SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    match target.protocol {
        Protocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_protocol(opentelemetry_otlp::Protocol::Grpc)
            .with_endpoint(&target.endpoint)
            .build(),
        Protocol::HttpProtobuf => SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(&target.endpoint)
            .build(),
    }
}

fn metric_exporter(
    target: &OtlpTarget,
) -> Result<MetricExporter, opentelemetry_otlp::ExporterBuildError> {
    match target.protocol {
        Protocol::Grpc => MetricExporter::builder()
            .with_tonic()
            .with_protocol(opentelemetry_otlp::Protocol::Grpc)
            .with_endpoint(&target.endpoint)
            .build(),
        Protocol::HttpProtobuf => MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(&target.endpoint)
            .build(),
    }
}
