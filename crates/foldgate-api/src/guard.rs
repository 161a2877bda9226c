//! Checks on the HTTP request before rmcp sees it: body size, Host and
//! Origin, and the MCP guard that parses JSON-RPC and validates folding tool
//! arguments, so that bad input is a 400 that names the field.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::Response,
};
use foldgate_engine::{FoldingConfig, TenantRules};
use serde_json::{Value, json};

use crate::{
    args::{self, ArgError, FoldingTool},
    auth::Authenticated,
    call::{Checked, Read, Target},
    error::jsonrpc_error,
    host::{HostPattern, OriginPattern, split_origin},
};
use foldgate_upstream::{Lookup, Upstreams};

/// The most bytes a request body may have, for whoever reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimit(pub usize);

/// The answer to a body over the limit: 413.
pub(crate) fn body_too_large(max: usize) -> Response {
    jsonrpc_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        None,
        -32600,
        &format!("request body exceeds {max} bytes"),
        None,
    )
}

/// Limits the body to `max` bytes without reading it: a declared length
/// over it is refused with 413 at once, before authentication, and any
/// other body is cut off while it is read (after authentication), which
/// the reader answers with 413 too ([`BodyLimit`]).
pub(crate) async fn limit_body(State(max): State<usize>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > max) {
        return body_too_large(max);
    }
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(BodyLimit(max));
    let limited = Body::new(http_body_util::Limited::new(body, max));
    next.run(Request::from_parts(parts, limited)).await
}

/// Whether a body read failed because it went over its [`BodyLimit`].
pub(crate) fn over_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Which `Host` and `Origin` values are accepted (DNS-rebinding protection,
/// required of MCP servers).
#[derive(Debug, Clone)]
pub struct HostOriginPolicy {
    hosts: Vec<HostPattern>,
    /// With none, an origin is accepted if its authority is an accepted host.
    origins: Vec<OriginPattern>,
}

impl HostOriginPolicy {
    /// The policy of `api.allowed_hosts` and `api.allowed_origins`; an
    /// entry that is not a host or an origin is an error naming it.
    pub fn new(hosts: &[String], origins: &[String]) -> Result<Self, String> {
        let hosts = hosts
            .iter()
            .map(|h| HostPattern::parse(h).map_err(|why| format!("allowed_hosts: {h:?} {why}")))
            .collect::<Result<_, _>>()?;
        let origins = origins
            .iter()
            .map(|o| OriginPattern::parse(o).map_err(|why| format!("allowed_origins: {o:?} {why}")))
            .collect::<Result<_, _>>()?;
        Ok(Self { hosts, origins })
    }

    fn host_allowed(&self, host: &str) -> bool {
        self.hosts.iter().any(|allowed| allowed.accepts(host))
    }

    /// An origin is allowed if listed; with no list, if its authority is
    /// one of the allowed hosts (a page served from the gateway's own
    /// address), which still defeats DNS rebinding.
    fn origin_allowed(&self, origin: &str) -> bool {
        if self.origins.is_empty() {
            return split_origin(origin).is_some_and(|(scheme, authority)| {
                matches!(scheme, "http" | "https") && self.host_allowed(authority)
            });
        }
        self.origins.iter().any(|allowed| allowed.accepts(origin))
    }
}

pub(crate) async fn check_host_origin(
    State(policy): State<Arc<HostOriginPolicy>>,
    req: Request,
    next: Next,
) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    let Some(host) = host.filter(|h| policy.host_allowed(h)) else {
        return jsonrpc_error(StatusCode::FORBIDDEN, None, -32600, "Host not allowed", None);
    };
    let _ = host;
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let allowed = origin.to_str().is_ok_and(|o| policy.origin_allowed(o));
        if !allowed {
            return jsonrpc_error(StatusCode::FORBIDDEN, None, -32600, "Origin not allowed", None);
        }
    }
    next.run(req).await
}

/// What the MCP guard needs.
#[derive(Debug, Clone)]
pub(crate) struct GuardState {
    pub folding: Arc<FoldingConfig>,
    /// Each tenant's own budget policy, over `folding`'s.
    pub tenants: Arc<TenantRules>,
    pub upstreams: Arc<Upstreams>,
    /// Where the protected-resource metadata lives, for 403 challenges.
    pub resource_metadata: Arc<str>,
}

