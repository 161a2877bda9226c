//! The upstream MCP servers and model providers a deployment fronts, with
//! how each is doing on this replica: `GET /upstreams` and `GET /models`.
//! Those of the configuration file are read-only here; others are
//! registered (`POST`) and removed (`DELETE`) through this API, kept in the
//! database and live on every replica within seconds ([`crate::sync`]).

use axum::{Json, extract::State, http::StatusCode};
use chrono::{DateTime, Utc};
use foldgate_domain::TenantId;
use foldgate_runner::{Model, ModelConfig, ModelHealth, ModelOrigin};
use foldgate_store::{Registration, RegistrationKind};
use foldgate_upstream::{Origin, Upstream, UpstreamConfig};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{
    AdminState,
    access::Operator,
    error::AdminError,
    extract::{DeclarationOf, FormerNames, Params},
    routes::{audit_entry, log_change},
};

/// Where a declaration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The configuration file: read-only here.
    Config,
    /// Registered through this API: kept in the database.
    Api,
}

/// Who registered a declaration, and when (absent for the configuration's).
#[derive(Debug, Serialize, ToSchema)]
pub struct Registered {
    pub at: DateTime<Utc>,
    /// `<tenant>/<subject>` of the token.
    pub by: String,
}

impl From<&Registration> for Registered {
    fn from(r: &Registration) -> Self {
        Self { at: r.created_at, by: format!("{}/{}", r.created_by.tenant, r.created_by.subject) }
    }
}

/// An upstream MCP server and its health on this replica.
#[derive(Debug, Serialize, ToSchema)]
pub struct UpstreamView {
    /// Its tools are `<name>__<tool>`.
    pub name: String,
    /// Its URL, without credentials or query; for a stdio upstream
    /// (configuration file only), `stdio: <program>`.
    pub url: String,
    /// The tenants it serves; absent: every tenant.
    pub tenants: Option<Vec<String>>,
    /// Its tools agents may call; absent: all it lists.
    pub tools_allowed: Option<Vec<String>>,
    /// The headers foldgate sends it (names only).
    pub headers: Vec<String>,
    /// Whether it answered its last listing or call.
    pub up: bool,
    /// Tools it offers agents now (those its allow-list keeps).
    pub tools: usize,
    /// What went wrong last, while it does not answer; for a registration
    /// this replica cannot use (an environment variable it lacks), why.
    pub last_error: Option<String>,
    pub source: Source,
    pub registered: Option<Registered>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UpstreamList {
    pub upstreams: Vec<UpstreamView>,
}

/// What a model's calls on this replica have shown since it started.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelHealthView {
    /// Attempts made (each retry is one).
    pub attempts: u64,
    pub failures: u64,
    pub last_ok_at: Option<DateTime<Utc>>,
    /// The last failure's kind and detail (never the key).
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
}

impl From<ModelHealth> for ModelHealthView {
    fn from(h: ModelHealth) -> Self {
        Self {
            attempts: h.attempts,
            failures: h.failures,
            last_ok_at: h.last_ok_at,
            last_error: h.last_error,
            last_error_at: h.last_error_at,
        }
    }
}

/// A model provider entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelView {
    pub name: String,
    /// `openai` or `anthropic`.
    pub provider: &'static str,
    /// The provider's model id.
    pub model: String,
    /// Its base URL, without credentials or query.
    pub base_url: String,
    /// The tenants it serves; absent: every tenant.
    pub tenants: Option<Vec<String>>,
    /// An embeddings model (for the memory), never run by `branch_run`.
    pub embeddings: bool,
    /// Its calls on this replica; absent while this replica cannot use it.
    pub health: Option<ModelHealthView>,
    /// Why this replica cannot use a registration (an environment variable
    /// it lacks), if it cannot.
    pub error: Option<String>,
    pub source: Source,
    pub registered: Option<Registered>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    pub models: Vec<ModelView>,
}

/// A URL as it may be shown: no user, password, query or fragment.
fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return String::new();
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if path.is_empty() { format!("{scheme}://{host}") } else { format!("{scheme}://{host}/{path}") }
}

fn serves(tenants: Option<&[String]>, tenant: &TenantId) -> bool {
    tenants.is_none_or(|list| list.iter().any(|t| t == tenant.as_str()))
}

/// The registrations of one kind, each with its declaration.
async fn registrations<T: serde::de::DeserializeOwned>(
    state: &AdminState,
    kind: RegistrationKind,
) -> Result<Vec<(Registration, T)>, AdminError> {
    let rows = state.service.store().registrations().await?;
    Ok(rows
        .into_iter()
        .filter(|r| r.kind == kind)
        .filter_map(|r| {
            let declared = serde_json::from_value(r.spec.clone()).ok()?;
            Some((r, declared))
        })
        .collect())
}

