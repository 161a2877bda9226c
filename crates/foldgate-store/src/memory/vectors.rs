//! The memory's vectors: one per item and embeddings model, for ranking by
//! embeddings as well as by full text. A vector is stored as its floats'
//! little-endian bytes with its dimension; it goes with its item (a foreign
//! key with `ON DELETE CASCADE`).

use std::fmt::Debug;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{MemoryId, MemoryItem, MemoryKind, TenantId};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use super::{MemoryQuery, rows::MemoryRow, rows::corrupt};
use crate::{
    StoreError,
    dialect::{Dialect, Param, Sql, Value},
    store::SqlStore,
    ts::Ts,
};

/// The tenants an embeddings model serves: those listed (`None`: every
/// tenant) except the ones an earlier model serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantScope {
    pub only: Option<Vec<TenantId>>,
    pub except: Vec<TenantId>,
}

impl TenantScope {
    /// Every tenant.
    pub fn every() -> Self {
        Self::default()
    }

    pub fn contains(&self, tenant: &TenantId) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(tenant)) && !self.except.contains(tenant)
    }
}

/// What a tenant's vectors of one model look like now: a replica compares
/// it with what it cached to see whether vectors were written since. It
/// changes when one is written or rewritten, and when their number changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorsVersion {
    pub count: i64,
    /// When the latest was written (as the database spells it).
    pub latest: Option<String>,
}

/// The memory's vectors. Every method takes the tenant first (or, for the
/// backfill, the tenants it may see) and every statement filters by it.
#[async_trait]
pub trait MemoryVectors: Send + Sync + Debug {
    /// Writes an item's vector from `model`, replacing the one it had;
    /// `false`: there is no such item (it went meanwhile).
    async fn put_memory_vector(
        &self,
        tenant: &TenantId,
        id: MemoryId,
        model: &str,
        vector: &[f32],
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Every vector the tenant's items have from `model`.
    async fn memory_vectors(
        &self,
        tenant: &TenantId,
        model: &str,
    ) -> Result<Vec<(MemoryId, Vec<f32>)>, StoreError>;

    /// What the tenant's vectors from `model` look like now (one cheap
    /// statement).
    async fn memory_vectors_version(
        &self,
        tenant: &TenantId,
        model: &str,
    ) -> Result<VectorsVersion, StoreError>;

    /// Up to `limit` items of the tenants in `scope` that have no vector
    /// from `model`, in (tenant, id) order, after `after`.
    async fn memories_without_vector(
        &self,
        model: &str,
        scope: &TenantScope,
        after: Option<&(TenantId, MemoryId)>,
        limit: u32,
    ) -> Result<Vec<MemoryItem>, StoreError>;

    /// The tenant's items among `ids` that pass `filter`'s kind, confidence
    /// and flag conditions (its text and limit are not used), in no
    /// particular order.
    async fn memories_among(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
        filter: &MemoryQuery,
    ) -> Result<Vec<MemoryItem>, StoreError>;
}

/// A vector as stored: its floats' little-endian bytes.
fn to_bytes(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(bytes: &[u8], dims: i32) -> Result<Vec<f32>, StoreError> {
    let dims = usize::try_from(dims).map_err(corrupt)?;
    if bytes.len() != dims * 4 {
        return Err(corrupt(format!("a vector of {} bytes for {dims} dimensions", bytes.len())));
    }
    Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// A list of tenants as a JSON array, for the statements' `json_each` and
/// `jsonb_array_elements_text`.
fn tenants_json(tenants: &[TenantId]) -> Result<String, StoreError> {
    serde_json::to_string(&tenants.iter().map(TenantId::as_str).collect::<Vec<_>>())
        .map_err(corrupt)
}

/// `$1` the model, `$2` the tenants served (JSON array or NULL: all), `$3`
/// those excluded (JSON array), `$4`/`$5` the (tenant, id) to start after
/// (or NULL), `$6` the limit.
const WITHOUT_VECTOR: Sql = Sql {
    postgres: concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories AS m WHERE ($2::jsonb IS NULL OR m.tenant_id IN \
         (SELECT jsonb_array_elements_text($2::jsonb))) \
         AND m.tenant_id NOT IN (SELECT jsonb_array_elements_text($3::jsonb)) \
         AND ($4::text IS NULL OR (m.tenant_id, m.id) > ($4::text, $5::uuid)) \
         AND NOT EXISTS (SELECT 1 FROM memory_embeddings AS e WHERE e.tenant_id = m.tenant_id \
         AND e.memory_id = m.id AND e.model = $1) \
         ORDER BY m.tenant_id, m.id LIMIT $6"
    ),
    sqlite: concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories AS m WHERE ($2 IS NULL OR m.tenant_id IN \
         (SELECT value FROM json_each($2))) \
         AND m.tenant_id NOT IN (SELECT value FROM json_each($3)) \
         AND ($4 IS NULL OR (m.tenant_id, m.id) > ($4, $5)) \
         AND NOT EXISTS (SELECT 1 FROM memory_embeddings AS e WHERE e.tenant_id = m.tenant_id \
         AND e.memory_id = m.id AND e.model = $1) \
         ORDER BY m.tenant_id, m.id LIMIT $6"
    ),
};

/// `$2` the ids (a JSON array of 32 hex digits each), then the filters as
/// in full-text search: `$3` the confidence floor, `$4` a kind or NULL,
/// `$5` whether flagged items count.
const AMONG: Sql = Sql {
    postgres: concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories WHERE tenant_id = $1 \
         AND id IN (SELECT CAST(e AS uuid) FROM jsonb_array_elements_text($2::jsonb) AS e) \
         AND confidence >= $3 AND ($4::text IS NULL OR kind = $4) AND ($5 OR flagged = '')"
    ),
    sqlite: concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories WHERE tenant_id = $1 \
         AND id IN (SELECT unhex(value) FROM json_each($2)) \
         AND confidence >= $3 AND ($4 IS NULL OR kind = $4) AND ($5 OR flagged = '')"
    ),
};

