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

/// The runner's instruments. Cheap to clone.
///
/// - `foldgate.run.runs{tenant, model, status}`: runs that ended, by the
///   branch's final status.
/// - `foldgate.run.active`: runs being worked on by this replica.
/// - `foldgate.run.steps{model, kind}`: steps written (`model`, `tool`).
/// - `gen_ai.client.operation.duration{gen_ai.provider.name,
///   gen_ai.request.model, error.type}` (seconds): each attempt of a model
///   call.
/// - `gen_ai.client.token.usage{tenant, gen_ai.request.model,
///   gen_ai.token.type}`: tokens the provider billed (`input`, `output`).
/// - `foldgate.model.errors{model, kind}`: failed attempts by kind
///   (`rate_limited`, `server_error`, `timeout`, `unreachable`,
///   `malformed_answer`, `refused`).
#[derive(Debug, Clone)]
pub struct RunMetrics {
    runs: Counter<u64>,
    active: UpDownCounter<i64>,
    steps: Counter<u64>,
    duration: Histogram<f64>,
    tokens: Counter<u64>,
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
                .u64_counter("gen_ai.client.token.usage")
                .with_description("Tokens model providers billed for gateway-run branches")
                .with_unit("{token}")
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

    pub(crate) fn billed(&self, tenant: &str, model: &str, input: u64, output: u64) {
        for (kind, tokens) in [("input", input), ("output", output)] {
            self.tokens.add(
                tokens,
                &[
                    KeyValue::new("tenant", tenant.to_owned()),
                    KeyValue::new("gen_ai.request.model", model.to_owned()),
                    KeyValue::new("gen_ai.token.type", kind),
                ],
            );
        }
    }
}

impl AttemptObserver for RunMetrics {
    fn attempt(&self, model: &ModelConfig, duration: Duration, fault: Option<FaultKind>) {
        let mut attributes = vec![
            KeyValue::new("gen_ai.provider.name", model.provider.as_str()),
            KeyValue::new("gen_ai.request.model", model.name.clone()),
            KeyValue::new("gen_ai.operation.name", "chat"),
        ];
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
