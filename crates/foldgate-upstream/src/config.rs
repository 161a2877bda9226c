//! How upstream MCP servers are declared (`[[upstreams]]` in the config
//! file).

use std::{collections::BTreeMap, fmt, time::Duration};

use foldgate_domain::{
    duration::{self, Renamed},
    redact_url,
};
use serde::{Deserialize, Serialize};

use crate::identity::{self, IdentityMode};

/// The scope a token needs to see and call an upstream's tools unless the
/// upstream names another: upstream calls are charged to branches.
pub const DEFAULT_UPSTREAM_SCOPE: &str = "fold:write";

/// Separates an upstream's name from its tool's in the names agents see.
pub const NAMESPACE_SEPARATOR: &str = "__";

/// One upstream MCP server: reached over Streamable HTTP (`url`), or run by
/// the gateway as child processes speaking MCP on their stdin and stdout
/// (`command`, only in the configuration file).
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Its tools appear as `<name>__<tool>`. Letters, digits, `-` and `_`
    /// (not `__`), at most 32 characters.
    pub name: String,
    /// The upstream's Streamable HTTP endpoint (exactly one of `url` and
    /// `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A program and its arguments, run as the upstream's MCP server over
    /// stdio (exactly one of `url` and `command`). Never from the admin API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The environment of `command`'s processes: nothing of the gateway's
    /// but `PATH`, plus these. `${VAR}` is replaced by the gateway's
    /// environment variable `VAR`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The working directory of `command`'s processes (the gateway's own if
    /// omitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// How many processes of `command` may run for one tenant at once
    /// (requests are multiplexed over each process).
    #[serde(default = "default_max_processes")]
    pub max_processes: usize,
    /// How long a process of `command` may sit unused before it is
    /// stopped: text with units (`"5m"`) or a whole number of seconds.
    #[serde(
        default = "default_idle_timeout",
        deserialize_with = "duration::seconds",
        serialize_with = "duration::serialize"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = duration::DurationSchema))]
    pub idle_timeout: Duration,
    /// The address space a process of `command` may use (`RLIMIT_AS`): a
    /// number of bytes, or text with a unit (`"512MiB"`, `"2GiB"`).
    #[serde(
        default,
        deserialize_with = "bytes::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_memory: Option<u64>,
    /// The CPU time a process of `command` may use (`RLIMIT_CPU`), in whole
    /// seconds: text with units (`"10m"`) or a number of seconds.
    #[serde(
        default,
        deserialize_with = "optional_seconds",
        serialize_with = "serialize_optional_seconds",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<duration::DurationSchema>))]
    pub max_cpu: Option<Duration>,
    /// Tenants that may use it; `None` (omitted) means every tenant.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
    /// Tools offered (by their upstream name); `None` means all of them.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Longest a call (or a tool listing) may take: text with units
    /// (`"30s"`, `"2m"`) or a whole number of seconds. Formerly
    /// `timeout_seconds`, still accepted.
    #[serde(
        default = "default_timeout",
        alias = "timeout_seconds",
        deserialize_with = "duration::seconds",
        serialize_with = "duration::serialize"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = duration::DurationSchema))]
    pub timeout: Duration,
    /// How often the tool list is fetched again while the upstream is up:
    /// text with units (`"30s"`, `"5m"`) or a whole number of seconds.
    /// Formerly `refresh_seconds`, still accepted.
    #[serde(
        default = "default_refresh",
        alias = "refresh_seconds",
        deserialize_with = "duration::seconds",
        serialize_with = "duration::serialize"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = duration::DurationSchema))]
    pub refresh_interval: Duration,
    /// Pass results through the secret scrubber before the agent sees them.
    #[serde(default = "yes")]
    pub scrub_results: bool,
    /// The scope a token needs to see and call these tools.
    #[serde(default)]
    pub scope: Option<String>,
    /// Largest response accepted from the upstream, in bytes.
    #[serde(default = "default_max_response")]
    pub max_response_bytes: usize,
    /// Headers foldgate sends with every request (its own credentials; the
    /// agent's token is never forwarded). `${VAR}` is replaced by the
    /// environment variable `VAR`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// An OAuth 2.0 client-credentials grant whose access token foldgate
    /// fetches, caches and sends as `Authorization: Bearer …`.
    #[serde(default)]
    pub oauth: Option<OAuthClientCredentials>,
    /// How the upstream learns who each call is made for: `none`,
    /// `headers` (the `Foldgate-*` headers, only to an https or loopback
    /// url) or `token` (a JWT the gateway mints; see `[identity]`).
    #[serde(default, skip_serializing_if = "is_none_mode")]
    pub identity: IdentityMode,
    /// The `aud` of the tokens minted for it (`identity = "token"`); its
    /// `url` if omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_audience: Option<String>,
}

