//! Model providers: the `[[models]]` an operator configures, and one call of
//! a model with the provider's faults handled.
//!
//! The providers' wire formats are spoken by the `genai` crate (OpenAI's
//! Chat Completions, which vLLM, LiteLLM, Ollama and most gateways also
//! speak, and Anthropic's Messages API, streaming and not). foldgate adds
//! what a shared gateway needs around it: which tenant may use which model,
//! the operator's key (never a caller's token), a timeout per call, bounded
//! retries with backoff and jitter for rate limits, server errors, timeouts
//! and malformed answers (honouring `Retry-After`), and error texts that
//! never carry the key.

use std::{fmt, sync::Arc, time::Duration};

use foldgate_domain::{TenantId, Tokens};
use genai::{
    ModelIden, ServiceTarget,
    adapter::AdapterKind,
    chat::{
        ChatMessage, ChatOptions, ChatRequest, ChatStreamEvent, MessageContent, Tool, ToolCall,
    },
    resolver::{AuthData, Endpoint},
};
use serde::Deserialize;
use serde_json::Value;

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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

    fn adapter(self) -> AdapterKind {
        match self {
            Self::Openai => AdapterKind::OpenAI,
            Self::Anthropic => AdapterKind::Anthropic,
        }
    }
}

/// One `[[models]]` entry.
#[derive(Clone, PartialEq, Eq, Deserialize)]
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
    /// Longest one call (one attempt) may take.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    /// Ask for answers as server-sent events rather than one body.
    #[serde(default)]
    pub stream: bool,
    /// An embeddings model (for memory retrieval), not a chat model: never
    /// used by `branch_run`.
    #[serde(default)]
    pub embeddings: bool,
}

fn default_max_output() -> u32 {
    2_048
}

fn default_timeout() -> u64 {
    120
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
            .field("timeout_seconds", &self.timeout_seconds)
            .field("stream", &self.stream)
            .field("embeddings", &self.embeddings)
            .finish()
    }
}

impl ModelConfig {
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
        if !(1..=3_600).contains(&self.timeout_seconds) {
            return Err("timeout_seconds must be between 1 and 3600".into());
        }
        Ok(())
    }

    /// Whether a tenant may use this model.
    pub fn serves_tenant(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|list| list.iter().any(|t| t == tenant))
    }

    fn endpoint(&self) -> String {
        // genai appends the path (`chat/completions`, `messages`) to the root.
        let mut root = self.base_url.clone();
        if !root.ends_with('/') {
            root.push('/');
        }
        root
    }
}

/// A model's message history, as the runner builds it.
#[derive(Debug, Clone)]
pub enum Turn {
    /// The caller's task: the branch's description and prompt.
    User(String),
    /// The model's answer: its text and the tools it asked for.
    Assistant { text: String, calls: Vec<Call> },
    /// A tool's result, as the model gets it.
    ToolResult { call_id: String, content: String },
}

/// A tool the model asked for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// A tool the model may call.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// One answer of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub text: String,
    pub calls: Vec<Call>,
    /// As the provider reported them.
    pub input_tokens: Tokens,
    pub output_tokens: Tokens,
    /// Attempts made, retries included.
    pub attempts: u32,
}

/// Why a model call failed, after the retries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct ModelFailure {
    pub kind: FaultKind,
    /// For people: what happened, without the key.
    pub detail: String,
    pub attempts: u32,
}

/// What went wrong with one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// 429: retried after `Retry-After` (or backoff).
    RateLimited,
    /// 5xx or 408: retried.
    ServerError,
    /// No answer within `timeout_seconds`: retried.
    Timeout,
    /// Not reached (connection refused, reset): retried.
    Unreachable,
    /// An answer that is not the provider's format, or reports no usage:
    /// retried.
    Malformed,
    /// Refused for good (401, 403, 400, 404…): not retried.
    Refused,
}

