//! The HTTP application: routes and the layers in front of `/mcp`.

use std::{sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{MatchedPath, State},
    http::{HeaderName, StatusCode},
    middleware,
    response::{IntoResponse, Response},
    routing::get,
};
use foldgate_background::{Activator, Board, Driver};
use foldgate_engine::FoldingService;
use foldgate_telemetry::Prometheus;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::{
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    timeout::TimeoutLayer,
    trace::TraceLayer,
};
use tracing::Span;

use crate::{
    ApiConfig,
    auth::{self, AuthState},
    error,
    exchange::{self, ExchangeState},
    guard::{self, GuardState, HostOriginPolicy},
    limit,
    metrics::{self, ApiMetrics},
    tools::FoldingTools,
};
use foldgate_upstream::{Upstreams, identity::Signer};

/// Everything the HTTP application needs.
#[derive(Clone)]
pub struct Gateway {
    pub service: Arc<FoldingService>,
    /// The upstream MCP servers fronted (none by default).
    pub upstreams: Arc<Upstreams>,
    /// Works inside gateway-run branches.
    pub runner: Arc<foldgate_runner::Runner>,
    pub auth: AuthState,
    pub config: ApiConfig,
    /// The admin API's settings (`[admin]`).
    pub admin: foldgate_admin::AdminConfig,
    /// The canonical MCP URL (`public_url`, or derived from the listener).
    pub mcp_url: String,
    /// The trusted token issuers, published as the authorization servers
    /// in the protected resource metadata.
    pub authorization_servers: Vec<String>,
    /// What the background tasks last did: `/readyz` reports whether they
    /// all run.
    pub background: Board,
    /// Cancelled on shutdown: open MCP streams end.
    pub shutdown: CancellationToken,
    /// Where the HTTP layers and the MCP handlers record metrics.
    pub metrics: ApiMetrics,
    /// The identity provider operators sign in to the console with, if any.
    pub console_sign_in: Option<foldgate_console::OidcSignIn>,
    /// Signs the tokens minted for upstreams; its public keys are served at
    /// `/.well-known/jwks.json`.
    pub signer: Arc<Signer>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("mcp_url", &self.mcp_url).finish_non_exhaustive()
    }
}

/// Builds the application, registering its background tasks (the rate
/// limiter's cleanup, the database outage check, the sync of the admin
/// API's registrations) on `driver`.
pub fn router(gateway: Gateway, driver: &mut Driver) -> Result<Router, String> {
    let config = &gateway.config;
    let metadata_url: Arc<str> = gateway.auth.resource_metadata_url().into();

    let tools = FoldingTools::new(
        Arc::clone(&gateway.service),
        Arc::clone(&gateway.upstreams),
        Arc::clone(&gateway.runner),
        config.request_timeout,
    );
    let mcp = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_sse_keep_alive(None)
            // Host and Origin are checked in front, before authentication.
            .disable_allowed_hosts()
            .disable_allowed_origins()
            .with_max_request_body_bytes(config.max_body_bytes)
            .with_cancellation_token(gateway.shutdown.child_token()),
    );

    let policy = Arc::new(
        HostOriginPolicy::new(&allowed_hosts(config, &gateway.mcp_url), &config.allowed_origins)
            .map_err(|e| format!("api.{e}"))?,
    );
    let guard_state = GuardState {
        folding: Arc::new(gateway.service.config().clone()),
        tenants: Arc::clone(gateway.service.tenant_rules()),
        upstreams: Arc::clone(&gateway.upstreams),
        resource_metadata: Arc::clone(&metadata_url),
    };
    let outage = error::Outage::new(Arc::clone(gateway.service.store()));
    outage.register(driver);
    let exchange_state =
        ExchangeState { guard: guard_state, metrics: gateway.metrics.mcp.clone(), outage };
    let limit = limit::layer(config.rate_limit, driver, gateway.metrics.rate_limited.clone())?;
    let admin_state = foldgate_admin::AdminState {
        service: Arc::clone(&gateway.service),
        upstreams: Arc::clone(&gateway.upstreams),
        models: Arc::clone(gateway.runner.models()),
        config: Arc::new(gateway.admin.clone()),
        registrations_changed: Activator::new(),
    };
    foldgate_admin::sync::register(driver, &admin_state);
    let admin = foldgate_admin::router(
        admin_state,
        gateway.auth.clone().with_rejections(gateway.metrics.auth_rejected.clone()),
        limit::answering(
            limit.clone(),
            gateway.metrics.rate_limited.clone(),
            foldgate_admin::too_many_requests,
        ),
    );
    // Outermost first.
    let mcp_layers = ServiceBuilder::new()
        .layer(middleware::from_fn_with_state(config.max_body_bytes, guard::limit_body))
        .layer(middleware::from_fn_with_state(policy, guard::check_host_origin))
        .layer(middleware::from_fn_with_state(
            gateway.auth.clone().with_rejections(gateway.metrics.auth_rejected.clone()),
            auth::authenticate_request,
        ))
        .layer(limit)
        .layer(middleware::from_fn_with_state(exchange_state, exchange::mcp_exchange));

    let metadata =
        auth::ProtectedResourceMetadata::new(&gateway.mcp_url, &gateway.authorization_servers);
    let metadata_route = get(move || {
        let metadata = metadata.clone();
        async move { Json(metadata) }
    });

    let key_set = serde_json::to_vec(gateway.signer.key_set())
        .map_err(|e| format!("serialising the key set: {e}"))?;
    let key_set = axum::body::Bytes::from(key_set);
    let jwks_route = get(move || {
        let key_set = key_set.clone();
        async move {
            (
                [
                    (http::header::CONTENT_TYPE, "application/json"),
                    (http::header::CACHE_CONTROL, "public, max-age=300"),
                ],
                key_set,
            )
        }
    });

    let request_id = HeaderName::from_static("x-request-id");
    Ok(Router::new()
        .route_service("/mcp", mcp_layers.service(mcp))
        .nest(foldgate_admin::PREFIX, admin)
        .merge(foldgate_console::router(gateway.console_sign_in.clone()))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/.well-known/oauth-protected-resource", metadata_route.clone())
        .route("/.well-known/oauth-protected-resource/mcp", metadata_route)
        .route("/.well-known/jwks.json", jwks_route)
        .with_state(gateway.clone())
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(request_span)
                        .on_response(record_response),
                )
                .layer(middleware::from_fn_with_state(
                    gateway.metrics.http.clone(),
                    metrics::record_http,
                ))
                .layer(PropagateRequestIdLayer::new(request_id))
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::SERVICE_UNAVAILABLE,
                    config.request_timeout,
                )),
        ))
}