fn is_none_mode(mode: &IdentityMode) -> bool {
    *mode == IdentityMode::None
}

/// An OAuth 2.0 client-credentials grant (RFC 6749 §4.4).
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OAuthClientCredentials {
    pub token_url: String,
    /// `${VAR}` is replaced by the environment variable `VAR`.
    pub client_id: String,
    /// `${VAR}` is replaced by the environment variable `VAR`.
    pub client_secret: String,
    /// Space-separated scopes to request.
    #[serde(default)]
    pub scope: Option<String>,
    /// The RFC 8707 `resource` to request the token for (often the
    /// upstream's URL).
    #[serde(default)]
    pub resource: Option<String>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_refresh() -> Duration {
    Duration::from_secs(30)
}

fn default_max_processes() -> usize {
    1
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(300)
}

fn optional_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    struct Seconds(#[serde(deserialize_with = "duration::whole_seconds")] Duration);
    Ok(Option::<Seconds>::deserialize(d)?.map(|s| s.0))
}

fn serialize_optional_seconds<S: serde::Serializer>(
    value: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => duration::serialize(value, s),
        None => s.serialize_none(),
    }
}

/// Sizes in bytes: a number, or text with a binary unit.
mod bytes {
    use serde::{Deserialize, Deserializer, de::Error};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }

    pub(super) fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match Option::<Size>::deserialize(d)? {
            None => Ok(None),
            Some(Size::Bytes(n)) => Ok(Some(n)),
            Some(Size::Text(text)) => parse(&text).map(Some).map_err(D::Error::custom),
        }
    }

    /// `"512MiB"`, `"2 GiB"`, `"1024"`: a whole number with an optional
    /// binary unit (KiB, MiB, GiB, TiB; KB, MB, GB and TB mean the same).
    pub(super) fn parse(text: &str) -> Result<u64, String> {
        let text = text.trim();
        let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (number, unit) = text.split_at(digits);
        let number: u64 =
            number.parse().map_err(|_| format!("{text:?} is not a size such as \"512MiB\""))?;
        let shift = match unit.trim() {
            "" | "B" => 0,
            "K" | "KB" | "KiB" => 10,
            "M" | "MB" | "MiB" => 20,
            "G" | "GB" | "GiB" => 30,
            "T" | "TB" | "TiB" => 40,
            _ => return Err(format!("{text:?} is not a size such as \"512MiB\"")),
        };
        number.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))
    }
}

fn yes() -> bool {
    true
}

fn default_max_response() -> usize {
    16 * 1024 * 1024
}

// Credentials never appear in logs or `check-config` output.
impl fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("name", &self.name)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("command", &self.command)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("max_processes", &self.max_processes)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_memory", &self.max_memory)
            .field("max_cpu", &self.max_cpu)
            .field("tenants", &self.tenants)
            .field("tools", &self.tools)
            .field("timeout", &self.timeout)
            .field("refresh_interval", &self.refresh_interval)
            .field("scrub_results", &self.scrub_results)
            .field("scope", &self.scope)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("oauth", &self.oauth)
            .field("identity", &self.identity)
            .field("identity_audience", &self.identity_audience)
            .finish()
    }
}

