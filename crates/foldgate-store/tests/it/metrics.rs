//! The store measured: `foldgate.db.operation.duration` per call.

use std::collections::BTreeMap;

use foldgate_domain::{SessionId, TenantId};
use foldgate_testkit::TestDb;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::{
    InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
    data::{AggregatedMetrics, MetricData},
};

#[tokio::test]
async fn every_call_is_timed_by_operation() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let db = TestDb::new(foldgate_testkit::Backend::Sqlite).await;
    let options = foldgate_store::ConnectOptions::new(db.url.clone());
    let meter = provider.meter("foldgate");
    let store = foldgate_store::connect_with_meter(&options, true, &meter).await.unwrap();
    let tenant = TenantId::parse("acme").unwrap();
    let session = SessionId::parse("s").unwrap();

    store.ready().await.unwrap();
    assert!(store.session(&tenant, &session).await.unwrap().is_none());
    assert!(store.session(&tenant, &session).await.unwrap().is_none());
    assert_eq!(store.active_branches().await.unwrap(), vec![]);
    assert_eq!(store.pool_usage().max, options.max_connections);
    store.close().await;
    // A closed pool fails every call: recorded with its error type.
    assert!(store.ready().await.is_err());
    provider.force_flush().unwrap();

    let mut counts: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
    for resource in exporter.get_finished_metrics().unwrap() {
        for scope in resource.scope_metrics() {
            for metric in scope.metrics() {
                assert_eq!(metric.name(), "foldgate.db.operation.duration");
                let AggregatedMetrics::F64(MetricData::Histogram(h)) = metric.data() else {
                    panic!("a histogram");
                };
                for point in h.data_points() {
                    let attr = |key: &str| {
                        point
                            .attributes()
                            .find(|kv| kv.key.as_str() == key)
                            .map(|kv| kv.value.to_string())
                    };
                    assert_eq!(attr("db.system.name").as_deref(), Some("sqlite"));
                    let key = (attr("db.operation.name").unwrap(), attr("error.type"));
                    *counts.entry(key).or_default() = point.count();
                }
            }
        }
    }
    let expected: BTreeMap<(String, Option<String>), u64> = [
        (("ready".to_owned(), None), 1),
        (("ready".to_owned(), Some("pool_closed".to_owned())), 1),
        (("session".to_owned(), None), 2),
        (("active_branches".to_owned(), None), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(counts, expected);
    db.cleanup().await;
}