impl FaultKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::ServerError => "server_error",
            Self::Timeout => "timeout",
            Self::Unreachable => "unreachable",
            Self::Malformed => "malformed_answer",
            Self::Refused => "refused",
        }
    }

    const fn retried(self) -> bool {
        !matches!(self, Self::Refused)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One failed attempt.
#[derive(Debug, Clone)]
struct Fault {
    kind: FaultKind,
    detail: String,
    retry_after: Option<Duration>,
}

/// How often a call is tried in all.
pub const ATTEMPTS: u32 = 3;
/// The first backoff; doubled on each retry, with ±50% jitter.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest `Retry-After` honoured; a provider asking for more is
/// waited for this long (the branch's deadline bounds the whole run).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// How much of a provider's error body is kept for the log and the reason.
const DETAIL_CHARS: usize = 300;

/// A configured model, ready to call.
pub struct Model {
    pub config: ModelConfig,
    client: genai::Client,
    /// The resolved key (empty when none is configured).
    key: String,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Observes each attempt of a model call (metrics).
pub trait AttemptObserver: Send + Sync {
    /// One attempt ended: in `duration`, with `fault` if it failed.
    fn attempt(&self, model: &ModelConfig, duration: Duration, fault: Option<FaultKind>);
}

impl Model {
    /// Calls the model: `max_tokens` caps the answer. Retries what can be
    /// retried, up to [`ATTEMPTS`] in all.
    pub async fn complete(
        &self,
        system: &str,
        turns: &[Turn],
        tools: &[ToolSpec],
        max_tokens: u32,
        observer: &dyn AttemptObserver,
    ) -> Result<Completion, ModelFailure> {
        let request = self.request(system, turns, tools);
        let options = ChatOptions::default()
            .with_max_tokens(max_tokens)
            .with_capture_usage(true)
            .with_capture_content(true)
            .with_capture_tool_calls(true);
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = std::time::Instant::now();
            let result = tokio::time::timeout(
                Duration::from_secs(self.config.timeout_seconds),
                self.attempt(request.clone(), &options),
            )
            .await
            .unwrap_or_else(|_elapsed| {
                Err(Fault {
                    kind: FaultKind::Timeout,
                    detail: format!("no answer within {} s", self.config.timeout_seconds),
                    retry_after: None,
                })
            });
            observer.attempt(
                &self.config,
                started.elapsed(),
                result.as_ref().err().map(|f| f.kind),
            );
            let fault = match result {
                Ok(mut completion) => {
                    completion.attempts = attempt;
                    return Ok(completion);
                }
                Err(fault) => fault,
            };
            tracing::warn!(model = %self.config.name, provider = self.config.provider.as_str(),
                attempt, kind = %fault.kind, detail = %fault.detail, "model call failed");
            if !fault.kind.retried() || attempt >= ATTEMPTS {
                return Err(ModelFailure {
                    kind: fault.kind,
                    detail: fault.detail,
                    attempts: attempt,
                });
            }
            let wait =
                fault.retry_after.map_or_else(|| jitter(backoff), |w| w.min(MAX_RETRY_AFTER));
            tokio::time::sleep(wait).await;
            backoff = backoff.saturating_mul(2);
        }
    }

    fn target(&self) -> ServiceTarget {
        ServiceTarget {
            endpoint: Endpoint::from_owned(self.config.endpoint()),
            auth: AuthData::from_single(self.key.clone()),
            model: ModelIden::new(self.config.provider.adapter(), self.config.model.clone()),
        }
    }

    fn request(&self, system: &str, turns: &[Turn], tools: &[ToolSpec]) -> ChatRequest {
        let messages = turns.iter().map(message).collect();
        let mut request = ChatRequest::new(messages).with_system(system);
        if !tools.is_empty() {
            request = request.with_tools(tools.iter().map(|t| {
                Tool::new(t.name.clone())
                    .with_description(t.description.clone())
                    .with_schema(t.input_schema.clone())
            }));
        }
        request
    }

    async fn attempt(
        &self,
        request: ChatRequest,
        options: &ChatOptions,
    ) -> Result<Completion, Fault> {
        let (content, usage) = if self.config.stream {
            let response = self
                .client
                .exec_chat_stream(self.target(), request, Some(options))
                .await
                .map_err(|e| self.fault(&e))?;
            let mut stream = response.stream;
            let mut end = None;
            while let Some(event) = futures::StreamExt::next(&mut stream).await {
                if let ChatStreamEvent::End(e) = event.map_err(|e| self.fault(&e))? {
                    end = Some(e);
                }
            }
            let end = end.ok_or_else(|| malformed("the stream ended without its end event"))?;
            (
                end.captured_content.unwrap_or_else(|| MessageContent::from_text("")),
                end.captured_usage,
            )
        } else {
            let response = self
                .client
                .exec_chat(self.target(), request, Some(options))
                .await
                .map_err(|e| self.fault(&e))?;
            (response.content, Some(response.usage))
        };
        let usage = usage.ok_or_else(|| malformed("the answer reports no token usage"))?;
        let (Some(input), Some(output)) = (usage.prompt_tokens, usage.completion_tokens) else {
            return Err(malformed("the answer reports no token usage"));
        };
        let text = content.texts().join("");
        let calls = content
            .tool_calls()
            .into_iter()
            .map(|c| Call {
                id: c.call_id.clone(),
                name: c.fn_name.clone(),
                arguments: c.fn_arguments.clone(),
            })
            .collect();
        Ok(Completion {
            text,
            calls,
            input_tokens: Tokens::try_from(input).unwrap_or(0),
            output_tokens: Tokens::try_from(output).unwrap_or(0),
            attempts: 1,
        })
    }

    /// What an error of genai's says, for retrying and for people, with the
    /// key (should a provider echo it) blanked out.
    fn fault(&self, e: &genai::Error) -> Fault {
        let mut fault = classify(e);
        if !self.key.is_empty() {
            fault.detail = fault.detail.replace(&self.key, "***");
        }
        fault.detail = fault.detail.chars().take(DETAIL_CHARS).collect();
        fault
    }
}

fn malformed(detail: &str) -> Fault {
    Fault { kind: FaultKind::Malformed, detail: detail.to_owned(), retry_after: None }
}

fn message(turn: &Turn) -> ChatMessage {
    match turn {
        Turn::User(text) => ChatMessage::user(text.clone()),
        Turn::Assistant { text, calls } if calls.is_empty() => ChatMessage::assistant(text.clone()),
        Turn::Assistant { text, calls } => {
            let mut parts: Vec<genai::chat::ContentPart> = Vec::new();
            if !text.is_empty() {
                parts.push(text.clone().into());
            }
            parts.extend(calls.iter().map(|c| {
                ToolCall {
                    call_id: c.id.clone(),
                    fn_name: c.name.clone(),
                    fn_arguments: c.arguments.clone(),
                    thought_signatures: None,
                }
                .into()
            }));
            ChatMessage::assistant(MessageContent::from_parts(parts))
        }
        Turn::ToolResult { call_id, content } => {
            ChatMessage::from(genai::chat::ToolResponse::new(call_id.clone(), content.clone()))
        }
    }
}

/// Sorts a genai error into what to do about it.
fn classify(e: &genai::Error) -> Fault {
    use genai::{Error, webc};
    let status = |status: reqwest::StatusCode, body: &str, headers: Option<&http::HeaderMap>| {
        let kind = match status.as_u16() {
            429 => FaultKind::RateLimited,
            408 | 500..=599 => FaultKind::ServerError,
            _ => FaultKind::Refused,
        };
        Fault {
            kind,
            detail: format!("the provider answered {status}: {}", body.trim()),
            retry_after: headers.and_then(retry_after),
        }
    };
    match e {
        Error::WebModelCall { webc_error, .. } | Error::WebAdapterCall { webc_error, .. } => {
            match webc_error {
                webc::Error::ResponseFailedStatus { status: s, body, headers } => {
                    status(*s, body, Some(headers))
                }
                webc::Error::Reqwest(r) if r.is_timeout() => Fault {
                    kind: FaultKind::Timeout,
                    detail: "timed out".into(),
                    retry_after: None,
                },
                webc::Error::Reqwest(r) => match r.status() {
                    Some(s) => status(s, &without_url(r), None),
                    None => Fault {
                        kind: FaultKind::Unreachable,
                        detail: format!("the provider could not be reached: {}", without_url(r)),
                        retry_after: None,
                    },
                },
                other => malformed(&format!("the provider's answer is unreadable: {other}")),
            }
        }
        Error::HttpError { status: s, body, headers, .. } => status(*s, body, Some(headers)),
        Error::WebStream { error, .. } => match error.downcast_ref::<Error>() {
            Some(inner @ Error::HttpError { .. }) => classify(inner),
            _ => Fault {
                kind: FaultKind::Unreachable,
                detail: "the provider's stream failed".into(),
                retry_after: None,
            },
        },
        Error::ChatResponseGeneration { cause, .. } => {
            malformed(&format!("the provider's answer is unreadable: {cause}"))
        }
        Error::StreamParse { .. }
        | Error::InvalidJsonResponseElement { .. }
        | Error::NoChatResponse { .. }
        | Error::ChatResponse { .. } => malformed("the provider's answer is unreadable"),
        other => Fault { kind: FaultKind::Refused, detail: other.to_string(), retry_after: None },
    }
}

/// A reqwest error's text without its URL (which may carry query
/// credentials).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<provider>");
    }
    text
}

