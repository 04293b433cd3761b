//! The health rule, one for `projector status` and for the `/health` endpoint of
//! `projector run`, so that both say the same thing about the same state.
//!
//! **A live view version is unhealthy when one of its partitions has made no progress for
//! `stall_after` while input waits for it**: messages are waiting (`lag_messages > 0`), the
//! oldest of them is at least `stall_after` old (its Kafka timestamp), and the partition's
//! last commit (`projector.offsets.updated_at`; for a partition never committed, the time the
//! version became live) is at least `stall_after` old. The process is unhealthy, too, when
//! PostgreSQL or Kafka cannot be reached.
//!
//! Why these three conditions together:
//! - a slow but progressing view commits every few seconds, however far behind it is: it is
//!   healthy (its lag is a gauge and an alert of its own, not a page for a stuck consumer);
//! - an idle partition that just received a message has an old last commit but a young
//!   message: it is healthy until that message has waited `stall_after`;
//! - a stuck consumer (a wedged worker, a batch that fails again and again, a process that
//!   died) stops committing while its oldest waiting message ages: it pages.
//!
//! **A live version is unhealthy, too, when a running process should be consuming it and is
//! not** ([`crate::processes`]): its task failed and waits to start again, it is still
//! starting after `start_grace`, or every process that serves it skips it (its code is not
//! the code that registered the version) and none consumes it. A process that skips a version
//! another one consumes is a warning: a rolling upgrade looks like that for a while.
//!
//! A `building` version (a rebuild) never pages: its stall is a warning (`rebuild_stalled`),
//! and a paused rebuild is not even that. Open dead letters, parked accounts and a view
//! behind the log's retention are warnings: they need an engineer, but not at night.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// How long a partition may make no progress while input waits before it counts as stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthRule {
    /// The time without a commit (and the age of the oldest waiting message) that makes a
    /// partition stalled.
    pub stall_after: Duration,
    /// How long a process may take to start consuming a version (connect, prepare, join the
    /// group) before it counts as not consuming.
    pub start_grace: Duration,
}

impl Default for HealthRule {
    fn default() -> Self {
        Self {
            stall_after: Duration::from_secs(120),
            start_grace: Duration::from_secs(10),
        }
    }
}

impl HealthRule {
    /// Whether a partition is stalled: `lag_messages` wait, the oldest of them was produced
    /// `lag_seconds` ago (`None`: its time could not be read, counted as old), and the
    /// partition last made progress at `last_progress`.
    pub fn stalled(
        &self,
        now: DateTime<Utc>,
        lag_messages: i64,
        lag_seconds: Option<i64>,
        last_progress: DateTime<Utc>,
    ) -> bool {
        let stall = i64::try_from(self.stall_after.as_secs()).unwrap_or(i64::MAX);
        let stall_ms = i64::try_from(self.stall_after.as_millis()).unwrap_or(i64::MAX);
        let idle_ms = (now - last_progress).num_milliseconds();
        lag_messages > 0 && idle_ms >= stall_ms && lag_seconds.is_none_or(|s| s >= stall)
    }
}

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Makes the process unhealthy: someone must act now.
    Page,
    /// Shown, never makes the process unhealthy.
    Warn,
}

/// What is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// PostgreSQL cannot be reached.
    PostgresUnreachable,
    /// The Kafka brokers cannot be reached, or do not know the topic.
    KafkaUnreachable,
    /// The health check itself failed (a statement failed, or it did not finish in time),
    /// or the running process has no recent check.
    CheckFailed,
    /// A live version's partition makes no progress while input waits.
    Stalled,
    /// A running process should consume a live version and does not: its start failed and is
    /// retried, or it is still starting.
    NotConsuming,
    /// This process cannot write its heartbeat: other processes and `projector status`
    /// count it gone.
    Heartbeat,
    /// Two running processes share one name (`--instance-id`).
    SharedName,
    /// A process leaves a version alone: its code for it is not the code that registered it,
    /// or it has none. A page when no process consumes the version.
    Skipped,
    /// A building version's partition makes no progress while input waits (not paused).
    RebuildStalled,
    /// A version's stored offset lies below the log's start: retention deleted events it
    /// never applied.
    BehindRetention,
    /// Dead letters wait for an engineer.
    DeadLetters,
    /// Accounts are parked.
    ParkedAccounts,
    /// The inbox's days reach less than a day ahead: the engine stopped making them.
    InboxPartitionsBehind,
}

/// One problem, in one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// `page` or `warn`.
    pub severity: Severity,
    /// What kind of problem.
    pub kind: ProblemKind,
    /// The view version concerned, if any.
    pub consumer: Option<String>,
    /// The partition concerned, if any.
    pub partition: Option<i32>,
    /// What an operator reads.
    pub message: String,
}

impl Problem {
    /// A problem of the whole process.
    pub fn global(severity: Severity, kind: ProblemKind, message: String) -> Self {
        Self {
            severity,
            kind,
            consumer: None,
            partition: None,
            message,
        }
    }
}

/// Whether a list of problems makes the process unhealthy.
pub fn healthy(problems: &[Problem]) -> bool {
    problems.iter().all(|p| p.severity != Severity::Page)
}

/// `95` as `1m35s`: how status prints a duration.
pub fn human_seconds(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).expect("time")
    }

    #[test]
    fn a_stall_needs_waiting_input_an_old_message_and_no_commit() {
        let rule = HealthRule {
            stall_after: Duration::from_secs(120),
            ..HealthRule::default()
        };
        let now = at(1000);
        // Stuck: 50 messages wait, the oldest for 10 minutes, no commit for 10 minutes.
        assert!(rule.stalled(now, 50, Some(600), at(400)));
        // Slow but progressing: far behind, but it committed a second ago.
        assert!(!rule.stalled(now, 1_000_000, Some(3600), at(999)));
        // Idle, then one new message: the last commit is old, the message is not.
        assert!(!rule.stalled(now, 1, Some(0), at(0)));
        // Caught up: nothing waits, however old the last commit.
        assert!(!rule.stalled(now, 0, None, at(0)));
        // The message's time unknown: the commit age alone decides.
        assert!(rule.stalled(now, 3, None, at(880)));
        assert!(!rule.stalled(now, 3, None, at(881)));
    }

    #[test]
    fn durations_print_short() {
        assert_eq!(human_seconds(-3), "0s");
        assert_eq!(human_seconds(59), "59s");
        assert_eq!(human_seconds(95), "1m35s");
        assert_eq!(human_seconds(7260), "2h01m");
        assert_eq!(human_seconds(90_000), "1d01h");
    }
}