impl fmt::Debug for OAuthClientCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthClientCredentials")
            .field("token_url", &redact_url(&self.token_url))
            .field("client_id", &self.client_id)
            .field("client_secret", &"***")
            .field("scope", &self.scope)
            .field("resource", &self.resource)
            .finish()
    }
}

impl UpstreamConfig {
    /// The former names of its settings.
    pub const RENAMED: &'static [Renamed] = &[
        Renamed::new("timeout_seconds", "timeout"),
        Renamed::new("refresh_seconds", "refresh_interval"),
    ];

    /// The scope a token needs for these tools.
    pub fn required_scope(&self) -> &str {
        self.scope.as_deref().unwrap_or(DEFAULT_UPSTREAM_SCOPE)
    }

    /// Whether it is run as child processes over stdio (`command`).
    pub fn is_stdio(&self) -> bool {
        self.command.is_some()
    }

    /// Where it is, to be shown: its URL with any password redacted, or
    /// `stdio: <program>` (not its arguments, which may hold credentials).
    pub fn shown_target(&self) -> String {
        match (&self.url, &self.command) {
            (Some(url), _) => redact_url(url),
            (None, Some(command)) => {
                format!("stdio: {}", command.first().map_or("", String::as_str))
            }
            (None, None) => String::new(),
        }
    }

    /// Whether a tenant may use this upstream.
    pub fn serves_tenant(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|list| list.iter().any(|t| t == tenant))
    }

    /// Whether an upstream tool is offered.
    pub fn offers(&self, tool: &str) -> bool {
        self.tools.as_ref().is_none_or(|list| list.iter().any(|t| t == tool))
    }

    /// Checks the declaration (without resolving `${VAR}`s).
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        let name = &self.name;
        let valid_name = !name.is_empty()
            && name.len() <= 32
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !name.contains(NAMESPACE_SEPARATOR)
            && !name.ends_with('_');
        if !valid_name {
            return Err(format!(
                "name {name:?} must be 1 to 32 letters, digits, '-' or '_', without \"__\" and not ending in '_'"
            ).into());
        }
        match (&self.url, &self.command) {
            (Some(url), None) => {
                check_url("url", url)?;
                self.check_http_only()?;
            }
            (None, Some(command)) => self.check_command(command)?,
            (Some(_), Some(_)) => {
                return Err("set either url (Streamable HTTP) or command (stdio), not both".into());
            }
            (None, None) => {
                return Err("set url (a Streamable HTTP server) or command (a stdio server)".into());
            }
        }
        duration::check_range(
            "timeout",
            self.timeout,
            Duration::from_secs(1),
            Duration::from_secs(3600),
        )?;
        // At most a day: an upstream's tools are not left unlisted longer.
        duration::check_range(
            "refresh_interval",
            self.refresh_interval,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )?;
        if !(1..=64).contains(&self.max_processes) {
            return Err(
                format!("max_processes must be from 1 to 64, got {}", self.max_processes).into()
            );
        }
        duration::check_range(
            "idle_timeout",
            self.idle_timeout,
            Duration::from_secs(1),
            Duration::from_secs(86_400 * 7),
        )?;
        if self.max_response_bytes < 1024 {
            return Err("max_response_bytes must be at least 1024".into());
        }
        if self.tenants.as_ref().is_some_and(Vec::is_empty) {
            return Err("tenants is empty: omit it to serve every tenant".into());
        }
        for header in self.headers.keys() {
            let parsed = http::HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| format!("headers: {header:?} is not a header name"))?;
            if RESERVED_HEADERS.contains(&parsed.as_str()) {
                return Err(format!("headers: {header:?} is set by foldgate itself").into());
            }
            if parsed == http::header::AUTHORIZATION && self.oauth.is_some() {
                return Err("headers: Authorization conflicts with oauth".into());
            }
        }
        if let Some(oauth) = &self.oauth {
            check_url("oauth.token_url", &oauth.token_url)?;
            if oauth.client_id.is_empty() {
                return Err("oauth.client_id is empty".into());
            }
        }
        self.check_identity()?;
        Ok(())
    }

    /// `identity` and `identity_audience` fit the rest.
    fn check_identity(&self) -> Result<(), String> {
        if self.identity_audience.is_some() && self.identity != IdentityMode::Token {
            return Err("identity_audience is only used with identity = \"token\"".into());
        }
        if self.identity_audience.as_deref().is_some_and(|a| a.trim().is_empty()) {
            return Err("identity_audience is empty: omit it to use the url".into());
        }
        if self.identity == IdentityMode::None {
            return Ok(());
        }
        let Some(url) = &self.url else {
            return Err("identity: only an upstream with a url (HTTP) is told who calls".into());
        };
        match self.identity {
            IdentityMode::Headers => {
                let private = reqwest::Url::parse(url).is_ok_and(|u| identity::private_path(&u));
                if !private {
                    return Err("identity = \"headers\" sends who calls in plain headers: \
                                only to an https or loopback url"
                        .into());
                }
            }
            IdentityMode::Token => {
                if self.oauth.is_some() {
                    return Err("identity = \"token\" conflicts with oauth: both send \
                                Authorization"
                        .into());
                }
                if self.headers.keys().any(|h| h.eq_ignore_ascii_case("authorization")) {
                    return Err(
                        "identity = \"token\" conflicts with an Authorization header".into()
                    );
                }
            }
            IdentityMode::None => {}
        }
        Ok(())
    }

    /// The `aud` of tokens minted for it.
    pub fn audience(&self) -> &str {
        self.identity_audience.as_deref().or(self.url.as_deref()).unwrap_or(&self.name)
    }
}

