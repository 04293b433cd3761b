//! Gauges a running process sets from each status snapshot ([`crate::monitor`]): the half of
//! the metrics that reads a [`Status`]. The counters the apply path records are the engine's
//! (`projector_engine::metrics`); [`crate::describe_metrics`] describes both.

use metrics::gauge;
use projector_engine::versions::VersionState;

use crate::status::Status;

/// Gauges set from each [`Status`] snapshot of a running process ([`crate::monitor`]).
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
/// | `projector_inbox_partitions_ahead_seconds` | | from now to where the inbox's days made ahead stop, at the first day missing from today on (under a day: the engine fell behind making them) |
pub(crate) fn publish_status(status: &Status) {
    gauge!("projector_healthy").set(flag(status.healthy));
    gauge!("projector_up", "system" => "postgres").set(flag(status.postgres.reachable));
    gauge!("projector_up", "system" => "kafka").set(flag(status.kafka.reachable));
    for v in &status.views {
        if v.state == VersionState::Retired || v.dropped {
            continue;
        }
        let c = v.consumer.clone();
        gauge!("projector_view_healthy", "consumer" => c.clone(), "state" => v.state.as_str())
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

/// Help text for every gauge, for `# HELP` lines.
pub(crate) fn describe() {
    use metrics::{describe_gauge, Unit};
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
        "From now to where the inbox's days made ahead stop (the first day missing from today on)"
    );
}
