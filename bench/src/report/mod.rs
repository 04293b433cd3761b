//! What a run measured, [`Figures`], and how `projector bench` prints them: the table for
//! people with the goals met or missed (`table`), one line of JSON for scripts (`json`).

mod json;
mod table;

use std::time::Duration;

/// The figures of one run, as [`run`](crate::run) returns them; [`Figures::table`] and [`Figures::json`]
/// are what `projector bench` prints.
#[derive(Debug, Default)]
pub struct Figures {
    pub(crate) events: u64,
    pub(crate) accounts: i64,
    pub(crate) partitions: i32,
    pub(crate) naive_events: u64,
    pub(crate) naive_eps: u64,
    pub(crate) engine_eps: u64,
    /// The engine's rounds without the read-your-writes notifier (`run --no-notify`).
    pub(crate) engine_no_notify_eps: u64,
    /// Write (handed to the producer) to readable (`projector.wait_applied` answered
    /// `applied`), at the latency phase's rate.
    pub(crate) ryw_waits: u64,
    pub(crate) ryw_p50: Duration,
    pub(crate) ryw_p99: Duration,
    pub(crate) engine_all_views_eps: u64,
    pub(crate) ceiling_eps: u64,
    pub(crate) catch_up_eps: u64,
    pub(crate) ceiling_all_views_eps: u64,
    pub(crate) engine_full_inbox_eps: u64,
    pub(crate) inbox_rows: u64,
    /// Rows the full inbox held when its phase ran (the filler and earlier phases' rows of
    /// every consumer).
    pub(crate) inbox_total: u64,
    pub(crate) inbox_fill: Duration,
    /// Events per second of the rebuild's tail, first batch to last commit.
    pub(crate) rebuild_eps: u64,
    /// The shortest whole rebuild command, log check and consumer group start included.
    pub(crate) rebuild_command: Duration,
    /// The rebuild's rate while the live version was fed, and the live events meanwhile.
    pub(crate) rebuild_loaded_eps: u64,
    pub(crate) rebuild_live_events: u64,
    pub(crate) rebuild_live_p50: Duration,
    pub(crate) rebuild_live_p99: Duration,
    pub(crate) rebuild_live_max: Duration,
    pub(crate) latency_events: u64,
    pub(crate) latency_rate: u64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
    pub(crate) server: String,
    /// The server settings that decide what a large inbox costs (see `docs/benchmarks.md`,
    /// "A full inbox").
    pub(crate) settings: String,
    /// Full-page images PostgreSQL wrote during the best engine round and during the
    /// full-inbox phase (`pg_stat_wal`, the whole server's; `None` before PostgreSQL 14).
    pub(crate) engine_wal_fpi: Option<u64>,
    pub(crate) full_inbox_wal_fpi: Option<u64>,
    /// The prune of the full inbox's oldest day while a paced feed ran: how long it took,
    /// the day's rows, and the latencies of the events published meanwhile.
    pub(crate) prune: Duration,
    pub(crate) prune_rows: u64,
    pub(crate) prune_live_events: u64,
    pub(crate) prune_live_p50: Duration,
    pub(crate) prune_live_p99: Duration,
    pub(crate) prune_live_max: Duration,
    /// Every round's figure: engine, ceiling, catch-up, rebuild.
    pub(crate) samples: Vec<Vec<u64>>,
}

impl Figures {
    /// The table for people: every phase's events per second and ratios, the latency, the
    /// goals met or missed.
    pub fn table(&self) -> String {
        table::table(self)
    }

    /// One line of JSON for scripts. Its keys are a contract: `docs/benchmarks.md` and the
    /// smoke test read them.
    pub fn json(&self) -> String {
        json::json(self)
    }
}
