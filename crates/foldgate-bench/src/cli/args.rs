//! The command line's arguments, per command.

use super::*;

/// Which gateway to load.
#[derive(Debug, Args)]
pub(super) struct GatewayArgs {
    /// MCP URL of a running gateway. Repeat for several replicas; agents
    /// spread their requests over them (see --balance).
    #[arg(long = "url", value_name = "URL")]
    pub(super) urls: Vec<String>,
    /// Start `foldgate serve` from this binary (on a free loopback port, with
    /// limits high enough to measure speed) instead of using --url.
    #[arg(long, value_name = "PATH", conflicts_with = "urls")]
    pub(super) spawn_gateway: Option<PathBuf>,
    /// The database of the started gateway; for `deadlines`, also the one
    /// checked (Postgres).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(super) database_url: Option<String>,
    /// A configuration file for the started gateway instead of the bench's
    /// own (which raises the rate and branch limits).
    #[arg(long, value_name = "FILE", requires = "spawn_gateway")]
    pub(super) gateway_config: Option<PathBuf>,
    /// Where the started gateway's log goes.
    #[arg(long, value_name = "FILE", requires = "spawn_gateway")]
    pub(super) gateway_log: Option<PathBuf>,
    /// The gateway's HS256 secret; agents mint their tokens with it. A
    /// started gateway gets a random one by default.
    #[arg(long, env = "FOLDGATE_JWT_SECRET", hide_env_values = true)]
    pub(super) jwt_secret: Option<String>,
    /// Token audience (default: each URL, the gateway's default audience).
    #[arg(long)]
    pub(super) audience: Option<String>,
    /// Agents are spread over this many tenants (one subject each).
    #[arg(long, default_value_t = 4)]
    pub(super) tenants: usize,
    /// PID of a gateway given by --url, to sample its memory and sockets.
    #[arg(long)]
    pub(super) pid: Option<u32>,
}

/// What the agents do.
#[derive(Debug, Args)]
pub(super) struct LoadArgs {
    #[arg(long, value_enum, default_value_t = Mode::Fold)]
    pub(super) mode: Mode,
    /// Concurrent agents.
    #[arg(long, default_value_t = 16)]
    pub(super) agents: usize,
    /// Measured time (after --warmup); ignored with --count.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(super) duration: Duration,
    /// Stop after this many fold cycles (fold mode) or calls (other modes).
    #[arg(long)]
    pub(super) count: Option<u64>,
    /// Calls in this first period are made but not counted.
    #[arg(long, value_parser = parse_duration)]
    pub(super) warmup: Option<Duration>,
    /// How requests spread over several --url.
    #[arg(long, value_enum, default_value_t = Balance::Request)]
    pub(super) balance: Balance,
    /// `timeout_seconds` of the branches agents open.
    #[arg(long, default_value_t = 60)]
    pub(super) branch_timeout: u32,
    /// Fold cycles per session before it is ended and a new one begins.
    #[arg(long, default_value_t = 10)]
    pub(super) cycles_per_session: u32,
    /// Every n-th fold cycle leaves its two branches for the supervisor.
    #[arg(long)]
    pub(super) abandon_every: Option<u32>,
    /// Upstream whose `echo` tool proxy mode calls (`<upstream>__echo`).
    #[arg(long, default_value = "echo")]
    pub(super) upstream: String,
    /// Proxied calls per branch before it is returned and a new one opened.
    #[arg(long, default_value_t = 50)]
    pub(super) calls_per_branch: u32,
    /// Longest time for one HTTP exchange.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(super) request_timeout: Duration,
    /// Pause after a connection failure or a 502/503.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub(super) error_backoff: Duration,
    /// Prefix of tenants and sessions (default: random).
    #[arg(long)]
    pub(super) run_id: Option<String>,
    /// Interval of throughput and resource samples.
    #[arg(long, value_parser = parse_duration)]
    pub(super) sample_interval: Option<Duration>,
    /// Print throughput at every sample.
    #[arg(long)]
    pub(super) progress: bool,
    /// Append every branch created and returned to this file (JSON lines),
    /// for `verify`.
    #[arg(long, value_name = "FILE")]
    pub(super) record: Option<PathBuf>,
    /// Before the clock starts, give each tenant this many trusted lessons
    /// that match the branches agents open, and open every branch with
    /// `inject_memories: true` (fold mode).
    #[arg(long, value_name = "LESSONS")]
    pub(super) inject_memories: Option<u32>,
}

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub(super) gateway: GatewayArgs,
    #[command(flatten)]
    pub(super) load: LoadArgs,
    /// Also start the baseline echo server (a separate process) and load it
    /// with the same agents, before the gateway, in each round.
    #[arg(long)]
    pub(super) baseline: bool,
    /// Load this running echo server as the baseline instead.
    #[arg(long, value_name = "URL", conflicts_with = "baseline")]
    pub(super) baseline_url: Option<String>,
    /// Alternate baseline and gateway this many times; figures add up.
    #[arg(long, default_value_t = 1)]
    pub(super) rounds: u32,
    /// Open loop at --rate for --duration, sampling the gateway's memory,
    /// descriptors and sockets; reports their drift after --soak-warmup.
    #[arg(long, requires = "rate")]
    pub(super) soak: bool,
    /// Calls per second of an open loop (all agents together).
    #[arg(long)]
    pub(super) rate: Option<f64>,
    /// Samples before this are left out of the drift.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(super) soak_warmup: Duration,
    /// Write the report here (JSON).
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
    /// Exit 2 if more than this many calls failed.
    #[arg(long)]
    pub(super) max_errors: Option<u64>,
}

