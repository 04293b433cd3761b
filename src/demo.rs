//! `projector demo`: the whole story in one command, with no Kafka and no configuration.
//!
//! A write side (`projector_devkit::writeside`, the pieces of `projector simulate`) takes
//! orders from clients that retry on purpose and publishes through an outbox relay that
//! "crashes" between publish and mark, so events arrive more than once at new offsets. Beside
//! it, prices arrive at most once: a quote feed over UDP on loopback loses, repeats and
//! reorders ticks, and the quote gate refuses orders on stale or suspect quotes. The
//! dev broker (librdkafka's mock cluster) runs in this process. Two `projector run`
//! processes consume the topic into every view: B joins midway (the group rebalances), A is
//! killed with SIGKILL (B takes its partitions over). Meanwhile `portfolio` is rebuilt into
//! a new version from the write side's snapshot and cut over while live. At the end every
//! view is reconciled row by row with the write side (`projector_devkit::reconcile`).
//!
//! PostgreSQL: `DATABASE_URL`, else a server on 127.0.0.1:5432, else a throwaway cluster
//! ([`server`]). The story's steps, one function each, are in [`story`]; what they run in
//! PostgreSQL is in `projector_devkit::demo`. Progress goes to standard error ([`display`]);
//! the report to standard output. Exits 1 when a view differs from the write side.

mod display;
mod engines;
mod server;
mod story;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use projector_devkit::reconcile::ViewReconciliation;
use projector_devkit::writeside::ledger::decimal;
use projector_devkit::writeside::quotes::{FeedConfig, QuotesReport};
use projector_devkit::writeside::{LoadConfig, Order, Report as WriteReport, Side, WriteSide};
use projector_engine::versions::VersionState;
use projector_engine::{Applied, Registry};
use projector_rebuild::{Outcome, Progress, Status};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use display::{seconds, Display};
use engines::Engine;
use server::Server;

/// The demo's topic on the dev broker.
const TOPIC: &str = "trades";
/// How often the figures are read.
const TICK: Duration = Duration::from_millis(500);
/// After the clients stop: how long the relay, the rebuild and the engines may take to
/// finish what is left before the demo gives up.
const FINISH_WITHIN: Duration = Duration::from_secs(180);
/// The rebuilt view.
const REBUILT: &str = "portfolio";
/// Percent of the relay's batches after which it "crashes" between publish and mark.
const RELAY_CRASH_PERCENT: u8 = 5;
/// How often the reading client places an order and reads it back.
const READER_EVERY: Duration = Duration::from_millis(200);
/// The longest the reading client waits to see its write.
const READ_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How long the clients send requests, e.g. `60s`; the demo takes about 15 s more.
    #[arg(long, default_value = "60s", value_parser = parse_load_duration)]
    duration: Duration,
    /// Accounts 1 to N.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    accounts: i64,
    /// Requests per second over all clients (retries not counted).
    #[arg(long, default_value_t = 150, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: u32,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(2..=64))]
    partitions: i32,
    /// The database the demo makes on the server (and makes afresh on the next run).
    #[arg(long, default_value = "projector_demo", value_parser = server::parse_database)]
    database: String,
    /// Seed of the clients' and the relay's dice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_load_duration(s: &str) -> Result<Duration, String> {
    let d = crate::config::parse_duration(s)?;
    if d < Duration::from_secs(5) {
        return Err(format!(
            "the demo needs at least 5s of load to show its story, got {s:?}"
        ));
    }
    Ok(d)
}

/// Runs the demo; `database_url` is `--database-url` / `DATABASE_URL` when given.
pub async fn run(
    database_url: Option<String>,
    registry: &Registry,
    args: Args,
) -> anyhow::Result<()> {
    let interrupted = CancellationToken::new();
    let signals = tokio::spawn(crate::run::wait_for_signal(interrupted.clone()));
    let display = Arc::new(Display::new(args.duration));
    let server = tokio::select! {
        s = Server::choose(database_url) => s,
        () = interrupted.cancelled() => Err(anyhow::anyhow!("interrupted")),
    };
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            display.finish();
            return Err(e);
        }
    };
    let result = tokio::select! {
        r = story::story(&server, registry, &args, &display, interrupted.clone()) => r,
        () = interrupted.cancelled() => Err(anyhow::anyhow!(
            "interrupted: the engines are stopped{}",
            if server.cluster.is_some() { " and the throwaway cluster removed" } else { "" }
        )),
    };
    signals.abort();
    display.finish();
    if let Some(cluster) = server.cluster {
        // Stopping the server and removing its files blocks for a moment.
        let _ = tokio::task::spawn_blocking(move || drop(cluster)).await;
    }
    let report = result?;
    print!("{}", report.render());
    if report.clean() {
        Ok(())
    } else {
        anyhow::bail!("a view differs from the write side (rows above)")
    }
}

