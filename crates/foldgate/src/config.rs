//! The gateway's configuration: one struct, read from an optional TOML file
//! and then from the environment, checked before anything starts.
//!
//! Environment: the documented names (`FOLDGATE_LISTEN`, `DATABASE_URL`,
//! `FOLDGATE_JWT_SECRET`, …) and, for every other setting,
//! `FOLDGATE_<SECTION>__<FIELD>` (e.g. `FOLDGATE_FOLDING__MAX_DEPTH=4`,
//! `FOLDGATE_FOLDING__LIMITS__MAX_ACTIVE_PER_TENANT=200`).
//!
//! Settings renamed when durations took units (`auth.jwks_timeout_seconds`
//! became `auth.jwks_timeout`) keep their former names: the file's and the
//! environment's are put under the new name here, before anything is
//! read, so that a variable overrides the file whichever name each uses,
//! and a setting given under both names in one place is refused, naming
//! both.

use std::{net::SocketAddr, path::Path, time::Duration};

use foldgate_admin::AdminConfig;
use foldgate_api::{
    ApiConfig,
    auth::AuthConfig,
    upstream::{UpstreamConfig, expand_env, identity::IdentityConfig},
};
use foldgate_console::{ConsoleConfig, OidcSignIn, OidcToken};
use foldgate_domain::{
    ConfigError, TimeoutPolicy,
    duration::{self, Renamed},
    redact_urls_in,
};
use foldgate_engine::{FoldingConfig, MemoryConfig, RetentionConfig, SupervisorConfig};
use foldgate_runner::{ModelConfig, RunnerConfig};
use foldgate_scrub::ScrubConfig;
use foldgate_store::DatabaseUrl;
use foldgate_telemetry::TelemetryConfig;
use serde::Deserialize;
use toml::{Table, Value};

/// How requests are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// JWT bearer tokens (with no key configured, `serve` makes a development
    /// secret and prints a token).
    #[default]
    Jwt,
    /// No authentication: every caller is tenant `local`. Loopback only.
    None,
}

/// Database connection pool settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// Connections per process.
    pub max_connections: u32,
    /// How long a request waits for a connection before failing. A bare
    /// number counts seconds.
    #[serde(alias = "acquire_timeout_seconds", deserialize_with = "duration::seconds")]
    pub acquire_timeout: Duration,
    /// Whether the charge of an upstream call waits for Postgres to flush
    /// it to disk before the result is returned (see `docs/configuration.md`).
    pub synchronous_metering: bool,
}

/// A section's `Debug` form with the URLs in it redacted.
struct UrlsRedacted<'a, T>(&'a T);

impl<T: std::fmt::Debug> std::fmt::Debug for UrlsRedacted<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if f.alternate() { format!("{:#?}", self.0) } else { format!("{:?}", self.0) };
        f.write_str(&redact_urls_in(&shown))
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field, so that a new one cannot be left out.
        let Self {
            listen,
            ops_listen,
            database_url,
            database,
            migrate,
            auth_mode,
            auth,
            api,
            folding,
            supervisor,
            retention,
            admin,
            scrub,
            telemetry,
            upstreams,
            identity,
            models,
            runner,
            memory,
            console,
        } = self;
        f.debug_struct("Config")
            .field("listen", listen)
            .field("ops_listen", ops_listen)
            .field("database_url", database_url)
            .field("database", &UrlsRedacted(database))
            .field("migrate", migrate)
            .field("auth_mode", auth_mode)
            .field("auth", &UrlsRedacted(auth))
            .field("api", &UrlsRedacted(api))
            .field("folding", &UrlsRedacted(folding))
            .field("supervisor", &UrlsRedacted(supervisor))
            .field("retention", &UrlsRedacted(retention))
            .field("admin", &UrlsRedacted(admin))
            .field("scrub", &UrlsRedacted(scrub))
            .field("telemetry", &UrlsRedacted(telemetry))
            .field("upstreams", &UrlsRedacted(upstreams))
            .field("identity", identity)
            .field("models", &UrlsRedacted(models))
            .field("runner", &UrlsRedacted(runner))
            .field("memory", &UrlsRedacted(memory))
            .field("console", &UrlsRedacted(console))
            .finish()
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            synchronous_metering: false,
        }
    }
}

impl DatabaseConfig {
    /// The former names of its settings.
    pub const RENAMED: &'static [Renamed] =
        &[Renamed::new("acquire_timeout_seconds", "acquire_timeout")];
}

/// Every setting of `foldgate serve`. See `docs/configuration.md`. Its
/// `Debug` form shows every URL in it with its password (and secret query
/// parameters) redacted.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the MCP listener.
    pub listen: SocketAddr,
    /// Address of the operations listener (health probes, Prometheus `/metrics`).
    pub ops_listen: SocketAddr,
    /// `postgres://…` or `sqlite://PATH`; shown redacted.
    pub database_url: DatabaseUrl,
    pub database: DatabaseConfig,
    /// Apply pending migrations at startup.
    pub migrate: bool,
    pub auth_mode: AuthMode,
    pub auth: AuthConfig,
    pub api: ApiConfig,
    pub folding: FoldingConfig,
    pub supervisor: SupervisorConfig,
    /// How long what has ended is kept (`[retention]`).
    pub retention: RetentionConfig,
    /// The admin API (`[admin]`).
    pub admin: AdminConfig,
    pub scrub: ScrubConfig,
    /// Log format and metric collection (`[telemetry]`); where telemetry is
    /// exported is set by the standard `OTEL_*` variables.
    pub telemetry: TelemetryConfig,
    /// Upstream MCP servers whose tools agents reach through foldgate
    /// (`[[upstreams]]`, config file only).
    pub upstreams: Vec<UpstreamConfig>,
    /// The key that signs the tokens minted for upstreams with
    /// `identity = "token"` (`[identity]`).
    pub identity: IdentityConfig,
    /// Model providers that gateway-run branches (`branch_run`) run on
    /// (`[[models]]`, config file only).
    pub models: Vec<ModelConfig>,
    /// How gateway-run branches are worked on and taken over (`[runner]`).
    pub runner: RunnerConfig,
    /// The reasoning memory (`[memory]`).
    pub memory: MemoryConfig,
    /// How operators sign in to the web console (`[console]`).
    pub console: ConsoleConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            ops_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            database_url: "sqlite://foldgate.db".into(),
            database: DatabaseConfig::default(),
            migrate: false,
            auth_mode: AuthMode::Jwt,
            auth: AuthConfig::default(),
            api: ApiConfig::default(),
            folding: FoldingConfig::default(),
            supervisor: SupervisorConfig::default(),
            retention: RetentionConfig::default(),
            admin: AdminConfig::default(),
            scrub: ScrubConfig::default(),
            telemetry: TelemetryConfig::default(),
            upstreams: Vec::new(),
            identity: IdentityConfig::default(),
            models: Vec::new(),
            runner: RunnerConfig::default(),
            memory: MemoryConfig::default(),
            console: ConsoleConfig::default(),
        }
    }
}

/// The documented environment variables and the setting each sets.
const ENV_ALIASES: &[(&str, &[&str])] = &[
    ("FOLDGATE_LISTEN", &["listen"]),
    ("FOLDGATE_OPS_LISTEN", &["ops_listen"]),
    ("DATABASE_URL", &["database_url"]),
    ("FOLDGATE_JWT_SECRET", &["auth", "jwt_secret"]),
    ("FOLDGATE_JWKS_URL", &["auth", "jwks_url"]),
    ("FOLDGATE_JWT_PUBLIC_KEY_FILE", &["auth", "public_key_file"]),
    ("FOLDGATE_JWT_ISSUER", &["auth", "issuer"]),
    ("FOLDGATE_JWT_AUDIENCE", &["auth", "audience"]),
    ("FOLDGATE_TENANT_CLAIM", &["auth", "tenant_claim"]),
    ("FOLDGATE_ALLOWED_HOSTS", &["api", "allowed_hosts"]),
    ("FOLDGATE_ALLOWED_ORIGINS", &["api", "allowed_origins"]),
    ("FOLDGATE_LOG_FORMAT", &["telemetry", "log_format"]),
    ("FOLDGATE_ACCESS_LOG", &["telemetry", "access_log"]),
];