fn upstream_view(
    config: &UpstreamConfig,
    live: Option<&Upstream>,
    error: Option<String>,
    registration: Option<&Registration>,
) -> UpstreamView {
    let (up, tools, last_error) = match live {
        Some(upstream) => upstream.health(),
        None => (false, 0, Some(error.unwrap_or_else(|| NOT_LOADED.to_owned()))),
    };
    UpstreamView {
        name: config.name.clone(),
        url: config.url.as_deref().map_or_else(|| config.shown_target(), shown),
        tenants: config.tenants.clone(),
        tools_allowed: config.tools.clone(),
        headers: config.headers.keys().cloned().collect(),
        up,
        tools,
        last_error,
        source: if registration.is_some() { Source::Api } else { Source::Config },
        registered: registration.map(Registered::from),
    }
}

fn model_view(
    config: &ModelConfig,
    live: Option<&Model>,
    error: Option<String>,
    registration: Option<&Registration>,
) -> ModelView {
    ModelView {
        name: config.name.clone(),
        provider: config.provider.as_str(),
        model: config.model.clone(),
        base_url: shown(&config.base_url),
        tenants: config.tenants.clone(),
        embeddings: config.embeddings,
        health: live.map(|m| m.health().into()),
        error: if live.is_some() { None } else { Some(error.unwrap_or_else(|| NOT_LOADED.into())) },
        source: if registration.is_some() { Source::Api } else { Source::Config },
        registered: registration.map(Registered::from),
    }
}

/// A registration this replica has not read yet (it reads them every few
/// seconds).
const NOT_LOADED: &str = "registered; not loaded on this replica yet";

/// The upstream MCP servers (a tenant admin: those serving its tenant),
/// with whether each answers on this replica: the configuration file's,
/// then those registered through this API.
#[utoipa::path(
    get, path = "/upstreams", tag = "federation",
    responses((status = 200, body = UpstreamList)),
)]
pub async fn upstreams(
    State(state): State<AdminState>,
    operator: Operator,
) -> Result<Json<UpstreamList>, AdminError> {
    let only = operator.only_tenant();
    let rules = only.map(|t| state.service.tenant_rules().of(t));
    let visible = |config: &UpstreamConfig| {
        only.is_none_or(|t| serves(config.tenants.as_deref(), t))
            && rules.as_ref().is_none_or(|r| r.allows_upstream(&config.name))
    };
    let live = state.upstreams.snapshot();
    let unbuilt = state.upstreams.unbuilt();
    let mut list: Vec<UpstreamView> = live
        .iter()
        .filter(|u| u.origin == Origin::Config && visible(&u.config))
        .map(|u| upstream_view(&u.config, Some(u), None, None))
        .collect();
    for (registration, config) in
        registrations::<UpstreamConfig>(&state, RegistrationKind::Upstream).await?
    {
        if !visible(&config) {
            continue;
        }
        let built = live.iter().find(|u| u.origin == Origin::Registered && u.config == config);
        let error = unbuilt.iter().find(|(n, _)| *n == config.name).map(|(_, e)| e.clone());
        list.push(upstream_view(&config, built.map(AsRef::as_ref), error, Some(&registration)));
    }
    Ok(Json(UpstreamList { upstreams: list }))
}

/// The model providers (a tenant admin: those serving its tenant), with
/// how their calls went on this replica: the configuration file's, then
/// those registered through this API.
#[utoipa::path(
    get, path = "/models", tag = "federation",
    responses((status = 200, body = ModelList)),
)]
pub async fn models(
    State(state): State<AdminState>,
    operator: Operator,
) -> Result<Json<ModelList>, AdminError> {
    let only = operator.only_tenant();
    let rules = only.map(|t| state.service.tenant_rules().of(t));
    let visible = |config: &ModelConfig| {
        only.is_none_or(|t| serves(config.tenants.as_deref(), t))
            && rules.as_ref().is_none_or(|r| r.allows_model(&config.name))
    };
    let live = state.models.snapshot();
    let unbuilt = state.models.unbuilt();
    let mut list: Vec<ModelView> = live
        .iter()
        .filter(|m| m.origin == ModelOrigin::Config && visible(&m.config))
        .map(|m| model_view(&m.config, Some(m), None, None))
        .collect();
    for (registration, config) in
        registrations::<ModelConfig>(&state, RegistrationKind::Model).await?
    {
        if !visible(&config) {
            continue;
        }
        let built = live.iter().find(|m| m.origin == ModelOrigin::Registered && m.config == config);
        let error = unbuilt.iter().find(|(n, _)| *n == config.name).map(|(_, e)| e.clone());
        list.push(model_view(&config, built.map(AsRef::as_ref), error, Some(&registration)));
    }
    Ok(Json(ModelList { models: list }))
}