/// What the story saw, for the report.
struct Report {
    wall: Duration,
    server: String,
    database: String,
    kept: bool,
    load: LoadConfig,
    ran: Duration,
    write: WriteReport,
    /// Fills and busts written at version 1 (before the upgrade) and 2 (after).
    trades_by_version: (i64, i64),
    quotes: QuotesReport,
    story: Vec<String>,
    views: Vec<ViewStats>,
    max_lag: i64,
    dead_letters: i64,
    parked: i64,
    reconciled: Vec<ViewReconciliation>,
    own_reads: OwnReads,
}

impl Report {
    fn clean(&self) -> bool {
        self.reconciled.iter().all(ViewReconciliation::clean)
    }

    fn render(&self) -> String {
        let w = &self.write;
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(String::new());
        line(format!(
            "projector demo: {} wall time; PostgreSQL: {}",
            seconds(self.wall),
            self.server
        ));
        line(String::new());
        line("write side (the pieces of `projector simulate`)".to_owned());
        line(format!(
            "  requests      {} in {} over {} accounts ({} hot): retried {}, deduplicated {} (idempotency keys), refused {}, rejected {}",
            w.requests,
            seconds(self.ran),
            self.load.accounts,
            self.load.hot_accounts(),
            w.retries,
            w.deduplicated,
            w.refused,
            w.rejected
        ));
        let q = &self.quotes;
        line(format!(
            "  quotes        ticks sent {} over UDP (lost {}, late {}, duplicates {}; {} reconnects; clock offset {}); orders refused: stale {}, stale at source {}, suspect {}",
            q.feed.map_or(0, |f| f.ticks),
            q.gate.stats.lost,
            q.gate.stats.late,
            q.gate.stats.duplicates,
            q.gate.reconnects,
            q.gate
                .clock_offset_ms
                .map_or("not measured".to_owned(), |o| format!("{o} ms measured")),
            w.refused_stale_quote,
            w.refused_stale_at_source,
            w.refused_suspect
        ));
        line(format!(
            "  events        {} written (fill_executed {}, fill_busted {}, cash_adjusted {}); fills and busts at version 1 {}, at version 2 {}",
            w.events(),
            w.fills,
            w.busts,
            w.cash,
            self.trades_by_version.0,
            self.trades_by_version.1
        ));
        line(format!(
            "  published     {} (redeliveries injected {} in {} relay crashes between publish and mark)",
            w.published, w.redeliveries_injected, w.relay_crashes
        ));
        let r = &self.own_reads;
        line(format!(
            "  own reads     {} orders by a client that reads portfolio right after each: {} saw it at once, {} reads waited in projector.wait_applied (p50 {} ms, p99 {} ms), {} timed out, {} parked; {} orders refused",
            r.orders,
            r.at_once,
            r.waited.len(),
            r.percentile(50).as_millis(),
            r.percentile(99).as_millis(),
            r.timeouts,
            r.parked,
            r.refused
        ));
        line(String::new());
        line("engine".to_owned());
        for s in &self.story {
            line(format!("  {s}"));
        }
        line(String::new());
        line(format!(
            "  {:<10} {:>3} {:<8} {:>8} {:>8} {:>9} {:>7} {:>7} {:>9} {:>7} {:>6} {:>4}",
            "view",
            "v",
            "state",
            "applied",
            "ignored",
            "dropped",
            "inbox",
            "seq",
            "watermark",
            "filter",
            "dead",
            "lag"
        ));
        for v in &self.views {
            line(format!(
                "  {:<10} {:>3} {:<8} {:>8} {:>8} {:>9} {:>7} {:>7} {:>9} {:>7} {:>6} {:>4}",
                v.name,
                v.version,
                v.state,
                v.applied,
                v.ignored,
                v.duplicates,
                v.dup_inbox,
                v.dup_seq,
                v.dup_watermark,
                v.dup_version_filter,
                v.dead_lettered,
                if v.state == VersionState::Retired {
                    "-".to_owned()
                } else {
                    v.lag.to_string()
                }
            ));
        }
        line(
            "  dropped: duplicates dropped, by what caught them: the inbox, the per-account seq, \
             the snapshot's watermark (rebuild), the version filter"
                .to_owned(),
        );
        line(format!(
            "  lag           at most {} messages during the run, 0 at the end; dead letters {}, parked accounts {}",
            self.max_lag, self.dead_letters, self.parked
        ));
        line(String::new());
        line(
            "reconciliation: every view, through its stable name, against the write side"
                .to_owned(),
        );
        let mut differences = 0;
        for r in &self.reconciled {
            line(format!(
                "  {:<10} vs {:<18} {:>6} rows vs {:>6}: {} differences",
                r.view,
                r.against,
                r.view_rows,
                r.source_rows,
                r.differences.len()
            ));
            if !r.clean() {
                line(format!("    key: write side ({}) | view", r.columns));
            }
            for d in r.differences.iter().take(20) {
                line(format!(
                    "    {}: {} | {}",
                    d.key,
                    d.source.as_deref().unwrap_or("(missing)"),
                    d.view.as_deref().unwrap_or("(missing)")
                ));
            }
            if r.differences.len() > 20 {
                line(format!("    ... and {} more", r.differences.len() - 20));
            }
            differences += r.differences.len();
        }
        if differences == 0 {
            line(
                "result        0 differences: each event's effect is in every view exactly once"
                    .to_owned(),
            );
        } else {
            line(format!("result        {differences} differences"));
        }
        if self.kept {
            line(format!(
                "the views stay in database {} for you to query (`psql -d {}`): portfolio, risk and eod",
                self.database, self.database
            ));
        }
        out
    }
}

