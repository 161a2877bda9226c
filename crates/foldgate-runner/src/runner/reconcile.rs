//! The runner's reconcilers, tasks of the background driver: one takes
//! over runs whose replica stopped renewing their lease, the other tells
//! the runs of this process whose branch was ended from outside to stop.

use std::sync::Arc;

use foldgate_background::{Activation, BackgroundTask, BoxFuture, Driver, StopOrder, TaskDef};
use serde_json::json;

use super::{BRANCH_CHECK, Runner};

/// Claims runs whose lease lapsed and works on each as a resumed run.
#[derive(Debug)]
struct TakeOver(Arc<Runner>);

impl TakeOver {
    async fn pass(&self) -> Activation {
        let runner = &self.0;
        let now = runner.service.clock().now();
        match runner
            .service
            .store()
            .claim_lapsed_runs(&runner.owner, now, runner.lease_end(), runner.config.batch_size)
            .await
        {
            Ok(claimed) => {
                let count = claimed.len();
                for (tenant, id) in claimed {
                    tracing::info!(%tenant, branch_id = %id, "taking over a run whose lease lapsed");
                    runner.spawn(tenant, id, true);
                }
                Activation::ok(json!({"taken_over": count}))
            }
            Err(e) => {
                tracing::warn!(error = %e, "looking for runs to take over failed");
                Activation::failed(e, json!({"taken_over": 0}))
            }
        }
    }
}

impl BackgroundTask for TakeOver {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.pass())
    }
}

/// Tells the runs of this process whose branch was ended from outside (a
/// session end, an ancestor's return, the supervisor, a cancelled task) to
/// stop: one query for all of them.
#[derive(Debug)]
struct WatchEnds(Arc<Runner>);

impl WatchEnds {
    async fn pass(&self) -> Activation {
        let runner = &self.0;
        let working = runner.locals().len();
        if working == 0 {
            return Activation::ok(json!({"runs": 0, "ended": 0}));
        }
        match runner.service.store().ended_runs(&runner.owner).await {
            Ok(ended) => {
                let map = runner.locals();
                let mut stopped = 0;
                for id in ended {
                    if let Some(local) = map.get(&id) {
                        local.ended.cancel();
                        stopped += 1;
                    }
                }
                Activation::ok(json!({"runs": working, "ended": stopped}))
            }
            Err(e) => {
                tracing::warn!(error = %e, "looking for runs whose branch ended failed");
                Activation::failed(e, json!({"runs": working}))
            }
        }
    }
}

impl BackgroundTask for WatchEnds {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.pass())
    }
}

impl Runner {
    /// Registers the reconcilers: `run_takeover` every
    /// `runner.poll_interval` (and at once), `run_ends` every
    /// [`BRANCH_CHECK`]. They stop before the runs give their leases up
    /// ([`Runner::stopped`]).
    pub fn register(self: &Arc<Self>, driver: &mut Driver) {
        let take_over =
            TaskDef::new("run_takeover", StopOrder::RUNS).period(self.config.poll_interval);
        driver.register(take_over, TakeOver(Arc::clone(self)));
        let ends = TaskDef::new("run_ends", StopOrder::RUNS).period(BRANCH_CHECK);
        driver.register(ends, WatchEnds(Arc::clone(self)));
    }

    /// Waits until every run of this process has stopped (after the
    /// shutdown token given to [`Runner::new`] was cancelled, each gives
    /// its lease up).
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}
