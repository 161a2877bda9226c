//! Upstream tool calls as agents make them: the branch the call names (read
//! by [`call`](crate::call)), and the answer [`foldgate_upstream::meter`] gives, as MCP sends it.

use foldgate_domain::BranchId;
use foldgate_engine::{CallTarget, FoldingService};
use foldgate_upstream::meter::{self, Answer, CallFailure, UpstreamCall};
pub use foldgate_upstream::meter::{BRANCH_META_KEY, METERING_META_KEY, result_tokens};

pub use crate::call::{BRANCH_HEADER, named_branch};
use rmcp::model::{CallToolResponse, ErrorData};

use crate::{auth::Authenticated, error};

/// Forwards an agent's call of an upstream tool and meters it: inside the
/// branch the request names, or else where [`FoldingService::call_target`]
/// puts it. The tool counts as used by the session the call is metered in
/// (what `tools/list` shows a tenant that lists its tools by search).
pub(crate) async fn call(
    service: &FoldingService,
    who: &Authenticated,
    call: UpstreamCall<'_>,
    named: Option<BranchId>,
) -> Result<CallToolResponse, ErrorData> {
    let name = call.tool.tool.name.as_ref();
    let target = match service.call_target(&who.principal, named).await {
        Ok(target) => target,
        Err(e) => return error::tool_error(name, &e),
    };
    let session = match &target {
        CallTarget::Branch(branch) => Some(&branch.session_id),
        CallTarget::Outside(session) => session.as_ref(),
    };
    if let Some(session) = session {
        service.note_session_tool(&who.principal, session, name);
    }
    match meter::call(service, &who.principal, &target, call).await {
        Ok(Answer::Result(result)) => Ok(result.into()),
        Ok(Answer::Error(e)) => Err(e),
        Err(CallFailure::Refused(e)) => error::tool_error(name, &e),
        Err(CallFailure::Internal(what)) => Err(error::internal(what.into())),
    }
}