/// Checks a JSON-RPC message posted to `/mcp` (already parsed and read, or
/// the parse error): a message object, `jsonrpc: "2.0"`, the scopes of
/// `tasks/*`, and for `tools/call` the tool, the caller's scope and the
/// arguments, which it returns parsed. Whatever else rmcp cannot read (ids
/// that are neither strings nor numbers, mistyped params, repeated members)
/// rmcp refuses itself, and the exchange layer turns its answer into a
/// JSON-RPC 400 as well.
pub(crate) fn check_message(
    state: &GuardState,
    who: Option<&Authenticated>,
    message: &Result<Value, serde_json::Error>,
    read: Option<&Read<'_>>,
    // Boxed: a response is large, and the error path is the rare one.
) -> Result<Option<Checked>, Box<Response>> {
    if let Err(e) = message {
        return Err(Box::new(jsonrpc_error(
            StatusCode::BAD_REQUEST,
            None,
            -32700,
            &format!("parse error: {e}"),
            None,
        )));
    }
    let invalid = |id: Option<&Value>, why: &str| {
        Box::new(jsonrpc_error(
            StatusCode::BAD_REQUEST,
            id,
            -32600,
            &format!("invalid request: {why}"),
            None,
        ))
    };
    let Some(read) = read else {
        return Err(invalid(
            None,
            "expected a JSON-RPC message object (batches are not supported)",
        ));
    };
    let id = read.id;
    if read.jsonrpc != Some("2.0") {
        return Err(invalid(id, "`jsonrpc` must be \"2.0\""));
    }
    let Some(method) = read.method else {
        // A response from the client (to a server request): rmcp handles it.
        return Ok(None);
    };
    let Some(method) = method.as_str() else {
        return Err(invalid(id, "`method` must be a string"));
    };
    let missing_scope = |scope: &str| {
        Box::new(crate::auth::insufficient_scope_response(scope, &state.resource_metadata))
    };
    // Tasks are gateway-run branches: reading one is reading a branch,
    // cancelling it is ending one.
    let task_scope = match method {
        "tasks/get" | "tasks/update" => Some(FoldingTool::BranchStatus.scope()),
        "tasks/cancel" => Some(FoldingTool::BranchRun.scope()),
        _ => None,
    };
    if let (Some(scope), Some(who)) = (task_scope, who)
        && !who.has_scope(scope)
    {
        return Err(missing_scope(scope));
    }
    if method != "tools/call" {
        return Ok(None);
    }
    let Some(named) = &read.tool else {
        return Err(Box::new(jsonrpc_error(
            StatusCode::BAD_REQUEST,
            id,
            -32602,
            "invalid tool call: `params.name` must be a string",
            Some(json!({"field": "name"})),
        )));
    };
    let arguments = match read.params.and_then(|p| p.get("arguments")) {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(map),
        Some(_) => {
            return Err(Box::new(jsonrpc_error(
                StatusCode::BAD_REQUEST,
                id,
                -32602,
                "invalid argument `arguments`: must be an object",
                Some(json!({"field": "arguments"})),
            )));
        }
    };
    let bad_argument = |e: &ArgError| {
        Box::new(jsonrpc_error(
            StatusCode::BAD_REQUEST,
            id,
            -32602,
            &e.to_string(),
            Some(json!({"field": e.field, "reason": e.reason})),
        ))
    };
    let unknown = || bad_argument(&ArgError::new("name", format!("unknown tool {:?}", named.name)));
    match &named.target {
        Target::Folding(tool) => {
            if let Some(who) = who
                && !who.has_scope(tool.scope())
            {
                return Err(missing_scope(tool.scope()));
            }
            let rules = who.map(|w| state.tenants.of(&w.principal.tenant));
            let budget = rules.as_ref().map_or(&state.folding.budget, |r| &r.budget);
            let parsed = args::parse(*tool, arguments, &state.folding, budget)
                .map_err(|e| bad_argument(&e))?;
            if let (Some(scope), Some(who)) = (parsed.extra_scope(), who)
                && !who.has_scope(scope)
            {
                return Err(missing_scope(scope));
            }
            // The tools a run may use must be upstream tools the caller may call.
            if let (args::Parsed::Run(run), Some(who)) = (&parsed, who) {
                for name in run.tools.iter().flatten() {
                    if !matches!(state.upstreams.lookup(who, name), Lookup::Found(..)) {
                        let reason =
                            format!("{name:?} is not an upstream tool this token may call");
                        return Err(bad_argument(&ArgError::new("tools", reason)));
                    }
                }
            }
            Ok(Some(Checked::Folding(parsed)))
        }
        Target::Upstream { upstream, tool, branch } => {
            let branch = branch.clone().map_err(|e| bad_argument(&e))?;
            tool.check_arguments(arguments)
                .map_err(|m| bad_argument(&ArgError::new(m.field, m.reason)))?;
            Ok(Some(Checked::Upstream {
                upstream: Arc::clone(upstream),
                tool: Arc::clone(tool),
                branch,
            }))
        }
        Target::MissingScope(scope) => Err(missing_scope(scope)),
        Target::Unknown => Err(unknown()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy() {
        let p = HostOriginPolicy::new(
            &["localhost".into(), "api.example.com:8443".into(), "*.corp.example".into()],
            &["https://app.example.com".into()],
        )
        .unwrap();
        assert!(p.host_allowed("localhost:8080"));
        assert!(p.host_allowed("api.example.com:8443"));
        assert!(p.host_allowed("gw.corp.example"));
        assert!(!p.host_allowed("evil.example"));
        assert!(p.origin_allowed("https://app.example.com"));
        assert!(!p.origin_allowed("https://evil.example"));
        let own = HostOriginPolicy { origins: Vec::new(), ..p };
        assert!(own.origin_allowed("http://localhost:8080"), "the gateway's own origin");
        assert!(own.origin_allowed("https://gw.corp.example"));
        assert!(!own.origin_allowed("http://evil.example"));
        assert!(!own.origin_allowed("null"));
        assert!(!own.origin_allowed("ftp://localhost"));
    }

    #[test]
    fn a_bad_entry_is_named() {
        let e = HostOriginPolicy::new(&["https://x.example".into()], &[]).unwrap_err();
        assert!(e.starts_with("allowed_hosts: \"https://x.example\" is a URL"), "{e}");
        let e = HostOriginPolicy::new(&[], &["x.example".into()]).unwrap_err();
        assert!(e.starts_with("allowed_origins: \"x.example\" is not an origin"), "{e}");
    }
}