/// Settings that are lists: comma-separated in the environment.
const LIST_SETTINGS: &[&[&str]] = &[
    &["api", "allowed_hosts"],
    &["api", "allowed_origins"],
    &["console", "oidc_scopes"],
    &["console", "oidc_connect_origins"],
];

/// Settings that stay strings even when they look like numbers.
const STRING_SETTINGS: &[&[&str]] = &[
    &["database_url"],
    &["listen"],
    &["ops_listen"],
    &["auth", "jwt_secret"],
    &["auth", "issuer"],
    &["auth", "audience"],
    &["auth", "tenant_claim"],
    &["console", "oidc_client_id"],
    &["console", "oidc_issuer"],
    &["console", "oidc_resource"],
    &["identity", "signing_key_file"],
    &["identity", "previous_key_file"],
    &["identity", "issuer"],
];

/// The sections with settings renamed when durations took units, and
/// their former names.
const RENAMED: &[(&[&str], &[Renamed])] = &[
    (&["database"], DatabaseConfig::RENAMED),
    (&["auth"], AuthConfig::RENAMED),
    (&["folding", "timeout"], TimeoutPolicy::RENAMED),
    (&["retention"], RetentionConfig::RENAMED),
    (&["runner"], RunnerConfig::RENAMED),
    (&["memory"], MemoryConfig::RENAMED),
];

/// The arrays of tables whose entries have renamed settings (config file
/// only).
const RENAMED_IN_LISTS: &[(&str, &[Renamed])] =
    &[("upstreams", UpstreamConfig::RENAMED), ("models", ModelConfig::RENAMED)];

/// Variables with this prefix are never settings: they hold credentials
/// that upstreams and models registered through the admin API name
/// (`[admin] credential_env_prefix`, whose default this is).
const SECRET_PREFIX: &str = "FOLDGATE_SECRET_";

/// Environment variables the generic `FOLDGATE_` mapping skips: they
/// belong to commands, not to `serve`'s settings.
const NOT_SETTINGS: &[&str] = &["FOLDGATE_CONFIG", "FOLDGATE_TEST_DATABASE_URL"];

impl Config {
    /// Reads `file` (if any), then the environment, then validates, and
    /// checks that every `${VAR}` the upstreams and models name is set.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let config = Self::read(file, env.iter().cloned())?;
        config
            .check_upstream_credentials(|var| {
                env.iter().find(|(name, _)| name == var).map(|(_, value)| value.clone())
            })
            .map_err(ConfigError::redacted)?;
        Ok(config)
    }

    /// Reads `file` (if any), then the environment, then validates; the
    /// `${VAR}`s of credentials are not looked at (for `migrate`, which
    /// calls no upstream or model).
    pub fn read(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        // What an error quotes of the settings is shown without passwords.
        let config = Self::unchecked(file, env).map_err(ConfigError::redacted)?;
        config.validate().map_err(ConfigError::redacted)?;
        Ok(config)
    }

    /// The file (if any) with the environment over it, as settings, before
    /// [`Config::validate`].
    fn unchecked(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                let mut table =
                    text.parse::<Table>().map_err(|e| toml_syntax_error(path, &text, &e))?;
                to_new_names(&mut table)
                    .map_err(|e| format!("configuration: {}: {e}", path.display()))?;
                table
            }
            None => Table::new(),
        };
        // Which variable set which setting, to name it in an error.
        let mut from_env: Vec<(String, String)> = Vec::new();
        // The variables that name a setting by its former name.
        let mut former: Vec<String> = Vec::new();
        for (name, value) in env {
            if let Some(given) = setting_path(&name) {
                let path = new_name(given.clone());
                let setting = path.join(".");
                if path != given {
                    former.push(name.clone());
                }
                let twice = from_env.iter().find(|(set, _)| *set == setting);
                if let Some((_, other)) =
                    twice.filter(|(_, other)| path != given || former.contains(other))
                {
                    return Err(format!(
                        "configuration: {other} and {name} both set {setting}, one by its \
                         former name: set only one"
                    )
                    .into());
                }
                set(&mut table, &path, value).map_err(|e| format!("{name}: {e}"))?;
                from_env.push((setting, name));
            }
        }
        check_auth_forms(&table, &from_env)?;
        let config: Config =
            serde_path_to_error::deserialize(Value::Table(table)).map_err(|e| {
                let path = e.path().to_string();
                let message = e.inner().message();
                let by = from_env.iter().rev().find(|(set, _)| {
                    path == *set
                        || path.strip_prefix(set.as_str()).is_some_and(|r| r.starts_with('.'))
                });
                match by {
                    Some((_, var)) => format!("configuration: {var} (setting {path}): {message}"),
                    None => format!("configuration: {path}: {message}"),
                }
            })?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let section =
            |name: &str, r: Result<(), ConfigError>| r.map_err(|e| e.within(&format!("[{name}]")));
        section("api", self.api.validate())?;
        section("folding", self.folding.validate())?;
        section("supervisor", self.supervisor.validate())?;
        section("retention", self.retention.validate())?;
        section("admin", self.admin.validate())?;
        section("telemetry", self.telemetry.validate())?;
        section("runner", self.runner.validate())?;
        section("memory", self.memory.validate())?;
        section("identity", self.identity.validate().map_err(ConfigError::new))?;
        if self.auth_mode == AuthMode::Jwt && self.has_key_source() {
            section("auth", self.auth.validate())?;
        }
        self.console_sign_in()?;
        if self.auth_mode == AuthMode::None && !self.listen.ip().is_loopback() {
            return Err(format!(
                "auth_mode = \"none\" is only allowed on a loopback address, not {}",
                self.listen
            )
            .into());
        }
        if self.database.max_connections == 0 {
            return Err("[database] max_connections must be at least 1".into());
        }
        foldgate_store::Backend::of_url(self.database_url.expose()).map_err(|e| e.to_string())?;
        for (i, upstream) in self.upstreams.iter().enumerate() {
            let section = format!("[[upstreams]] {:?}:", upstream.name);
            upstream.validate().map_err(|e| e.within(&section))?;
            if self.upstreams[..i].iter().any(|u| u.name == upstream.name) {
                return Err(ConfigError::new("the name is used twice").within(&section));
            }
        }
        for (i, model) in self.models.iter().enumerate() {
            let section = format!("[[models]] {:?}:", model.name);
            model.validate().map_err(|e| e.within(&section))?;
            if self.models[..i].iter().any(|m| m.name == model.name) {
                return Err(ConfigError::new("the name is used twice").within(&section));
            }
        }
        Ok(())
    }

    /// Checks that every `${VAR}` in the upstreams' credentials and the
    /// models' keys is set.
    fn check_upstream_credentials(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        for upstream in &self.upstreams {
            let at =
                |field: &str, e: String| format!("[[upstreams]] {:?}: {field}: {e}", upstream.name);
            for (name, value) in &upstream.headers {
                expand_env(value, &env).map_err(|e| at(&format!("headers.{name}"), e))?;
            }
            if let Some(oauth) = &upstream.oauth {
                expand_env(&oauth.client_id, &env).map_err(|e| at("oauth.client_id", e))?;
                expand_env(&oauth.client_secret, &env).map_err(|e| at("oauth.client_secret", e))?;
            }
        }
        for model in &self.models {
            if let Some(key) = &model.api_key {
                expand_env(key, &env)
                    .map_err(|e| format!("[[models]] {:?}: api_key: {e}", model.name))?;
            }
        }
        Ok(())
    }

    /// The console's sign-in at the identity provider, if configured, checked
    /// against the rest: the gateway must verify the tokens it yields.
    pub fn console_sign_in(&self) -> Result<Option<OidcSignIn>, ConfigError> {
        let in_console = |e: String| ConfigError::new(e).within("[console]");
        let default_issuer = match self.auth.issuers.first() {
            Some(first) => (Some(first.issuer.as_str()), "auth.issuers[0].issuer"),
            None => (self.auth.issuer.as_deref(), "auth.issuer"),
        };
        let Some(sign_in) = self
            .console
            .sign_in_defaulting(default_issuer.0, default_issuer.1)
            .map_err(in_console)?
        else {
            return Ok(None);
        };
        if self.auth_mode == AuthMode::None {
            return Err(in_console(
                "oidc_client_id is set but auth_mode = \"none\": the gateway takes no tokens, \
                 so there is nothing to sign in with"
                    .into(),
            ));
        }
        if !self.has_key_source() {
            return Err(in_console(
                "oidc_client_id is set but [auth] has no key source to verify the provider's \
                 tokens with: set auth.discovery = true with auth.issuer (or auth.jwks_url, or \
                 public_key_file)"
                    .into(),
            ));
        }
        if sign_in.token == OidcToken::IdToken {
            // The issuer the console signs in with, if the gateway trusts
            // it; else the single-issuer form's audience, which applies to
            // every issuer when `auth.issuer` is unset.
            let audience = match self.auth.audience_of(&sign_in.issuer) {
                Some(audience) => Some(audience),
                None if self.auth.issuers.is_empty() => self.auth.audience.as_deref(),
                None => None,
            };
            if audience != Some(sign_in.client_id.as_str()) {
                let setting = if self.auth.issuers.is_empty() {
                    "auth.audience".to_owned()
                } else {
                    format!("the audience of the [[auth.issuers]] entry {:?}", sign_in.issuer)
                };
                return Err(in_console(format!(
                    "oidc_token = \"id_token\" sends the ID token, whose audience is the \
                     console's client id: set {setting} to {:?}, or send the access token",
                    sign_in.client_id
                )));
            }
        }
        Ok(Some(sign_in))
    }

    /// Whether a JWT key source is configured, in either form of `[auth]`.
    pub fn has_key_source(&self) -> bool {
        self.auth.has_key_source()
    }

    /// How to connect to the database, as `serve` and `migrate` do.
    pub fn connect_options(&self) -> foldgate_store::ConnectOptions {
        foldgate_store::ConnectOptions {
            url: self.database_url.clone(),
            max_connections: self.database.max_connections,
            acquire_timeout: self.database.acquire_timeout,
            synchronous_metering: self.database.synchronous_metering,
        }
    }
}

