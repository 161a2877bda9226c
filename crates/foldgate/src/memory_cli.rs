//! `foldgate memory`: a tenant's lessons listed or deleted from the
//! database, for operators (a review, a data-deletion request).

use anyhow::Context;
use clap::Subcommand;
use foldgate_domain::{MemoryId, TenantId};
use foldgate_store::{ConnectOptions, redact_url};
use serde_json::json;

/// What `foldgate memory` does.
#[derive(Debug, Subcommand)]
pub(crate) enum MemoryCommand {
    /// Print a tenant's lessons, newest first, one JSON object per line.
    List {
        #[arg(long)]
        tenant: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// The page after this lesson (the last id of the previous page).
        #[arg(long)]
        before: Option<String>,
        /// The database: postgres://… or sqlite://PATH.
        #[arg(long, env = "DATABASE_URL", default_value = "sqlite://foldgate.db")]
        database_url: String,
    },
    /// Delete one lesson of a tenant (`--id`), or all of them (`--all`).
    Delete {
        #[arg(long)]
        tenant: String,
        #[arg(long, conflicts_with = "all", required_unless_present = "all")]
        id: Option<String>,
        #[arg(long)]
        all: bool,
        /// The database: postgres://… or sqlite://PATH.
        #[arg(long, env = "DATABASE_URL", default_value = "sqlite://foldgate.db")]
        database_url: String,
    },
}

impl MemoryCommand {
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        let url = match &self {
            Self::List { database_url, .. } | Self::Delete { database_url, .. } => database_url,
        };
        let shown = redact_url(url);
        let store = foldgate_store::connect(&ConnectOptions::new(url.clone()), false)
            .await
            .with_context(|| format!("connecting to {shown}"))?;
        match self {
            Self::List { tenant, limit, before, .. } => {
                let tenant = TenantId::parse(&tenant)?;
                let before = before.as_deref().map(MemoryId::parse).transpose()?;
                for item in store.list_memories(&tenant, before, limit).await? {
                    let p = &item.provenance;
                    let line = json!({
                        "id": item.id.to_string(),
                        "kind": item.kind.as_str(),
                        "source": p.source.as_str(),
                        "subject": p.subject.as_str(),
                        "session_id": p.session.as_ref().map(|s| s.as_str()),
                        "branch_id": p.branch.map(|b| b.to_string()),
                        "confidence": item.confidence.get(),
                        "flagged": item.flagged,
                        "uses": item.uses,
                        "created_at": item.created_at,
                        "title": item.title,
                        "description": item.description,
                        "content": item.content,
                    });
                    println!("{line}");
                }
            }
            Self::Delete { tenant, id, .. } => {
                let tenant = TenantId::parse(&tenant)?;
                let deleted = match id {
                    Some(id) => {
                        u64::from(store.delete_memory(&tenant, MemoryId::parse(&id)?).await?)
                    }
                    None => store.delete_memories(&tenant).await?,
                };
                println!("deleted {deleted} lessons of tenant {tenant}");
            }
        }
        store.close().await;
        Ok(())
    }
}