/// What the client that reads its own writes saw.
#[derive(Debug, Default)]
struct OwnReads {
    /// Orders it placed that were written.
    orders: u64,
    /// Orders refused (the quote gate): nothing to read.
    refused: u64,
    /// Reads that found the write at once.
    at_once: u64,
    /// How long each read that had to wait waited, sorted.
    waited: Vec<Duration>,
    timeouts: u64,
    parked: u64,
}

impl OwnReads {
    fn percentile(&self, pct: usize) -> Duration {
        match self.waited.len() {
            0 => Duration::ZERO,
            n => self.waited[((n * pct).div_ceil(100)).clamp(1, n) - 1],
        }
    }
}

/// A client that reads its own writes, beside the load: every [`READER_EVERY`] it places an
/// order (through the write side's intake, as any client) and reads `portfolio` for it at
/// once: with `projector.applied` first, and when the view does not show it yet, by waiting
/// in `projector.wait_applied` on the reply's `(account_id, seq)`, until `stop`.
async fn read_own_writes(
    write_side: WriteSide,
    pool: deadpool_postgres::Pool,
    accounts: i64,
    stop: CancellationToken,
) -> anyhow::Result<OwnReads> {
    let intake = write_side.intake();
    let client = pool
        .get()
        .await
        .context("the reading client cannot connect")?;
    let mut out = OwnReads::default();
    let (one, price) = (decimal("1")?, decimal("1.08420")?);
    let mut tick = tokio::time::interval(READER_EVERY);
    let mut n: i64 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        n += 1;
        let account = 1 + (n * 7) % accounts.max(1);
        let order = Order {
            symbol: "EURUSD".to_owned(),
            side: if n % 2 == 0 { Side::Buy } else { Side::Sell },
            qty: one,
            price,
        };
        let reply = match intake.place(account, &format!("own-read-{n}"), order).await {
            Ok(outcome) => outcome.reply().clone(),
            Err(_) => {
                out.refused += 1;
                continue;
            }
        };
        out.orders += 1;
        let started = Instant::now();
        let shown = projector_devkit::demo::applied(&client, "portfolio", reply.account_id).await?;
        if shown.is_some_and(|s| s >= reply.seq) {
            out.at_once += 1;
            continue;
        }
        match projector_engine::wait_applied(
            &**client,
            "portfolio",
            reply.account_id,
            reply.seq,
            READ_WAIT,
        )
        .await?
        {
            Applied::Applied => out.waited.push(started.elapsed()),
            Applied::Timeout => out.timeouts += 1,
            Applied::Parked => out.parked += 1,
            Applied::UnknownView => anyhow::bail!("portfolio is not a view of the demo's database"),
        }
    }
    out.waited.sort_unstable();
    Ok(out)
}

/// One view version's counters, summed over partitions, and its lag.
#[derive(Debug, Clone)]
struct ViewStats {
    name: String,
    version: i32,
    state: VersionState,
    applied: i64,
    ignored: i64,
    duplicates: i64,
    dup_inbox: i64,
    dup_seq: i64,
    dup_watermark: i64,
    dup_version_filter: i64,
    dead_lettered: i64,
    /// Partition -> next offset.
    next: BTreeMap<i32, i64>,
    /// Partition -> who committed it last (`host:pid`).
    owners: BTreeMap<i32, String>,
    lag: i64,
}

