//! What a message posted to `/mcp` asks for, read once.
//!
//! The exchange layer parses each posted message into a JSON value once and
//! reads it here into a [`Read`]: the JSON-RPC head, and for `tools/call`
//! which tool it names — a folding tool, or an upstream tool looked up once
//! for the caller, with the branch the call names. Observing
//! ([`observe`](crate::observe)) and checking ([`guard`](crate::guard)) both
//! take that [`Read`]; the guard turns it into a [`Checked`] call, with the
//! folding tool's arguments parsed, which travels in the request's
//! extensions to the tool handlers ([`tools`](crate::tools)), so nothing is
//! looked up or parsed twice.

use std::sync::Arc;

use foldgate_auth::Authenticated;
use foldgate_domain::BranchId;
use foldgate_upstream::{Lookup, Upstream, UpstreamTool, Upstreams, meter::BRANCH_META_KEY};
use http::HeaderMap;
use serde_json::{Map, Value};

use crate::args::{ArgError, FoldingTool, Parsed};

/// The HTTP header naming the branch a call belongs to.
pub const BRANCH_HEADER: &str = "foldgate-branch";

/// A JSON-RPC message as posted, borrowed from its parsed body.
#[derive(Debug)]
pub(crate) struct Read<'a> {
    pub id: Option<&'a Value>,
    pub jsonrpc: Option<&'a str>,
    /// `None` for a response to a server request.
    pub method: Option<&'a Value>,
    pub params: Option<&'a Map<String, Value>>,
    pub meta: Option<&'a Map<String, Value>>,
    /// For `tools/call`: the tool it names.
    pub tool: Option<Named<'a>>,
}

/// The tool a `tools/call` names.
#[derive(Debug)]
pub(crate) struct Named<'a> {
    pub name: &'a str,
    pub target: Target,
}

/// What a tool name is, for this caller.
#[derive(Debug)]
pub(crate) enum Target {
    Folding(FoldingTool),
    Upstream {
        upstream: Arc<Upstream>,
        tool: Arc<UpstreamTool>,
        /// The branch the call names, in `_meta` or the header.
        branch: Result<Option<BranchId>, ArgError>,
    },
    /// An upstream tool the tenant sees but the token may not call.
    MissingScope(String),
    Unknown,
}

impl<'a> Read<'a> {
    /// `None` for anything but a JSON object.
    pub fn new(
        message: &'a Value,
        headers: &HeaderMap,
        who: Option<&Authenticated>,
        upstreams: &Upstreams,
    ) -> Option<Self> {
        let obj = message.as_object()?;
        let method = obj.get("method");
        let params = obj.get("params").and_then(Value::as_object);
        let meta = params.and_then(|p| p.get("_meta")).and_then(Value::as_object);
        let tool = (method.and_then(Value::as_str) == Some("tools/call"))
            .then(|| params?.get("name")?.as_str())
            .flatten()
            .map(|name| Named { name, target: Target::of(name, meta, headers, who, upstreams) });
        Some(Self {
            id: obj.get("id"),
            jsonrpc: obj.get("jsonrpc").and_then(Value::as_str),
            method,
            params,
            meta,
            tool,
        })
    }

    /// The method, if it is a string.
    pub fn method(&self) -> Option<&'a str> {
        self.method.and_then(Value::as_str)
    }

    /// A `tools/call`'s arguments, if they are an object.
    pub fn arguments(&self) -> Option<&'a Map<String, Value>> {
        self.params.and_then(|p| p.get("arguments")).and_then(Value::as_object)
    }
}

impl Target {
    fn of(
        name: &str,
        meta: Option<&Map<String, Value>>,
        headers: &HeaderMap,
        who: Option<&Authenticated>,
        upstreams: &Upstreams,
    ) -> Self {
        if let Some(tool) = FoldingTool::from_name(name) {
            return Self::Folding(tool);
        }
        let Some(who) = who else { return Self::Unknown };
        match upstreams.lookup(who, name) {
            Lookup::Found(upstream, tool) => {
                Self::Upstream { upstream, tool, branch: named_branch(meta, Some(headers)) }
            }
            Lookup::MissingScope(scope) => Self::MissingScope(scope),
            Lookup::Unknown => Self::Unknown,
        }
    }

    /// Whether the gateway offers this tool to the caller.
    pub fn offered(&self) -> bool {
        !matches!(self, Self::Unknown)
    }
}

/// A `tools/call` the guard let through, as the tool handlers receive it in
/// the request's extensions.
#[derive(Debug, Clone)]
pub(crate) enum Checked {
    Folding(Parsed),
    Upstream { upstream: Arc<Upstream>, tool: Arc<UpstreamTool>, branch: Option<BranchId> },
}

/// Which branch a request names, from `_meta` or the header. The error names
/// the field.
pub fn named_branch(
    meta: Option<&Map<String, Value>>,
    headers: Option<&HeaderMap>,
) -> Result<Option<BranchId>, ArgError> {
    let invalid =
        |field: &str, reason: &str| ArgError { field: field.to_owned(), reason: reason.to_owned() };
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
