//! The admin API, under `/admin/v1` on the MCP listener: what platform
//! teams need to run foldgate for many agent teams without editing files
//! or rolling pods.
//!
//! - `GET /tenants`: tenants with their open sessions, active branches and
//!   tokens today;
//! - `GET /tenants/{tenant}/sessions` and `…/sessions/{session_id}`: a
//!   tenant's sessions, and a session with its branch tree;
//! - `GET /tenants/{tenant}/branches/{branch_id}`: a branch with its
//!   children, its upstream calls, and a gateway-run branch's run and
//!   steps;
//! - `POST /tenants/{tenant}/branches/{branch_id}/end` and
//!   `…/sessions/{session_id}/end`: end a runaway branch or a session;
//! - `GET`/`PUT /tenants/{tenant}/limits`: a tenant's limits, budgets,
//!   allowed models and upstreams and token quotas, over the deployment's;
//! - `GET /tenants/{tenant}/usage`: what it used, per day, upstream or
//!   model;
//! - `GET`/`POST /upstreams`, `DELETE /upstreams/{name}`, and the same for
//!   `/models`: the upstream MCP servers and model providers, with how each
//!   is doing on this replica; those of the configuration file read-only,
//!   others registered here, kept in the database and live on every replica
//!   within seconds ([`sync`]);
//! - `GET /audit`: every change made through this API, who made it, when;
//! - `GET /openapi.json`: the OpenAPI document, generated from the types
//!   in [`views`] and the handlers in [`routes`].
//!
//! Tokens are the same as `/mcp`'s ([`access::authenticate`]); the scope
//! `foldgate:admin` reaches every tenant, `tenant:admin` only the token's
//! own ([`access::Operator`]). Changes are written to the audit log before
//! they are made.

use std::{convert::Infallible, sync::Arc};

use axum::{
    Json, Router,
    extract::Request,
    middleware,
    response::IntoResponse,
    routing::{Route, delete, get, post},
};
use foldgate_auth::AuthState;
use foldgate_background::Activator;
use foldgate_engine::FoldingService;
use foldgate_runner::Models;
use foldgate_upstream::Upstreams;
use tower::{Layer, Service};
use utoipa::{
    Modify, OpenApi,
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
};

pub mod access;
mod config;
pub mod error;
pub mod extract;
pub mod federation;
pub mod routes;
pub mod sync;
pub mod tenancy;
pub mod trace;
pub mod views;

pub use config::AdminConfig;
pub use error::{AdminError, too_many_requests};

use crate::federation::FormerNamesDoc;

/// Where the admin API is mounted.
pub const PREFIX: &str = "/admin/v1";

/// What the handlers need.
#[derive(Debug, Clone)]
pub struct AdminState {
    pub service: Arc<FoldingService>,
    /// The upstream MCP servers fronted.
    pub upstreams: Arc<Upstreams>,
    /// The model providers.
    pub models: Arc<Models>,
    pub config: Arc<AdminConfig>,
    /// Wakes this replica's registration sync after a change here.
    pub registrations_changed: Activator,
}

/// The admin API's OpenAPI document.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "foldgate admin API",
        description = "Tenants, sessions and branch trees, a branch's calls and steps, operator \
            ends and the audit log. \
            Bearer JWTs with the `foldgate:admin` (whole deployment) or `tenant:admin` (own \
            tenant) scope.",
    ),
    servers((url = "/admin/v1")),
    paths(
        routes::tenants,
        routes::sessions,
        routes::session,
        trace::branch,
        routes::end_branch,
        routes::end_session,
        routes::audit_log,
        tenancy::limits,
        tenancy::put_limits,
        tenancy::usage,
        federation::upstreams,
        federation::register_upstream,
        federation::remove_upstream,
        federation::models,
        federation::register_model,
        federation::remove_model,
    ),
    modifiers(&BearerAuth, &FormerNamesDoc),
    security(("bearer" = [])),
    tags(
        (name = "tenants", description = "Tenants at a glance"),
        (name = "sessions", description = "Sessions and their branch trees"),
        (name = "branches", description = "A branch's calls and steps, and ending a branch"),
        (name = "limits", description = "A tenant's limits, quotas and usage"),
        (name = "federation", description = "Upstream MCP servers and model providers: \
            health, registration and removal"),
        (name = "audit", description = "Changes made through this API"),
    ),
)]
pub struct ApiDoc;

/// Declares the bearer scheme the document's `security` names.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build(),
            ),
        );
    }
}

/// The admin API's routes, relative to [`PREFIX`]. Every route but the
/// OpenAPI document is authenticated with `auth`; `limit` wraps them after
/// authentication (the per-principal request limit).
pub fn router<S, L>(state: AdminState, auth: AuthState, limit: L) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    let document = ApiDoc::openapi();
    let api = Router::new()
        .route("/tenants", get(routes::tenants))
        .route("/tenants/{tenant}/sessions", get(routes::sessions))
        .route("/tenants/{tenant}/sessions/{session_id}", get(routes::session))
        .route("/tenants/{tenant}/sessions/{session_id}/end", post(routes::end_session))
        .route("/tenants/{tenant}/branches/{branch_id}", get(trace::branch))
        .route("/tenants/{tenant}/branches/{branch_id}/end", post(routes::end_branch))
        .route("/tenants/{tenant}/limits", get(tenancy::limits).put(tenancy::put_limits))
        .route("/tenants/{tenant}/usage", get(tenancy::usage))
        .route("/upstreams", get(federation::upstreams).post(federation::register_upstream))
        .route("/upstreams/{name}", delete(federation::remove_upstream))
        .route("/models", get(federation::models).post(federation::register_model))
        .route("/models/{name}", delete(federation::remove_model))
        .route("/audit", get(routes::audit_log))
        .with_state(state)
        // Outermost last: authenticate, then limit.
        .layer(limit)
        .layer(middleware::from_fn_with_state(auth, access::authenticate));
    Router::new()
        .route("/openapi.json", get(move || async move { Json(document.clone()) }))
        .merge(api)
        .fallback(|| async { AdminError::NotFound("route") })
}

#[cfg(test)]
mod tests {
    use utoipa::OpenApi;

    use super::*;

    #[test]
    fn durations_and_their_former_names_are_described() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let duration = &schemas["Duration"];
        let kinds: Vec<&str> = duration["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["string", "integer"], "{duration}");
        for (schema, field, former) in [
            ("UpstreamConfig", "timeout", "timeout_seconds"),
            ("UpstreamConfig", "refresh_interval", "refresh_seconds"),
            ("ModelConfig", "timeout", "timeout_seconds"),
        ] {
            let properties = &schemas[schema]["properties"];
            assert_eq!(properties[field]["$ref"], "#/components/schemas/Duration", "{schema}");
            assert!(
                properties[field]["description"]
                    .as_str()
                    .unwrap()
                    .contains("whole number of seconds"),
                "{schema}.{field}: {}",
                properties[field]
            );
            assert_eq!(properties[former]["$ref"], "#/components/schemas/Duration", "{schema}");
            let description = properties[former]["description"].as_str().unwrap();
            assert!(description.contains(&format!("Former name of `{field}`")), "{description}");
            assert_eq!(schemas[schema]["additionalProperties"], false);
        }
    }
}
