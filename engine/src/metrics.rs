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
//! in messages and seconds, parked accounts, open dead letters (see [`publish_status`]).

use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Histogram};

use crate::apply::Counts;
use crate::ops::Status;

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

/// Gauges set from each [`Status`] snapshot of a running process (`ops::monitor`).
///
/// | metric | labels | holds |
/// | --- | --- | --- |
/// | `projector_healthy` | | 1 when the health rule finds nothing that pages, else 0 |
/// | `projector_up` | system (`postgres`, `kafka`) | 1 when it answered the last check |
/// | `projector_view_healthy` | consumer, state | 1 unless one of the version's partitions is stalled |
/// | `projector_lag_messages` | consumer, partition | high watermark minus the stored `next_offset` |
/// | `projector_lag_seconds` | consumer, partition | age of the oldest message not consumed yet (0 when caught up) |
/// | `projector_partition_stalled` | consumer, partition | 1 when the health rule finds it stalled |
/// | `projector_parked_accounts` | consumer, reason (`gap`, `dead_letter`) | parked accounts |
/// | `projector_dead_letters_open` | consumer, kind | dead letters not resolved yet |
/// | `projector_waiting_events` | consumer | events waiting for an earlier `seq` |
/// | `projector_inbox_rows_estimate` | | PostgreSQL's estimate of the inbox's rows |
/// | `projector_inbox_oldest_seconds` | | age of the oldest inbox row (or of the oldest day's start) |
/// | `projector_inbox_partitions_ahead_seconds` | | from now to the end of the newest day of the inbox (under a day: the engine fell behind making them) |
pub(crate) fn publish_status(status: &Status) {
    gauge!("projector_healthy").set(flag(status.healthy));
    gauge!("projector_up", "system" => "postgres").set(flag(status.postgres.reachable));
    gauge!("projector_up", "system" => "kafka").set(flag(status.kafka.reachable));
    for v in &status.views {
        if v.state == "retired" || v.dropped {
            continue;
        }
        let c = v.consumer.clone();
        gauge!("projector_view_healthy", "consumer" => c.clone(), "state" => v.state.clone())
            .set(flag(v.healthy));
        for p in &v.partitions {
            let partition = p.partition.to_string();
            if let Some(lag) = p.lag_messages {
                gauge!("projector_lag_messages", "consumer" => c.clone(), "partition" => partition.clone())
                    .set(lag as f64);
            }
            if let Some(seconds) = p.lag_seconds {
                gauge!("projector_lag_seconds", "consumer" => c.clone(), "partition" => partition.clone())
                    .set(seconds as f64);
            }
            gauge!("projector_partition_stalled", "consumer" => c.clone(), "partition" => partition)
                .set(flag(p.stalled));
        }
        for (reason, n) in &v.parked.by_reason {
            gauge!("projector_parked_accounts", "consumer" => c.clone(), "reason" => reason.clone())
                .set(*n as f64);
        }
        for (kind, n) in &v.dead_letters.open_by_kind {
            gauge!("projector_dead_letters_open", "consumer" => c.clone(), "kind" => kind.clone())
                .set(*n as f64);
        }
        gauge!("projector_waiting_events", "consumer" => c).set(v.waiting_events as f64);
    }
    if let Some(inbox) = &status.inbox {
        if let Some(rows) = inbox.rows_estimate {
            gauge!("projector_inbox_rows_estimate").set(rows as f64);
        }
        gauge!("projector_inbox_oldest_seconds").set(inbox.oldest_age_seconds.unwrap_or(0) as f64);
        gauge!("projector_inbox_partitions_ahead_seconds")
            .set(inbox.partitions_ahead_seconds.unwrap_or(0) as f64);
    }
}

/// When no snapshot could be taken: unhealthy, PostgreSQL not answering.
pub(crate) fn publish_unhealthy() {
    gauge!("projector_healthy").set(0.0);
    gauge!("projector_up", "system" => "postgres").set(0.0);
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Help text for every metric, for `# HELP` lines.
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
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
    describe_gauge!("projector_healthy", "1 when nothing pages, else 0");
    describe_gauge!("projector_up", "1 when the system answered the last check");
    describe_gauge!(
        "projector_view_healthy",
        "1 unless a partition of the version is stalled"
    );
    describe_gauge!(
        "projector_lag_messages",
        "Messages not consumed yet: high watermark minus the stored next offset"
    );
    describe_gauge!(
        "projector_lag_seconds",
        Unit::Seconds,
        "Age of the oldest message not consumed yet"
    );
    describe_gauge!(
        "projector_partition_stalled",
        "1 when the partition makes no progress while input waits"
    );
    describe_gauge!("projector_parked_accounts", "Parked accounts, by reason");
    describe_gauge!(
        "projector_dead_letters_open",
        "Dead letters not resolved yet, by kind"
    );
    describe_gauge!(
        "projector_waiting_events",
        "Events waiting for an earlier seq"
    );
    describe_gauge!(
        "projector_inbox_rows_estimate",
        "Estimated rows in the inbox"
    );
    describe_gauge!(
        "projector_inbox_oldest_seconds",
        Unit::Seconds,
        "Age of the oldest inbox row"
    );
    describe_gauge!(
        "projector_inbox_partitions_ahead_seconds",
        Unit::Seconds,
        "From now to the end of the newest day of the inbox"
    );
}
