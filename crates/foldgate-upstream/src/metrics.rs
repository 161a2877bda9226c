//! What the gateway sends to upstream servers and what passes through them,
//! named and attributed as the OpenTelemetry semantic conventions for MCP
//! prescribe.

use std::{sync::Arc, time::Duration};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, Meter, MeterProvider as _, noop::NoopMeterProvider},
};

use crate::Upstreams;

/// Bucket boundaries (seconds) for MCP operations, as the MCP semantic
/// conventions recommend.
pub const MCP_BUCKETS: [f64; 14] =
    [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// `error.type` and method values outside a known set.
pub const OTHER: &str = "_OTHER";

/// `error.type` of a JSON-RPC error code: the code as text when it is one
/// of JSON-RPC's reserved codes (-32768 to -32000, which include the
/// gateway's own), [`OTHER`] otherwise, so that an upstream inventing codes
/// cannot create series.
pub fn rpc_error_type(code: i64) -> String {
    if (-32768..=-32000).contains(&code) { code.to_string() } else { OTHER.to_owned() }
}

/// What the gateway sends to upstream servers and what passes through
/// them. `upstream` and tool names come from the configuration and the
/// upstreams' own tool lists, never from a client.
///
/// - `mcp.client.operation.duration` (histogram, seconds): each request
///   to an upstream, from sending to the answer: `tools/call` (with
///   `gen_ai.tool.name`, the upstream's own name for the tool) and the
///   background `tools/list` refresh (all pages of one listing), with
///   `upstream` and, on failure, `error.type`.
/// - `foldgate.upstream.tokens{tenant, upstream, direction}`: tokens of
///   upstream calls as the gateway metered them, arguments (`in`) and
///   results as the agent received them (`out`), inside branches or not.
/// - `foldgate.upstream.calls_outside_branches{tenant, upstream}`: upstream
///   calls that belonged to no branch, so were charged to no budget.
///
/// The two counters start at zero for each tenant the process knows and
/// each upstream serving it ([`UpstreamMetrics::start_tenant`]).
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    operation_duration: Histogram<f64>,
    tokens: Counter<u64>,
    outside_branches: Counter<u64>,
}

impl UpstreamMetrics {
    pub fn new(meter: &Meter) -> Self {
        Self {
            operation_duration: meter
                .f64_histogram("mcp.client.operation.duration")
                .with_description("Duration of MCP requests the gateway sent to upstream servers")
                .with_unit("s")
                .with_boundaries(MCP_BUCKETS.to_vec())
                .build(),
            tokens: meter
                .u64_counter("foldgate.upstream.tokens")
                .with_description(
                    "Tokens of upstream tool calls as the gateway metered them: arguments (in) \
                     and results as the agent received them (out)",
                )
                .with_unit("{token}")
                .build(),
            outside_branches: meter
                .u64_counter("foldgate.upstream.calls_outside_branches")
                .with_description(
                    "Upstream tool calls that belonged to no branch (charged to no budget)",
                )
                .with_unit("{call}")
                .build(),
        }
    }

    /// Instruments that record nothing.
    pub fn noop() -> Self {
        Self::new(&NoopMeterProvider::new().meter("foldgate"))
    }

    /// Records one `tools/call` sent to `upstream` (over stdio if `stdio`,
    /// else over HTTP). `error_type` is `None`
    /// on success; otherwise `"tool_error"` for a result with `isError`,
    /// the JSON-RPC error code (see [`rpc_error_type`]), or
    /// `"upstream_unavailable"` when no answer came.
    pub fn record_call(
        &self,
        upstream: &str,
        stdio: bool,
        tool: &str,
        duration: Duration,
        error_type: Option<&str>,
    ) {
        let mut attributes = client_attributes("tools/call", upstream, stdio, error_type);
        attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
        attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        self.operation_duration.record(duration.as_secs_f64(), &attributes);
    }

    /// Records one listing of `upstream`'s tools (every page of it).
    pub fn record_listing(
        &self,
        upstream: &str,
        stdio: bool,
        duration: Duration,
        error_type: Option<&str>,
    ) {
        let attributes = client_attributes("tools/list", upstream, stdio, error_type);
        self.operation_duration.record(duration.as_secs_f64(), &attributes);
    }

