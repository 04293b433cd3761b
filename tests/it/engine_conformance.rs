//! The conformance suite over the engine's small test view, checked against the fold.

use std::sync::Arc;

use crate::support::{fills, trail_fold, Trail};
use projector_engine::testkit::conformance::{self, Factory};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trail_passes_the_conformance_suite_and_equals_the_fold() {
    let events = fills(4, 9);
    let factory: Factory = Arc::new(|v| Arc::new(Trail::new(v)));
    let report = conformance::run(factory, &events).await;
    assert_eq!(report.schedules.len(), conformance::SCHEDULES.len());
    assert_eq!(report.rows, vec![trail_fold(&events)]);
}
