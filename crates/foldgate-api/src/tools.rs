//! The MCP tools: `branch_create`, `branch_return`, `branch_run`,
//! `branch_status` and `session_end`, over the folding service and the
//! runner; and the tasks (`tasks/get`, `tasks/cancel`) that `branch_run`
//! answers with for clients of the tasks extension.

use std::{sync::Arc, time::Duration};

use foldgate_domain::{BranchId, BranchKind, EndReason, Principal, ToolListing};
use foldgate_engine::{FoldError, FoldingService, StatusQuery};
use foldgate_runner::{Grant, Runner};
use rmcp::{
    ServerHandler,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
        CompleteRequestMethod, CompleteRequestParams, CompleteResult, CreateTaskResult,
        DetailedTask, ErrorData, GetTaskParams, GetTaskResult, Implementation,
        ListPromptsRequestMethod, ListPromptsResult, ListResourceTemplatesRequestMethod,
        ListResourceTemplatesResult, ListResourcesRequestMethod, ListResourcesResult,
        ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
        ServerConfig, Task, TaskPayload, TaskStatus, Tool, ToolAnnotations, UpdateTaskParams,
    },
    service::{RequestContext, RoleServer},
};
use serde_json::{Value, json};

use crate::{
    answers::{
        self, BranchCreated, BranchReturned, BranchStatusAnswer, BranchView, Found, FoundTool,
        NoBranch, RunAnswer, RunView, SessionEndAnswer, StillRunning, ToolSearchAnswer, to_value,
    },
    args::{self, FoldingTool, Parsed},
    auth::Authenticated,
    call::Checked,
    error::{self, Internal},
    memory, proxy,
};
use foldgate_upstream::{Upstreams, meter::UpstreamCall};

/// What the server tells a model about folding when it connects.
const INSTRUCTIONS: &str = "\
This server folds context. To have a sub-task done without its work entering your context \
(reading many files, searching, trying several fixes), call branch_run when it is offered: the \
gateway runs it on its own model with your upstream tools and returns only the finding. To do a sub-task yourself \
inside a budgeted branch, call branch_create, work with the tools, then branch_return with a \
short summary; the gateway keeps the books, but only your client can drop the branch's turns \
from your context. branch_status shows a branch or a session; session_end closes a session.";

/// What the server adds about the reasoning memory when it is on.
const MEMORY_INSTRUCTIONS: &str = " Your team's earlier branches left lessons in the gateway's \
memory: memory_search finds them, memory_record keeps one of yours, memory_feedback says whether \
one helped (which is how lessons earn trust).";

/// How often a client that asked for progress hears from a run that has
/// written no new step, so that it and the proxies in between know the
/// call is alive.
const PROGRESS_HEARTBEAT: Duration = Duration::from_secs(15);
/// What a client of the tasks extension is told about polling.
const TASK_POLL_INTERVAL_MS: u64 = 1_000;

/// The folding tools and the upstreams' tools, served per request
/// (stateless).
#[derive(Debug, Clone)]
pub struct FoldingTools {
    service: Arc<FoldingService>,
    upstreams: Arc<Upstreams>,
    runner: Arc<Runner>,
    /// How long a call may take before its answer must start: a run that
    /// cannot stream progress answers before then with where to find its
    /// result.
    answer_within: Duration,
}

impl FoldingTools {
    pub fn new(
        service: Arc<FoldingService>,
        upstreams: Arc<Upstreams>,
        runner: Arc<Runner>,
        request_timeout: Duration,
    ) -> Self {
        // Leave the answer time to travel.
        let answer_within = request_timeout.saturating_sub(request_timeout / 10);
        Self { service, upstreams, runner, answer_within }
    }

