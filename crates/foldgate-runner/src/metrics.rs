//! What gateway-run branches record: runs, steps, and the model calls they
//! make, named after the OpenTelemetry GenAI conventions where they apply.

use std::time::Duration;

use opentelemetry::{
    KeyValue,
    metrics::{
        Counter, Histogram, Meter, MeterProvider as _, UpDownCounter, noop::NoopMeterProvider,
    },
};

use crate::model::{AttemptObserver, FaultKind, ModelConfig};

/// Bucket boundaries (seconds) for model calls, as the GenAI conventions
/// recommend.
const MODEL_BUCKETS: [f64; 14] =
    [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];

/// Bucket boundaries for token counts, as the GenAI conventions recommend.
const TOKEN_BUCKETS: [f64; 14] = [
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1_024.0,
    4_096.0,
    16_384.0,
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];

/// What a model call was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A step of a gateway-run branch.
    Run,
    /// Distilling an ended run's lessons.
    Distill,
}

impl Purpose {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Distill => "distill",
        }
    }
}

/// The runner's instruments. Cheap to clone.
///
/// - `foldgate.run.runs{tenant, model, status}`: runs that ended, by the
///   branch's final status.
/// - `foldgate.run.active`: runs being worked on by this replica.
/// - `foldgate.run.steps{model, kind}`: steps written (`model`, `tool`).
/// - `gen_ai.client.operation.duration{gen_ai.operation.name,
///   gen_ai.provider.name, gen_ai.request.model, model, error.type}`
///   (seconds): each attempt of a model call (`chat`), and each call of an
///   embeddings model (`embeddings`).
/// - `gen_ai.client.token.usage{tenant, gen_ai.provider.name,
///   gen_ai.request.model, model, gen_ai.token.type, purpose}` (histogram):
///   tokens the provider billed for each call (`input`, `output`), made for
///   a run's step (`purpose="run"`) or to distil an ended run's lessons
///   (`purpose="distill"`); its sum is what a tenant was billed.
///
/// `gen_ai.request.model` is the provider's model id and `model` the
/// `[[models]]` entry's name (what `branch_run` asks for).
/// - `foldgate.model.errors{model, kind}`: failed attempts by kind
///   (`rate_limited`, `server_error`, `timeout`, `unreachable`,
///   `malformed_answer`, `refused`).
#[derive(Debug, Clone)]
pub struct RunMetrics {
    runs: Counter<u64>,
    active: UpDownCounter<i64>,
    steps: Counter<u64>,
    duration: Histogram<f64>,
    tokens: Histogram<u64>,
    errors: Counter<u64>,
}

impl RunMetrics {
    pub fn new(meter: &Meter) -> Self {
        Self {
            runs: meter
                .u64_counter("foldgate.run.runs")
                .with_description("Gateway-run branches that ended, by final status")
                .with_unit("{run}")
                .build(),
            active: meter
                .i64_up_down_counter("foldgate.run.active")
                .with_description("Gateway-run branches this replica is working on")
                .with_unit("{run}")
                .build(),
            steps: meter
                .u64_counter("foldgate.run.steps")
                .with_description("Steps of gateway-run branches: model calls and tool calls")
                .with_unit("{step}")
                .build(),
            duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_description("Duration of each attempt of a model call")
                .with_unit("s")
                .with_boundaries(MODEL_BUCKETS.to_vec())
                .build(),
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_description(
                    "Tokens model providers billed for each call of a gateway-run branch, and \
                     of the distillation of its lessons",
                )
                .with_unit("{token}")
                .with_boundaries(TOKEN_BUCKETS.to_vec())
                .build(),
            errors: meter
                .u64_counter("foldgate.model.errors")
                .with_description("Failed attempts of model calls, by kind")
                .with_unit("{error}")
                .build(),
        }
    }

    /// Instruments that record nothing.
    pub fn noop() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }

    pub(crate) fn ended(&self, tenant: &str, model: &str, status: &str) {
        self.runs.add(
            1,
            &[
                KeyValue::new("tenant", tenant.to_owned()),
                KeyValue::new("model", model.to_owned()),
                KeyValue::new("status", status.to_owned()),
            ],
        );
    }

    pub(crate) fn working(&self, delta: i64) {
        self.active.add(delta, &[]);
    }

    pub(crate) fn step(&self, model: &str, kind: &'static str) {
        self.steps.add(1, &[KeyValue::new("model", model.to_owned()), KeyValue::new("kind", kind)]);
    }

    pub(crate) fn billed(
        &self,
        tenant: &str,
        model: &ModelConfig,
        input: u64,
        output: u64,
        purpose: Purpose,
    ) {
        for (kind, tokens) in [("input", input), ("output", output)] {
            let mut attributes = model_attributes(model);
            attributes.push(KeyValue::new("tenant", tenant.to_owned()));
            attributes.push(KeyValue::new("gen_ai.token.type", kind));
            attributes.push(KeyValue::new("purpose", purpose.as_str()));
            self.tokens.record(tokens, &attributes);
        }
    }
}

impl AttemptObserver for RunMetrics {
    fn attempt(&self, model: &ModelConfig, duration: Duration, fault: Option<FaultKind>) {
        self.operation("chat", model, duration, fault);
    }
}

impl RunMetrics {
    /// One call of an embeddings model.
    pub(crate) fn embeddings(
        &self,
        model: &ModelConfig,
        duration: Duration,
        fault: Option<FaultKind>,
    ) {
        self.operation("embeddings", model, duration, fault);
    }

