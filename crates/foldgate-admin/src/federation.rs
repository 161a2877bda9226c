//! The upstream MCP servers and model providers a deployment fronts, and
//! whether each upstream answers: `GET /upstreams` and `GET /models`.
//! These come from the configuration file and are read-only here.

use axum::{Json, extract::State};
use foldgate_domain::TenantId;
use serde::Serialize;
use utoipa::ToSchema;

use crate::{AdminState, access::Operator, error::AdminError};

/// Where a registration comes from.
const FROM_CONFIG: &str = "config";

/// An upstream MCP server and its health.
#[derive(Debug, Serialize, ToSchema)]
pub struct UpstreamView {
    /// Its tools are `<name>__<tool>`.
    pub name: String,
    /// Its URL, without credentials or query.
    pub url: String,
    /// The tenants it serves; absent: every tenant.
    pub tenants: Option<Vec<String>>,
    /// Its tools agents may call; absent: all it lists.
    pub tools_allowed: Option<Vec<String>>,
    /// Whether it answered its last listing or call.
    pub up: bool,
    /// Tools it offers agents now (those its allow-list keeps).
    pub tools: usize,
    /// What went wrong last, while it does not answer.
    pub last_error: Option<String>,
    /// `config`: the configuration file (read-only here).
    pub source: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UpstreamList {
    pub upstreams: Vec<UpstreamView>,
}

/// A model provider entry (`[[models]]`).
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
    pub source: &'static str,
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

/// The upstream MCP servers (a tenant admin: those serving its tenant),
/// with whether each answers.
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
    let upstreams = state
        .upstreams
        .iter()
        .filter(|u| {
            only.is_none_or(|t| serves(u.config.tenants.as_deref(), t))
                && rules.as_ref().is_none_or(|r| r.allows_upstream(u.name()))
        })
        .map(|u| {
            let (up, tools, last_error) = u.health();
            UpstreamView {
                name: u.config.name.clone(),
                url: shown(&u.config.url),
                tenants: u.config.tenants.clone(),
                tools_allowed: u.config.tools.clone(),
                up,
                tools,
                last_error,
                source: FROM_CONFIG,
            }
        })
        .collect();
    Ok(Json(UpstreamList { upstreams }))
}

/// The model providers (a tenant admin: those serving its tenant).
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
    let models = state
        .models
        .configs()
        .filter(|m| {
            only.is_none_or(|t| serves(m.tenants.as_deref(), t))
                && rules.as_ref().is_none_or(|r| r.allows_model(&m.name))
        })
        .map(|m| ModelView {
            name: m.name.clone(),
            provider: m.provider.as_str(),
            model: m.model.clone(),
            base_url: shown(&m.base_url),
            tenants: m.tenants.clone(),
            embeddings: m.embeddings,
            source: FROM_CONFIG,
        })
        .collect();
    Ok(Json(ModelList { models }))
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
