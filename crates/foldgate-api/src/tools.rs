//! The MCP tools: `branch_create`, `branch_return`, `branch_run`,
//! `branch_status` and `session_end`, over the folding service and the
//! runner; and the tasks (`tasks/get`, `tasks/cancel`) that `branch_run`
//! answers with for clients of the tasks extension.

use std::{sync::Arc, time::Duration};

use foldgate_domain::{Branch, BranchId, BranchKind, EndReason, Principal};
use foldgate_engine::{FoldError, FoldingService};
use foldgate_runner::{Grant, RunOutcome, Runner};
use rmcp::{
    ServerHandler,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
        CompleteRequestMethod, CompleteRequestParams, CompleteResult, CreateTaskResult,
        DetailedTask, ErrorCode, ErrorData, GetTaskParams, GetTaskResult, Implementation,
        ListPromptsRequestMethod, ListPromptsResult, ListResourceTemplatesRequestMethod,
        ListResourceTemplatesResult, ListResourcesRequestMethod, ListResourcesResult,
        ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
        ServerConfig, Task, TaskPayload, TaskStatus, Tool, ToolAnnotations, UpdateTaskParams,
    },
    service::{RequestContext, RoleServer},
};
use serde_json::{Value, json};

use crate::{
    args::{self, ArgError, FoldingTool, Parsed},
    auth::Authenticated,
    error, proxy,
};
use foldgate_upstream::{Lookup, Upstreams, meter::UpstreamCall};

