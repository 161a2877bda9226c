//! `tool_search`: the upstream tools that best match a query.
//!
//! Tools are ranked with BM25 (the `bm25` crate, with its English
//! tokenizer: Unicode folded to ASCII, stop words dropped, words stemmed, so
//! "repositories" finds `list_repos`' "repository"). A tool is read as its
//! name (upstream and tool, identifiers split into words: `list_pull_requests`
//! and `listPullRequests` are "list pull requests"), its title, its
//! description, and its arguments' names and descriptions. Names count
//! three times, titles and argument names twice, descriptions once: a word
//! in a tool's name says more about what it does than one in its prose.

use bm25::{Document, Language, SearchEngineBuilder};
use rmcp::model::Tool;
use serde_json::Value;

/// How many times the words of each part of a tool count.
const NAME_WEIGHT: usize = 3;
const TITLE_WEIGHT: usize = 2;
const ARGUMENT_NAME_WEIGHT: usize = 2;

/// The longest text of one tool that is read (its description and its
/// arguments' descriptions are cut past it), bounding the work an upstream
/// with very long descriptions makes for each search.
const MAX_DOCUMENT_CHARS: usize = 8_000;

/// Ranks `tools` for `query`: up to `limit` of them, as indexes into
/// `tools` with their scores, best first (equal scores by name). A tool
/// that shares no word with the query is left out.
pub fn rank(tools: &[Tool], query: &str, limit: usize) -> Vec<(usize, f32)> {
    let query = words(query);
    if tools.is_empty() || limit == 0 || query.trim().is_empty() {
        return Vec::new();
    }
    let documents = tools.iter().enumerate().map(|(i, tool)| Document::new(i, document(tool)));
    let engine = SearchEngineBuilder::<usize>::with_documents(Language::English, documents).build();
    let mut found: Vec<(usize, f32)> = engine
        .search(&query, None)
        .into_iter()
        .filter(|r| r.score > 0.0)
        .map(|r| (r.document.id, r.score))
        .collect();
    found.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| tools[a.0].name.cmp(&tools[b.0].name)));
    found.truncate(limit);
    found
}

/// A tool as the ranking reads it.
fn document(tool: &Tool) -> String {
    let mut text = String::new();
    let name = words(&tool.name);
    for _ in 0..NAME_WEIGHT {
        push(&mut text, &name);
    }
    if let Some(title) = &tool.title {
        for _ in 0..TITLE_WEIGHT {
            push(&mut text, title);
        }
    }
    let mut prose = String::new();
    if let Some(description) = &tool.description {
        push(&mut prose, description);
    }
    if let Some(Value::Object(properties)) = tool.input_schema.get("properties") {
        for (argument, schema) in properties {
            let argument = words(argument);
            for _ in 0..ARGUMENT_NAME_WEIGHT {
                push(&mut text, &argument);
            }
            if let Some(description) = schema.get("description").and_then(Value::as_str) {
                push(&mut prose, description);
            }
        }
    }
    let cut = prose.char_indices().nth(MAX_DOCUMENT_CHARS).map_or(prose.len(), |(at, _)| at);
    push(&mut text, &prose[..cut]);
    text
}

fn push(text: &mut String, more: &str) {
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(more);
}

/// Text with its identifiers split into words: `_`, `-`, `.`, `/` and `:`
/// separate words, and so does a capital after a small letter or a digit
/// (`listPullRequests`).
pub fn words(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut previous: Option<char> = None;
    for c in text.chars() {
        if matches!(c, '_' | '-' | '.' | '/' | ':') {
            out.push(' ');
        } else {
            if c.is_uppercase() && previous.is_some_and(|p| p.is_lowercase() || p.is_ascii_digit())
            {
                out.push(' ');
            }
            out.push(c);
        }
        previous = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn tool(name: &str, description: &str, properties: Value) -> Tool {
        let schema = json!({"type": "object", "properties": properties});
        let Value::Object(schema) = schema else { unreachable!() };
        Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema))
    }

    #[test]
    fn identifiers_are_split_into_words() {
        assert_eq!(words("github__list_pull_requests"), "github  list pull requests");
        assert_eq!(words("listPullRequests"), "list Pull Requests");
        assert_eq!(words("k8s.get-pods"), "k8s get pods");
        assert_eq!(words("plain words stay"), "plain words stay");
    }

    #[test]
    fn the_tool_that_names_the_need_ranks_first() {
        let tools = vec![
            tool("git__commit", "Record staged changes in the repository.", json!({})),
            tool(
                "github__create_pull_request",
                "Open a pull request from one branch into another.",
                json!({"head": {"description": "the branch with the changes"}}),
            ),
            tool("github__list_issues", "List a repository's issues.", json!({})),
            tool("slack__post_message", "Send a message to a channel.", json!({})),
        ];
        let found = rank(&tools, "open a pull request for my branch", 3);
        assert_eq!(found.first().map(|f| f.0), Some(1), "{found:?}");
        let found = rank(&tools, "post to the team's channel", 3);
        assert_eq!(found.first().map(|f| f.0), Some(3), "{found:?}");
        // Stemming: "issue" finds "issues".
        let found = rank(&tools, "which issue", 3);
        assert_eq!(found.first().map(|f| f.0), Some(2), "{found:?}");
    }

    #[test]
    fn no_shared_word_finds_nothing_and_limits_hold() {
        let tools = vec![
            tool("a__one", "alpha beta", json!({})),
            tool("a__two", "alpha gamma", json!({})),
            tool("a__three", "alpha delta", json!({})),
        ];
        assert!(rank(&tools, "zeta", 5).is_empty());
        assert!(rank(&tools, "   ", 5).is_empty());
        assert!(rank(&tools, "alpha", 0).is_empty());
        assert!(rank(&[], "alpha", 5).is_empty());
        let found = rank(&tools, "alpha", 2);
        assert_eq!(found.len(), 2);
        // Equal scores come by name.
        let names: Vec<&str> = found.iter().map(|(i, _)| tools[*i].name.as_ref()).collect();
        assert_eq!(names, ["a__one", "a__three"]);
    }

    #[test]
    fn a_name_outweighs_a_mention_in_prose() {
        let tools = vec![
            tool("db__query", "Runs SQL. Unlike delete_rows it never deletes rows.", json!({})),
            tool("db__delete_rows", "Removes the rows a filter matches.", json!({})),
        ];
        let found = rank(&tools, "delete rows", 2);
        assert_eq!(found.first().map(|f| f.0), Some(1), "{found:?}");
    }
}