impl UpstreamConfig {
    /// The settings of a stdio upstream: a program, no HTTP settings, a
    /// sane environment and limits.
    fn check_command(&self, command: &[String]) -> Result<(), String> {
        match command.first() {
            None => return Err("command is empty: give the program and its arguments".into()),
            Some(program) if program.trim().is_empty() => {
                return Err("command: the program name is empty".into());
            }
            Some(_) => {}
        }
        if command.iter().any(|a| a.contains('\0')) {
            return Err("command: an argument contains a NUL character".into());
        }
        if !self.headers.is_empty() {
            return Err("headers: only an upstream with a url (HTTP) sends headers".into());
        }
        if self.oauth.is_some() {
            return Err("oauth: only an upstream with a url (HTTP) uses OAuth".into());
        }
        for name in self.env.keys() {
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("env: {name:?} is not a variable name"));
            }
        }
        if self.cwd.as_deref().is_some_and(str::is_empty) {
            return Err("cwd is empty: omit it to use the gateway's working directory".into());
        }
        if self.max_memory.is_some_and(|m| m < 16 << 20) {
            return Err("max_memory must be at least 16MiB".into());
        }
        if self.max_cpu.is_some_and(|c| c < Duration::from_secs(1)) {
            return Err("max_cpu must be at least 1s".into());
        }
        Ok(())
    }

    /// The settings only a stdio upstream has are not set.
    fn check_http_only(&self) -> Result<(), String> {
        let stdio_only = [
            ("env", !self.env.is_empty()),
            ("cwd", self.cwd.is_some()),
            ("max_memory", self.max_memory.is_some()),
            ("max_cpu", self.max_cpu.is_some()),
            ("max_processes", self.max_processes != default_max_processes()),
            ("idle_timeout", self.idle_timeout != default_idle_timeout()),
        ];
        match stdio_only.iter().find(|(_, set)| *set) {
            Some((name, _)) => {
                Err(format!("{name}: only an upstream with a command (stdio) has it"))
            }
            None => Ok(()),
        }
    }
}