/// `Retry-After` (seconds, or `retry-after-ms`).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let read = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = read("retry-after-ms").and_then(|v| v.parse::<u64>().ok()) {
        return Some(Duration::from_millis(ms));
    }
    read("retry-after").and_then(|v| v.parse::<u64>().ok()).map(Duration::from_secs)
}

/// `d` give or take half, so that callers that failed together do not
/// retry together.
fn jitter(d: Duration) -> Duration {
    let random = uuid::Uuid::new_v4().as_u128();
    #[expect(clippy::cast_precision_loss, reason = "a fraction for jitter")]
    let fraction = (random % 1_000) as f64 / 1_000.0;
    d.mul_f64(0.5 + fraction)
}

/// The configured models.
#[derive(Debug, Default)]
pub struct Models {
    list: Vec<Arc<Model>>,
}

impl Models {
    /// Builds the clients, resolving `${VAR}`s in keys with `env`. Nothing
    /// is contacted.
    pub fn new(
        configs: &[ModelConfig],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Arc<Self>, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| format!("building the model HTTP client: {e}"))?;
        let mut list = Vec::with_capacity(configs.len());
        for config in configs {
            let at = |e: String| format!("model {:?}: {e}", config.name);
            config.validate().map_err(|e| at(e.to_string()))?;
            if list.iter().any(|m: &Arc<Model>| m.config.name == config.name) {
                return Err(at("the name is used twice".into()));
            }
            let key = match &config.api_key {
                Some(raw) => foldgate_upstream::expand_env(raw, &env)
                    .map_err(|e| at(format!("api_key: {e}")))?,
                None => String::new(),
            };
            let client = genai::Client::builder()
                .with_reqwest(http.clone())
                .build()
                .map_err(|e| at(format!("building its client: {e}")))?;
            list.push(Arc::new(Model { config: config.clone(), client, key }));
        }
        Ok(Arc::new(Self { list }))
    }

    /// No models.
    pub fn none() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The chat model a tenant asked for (`None`: its first), if it serves
    /// the tenant.
    pub fn for_tenant(&self, tenant: &TenantId, name: Option<&str>) -> Option<Arc<Model>> {
        self.list
            .iter()
            .filter(|m| !m.config.embeddings && m.config.serves_tenant(tenant.as_str()))
            .find(|m| name.is_none_or(|n| m.config.name == n))
            .cloned()
    }

    /// The chat models a tenant may use, by name.
    pub fn names_for(&self, tenant: &TenantId) -> Vec<&str> {
        self.list
            .iter()
            .filter(|m| !m.config.embeddings && m.config.serves_tenant(tenant.as_str()))
            .map(|m| m.config.name.as_str())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_in_seconds_or_milliseconds() {
        let mut h = http::HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)), "the finer one wins");
    }

    #[test]
    fn jitter_stays_within_half() {
        for _ in 0..100 {
            let d = jitter(Duration::from_millis(1_000));
            assert!(d >= Duration::from_millis(500) && d < Duration::from_millis(1_500), "{d:?}");
        }
    }

    #[test]
    fn declarations_are_checked_and_keys_never_print() {
        let good: ModelConfig = toml_like(
            r#"{"name": "default", "provider": "openai", "base_url": "http://127.0.0.1:8000/v1",
                "model": "qwen3-32b", "api_key": "sk-secret"}"#,
        );
        good.validate().unwrap();
        assert_eq!(good.max_output_tokens, 2_048);
        assert_eq!(good.timeout_seconds, 120);
        assert_eq!(good.endpoint(), "http://127.0.0.1:8000/v1/");
        assert!(!format!("{good:?}").contains("sk-secret"));
        for (bad, why) in [
            (ModelConfig { name: "a b".into(), ..good.clone() }, "name"),
            (ModelConfig { base_url: "ftp://x".into(), ..good.clone() }, "base_url"),
            (ModelConfig { base_url: "not a url".into(), ..good.clone() }, "base_url"),
            (ModelConfig { model: String::new(), ..good.clone() }, "model"),
            (ModelConfig { tenants: Some(Vec::new()), ..good.clone() }, "tenants"),
            (ModelConfig { max_output_tokens: 0, ..good.clone() }, "max_output_tokens"),
            (ModelConfig { timeout_seconds: 0, ..good.clone() }, "timeout_seconds"),
            (ModelConfig { timeout_seconds: 3_601, ..good.clone() }, "timeout_seconds"),
        ] {
            let err = bad.validate().unwrap_err();
            assert!(err.to_string().contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn tenants_see_their_models_first_one_default() {
        let base = ModelConfig {
            name: "a".into(),
            provider: Provider::Openai,
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "m".into(),
            api_key: Some("${KEY}".into()),
            tenants: Some(vec!["acme".into()]),
            max_output_tokens: 100,
            timeout_seconds: 5,
            stream: false,
            embeddings: false,
        };
        let configs = [
            base.clone(),
            ModelConfig { name: "b".into(), tenants: None, ..base.clone() },
            ModelConfig { name: "e".into(), tenants: None, embeddings: true, ..base.clone() },
        ];
        let models = Models::new(&configs, |v| (v == "KEY").then(|| "k".to_owned())).unwrap();
        let acme = TenantId::parse("acme").unwrap();
        let other = TenantId::parse("other").unwrap();
        assert_eq!(models.for_tenant(&acme, None).unwrap().config.name, "a");
        assert_eq!(models.for_tenant(&other, None).unwrap().config.name, "b");
        assert!(models.for_tenant(&other, Some("a")).is_none(), "not another tenant's model");
        assert!(models.for_tenant(&acme, Some("e")).is_none(), "embeddings do not chat");
        assert_eq!(models.names_for(&acme), ["a", "b"]);
        let missing = Models::new(&configs, |_| None).unwrap_err();
        assert!(missing.contains("api_key"), "{missing}");
        let twice = Models::new(&[base.clone(), base], |_| Some("k".into())).unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
    }

    fn toml_like(json: &str) -> ModelConfig {
        serde_json::from_str(json).unwrap()
    }
}
