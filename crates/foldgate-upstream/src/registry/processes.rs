//! A stdio upstream's processes, looked after by a task of the background
//! driver: `upstream_processes:<name>` stops those left unused for the
//! upstream's `idle_timeout` (and forgets those that died).

use std::{sync::Arc, time::Duration};

use foldgate_background::{
    Activation, BackgroundTask, BoxFuture, Driver, OnStop, StopOrder, TaskDef,
};
use serde_json::json;

use super::Upstream;

/// Registers the task of a configured stdio upstream for the gateway's
/// whole life. It looks every quarter of `idle_timeout` (at least every
/// second, at most every minute); it is stopped with the tasks serving
/// requests, and the processes themselves at the end of the shutdown
/// ([`super::Upstreams::stop_processes`]).
pub(super) fn register(driver: &mut Driver, upstream: &Arc<Upstream>) {
    let period =
        (upstream.config.idle_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let def = TaskDef::new(format!("upstream_processes:{}", upstream.name()), StopOrder::SERVING)
        .period(period)
        .on_stop(OnStop::Abandon);
    driver.register(def, Reaper { upstream: Arc::clone(upstream) });
}

#[derive(Debug)]
struct Reaper {
    upstream: Arc<Upstream>,
}

impl BackgroundTask for Reaper {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            let running = self.upstream.reap_idle().await;
            Activation::ok(json!({"processes": running}))
        })
    }
}