/// A registration's name, in the path.
#[derive(Debug, Deserialize)]
pub struct NamePath {
    pub name: String,
}

/// What registering and removing need to know of a kind of declaration.
trait Declaration: Serialize {
    const KIND: RegistrationKind;
    fn name(&self) -> &str;
    fn validate_registered(&self, prefix: &str) -> Result<(), String>;
    /// Whether the configuration file declares one of this name.
    fn configured(state: &AdminState, name: &str) -> bool;
    /// Whether this replica could build it (its `${VAR}`s set here).
    fn buildable(&self, state: &AdminState) -> Result<(), String>;
}

/// Adds the former names of the declarations' duration fields, which
/// registrations may still use, to the OpenAPI document (utoipa describes
/// a field by its name only).
pub(crate) struct FormerNamesDoc;

impl utoipa::Modify for FormerNamesDoc {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{
            RefOr,
            schema::{RefBuilder, Schema},
        };
        let Some(components) = openapi.components.as_mut() else { return };
        for (schema, renamed) in
            [("UpstreamConfig", UpstreamConfig::RENAMED), ("ModelConfig", ModelConfig::RENAMED)]
        {
            let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(schema) else {
                continue;
            };
            for r in renamed {
                let former = RefBuilder::new()
                    .ref_location_from_schema_name("Duration")
                    .description(Some(format!(
                        "Former name of `{}`, still accepted (a whole number of seconds, or text \
                         with units); give one of the two names, not both.",
                        r.new
                    )))
                    .build();
                object.properties.insert(r.old.to_owned(), RefOr::Ref(former));
            }
        }
    }
}

impl FormerNames for UpstreamConfig {
    const RENAMED: &'static [foldgate_domain::duration::Renamed] = Self::RENAMED;
}

impl FormerNames for ModelConfig {
    const RENAMED: &'static [foldgate_domain::duration::Renamed] = Self::RENAMED;
}

impl Declaration for UpstreamConfig {
    const KIND: RegistrationKind = RegistrationKind::Upstream;

    fn name(&self) -> &str {
        &self.name
    }

    fn validate_registered(&self, prefix: &str) -> Result<(), String> {
        Self::validate_registered(self, prefix).map_err(|e| e.to_string())
    }

    fn configured(state: &AdminState, name: &str) -> bool {
        state.upstreams.snapshot().iter().any(|u| u.origin == Origin::Config && u.name() == name)
    }

    fn buildable(&self, state: &AdminState) -> Result<(), String> {
        state.upstreams.check(self, |var| std::env::var(var).ok())
    }
}

impl Declaration for ModelConfig {
    const KIND: RegistrationKind = RegistrationKind::Model;

    fn name(&self) -> &str {
        &self.name
    }

    fn validate_registered(&self, prefix: &str) -> Result<(), String> {
        Self::validate_registered(self, prefix).map_err(|e| e.to_string())
    }

    fn configured(state: &AdminState, name: &str) -> bool {
        state
            .models
            .snapshot()
            .iter()
            .any(|m| m.origin == ModelOrigin::Config && m.config.name == name)
    }

    fn buildable(&self, state: &AdminState) -> Result<(), String> {
        state.models.check(self, |var| std::env::var(var).ok())
    }
}

/// Registers an upstream MCP server: the fields of an `[[upstreams]]`
/// entry (durations as text with units, `"30s"`, or whole seconds; the
/// former names `timeout_seconds` and `refresh_seconds` are accepted too,
/// and the declaration is kept under the new ones). Credentials (header values, the OAuth client's id and secret)
/// must be `${VAR}` references to environment variables named with the
/// `[admin] credential_env_prefix` and set on every replica. Live on every
/// replica within seconds. `foldgate:admin` only.
#[utoipa::path(
    post, path = "/upstreams", tag = "federation",
    request_body = UpstreamConfig,
    responses(
        (status = 201, body = UpstreamView),
        (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody),
    ),
)]
pub async fn register_upstream(
    State(state): State<AdminState>,
    operator: Operator,
    DeclarationOf(config): DeclarationOf<UpstreamConfig>,
) -> Result<(StatusCode, Json<UpstreamView>), AdminError> {
    let registration = register(&state, &operator, &config).await?;
    Ok((StatusCode::CREATED, Json(upstream_view(&config, None, None, Some(&registration)))))
}