    /// Counts the tokens the gateway metered for one upstream call.
    pub fn record_tokens(&self, tenant: &str, upstream: &str, tokens_in: u64, tokens_out: u64) {
        for (direction, tokens) in [(IN, tokens_in), (OUT, tokens_out)] {
            if tokens > 0 {
                self.tokens.add(tokens, &token_labels(tenant, upstream, direction));
            }
        }
    }

    /// Counts an upstream call that belonged to no branch.
    pub fn record_outside_branches(&self, tenant: &str, upstream: &str) {
        self.outside_branches.add(1, &outside_labels(tenant, upstream));
    }

    /// Starts the counts of `tenant`'s calls to `upstream` at zero.
    pub fn start_tenant(&self, tenant: &str, upstream: &str) {
        for direction in [IN, OUT] {
            self.tokens.add(0, &token_labels(tenant, upstream, direction));
        }
        self.outside_branches.add(0, &outside_labels(tenant, upstream));
    }
}

/// `direction` of the tokens of arguments and of results.
const IN: &str = "in";
const OUT: &str = "out";

fn token_labels(tenant: &str, upstream: &str, direction: &'static str) -> [KeyValue; 3] {
    [
        KeyValue::new("tenant", tenant.to_owned()),
        KeyValue::new("upstream", upstream.to_owned()),
        KeyValue::new("direction", direction),
    ]
}

fn outside_labels(tenant: &str, upstream: &str) -> [KeyValue; 2] {
    [KeyValue::new("tenant", tenant.to_owned()), KeyValue::new("upstream", upstream.to_owned())]
}

fn client_attributes(
    method: &'static str,
    upstream: &str,
    stdio: bool,
    error: Option<&str>,
) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("mcp.method.name", method),
        KeyValue::new("upstream", upstream.to_owned()),
    ];
    if stdio {
        attributes.push(KeyValue::new("network.transport", "pipe"));
    } else {
        attributes.push(KeyValue::new("network.transport", "tcp"));
        attributes.push(KeyValue::new("network.protocol.name", "http"));
    }
    if let Some(error) = error {
        attributes.push(KeyValue::new("error.type", error.to_owned()));
    }
    attributes
}

/// Registers the upstream health gauges, read from
/// [`Upstreams::health`] at each collection:
/// `foldgate.upstream.up{upstream}` (1 when the upstream answered its last
/// listing or call, 0 otherwise), `foldgate.upstream.tools{upstream}`
/// (the tools it offers agents, after the allow-list) and, for stdio
/// upstreams, `foldgate.upstream.processes{upstream}` (their processes
/// running now, every tenant's and the one listing tools). The gauges keep the
/// upstreams for as long as the meter provider lives, so that the last
/// export, at shutdown, still reports them.
pub fn observe_upstreams(meter: &Meter, upstreams: &Arc<Upstreams>) {
    let health = Arc::clone(upstreams);
    meter
        .u64_observable_gauge("foldgate.upstream.up")
        .with_description(
            "Whether an upstream answered its last tool listing or call (1) or not (0)",
        )
        // No unit: a 0/1 state, which unit `1` would expose as `_ratio`.
        .with_callback(move |observer| {
            for (name, up, _, _) in health.health() {
                observer.observe(u64::from(up), &[KeyValue::new("upstream", name)]);
            }
        })
        .build();
    let health = Arc::clone(upstreams);
    meter
        .u64_observable_gauge("foldgate.upstream.tools")
        .with_description(
            "Tools an upstream offers agents (its last listing, after the allow-list)",
        )
        .with_unit("{tool}")
        .with_callback(move |observer| {
            for (name, _, tools, _) in health.health() {
                observer.observe(
                    u64::try_from(tools).unwrap_or(u64::MAX),
                    &[KeyValue::new("upstream", name)],
                );
            }
        })
        .build();
    let processes = Arc::clone(upstreams);
    meter
        .u64_observable_gauge("foldgate.upstream.processes")
        .with_description("Processes of a stdio upstream running now")
        .with_unit("{process}")
        .with_callback(move |observer| {
            for (name, live) in processes.processes() {
                observer.observe(
                    u64::try_from(live).unwrap_or(u64::MAX),
                    &[KeyValue::new("upstream", name)],
                );
            }
        })
        .build();
}
