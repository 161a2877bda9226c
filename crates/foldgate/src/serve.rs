//! `foldgate serve`: wires the store, the engine, the supervisor and the
//! HTTP application together, and takes them down in order.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use foldgate_api::metrics::{self, ApiMetrics};
use foldgate_api::{
    Gateway,
    auth::{self, AuthState, Authenticator, Secret},
    upstream::{Upstreams, identity::Signer},
};
use foldgate_background::{BackgroundTask as _, Driver, StopOrder};
use foldgate_engine::{
    Clock, EngineMetrics, FoldingService, MemoryBank, MemoryMetrics, StoreGauges, SystemClock,
    TokenCounter, scrubber_from_config, supervisor,
};
use foldgate_store::Backend;
use foldgate_telemetry::Telemetry;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    background,
    config::{AuthMode, Config},
    http::{self, ServerSettings},
};
use foldgate_domain::{Subject, TenantId};

/// What the zero-configuration mode prints: a token for trying the gateway.
#[derive(Debug, Clone)]
pub struct DevToken {
    pub token: String,
    /// The generated signing secret, to mint more with `foldgate token`.
    pub secret: String,
}

/// A running gateway.
#[derive(Debug)]
pub struct Running {
    /// The MCP endpoint's URL.
    pub mcp_url: String,
    pub addr: SocketAddr,
    pub ops_addr: SocketAddr,
    /// Set when no key was configured and one was generated.
    pub dev_token: Option<DevToken>,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Asks the gateway to stop (as SIGTERM does) and waits until it has.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await.context("the gateway task failed")?
    }

    /// Waits until the gateway stops (after `shutdown` is cancelled).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("the gateway task failed")?
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// Development tokens live this long.
const DEV_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

