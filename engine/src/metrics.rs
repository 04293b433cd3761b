//! Counters and histograms through the `metrics` facade. The binary installs an exporter;
//! without one, recording costs next to nothing.
//!
//! `projector_duplicates_total` is a sensor, not noise: a jump means trouble upstream
//! (a producer retrying without idempotence, a rebalance storm, a republish).

use std::time::Duration;

use metrics::{counter, histogram, Counter, Histogram};

use crate::apply::Counts;

/// Handles registered once per view version, so the hot path does not build labels.
#[derive(Clone)]
pub(crate) struct ViewMetrics {
    applied: Counter,
    ignored: Counter,
    dup_seq: Counter,
    dup_watermark: Counter,
    dup_inbox: Counter,
    dup_version_filter: Counter,
    poison: Counter,
    failed: Counter,
    parked: Counter,
    drained: Counter,
    batch_seconds: Histogram,
}

impl ViewMetrics {
    pub(crate) fn new(consumer: &str) -> Self {
        let c = consumer.to_owned();
        let dup = |kind: &'static str| counter!("projector_duplicates_total", "consumer" => c.clone(), "kind" => kind);
        Self {
            applied: counter!("projector_events_applied_total", "consumer" => c.clone()),
            ignored: counter!("projector_events_ignored_total", "consumer" => c.clone()),
            dup_seq: dup("seq"),
            dup_watermark: dup("watermark"),
            dup_inbox: dup("inbox"),
            dup_version_filter: dup("version_filter"),
            poison: counter!("projector_dead_letters_total", "consumer" => c.clone(), "kind" => "poison"),
            failed: counter!("projector_dead_letters_total", "consumer" => c.clone(), "kind" => "apply_failed"),
            parked: counter!("projector_events_parked_total", "consumer" => c.clone()),
            drained: counter!("projector_events_unparked_total", "consumer" => c.clone()),
            batch_seconds: histogram!("projector_batch_seconds", "consumer" => c),
        }
    }

    pub(crate) fn record(&self, counts: &Counts, elapsed: Duration) {
        self.applied.increment(counts.applied);
        self.ignored.increment(counts.ignored);
        self.dup_seq.increment(counts.dup_seq);
        self.dup_watermark.increment(counts.dup_watermark);
        self.dup_inbox.increment(counts.dup_inbox);
        self.dup_version_filter.increment(counts.dup_version_filter);
        self.poison.increment(counts.poison);
        self.failed.increment(counts.failed);
        self.parked.increment(counts.parked);
        self.drained.increment(counts.drained);
        self.batch_seconds.record(elapsed);
    }
}
