//! The engine records redactions by rule into the meter it is given.

use foldgate_domain::{Message, Outcome};
use foldgate_engine::{CreateBranch, EngineMetrics, ReturnBranch};
use foldgate_testkit::{ServiceBuilder, TestDb, principal};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::{
    InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
    data::{AggregatedMetrics, MetricData},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redactions_are_counted_by_rule() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let db = TestDb::sqlite().await;
    let service = ServiceBuilder::new(db.connect().await)
        .metrics(EngineMetrics::new(&provider.meter("foldgate")))
        .build();
    let alice = principal("acme", "alice");
    let req =
        CreateBranch::parse(service.config(), "s", "audit", None, None, None, None, None).unwrap();
    let branch = service.create(&alice, req).await.unwrap().branch;

    // Synthetic values in the documented formats.
    let github = format!("ghp_{}", "Zq8vN2kLp4Rt6Wx9Yb1Cd3Ef5Gh7Jk0Mn2Pq");
    let aws = format!("AKIA{}", "QZ7XW2NV4RT6YB3M");
    let message = format!("tokens seen: {github} and {aws}, also {github} again");
    let returned = service
        .return_branch(
            &alice,
            ReturnBranch {
                branch_id: branch.id,
                message: Message::parse(&message).unwrap(),
                outcome: Outcome::Success,
                extract_memory: false,
            },
        )
        .await
        .unwrap();
    assert!(!returned.message.contains(&github) && !returned.message.contains(&aws));

    provider.force_flush().unwrap();
    let mut by_rule = std::collections::BTreeMap::new();
    for resource in exporter.get_finished_metrics().unwrap() {
        for scope in resource.scope_metrics() {
            for metric in scope.metrics().filter(|m| m.name() == "foldgate.secrets.redacted") {
                let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() else {
                    panic!("a u64 sum");
                };
                for point in sum.data_points() {
                    let rule = point
                        .attributes()
                        .find(|kv| kv.key.as_str() == "rule")
                        .map(|kv| kv.value.to_string())
                        .unwrap();
                    by_rule.insert(rule, point.value());
                }
            }
        }
    }
    assert_eq!(by_rule.values().sum::<u64>(), returned.redactions);
    assert!(by_rule.keys().any(|r| r.starts_with("github")), "{by_rule:?}");
    assert!(by_rule.keys().any(|r| r.starts_with("aws")), "{by_rule:?}");
    assert!(returned.redactions >= 2);
    db.cleanup().await;
}
