//! The MCP tools: `branch_create`, `branch_return`, `branch_status` and
//! `session_end`, over the folding service.

use std::sync::Arc;

use foldgate_domain::{Branch, Principal};
use foldgate_engine::{FoldError, FoldingService};
use rmcp::{
    ServerHandler,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestMethod,
        CompleteRequestParams, CompleteResult, ErrorCode, ErrorData, Implementation,
        ListPromptsRequestMethod, ListPromptsResult, ListResourceTemplatesRequestMethod,
        ListResourceTemplatesResult, ListResourcesRequestMethod, ListResourcesResult,
        ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
        ToolAnnotations,
    },
    service::{RequestContext, RoleServer},
};
use serde_json::{Value, json};

use crate::{
    args::{self, ArgError, FoldingTool, Parsed},
    auth::Authenticated,
    error, proxy,
    upstream::{Lookup, Upstreams},
};

/// What the server tells a model about folding when it connects.
const INSTRUCTIONS: &str = "\
This server manages context folding. When a sub-task needs exploration that would fill your \
context (reading many files, searching, trying several fixes), call branch_create to open a \
branch with a budget and a deadline, do the work inside it, then call branch_return with a short \
summary: only that summary comes back to the parent context. Branches nest up to depth 3; \
branch_status shows where you are; session_end closes everything when the conversation ends.";

/// The folding tools and the upstreams' tools, served per request
/// (stateless).
#[derive(Debug, Clone)]
pub struct FoldingTools {
    service: Arc<FoldingService>,
    upstreams: Arc<Upstreams>,
}

impl FoldingTools {
    pub fn new(service: Arc<FoldingService>, upstreams: Arc<Upstreams>) -> Self {
        Self { service, upstreams }
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
                })
            }
            Parsed::Return(req) => {
                let returned = s.return_branch(who, req).await?;
                let b = &returned.branch;
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
                })
            }
            Parsed::Status(query) => match s.status(who, query).await? {
                Some(branch) => {
                    let calls = s.call_summary(who, branch.id).await?;
                    let mut view = branch_view(&branch);
                    view["calls"] = calls_view(&calls);
                    view
                }
                None => json!({"branch_id": null, "status": "No active branch found"}),
            },
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
            "tool": format!("{}{}{}", t.upstream, crate::upstream::NAMESPACE_SEPARATOR, t.tool),
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
            "Open a budgeted, time-limited branch for a sub-task (exploration, research, \
             trial and error). Work inside it, then call branch_return with a short summary; only \
             that summary reaches the parent context. Returns branch_id, depth and the budget \
             actually allocated. The gateway counts the branch's tokens and ends it at its budget \
             or deadline.",
            false,
            false,
        ),
        FoldingTool::BranchReturn => (
            "Return from a branch",
            "Finish a branch and hand its result to the parent: a concise summary of findings \
             or of what failed (outcome \"failure\"), not raw material. Active child branches are \
             ended first. Secrets in the message are redacted. Returns tokens_used and the \
             message as the parent receives it.",
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
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("foldgate", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools: Vec<Tool> = FoldingTool::ALL.into_iter().map(tool).collect();
        if let Some(who) = principal_of(&context) {
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
                    let call = proxy::UpstreamCall {
                        upstream: &upstream,
                        tool: &tool,
                        request: &request,
                        meta: Some(meta),
                        headers,
                    };
                    proxy::call(&self.service, &who.principal, call).await
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
        let result = match self.call(&who.principal, parsed).await {
            Ok(value) => CallToolResult::structured(value),
            Err(e) => return error::tool_error(tool.name(), &e),
        };
        Ok(result.into())
    }
}