#[derive(Debug, Args)]
pub(super) struct DeadlineArgs {
    #[command(flatten)]
    pub(super) gateway: GatewayArgs,
    /// Branches to create.
    #[arg(long, default_value_t = 10_000)]
    pub(super) branches: u64,
    /// Nested branches per session (at most the gateway's max_depth).
    #[arg(long, default_value_t = 1)]
    pub(super) chain: u32,
    /// `timeout_seconds` of every branch.
    #[arg(long, default_value_t = 60)]
    pub(super) timeout: u32,
    /// Concurrent creators.
    #[arg(long, default_value_t = 16)]
    pub(super) agents: usize,
    /// Latest a deadline may fire.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(super) max_late: Duration,
    /// Wait this long after the last deadline before checking.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(super) grace: Duration,
    /// Fail if the gateway's resident memory went above this (MiB).
    #[arg(long, default_value_t = 150)]
    pub(super) max_rss_mib: u64,
    #[arg(long)]
    pub(super) run_id: Option<String>,
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(super) struct RunsArgs {
    /// The gateway: --spawn-gateway is required (the bench writes its
    /// `[[models]]` and `[[upstreams]]`); without --database-url, a SQLite
    /// file in a temporary directory.
    #[command(flatten)]
    pub(super) gateway: GatewayArgs,
    /// Runs made one at a time, to measure the overhead per step (0: none).
    #[arg(long, default_value_t = 200)]
    pub(super) runs: usize,
    /// Runs made before those, not counted.
    #[arg(long, default_value_t = 5)]
    pub(super) warmup_runs: usize,
    /// Tool calls per run made one at a time; each makes a model step and a
    /// tool step, and a final model step ends the run.
    #[arg(long, default_value_t = 5)]
    pub(super) tool_calls: usize,
    /// Runs in flight at once, one level after the other: e.g.
    /// `50,200,1000`. None: no such level.
    #[arg(long, value_delimiter = ',')]
    pub(super) concurrent: Vec<usize>,
    /// Tool calls per run of the concurrent levels.
    #[arg(long, default_value_t = 2)]
    pub(super) concurrent_tool_calls: usize,
    /// How long each model answer takes in the concurrent levels.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(super) model_delay: Duration,
    /// Pause between two `branch_status` calls made while the concurrent
    /// runs work.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub(super) status_interval: Duration,
    /// The provider API the gateway speaks to the model server.
    #[arg(long, value_enum, default_value_t = ModelApi::Openai)]
    pub(super) provider: ModelApi,
    /// Ask the model server for streamed answers.
    #[arg(long)]
    pub(super) stream: bool,
    /// `timeout_seconds` of every run.
    #[arg(long, default_value_t = 120)]
    pub(super) run_timeout: u32,
    /// The started gateway's `database.max_connections` (default: the
    /// gateway's own, 10).
    #[arg(long)]
    pub(super) max_connections: Option<u32>,
    /// Prefix of tenants and sessions (default: random).
    #[arg(long)]
    pub(super) run_id: Option<String>,
    /// Write the report here (JSON).
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(super) struct VerifyArgs {
    /// The gateway's database (Postgres).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(super) database_url: String,
    /// The run id the load used (--run-id).
    #[arg(long)]
    pub(super) run_id: String,
    /// The load run's record (--record).
    #[arg(long, value_name = "FILE")]
    pub(super) record: Option<PathBuf>,
    /// Wait for branches whose deadline falls within this time to end
    /// (checking sooner if none is left).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(super) settle: Duration,
    /// Latest a deadline may fire while a gateway runs.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(super) max_late: Duration,
    /// A period with no gateway: START,END in Unix seconds (END = when the
    /// replacement was ready). Repeatable.
    #[arg(long, value_name = "START,END", value_parser = parse_outage)]
    pub(super) outage: Vec<(f64, f64)>,
    /// Latest a deadline that passed during an outage may fire after it.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(super) restart_slack: Duration,
    /// Gateway logs (JSON lines) to check for branches ended twice.
    #[arg(long = "log", value_name = "FILE")]
    pub(super) logs: Vec<PathBuf>,
    /// The database holds only this run: check the deployment counter too.
    #[arg(long)]
    pub(super) whole_database: bool,
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(super) struct SlowArgs {
    /// The gateway's MCP URL.
    #[arg(long)]
    pub(super) url: String,
    /// The gateway's process id (sampled).
    #[arg(long)]
    pub(super) pid: u32,
    #[arg(long, env = "FOLDGATE_JWT_SECRET", hide_env_values = true)]
    pub(super) jwt_secret: String,
    /// Token audience (default: the URL).
    #[arg(long)]
    pub(super) audience: Option<String>,
    #[arg(long, value_enum)]
    pub(super) kind: SlowKind,
    #[arg(long, default_value_t = 500)]
    pub(super) connections: usize,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(super) hold: Duration,
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
}