/// What the server tells a model about folding when it connects.
const INSTRUCTIONS: &str = "\
This server folds context. To have a sub-task done without its work entering your context \
(reading many files, searching, trying several fixes), call branch_run when it is offered: the \
gateway runs it on its own model with your upstream tools and returns only the finding. To do a sub-task yourself \
inside a budgeted branch, call branch_create, work with the tools, then branch_return with a \
short summary; the gateway keeps the books, but only your client can drop the branch's turns \
from your context. branch_status shows a branch or a session; session_end closes a session.";

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
            Parsed::Create(req) => {
                let created = s.create(who, req).await?;
                let b = &created.branch;
                json!({
                    "branch_id": b.id,
                    "session_id": b.session_id.as_str(),
                    "parent_branch_id": b.parent,
                    "depth": b.depth,
                    "budget_allocated": b.ledger.budget,
                    "budget_requested": created.budget_requested,
                    "budget_used": b.ledger.used,
                    "deadline_at": b.deadline_at,
                    "status": b.status.as_str(),
                    "return_tier": b.return_tier.as_str(),
                })
            }
            Parsed::Return(req) => {
                let returned = s.return_branch(who, req).await?;
                let b = &returned.branch;
                let tier = b.return_tier;
                json!({
                    "success": true,
                    "branch_id": b.id,
                    "status": b.status.as_str(),
                    "tokens_used": b.ledger.used,
                    "tokens_returned": returned.tokens_returned,
                    "compression_ratio": (returned.compression_ratio() * 1000.0).round() / 1000.0,
                    "message": returned.message,
                    "redactions": returned.redactions,
                    "children_force_returned": returned.children_ended,
                    "return_tier": tier.as_str(),
                    "tier_exceeded": returned.tokens_returned > tier.max_tokens(),
                })
            }
            Parsed::Run(_) => {
                // Answered by `run`, which needs the request's context.
                return Err(FoldError::Busy);
            }
            Parsed::Status(query) => {
                let session = match &query {
                    foldgate_engine::StatusQuery::Session(session) => Some(session.clone()),
                    foldgate_engine::StatusQuery::Branch(_) => None,
                };
                let mut view = match s.status(who, query).await? {
                    Some(branch) => {
                        let calls = s.call_summary(who, branch.id).await?;
                        let mut view = branch_view(&branch);
                        view["calls"] = calls_view(&calls);
                        if branch.kind == BranchKind::Gateway {
                            view["run"] = self.run_view(who, branch.id).await?;
                        }
                        view
                    }
                    None => json!({"branch_id": null, "status": "No active branch found"}),
                };
                if let Some(session) = session {
                    view["session_tokens_returned"] =
                        json!(s.session_returned_tokens(who, &session).await?);
                }
                view
            }
            Parsed::End(session) => {
                let ended = s.end_session(who, &session).await?;
                json!({
                    "session_id": session.as_str(),
                    "branches_ended": ended.branches_ended,
                    "session_ended": ended.session_ended,
                })
            }
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
                    return Ok(CallToolResult::structured(still_running(&branch)).into());
                }
            }
        };
        match outcome {
            Ok(outcome) => Ok(CallToolResult::structured(outcome_view(&outcome)).into()),
            Err(e) => error::tool_error(FoldingTool::BranchRun.name(), &e),
        }
    }

    /// What `branch_status` shows of a gateway-run branch's run.
    async fn run_view(&self, who: &Principal, id: BranchId) -> Result<Value, FoldError> {
        let Some((run, steps)) = self.runner.run_of(who, id).await? else {
            return Ok(Value::Null);
        };
        let outcome = run
            .outcome
            .as_deref()
            .and_then(|o| serde_json::from_str::<RunOutcome>(o).ok())
            .map(|o| outcome_view(&o));
        Ok(json!({
            "state": run.state.as_str(),
            "model": run.model,
            "model_usage": {
                "input_tokens": run.usage.input_tokens,
                "output_tokens": run.usage.output_tokens,
                "calls": run.usage.calls,
            },
            "resumes": run.resumes,
            "steps": steps.iter().map(|s| json!({
                "seq": s.seq,
                "kind": s.kind.as_str(),
                "input_tokens": s.input_tokens,
                "output_tokens": s.output_tokens,
                "duration_ms": u64::try_from(s.duration.as_millis()).unwrap_or(u64::MAX),
                "repeated": s.repeated,
                "at": s.at,
                "tool": (s.kind == foldgate_store::StepKind::Tool)
                    .then(|| serde_json::from_str::<Value>(&s.body).ok()
                        .and_then(|b| b.get("name").cloned()))
                    .flatten(),
            })).collect::<Vec<_>>(),
            "outcome": outcome,
        }))
    }

    /// A task as `tasks/get` reports it: working, or completed with the
    /// result `branch_run` gives.
    async fn task(&self, who: &Principal, task_id: &str) -> Result<DetailedTask, ErrorData> {
        let unknown =
            || ErrorData::invalid_params("unknown task", Some(json!({"field": "taskId"})));
        let id = BranchId::parse(task_id).map_err(|_| unknown())?;
        let branch = match self.service.status(who, foldgate_engine::StatusQuery::Branch(id)).await
        {
            Ok(Some(branch)) if branch.kind == BranchKind::Gateway => branch,
            Ok(_) | Err(FoldError::BranchNotFound) => return Err(unknown()),
            Err(e) => return Err(task_error(&e)),
        };
        let found = self.runner.outcome_or_steps(who, id).await.map_err(|e| task_error(&e))?;
        let created = branch.created_at.to_rfc3339();
        Ok(match found {
            Ok(outcome) => {
                let updated = branch.completed_at.unwrap_or(branch.created_at).to_rfc3339();
                let task = Task::new(task_id, TaskStatus::Completed, created, updated);
                let result = CallToolResult::structured(outcome_view(&outcome));
                let result = match serde_json::to_value(&result) {
                    Ok(Value::Object(map)) => map,
                    _ => return Err(error::internal("a run's result could not be encoded")),
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

/// The answer to a call that could not wait for its run.
fn still_running(branch: &Branch) -> Value {
    json!({
        "branch_id": branch.id,
        "status": "running",
        "message": format!(
            "The run is still working. Its result will be in branch_status(branch_id: \"{}\") \
             under run.outcome; ask for progress or use the tasks extension to wait for it.",
            branch.id
        ),
    })
}

fn task_error(e: &FoldError) -> ErrorData {
    error::tool_error("tasks/get", e).err().unwrap_or_else(|| error::internal(&e.to_string()))
}

/// `branch_run`'s result.
fn outcome_view(o: &RunOutcome) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// What `branch_status` shows of a branch.
fn branch_view(b: &Branch) -> Value {
    json!({
        "branch_id": b.id,
        "session_id": b.session_id.as_str(),
        "parent_branch_id": b.parent,
        "status": b.status.as_str(),
        "reason": b.reason.map(|r| r.as_str()),
        "depth": b.depth,
        "description": b.description,
        "budget_total": b.ledger.budget,
        "budget_used": b.ledger.used,
        "budget_lent_to_children": b.ledger.reserved,
        "budget_warning": b.warned_at.is_some(),
        "created_at": b.created_at,
        "deadline_at": b.deadline_at,
        "completed_at": b.completed_at,
        "kind": b.kind.as_str(),
        "return_tier": b.return_tier.as_str(),
        "tokens_returned": b.returned_tokens,
    })
}

/// The `calls` member of `branch_status`: the branch's upstream calls.
fn calls_view(c: &foldgate_engine::CallSummary) -> Value {
    json!({
        "count": c.calls,
        "tokens_in": c.tokens_in,
        "tokens_out": c.tokens_out,
        "tokens_charged": c.tokens_charged,
        "errors": c.errors,
        "truncated": c.truncated,
        "last_call_at": c.last_call_at,
        "by_tool": c.by_tool.iter().map(|t| json!({
            "tool": format!("{}{}{}", t.upstream, foldgate_upstream::NAMESPACE_SEPARATOR, t.tool),
            "calls": t.calls,
            "tokens": t.tokens,
        })).collect::<Vec<_>>(),
    })
}

/// The principal the auth layer put on the HTTP request.
pub(crate) fn principal_of(ctx: &RequestContext<RoleServer>) -> Option<Authenticated> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Authenticated>())
        .cloned()
}

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
    };
    let mut annotations = ToolAnnotations::default();
    annotations.title = Some(title.to_owned());
    annotations.read_only_hint = Some(read_only);
    annotations.destructive_hint = Some(destructive);
    annotations.idempotent_hint = Some(read_only);
    annotations.open_world_hint = Some(false);
    let mut tool = Tool::new(t.name(), description, Arc::new(args::input_schema(t)));
    tool.title = Some(title.to_owned());
    tool.annotations = Some(annotations);
    tool
}

impl ServerHandler for FoldingTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("foldgate", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
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
        let mut tools: Vec<Tool> = FoldingTool::ALL
            .into_iter()
            .filter(|t| *t != FoldingTool::BranchRun || runs)
            .map(tool)
            .collect();
        if let Some(who) = who {
            tools.extend(self.upstreams.tools_for(&who));
        }
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
            return Err(error::internal("request without a principal"));
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
            return Err(error::internal("request without a principal"));
        };
        self.task(&who.principal, &request.task_id).await.map(|_| ())
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Some(who) = principal_of(&context) else {
            return Err(error::internal("request without a principal"));
        };
        if !who.has_scope(FoldingTool::BranchRun.scope()) {
            return Err(ErrorData::new(
                ErrorCode(error::INSUFFICIENT_SCOPE),
                format!("the token lacks the {} scope", FoldingTool::BranchRun.scope()),
                None,
            ));
        }
        let task = self.task(&who.principal, &request.task_id).await?;
        if task.status() == TaskStatus::Working
            && let Ok(id) = BranchId::parse(&request.task_id)
        {
            // The run sees its branch end and concludes, cut, as cancelled.
            self.service
                .force_return(&who.principal.tenant, id, EndReason::ReportedFailure)
                .await
                .map_err(|e| task_error(&e))?;
        }
        Ok(())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(who) = principal_of(&context) else {
            // The auth layer runs before every request reaches here.
            return Err(error::internal("request without a principal"));
        };
        let Some(tool) = FoldingTool::from_name(&request.name) else {
            return match self.upstreams.lookup(&who, &request.name) {
                Lookup::Found(upstream, tool) => {
                    let headers =
                        context.extensions.get::<http::request::Parts>().map(|p| &p.headers);
                    // rmcp hands the request's `_meta` over in the context.
                    let meta = request.meta.as_ref().map_or(&context.meta.0.0, |m| &m.0.0);
                    let call = UpstreamCall {
                        upstream: &upstream,
                        tool: &tool,
                        arguments: request.arguments.as_ref(),
                        meta: Some(meta),
                    };
                    proxy::call(&self.service, &who, call, headers).await
                }
                Lookup::MissingScope(scope) => Err(ErrorData::new(
                    ErrorCode(error::INSUFFICIENT_SCOPE),
                    format!("the token lacks the {scope} scope"),
                    Some(json!({"scope": scope})),
                )),
                Lookup::Unknown => Err(ErrorData::invalid_params(
                    format!("unknown tool {:?}", request.name),
                    Some(json!({"field": "name"})),
                )),
            };
        };
        if !who.has_scope(tool.scope()) {
            return Err(ErrorData::new(
                ErrorCode(error::INSUFFICIENT_SCOPE),
                format!("the token lacks the {} scope", tool.scope()),
                Some(json!({"scope": tool.scope()})),
            ));
        }
        let parsed = args::parse(tool, request.arguments.as_ref(), self.service.config())
            .map_err(|e: ArgError| error::invalid_argument(&e))?;
        if let Parsed::Run(req) = parsed {
            return self.run(&who, req, &context).await;
        }
        let result = match self.call(&who.principal, parsed).await {
            Ok(value) => CallToolResult::structured(value),
            Err(e) => return error::tool_error(tool.name(), &e),
        };
        Ok(result.into())
    }
}
