//! How failures reach clients: one mapping for HTTP and MCP.
//!
//! - invalid arguments: JSON-RPC `-32602` with `data.field` (HTTP 400 from the
//!   guard, which sees them first);
//! - limits: JSON-RPC [`RATE_LIMITED`] with `data.retry_after`, turned into
//!   HTTP 429 with `Retry-After` by the router;
//! - domain refusals (not found, not active, depth, budget): a tool result
//!   with `isError: true` and `{"error": {"code", "message"}}`, which a model
//!   can read and act on;
//! - internal failures: JSON-RPC `-32603` with a correlation id, logged once
//!   here; the cause never reaches the client;
//! - the database out of reach: JSON-RPC [`UNAVAILABLE`], turned into HTTP
//!   503 with `Retry-After` by the exchange layer, which also fails
//!   requests at once until the database answers again ([`Outage`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use foldgate_background::{
    Activation, Activator, BackgroundTask, BoxFuture, Driver, Next, OnStop, StopOrder, TaskDef,
};
use foldgate_engine::FoldError;
use foldgate_store::{Store, StoreError};
use foldgate_upstream::meter;
use rmcp::model::{CallToolResponse, CallToolResult, ErrorCode, ErrorData};
use serde_json::{Value, json};

use crate::args::ArgError;

/// JSON-RPC error code for a rate or concurrency limit (server-defined range).
pub const RATE_LIMITED: i32 = -32029;
/// JSON-RPC error code for a token without the scope a tool needs.
pub const INSUFFICIENT_SCOPE: i32 = -32003;
/// JSON-RPC error code for "temporarily unavailable, retry" (as for token
/// keys that cannot be fetched): here, the database is out of reach.
pub const UNAVAILABLE: i32 = -32004;
/// What clients are told to wait before retrying, while the database is
/// out of reach.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often a gateway that lost its database checks whether it is back.
const OUTAGE_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// A JSON-RPC error response with an HTTP status.
pub(crate) fn jsonrpc_error(
    status: StatusCode,
    id: Option<&Value>,
    code: i32,
    message: &str,
    data: Option<Value>,
) -> Response {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    let body = json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": error});
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub(crate) fn invalid_argument(e: &ArgError) -> ErrorData {
    ErrorData::invalid_params(e.to_string(), Some(json!({"field": e.field, "reason": e.reason})))
}

/// A failure inside the gateway, as it is logged; the client is told none of
/// it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Internal {
    /// A request reached a handler without the principal that the auth layer
    /// puts on every request it lets through.
    #[error("a request reached its handler without a principal")]
    NoPrincipal,
    /// A tool call reached its handler without the call the guard checked.
    #[error("a tool call reached its handler without the guard's checked call")]
    Unchecked,
    /// A run's outcome could not be turned into a task's result.
    #[error("a run's result could not be encoded as a JSON object")]
    Unencodable,
    #[error(transparent)]
    Upstream(#[from] meter::Fault),
    #[error(transparent)]
    Fold(#[from] FoldError),
}

/// An internal failure: logged with a fresh correlation id, which is all the
/// client gets.
pub(crate) fn internal(what: Internal) -> ErrorData {
    let id = uuid::Uuid::new_v4();
    tracing::error!(correlation_id = %id, error = %what, "internal error");
    ErrorData::internal_error("internal error", Some(json!({"correlation_id": id.to_string()})))
}

/// The response to a tool call the engine refused or failed.
pub(crate) fn tool_error(tool: &str, e: &FoldError) -> Result<CallToolResponse, ErrorData> {
    match e {
        FoldError::RateLimited { limit, retry_after } => Err(ErrorData::new(
            ErrorCode(RATE_LIMITED),
            e.to_string(),
            Some(json!({
                "code": e.code().as_str(),
                "limit": limit.as_str(),
                "retry_after": retry_after.as_secs().max(1),
            })),
        )),
        FoldError::QuotaExceeded { period, retry_after } => Err(ErrorData::new(
            ErrorCode(RATE_LIMITED),
            e.to_string(),
            Some(json!({
                "code": e.code().as_str(),
                "reason": "quota_exceeded",
                "period": period,
                "retry_after": retry_after.as_secs().max(1),
            })),
        )),
        FoldError::Invalid(invalid) => Err(invalid_argument(&ArgError {
            field: invalid.field.to_owned(),
            reason: invalid.reason.clone(),
        })),
        FoldError::Store(source) if database_unreachable(source) => {
            let id = uuid::Uuid::new_v4();
            tracing::warn!(correlation_id = %id, tool, error = %source,
                source = ?std::error::Error::source(source), "the database is unreachable");
            Err(ErrorData::new(
                ErrorCode(UNAVAILABLE),
                "the database is unavailable; retry shortly",
                Some(json!({
                    "correlation_id": id.to_string(),
                    "retry_after": RETRY_AFTER.as_secs(),
                })),
            ))
        }
        FoldError::Store(source) => {
            let id = uuid::Uuid::new_v4();
            tracing::error!(correlation_id = %id, tool, error = %source,
                source = ?std::error::Error::source(source), "tool call failed");
            Err(ErrorData::internal_error(
                "internal error",
                Some(json!({"correlation_id": id.to_string()})),
            ))
        }
        refusal => Ok(CallToolResult::structured_error(json!({
            "error": {"code": refusal.code().as_str(), "message": refusal.to_string()}
        }))
        .into()),
    }
}

/// Whether a storage failure means the database cannot be reached (no
/// connection within the pool's acquire timeout, a connection lost, the
/// server shutting down or refusing connections) rather than that a
/// statement failed.
fn database_unreachable(e: &StoreError) -> bool {
    e.is_unavailable()
}

fn unavailable(headers: &mut http::HeaderMap) {
    headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER.as_secs()));
}