impl UpstreamConfig {
    /// Checks a declaration made through the admin API, which is kept in
    /// the database: as [`UpstreamConfig::validate`], and every credential
    /// (header values, the OAuth client's id and secret) only references
    /// environment variables whose names start with `prefix`
    /// ([`check_credential`]).
    /// A registered upstream is never a `command`: that would let a caller
    /// of the admin API run programs on the gateway's hosts.
    pub fn validate_registered(&self, prefix: &str) -> Result<(), foldgate_domain::ConfigError> {
        if self.command.is_some() {
            return Err("command: an upstream registered through the admin API must be reached \
                        by url; only the configuration file may declare a stdio upstream \
                        (command)"
                .into());
        }
        self.validate()?;
        for (name, value) in &self.headers {
            check_credential(&format!("headers.{name}"), value, prefix)?;
        }
        if let Some(oauth) = &self.oauth {
            check_credential("oauth.client_id", &oauth.client_id, prefix)?;
            check_credential("oauth.client_secret", &oauth.client_secret, prefix)?;
        }
        Ok(())
    }
}

/// Checks a credential declared through the admin API: it must name at
/// least one environment variable (`${VAR}`) and only variables whose names
/// start with `prefix`, so that no secret is kept in the database and no
/// other variable of the gateway's environment (its own database password,
/// say) can be sent to a server the declaration names.
pub fn check_credential(field: &str, value: &str, prefix: &str) -> Result<(), String> {
    let named = std::cell::RefCell::new(Vec::new());
    expand_env(value, |var| {
        named.borrow_mut().push(var.to_owned());
        Some(String::new())
    })
    .map_err(|e| format!("{field}: {e}"))?;
    let named = named.into_inner();
    if named.is_empty() {
        return Err(format!(
            "{field}: a credential registered through the API must be a reference to an \
             environment variable, such as \"${{{prefix}NAME}}\", set on every replica; \
             it is not kept in the database"
        ));
    }
    if let Some(other) = named.iter().find(|var| !var.starts_with(prefix)) {
        return Err(format!(
            "{field}: ${{{other}}} is not allowed: a registration may only read environment \
             variables whose names start with {prefix:?}"
        ));
    }
    Ok(())
}

/// Headers that belong to the MCP transport.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "content-length",
    "host",
    // Who calls (`identity = "headers"`): never a fixed value.
    "foldgate-tenant",
    "foldgate-subject",
    "foldgate-scope",
    "foldgate-branch",
];

fn check_url(field: &str, url: &str) -> Result<(), String> {
    let shown = redact_url(url);
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{field} {shown:?}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{field} {shown:?} must be an http(s) URL"));
    }
    Ok(())
}

