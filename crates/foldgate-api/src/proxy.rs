//! Upstream tool calls as agents make them: the branch the call names (read
//! by [`call`](crate::call)), the answer [`foldgate_upstream::meter`] gives,
//! as MCP sends it, and what the upstream says about the call on the way
//! (its progress and log messages), told to the agent before the answer.

use foldgate_domain::BranchId;
use foldgate_engine::{CallTarget, FoldingService};
pub use foldgate_upstream::meter::{BRANCH_META_KEY, METERING_META_KEY, result_tokens};
use foldgate_upstream::{
    meter::{self, Answer, CallFailure, LOG_LEVEL_META_KEY, UpstreamCall},
    notice::{self, Notice, Relay},
};

pub use crate::call::{BRANCH_HEADER, named_branch};
use rmcp::{
    Peer, RoleServer,
    model::{CallToolResponse, ErrorData, ProgressNotificationParam, ProgressToken},
};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::{auth::Authenticated, error};

/// What an agent asked to hear of its call while it runs, and where to tell
/// it: progress for its `progressToken`, and log messages at the level its
/// request's `_meta` names (`io.modelcontextprotocol/logLevel`) or above.
/// Both go on the call's own answer, which the first of them turns into an
/// event stream.
#[derive(Debug)]
pub(crate) struct Asked {
    peer: Peer<RoleServer>,
    progress: Option<ProgressToken>,
    min_log: Option<String>,
}

impl Asked {
    /// What a request's `_meta` asks for.
    pub fn new(peer: Peer<RoleServer>, meta: &Map<String, Value>) -> Self {
        let progress = meta
            .get("progressToken")
            .and_then(|token| serde_json::from_value::<ProgressToken>(token.clone()).ok());
        let min_log = meta.get(LOG_LEVEL_META_KEY).and_then(Value::as_str).map(str::to_owned);
        Self { peer, progress, min_log }
    }

    fn relay<'a>(&'a self, sink: &'a mpsc::Sender<Notice>) -> Option<Relay<'a>> {
        let min_log = self.min_log.as_deref().filter(|l| notice::LOG_LEVELS.contains(l));
        (self.progress.is_some() || min_log.is_some()).then_some(Relay {
            sink,
            progress: self.progress.is_some(),
            min_log,
        })
    }

    /// Tells the agent; an agent that went away is not an error.
    async fn tell(&self, notice: Notice) {
        let sent = match notice {
            Notice::Progress { progress, total, message } => {
                let Some(token) = &self.progress else { return };
                let mut param = ProgressNotificationParam::new(token.clone(), progress);
                param.total = total;
                param.message = message;
                self.peer.notify_progress(param).await
            }
            Notice::Log { level, logger, data } => self.log(level, logger, data).await,
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "a notice of an upstream call was not delivered");
        }
    }

    #[expect(deprecated, reason = "MCP log messages, still what clients read")]
    async fn log(
        &self,
        level: &str,
        logger: Option<String>,
        data: Value,
    ) -> Result<(), rmcp::service::ServiceError> {
        use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
        let Ok(level) = serde_json::from_value::<LoggingLevel>(Value::String(level.to_owned()))
        else {
            return Ok(());
        };
        let mut param = LoggingMessageNotificationParam::new(level, data);
        param.logger = logger;
        self.peer.notify_logging_message(param).await
    }
}

/// Forwards an agent's call of an upstream tool and meters it: inside the
/// branch the request names, or else where [`FoldingService::call_target`]
/// puts it. The tool counts as used by the session the call is metered in
/// (what `tools/list` shows a tenant that lists its tools by search). What
/// the upstream says about the call before it answers is told to the agent
/// as it comes, as far as `asked` wants it.
pub(crate) async fn call(
    service: &FoldingService,
    who: &Authenticated,
    call: UpstreamCall<'_>,
    named: Option<BranchId>,
    asked: &Asked,
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
    let (sink, mut notices) = mpsc::channel(notice::QUEUE);
    let call = UpstreamCall { relay: asked.relay(&sink), ..call };
    let metered = meter::call(service, &who.principal, &target, call);
    tokio::pin!(metered);
    let answer = loop {
        tokio::select! {
            biased;
            Some(notice) = notices.recv() => asked.tell(notice).await,
            answer = &mut metered => break answer,
        }
    };
    // What came just before the answer, still queued.
    while let Ok(notice) = notices.try_recv() {
        asked.tell(notice).await;
    }
    match answer {
        Ok(Answer::Result(result)) => Ok(result.into()),
        Ok(Answer::Error(e)) => Err(e),
        Err(CallFailure::Refused(e)) => error::tool_error(name, &e),
        Err(CallFailure::Internal(what)) => Err(error::internal(what.into())),
    }
}