/// The settings of `[auth]`'s single-issuer form, which `[[auth.issuers]]`
/// replaces.
const SINGLE_ISSUER_SETTINGS: &[&str] = &[
    "jwt_secret",
    "jwks_url",
    "public_key_file",
    "issuer",
    "discovery",
    "audience",
    "tenant_claim",
    "jwks_allow_http",
];

/// `[[auth.issuers]]` comes from the file only, and replaces the
/// single-issuer settings: a single-issuer setting beside it (from the file,
/// or from a variable such as `FOLDGATE_JWKS_URL`, which keeps meaning the
/// single form) is refused, naming where it came from.
fn check_auth_forms(table: &Table, from_env: &[(String, String)]) -> Result<(), ConfigError> {
    if let Some((_, var)) = from_env.iter().find(|(set, _)| set == "auth.issuers") {
        return Err(format!(
            "configuration: {var}: [[auth.issuers]] can only be declared in the config file"
        )
        .into());
    }
    let Some(Value::Table(auth)) = table.get("auth") else { return Ok(()) };
    if auth.get("issuers").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        return Ok(());
    }
    let single: Vec<String> = SINGLE_ISSUER_SETTINGS
        .iter()
        .filter(|name| auth.contains_key(**name))
        .map(|name| {
            let path = format!("auth.{name}");
            match from_env.iter().rev().find(|(set, _)| *set == path) {
                Some((_, var)) => format!("{path} (from {var})"),
                None => path,
            }
        })
        .collect();
    if single.is_empty() {
        return Ok(());
    }
    Err(format!(
        "configuration: [[auth.issuers]] is set, and so is the single-issuer form ({}): use \
         one form; with several issuers, each entry has its own key source, audience and \
         tenant_claim (the HS256 jwt_secret exists in the single form only)",
        single.join(", ")
    )
    .into())
}

