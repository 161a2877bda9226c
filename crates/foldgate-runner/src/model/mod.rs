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

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use foldgate_domain::{TenantId, Tokens, duration};
use genai::{
    ModelIden, ServiceTarget,
    chat::{
        ChatMessage, ChatOptions, ChatRequest, ChatStreamEvent, MessageContent, Tool, ToolCall,
    },
    resolver::{AuthData, Endpoint},
};
use serde::Deserialize;
use serde_json::Value;

pub use self::{
    config::{ModelConfig, Provider},
    embeddings::ModelEmbedder,
};

mod config;
mod embeddings;

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
    /// No answer within `timeout`: retried.
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
    pub origin: ModelOrigin,
    client: genai::Client,
    /// The resolved key (empty when none is configured).
    key: String,
    health: Mutex<ModelHealth>,
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
    /// A model's client, resolving `${VAR}`s in its key with `env`; nothing
    /// is contacted.
    fn build(
        http: &reqwest::Client,
        config: &ModelConfig,
        origin: ModelOrigin,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        config.validate().map_err(|e| e.to_string())?;
        let key = match &config.api_key {
            Some(raw) => {
                foldgate_upstream::expand_env(raw, env).map_err(|e| format!("api_key: {e}"))?
            }
            None => String::new(),
        };
        let client = genai::Client::builder()
            .with_reqwest(http.clone())
            .build()
            .map_err(|e| format!("building its client: {e}"))?;
        Ok(Self {
            config: config.clone(),
            origin,
            client,
            key,
            health: Mutex::new(ModelHealth::default()),
        })
    }

    /// What its calls on this replica have shown.
    pub fn health(&self) -> ModelHealth {
        self.health.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn record(&self, fault: Option<&Fault>) {
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        health.attempts += 1;
        let now = chrono::Utc::now();
        match fault {
            None => health.last_ok_at = Some(now),
            Some(fault) => {
                health.failures += 1;
                health.last_error = Some(format!("{}: {}", fault.kind, fault.detail));
                health.last_error_at = Some(now);
            }
        }
    }

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
            let result =
                tokio::time::timeout(self.config.timeout, self.attempt(request.clone(), &options))
                    .await
                    .unwrap_or_else(|_elapsed| {
                        Err(Fault {
                            kind: FaultKind::Timeout,
                            detail: format!(
                                "no answer within {}",
                                duration::show(self.config.timeout)
                            ),
                            retry_after: None,
                        })
                    });
            observer.attempt(
                &self.config,
                started.elapsed(),
                result.as_ref().err().map(|f| f.kind),
            );
            self.record(result.as_ref().err());
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

/// What a model's calls on this replica have shown, since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelHealth {
    /// Attempts made (each retry is one).
    pub attempts: u64,
    /// Attempts that failed.
    pub failures: u64,
    /// When an attempt last succeeded.
    pub last_ok_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The last failure: its kind (`rate_limited`, `timeout`, …) and
    /// detail, without the key.
    pub last_error: Option<String>,
    pub last_error_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A model registered through the admin API: its declaration, and the
/// model built from it or why it could not be built here.
type Registered = (ModelConfig, Result<Arc<Model>, String>);

/// Where a model was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelOrigin {
    /// The configuration file (`[[models]]`).
    Config,
    /// The admin API (kept in the database).
    Registered,
}

/// The models: those of the configuration file, fixed at startup, and chat
/// models registered through the admin API, which come and go while the
/// gateway runs ([`Models::apply`]).
#[derive(Debug)]
pub struct Models {
    /// What runs see: the configured models, then the registered ones by
    /// name. Replaced whole when a registration changes.
    current: RwLock<Arc<[Arc<Model>]>>,
    /// From the configuration file (the embeddings models among them).
    configured: Vec<Arc<Model>>,
    /// Registered through the admin API, by name: the declaration and the
    /// model built from it, or why it could not be built here.
    registered: Mutex<BTreeMap<String, Registered>>,
    http: reqwest::Client,
}