/// Replaces every `${VAR}` with the value of the environment variable
/// `VAR`, as `lookup` gives it. `$$` is a literal `$`.
pub fn expand_env(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').ok_or_else(|| "unterminated ${".to_owned())?;
            let var = &body[..end];
            let valid =
                !var.is_empty() && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("${{{var}}} is not a variable name"));
            }
            let value =
                lookup(var).ok_or_else(|| format!("environment variable {var} is not set"))?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(name: &str) -> UpstreamConfig {
        toml_upstream(&format!("name = {name:?}\nurl = \"http://127.0.0.1:9000/mcp\""))
    }

    fn toml_upstream(src: &str) -> UpstreamConfig {
        #[derive(Deserialize)]
        struct One {
            upstreams: Vec<UpstreamConfig>,
        }
        let doc = format!("[[upstreams]]\n{src}");
        let one: One = toml::from_str(&doc).unwrap();
        one.upstreams.into_iter().next().unwrap()
    }

    #[test]
    fn names_are_checked() {
        for good in ["files", "git-hub", "a", "team_files", "X9"] {
            upstream(good).validate().unwrap();
        }
        for bad in ["", "a__b", "files_", "with space", "dots.no", &"x".repeat(33)] {
            assert!(upstream(bad).validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults_and_checks() {
        let u = upstream("files");
        assert_eq!(u.timeout, Duration::from_secs(30));
        assert_eq!(u.refresh_interval, Duration::from_secs(30));
        assert!(u.scrub_results);
        assert_eq!(u.required_scope(), DEFAULT_UPSTREAM_SCOPE);
        assert!(u.serves_tenant("anyone") && u.offers("anything"));
        let u = toml_upstream(
            "name = \"f\"\nurl = \"http://h/mcp\"\ntenants = [\"acme\"]\ntools = [\"read\"]",
        );
        assert!(u.serves_tenant("acme") && !u.serves_tenant("other"));
        assert!(u.offers("read") && !u.offers("write"));
        let bad = |src: &str| {
            toml_upstream(&format!("name = \"f\"\n{src}")).validate().unwrap_err().to_string()
        };
        assert!(bad("url = \"ftp://h\"").contains("http"));
        assert!(
            bad("url = \"http://h\"\ntimeout_seconds = 0")
                .contains("timeout must be from 1s to 1h, got 0s")
        );
        assert!(
            bad("url = \"http://h\"\nrefresh_interval = \"2d\"")
                .contains("refresh_interval must be from 1s to 1d, got 2d")
        );
        assert!(bad("url = \"http://h\"\ntenants = []").contains("tenants"));
        assert!(
            bad("url = \"http://h\"\n[upstreams.headers]\nMcp-Session-Id = \"x\"")
                .contains("foldgate")
        );
        assert!(
            bad("url = \"http://h\"\n[upstreams.headers]\nAuthorization = \"x\"\n[upstreams.oauth]\ntoken_url = \"http://t\"\nclient_id = \"c\"\nclient_secret = \"s\"")
                .contains("oauth")
        );
    }

    #[test]
    fn identity_fits_the_rest_of_the_declaration() {
        let check = |src: &str| toml_upstream(&format!("name = \"f\"\n{src}")).validate();
        let refused = |src: &str| check(src).unwrap_err().to_string();
        for fine in [
            "url = \"https://repo.example/mcp\"\nidentity = \"headers\"",
            "url = \"http://127.0.0.1:9000/mcp\"\nidentity = \"headers\"",
            "url = \"http://localhost:9000/mcp\"\nidentity = \"headers\"",
            "url = \"http://repo.example/mcp\"\nidentity = \"token\"",
            "url = \"http://h/mcp\"\nidentity = \"token\"\nidentity_audience = \"urn:repo\"",
            "url = \"http://h/mcp\"\nidentity = \"none\"",
        ] {
            check(fine).unwrap_or_else(|e| panic!("{fine}: {e}"));
        }
        assert!(
            refused("url = \"http://repo.example/mcp\"\nidentity = \"headers\"")
                .contains("only to an https or loopback url")
        );
        assert!(
            refused("url = \"http://h\"\nidentity = \"token\"\n[upstreams.oauth]\ntoken_url = \"http://t\"\nclient_id = \"c\"\nclient_secret = \"s\"")
                .contains("conflicts with oauth")
        );
        assert!(
            refused("url = \"http://h\"\nidentity = \"token\"\n[upstreams.headers]\nauthorization = \"x\"")
                .contains("conflicts with an Authorization header")
        );
        assert!(
            refused("url = \"http://h\"\nidentity_audience = \"urn:x\"")
                .contains("identity_audience is only used with identity = \"token\"")
        );
        assert!(
            refused("url = \"http://h\"\nidentity = \"token\"\nidentity_audience = \" \"")
                .contains("identity_audience is empty")
        );
        assert!(
            refused("command = [\"srv\"]\nidentity = \"token\"")
                .contains("only an upstream with a url (HTTP) is told who calls")
        );
        assert!(
            refused("url = \"https://h\"\nidentity = \"headers\"\n[upstreams.headers]\nFoldgate-Tenant = \"acme\"")
                .contains("set by foldgate itself")
        );
        let audience =
            |src: &str| toml_upstream(&format!("name = \"f\"\n{src}")).audience().to_owned();
        assert_eq!(audience("url = \"http://h/mcp\"\nidentity = \"token\""), "http://h/mcp");
        assert_eq!(
            audience("url = \"http://h/mcp\"\nidentity = \"token\"\nidentity_audience = \"urn:r\""),
            "urn:r"
        );
    }

    #[test]
    fn credentials_are_not_printed() {
        let u = toml_upstream(
            "name = \"f\"\nurl = \"http://h\"\n[upstreams.headers]\nAuthorization = \"Bearer hunter2\"\n[upstreams.oauth]\ntoken_url = \"http://t\"\nclient_id = \"c\"\nclient_secret = \"s3cret\"",
        );
        let shown = format!("{u:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("Authorization"));
    }

    /// A URL's password, or a token in its query, is neither in the `Debug`
    /// form nor in an error about the URL (found by fuzzing the config
    /// loader).
    #[test]
    fn url_passwords_are_not_printed() {
        let u = toml_upstream(
            "name = \"f\"\nurl = \"http://bot:hunter2@h/mcp?token=t0ps3cret\"\n[upstreams.oauth]\ntoken_url = \"http://c:s3cret@t\"\nclient_id = \"c\"\nclient_secret = \"x\"",
        );
        let shown = format!("{u:?}");
        assert!(["hunter2", "t0ps3cret", "s3cret"].iter().all(|s| !shown.contains(s)), "{shown}");
        assert!(shown.contains("http://bot:***@h/mcp?token=***"), "{shown}");
        let bad = toml_upstream("name = \"f\"\nurl = \"ftp://bot:hunter2@h/mcp\"");
        let error = bad.validate().unwrap_err().to_string();
        assert!(!error.contains("hunter2") && error.contains("ftp://bot:***@h/mcp"), "{error}");
    }

    #[test]
    fn registered_credentials_are_references_to_allowed_variables() {
        let with = |headers: &str| {
            toml_upstream(&format!(
                "name = \"f\"\nurl = \"http://h/mcp\"\n[upstreams.headers]\n{headers}"
            ))
            .validate_registered("FOLDGATE_SECRET_")
        };
        with("Authorization = \"Bearer ${FOLDGATE_SECRET_FILES}\"").unwrap();
        with("X-Key = \"${FOLDGATE_SECRET_A}:${FOLDGATE_SECRET_B}\"").unwrap();
        let literal = with("Authorization = \"Bearer hunter2\"").unwrap_err().to_string();
        assert!(literal.contains("headers.Authorization") && literal.contains("database"));
        let other = with("Authorization = \"Bearer ${DATABASE_PASSWORD}\"").unwrap_err();
        assert!(other.to_string().contains("DATABASE_PASSWORD"), "{other}");
        let mixed = with("X = \"${FOLDGATE_SECRET_A}${HOME}\"").unwrap_err();
        assert!(mixed.to_string().contains("HOME"));
        assert!(with("X = \"${FOLDGATE_SECRET_\"").is_err(), "unterminated");
        let oauth = toml_upstream(
            "name = \"f\"\nurl = \"http://h\"\n[upstreams.oauth]\ntoken_url = \"http://t\"\nclient_id = \"${FOLDGATE_SECRET_ID}\"\nclient_secret = \"s3cret\"",
        );
        assert!(
            oauth
                .validate_registered("FOLDGATE_SECRET_")
                .unwrap_err()
                .to_string()
                .contains("oauth.client_secret")
        );
    }

    #[test]
    fn stdio_upstreams_are_checked() {
        let u = toml_upstream("name = \"fs\"\ncommand = [\"mcp-server-filesystem\", \"/srv\"]");
        u.validate().unwrap();
        assert!(u.is_stdio());
        assert_eq!(u.max_processes, 1);
        assert_eq!(u.idle_timeout, Duration::from_secs(300));
        assert_eq!((u.max_memory, u.max_cpu), (None, None));
        assert_eq!(u.shown_target(), "stdio: mcp-server-filesystem");
        let u = toml_upstream(
            "name = \"fs\"\ncommand = [\"prog\"]\ncwd = \"/srv\"\nmax_processes = 4\nidle_timeout = \"10m\"\nmax_memory = \"512MiB\"\nmax_cpu = \"1m\"\n[upstreams.env]\nTOKEN = \"${FS_TOKEN}\"",
        );
        u.validate().unwrap();
        assert_eq!(u.max_memory, Some(512 << 20));
        assert_eq!(u.max_cpu, Some(Duration::from_secs(60)));
        assert_eq!(u.idle_timeout, Duration::from_secs(600));
        let shown = format!("{u:?}");
        assert!(shown.contains("TOKEN") && !shown.contains("FS_TOKEN"), "{shown}");
        assert_eq!(
            toml_upstream("name = \"f\"\ncommand = [\"p\"]\nmax_memory = 1048576000").max_memory,
            Some(1_048_576_000)
        );

        let bad = |src: &str| {
            toml_upstream(&format!("name = \"f\"\n{src}")).validate().unwrap_err().to_string()
        };
        assert!(bad("").contains("set url") && bad("").contains("command"));
        assert!(bad("url = \"http://h\"\ncommand = [\"p\"]").contains("not both"));
        assert!(bad("command = []").contains("command is empty"));
        assert!(bad("command = [\"  \"]").contains("program name is empty"));
        assert!(bad("command = [\"p\"]\n[upstreams.headers]\nX = \"y\"").contains("headers"));
        assert!(
            bad("command = [\"p\"]\n[upstreams.oauth]\ntoken_url = \"http://t\"\nclient_id = \"c\"\nclient_secret = \"s\"")
                .contains("oauth")
        );
        assert!(bad("command = [\"p\"]\n[upstreams.env]\n\"A-B\" = \"x\"").contains("A-B"));
        assert!(bad("command = [\"p\"]\nmax_processes = 0").contains("max_processes"));
        assert!(bad("command = [\"p\"]\nmax_processes = 65").contains("max_processes"));
        assert!(bad("command = [\"p\"]\nidle_timeout = 0").contains("idle_timeout"));
        assert!(bad("command = [\"p\"]\nmax_memory = \"1MiB\"").contains("max_memory"));
        assert!(bad("command = [\"p\"]\ncwd = \"\"").contains("cwd"));
        // Settings of stdio upstreams are refused on an HTTP one.
        assert!(bad("url = \"http://h\"\ncwd = \"/srv\"").contains("cwd"));
        assert!(bad("url = \"http://h\"\nmax_cpu = 10").contains("max_cpu"));
        assert!(bad("url = \"http://h\"\n[upstreams.env]\nA = \"b\"").contains("env"));
        // Unreadable sizes are refused when the file is read.
        #[derive(Debug, Deserialize)]
        struct One {
            #[allow(dead_code, reason = "only whether it parses")]
            upstreams: Vec<UpstreamConfig>,
        }
        let unreadable = toml::from_str::<One>(
            "[[upstreams]]\nname = \"f\"\ncommand = [\"p\"]\nmax_memory = \"lots\"",
        );
        assert!(unreadable.unwrap_err().to_string().contains("512MiB"));
    }

    #[test]
    fn sizes_are_read_with_binary_units() {
        assert_eq!(bytes::parse("1024"), Ok(1024));
        assert_eq!(bytes::parse("512MiB"), Ok(512 << 20));
        assert_eq!(bytes::parse(" 2 GiB "), Ok(2 << 30));
        assert_eq!(bytes::parse("3K"), Ok(3 << 10));
        assert!(bytes::parse("1.5GiB").is_err());
        assert!(bytes::parse("MiB").is_err());
        assert!(bytes::parse("99999999999TiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn a_registered_upstream_cannot_be_a_command() {
        let u = toml_upstream("name = \"f\"\ncommand = [\"/bin/sh\", \"-c\", \"id\"]");
        let error = u.validate_registered("FOLDGATE_SECRET_").unwrap_err().to_string();
        assert!(error.contains("command") && error.contains("configuration file"), "{error}");
    }

    #[test]
    fn environment_references_are_expanded() {
        let env = |v: &str| (v == "TOKEN").then(|| "abc".to_owned());
        assert_eq!(expand_env("Bearer ${TOKEN}", env).unwrap(), "Bearer abc");
        assert_eq!(expand_env("a$$b $x", env).unwrap(), "a$b $x");
        assert!(expand_env("${MISSING}", env).unwrap_err().contains("MISSING"));
        assert!(expand_env("${TOKEN", env).is_err());
        assert!(expand_env("${BAD-NAME}", env).is_err());
    }
}
