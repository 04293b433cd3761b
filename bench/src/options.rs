//! [`Options`]: what to run, `projector bench`'s flags.

use crate::error::{stop, BenchError};

/// What to run: `projector bench`'s flags, whose defaults are in its `--help`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// Events in the stream (each throughput phase applies all of them), at least 1.
    pub events: u64,
    /// Accounts the events are spread over, at least 1.
    pub accounts: i64,
    /// Partitions of each topic, 1 to 64.
    pub partitions: i32,
    /// Seconds the naive consumer runs; it stops earlier if it reaches the end of the topic.
    pub naive_seconds: u64,
    /// Events per second of the latency phase, at least 1.
    pub latency_rate: u64,
    /// Seconds the latency phase publishes for, at least 1.
    pub latency_seconds: u64,
    /// Rounds of the engine, ceiling and catch-up phases, 1 to 9; each figure is the best
    /// round.
    pub repeat: u8,
    /// Keep the scratch database afterwards (it is named on standard error).
    pub keep_db: bool,
    /// Rows in the inbox of the full-inbox phase's version before it runs; 0 skips the phase.
    pub inbox_rows: u64,
    /// The rebuild phases' `--max-connections` (`projector rebuild`'s default unless set).
    pub rebuild_connections: usize,
    /// The rebuild phases' `--batch-messages` (`projector rebuild`'s default unless set).
    pub rebuild_batch_messages: usize,
}

impl Options {
    /// The options of `projector bench` without flags.
    pub fn new() -> Self {
        Self {
            events: 200_000,
            accounts: 1000,
            partitions: 4,
            naive_seconds: 10,
            latency_rate: 2000,
            latency_seconds: 10,
            repeat: 2,
            keep_db: false,
            inbox_rows: 20_000_000,
            rebuild_connections: projector_rebuild::Options::new("").connections,
            rebuild_batch_messages: projector_rebuild::Options::new("").batch_messages,
        }
    }

    /// Refuses values the phases cannot run with, before anything is created.
    pub(crate) fn check(&self) -> Result<(), BenchError> {
        let ranges = [
            ("events", self.events >= 1),
            ("accounts", self.accounts >= 1),
            ("partitions", (1..=64).contains(&self.partitions)),
            ("naive_seconds", self.naive_seconds >= 1),
            ("latency_rate", self.latency_rate >= 1),
            ("latency_seconds", self.latency_seconds >= 1),
            ("repeat", (1..=9).contains(&self.repeat)),
            ("inbox_rows", self.inbox_rows <= 1_000_000_000),
            (
                "rebuild_connections",
                (1..=64).contains(&self.rebuild_connections),
            ),
            (
                "rebuild_batch_messages",
                (1..=1_000_000).contains(&self.rebuild_batch_messages),
            ),
        ];
        for (name, ok) in ranges {
            if !ok {
                stop!("the bench option {name} is out of range");
            }
        }
        Ok(())
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}
