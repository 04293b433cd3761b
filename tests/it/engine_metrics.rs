//! The counters a batch records through the `metrics` facade, read back with a debugging
//! recorder: `projector_duplicates_total` is a sensor, so it must count what happened.

use std::sync::Arc;

use crate::support::{fills, Trail};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use projector_engine::testkit::{Partition, TestDb};
use projector_engine::{Applier, Registry, SourceOrdering};

/// A counter's name, labels and value.
type Counter = (String, Vec<(String, String)>, u64);

fn counter(snapshot: &[Counter], name: &str, kind: Option<&str>) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && labels.iter().any(|(k, v)| k == "consumer" && v == CONSUMER)
                && kind.is_none_or(|kind| labels.iter().any(|(k, v)| k == "kind" && v == kind))
        })
        .map(|(_, _, v)| *v)
        .sum()
}

/// The recorder is global to the test binary, and other tests apply `trail_v1` batches at the
/// same time: a version of its own keeps their counts out of this test's.
const VERSION: i32 = 77;
const CONSUMER: &str = "trail_v77";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_records_what_it_did() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in the test binary");

    let registry = Registry::new()
        .register(Trail::new(VERSION))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let applier =
        Applier::new(Arc::new(Trail::new(VERSION)), SourceOrdering::PerAccount).expect("applier");
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
    assert_eq!(
        counter(&snapshot, "projector_events_waiting_total", None),
        0
    );
}