/// Every view version's counters and lag; `published` is each partition's end (only the
/// demo's relay writes to the topic, so what it published is the high watermark).
async fn view_stats(
    client: &deadpool_postgres::Client,
    published: &BTreeMap<i32, u64>,
) -> anyhow::Result<Vec<ViewStats>> {
    let rows = projector_devkit::demo::view_offsets(client, TOPIC)
        .await
        .context("cannot read the views' offsets")?;
    let mut out: Vec<ViewStats> = Vec::new();
    for r in rows {
        if out
            .last()
            .is_none_or(|s| s.name != r.name || s.version != r.version)
        {
            out.push(ViewStats {
                name: r.name,
                version: r.version,
                state: r.state,
                applied: 0,
                ignored: 0,
                duplicates: 0,
                dup_inbox: 0,
                dup_seq: 0,
                dup_watermark: 0,
                dup_version_filter: 0,
                dead_lettered: 0,
                next: BTreeMap::new(),
                owners: BTreeMap::new(),
                lag: 0,
            });
        }
        let Some(s) = out.last_mut() else { continue };
        let Some(o) = r.partition else {
            continue;
        };
        s.next.insert(o.partition, o.next_offset);
        s.applied += o.applied;
        s.ignored += o.ignored;
        s.duplicates += o.duplicates;
        s.dup_inbox += o.dup_inbox;
        s.dup_seq += o.dup_seq;
        s.dup_watermark += o.dup_watermark;
        s.dup_version_filter += o.dup_version_filter;
        s.dead_lettered += o.dead_lettered;
        if let Some(by) = o.committed_by {
            s.owners.insert(o.partition, by);
        }
    }
    for s in &mut out {
        s.lag = published
            .iter()
            .map(|(p, end)| {
                let end = i64::try_from(*end).unwrap_or(i64::MAX);
                (end - s.next.get(p).copied().unwrap_or(0)).max(0)
            })
            .sum();
    }
    Ok(out)
}

/// The rebuild's progress, shown as story lines and in the figures.
struct RebuildProgress {
    display: Arc<Display>,
    lag: Mutex<Option<i64>>,
}

impl Progress for RebuildProgress {
    fn message(&self, line: &str) {
        self.display.say(&format!("rebuild: {line}"));
    }

    fn status(&self, s: &Status) {
        if let Ok(mut lag) = self.lag.lock() {
            *lag = Some(s.lag());
        }
    }
}

/// Which engine owns which partitions of `view`, as `A: 0,2  B: 1,3`.
fn ownership(view: &ViewStats, engines: &[&Engine]) -> String {
    engines
        .iter()
        .map(|e| {
            let mine: Vec<String> = view
                .owners
                .iter()
                .filter(|(_, by)| e.committed(by))
                .map(|(p, _)| p.to_string())
                .collect();
            format!(
                "{}: {}",
                e.label,
                if mine.is_empty() {
                    "-".to_owned()
                } else {
                    mine.join(",")
                }
            )
        })
        .collect::<Vec<_>>()
        .join("  ")
}

/// The story line of a finished rebuild, or why it failed.
fn rebuilt(
    joined: Result<Result<Outcome, projector_rebuild::RebuildError>, tokio::task::JoinError>,
) -> anyhow::Result<String> {
    match joined
        .context("the rebuild's task panicked")?
        .context("the rebuild failed")?
    {
        Outcome::CutOver(r) => Ok(format!(
            "{} v{} is live (cut over); v{} is retired; the engines follow without a restart",
            r.name,
            r.new,
            r.old.map_or("-".to_owned(), |v| v.to_string())
        )),
        other => anyhow::bail!("the rebuild ended without a cutover: {other:?}"),
    }
}

/// How often the demo's feed lags at the source: simulate's period, or a quarter of a run too
/// short for four of them, never shorter than twice a lag (a lag must end before the next).
fn lag_every(feed: &FeedConfig, duration: Duration) -> Duration {
    feed.lag_every.min(duration / 4).max(feed.lag_for * 2)
}

#[cfg(test)]
mod tests {
    use projector_devkit::writeside::quotes::FeedSymbol;

    use super::*;

    #[test]
    fn a_short_demo_lags_at_the_source_four_times_and_a_long_one_as_simulate_does() {
        let feed = FeedConfig::new(FeedSymbol::traded());
        let s = Duration::from_secs;
        assert_eq!(lag_every(&feed, s(12)), s(3));
        assert_eq!(lag_every(&feed, s(60)), feed.lag_every, "simulate's period");
        assert_eq!(
            lag_every(&feed, s(1)),
            feed.lag_for * 2,
            "a lag ends before the next"
        );
        assert!(FeedConfig {
            lag_every: lag_every(&feed, s(1)),
            ..feed
        }
        .check()
        .is_ok());
    }
}