/// The `[telemetry]` settings alone, from the environment: for commands
/// that log but read no configuration file (`migrate`).
pub fn telemetry_from_env(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<TelemetryConfig, ConfigError> {
    let mut table = Table::new();
    for (name, value) in env {
        if let Some(path) =
            setting_path(&name).filter(|p| p.first().is_some_and(|s| s == "telemetry"))
        {
            set(&mut table, &path, value)?;
        }
    }
    let telemetry = table.remove("telemetry").unwrap_or_else(|| Value::Table(Table::new()));
    let config: TelemetryConfig = serde_path_to_error::deserialize(telemetry)
        .map_err(|e| format!("configuration: telemetry.{}: {}", e.path(), e.inner().message()))?;
    config.validate().map_err(|e| e.within("[telemetry]"))?;
    Ok(config)
}

/// A TOML syntax error, placed by line and column but without the line
/// itself, which may hold a secret.
fn toml_syntax_error(path: &Path, text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    let Some(start) = e.span().map(|span| span.start.min(text.len())) else {
        return format!("{}: {message}", path.display());
    };
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{}: line {line}, column {column}: {message}", path.display())
}

/// A setting's path under its new name, if it was renamed.
fn new_name(mut path: Vec<String>) -> Vec<String> {
    if let Some((last, section)) = path.split_last_mut() {
        let renamed = RENAMED
            .iter()
            .filter(|(at, _)| at.iter().copied().eq(section.iter().map(String::as_str)))
            .flat_map(|(_, renamed)| renamed.iter())
            .find(|r| r.old == last.as_str());
        if let Some(r) = renamed {
            r.new.clone_into(last);
        }
    }
    path
}

/// Puts the file's settings given by their former names under their new
/// ones; a setting given under both is refused, naming both.
fn to_new_names(table: &mut Table) -> Result<(), String> {
    fn rename(table: &mut Table, renamed: &[Renamed], at: &str) -> Result<(), String> {
        duration::both_names(renamed, at, |name| table.contains_key(name))?;
        for r in renamed {
            if let Some(value) = table.remove(r.old) {
                table.insert(r.new.to_owned(), value);
            }
        }
        Ok(())
    }
    for (section, renamed) in RENAMED {
        let mut current = Some(&mut *table);
        for key in *section {
            current = current.and_then(|t| t.get_mut(*key)).and_then(Value::as_table_mut);
        }
        if let Some(current) = current {
            rename(current, renamed, &format!("{}.", section.join(".")))?;
        }
    }
    for (list, renamed) in RENAMED_IN_LISTS {
        let Some(entries) = table.get_mut(*list).and_then(Value::as_array_mut) else { continue };
        for entry in entries.iter_mut().filter_map(Value::as_table_mut) {
            let name = entry.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
            rename(entry, renamed, "").map_err(|e| format!("[[{list}]] {name:?}: {e}"))?;
        }
    }
    Ok(())
}

/// The setting an environment variable sets, if any.
fn setting_path(name: &str) -> Option<Vec<String>> {
    if let Some((_, path)) = ENV_ALIASES.iter().find(|(n, _)| *n == name) {
        return Some(path.iter().map(|s| (*s).to_owned()).collect());
    }
    if NOT_SETTINGS.contains(&name) || name.starts_with(SECRET_PREFIX) {
        return None;
    }
    let rest = name.strip_prefix("FOLDGATE_")?;
    if is_service_link(rest) {
        return None;
    }
    Some(rest.split("__").map(str::to_ascii_lowercase).collect())
}

/// Whether a name (after `FOLDGATE_`) is one of the variables Kubernetes
/// sets for a Service whose name starts with `foldgate` (`FOLDGATE_PORT`,
/// `FOLDGATE_SERVICE_HOST`, `FOLDGATE_OPS_PORT_9090_TCP_ADDR`, …): they
/// are not settings, and must not stop the gateway from starting.
fn is_service_link(rest: &str) -> bool {
    let words: Vec<&str> = rest.split('_').collect();
    words.iter().enumerate().any(|(i, word)| {
        let tail = &words[i + 1..];
        match *word {
            "SERVICE" => matches!(tail.first(), Some(&"HOST") | Some(&"PORT")),
            "PORT" => match tail {
                [] => true,
                [port, proto, ..] => {
                    port.chars().all(|c| c.is_ascii_digit())
                        && matches!(*proto, "TCP" | "UDP" | "SCTP")
                }
                _ => false,
            },
            _ => false,
        }
    })
}

fn set(table: &mut Table, path: &[String], raw: String) -> Result<(), ConfigError> {
    let Some((last, parents)) = path.split_last() else {
        return Ok(());
    };
    let mut current = table;
    for key in parents {
        let entry = current.entry(key.clone()).or_insert_with(|| Value::Table(Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| format!("setting {} is not a section", path.join(".")))?;
    }
    current.insert(last.clone(), env_value(path, raw));
    Ok(())
}

/// Interprets an environment value: a list, a number, a boolean, or text.
fn env_value(path: &[String], raw: String) -> Value {
    let is = |list: &[&[&str]]| {
        list.iter().any(|p| p.iter().copied().eq(path.iter().map(String::as_str)))
    };
    if is(LIST_SETTINGS) {
        return Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_owned()))
                .collect(),
        );
    }
    if is(STRING_SETTINGS) {
        return Value::String(raw);
    }
    if let Ok(i) = raw.parse::<i64>() {
        return Value::Integer(i);
    }
    if let Ok(f) = raw.parse::<f64>() {
        return Value::Float(f);
    }
    match raw.as_str() {
        "true" => Value::Boolean(true),
        "false" => Value::Boolean(false),
        _ => Value::String(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_is_placed_without_quoting_the_file() {
        // Found by the `config` fuzz target: the error quoted the line, and
        // with it whatever secret the line held.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("foldgate.toml");
        std::fs::write(&file, "[auth]\njwt_secret = \"0123456789abcdef0123456789abcdef\" !\n")
            .unwrap();
        let e = Config::load(Some(&file), []).unwrap_err().to_string();
        assert!(!e.contains("0123456789abcdef"), "{e}");
        assert!(e.contains("line 2, column 49"), "{e}");
    }

    #[test]
    fn debug_output_hides_every_url_password() {
        // Found by the `config` fuzz target: `auth.jwks_url` was shown whole.
        let (_dir, path) = file(
            "[auth]\nissuer = \"https://idp.example/realms/a\"\njwks_url = \"http://idp:s3cret@idp.internal/certs\"\njwks_allow_http = true\n",
        );
        let config = Config::load(Some(&path), env(&[])).unwrap();
        for shown in [format!("{config:?}"), format!("{config:#?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("http://idp:***@idp.internal/certs"), "{shown}");
        }
    }

    #[test]
    fn debug_output_hides_the_database_password() {
        // Found by the `config` fuzz target: `Debug` showed the URL whole.
        for url in [
            "postgres://foldgate:s3cret-password@db:5432/foldgate",
            "postgres://db/foldgate?sslmode=require&password=s3cret-password",
        ] {
            let env = [("DATABASE_URL".to_owned(), url.to_owned())];
            let config = Config::load(None, env).unwrap();
            assert_eq!(config.database_url.expose(), url);
            let shown = format!("{config:?}");
            assert!(!shown.contains("s3cret-password"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
    }

    #[test]
    fn kubernetes_service_links_are_not_settings() {
        for name in [
            "FOLDGATE_PORT",
            "FOLDGATE_SERVICE_HOST",
            "FOLDGATE_SERVICE_PORT",
            "FOLDGATE_SERVICE_PORT_HTTP",
            "FOLDGATE_PORT_8080_TCP",
            "FOLDGATE_PORT_8080_TCP_ADDR",
            "FOLDGATE_OPS_PORT_9090_TCP_PROTO",
            "FOLDGATE_OPS_SERVICE_HOST",
        ] {
            assert_eq!(setting_path(name), None, "{name}");
        }
        assert_eq!(setting_path("FOLDGATE_OPS_LISTEN").unwrap(), vec!["ops_listen".to_owned()]);
        assert_eq!(
            setting_path("FOLDGATE_FOLDING__MAX_DEPTH").unwrap(),
            vec!["folding".to_owned(), "max_depth".to_owned()]
        );
        let env = [("FOLDGATE_PORT".to_owned(), "tcp://10.0.0.1:8080".to_owned())];
        Config::load(None, env).unwrap();
        let env = [("FOLDGATE_SECRET_TEAM_A".to_owned(), "s3cret".to_owned())];
        Config::load(None, env).unwrap();
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn defaults_need_nothing() {
        let c = Config::load(None, env(&[])).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.database_url.expose(), "sqlite://foldgate.db");
    }

    #[test]
    fn environment_overrides_file_and_documented_names_work() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("foldgate.toml");
        std::fs::write(
            &path,
            "listen = \"0.0.0.0:8000\"\n[folding]\nmax_depth = 5\n[folding.limits]\nmax_active_per_tenant = 7\n",
        )
        .unwrap();
        let c = Config::load(
            Some(&path),
            env(&[
                ("FOLDGATE_FOLDING__MAX_DEPTH", "4"),
                ("DATABASE_URL", "postgres://db/foldgate"),
                ("FOLDGATE_JWT_SECRET", "0123456789"),
                ("FOLDGATE_ALLOWED_HOSTS", "a.example, b.example"),
                ("FOLDGATE_API__RATE_LIMIT__BURST", "3"),
                ("FOLDGATE_CONFIG", "/ignored"),
                ("HOME", "/root"),
            ]),
        );
        let c = match c {
            Ok(c) => c,
            // A 10-byte secret is refused by the auth checks: that is a
            // validation message, which is the point of this case too.
            Err(e) => {
                assert!(e.to_string().contains("[auth]"), "{e}");
                Config::load(
                    Some(&path),
                    env(&[
                        ("FOLDGATE_FOLDING__MAX_DEPTH", "4"),
                        ("DATABASE_URL", "postgres://db/foldgate"),
                        ("FOLDGATE_JWT_SECRET", &"k".repeat(40)),
                        ("FOLDGATE_ALLOWED_HOSTS", "a.example, b.example"),
                        ("FOLDGATE_API__RATE_LIMIT__BURST", "3"),
                    ]),
                )
                .unwrap()
            }
        };
        assert_eq!(c.listen.to_string(), "0.0.0.0:8000", "from the file");
        assert_eq!(c.folding.max_depth, 4, "the environment wins");
        assert_eq!(c.folding.limits.max_active_per_tenant, 7);
        assert_eq!(c.database_url.expose(), "postgres://db/foldgate");
        assert_eq!(c.api.allowed_hosts, vec!["a.example", "b.example"]);
        assert_eq!(c.api.rate_limit.burst, 3);
        assert!(c.auth.jwt_secret.is_some());
    }

    #[test]
    fn errors_from_the_environment_name_the_variable() {
        for (var, value, setting) in [
            ("FOLDGATE_API__MAX_BODY_BYTES", "lots", "api.max_body_bytes"),
            ("FOLDGATE_FOLDING__MAX_DEPTH", "-1", "folding.max_depth"),
            ("FOLDGATE_LISTEN", "not an address", "listen"),
        ] {
            let e = Config::load(None, env(&[(var, value)])).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(setting), "{var}: {e}");
        }
        // A bad value from the file names the setting alone.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("foldgate.toml");
        std::fs::write(&path, "[api]\nmax_body_bytes = \"lots\"\n").unwrap();
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(e.contains("api.max_body_bytes") && !e.contains("FOLDGATE_"), "{e}");
    }

    #[test]
    fn telemetry_settings_come_from_the_environment() {
        use foldgate_telemetry::LogFormat;
        let c = Config::load(
            None,
            env(&[
                ("FOLDGATE_LOG_FORMAT", "json"),
                ("FOLDGATE_TELEMETRY__STORE_POLL_INTERVAL", "2500"),
            ]),
        )
        .unwrap();
        assert_eq!(c.telemetry.log_format, LogFormat::Json);
        assert_eq!(c.telemetry.store_poll_interval, Duration::from_millis(2500));
        // `migrate` reads the same settings without a configuration file,
        // and ignores every other setting.
        let t = telemetry_from_env(env(&[
            ("FOLDGATE_LOG_FORMAT", "text"),
            ("FOLDGATE_FOLDING__MAX_DEPTH", "0"),
        ]))
        .unwrap();
        assert_eq!(t.log_format, LogFormat::Text);
        for (vars, expected) in [
            (&[("FOLDGATE_LOG_FORMAT", "xml")][..], "log_format"),
            (&[("FOLDGATE_TELEMETRY__STORE_POLL_INTERVAL", "0")][..], "store_poll_interval"),
        ] {
            let err = Config::load(None, env(vars)).unwrap_err();
            assert!(err.to_string().contains(expected), "{vars:?}: {err}");
            let err = telemetry_from_env(env(vars)).unwrap_err();
            assert!(err.to_string().contains(expected), "{vars:?}: {err}");
        }
    }

    #[test]
    fn console_sign_in_comes_from_the_environment() {
        let c = Config::load(
            None,
            env(&[
                ("FOLDGATE_JWKS_URL", "https://idp.example/jwks"),
                ("FOLDGATE_JWT_ISSUER", "https://idp.example/realms/ops"),
                // Numeric client ids stay text.
                ("FOLDGATE_CONSOLE__OIDC_CLIENT_ID", "245678901234567890"),
                ("FOLDGATE_CONSOLE__OIDC_SCOPES", "openid, tenant:admin"),
                ("FOLDGATE_CONSOLE__OIDC_RESOURCE", "https://foldgate.example/mcp"),
                ("FOLDGATE_CONSOLE__OIDC_CONNECT_ORIGINS", "https://oauth2.idp.example"),
            ]),
        )
        .unwrap();
        let sign_in = c.console_sign_in().unwrap().unwrap();
        assert_eq!(sign_in.client_id, "245678901234567890");
        assert_eq!(sign_in.issuer, "https://idp.example/realms/ops", "auth.issuer by default");
        assert_eq!(sign_in.scopes, ["openid", "tenant:admin"]);
        assert_eq!(sign_in.token, OidcToken::AccessToken);
        assert_eq!(sign_in.resource.as_deref(), Some("https://foldgate.example/mcp"));
        assert_eq!(sign_in.connect_origins, ["https://idp.example", "https://oauth2.idp.example"]);

        let c = Config::load(
            None,
            env(&[
                ("FOLDGATE_JWKS_URL", "http://127.0.0.1:4000/jwks"),
                ("FOLDGATE_JWT_AUDIENCE", "foldgate-console"),
                ("FOLDGATE_CONSOLE__OIDC_CLIENT_ID", "foldgate-console"),
                ("FOLDGATE_CONSOLE__OIDC_ISSUER", "http://127.0.0.1:4000"),
                ("FOLDGATE_CONSOLE__OIDC_TOKEN", "id_token"),
            ]),
        )
        .unwrap();
        let sign_in = c.console_sign_in().unwrap().unwrap();
        assert_eq!(sign_in.token, OidcToken::IdToken);
        assert_eq!(sign_in.issuer, "http://127.0.0.1:4000");
        // Without a client id the console takes pasted tokens only.
        assert_eq!(Config::load(None, env(&[])).unwrap().console_sign_in(), Ok(None));
    }

    #[test]
    fn console_sign_in_mistakes_are_reported_clearly() {
        let jwks = ("FOLDGATE_JWKS_URL", "https://idp.example/jwks");
        let client = ("FOLDGATE_CONSOLE__OIDC_CLIENT_ID", "foldgate-console");
        let issuer = ("FOLDGATE_CONSOLE__OIDC_ISSUER", "https://idp.example");
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[jwks, client],
                "[console] oidc_client_id is set but there is no issuer to sign in with",
            ),
            (&[jwks, issuer], "[console] oidc_issuer set without oidc_client_id"),
            (&[client, issuer], "[console] oidc_client_id is set but [auth] has no key source"),
            (
                &[("FOLDGATE_AUTH_MODE", "none"), client, issuer],
                "[console] oidc_client_id is set but auth_mode = \"none\"",
            ),
            (
                &[jwks, client, issuer, ("FOLDGATE_CONSOLE__OIDC_TOKEN", "id_token")],
                "set auth.audience to \"foldgate-console\"",
            ),
            (
                &[jwks, client, issuer, ("FOLDGATE_CONSOLE__OIDC_TOKEN", "refresh_token")],
                "oidc_token",
            ),
            (
                &[jwks, client, ("FOLDGATE_CONSOLE__OIDC_ISSUER", "http://idp.example")],
                "[console] oidc_issuer must use https",
            ),
            (
                &[jwks, client, issuer, ("FOLDGATE_CONSOLE__OIDC_SCOPES", "foldgate:admin")],
                "must include openid",
            ),
            (&[jwks, client, issuer, ("FOLDGATE_CONSOLE__OIDC_CLIENT", "x")], "oidc_client"),
        ];
        for (vars, expected) in cases {
            let err = Config::load(None, env(vars)).unwrap_err();
            assert!(err.to_string().contains(expected), "{vars:?}: {err}");
        }
    }

    const TWO_ISSUERS: &str = r#"
[[auth.issuers]]
issuer = "https://idp.example/realms/agents"
discovery = true

[[auth.issuers]]
issuer = "https://login.example.com/tenant-id/v2.0"
jwks_url = "https://login.example.com/tenant-id/discovery/v2.0/keys"
audience = "api://foldgate"
tenant_claim = "tid"
"#;

    fn in_file(toml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("foldgate.toml");
        std::fs::write(&path, toml).unwrap();
        (dir, path)
    }

    #[test]
    fn several_issuers_come_from_the_file_and_replace_the_single_form() {
        let (_dir, path) = in_file(TWO_ISSUERS);
        let c =
            Config::load(Some(&path), env(&[("FOLDGATE_AUTH__TOKEN_CACHE_SECONDS", "5")])).unwrap();
        assert_eq!(c.auth.issuers.len(), 2);
        assert_eq!(c.auth.issuers[0].tenant_claim, "tenant", "the default tenant claim");
        assert_eq!(c.auth.issuers[1].tenant_claim, "tid");
        assert_eq!(
            c.auth.token_cache_ttl,
            Duration::from_secs(5),
            "shared settings stay at the top"
        );
        assert!(c.has_key_source());

        // A single-issuer setting beside the list, named with where it came
        // from; the documented variables keep meaning the single form.
        /// What the file adds, the environment, and a part of the error.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case<'_>] = &[
            (
                "",
                &[("FOLDGATE_JWKS_URL", "https://idp.example/jwks")],
                "single-issuer form (auth.jwks_url (from FOLDGATE_JWKS_URL))",
            ),
            (
                "",
                &[("FOLDGATE_TENANT_CLAIM", "tenant")],
                "(auth.tenant_claim (from FOLDGATE_TENANT_CLAIM))",
            ),
            (
                "",
                &[("FOLDGATE_JWT_SECRET", "0123456789abcdef0123456789abcdef")],
                "(auth.jwt_secret (from FOLDGATE_JWT_SECRET))",
            ),
            ("[auth]\nissuer = \"https://idp.example\"\n", &[], "single-issuer form (auth.issuer)"),
            (
                "",
                &[("FOLDGATE_AUTH__ISSUERS", "https://idp.example")],
                "FOLDGATE_AUTH__ISSUERS: [[auth.issuers]] can only be declared in the config file",
            ),
            (
                "[[auth.issuers]]\nissuer = \"https://idp.example/realms/agents\"\ndiscovery = true\n",
                &[],
                "[auth] issuers[2] \"https://idp.example/realms/agents\": the issuer is listed twice",
            ),
            (
                "[[auth.issuers]]\nissuer = \"https://third.example\"\n",
                &[],
                "[auth] issuers[2] \"https://third.example\": no key source",
            ),
        ];
        for (more, vars, expected) in cases {
            // `[auth]` keys go before the list's tables.
            let toml = if more.starts_with("[auth]") {
                format!("{more}{TWO_ISSUERS}")
            } else {
                format!("{TWO_ISSUERS}{more}")
            };
            let (_dir, path) = in_file(&toml);
            let err = Config::load(Some(&path), env(vars)).unwrap_err();
            assert!(err.to_string().contains(expected), "{vars:?} {more:?}: {err}");
        }

        // Discovery in the single form, from the environment.
        let c = Config::load(
            None,
            env(&[
                ("FOLDGATE_JWT_ISSUER", "https://idp.example/realms/agents"),
                ("FOLDGATE_AUTH__DISCOVERY", "true"),
            ]),
        )
        .unwrap();
        assert!(c.auth.discovery && c.has_key_source());
        let err = Config::load(None, env(&[("FOLDGATE_AUTH__DISCOVERY", "true")])).unwrap_err();
        assert!(err.to_string().contains("[auth] discovery = true needs issuer"), "{err}");
    }

    #[test]
    fn the_console_signs_in_with_the_first_listed_issuer_by_default() {
        let client = ("FOLDGATE_CONSOLE__OIDC_CLIENT_ID", "foldgate-console");
        let (_dir, path) = in_file(TWO_ISSUERS);
        let c = Config::load(Some(&path), env(&[client])).unwrap();
        let sign_in = c.console_sign_in().unwrap().unwrap();
        assert_eq!(sign_in.issuer, "https://idp.example/realms/agents");

        // With the ID token, the audience of the issuer signed in with must
        // be the client id.
        let id_token = ("FOLDGATE_CONSOLE__OIDC_TOKEN", "id_token");
        let second = ("FOLDGATE_CONSOLE__OIDC_ISSUER", "https://login.example.com/tenant-id/v2.0");
        let err = Config::load(Some(&path), env(&[client, id_token, second])).unwrap_err();
        assert!(
            err.to_string().contains(
                "set the audience of the [[auth.issuers]] entry \
                 \"https://login.example.com/tenant-id/v2.0\" to \"foldgate-console\""
            ),
            "{err}"
        );
        let (_dir, path) = in_file(&TWO_ISSUERS.replace("api://foldgate", "foldgate-console"));
        let c = Config::load(Some(&path), env(&[client, id_token, second])).unwrap();
        assert_eq!(c.console_sign_in().unwrap().unwrap().token, OidcToken::IdToken);
    }

    /// A configuration file holding `text`, and its directory (kept while
    /// the file is used).
    fn file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("foldgate.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// The settings of a file and an environment, before validation.
    fn unchecked(text: &str, vars: &[(&str, &str)]) -> Result<Config, String> {
        let (_dir, path) = file(text);
        Config::unchecked(Some(&path), env(vars)).map_err(|e| e.to_string())
    }

    #[test]
    fn durations_take_units_in_the_file_and_the_environment() {
        type Get = fn(&Config) -> Duration;
        const S: Duration = Duration::from_secs(1);
        const MS: Duration = Duration::from_millis(1);
        const DAY: Duration = Duration::from_secs(86_400);
        // (section, field, the unit of a bare number, the setting)
        let settings: &[(&str, &str, Duration, Get)] = &[
            ("folding", "session_idle_timeout", S, |c| c.folding.session_idle_timeout),
            ("supervisor", "claim_lease", MS, |c| c.supervisor.claim_lease),
            ("auth", "jwks_timeout", S, |c| c.auth.jwks_timeout),
            ("memory", "embeddings_timeout", MS, |c| c.memory.embeddings_timeout),
            ("retention", "branches", DAY, |c| c.retention.branches),
            ("database", "acquire_timeout", S, |c| c.database.acquire_timeout),
            ("identity", "token_ttl", S, |c| c.identity.token_ttl),
        ];
        // (TOML value, environment value, the duration for a unit)
        type Of = fn(Duration) -> Duration;
        let forms: &[(&str, &str, Of)] = &[
            ("7", "7", |unit| 7 * unit),
            ("\"500ms\"", "500ms", |_| 500 * MS),
            ("\"30s\"", "30s", |_| 30 * S),
            ("\"5m\"", "5m", |_| 300 * S),
            ("\"1m30s\"", "1m30s", |_| 90 * S),
            ("\"2h 15m\"", "2h 15m", |_| 8100 * S),
        ];
        for (section, field, unit, get) in settings {
            for (toml, var_value, expected) in forms {
                let expected = expected(*unit);
                let in_file = unchecked(&format!("[{section}]\n{field} = {toml}\n"), &[]);
                assert_eq!(in_file.map(|c| get(&c)), Ok(expected), "{section}.{field} = {toml}");
                let var = format!("FOLDGATE_{}__{}", section, field).to_ascii_uppercase();
                let in_env = unchecked("", &[(&var, var_value)]);
                assert_eq!(in_env.map(|c| get(&c)), Ok(expected), "{var}={var_value}");
            }
        }
        // A setting kept in whole seconds takes them in any unit.
        let c = unchecked("[folding.timeout]\ndefault = \"2m\"\nmax = \"3600000ms\"\n", &[]);
        let timeout = c.unwrap().folding.timeout;
        assert_eq!((timeout.default, timeout.max), (120 * S, 3600 * S));
    }

    /// One file and one variable per renamed setting, under its former name.
    fn every_former_name() -> Vec<(String, String, String, String)> {
        let mut all = Vec::new();
        for (section, renamed) in RENAMED {
            for r in *renamed {
                let var =
                    format!("FOLDGATE_{}__{}", section.join("__"), r.old).to_ascii_uppercase();
                all.push((
                    format!("[{}]\n{} = 7\n", section.join("."), r.old),
                    format!("[{}]\n{} = 7\n", section.join("."), r.new),
                    var,
                    format!("{}.{}", section.join("."), r.new),
                ));
            }
        }
        let entries = [
            ("upstreams", "name = \"f\"\nurl = \"http://h/mcp\""),
            (
                "models",
                "name = \"m\"\nprovider = \"openai\"\nbase_url = \"http://h/v1\"\nmodel = \"x\"",
            ),
        ];
        for (list, renamed) in RENAMED_IN_LISTS {
            let (_, entry) = entries.iter().find(|(l, _)| l == list).unwrap();
            for r in *renamed {
                all.push((
                    format!("[[{list}]]\n{entry}\n{} = 7\n", r.old),
                    format!("[[{list}]]\n{entry}\n{} = 7\n", r.new),
                    String::new(),
                    format!("{list}[0].{}", r.new),
                ));
            }
        }
        all
    }

    #[test]
    fn former_names_still_work_in_the_file_and_the_environment() {
        let former = every_former_name();
        assert_eq!(former.len(), 21, "every renamed setting is here");
        for (old, new, var, setting) in former {
            let by_old = unchecked(&old, &[]).unwrap();
            assert_eq!(by_old, unchecked(&new, &[]).unwrap(), "{setting}: {old}");
            assert_ne!(by_old, Config::default(), "{setting}: {old} is read");
            // The struct itself takes the former name too (as the admin API
            // and the registrations kept in the database do).
            assert_eq!(toml::from_str::<Config>(&old).unwrap(), by_old, "{setting}: alias");
            if !var.is_empty() {
                assert_eq!(unchecked("", &[(&var, "7")]).unwrap(), by_old, "{var}");
            }
        }
    }

    #[test]
    fn the_documents_list_every_former_name_and_the_duration_syntax() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let docs = std::fs::read_to_string(format!("{root}/docs/configuration.md")).unwrap();
        let schema =
            std::fs::read_to_string(format!("{root}/helm/foldgate/values.schema.json")).unwrap();
        let schema: serde_json::Value = serde_json::from_str(&schema).unwrap();
        assert_eq!(
            schema["definitions"]["duration"]["pattern"],
            duration::TEXT_PATTERN,
            "the chart takes the text the gateway does"
        );
        let mut rows = Vec::new();
        for (section, renamed) in RENAMED {
            for r in *renamed {
                let at = section.join(".");
                rows.push(format!("| `{at}.{}` | `{at}.{}` |", r.old, r.new));
            }
        }
        for (list, renamed) in RENAMED_IN_LISTS {
            for r in *renamed {
                rows.push(format!("| `[[{list}]] {}` | `[[{list}]] {}` |", r.old, r.new));
            }
        }
        for row in rows {
            assert!(docs.contains(&row), "docs/configuration.md lacks {row}");
        }
        // The chart's schema takes both names of every renamed setting it
        // exposes (it leaves `[memory]` out), the former one deprecated.
        let config = &schema["properties"]["config"]["properties"];
        let mut exposed = 0;
        let sections = RENAMED.iter().map(|(section, renamed)| {
            let node = section.iter().fold(config, |node, key| &node[*key]["properties"]);
            (section.join("."), node, *renamed)
        });
        let lists = RENAMED_IN_LISTS.iter().map(|(list, renamed)| {
            ((*list).to_owned(), &config[*list]["items"]["properties"], *renamed)
        });
        for (at, properties, renamed) in sections.chain(lists) {
            if properties.is_null() {
                assert_eq!(at, "memory", "the chart exposes [{at}]");
                continue;
            }
            for r in renamed {
                assert!(properties[r.new].is_object(), "the chart's {at}.{}", r.new);
                assert_eq!(properties[r.old]["deprecated"], true, "the chart's {at}.{}", r.old);
                exposed += 1;
            }
        }
        assert_eq!(exposed, 18);
    }

    #[test]
    fn the_environment_overrides_the_file_whichever_name_each_uses() {
        let old_file = "[auth]\njwks_timeout_seconds = 5\n[runner]\nlease_seconds = 40\n";
        let new_file = "[auth]\njwks_timeout = \"5s\"\n[runner]\nlease = \"40s\"\n";
        let new_vars = [("FOLDGATE_AUTH__JWKS_TIMEOUT", "9s"), ("FOLDGATE_RUNNER__LEASE", "1m")];
        let old_vars = [
            ("FOLDGATE_AUTH__JWKS_TIMEOUT_SECONDS", "9"),
            ("FOLDGATE_RUNNER__LEASE_SECONDS", "60"),
        ];
        for file in [old_file, new_file] {
            assert_eq!(unchecked(file, &[]).unwrap().auth.jwks_timeout, Duration::from_secs(5));
            for vars in [&new_vars, &old_vars] {
                let c = unchecked(file, vars).unwrap();
                assert_eq!(c.auth.jwks_timeout, Duration::from_secs(9), "{file} {vars:?}");
                assert_eq!(c.runner.lease, Duration::from_secs(60), "{file} {vars:?}");
            }
        }
    }

    #[test]
    fn a_setting_given_under_both_names_is_refused_naming_both() {
        let (_dir, path) = file("[auth]\njwks_timeout = \"5s\"\njwks_timeout_seconds = 5\n");
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "configuration: {}: auth.jwks_timeout and auth.jwks_timeout_seconds are one \
                 setting (jwks_timeout_seconds is its former name): set only jwks_timeout",
                path.display()
            )
        );
        let e = unchecked("[folding.timeout]\nmax = 60\nmax_seconds = 60\n", &[]).unwrap_err();
        assert!(e.contains("folding.timeout.max and folding.timeout.max_seconds"), "{e}");
        let e = unchecked(
            "[[upstreams]]\nname = \"f\"\nurl = \"http://h\"\ntimeout = 5\ntimeout_seconds = 5\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("[[upstreams]] \"f\": timeout and timeout_seconds are one setting"));
        for vars in [
            [("FOLDGATE_AUTH__JWKS_TIMEOUT", "5s"), ("FOLDGATE_AUTH__JWKS_TIMEOUT_SECONDS", "5")],
            [("FOLDGATE_AUTH__JWKS_TIMEOUT_SECONDS", "5"), ("FOLDGATE_AUTH__JWKS_TIMEOUT", "5s")],
        ] {
            let e = unchecked("", &vars).unwrap_err();
            assert!(
                e.contains(&format!("{} and {} both set auth.jwks_timeout", vars[0].0, vars[1].0)),
                "{e}"
            );
        }
        // Two names of a setting that was not renamed: the later wins, as
        // before.
        let vars = [("FOLDGATE_ACCESS_LOG", "true"), ("FOLDGATE_TELEMETRY__ACCESS_LOG", "false")];
        assert!(!unchecked("", &vars).unwrap().telemetry.access_log);
    }

    /// A URL given for a setting of another type is quoted in the error
    /// with its password redacted (found by fuzzing the loader), as is any
    /// URL an error quotes.
    #[test]
    fn a_value_of_the_wrong_type_is_quoted_without_a_url_password() {
        let e = Config::load(None, env(&[("FOLDGATE_DATABASE", "postgres://app:s3cret@db/fold")]))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cret"), "{e}");
        assert!(e.contains("FOLDGATE_DATABASE") && e.contains("postgres://app:***@db/fold"), "{e}");
        let (_dir, path) = file("[folding]\nlimits = \"https://u:s3cret@h/x?token=t0k3n\"\n");
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(!e.contains("s3cret") && !e.contains("t0k3n"), "{e}");
        // Validation's errors too.
        let (_dir, path) = file("[api]\npublic_url = \"ftp://u:s3cret@h/mcp\"\n");
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(!e.contains("s3cret") && e.contains("public_url"), "{e}");
        // A password with a quote in it, in a URL with no host.
        let (_dir, path) = file(
            "[[auth.issuers]]\nissuer = \"http://id'''p:s3'cret@/realms\"\ntenant_claim = \"t\"\n",
        );
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(!e.contains("cret"), "{e}");
        assert!(e.contains("http://id'''p:***@/realms"), "{e}");
        let (_dir, path) = file(
            "[[auth.issuers]]\nissuer = \"http://id>p:s3cret@/realms\"\ntenant_claim = \"t\"\n",
        );
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(!e.contains("s3cret") && e.contains("http://id>p:***@/realms"), "{e}");
    }

    #[test]
    fn hosts_and_origins_are_checked_and_quoted_without_a_password() {
        let (_dir, path) =
            file("[api]\nallowed_hosts = [\"localhost\", \"https://u:s3cret@h.example\"]\n");
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        assert!(e.contains("[api] allowed_hosts: \"https://u:***@h.example\" is a URL"), "{e}");
        let e = Config::load(None, env(&[("FOLDGATE_ALLOWED_ORIGINS", "app.example.com")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("allowed_origins: \"app.example.com\" is not an origin"), "{e}");
        // What the Helm chart lists by default: loopback names, `::1` bare, an
        // Ingress's wildcard host.
        let (_dir, path) = file(
            "[api]\nallowed_hosts = [\"localhost\", \"127.0.0.1\", \"::1\", \"fg.ns.svc\", \"*.example.com\", \"[::1]:8080\"]\nallowed_origins = [\"https://*.example.com\", \"http://localhost:5173\"]\n",
        );
        let c = Config::load(Some(&path), env(&[])).unwrap();
        assert_eq!(c.api.allowed_hosts.len(), 6);
        let (_dir, path) = file("[api]\npublic_url = \"https://*.example.com/mcp\"\n");
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(e.contains("wildcard"), "{e}");
    }

    #[test]
    fn a_bad_duration_is_reported_naming_the_setting_and_the_forms_accepted() {
        let seconds =
            r#"expected a duration such as "30s", "500ms" or "5m", or a whole number of seconds"#;
        let (_dir, path) = file("[auth]\njwks_timeout = \"5 parsecs\"\n");
        let e = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert_eq!(e, format!("configuration: auth.jwks_timeout: {seconds}; got \"5 parsecs\""));
        // From the environment, under either name: the variable is named.
        for var in ["FOLDGATE_AUTH__JWKS_TIMEOUT", "FOLDGATE_AUTH__JWKS_TIMEOUT_SECONDS"] {
            let e = Config::load(None, env(&[(var, "5 parsecs")])).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "configuration: {var} (setting auth.jwks_timeout): {seconds}; got \"5 parsecs\""
                )
            );
        }
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(&str, Vars<'_>, &str)] = &[
            ("", &[("FOLDGATE_RUNNER__LEASE", "-5")], "got -5, which is negative"),
            ("", &[("FOLDGATE_RUNNER__LEASE", "-5s")], "got \"-5s\", which is negative"),
            ("[runner]\nlease = -5\n", &[], "runner.lease: expected"),
            (
                "[runner]\nlease = 1.5\n",
                &[],
                "runner.lease: expected a duration such as \"30s\", \"500ms\" or \"5m\", or a \
                 whole number of seconds; got 1.5, which is not a whole number: write it with \
                 units, as \"1s 500ms\"",
            ),
            (
                "",
                &[("FOLDGATE_SUPERVISOR__CLAIM_LEASE", "2.5")],
                "or a whole number of milliseconds; got 2.5, which is not a whole number: write \
                 it with units, as \"2ms 500us\"",
            ),
            (
                "[retention]\naudit = 9223372036854775807\n",
                &[],
                "retention.audit: expected a duration such as \"30d\", \"12h\" or \"2w\", or a \
                 whole number of days; got 9223372036854775807, which is too long",
            ),
            ("[retention]\naudit = \"99999999999999999999d\"\n", &[], "which is too long"),
            (
                "[folding.timeout]\ndefault = \"1500ms\"\n",
                &[],
                "folding.timeout.default: expected a duration in whole seconds such as \"30s\", \
                 \"5m\" or \"1h\", or a whole number of seconds; got \"1500ms\", which is not a \
                 whole number of seconds",
            ),
            (
                "",
                &[("FOLDGATE_FOLDING__TIMEOUT__MAX_SECONDS", "2.5")],
                "FOLDGATE_FOLDING__TIMEOUT__MAX_SECONDS (setting folding.timeout.max): expected a \
                 duration in whole seconds",
            ),
            ("[api]\nrequest_timeout = true\n", &[], "api.request_timeout: invalid type"),
        ];
        for (text, vars, expected) in cases {
            let e = unchecked(text, vars).unwrap_err();
            assert!(e.contains(expected), "{text} {vars:?}: {e}");
        }
    }

    #[test]
    fn duration_ranges_are_checked_and_reported_with_units() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("FOLDGATE_SUPERVISOR__CLAIM_LEASE", "2d")],
                "[supervisor] supervisor claim_lease must be from 1ms to 1d, got 2d",
            ),
            (
                &[("FOLDGATE_RUNNER__LEASE_SECONDS", "2")],
                "[runner] lease must be from 3s to 1h, got 2s",
            ),
            (
                &[("FOLDGATE_TELEMETRY__STORE_POLL_INTERVAL", "5ms")],
                "[telemetry] store_poll_interval must be from 10ms to 1h, got 5ms",
            ),
            (
                &[("FOLDGATE_MEMORY__EMBEDDINGS_CACHE_TTL", "2h")],
                "[memory] embeddings_cache_ttl must be from 1s to 1h, got 2h",
            ),
            (
                &[("FOLDGATE_RETENTION__INTERVAL", "500ms")],
                "[retention] retention interval must be from 1s to 1d, got 500ms",
            ),
            (
                &[("FOLDGATE_RETENTION__BRANCHES", "40000d")],
                "[retention] retention branches must be from 0s to 36500d, got 40000d",
            ),
            (
                &[("FOLDGATE_FOLDING__TIMEOUT__DEFAULT", "20m")],
                "[folding] timeout.default (20m) exceeds timeout.max (10m)",
            ),
            (
                &[("FOLDGATE_JWT_SECRET", &"k".repeat(40)), ("FOLDGATE_AUTH__LEEWAY", "6m")],
                "[auth] leeway must be from 0s to 5m, got 6m",
            ),
        ];
        for (vars, expected) in cases {
            let e = Config::load(None, env(vars)).unwrap_err().to_string();
            assert!(e.contains(expected), "{vars:?}: {e}");
        }
        // Zero keeps what ended forever.
        let c = Config::load(None, env(&[("FOLDGATE_RETENTION__AUDIT_DAYS", "0")])).unwrap();
        assert!(c.retention.audit.is_zero());
    }

    #[test]
    fn mistakes_are_reported_clearly() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("FOLDGATE_FOLDING__MAX_DEPTH", "0")], "max_depth"),
            (&[("FOLDGATE_FOLDING__MAX_DEPTH", "deep")], "max_depth"),
            (&[("FOLDGATE_NO_SUCH_SETTING", "1")], "no_such_setting"),
            (&[("FOLDGATE_LISTEN", "nowhere")], "listen"),
            (&[("DATABASE_URL", "mysql://x")], "unsupported database URL"),
            (&[("FOLDGATE_AUTH_MODE", "none"), ("FOLDGATE_LISTEN", "0.0.0.0:8080")], "loopback"),
        ];
        for (vars, expected) in cases {
            let err = Config::load(None, env(vars)).unwrap_err();
            assert!(err.to_string().contains(expected), "{vars:?}: {err}");
        }
    }
}
