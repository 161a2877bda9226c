//! The engine's metric instruments, built from an injected meter so that
//! the process decides where metrics go (OTLP, Prometheus, or nowhere).

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Meter, MeterProvider, noop::NoopMeterProvider},
};

/// Instruments the engine records into.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    /// `foldgate.secrets.redacted{rule}`: values redacted from returned
    /// messages, by the rule that found them.
    secrets_redacted: Counter<u64>,
}

impl EngineMetrics {
    pub fn new(meter: &Meter) -> Self {
        Self {
            secrets_redacted: meter
                .u64_counter("foldgate.secrets.redacted")
                .with_description("Secret values redacted from branch results, by rule")
                .with_unit("{secret}")
                .build(),
        }
    }

    /// Instruments that record nothing.
    pub fn noop() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }

    pub(crate) fn redacted(&self, by_rule: &[(String, u64)]) {
        for (rule, count) in by_rule {
            self.secrets_redacted.add(*count, &[KeyValue::new("rule", rule.clone())]);
        }
    }
}