    async fn call(&self, who: &Principal, parsed: Parsed) -> Result<Value, FoldError> {
        let s = &self.service;
        Ok(match parsed {
            Parsed::Create(req) => to_value(&BranchCreated::from(&s.create(who, req).await?)),
            // `extract_memory` is in the request: the return queues it.
            Parsed::Return(req) => {
                to_value(&BranchReturned::from(&s.return_branch(who, req).await?))
            }
            Parsed::Memory(call) => match s.memory() {
                Some(bank) => memory::call(bank, who, call).await?,
                None => return Err(FoldError::MemoryDisabled),
            },
            Parsed::Run(_) | Parsed::ToolSearch { .. } => {
                // Answered by `run` and `tool_search`, which need the
                // caller's scopes or the request's context.
                return Err(FoldError::Busy);
            }
            Parsed::Status(query) => {
                let session = match &query {
                    StatusQuery::Session(session) => Some(session.clone()),
                    StatusQuery::Branch(_) => None,
                };
                let found = match s.report(who, query).await? {
                    Some((branch, calls)) => {
                        let run = match branch.kind {
                            BranchKind::Gateway => self.run_view(who, branch.id).await?,
                            BranchKind::Agent => None,
                        };
                        Found::Branch(Box::new(BranchView::new(&branch, &calls, run)))
                    }
                    None => Found::Nothing(NoBranch::default()),
                };
                let session_tokens_returned = match &session {
                    Some(session) => Some(s.session_returned_tokens(who, session).await?),
                    None => None,
                };
                to_value(&BranchStatusAnswer { found, session_tokens_returned })
            }
            Parsed::End(session) => to_value(&SessionEndAnswer::new(
                session.as_str(),
                &s.end_session(who, &session).await?,
            )),
        })
    }
}

impl FoldingTools {
    /// `branch_run`: opens the branch, starts the run and answers with a
    /// task (tasks extension), or waits for the run, telling a client that
    /// asked for progress of each step, or answers when it can wait no
    /// longer with where the result will be.
    async fn run(
        &self,
        who: &Authenticated,
        req: foldgate_runner::RunBranch,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let grant = Grant { principal: who.principal.clone(), scopes: who.scopes.clone() };
        let branch = match self.runner.start(&grant, req).await {
            Ok(branch) => branch,
            Err(e) => return error::tool_error(FoldingTool::BranchRun.name(), &e),
        };
        if context.client_capabilities().is_some_and(|c| c.supports_tasks()) {
            let at = branch.created_at.to_rfc3339();
            let task = Task::new(branch.id.to_string(), TaskStatus::Working, at.clone(), at)
                .with_poll_interval_ms(TASK_POLL_INTERVAL_MS);
            return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        }
        let progress = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let (steps_tx, mut steps_rx) = tokio::sync::watch::channel(0_u32);
        let wait = self.runner.wait(&who.principal, branch.id, move |steps| {
            steps_tx.send_replace(steps);
        });
        tokio::pin!(wait);
        let give_up = tokio::time::sleep(self.answer_within);
        tokio::pin!(give_up);
        if let Some(token) = &progress {
            // The first notification turns the answer into an event stream,
            // which the request timeout no longer bounds.
            notify(&peer, token, 0, "started").await;
        }
        let outcome = loop {
            tokio::select! {
                outcome = &mut wait => break outcome,
                changed = steps_rx.changed(), if progress.is_some() => {
                    let steps = *steps_rx.borrow_and_update();
                    if changed.is_ok()
                        && steps > 0
                        && let Some(token) = &progress
                    {
                        notify(&peer, token, steps, &format!("step {steps}")).await;
                    }
                }
                () = tokio::time::sleep(PROGRESS_HEARTBEAT), if progress.is_some() => {
                    if let Some(token) = &progress {
                        let steps = *steps_rx.borrow();
                        notify(&peer, token, steps, "working").await;
                    }
                }
                () = &mut give_up, if progress.is_none() => {
                    let running = RunAnswer::Running(StillRunning::new(&branch));
                    return Ok(CallToolResult::structured(to_value(&running)).into());
                }
            }
        };
        match outcome {
            Ok(outcome) => {
                let done = RunAnswer::Done(Box::new(outcome));
                Ok(CallToolResult::structured(to_value(&done)).into())
            }
            Err(e) => error::tool_error(FoldingTool::BranchRun.name(), &e),
        }
    }

    /// What `branch_status` shows of a gateway-run branch's run.
    async fn run_view(&self, who: &Principal, id: BranchId) -> Result<Option<RunView>, FoldError> {
        Ok(self.runner.run_of(who, id).await?.map(|(run, steps)| RunView::new(&run, &steps)))
    }

