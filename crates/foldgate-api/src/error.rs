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
//!   here; the cause never reaches the client.

use foldgate_engine::FoldError;
use rmcp::model::{CallToolResponse, CallToolResult, ErrorCode, ErrorData};
use serde_json::json;

use crate::args::{ArgError, FoldingTool};

/// JSON-RPC error code for a rate or concurrency limit (server-defined range).
pub const RATE_LIMITED: i32 = -32029;
/// JSON-RPC error code for a token without the scope a tool needs.
pub const INSUFFICIENT_SCOPE: i32 = -32003;

pub(crate) fn invalid_argument(e: &ArgError) -> ErrorData {
    ErrorData::invalid_params(e.to_string(), Some(json!({"field": e.field, "reason": e.reason})))
}

/// An internal failure: logged with a fresh correlation id, which is all the
/// client gets.
pub(crate) fn internal(what: &str) -> ErrorData {
    let id = uuid::Uuid::new_v4();
    tracing::error!(correlation_id = %id, error = what, "internal error");
    ErrorData::internal_error("internal error", Some(json!({"correlation_id": id.to_string()})))
}

/// The response to a tool call the engine refused or failed.
pub(crate) fn tool_error(tool: FoldingTool, e: &FoldError) -> Result<CallToolResponse, ErrorData> {
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
        FoldError::Invalid(invalid) => Err(invalid_argument(&ArgError {
            field: invalid.field.to_owned(),
            reason: invalid.reason.clone(),
        })),
        FoldError::Store(source) => {
            let id = uuid::Uuid::new_v4();
            tracing::error!(correlation_id = %id, tool = tool.name(), error = %source,
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
