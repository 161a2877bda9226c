//! The command line: `serve`, `migrate`, `token`, `check-config` and `memory`.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use foldgate_telemetry::{LogFormat, OtelSettings, Telemetry};

use crate::{
    check,
    config::{AuthMode, Config, telemetry_from_env},
    memory_cli::MemoryCommand,
    serve,
};

/// A multi-tenant MCP gateway for context folding.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway. With no configuration: SQLite in ./foldgate.db, a
    /// generated signing secret, and a development token printed.
    Serve {
        /// Address of the MCP listener [default: 127.0.0.1:8080].
        #[arg(long, env = "FOLDGATE_LISTEN")]
        listen: Option<String>,
        /// Address of the operations listener (probes, /metrics) [default: 127.0.0.1:9090].
        #[arg(long, env = "FOLDGATE_OPS_LISTEN")]
        ops_listen: Option<String>,
        /// The database: postgres://… or sqlite://PATH [default: sqlite://foldgate.db].
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        /// Apply pending migrations first (always done for SQLite).
        #[arg(long)]
        migrate: bool,
        /// `jwt` (default) or `none` (no authentication; loopback only).
        #[arg(long, value_enum)]
        auth: Option<AuthMode>,
        /// A TOML configuration file (see docs/configuration.md).
        #[arg(long, env = "FOLDGATE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Apply pending database migrations, then exit. Reads the database
    /// settings as `serve` does: the flag, then the environment, then the
    /// configuration file.
    Migrate {
        /// The database: `postgres://…` or `sqlite://PATH` (created if missing)
        /// [default: the configuration's `database_url`, else sqlite://foldgate.db].
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        /// A TOML configuration file (see docs/configuration.md).
        #[arg(long, env = "FOLDGATE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Mint a token signed with FOLDGATE_JWT_SECRET; prints it alone.
    Token {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        sub: String,
        /// Space-separated scopes.
        #[arg(long, default_value = "fold:read fold:write memory:read memory:write")]
        scope: String,
        /// Lifetime, e.g. 30m, 1h, 7d.
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: Duration,
        /// A TOML configuration file, for the issuer and audience.
        #[arg(long, env = "FOLDGATE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Check a configuration (file and environment) as `serve` would at
    /// startup, and exit: non-zero, naming what is wrong, if it would not
    /// start.
    CheckConfig {
        #[arg(long, env = "FOLDGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Also reach the database (checking its schema) and fetch the JWKS.
        #[arg(long)]
        connect: bool,
    },
    /// List or delete a tenant's lessons in the reasoning memory.
    #[command(subcommand)]
    Memory(MemoryCommand),
}

fn parse_ttl(raw: &str) -> Result<Duration, String> {
    let (number, unit) = raw.split_at(raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len()));
    let n: u64 = number.parse().map_err(|_| format!("{raw:?}: expected e.g. 30m, 1h, 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("{raw:?}: unit must be s, m, h or d")),
    };
    if secs == 0 {
        return Err("the lifetime must be positive".into());
    }
    Ok(Duration::from_secs(secs))
}

/// Logs only, for the commands that export no telemetry.
fn init_logs(format: LogFormat) -> anyhow::Result<()> {
    foldgate_telemetry::install(&Telemetry::disabled(), format, false)?;
    Ok(())
}

/// The telemetry the `OTEL_*` variables ask for.
fn otel_settings() -> anyhow::Result<OtelSettings> {
    Ok(OtelSettings::from_env(std::env::vars())?)
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { listen, ops_listen, database_url, migrate, auth, config } => {
            let mut env: Vec<(String, String)> = std::env::vars().collect();
            // Flags win over the environment and the file.
            let flags = [
                ("FOLDGATE_LISTEN", listen),
                ("FOLDGATE_OPS_LISTEN", ops_listen),
                ("DATABASE_URL", database_url),
                ("FOLDGATE_MIGRATE", migrate.then(|| "true".to_owned())),
                (
                    "FOLDGATE_AUTH_MODE",
                    auth.map(|a| if a == AuthMode::None { "none" } else { "jwt" }.to_owned()),
                ),
            ];
            env.extend(flags.into_iter().filter_map(|(k, v)| Some((k.to_owned(), v?))));
            let config = Config::load(config.as_deref(), env).map_err(anyhow::Error::msg)?;
            let telemetry = Telemetry::new(&otel_settings()?).context("setting up telemetry")?;
            foldgate_telemetry::install(
                &telemetry,
                config.telemetry.log_format,
                config.telemetry.access_log,
            )?;
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("listening on {}", config.listen))?;
            let ops_listener = tokio::net::TcpListener::bind(config.ops_listen)
                .await
                .with_context(|| format!("listening on {}", config.ops_listen))?;
            // Installed before anything is announced, so that a SIGTERM sent
            // as soon as the gateway is up stops it gracefully.
            let signals = shutdown_signal()?;
            let running = serve::start(config, listener, ops_listener, telemetry).await?;
            println!("foldgate is serving MCP at {}", running.mcp_url);
            if let Some(dev) = &running.dev_token {
                println!("development token (tenant \"dev\", expires in 24 h):");
                println!("{}", dev.token);
                println!("to mint more while this process runs:");
                println!(
                    "  FOLDGATE_JWT_SECRET={} FOLDGATE_LISTEN={} foldgate token --tenant T --sub S",
                    dev.secret, running.addr
                );
            }
            let shutdown = running.shutdown_token();
            tokio::spawn(async move {
                signals.await;
                tracing::info!("shutting down");
                shutdown.cancel();
            });
            running.wait().await?;
        }
        Command::Migrate { database_url, config } => {
            let mut env: Vec<(String, String)> = std::env::vars().collect();
            // The flag wins over the environment and the file.
            env.extend(database_url.map(|url| ("DATABASE_URL".to_owned(), url)));
            let config = Config::read(config.as_deref(), env).map_err(anyhow::Error::msg)?;
            init_logs(config.telemetry.log_format)?;
            let shown = config.database_url.to_string();
            foldgate_store::migrate(&config.connect_options())
                .await
                .with_context(|| format!("migrating {shown}"))?;
            tracing::info!(database = %shown, "database is migrated");
        }
        Command::Token { tenant, sub, scope, ttl, config } => {
            let config =
                Config::load(config.as_deref(), std::env::vars()).map_err(anyhow::Error::msg)?;
            init_logs(config.telemetry.log_format)?;
            let secret = config
                .auth
                .jwt_secret
                .as_ref()
                .context("FOLDGATE_JWT_SECRET (or auth.jwt_secret) is not set")?;
            let audience = config.auth.audience.clone().or_else(|| {
                Some(
                    config
                        .api
                        .public_url
                        .clone()
                        .unwrap_or_else(|| format!("http://{}/mcp", config.listen)),
                )
            });
            let scopes: Vec<&str> = scope.split_whitespace().collect();
            let tenant = foldgate_domain::TenantId::parse(&tenant)?;
            let sub = foldgate_domain::Subject::parse(&sub)?;
            let token = foldgate_api::auth::mint_hs256(
                secret,
                &tenant,
                &sub,
                scopes,
                ttl,
                config.auth.issuer.as_deref(),
                audience.as_deref(),
            )?;
            println!("{token}");
        }
        Command::CheckConfig { config, connect } => {
            let config =
                Config::load(config.as_deref(), std::env::vars()).map_err(anyhow::Error::msg)?;
            otel_settings()?;
            let checked = check::deep_check(&config, connect).await?;
            println!("configuration is valid (database {})", config.database_url);
            for line in checked {
                println!("{line}");
            }
            println!("{}", check::describe_upstreams(&config));
            println!("{}", check::describe_models(&config));
            println!("{}", check::describe_console(&config));
        }
        Command::Memory(command) => {
            init_logs(
                telemetry_from_env(std::env::vars()).map_err(anyhow::Error::msg)?.log_format,
            )?;
            command.run().await?;
        }
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C. The handlers are registered when this is
/// called, not when the future is first polled.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    #[cfg(unix)]
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("installing the SIGINT handler")?;
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    })
}