/// Registers a chat model: the fields of a `[[models]]` entry (embeddings
/// models are declared in the configuration file only; `timeout` as text
/// with units or whole seconds, or by its former name `timeout_seconds`). The key must be a
/// `${VAR}` reference, as for upstreams. `foldgate:admin` only.
#[utoipa::path(
    post, path = "/models", tag = "federation",
    request_body = ModelConfig,
    responses(
        (status = 201, body = ModelView),
        (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody),
    ),
)]
pub async fn register_model(
    State(state): State<AdminState>,
    operator: Operator,
    DeclarationOf(config): DeclarationOf<ModelConfig>,
) -> Result<(StatusCode, Json<ModelView>), AdminError> {
    let registration = register(&state, &operator, &config).await?;
    Ok((StatusCode::CREATED, Json(model_view(&config, None, None, Some(&registration)))))
}

/// Removes a registered upstream from every replica. `foldgate:admin` only.
#[utoipa::path(
    delete, path = "/upstreams/{name}", tag = "federation",
    params(("name" = String, Path)),
    responses(
        (status = 204),
        (status = 404, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody),
    ),
)]
pub async fn remove_upstream(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<NamePath>,
) -> Result<StatusCode, AdminError> {
    remove::<UpstreamConfig>(&state, &operator, &path.name).await
}

/// Removes a registered model from every replica. `foldgate:admin` only.
#[utoipa::path(
    delete, path = "/models/{name}", tag = "federation",
    params(("name" = String, Path)),
    responses(
        (status = 204),
        (status = 404, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody),
    ),
)]
pub async fn remove_model(
    State(state): State<AdminState>,
    operator: Operator,
    Params(path): Params<NamePath>,
) -> Result<StatusCode, AdminError> {
    remove::<ModelConfig>(&state, &operator, &path.name).await
}

fn from_config(kind: RegistrationKind, name: &str) -> AdminError {
    let kind = kind.as_str();
    AdminError::Conflict {
        code: "declared_in_config",
        message: format!(
            "the configuration file declares the {kind} {name:?}; it is read-only here"
        ),
    }
}

/// Checks a declaration, keeps it as a registration (with its audit
/// entry) and wakes this replica's sync, so that it is live here at once
/// and elsewhere within seconds.
async fn register<D: Declaration>(
    state: &AdminState,
    operator: &Operator,
    declaration: &D,
) -> Result<Registration, AdminError> {
    if !operator.is_deployment_admin() {
        return Err(AdminError::Forbidden);
    }
    let (kind, name) = (D::KIND, declaration.name());
    declaration
        .validate_registered(&state.config.credential_env_prefix)
        .map_err(AdminError::BadRequest)?;
    if D::configured(state, name) {
        return Err(from_config(kind, name));
    }
    declaration
        .buildable(state)
        .map_err(|e| AdminError::BadRequest(format!("on this replica: {e}")))?;
    let spec =
        serde_json::to_value(declaration).map_err(|e| AdminError::Internal(e.to_string()))?;
    let registration = Registration {
        kind,
        name: name.to_owned(),
        spec: spec.clone(),
        created_at: state.service.clock().now(),
        created_by: operator.principal.clone(),
    };
    let action = format!("{}.register", kind.as_str());
    let entry = audit_entry(state, operator, None, &action, name.to_owned(), spec);
    if !state.service.store().add_registration(&registration, &entry).await? {
        return Err(AdminError::Conflict {
            code: "already_registered",
            message: format!("a {} named {name:?} is registered already", kind.as_str()),
        });
    }
    log_change(&entry);
    state.registrations_changed.activate();
    Ok(registration)
}

/// Removes a registration (with its audit entry) and wakes this replica's
/// sync.
async fn remove<D: Declaration>(
    state: &AdminState,
    operator: &Operator,
    name: &str,
) -> Result<StatusCode, AdminError> {
    if !operator.is_deployment_admin() {
        return Err(AdminError::Forbidden);
    }
    if D::configured(state, name) {
        return Err(from_config(D::KIND, name));
    }
    let action = format!("{}.remove", D::KIND.as_str());
    let entry = audit_entry(state, operator, None, &action, name.to_owned(), serde_json::json!({}));
    if !state.service.store().remove_registration(D::KIND, name, &entry).await? {
        return Err(AdminError::NotFound("registration"));
    }
    log_change(&entry);
    state.registrations_changed.activate();
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_credentials() {
        let cases = [
            ("https://files.tools.svc:9000/mcp", "https://files.tools.svc:9000/mcp"),
            ("https://user:secret@host/mcp?token=abc#x", "https://host/mcp"),
            ("http://host", "http://host"),
            ("not a url", ""),
        ];
        for (url, expected) in cases {
            assert_eq!(shown(url), expected, "{url}");
        }
    }
}
