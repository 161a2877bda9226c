//! Each upstream's tool list, kept fresh by a task of the background
//! driver: every `refresh_interval` while the upstream answers, sooner (with
//! backoff) while it does not, and shortly after a call to it failed.

use std::{sync::Arc, time::Duration};

use foldgate_background::{
    Activation, BackgroundTask, BoxFuture, Driver, Next, OnStop, Spawner, StopOrder, TaskDef,
    TaskHandle,
};
use serde_json::json;

use super::{FIRST_RETRY, Upstream};

/// Registers the refresher of a configured upstream,
/// `upstream_tools:<name>`, for the gateway's whole life.
pub(super) fn register(driver: &mut Driver, upstream: &Arc<Upstream>) {
    driver
        .register(def(upstream), Refresher { upstream: Arc::clone(upstream), retry: FIRST_RETRY });
}

/// Starts the refresher of a registered upstream; it stops when the handle
/// is dropped (the registration removed or changed).
pub(super) fn spawn(spawner: &Spawner, upstream: &Arc<Upstream>) -> TaskHandle {
    spawner.spawn(def(upstream), Refresher { upstream: Arc::clone(upstream), retry: FIRST_RETRY })
}

/// It stops with the tasks serving requests, dropping a listing in flight.
fn def(upstream: &Upstream) -> TaskDef {
    TaskDef::new(format!("upstream_tools:{}", upstream.name()), StopOrder::SERVING)
        .period(upstream.config.refresh_interval)
        .trigger(upstream.recheck.clone())
        .on_stop(OnStop::Abandon)
}

/// Keeps one upstream's tool list fresh.
#[derive(Debug)]
struct Refresher {
    upstream: Arc<Upstream>,
    /// The wait after the next failure; doubles up to `refresh_interval`.
    retry: Duration,
}

impl Refresher {
    async fn pass(&mut self) -> Activation {
        let upstream = &self.upstream;
        let recheck_at = upstream.read().recheck_at;
        if let Some(at) = recheck_at {
            let now = tokio::time::Instant::now();
            if at > now {
                // A call failed: check again soon, not at once.
                let status = json!({"up": upstream.is_up(), "recheck": true});
                return Activation::ok(status).next(Next::After(at - now));
            }
        }
        upstream.write().recheck_at = None;
        match upstream.refresh().await {
            Ok(count) => {
                if self.retry != FIRST_RETRY {
                    tracing::info!(upstream = %upstream.name(), tools = count, "upstream is back");
                }
                self.retry = FIRST_RETRY;
                Activation::ok(json!({"up": true, "tools": count}))
            }
            Err(why) => {
                {
                    let mut listing = upstream.write();
                    if listing.up || self.retry == FIRST_RETRY {
                        tracing::warn!(upstream = %upstream.name(), error = %why,
                            "upstream tool listing failed; its tools are hidden until it answers");
                    }
                    listing.up = false;
                    listing.last_error = Some(why.clone());
                }
                let wait = self.retry;
                self.retry = (self.retry * 2).min(upstream.config.refresh_interval);
                let retry_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                Activation::failed(why, json!({"up": false, "retry_in_ms": retry_ms}))
                    .next(Next::After(wait))
            }
        }
    }
}

impl BackgroundTask for Refresher {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.pass())
    }
}
