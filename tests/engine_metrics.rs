//! The counters a batch records through the `metrics` facade, read back with a debugging
//! recorder: `projector_duplicates_total` is a sensor, so it must count what happened.

mod support;

use std::sync::Arc;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use projector_engine::testkit::{Partition, TestDb};
use projector_engine::{Applier, Registry, SourceOrdering};
use support::{fills, Trail};

/// A counter's name, labels and value.
type Counter = (String, Vec<(String, String)>, u64);

fn counter(snapshot: &[Counter], name: &str, kind: Option<&str>) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && labels
                    .iter()
                    .any(|(k, v)| k == "consumer" && v == "trail_v1")
                && kind.is_none_or(|kind| labels.iter().any(|(k, v)| k == "kind" && v == kind))
        })
        .map(|(_, _, v)| *v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_records_what_it_did() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this test binary");

    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier =
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier");
    let events = fills(3, 4);
    let mut log = Partition::from_events("fills", 0, &events);
    log.push_event(&events[0]); // a duplicate
    log.push_event(&events[5]); // another
    log.push_raw(Some(b"1".to_vec()), b"not json".to_vec()); // poison
    let mut client = db.client().await;
    applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("apply");

    let snapshot: Vec<Counter> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match (key.kind(), value) {
            (MetricKind::Counter, DebugValue::Counter(v)) => Some((
                key.key().name().to_owned(),
                key.key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                v,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        counter(&snapshot, "projector_events_applied_total", None),
        12
    );
    assert_eq!(
        counter(&snapshot, "projector_duplicates_total", Some("seq")),
        2
    );
    assert_eq!(counter(&snapshot, "projector_duplicates_total", None), 2);
    assert_eq!(
        counter(&snapshot, "projector_dead_letters_total", Some("poison")),
        1
    );
    assert_eq!(counter(&snapshot, "projector_events_parked_total", None), 0);
}
