//! Upstream MCP servers and model providers registered through the admin
//! API rather than the configuration file: kept here, read by every replica
//! every few seconds, so that one added or removed applies everywhere
//! without a restart.
//!
//! A registration holds its declaration as JSON, with the fields of an
//! `[[upstreams]]` or `[[models]]` entry; what they mean, and the check that
//! credentials are only ever references to environment variables, belong to
//! the layers that build clients from them.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use foldgate_domain::{Principal, Subject, TenantId};
use sqlx::{ColumnIndex, Database, Encode, Executor, Type};
use uuid::Uuid;

use crate::{
    StoreError,
    admin::{AuditEntry, insert_audit},
    dialect::{Dialect, Param, RowsAffected as _, Value},
    store::SqlStore,
    ts::Ts,
};

/// What a registration declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegistrationKind {
    /// An upstream MCP server (`[[upstreams]]`).
    Upstream,
    /// A model provider (`[[models]]`).
    Model,
}

impl RegistrationKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Upstream => "upstream",
            Self::Model => "model",
        }
    }

    fn parse(text: &str) -> Result<Self, StoreError> {
        match text {
            "upstream" => Ok(Self::Upstream),
            "model" => Ok(Self::Model),
            other => Err(StoreError::Corrupt(format!("registration kind {other:?}"))),
        }
    }
}

/// One registration.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub kind: RegistrationKind,
    pub name: String,
    /// The declaration: the fields of an `[[upstreams]]` or `[[models]]`
    /// entry, as a JSON object.
    pub spec: serde_json::Value,
    pub created_at: DateTime<Utc>,
    /// Who registered it: the token's tenant and subject.
    pub created_by: Principal,
}

#[derive(Debug, sqlx::FromRow)]
struct RegistrationRow {
    kind: String,
    name: String,
    spec: String,
    created_at: DateTime<Utc>,
    created_by_tenant: String,
    created_by_sub: String,
}

impl TryFrom<RegistrationRow> for Registration {
    type Error = StoreError;

    fn try_from(row: RegistrationRow) -> Result<Self, StoreError> {
        let corrupt = |e: String| StoreError::Corrupt(format!("registration {}: {e}", row.name));
        Ok(Self {
            kind: RegistrationKind::parse(&row.kind)?,
            spec: serde_json::from_str(&row.spec).map_err(|e| corrupt(e.to_string()))?,
            created_at: row.created_at,
            created_by: Principal {
                tenant: TenantId::parse(&row.created_by_tenant)
                    .map_err(|e| corrupt(e.to_string()))?,
                subject: Subject::parse(&row.created_by_sub).map_err(|e| corrupt(e.to_string()))?,
            },
            name: row.name,
        })
    }
}

/// The registrations, and their changes with the audit entry that records
/// each.
#[async_trait]
pub trait Registrations {
    /// Every registration, by kind and name.
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError>;

    /// Adds a registration and writes `audit`, in one transaction. `false`
    /// (and nothing written) when its kind already has one of that name.
    async fn add_registration(
        &self,
        registration: &Registration,
        audit: &AuditEntry,
    ) -> Result<bool, StoreError>;

    /// Removes a registration and writes `audit`, in one transaction.
    /// `false` (and nothing written) when there is none of that name.
    async fn remove_registration(
        &self,
        kind: RegistrationKind,
        name: &str,
        audit: &AuditEntry,
    ) -> Result<bool, StoreError>;
}

#[async_trait]
impl<D: Dialect> Registrations for SqlStore<D>
where
    for<'c> &'c mut <D::DB as Database>::Connection: Executor<'c, Database = D::DB>,
    for<'a> &'a str: Encode<'a, D::DB> + Type<D::DB> + ColumnIndex<<D::DB as Database>::Row>,
    for<'a> Option<&'a str>: Encode<'a, D::DB> + Type<D::DB>,
    Ts: Param<D::DB>,
    Uuid: Param<D::DB>,
    String: Value<D::DB>,
    DateTime<Utc>: Value<D::DB>,
{
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        self.timed("registrations", async {
            let rows: Vec<RegistrationRow> = sqlx::query_as(
                "SELECT kind, name, spec, created_at, created_by_tenant, created_by_sub \
                 FROM registrations ORDER BY kind, name",
            )
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter().map(Registration::try_from).collect()
        })
        .await
    }

    async fn add_registration(
        &self,
        registration: &Registration,
        audit: &AuditEntry,
    ) -> Result<bool, StoreError> {
        let spec = registration.spec.to_string();
        self.timed("add_registration", async {
            // As the dialect begins a writing transaction (SQLite: IMMEDIATE).
            let mut tx = D::begin(&self.pool).await?;
            let added = sqlx::query(
                "INSERT INTO registrations (kind, name, spec, created_at, created_by_tenant, \
                 created_by_sub) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (kind, name) DO NOTHING",
            )
            .bind(registration.kind.as_str())
            .bind(registration.name.as_str())
            .bind(spec.as_str())
            .bind(Ts(registration.created_at))
            .bind(registration.created_by.tenant.as_str())
            .bind(registration.created_by.subject.as_str())
            .execute(&mut *tx)
            .await?;
            if added.rows_affected() == 0 {
                return Ok(false);
            }
            insert_audit(audit).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn remove_registration(
        &self,
        kind: RegistrationKind,
        name: &str,
        audit: &AuditEntry,
    ) -> Result<bool, StoreError> {
        self.timed("remove_registration", async {
            let mut tx = D::begin(&self.pool).await?;
            let removed = sqlx::query("DELETE FROM registrations WHERE kind = $1 AND name = $2")
                .bind(kind.as_str())
                .bind(name)
                .execute(&mut *tx)
                .await?;
            if removed.rows_affected() == 0 {
                return Ok(false);
            }
            insert_audit(audit).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }
}
