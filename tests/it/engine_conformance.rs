//! The conformance suite over the engine's small test views, checked against their folds:
//! `Trail` (order-dependent) and `Tally` (order-independent).

use std::sync::Arc;

use crate::support::{fills, tally_fold, trail_fold, Tally, Trail};
use projector_engine::testkit::conformance::{self, Factory};
use projector_engine::testkit::EventSpec;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trail_passes_the_conformance_suite_and_equals_the_fold() {
    let events = fills(4, 9);
    let factory: Factory = Arc::new(|v| Arc::new(Trail::new(v)));
    let report = conformance::run(factory, &events).await;
    assert_eq!(report.schedules.len(), conformance::SCHEDULES.len());
    assert_eq!(report.rows, vec![trail_fold(&events)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tally_passes_the_conformance_suite_and_equals_the_fold() {
    // Fills, memos (any JSON object as data) and a type Tally ignores, for three accounts.
    let mut events = fills(3, 6);
    for e in events.iter_mut().filter(|e| e.seq % 3 == 0) {
        *e = EventSpec::new(
            "memo",
            e.account_id,
            e.seq,
            &e.occurred_at,
            serde_json::json!({"text": "ü", "n": [1.5e-300, null, {"deep": [true]}]}),
        );
    }
    for e in events.iter_mut().filter(|e| e.seq == 5) {
        *e = EventSpec::new(
            "margin_call",
            e.account_id,
            e.seq,
            &e.occurred_at,
            serde_json::json!({}),
        );
    }
    let factory: Factory = Arc::new(|v| Arc::new(Tally::new(v)));
    let report = conformance::run(factory, &events).await;
    assert_eq!(report.rows, vec![tally_fold(&events)]);
    // Three margin calls: the reference schedule ignores each once.
    assert_eq!(report.schedules[0].counts.ignored, 3);
}
