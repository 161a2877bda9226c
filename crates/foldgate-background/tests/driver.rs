//! The driver activates tasks on their period, on their triggers and when
//! they ask; stops them in order; and records what they did.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use foldgate_background::{
    Activation, Activator, BackgroundTask, BoxFuture, Driver, Next, OnStop, Reason, State,
    StopOrder, TaskDef,
};
use opentelemetry::metrics::{MeterProvider, noop::NoopMeterProvider};
use opentelemetry_sdk::metrics::{
    InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
    data::{AggregatedMetrics, MetricData},
};
use serde_json::json;

/// What the tasks did, in order: (task, activation number).
type Log = Arc<Mutex<Vec<(&'static str, u64)>>>;

/// A task that logs each activation, optionally takes `work` to do it,
/// fails every other time if asked, and asks for `next`.
struct Probe {
    name: &'static str,
    log: Log,
    count: u64,
    work: Duration,
    fail: bool,
    next: Next,
}

impl Probe {
    fn new(name: &'static str, log: &Log) -> Self {
        Self {
            name,
            log: Arc::clone(log),
            count: 0,
            work: Duration::ZERO,
            fail: false,
            next: Next::Period,
        }
    }
}

impl BackgroundTask for Probe {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            if !self.work.is_zero() {
                tokio::time::sleep(self.work).await;
            }
            self.count += 1;
            self.log.lock().unwrap().push((self.name, self.count));
            let status = json!({"count": self.count});
            let activation = if self.fail && self.count.is_multiple_of(2) {
                Activation::failed("even", status)
            } else {
                Activation::ok(status)
            };
            activation.next(self.next)
        })
    }
}

fn driver() -> Driver {
    Driver::new(&NoopMeterProvider::new().meter("test"))
}

fn count(log: &Log, name: &str) -> usize {
    log.lock().unwrap().iter().filter(|(n, _)| *n == name).count()
}