    /// A task as `tasks/get` reports it: working, or completed with the
    /// result `branch_run` gives.
    async fn task(&self, who: &Principal, task_id: &str) -> Result<DetailedTask, ErrorData> {
        let unknown =
            || ErrorData::invalid_params("unknown task", Some(json!({"field": "taskId"})));
        let id = BranchId::parse(task_id).map_err(|_| unknown())?;
        let branch = match self.service.status(who, StatusQuery::Branch(id)).await {
            Ok(Some(branch)) if branch.kind == BranchKind::Gateway => branch,
            Ok(_) | Err(FoldError::BranchNotFound) => return Err(unknown()),
            Err(e) => return Err(task_error(e)),
        };
        let found = self.runner.outcome_or_steps(who, id).await.map_err(task_error)?;
        let created = branch.created_at.to_rfc3339();
        Ok(match found {
            Ok(outcome) => {
                let updated = branch.completed_at.unwrap_or(branch.created_at).to_rfc3339();
                let task = Task::new(task_id, TaskStatus::Completed, created, updated);
                let result =
                    CallToolResult::structured(to_value(&RunAnswer::Done(Box::new(outcome))));
                let result = match serde_json::to_value(&result) {
                    Ok(Value::Object(map)) => map,
                    _ => return Err(error::internal(Internal::Unencodable)),
                };
                DetailedTask::new(task, TaskPayload::Completed { result })
            }
            Err(steps) => {
                let task = Task::new(task_id, TaskStatus::Working, created.clone(), created)
                    .with_status_message(format!("{steps} steps"))
                    .with_poll_interval_ms(TASK_POLL_INTERVAL_MS);
                DetailedTask::new(task, TaskPayload::Working)
            }
        })
    }
}

/// Sends a progress notification; a client that went away is not an error.
async fn notify(
    peer: &rmcp::Peer<RoleServer>,
    token: &rmcp::model::ProgressToken,
    steps: u32,
    message: &str,
) {
    let param = ProgressNotificationParam::new(token.clone(), f64::from(steps))
        .with_message(message.to_owned());
    if let Err(e) = peer.notify_progress(param).await {
        tracing::debug!(error = %e, "a progress notification was not delivered");
    }
}

fn task_error(e: FoldError) -> ErrorData {
    error::tool_error("tasks/get", &e).err().unwrap_or_else(|| error::internal(e.into()))
}

/// The principal the auth layer put on the HTTP request.
pub(crate) fn principal_of(ctx: &RequestContext<RoleServer>) -> Option<Authenticated> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Authenticated>())
        .cloned()
}

/// The folding tools as listed, built once: their schemas are generated
/// from types and never change.
static FOLDING_TOOLS: std::sync::LazyLock<Vec<Tool>> =
    std::sync::LazyLock::new(|| FoldingTool::ALL.into_iter().map(tool).collect());