impl Default for Models {
    fn default() -> Self {
        Self {
            current: RwLock::new(Arc::from([])),
            configured: Vec::new(),
            registered: Mutex::default(),
            http: reqwest::Client::new(),
        }
    }
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
        let mut configured: Vec<Arc<Model>> = Vec::with_capacity(configs.len());
        for config in configs {
            let at = |e: String| format!("model {:?}: {e}", config.name);
            if configured.iter().any(|m| m.config.name == config.name) {
                return Err(at("the name is used twice".into()));
            }
            let model = Model::build(&http, config, ModelOrigin::Config, &env).map_err(at)?;
            configured.push(Arc::new(model));
        }
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::from(configured.clone())),
            configured,
            registered: Mutex::default(),
            http,
        }))
    }

    /// No models.
    pub fn none() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Makes the registered models those of `wanted` (the admin API's
    /// registrations), resolving `${VAR}`s with `env`: builds those new or
    /// changed, drops those no longer wanted. One that cannot be built here
    /// (a variable this replica lacks, a name the configuration uses, an
    /// embeddings model) is kept with its error, for the admin API to show.
    /// Returns the errors of those built now.
    pub fn apply(
        &self,
        wanted: &[ModelConfig],
        env: impl Fn(&str) -> Option<String>,
    ) -> Vec<(String, String)> {
        let mut registered = self.registered.lock().unwrap_or_else(PoisonError::into_inner);
        let before = registered.len();
        registered.retain(|name, _| wanted.iter().any(|w| &w.name == name));
        let mut changed = registered.len() != before;
        let mut errors = Vec::new();
        for config in wanted {
            if registered.get(&config.name).is_some_and(|(c, _)| c == config) {
                continue;
            }
            let built = if self.configured.iter().any(|m| m.config.name == config.name) {
                Err("the configuration file declares a model of this name".to_owned())
            } else if config.embeddings {
                Err("an embeddings model is declared in the configuration file only".to_owned())
            } else {
                Model::build(&self.http, config, ModelOrigin::Registered, &env).map(Arc::new)
            };
            if let Err(why) = &built {
                errors.push((config.name.clone(), why.clone()));
            }
            registered.insert(config.name.clone(), (config.clone(), built));
            changed = true;
        }
        if changed {
            let now: Vec<Arc<Model>> = self
                .configured
                .iter()
                .cloned()
                .chain(registered.values().filter_map(|(_, built)| built.as_ref().ok().cloned()))
                .collect();
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::from(now);
        }
        errors
    }

    /// Whether a declaration could be built here (its `${VAR}`s set),
    /// without keeping it.
    pub fn check(
        &self,
        config: &ModelConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        Model::build(&self.http, config, ModelOrigin::Registered, &env).map(drop)
    }

    /// Registered models this replica could not build, with why.
    pub fn unbuilt(&self) -> Vec<(String, String)> {
        self.registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(name, (_, built))| {
                built.as_ref().err().map(|e| (name.clone(), e.clone()))
            })
            .collect()
    }

    /// The models now, configured ones first.
    pub fn snapshot(&self) -> Arc<[Arc<Model>]> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The chat model a tenant asked for (`None`: its first), if it serves
    /// the tenant.
    pub fn for_tenant(&self, tenant: &TenantId, name: Option<&str>) -> Option<Arc<Model>> {
        self.snapshot()
            .iter()
            .filter(|m| !m.config.embeddings && m.config.serves_tenant(tenant.as_str()))
            .find(|m| name.is_none_or(|n| m.config.name == n))
            .cloned()
    }

    /// The chat models a tenant may use, by name.
    pub fn names_for(&self, tenant: &TenantId) -> Vec<String> {
        self.snapshot()
            .iter()
            .filter(|m| !m.config.embeddings && m.config.serves_tenant(tenant.as_str()))
            .map(|m| m.config.name.clone())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }
}

#[cfg(test)]
mod tests;
