//! A catalogue of 327 upstream tools across 25 servers of the kinds teams
//! run (code hosting, issue trackers, chat, mail, files, databases,
//! clusters, monitoring, payments, a browser), and 72 needs an agent might
//! search them for, each labelled with the tool a careful person would pick
//! (`data/tool-catalog.json`, `data/tool-queries.json`). Several servers
//! overlap in kind (GitHub and GitLab, Jira and Linear, Slack and mail,
//! Postgres and a warehouse), so that finding the right one is not trivial.

use std::sync::Arc;

use rmcp::model::Tool;
use serde::Deserialize;
use serde_json::{Map, Value};

/// One server of the catalogue.
#[derive(Debug, Clone)]
pub struct CatalogUpstream {
    /// The name to declare it by in `[[upstreams]]`.
    pub name: String,
    /// Its tools, by the names it gives them.
    pub tools: Vec<Tool>,
}

/// One labelled need.
#[derive(Debug, Clone, Deserialize)]
pub struct LabelledQuery {
    pub query: String,
    /// The right tool, namespaced (`<upstream>__<tool>`); two where both are
    /// equally right.
    pub expected: Vec<String>,
}

#[derive(Deserialize)]
struct CatalogFile {
    upstreams: Vec<UpstreamEntry>,
}

#[derive(Deserialize)]
struct UpstreamEntry {
    name: String,
    tools: Vec<ToolEntry>,
}

#[derive(Deserialize)]
struct ToolEntry {
    name: String,
    title: Option<String>,
    description: String,
    #[serde(rename = "inputSchema")]
    input_schema: Map<String, Value>,
}

#[derive(Deserialize)]
struct QueriesFile {
    queries: Vec<LabelledQuery>,
}

/// Every server of the catalogue, in its order.
pub fn upstreams() -> Vec<CatalogUpstream> {
    let file: CatalogFile =
        serde_json::from_str(include_str!("../data/tool-catalog.json")).expect("the catalogue");
    file.upstreams
        .into_iter()
        .map(|u| CatalogUpstream {
            name: u.name,
            tools: u
                .tools
                .into_iter()
                .map(|t| {
                    let mut tool = Tool::new(t.name, t.description, Arc::new(t.input_schema));
                    tool.title = t.title;
                    tool
                })
                .collect(),
        })
        .collect()
}

/// Every tool as an agent sees it behind the gateway: `<upstream>__<tool>`.
pub fn namespaced_tools() -> Vec<Tool> {
    upstreams()
        .into_iter()
        .flat_map(|u| {
            u.tools.into_iter().map(move |mut t| {
                t.name = format!("{}__{}", u.name, t.name).into();
                t
            })
        })
        .collect()
}

/// The labelled needs.
pub fn queries() -> Vec<LabelledQuery> {
    let file: QueriesFile =
        serde_json::from_str(include_str!("../data/tool-queries.json")).expect("the queries");
    file.queries
}