fn tool(t: FoldingTool) -> Tool {
    let (title, description, read_only, destructive) = match t {
        FoldingTool::BranchCreate => (
            "Open a branch",
            "Open a budgeted, time-limited branch for a sub-task you will do yourself \
             (exploration, research, trial and error), then call branch_return with a short \
             summary. The gateway keeps the books: it counts the branch's prompt, the upstream \
             tool calls made inside it and the summary, and ends it at its budget or deadline. It \
             cannot remove the branch's turns from your context: your client must drop them \
             after branch_return (to have the gateway do the sub-task out of your context, use \
             branch_run). Returns branch_id, depth and the budget actually allocated.",
            false,
            false,
        ),
        FoldingTool::BranchReturn => (
            "Return from a branch",
            "Finish a branch you opened with branch_create and hand its result to the parent: a \
             concise summary of findings or of what failed (outcome \"failure\"), not raw \
             material, within the branch's return tier. Active child branches are ended first. \
             Secrets in the message are redacted. Returns tokens_used and the message as the \
             parent receives it.",
            false,
            false,
        ),
        FoldingTool::BranchRun => (
            "Run a sub-task in the gateway",
            "Have the gateway do a sub-task on its own model, with your upstream tools, in a \
             context of its own: it sees only description and prompt (say everything it needs), \
             and only its finding, scrubbed of secrets and within return_tier, comes back to \
             you. The budget bounds the sub-task's whole context and the deadline its time. \
             Returns the finding (message), status, tokens_used, tokens_returned, model_usage and \
             steps.",
            false,
            false,
        ),
        FoldingTool::BranchStatus => (
            "Branch status",
            "Show a branch (by branch_id) or the current innermost active branch of a session \
             (by session_id): status, depth, budget used and total, deadline.",
            true,
            false,
        ),
        FoldingTool::SessionEnd => (
            "End a folding session",
            "End a session: every active branch in it is ended, deepest first. Use when the \
             conversation is over.",
            false,
            true,
        ),
        FoldingTool::MemorySearch => (
            "Search the team's memory",
            "Find lessons your team's earlier branches learned (strategies that worked, pitfalls \
             to avoid) that match what you are about to do. Each item says where it came from, \
             its confidence, and whether it is trusted yet (an agent's lesson is trusted once it \
             has helped). Items flagged as prompt injection are never returned.",
            true,
            false,
        ),
        FoldingTool::MemoryRecord => (
            "Record a lesson",
            "Keep a lesson for your team's later branches: a strategy that worked or a pitfall \
             and why, concrete enough to act on. Secrets are redacted; text that tries to \
             instruct a model is flagged and never shown to anyone. It starts untrusted and is \
             injected into branches once other agents' memory_feedback says it helped.",
            false,
            false,
        ),
        FoldingTool::ToolSearch => (
            "Find an upstream tool",
            "Find the upstream tools (your team's servers behind the gateway) that can do what you \
             need: describe the action and what it acts on, e.g. \"list open pull requests\". \
             Returns the best matches with their input schemas; call one by its name as you \
             would any listed tool. Only the tools you may call are searched.",
            true,
            false,
        ),
        FoldingTool::MemoryFeedback => (
            "Say whether a lesson helped",
            "Tell the gateway whether following a lesson (from injected_context or \
             memory_search) helped: one vote per agent and lesson, never on your own. Its \
             confidence moves: lessons that help are injected, lessons that keep failing stop \
             being injected.",
            false,
            false,
        ),
    };
    let mut annotations = ToolAnnotations::default();
    annotations.title = Some(title.to_owned());
    annotations.read_only_hint = Some(read_only);
    annotations.destructive_hint = Some(destructive);
    annotations.idempotent_hint = Some(read_only);
    annotations.open_world_hint = Some(false);
    let mut tool = Tool::new(t.name(), description, Arc::new(args::input_schema(t)));
    tool.output_schema = Some(Arc::new(answers::output_schema(t)));
    tool.title = Some(title.to_owned());
    tool.annotations = Some(annotations);
    tool
}