#[tokio::test(start_paused = true)]
async fn tasks_run_at_start_then_on_their_period() {
    let log = Log::default();
    let mut driver = driver();
    let def = TaskDef::new("ticker", StopOrder(1)).period(Duration::from_secs(10));
    driver.register(def, Probe::new("ticker", &log));
    let running = driver.start();

    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(count(&log, "ticker"), 1, "activated at start");
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(count(&log, "ticker"), 3, "then every 10 s");
    let report = running.board().task("ticker").unwrap();
    assert_eq!(report.activations, 3);
    assert_eq!(report.last.unwrap().reason, Reason::Timer);
    running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_trigger_activates_a_task_at_once_and_a_task_may_ask_for_its_next_run() {
    let log = Log::default();
    let mut driver = driver();
    let poke = Activator::new();
    let def =
        TaskDef::new("woken", StopOrder(1)).period(Duration::from_secs(3600)).trigger(poke.clone());
    driver.register(def, Probe::new("woken", &log));
    let mut soon = Probe::new("soon", &log);
    soon.next = Next::After(Duration::from_secs(1));
    driver.register(TaskDef::new("soon", StopOrder(1)).period(Duration::from_secs(3600)), soon);
    let mut idle = Probe::new("idle", &log);
    idle.next = Next::Trigger;
    driver.register(TaskDef::new("idle", StopOrder(1)).period(Duration::from_secs(1)), idle);
    let running = driver.start();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(count(&log, "woken"), 1);

    poke.activate();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(count(&log, "woken"), 2, "the trigger activated it, long before its period");
    let report = running.board().task("woken").unwrap();
    assert_eq!(report.last.unwrap().reason, Reason::Trigger);
    assert_eq!(report.triggers, 1);

    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(count(&log, "soon"), 3, "every second, as it asked, not hourly");
    assert_eq!(count(&log, "idle"), 1, "waits for a trigger it does not have");
    running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_trigger_during_an_activation_runs_another_one_after_it() {
    let log = Log::default();
    let mut driver = driver();
    let poke = Activator::new();
    let mut slow = Probe::new("slow", &log);
    slow.work = Duration::from_secs(1);
    slow.next = Next::Trigger;
    driver.register(TaskDef::new("slow", StopOrder(1)).trigger(poke.clone()), slow);
    let running = driver.start();
    tokio::time::sleep(Duration::from_millis(500)).await;
    poke.activate();
    poke.activate();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(count(&log, "slow"), 2, "one more activation for both requests");
    running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_tasks_in_their_stop_order() {
    let log = Log::default();
    let mut driver = driver();
    // Registered out of order; each runs a last pass when it stops, which
    // shows when it stopped.
    for (name, order) in [("third", 30), ("first", 10), ("last", u8::MAX), ("second", 20)] {
        let def = TaskDef::new(name, StopOrder(order))
            .period(Duration::from_secs(3600))
            .on_stop(OnStop::LastPass);
        driver.register(def, Probe::new(name, &log));
    }
    let mut slow = Probe::new("finishing", &log);
    slow.work = Duration::from_secs(2);
    driver.register(TaskDef::new("finishing", StopOrder(15)), slow);
    let mut cut = Probe::new("abandoned", &log);
    cut.work = Duration::from_secs(2);
    driver.register(TaskDef::new("abandoned", StopOrder(15)).on_stop(OnStop::Abandon), cut);
    let mut running = driver.start();
    tokio::time::sleep(Duration::from_millis(1)).await;
    log.lock().unwrap().retain(|(_, n)| *n > 1);

    running.stop_through(StopOrder(15)).await;
    let board = running.board();
    assert_eq!(board.task("first").unwrap().state, State::Stopped);
    assert_eq!(board.task("second").unwrap().state, State::Waiting);
    assert!(!board.all_running());
    running.shutdown().await;

    let order: Vec<_> = log.lock().unwrap().clone();
    assert_eq!(
        order,
        [("first", 2), ("finishing", 1), ("second", 2), ("third", 2), ("last", 2)],
        "in stop order; the activation in progress finished, the abandoned one did not"
    );
    let last = board.task("third").unwrap().last.unwrap();
    assert_eq!(last.reason, Reason::Shutdown);
    assert_eq!(board.task("abandoned").unwrap().activations, 0);
}

#[tokio::test(start_paused = true)]
async fn the_board_shows_each_task_and_its_last_outcome() {
    let log = Log::default();
    let mut driver = driver();
    let mut flaky = Probe::new("flaky", &log);
    flaky.fail = true;
    driver.register(TaskDef::new("flaky", StopOrder(1)).period(Duration::from_secs(1)), flaky);
    let board = driver.board();
    assert_eq!(board.task("flaky").unwrap().state, State::Registered);
    assert!(!board.all_running(), "not started");
    let running = driver.start();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    assert!(board.all_running());
    let report = board.task("flaky").unwrap();
    assert_eq!(report.activations, 2);
    assert_eq!(report.period_ms, Some(1000));
    let last = report.last.unwrap();
    assert_eq!((last.outcome, last.error.as_deref()), ("error", Some("even")));
    assert_eq!(last.status, json!({"count": 2}));
    let shown = serde_json::to_value(board.tasks()).unwrap();
    assert_eq!(shown[0]["name"], "flaky");
    assert_eq!(shown[0]["last"]["outcome"], "error");
    assert_eq!(shown[0]["stop_order"], 1);
    running.shutdown().await;
    assert_eq!(board.task("flaky").unwrap().state, State::Stopped);
}

struct Panics;

impl BackgroundTask for Panics {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async { panic!("broken") })
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_that_panics_shows_as_stopped() {
    let mut driver = driver();
    driver.register(TaskDef::new("broken", StopOrder(1)), Panics);
    let running = driver.start();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(running.board().task("broken").unwrap().state, State::Stopped);
    assert!(!running.board().all_running());
    running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn activations_are_counted_and_timed_by_task_and_outcome() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let log = Log::default();
    let mut driver = Driver::new(&provider.meter("foldgate"));
    let mut flaky = Probe::new("flaky", &log);
    flaky.fail = true;
    driver.register(TaskDef::new("flaky", StopOrder(1)).period(Duration::from_secs(1)), flaky);
    let running = driver.start();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    running.shutdown().await;

    provider.force_flush().unwrap();
    let mut counts = std::collections::BTreeMap::new();
    let mut timed = 0;
    for resource in exporter.get_finished_metrics().unwrap() {
        for scope in resource.scope_metrics() {
            for metric in scope.metrics() {
                match (metric.name(), metric.data()) {
                    (
                        "foldgate.background.activations",
                        AggregatedMetrics::U64(MetricData::Sum(sum)),
                    ) => {
                        for point in sum.data_points() {
                            let attr = |key: &str| {
                                point
                                    .attributes()
                                    .find(|kv| kv.key.as_str() == key)
                                    .unwrap()
                                    .value
                                    .to_string()
                            };
                            counts.insert((attr("task"), attr("outcome")), point.value());
                        }
                    }
                    (
                        "foldgate.background.activation.duration",
                        AggregatedMetrics::F64(MetricData::Histogram(histogram)),
                    ) => timed += histogram.data_points().map(|p| p.count()).sum::<u64>(),
                    _ => {}
                }
            }
        }
    }
    let key = |outcome: &str| ("flaky".to_owned(), outcome.to_owned());
    assert_eq!(counts.get(&key("ok")), Some(&2), "{counts:?}");
    assert_eq!(counts.get(&key("error")), Some(&1), "{counts:?}");
    assert_eq!(timed, 3);
}

#[tokio::test(start_paused = true)]
async fn a_spawned_task_runs_until_its_handle_is_dropped() {
    let log = Log::default();
    let driver = driver();
    let spawner = driver.spawner();
    let every = |name| TaskDef::new(name, StopOrder(1)).period(Duration::from_secs(10));
    // Spawned before the start: it waits for it, as a registered task does.
    let early = spawner.spawn(every("early"), Probe::new("early", &log));
    let board = driver.board();
    assert_eq!(board.task("early").unwrap().state, State::Registered);
    let mut running = driver.start();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count(&log, "early"), 1);

    let late = spawner.spawn(every("late"), Probe::new("late", &log));
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!((count(&log, "early"), count(&log, "late")), (2, 2));
    assert_eq!(board.task("late").unwrap().state, State::Waiting);

    // Dropped: it stops and leaves the board; the other goes on.
    drop(late);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(count(&log, "late"), 2);
    assert_eq!(count(&log, "early"), 5);
    assert!(board.task("late").is_none());
    assert!(board.all_running());

    // Once its stage has stopped, a spawned task never runs.
    running.stop_through(StopOrder(1)).await;
    let after = spawner.spawn(every("after"), Probe::new("after", &log));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(count(&log, "after"), 0);
    assert!(board.task("after").is_none());
    drop((early, after));
    running.shutdown().await;
}
