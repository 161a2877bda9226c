//! The reasoning memory's tools (`memory_search`, `memory_record`,
//! `memory_feedback`), their answers, and the lessons a created branch is
//! given (`injected_context`).

use chrono::{DateTime, Utc};
use foldgate_domain::{MemoryItem, Principal};
use foldgate_engine::{FoldError, Found, Injection, MemoryBank};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::{answers::to_value, args::MemoryCall};

/// Where an item came from.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProvenanceView {
    /// `distilled` (by the gateway, from a branch it saw end) or `recorded` (by an agent).
    pub source: &'static str,
    /// Who recorded it, or whose branch it came from.
    pub subject: String,
    pub session_id: Option<String>,
    pub branch_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// An item of the memory, as tools show it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MemoryView {
    pub id: String,
    /// `strategy` or `pitfall`.
    pub kind: &'static str,
    pub title: String,
    pub description: String,
    pub content: String,
    /// 0-1; moved by `memory_feedback`.
    pub confidence: f64,
    /// Whether it clears the injection threshold (an agent's item does only after it helped).
    pub trusted: bool,
    pub provenance: ProvenanceView,
    /// How often it was injected, and the feedback it got.
    pub uses: u64,
    pub helpful: u64,
    pub unhelpful: u64,
}

impl MemoryView {
    fn new(item: &MemoryItem, trusted: bool) -> Self {
        let p = &item.provenance;
        Self {
            id: item.id.to_string(),
            kind: item.kind.as_str(),
            title: item.title.clone(),
            description: item.description.clone(),
            content: item.content.clone(),
            confidence: round(item.confidence.get()),
            trusted,
            provenance: ProvenanceView {
                source: p.source.as_str(),
                subject: p.subject.as_str().to_owned(),
                session_id: p.session.as_ref().map(|s| s.as_str().to_owned()),
                branch_id: p.branch.map(|b| b.to_string()),
                created_at: item.created_at,
            },
            uses: item.uses,
            helpful: item.helpful,
            unhelpful: item.unhelpful,
        }
    }
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// An injected lesson, as `branch_create` reports it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InjectedView {
    pub id: String,
    /// `strategy` or `pitfall`.
    pub kind: &'static str,
    pub title: String,
    pub content: String,
    pub confidence: f64,
    pub provenance: ProvenanceView,
}

impl InjectedView {
    pub fn list(injection: &Injection) -> Vec<Self> {
        injection
            .items
            .iter()
            .map(|item| {
                let view = MemoryView::new(item, true);
                Self {
                    id: view.id,
                    kind: view.kind,
                    title: view.title,
                    content: view.content,
                    confidence: view.confidence,
                    provenance: view.provenance,
                }
            })
            .collect()
    }
}

/// `memory_search`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MemorySearchAnswer {
    /// Best match first.
    pub items: Vec<MemoryView>,
}

/// `memory_record`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MemoryRecorded {
    pub item: MemoryView,
    /// The injection-screen rules it set off: a flagged item is kept for review but never
    /// injected nor found.
    pub flagged: Vec<String>,
}

/// `memory_feedback`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MemoryFeedbackAnswer {
    pub item: MemoryView,
}

/// Runs a memory tool.
pub(crate) async fn call(
    bank: &MemoryBank,
    who: &Principal,
    call: MemoryCall,
) -> Result<Value, FoldError> {
    let threshold = bank.config().memory_min_confidence;
    Ok(match call {
        MemoryCall::Search { query, kind, limit } => {
            let found = bank.search(who, &query, kind, limit).await?;
            to_value(&MemorySearchAnswer {
                items: found
                    .iter()
                    .map(|Found { item, trusted, .. }| MemoryView::new(item, *trusted))
                    .collect(),
            })
        }
        MemoryCall::Record(item) => {
            let item = bank.record(who, item).await?;
            let trusted = item.injectable(threshold);
            to_value(&MemoryRecorded {
                flagged: item.flagged.clone(),
                item: MemoryView::new(&item, trusted),
            })
        }
        MemoryCall::Feedback { id, helpful } => {
            let item = bank.feedback(who, id, helpful).await?;
            to_value(&MemoryFeedbackAnswer {
                item: MemoryView::new(&item, item.injectable(threshold)),
            })
        }
    })
}
