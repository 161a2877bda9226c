//! Upstream tool calls as agents make them: which branch a request names,
//! and the answer [`foldgate_upstream::meter`] gives, as MCP sends it.

use foldgate_domain::BranchId;
use foldgate_engine::FoldingService;
use foldgate_upstream::meter::{self, Answer, CallFailure, UpstreamCall};
pub use foldgate_upstream::meter::{BRANCH_META_KEY, METERING_META_KEY, result_tokens};
use http::HeaderMap;
use rmcp::model::{CallToolResponse, ErrorData};
use serde_json::{Map, Value};

use crate::{auth::Authenticated, error};

/// The HTTP header naming the branch a call belongs to.
pub const BRANCH_HEADER: &str = "foldgate-branch";

/// Which branch a request names, from `_meta` or the header. The error names
/// the field.
pub fn named_branch(
    meta: Option<&Map<String, Value>>,
    headers: Option<&HeaderMap>,
) -> Result<Option<BranchId>, crate::args::ArgError> {
    let invalid = |field: &str, reason: &str| crate::args::ArgError {
        field: field.to_owned(),
        reason: reason.to_owned(),
    };
    if let Some(value) = meta.and_then(|m| m.get(BRANCH_META_KEY)) {
        let field = format!("_meta.{BRANCH_META_KEY}");
        let id = value.as_str().ok_or_else(|| invalid(&field, "must be a string"))?;
        return BranchId::parse(id).map(Some).map_err(|e| invalid(&field, &e.reason));
    }
    if let Some(value) = headers.and_then(|h| h.get(BRANCH_HEADER)) {
        let id = value.to_str().map_err(|_| invalid("Foldgate-Branch", "must be text"))?;
        return BranchId::parse(id.trim())
            .map(Some)
            .map_err(|e| invalid("Foldgate-Branch", &e.reason));
    }
    Ok(None)
}

/// Forwards an agent's call of an upstream tool and meters it: inside the
/// branch the request names, or else where [`FoldingService::call_target`]
/// puts it.
pub(crate) async fn call(
    service: &FoldingService,
    who: &Authenticated,
    call: UpstreamCall<'_>,
    headers: Option<&HeaderMap>,
) -> Result<CallToolResponse, ErrorData> {
    let name = call.tool.tool.name.as_ref();
    let named = named_branch(call.meta, headers).map_err(|e| error::invalid_argument(&e))?;
    let target = match service.call_target(&who.principal, named).await {
        Ok(target) => target,
        Err(e) => return error::tool_error(name, &e),
    };
    match meter::call(service, &who.principal, &target, call).await {
        Ok(Answer::Result(result)) => Ok(result.into()),
        Ok(Answer::Error(e)) => Err(e),
        Err(CallFailure::Refused(e)) => error::tool_error(name, &e),
        Err(CallFailure::Internal(what)) => Err(error::internal(&what)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_branch_is_named_by_meta_or_header() {
        let id = BranchId::generate();
        let meta: Map<String, Value> =
            [(BRANCH_META_KEY.to_owned(), json!(id.to_string()))].into_iter().collect();
        assert_eq!(named_branch(Some(&meta), None).unwrap(), Some(id));
        let mut headers = HeaderMap::new();
        headers.insert(BRANCH_HEADER, id.to_string().parse().unwrap());
        assert_eq!(named_branch(None, Some(&headers)).unwrap(), Some(id));
        assert_eq!(named_branch(None, None).unwrap(), None);
        let bad: Map<String, Value> =
            [(BRANCH_META_KEY.to_owned(), json!(7))].into_iter().collect();
        assert_eq!(named_branch(Some(&bad), None).unwrap_err().field, "_meta.foldgate/branch_id");
        headers.insert(BRANCH_HEADER, "nope".parse().unwrap());
        assert_eq!(named_branch(None, Some(&headers)).unwrap_err().field, "Foldgate-Branch");
    }
}