    fn operation(
        &self,
        operation: &'static str,
        model: &ModelConfig,
        duration: Duration,
        fault: Option<FaultKind>,
    ) {
        let mut attributes = model_attributes(model);
        attributes.push(KeyValue::new("gen_ai.operation.name", operation));
        if let Some(kind) = fault {
            attributes.push(KeyValue::new("error.type", kind.as_str()));
            self.errors.add(
                1,
                &[KeyValue::new("model", model.name.clone()), KeyValue::new("kind", kind.as_str())],
            );
        }
        self.duration.record(duration.as_secs_f64(), &attributes);
    }
}

/// Which model: the provider, its model id, and the `[[models]]` name.
fn model_attributes(model: &ModelConfig) -> Vec<KeyValue> {
    vec![
        KeyValue::new("gen_ai.provider.name", model.provider.as_str()),
        KeyValue::new("gen_ai.request.model", model.model.clone()),
        KeyValue::new("model", model.name.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::{
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
        data::{AggregatedMetrics, MetricData},
    };

    use super::*;
    use crate::model::Provider;

    /// Each data point of `name`: its attributes and its value (a sum, or a
    /// histogram's count).
    fn points(
        exporter: &InMemoryMetricExporter,
        name: &str,
    ) -> Vec<(BTreeMap<String, String>, f64)> {
        let mut found: Vec<(BTreeMap<String, String>, f64)> = Vec::new();
        for resource in exporter.get_finished_metrics().unwrap() {
            for scope in resource.scope_metrics() {
                for metric in scope.metrics().filter(|m| m.name() == name) {
                    let attrs =
                        |kv: &mut dyn Iterator<Item = &KeyValue>| -> BTreeMap<String, String> {
                            kv.map(|kv| (kv.key.to_string(), kv.value.to_string())).collect()
                        };
                    match metric.data() {
                        AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                            for p in sum.data_points() {
                                #[expect(
                                    clippy::cast_precision_loss,
                                    reason = "small test counts"
                                )]
                                found.push((attrs(&mut p.attributes()), p.value() as f64));
                            }
                        }
                        AggregatedMetrics::I64(MetricData::Sum(sum)) => {
                            for p in sum.data_points() {
                                #[expect(
                                    clippy::cast_precision_loss,
                                    reason = "small test counts"
                                )]
                                found.push((attrs(&mut p.attributes()), p.value() as f64));
                            }
                        }
                        AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                            for p in h.data_points() {
                                #[expect(
                                    clippy::cast_precision_loss,
                                    reason = "small test counts"
                                )]
                                found.push((attrs(&mut p.attributes()), p.sum() as f64));
                            }
                        }
                        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                            for p in h.data_points() {
                                #[expect(
                                    clippy::cast_precision_loss,
                                    reason = "small test counts"
                                )]
                                found.push((attrs(&mut p.attributes()), p.count() as f64));
                            }
                        }
                        _ => panic!("{name}: unexpected kind"),
                    }
                }
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn runs_steps_model_calls_and_tokens_are_recorded() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let metrics = RunMetrics::new(&provider.meter("foldgate"));
        let model: ModelConfig = serde_json::from_value(serde_json::json!({
            "name": "default", "provider": "anthropic", "base_url": "http://127.0.0.1:1/v1",
            "model": "m", "api_key": "k",
        }))
        .unwrap();
        assert_eq!(model.provider, Provider::Anthropic);
        metrics.working(1);
        metrics.attempt(&model, Duration::from_millis(20), Some(FaultKind::RateLimited));
        metrics.attempt(&model, Duration::from_millis(30), None);
        metrics.billed("acme", &model, 1_000, 50, Purpose::Run);
        metrics.billed("acme", &model, 200, 30, Purpose::Run);
        metrics.billed("acme", &model, 300, 40, Purpose::Distill);
        metrics.step("default", "model");
        metrics.step("default", "tool");
        metrics.ended("acme", "default", "completed");
        metrics.working(-1);
        provider.force_flush().unwrap();

        let call = [
            ("gen_ai.provider.name", "anthropic"),
            ("gen_ai.request.model", "m"),
            ("model", "default"),
            ("gen_ai.operation.name", "chat"),
        ];
        let mut failed = attrs(&call);
        failed.insert("error.type".into(), "rate_limited".into());
        let mut expected = vec![(attrs(&call), 1.0), (failed, 1.0)];
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(points(&exporter, "gen_ai.client.operation.duration"), expected);
        assert_eq!(
            points(&exporter, "foldgate.model.errors"),
            [(attrs(&[("kind", "rate_limited"), ("model", "default")]), 1.0)]
        );
        let tokens = |kind, purpose| {
            attrs(&[
                ("gen_ai.provider.name", "anthropic"),
                ("gen_ai.request.model", "m"),
                ("model", "default"),
                ("gen_ai.token.type", kind),
                ("purpose", purpose),
                ("tenant", "acme"),
            ])
        };
        assert_eq!(
            points(&exporter, "gen_ai.client.token.usage"),
            [
                (tokens("input", "distill"), 300.0),
                (tokens("input", "run"), 1_200.0),
                (tokens("output", "distill"), 40.0),
                (tokens("output", "run"), 80.0)
            ]
        );
        assert_eq!(
            points(&exporter, "foldgate.run.steps"),
            [
                (attrs(&[("kind", "model"), ("model", "default")]), 1.0),
                (attrs(&[("kind", "tool"), ("model", "default")]), 1.0)
            ]
        );
        assert_eq!(
            points(&exporter, "foldgate.run.runs"),
            [(attrs(&[("model", "default"), ("status", "completed"), ("tenant", "acme")]), 1.0)]
        );
        assert_eq!(points(&exporter, "foldgate.run.active"), [(attrs(&[]), 0.0)]);
    }
}