#[async_trait]
impl<D: Dialect> MemoryVectors for SqlStore<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    for<'a> &'a str: Encode<'a, D::DB> + Type<D::DB> + ColumnIndex<<D::DB as Database>::Row>,
    usize: ColumnIndex<<D::DB as Database>::Row>,
    Ts: Param<D::DB>,
    for<'a> Option<&'a str>: Encode<'a, D::DB> + Type<D::DB>,
    Option<String>: Value<D::DB>,
    Option<Uuid>: Param<D::DB>,
    String: Value<D::DB>,
    i64: Value<D::DB>,
    i32: Value<D::DB>,
    f64: Value<D::DB>,
    bool: Value<D::DB>,
    Uuid: Value<D::DB>,
    Vec<u8>: Value<D::DB>,
    DateTime<Utc>: Value<D::DB>,
{
    async fn put_memory_vector(
        &self,
        tenant: &TenantId,
        id: MemoryId,
        model: &str,
        vector: &[f32],
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let dims = i32::try_from(vector.len()).map_err(corrupt)?;
        if dims == 0 || vector.iter().any(|x| !x.is_finite()) {
            return Err(corrupt("a vector must have finite components and at least one"));
        }
        self.timed("put_memory_vector", async {
            // Only for an item that exists: one that went meanwhile gets none.
            let done = sqlx::query(
                "INSERT INTO memory_embeddings \
                 (tenant_id, memory_id, model, dims, vector, embedded_at) \
                 SELECT tenant_id, id, $3, $4, $5, $6 FROM memories \
                 WHERE tenant_id = $1 AND id = $2 \
                 ON CONFLICT (tenant_id, model, memory_id) DO UPDATE SET dims = excluded.dims, \
                 vector = excluded.vector, embedded_at = excluded.embedded_at",
            )
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .bind(model)
            .bind(dims)
            .bind(to_bytes(vector))
            .bind(Ts(at))
            .execute(&self.pool)
            .await?;
            Ok(crate::dialect::RowsAffected::rows_affected(&done) > 0)
        })
        .await
    }

    async fn memory_vectors(
        &self,
        tenant: &TenantId,
        model: &str,
    ) -> Result<Vec<(MemoryId, Vec<f32>)>, StoreError> {
        self.timed("memory_vectors", async {
            let rows: Vec<(Uuid, i32, Vec<u8>)> = sqlx::query_as(
                "SELECT memory_id, dims, vector FROM memory_embeddings \
                 WHERE tenant_id = $1 AND model = $2",
            )
            .bind(tenant.as_str())
            .bind(model)
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|(id, dims, bytes)| Ok((MemoryId::from_uuid(id), from_bytes(&bytes, dims)?)))
                .collect()
        })
        .await
    }

    async fn memory_vectors_version(
        &self,
        tenant: &TenantId,
        model: &str,
    ) -> Result<VectorsVersion, StoreError> {
        self.timed("memory_vectors_version", async {
            let (count, latest): (i64, Option<String>) = sqlx::query_as(
                "SELECT count(*), CAST(max(embedded_at) AS TEXT) FROM memory_embeddings \
                 WHERE tenant_id = $1 AND model = $2",
            )
            .bind(tenant.as_str())
            .bind(model)
            .fetch_one(&self.pool)
            .await?;
            Ok(VectorsVersion { count, latest })
        })
        .await
    }

    async fn memories_without_vector(
        &self,
        model: &str,
        scope: &TenantScope,
        after: Option<&(TenantId, MemoryId)>,
        limit: u32,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        let only = scope.only.as_deref().map(tenants_json).transpose()?;
        let except = tenants_json(&scope.except)?;
        self.timed("memories_without_vector", async {
            let rows: Vec<MemoryRow> = sqlx::query_as(D::pick(&WITHOUT_VECTOR))
                .bind(model)
                .bind(only)
                .bind(except)
                .bind(after.map(|(tenant, _)| tenant.as_str()))
                .bind(after.map(|(_, id)| id.as_uuid()))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter().map(MemoryItem::try_from).collect()
        })
        .await
    }

    async fn memories_among(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
        filter: &MemoryQuery,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(
            &ids.iter().map(|id| id.as_uuid().simple().to_string()).collect::<Vec<_>>(),
        )
        .map_err(corrupt)?;
        self.timed("memories_among", async {
            let rows: Vec<MemoryRow> = sqlx::query_as(D::pick(&AMONG))
                .bind(tenant.as_str())
                .bind(ids)
                .bind(filter.min_confidence)
                .bind(filter.kind.map(MemoryKind::as_str))
                .bind(filter.include_flagged)
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter().map(MemoryItem::try_from).collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_as_little_endian_bytes() {
        let v = [1.0_f32, -0.5, 0.0, 3.25e-8];
        let bytes = to_bytes(&v);
        assert_eq!(bytes.len(), 16);
        assert_eq!(&bytes[..4], &1.0_f32.to_le_bytes());
        assert_eq!(from_bytes(&bytes, 4).unwrap(), v);
        assert!(from_bytes(&bytes, 3).is_err(), "a length that does not match is corrupt");
    }

    #[test]
    fn a_scope_serves_its_tenants_but_the_excepted() {
        let t = |s: &str| TenantId::parse(s).unwrap();
        assert!(TenantScope::every().contains(&t("acme")));
        let scope = TenantScope { only: None, except: vec![t("acme")] };
        assert!(!scope.contains(&t("acme")) && scope.contains(&t("globex")));
        let scope = TenantScope { only: Some(vec![t("acme")]), except: Vec::new() };
        assert!(scope.contains(&t("acme")) && !scope.contains(&t("globex")));
    }
}
