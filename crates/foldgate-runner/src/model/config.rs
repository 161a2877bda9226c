//! A `[[models]]` entry: which provider, where, with which key, for which tenants.

use std::{fmt, time::Duration};

use foldgate_domain::duration::{self, Renamed};
use genai::adapter::AdapterKind;
use serde::{Deserialize, Serialize};

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`).
    Openai,
    /// Anthropic's Messages API (`POST {base_url}/messages`).
    Anthropic,
}

impl Provider {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    pub(super) fn adapter(self) -> AdapterKind {
        match self {
            Self::Openai => AdapterKind::OpenAI,
            Self::Anthropic => AdapterKind::Anthropic,
        }
    }
}

/// One `[[models]]` entry.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// What `branch_run`'s `model` argument names; the first entry serving
    /// a tenant is its default.
    pub name: String,
    pub provider: Provider,
    /// The provider's API root, e.g. `http://127.0.0.1:8000/v1` or
    /// `https://api.anthropic.com/v1`.
    pub base_url: String,
    /// The provider's model id.
    pub model: String,
    /// The operator's key; `${VAR}` is replaced by the environment variable
    /// `VAR`. Never a caller's token.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Tenants that may use it; `None` (omitted) means every tenant.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
    /// The most tokens one answer may have (the cap before the budget's).
    #[serde(default = "default_max_output")]
    pub max_output_tokens: u32,
    /// Longest one call (one attempt) may take: text with units (`"2m"`,
    /// `"90s"`) or a whole number of seconds. Formerly `timeout_seconds`,
    /// still accepted.
    #[serde(
        default = "default_timeout",
        alias = "timeout_seconds",
        deserialize_with = "duration::seconds",
        serialize_with = "duration::serialize"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = duration::DurationSchema))]
    pub timeout: Duration,
    /// Ask for answers as server-sent events rather than one body.
    #[serde(default)]
    pub stream: bool,
    /// An embeddings model (`POST {base_url}/embeddings`, OpenAI's format),
    /// for ranking the memory, not a chat model: never used by
    /// `branch_run` or distillation. The first one serving a tenant ranks
    /// its memory.
    #[serde(default)]
    pub embeddings: bool,
}

fn default_max_output() -> u32 {
    2_048
}

fn default_timeout() -> Duration {
    Duration::from_secs(120)
}

// The key never appears in logs or `check-config` output.
impl fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelConfig")
            .field("name", &self.name)
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("tenants", &self.tenants)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("timeout", &self.timeout)
            .field("stream", &self.stream)
            .field("embeddings", &self.embeddings)
            .finish()
    }
}

impl ModelConfig {
    /// The former names of its settings.
    pub const RENAMED: &'static [Renamed] = &[Renamed::new("timeout_seconds", "timeout")];

    /// Checks the declaration (without resolving `${VAR}`s).
    pub fn validate(&self) -> Result<(), foldgate_domain::ConfigError> {
        let name = &self.name;
        if name.is_empty()
            || name.len() > 64
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "name {name:?}: 1-64 letters, digits, `-`, `_` or `.` are allowed"
            )
            .into());
        }
        let url = reqwest::Url::parse(&self.base_url)
            .map_err(|e| format!("base_url {:?}: {e}", self.base_url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("base_url {:?}: must be http or https", self.base_url).into());
        }
        if self.model.is_empty() {
            return Err("model must not be empty".into());
        }
        if self.tenants.as_ref().is_some_and(Vec::is_empty) {
            return Err("tenants is empty: omit it to serve every tenant".into());
        }
        if !(1..=1_000_000).contains(&self.max_output_tokens) {
            return Err("max_output_tokens must be between 1 and 1000000".into());
        }
        duration::check_range(
            "timeout",
            self.timeout,
            Duration::from_secs(1),
            Duration::from_secs(3600),
        )?;
        if self.embeddings && self.provider != Provider::Openai {
            return Err(format!(
                "embeddings = true needs provider = \"openai\" (an OpenAI-compatible \
                 /embeddings endpoint), not {:?}",
                self.provider.as_str()
            )
            .into());
        }
        if self.embeddings && self.stream {
            return Err("stream does not apply to an embeddings model: leave it out".into());
        }
        Ok(())
    }

    /// Checks a declaration made through the admin API, which is kept in
    /// the database: as [`ModelConfig::validate`], a chat model (the
    /// memory's embeddings models are fixed at startup), and a key that only
    /// references environment variables whose names start with `prefix`.
    pub fn validate_registered(&self, prefix: &str) -> Result<(), foldgate_domain::ConfigError> {
        self.validate()?;
        if self.embeddings {
            return Err("an embeddings model can only be declared in the configuration file".into());
        }
        if let Some(key) = &self.api_key {
            foldgate_upstream::check_credential("api_key", key, prefix)?;
        }
        Ok(())
    }

    /// Whether a tenant may use this model.
    pub fn serves_tenant(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|list| list.iter().any(|t| t == tenant))
    }

    pub(super) fn endpoint(&self) -> String {
        // genai appends the path (`chat/completions`, `messages`) to the root.
        let mut root = self.base_url.clone();
        if !root.ends_with('/') {
            root.push('/');
        }
        root
    }
}
