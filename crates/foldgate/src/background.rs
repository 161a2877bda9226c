//! The gateway's own background tasks, and the registration of every task
//! on the driver with its period, its triggers and its stop order.

use std::{sync::Arc, time::Duration};

use foldgate_background::{
    Activation, BackgroundTask, BoxFuture, Driver, OnStop, StopOrder, TaskDef,
};
use foldgate_engine::{
    FoldingService, MemoryBank, MemoryEmbedding, MemoryExtract, MemoryRetention, MemoryUses,
    StoreGauges, TENANT_SYNC_INTERVAL,
};
use serde_json::json;

/// How often the memory's retention runs.
const MEMORY_RETENTION_INTERVAL: Duration = Duration::from_secs(3600);

/// How often the lessons queued by returns are looked for (a return of this
/// replica that queues one wakes the task at once).
const MEMORY_EXTRACT_INTERVAL: Duration = Duration::from_secs(5);
/// How often the memory's items without a vector are looked for.
const MEMORY_EMBED_INTERVAL: Duration = Duration::from_secs(30);

/// How often usage outside branches is written to the database.
const USAGE_FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// Writes the upstream usage outside branches: every few seconds, and once
/// more at shutdown, after the listeners have drained.
#[derive(Debug)]
struct UsageFlusher(Arc<FoldingService>);

impl BackgroundTask for UsageFlusher {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.0.flush_outside_usage().await {
                Ok(()) => Activation::ok(json!({})),
                Err(e) => {
                    tracing::warn!(error = %e, "writing upstream usage outside branches failed; kept for the next try");
                    Activation::failed(e, json!({}))
                }
            }
        })
    }
}

/// Writes the daily usage this replica counted and reads every tenant's
/// overrides and spending (see `foldgate_engine::TenantRules`): every
/// second, and once more at shutdown.
#[derive(Debug)]
struct TenantSync(Arc<FoldingService>);

impl BackgroundTask for TenantSync {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.0.sync_tenants().await {
                Ok((written, tenants)) => Activation::ok(
                    json!({"usage_lines_written": written, "tenants_with_settings": tenants}),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "syncing tenant usage and settings failed; usage kept for the next try");
                    Activation::failed(e, json!({}))
                }
            }
        })
    }
}

/// Registers the usage flusher, the tenant sync and the store gauges.
pub(crate) fn register_store_tasks(
    driver: &mut Driver,
    service: &Arc<FoldingService>,
    gauges: StoreGauges,
    gauge_interval: Duration,
) {
    let flush = TaskDef::new("usage_flush", StopOrder::USAGE)
        .period(USAGE_FLUSH_INTERVAL)
        .on_stop(OnStop::LastPass);
    driver.register(flush, UsageFlusher(Arc::clone(service)));
    let sync = TaskDef::new("tenant_sync", StopOrder::USAGE)
        .period(TENANT_SYNC_INTERVAL)
        .on_stop(OnStop::LastPass);
    driver.register(sync, TenantSync(Arc::clone(service)));
    let gauge_def = TaskDef::new("store_gauges", StopOrder::GAUGES).period(gauge_interval);
    driver.register(gauge_def, gauges);
}

/// Registers the memory's tasks: retention (once at start, then hourly),
/// the use counts (every few seconds, and once more at shutdown), the
/// lessons queued by returns (every few seconds, and when a return queues
/// one) and, with an embeddings model, the backfill of vectors (at start,
/// then every 30 s).
pub(crate) fn register_memory_tasks(driver: &mut Driver, bank: &Arc<MemoryBank>) {
    let def =
        TaskDef::new("memory_retention", StopOrder::SUPERVISOR).period(MEMORY_RETENTION_INTERVAL);
    driver.register(def, MemoryRetention(Arc::clone(bank)));
    let def = TaskDef::new("memory_uses", StopOrder::USAGE)
        .period(USAGE_FLUSH_INTERVAL)
        .on_stop(OnStop::LastPass);
    driver.register(def, MemoryUses(Arc::clone(bank)));
    let def = TaskDef::new("memory_extract", StopOrder::SUPERVISOR)
        .period(MEMORY_EXTRACT_INTERVAL)
        .trigger(bank.extract_activator());
    driver.register(def, MemoryExtract(Arc::clone(bank)));
    if bank.embeds() {
        let def = TaskDef::new("memory_embed", StopOrder::SUPERVISOR).period(MEMORY_EMBED_INTERVAL);
        driver.register(def, MemoryEmbedding::new(Arc::clone(bank)));
    }
}