impl ServerHandler for FoldingTools {
    fn get_info(&self) -> ServerConfig {
        // Logging: the upstreams' log messages are relayed to the calls that
        // ask for them (`crate::proxy`).
        #[allow(deprecated, reason = "MCP log messages, which clients still read")]
        let capabilities =
            ServerCapabilities::builder().enable_logging().enable_tools().enable_tasks().build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("foldgate", env!("CARGO_PKG_VERSION")))
            .with_instructions(if self.service.memory().is_some() {
                [INSTRUCTIONS, MEMORY_INSTRUCTIONS].concat()
            } else {
                INSTRUCTIONS.to_owned()
            })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let who = principal_of(&context);
        // `branch_run` is offered to tenants that have a model to run on.
        let runs = who
            .as_ref()
            .is_some_and(|w| !self.runner.models().names_for(&w.principal.tenant).is_empty());
        // The memory's tools, when it is on.
        let memory = self.service.memory().is_some();
        // The upstream tools the caller may call: all of them, or, for a
        // tenant that lists them by search, `tool_search` and those its
        // sessions used.
        let mut upstream = who.as_ref().map_or_else(Vec::new, |w| self.upstreams.tools_for(w));
        let listing = who.as_ref().map_or(ToolListing::Full, |w| {
            self.service.tenant_rules().of(&w.principal.tenant).tool_listing
        });
        let search = listing == ToolListing::Search && !upstream.is_empty();
        if let (ToolListing::Search, Some(who)) = (listing, &who) {
            upstream = match self.service.session_tools(&who.principal).await {
                Ok(used) => self.upstreams.tools_named(who, &used),
                Err(e) => {
                    // The list still works; the used tools can be found again.
                    tracing::warn!(error = %e, "reading the tools of the caller's sessions failed");
                    Vec::new()
                }
            };
        }
        let mut tools: Vec<Tool> = FOLDING_TOOLS
            .iter()
            .filter(|t| match FoldingTool::from_name(&t.name) {
                Some(FoldingTool::BranchRun) => runs,
                Some(FoldingTool::ToolSearch) => search,
                Some(tool) if tool.is_memory() => memory,
                _ => true,
            })
            .cloned()
            .collect();
        tools.extend(upstream);
        // What a principal may call differs by tenant and scope: never
        // share the list.
        Ok(ListToolsResult::with_all_items(tools).with_cache_scope(CacheScope::Private))
    }

    // Only tools are offered: the other listing methods answer "method not
    // found" rather than an empty list, as the capabilities say.
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Err(ErrorData::method_not_found::<ListPromptsRequestMethod>())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Err(ErrorData::method_not_found::<ListResourcesRequestMethod>())
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Err(ErrorData::method_not_found::<ListResourceTemplatesRequestMethod>())
    }

    /// Accepted and without effect: served statelessly, the gateway keeps
    /// no level past a request. A request asks for log messages with the
    /// `io.modelcontextprotocol/logLevel` key of its `_meta`.
    #[allow(deprecated, reason = "logging/setLevel, which clients still send")]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn complete(
        &self,
        _request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        Err(ErrorData::method_not_found::<CompleteRequestMethod>())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let Some(who) = principal_of(&context) else {
            return Err(error::internal(Internal::NoPrincipal));
        };
        Ok(GetTaskResult::new(self.task(&who.principal, &request.task_id).await?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // A run never asks its caller for input: there is nothing to update.
        let Some(who) = principal_of(&context) else {
            return Err(error::internal(Internal::NoPrincipal));
        };
        self.task(&who.principal, &request.task_id).await.map(|_| ())
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // The guard has checked the token's scope.
        let Some(who) = principal_of(&context) else {
            return Err(error::internal(Internal::NoPrincipal));
        };
        let task = self.task(&who.principal, &request.task_id).await?;
        if task.status() == TaskStatus::Working
            && let Ok(id) = BranchId::parse(&request.task_id)
        {
            // The run sees its branch end and concludes, cut, as cancelled.
            self.service
                .force_return(&who.principal.tenant, id, EndReason::ReportedFailure)
                .await
                .map_err(task_error)?;
        }
        Ok(())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = context.extensions.get::<http::request::Parts>();
        let who = parts.and_then(|p| p.extensions.get::<Authenticated>());
        let checked = parts.and_then(|p| p.extensions.get::<Checked>());
        let (Some(who), Some(checked)) = (who, checked) else {
            // The auth layer and the guard run before every call reaches here.
            return Err(error::internal(Internal::Unchecked));
        };
        match checked.clone() {
            Checked::Upstream { upstream, tool, branch } => {
                // rmcp hands the request's `_meta` over in the context.
                let meta = request.meta.as_ref().map_or(&context.meta.0.0, |m| &m.0.0);
                let call = UpstreamCall {
                    upstream: &upstream,
                    tool: &tool,
                    arguments: request.arguments.as_ref(),
                    scopes: &who.scopes,
                    meta: Some(meta),
                    relay: None,
                };
                let asked = proxy::Asked::new(context.peer.clone(), meta);
                proxy::call(&self.service, who, call, branch, &asked).await
            }
            Checked::Folding(Parsed::Run(req)) => self.run(who, req, &context).await,
            Checked::Folding(Parsed::ToolSearch { query, limit }) => {
                let (found, searched) = self.upstreams.search(
                    who,
                    &query,
                    usize::try_from(limit).unwrap_or(usize::MAX),
                );
                let answer = ToolSearchAnswer {
                    tools: found.iter().map(|(tool, score)| FoundTool::new(tool, *score)).collect(),
                    tools_searched: searched,
                };
                Ok(CallToolResult::structured(to_value(&answer)).into())
            }
            Checked::Folding(parsed) => {
                let tool = parsed.tool();
                match self.call(&who.principal, parsed).await {
                    Ok(value) => Ok(CallToolResult::structured(value).into()),
                    Err(e) => error::tool_error(tool.name(), &e),
                }
            }
        }
    }
}