/// The span of one HTTP request, named and attributed as the HTTP semantic
/// conventions say (`POST /mcp`), continuing the caller's trace if it sent
/// a `traceparent`.
fn request_span(req: &http::Request<axum::body::Body>) -> Span {
    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let route = req.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
    let method = req.method().as_str();
    let span = tracing::info_span!(
        "request",
        otel.name = %route.map_or_else(|| method.to_owned(), |r| format!("{method} {r}")),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = route,
        url.path = req.uri().path(),
        http.response.status_code = tracing::field::Empty,
        request_id = id,
    );
    foldgate_telemetry::set_remote_parent(&span, req.headers());
    span
}

/// Records the status on the request span; a server error marks it failed.
fn record_response(response: &http::Response<axum::body::Body>, latency: Duration, span: &Span) {
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    tracing::debug!(status = status.as_u16(), latency_ms = latency.as_millis(), "response");
}

/// Loopback names, what the operator listed, and the public URL's host.
fn allowed_hosts(config: &ApiConfig, mcp_url: &str) -> Vec<String> {
    if !config.allowed_hosts.is_empty() {
        return config.allowed_hosts.clone();
    }
    let mut hosts: Vec<String> =
        ["localhost", "127.0.0.1", "::1"].into_iter().map(str::to_owned).collect();
    if let Some(authority) = mcp_url.split("://").nth(1).and_then(|rest| rest.split('/').next()) {
        hosts.push(authority.to_owned());
    }
    hosts
}

/// Readiness on the MCP port, which the internet may reach: whether the
/// database answers, never why not (the log and the ops port's `/readyz`
/// say that).
async fn readyz(State(gateway): State<Gateway>) -> Response {
    let store = tokio::time::timeout(Duration::from_secs(2), gateway.service.store().ready()).await;
    let database = match store {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the database is unavailable");
            Err("unavailable".to_owned())
        }
        Err(_) => Err("unavailable".to_owned()),
    };
    let background = gateway.background.all_running();
    let ready = database.is_ok() && background;
    let body = json!({
        "ready": ready,
        "database": database.err().unwrap_or_else(|| "ok".to_owned()),
        "supervisor": if background { "ok" } else { "stopped" },
    });
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

/// The operations listener's application: health probes, the Prometheus
/// `/metrics` endpoint and `/background` (what each background task last
/// did), on a port that is never exposed with the MCP port.
pub fn ops_router(
    store: Arc<dyn foldgate_store::Store>,
    prometheus: Prometheus,
    background: Board,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/background",
            get(move || async move { Json(json!({"tasks": background.tasks()})) }),
        )
        .route("/metrics", get(move || scrape(prometheus.clone())))
        .route(
            "/readyz",
            get(move || {
                let store = Arc::clone(&store);
                async move {
                    match tokio::time::timeout(Duration::from_secs(2), store.ready()).await {
                        Ok(Ok(())) => (StatusCode::OK, "ready").into_response(),
                        Ok(Err(e)) => {
                            (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
                        }
                        Err(_) => {
                            (StatusCode::SERVICE_UNAVAILABLE, "database timeout").into_response()
                        }
                    }
                }
            }),
        )
}

/// `GET /metrics`: the Prometheus text exposition.
async fn scrape(prometheus: Prometheus) -> Response {
    // Collecting runs every observable gauge's callback: cheap, but not
    // async work.
    match tokio::task::spawn_blocking(move || prometheus.render()).await {
        Ok(Ok(text)) => {
            ([(http::header::CONTENT_TYPE, Prometheus::CONTENT_TYPE)], text).into_response()
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "rendering metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "rendering metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
