//! Counters and histograms through the `metrics` facade. The binary installs an exporter;
//! without one, recording costs next to nothing.
//!
//! `projector_duplicates_total` is a sensor, not noise: a jump means trouble upstream
//! (a producer retrying without idempotence, a rebalance storm, a republish).
//!
//! | metric | labels | counts |
//! | --- | --- | --- |
//! | `projector_events_applied_total` | consumer | events whose effect a batch wrote |
//! | `projector_events_ignored_total` | consumer | events of types the view does not read |
//! | `projector_duplicates_total` | consumer, kind (`seq`, `watermark`, `inbox`, `version_filter`) | duplicates dropped, by what caught them |
//! | `projector_dead_letters_total` | consumer, kind (`poison`, `apply_failed`, `conflict`) | messages dead-lettered |
//! | `projector_events_waiting_total` | consumer | events that began waiting for an earlier `seq` |
//! | `projector_events_drained_total` | consumer | waiting events that left the waiting table |
//! | `projector_notices_total` | consumer | notices the live version's statements emitted |
//! | `projector_events_outside_window_total` | consumer | events whose `occurred_at` lies outside the inbox's retained window (applied once all the same) |
//! | `projector_events_below_seen_total` | consumer | events an order-independent view applied at or below the highest `seq` it had applied for the account, unknown to its inbox: a copy stamped with another `occurred_at`, a copy past the window, or events published out of order (likely applied twice) |
//! | `projector_batch_seconds` | consumer | time from BEGIN to COMMIT of a batch |
//!
//! A running process also sets gauges from its periodic status snapshot: lag per partition
//! in messages and seconds, parked accounts, open dead letters. They are operations' and
//! live with them, in `projector_ops::gauges`: the apply path only counts.

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
    conflicts: Counter,
    waiting: Counter,
    drained: Counter,
    notices: Counter,
    outside_window: Counter,
    below_seen: Counter,
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
            conflicts: counter!("projector_dead_letters_total", "consumer" => c.clone(), "kind" => "conflict"),
            waiting: counter!("projector_events_waiting_total", "consumer" => c.clone()),
            drained: counter!("projector_events_drained_total", "consumer" => c.clone()),
            notices: counter!("projector_notices_total", "consumer" => c.clone()),
            outside_window: counter!("projector_events_outside_window_total", "consumer" => c.clone()),
            below_seen: counter!("projector_events_below_seen_total", "consumer" => c.clone()),
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
        self.conflicts.increment(counts.conflicts);
        self.waiting.increment(counts.waiting);
        self.drained.increment(counts.drained);
        self.notices.increment(counts.notices);
        self.outside_window.increment(counts.outside_window);
        self.below_seen.increment(counts.below_seen);
        self.batch_seconds.record(elapsed);
    }
}

/// Writes the help text of the engine's counters and histogram, for an exporter that shows
/// it (Prometheus's `# HELP`). `projector_ops::describe_metrics` calls it along with the
/// gauges' own.
pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        "projector_events_applied_total",
        "Events whose effect a batch wrote"
    );
    describe_counter!(
        "projector_events_ignored_total",
        "Events of types the view does not read"
    );
    describe_counter!(
        "projector_duplicates_total",
        "Duplicates dropped, by what caught them (a sensor: a jump means trouble upstream)"
    );
    describe_counter!(
        "projector_dead_letters_total",
        "Messages dead-lettered, by kind"
    );
    describe_counter!(
        "projector_events_waiting_total",
        "Events that began waiting for an earlier seq"
    );
    describe_counter!(
        "projector_events_drained_total",
        "Waiting events that left the waiting table"
    );
    describe_counter!(
        "projector_notices_total",
        "Notices the live version emitted"
    );
    describe_counter!(
        "projector_events_outside_window_total",
        "Events whose occurred_at lies outside the inbox's retained window (applied once all the same)"
    );
    describe_counter!(
        "projector_events_below_seen_total",
        "Events an order-independent view applied at or below the highest seq it had applied for the account, unknown to its inbox (likely applied twice)"
    );
    describe_histogram!(
        "projector_batch_seconds",
        Unit::Seconds,
        "Time from BEGIN to COMMIT of a batch"
    );
}
