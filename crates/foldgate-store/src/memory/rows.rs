//! `memories` rows as the store reads them.

use chrono::{DateTime, Utc};
use foldgate_domain::{
    BranchId, Confidence, MemoryId, MemoryItem, MemorySource, Provenance, SessionId, Subject,
    TenantId,
};
use uuid::Uuid;

use crate::StoreError;

/// A `memories` row.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct MemoryRow {
    tenant_id: String,
    id: Uuid,
    kind: String,
    source: String,
    title: String,
    description: String,
    content: String,
    prior: f64,
    confidence: f64,
    subject: String,
    session_id: Option<String>,
    branch_id: Option<Uuid>,
    flagged: String,
    uses: i64,
    helpful: i64,
    unhelpful: i64,
    created_at: DateTime<Utc>,
    last_used_at: Option<DateTime<Utc>>,
}

#[derive(Debug, sqlx::FromRow)]
pub(super) struct RankedRow {
    #[sqlx(flatten)]
    pub row: MemoryRow,
    pub score: f64,
}

pub(super) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn count(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(format!("negative count {v}")))
}

impl TryFrom<MemoryRow> for MemoryItem {
    type Error = StoreError;

    fn try_from(r: MemoryRow) -> Result<Self, Self::Error> {
        Ok(MemoryItem {
            id: MemoryId::from_uuid(r.id),
            kind: r.kind.parse().map_err(corrupt)?,
            title: r.title,
            description: r.description,
            content: r.content,
            prior: Confidence::new(r.prior).map_err(corrupt)?,
            confidence: Confidence::new(r.confidence).map_err(corrupt)?,
            provenance: Provenance {
                tenant: TenantId::parse(&r.tenant_id).map_err(corrupt)?,
                subject: Subject::parse(&r.subject).map_err(corrupt)?,
                session: r
                    .session_id
                    .as_deref()
                    .map(SessionId::parse)
                    .transpose()
                    .map_err(corrupt)?,
                branch: r.branch_id.map(BranchId::from_uuid),
                source: r.source.parse::<MemorySource>().map_err(corrupt)?,
            },
            flagged: r.flagged.split_whitespace().map(str::to_owned).collect(),
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            uses: count(r.uses)?,
            helpful: count(r.helpful)?,
            unhelpful: count(r.unhelpful)?,
        })
    }
}