/// Whether the database is known to be out of reach. Tripped by a tool call
/// that found it so; while tripped, requests are answered 503 at once
/// instead of each waiting for the pool's acquire timeout, and a background
/// check (the `database_outage` task) clears it as soon as the database
/// answers again.
#[derive(Debug)]
pub struct Outage {
    tripped: AtomicBool,
    store: Arc<dyn Store>,
    /// Wakes the background check when the switch trips.
    probe: Activator,
}

impl Outage {
    pub fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self { tripped: AtomicBool::new(false), store, probe: Activator::new() })
    }

    /// Registers the background check, `database_outage`: woken when the
    /// switch trips, it asks the database every 250 ms until it answers.
    /// It stops with the tasks serving requests, dropping a check in flight.
    pub fn register(self: &Arc<Self>, driver: &mut Driver) {
        let def = TaskDef::new("database_outage", StopOrder::SERVING)
            .trigger(self.probe.clone())
            .on_stop(OnStop::Abandon);
        driver.register(def, OutageProbe { outage: Arc::clone(self), checking: false });
    }

    /// The answer to a request while the database is known to be out of
    /// reach.
    pub(crate) fn refusal(&self) -> Option<Response> {
        if !self.tripped.load(Ordering::Acquire) {
            return None;
        }
        let body = json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": UNAVAILABLE,
            "message": "the database is unavailable; retry shortly",
            "data": {"retry_after": RETRY_AFTER.as_secs()},
        }});
        let mut response = (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body.to_string(),
        )
            .into_response();
        unavailable(response.headers_mut());
        Some(response)
    }

    /// Turns a tool's [`UNAVAILABLE`] answer into HTTP 503 with
    /// `Retry-After`, and trips the switch.
    pub(crate) fn unavailable_answer(self: &Arc<Self>, parts: &mut http::response::Parts) {
        self.trip();
        parts.status = StatusCode::SERVICE_UNAVAILABLE;
        unavailable(&mut parts.headers);
    }

    fn trip(self: &Arc<Self>) {
        if self.tripped.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!("the database is unreachable: failing requests until it answers");
        self.probe.activate();
    }
}

/// Clears the outage once the database answers: idle until the switch
/// trips, then a check every [`OUTAGE_CHECK_INTERVAL`], the first one an
/// interval after the trip.
#[derive(Debug)]
struct OutageProbe {
    outage: Arc<Outage>,
    /// Checks are under way (the switch tripped and the first wait passed).
    checking: bool,
}

impl OutageProbe {
    async fn check(&mut self) -> Activation {
        let outage = &self.outage;
        if !outage.tripped.load(Ordering::Acquire) {
            self.checking = false;
            return Activation::ok(json!({"tripped": false})).next(Next::Trigger);
        }
        if !std::mem::replace(&mut self.checking, true) {
            return Activation::ok(json!({"tripped": true}))
                .next(Next::After(OUTAGE_CHECK_INTERVAL));
        }
        match outage.store.ready().await {
            Ok(()) => {
                outage.tripped.store(false, Ordering::Release);
                self.checking = false;
                tracing::info!("the database answers again");
                Activation::ok(json!({"tripped": false})).next(Next::Trigger)
            }
            Err(e) => Activation::failed(e, json!({"tripped": true}))
                .next(Next::After(OUTAGE_CHECK_INTERVAL)),
        }
    }
}

impl BackgroundTask for OutageProbe {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.check())
    }
}