/// Starts the gateway on the given listeners, recording metrics and spans
/// into `telemetry`, which it shuts down (flushing it) when it stops.
pub async fn start(
    mut config: Config,
    listener: TcpListener,
    ops_listener: TcpListener,
    telemetry: Telemetry,
) -> anyhow::Result<Running> {
    let meter = telemetry.meter();
    let addr = listener.local_addr()?;
    let ops_addr = ops_listener.local_addr()?;
    let mcp_url = config.api.public_url.clone().unwrap_or_else(|| format!("http://{addr}/mcp"));
    // Before a development secret is made up below: sign-in at a provider
    // needs the provider's keys.
    let console_sign_in = config.console_sign_in().map_err(anyhow::Error::msg)?;

    // The embedded database belongs to this process alone: keep its schema
    // current. Postgres is migrated by `foldgate migrate` (or `--migrate`).
    let backend = Backend::of_url(config.database_url.expose())?;
    let migrate = config.migrate || backend == Backend::Sqlite;
    let shown = config.database_url.to_string();
    let options = config.connect_options();
    let store = foldgate_store::connect_with_meter(&options, migrate, &meter)
        .await
        .with_context(|| format!("connecting to {shown}"))?;
    store.ready().await.with_context(|| format!("checking {shown}"))?;
    // Every background task is registered here and started once the
    // application is built; see `background.rs` for the stop order.
    let mut driver = Driver::new(&meter);
    let engine_metrics = EngineMetrics::new(&meter);
    let tenant_series = Arc::clone(engine_metrics.tenants());
    let mut gauges = StoreGauges::new(&meter, Arc::clone(&store), Arc::clone(&tenant_series));
    // A first reading before anything is served: every tenant the database
    // knows has its series, at zero, from the start. A failure is logged
    // and left to the next reading.
    gauges.activate().await;

    let tokens = TokenCounter::new(config.folding.encoding).map_err(anyhow::Error::msg)?;
    let scrubber = scrubber_from_config(&config.scrub).context("loading secret-scrubbing rules")?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut service = FoldingService::new(
        Arc::clone(&store),
        tokens.clone(),
        Arc::clone(&scrubber),
        Arc::clone(&clock),
        config.folding.clone(),
    )
    .with_metrics(engine_metrics);
    // Nothing is contacted here; the memory ranks with the embeddings
    // models among them.
    let models = foldgate_runner::Models::new(&config.models, |var| std::env::var(var).ok())
        .map_err(anyhow::Error::msg)?;
    let run_metrics = foldgate_runner::RunMetrics::new(&meter);
    if config.memory.enabled {
        let screen = config.memory.screen().context("loading the memory's injection screen")?;
        let bank = MemoryBank::new(
            Arc::clone(&store),
            scrubber,
            screen,
            tokens,
            clock,
            config.memory.clone(),
        )
        .with_metrics(MemoryMetrics::new(&meter));
        let bank = match models.embedder(run_metrics.clone()) {
            Some(embedder) => bank.with_embedder(embedder),
            None => bank,
        };
        let bank = Arc::new(bank);
        background::register_memory_tasks(&mut driver, &bank);
        service = service.with_memory(bank);
    }
    let service = Arc::new(service);

    let metadata_url = auth::resource_metadata_url(&mcp_url).map_err(anyhow::Error::msg)?;
    let mut dev_token = None;
    let auth_state = match config.auth_mode {
        AuthMode::None => AuthState::new(auth::AuthMode::None, metadata_url.clone()),
        AuthMode::Jwt => {
            if !config.has_key_source() {
                let secret = generated_secret();
                config.auth.jwt_secret = Some(Secret::new(secret.clone()));
                let token = auth::mint_hs256(
                    &Secret::new(secret.clone()),
                    &TenantId::parse("dev")?,
                    &Subject::parse("developer")?,
                    auth::EVERY_SCOPE,
                    DEV_TOKEN_TTL,
                    config.auth.issuer.as_deref(),
                    Some(config.auth.audience.as_deref().unwrap_or(&mcp_url)),
                )?;
                dev_token = Some(DevToken { token, secret });
            }
            if config.auth.issuers.is_empty() {
                if config.auth.audience.is_none() {
                    config.auth.audience = Some(mcp_url.clone());
                }
            } else {
                for issuer in &mut config.auth.issuers {
                    if issuer.audience.is_none() {
                        issuer.audience = Some(mcp_url.clone());
                    }
                }
            }
            let authenticator =
                Authenticator::new(&config.auth).await.context("setting up authentication")?;
            authenticator.register(&mut driver);
            AuthState::new(auth::AuthMode::Jwt(authenticator), metadata_url.clone())
        }
    };

    let shutdown = CancellationToken::new();
    let api_metrics = ApiMetrics::new(&meter);
    let signer =
        Arc::new(Signer::load(&config.identity).map_err(|e| anyhow::anyhow!("[identity] {e}"))?);
    let upstreams = Upstreams::new(
        &config.upstreams,
        |var| std::env::var(var).ok(),
        &api_metrics.upstream,
        Some(Arc::clone(&signer)),
    )
    .map_err(anyhow::Error::msg)?;
    upstreams.restrict_with(Arc::clone(service.tenant_rules()));
    upstreams.start_series(&tenant_series);
    metrics::observe_upstreams(&meter, &upstreams);
    upstreams.register(&mut driver);
    let upstream_processes = Arc::clone(&upstreams);
    // Stopped after the servers, so that runs whose callers are still
    // waiting go on during the grace period; then each run gives its lease
    // up, for another replica to take it over at once.
    let runs_stop = CancellationToken::new();
    let runner = foldgate_runner::Runner::new(
        Arc::clone(&service),
        Arc::clone(&upstreams),
        models,
        config.runner,
        run_metrics,
        runs_stop.clone(),
    );
    runner.register(&mut driver);
    runner.register_distiller(&mut driver);
    background::register_store_tasks(
        &mut driver,
        &service,
        gauges,
        config.telemetry.store_poll_interval,
    );
    supervisor::register(&mut driver, Arc::clone(&service), config.supervisor.clone());
    supervisor::register_retention(&mut driver, Arc::clone(&service), config.retention.clone());

    let app = foldgate_api::router(
        Gateway {
            service,
            upstreams,
            runner: Arc::clone(&runner),
            auth: auth_state,
            config: config.api.clone(),
            admin: config.admin.clone(),
            mcp_url: mcp_url.clone(),
            authorization_servers: config.auth.authorization_servers(),
            background: driver.board(),
            shutdown: shutdown.clone(),
            metrics: api_metrics,
            console_sign_in,
            signer,
        },
        &mut driver,
    )
    .map_err(anyhow::Error::msg)?;
    let ops_app =
        foldgate_api::ops_router(Arc::clone(&store), telemetry.prometheus(), driver.board());

    let mut background = driver.start();

    let grace = config.api.shutdown_grace;
    let server = ServerSettings { header_read_timeout: config.api.header_read_timeout };
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let mcp = http::serve(listener, app, server, shutdown.clone());
            let ops = http::serve(ops_listener, ops_app, server, shutdown.clone());
            let servers = async { tokio::try_join!(mcp, ops) };
            tokio::pin!(servers);
            let served = tokio::select! {
                r = &mut servers => r.map(|_| ()),
                () = shutdown.cancelled() => {
                    // Stop accepting; give in-flight requests `grace` to finish.
                    match tokio::time::timeout(grace, &mut servers).await {
                        Ok(r) => r.map(|_| ()),
                        Err(_) => {
                            tracing::warn!(?grace, "in-flight requests did not finish in time");
                            Ok(())
                        }
                    }
                }
            };
            // The tasks serving requests and the runner's reconcilers stop
            // first, then each run gives its lease up.
            background.stop_through(StopOrder::RUNS).await;
            runs_stop.cancel();
            runner.stopped().await;
            // The runs are done with the upstreams: their stdio processes stop.
            upstream_processes.stop_processes().await;
            // The supervisor, then the usage flusher's last pass (what the
            // calls of the grace period added), then the gauges.
            background.shutdown().await;
            store.close().await;
            tracing::info!("stopped");
            // Last: what the shutdown itself recorded is exported too.
            let flushed = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
            if let Ok(Err(e)) = flushed {
                tracing::warn!(error = %e, "telemetry was not fully exported");
            }
            served.context("serving HTTP")
        }
    });
    tracing::info!(%mcp_url, ops = %ops_addr, database = %shown, "foldgate is serving");
    Ok(Running { mcp_url, addr, ops_addr, dev_token, shutdown, task })
}

/// A random signing secret for development mode.
fn generated_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}
