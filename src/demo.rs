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
//! ([`server`]). Progress goes to standard error ([`display`]); the report to standard
//! output. Exits 1 when a view differs from the write side.

mod display;
mod engines;
mod server;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use projector_devkit::devbroker::DevBroker;
use projector_devkit::reconcile::{reconcile, ViewReconciliation};
use projector_devkit::writeside::ledger::decimal;
use projector_devkit::writeside::quotes::{
    FeedConfig, FeedMode, FeedSymbol, Limits, QuotesReport, ReceiverConfig,
};
use projector_devkit::writeside::{
    LoadConfig, Order, RelayConfig, Report as WriteReport, Side, WriteSide,
};
use projector_engine::kafka::source::KafkaConfig;
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
        r = story(&server, registry, &args, &display, interrupted.clone()) => r,
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
                if v.state == "retired" {
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
                "the views stay in database {} for you to query (`psql -d {}`: SELECT * FROM portfolio, risk, eod)",
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
        let shown: Option<i64> = client
            .query_one(
                "SELECT projector.applied('portfolio', $1)",
                &[&reply.account_id],
            )
            .await?
            .get(0);
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
#[derive(Debug, Clone, Default)]
struct ViewStats {
    name: String,
    version: i32,
    state: String,
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
    let rows = client
        .query(
            "SELECT v.name, v.version, v.state, o.partition, o.next_offset, o.applied, o.ignored, \
                    o.duplicates, o.dup_inbox, o.dup_seq, o.dup_watermark, o.dup_version_filter, \
                    o.dead_lettered, o.committed_by \
             FROM projector.views v \
             LEFT JOIN projector.offsets o ON o.consumer = v.consumer AND o.topic = $1 \
             WHERE v.dropped_at IS NULL \
             ORDER BY v.name, v.version, o.partition",
            &[&TOPIC],
        )
        .await
        .context("cannot read the views' offsets")?;
    let mut out: Vec<ViewStats> = Vec::new();
    for r in rows {
        let (name, version): (String, i32) = (r.get(0), r.get(1));
        if out
            .last()
            .is_none_or(|s| s.name != name || s.version != version)
        {
            out.push(ViewStats {
                name,
                version,
                state: r.get(2),
                ..ViewStats::default()
            });
        }
        let Some(s) = out.last_mut() else { continue };
        let Some(partition) = r.get::<_, Option<i32>>(3) else {
            continue;
        };
        let n = |i: usize| r.get::<_, Option<i64>>(i).unwrap_or(0);
        s.next.insert(partition, n(4));
        s.applied += n(5);
        s.ignored += n(6);
        s.duplicates += n(7);
        s.dup_inbox += n(8);
        s.dup_seq += n(9);
        s.dup_watermark += n(10);
        s.dup_version_filter += n(11);
        s.dead_lettered += n(12);
        if let Some(by) = r.get::<_, Option<String>>(13) {
            s.owners.insert(partition, by);
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

/// The demo from an empty database to the report.
/// How often the demo's feed lags at the source: simulate's period, or a quarter of a run too
/// short for four of them, never shorter than twice a lag (a lag must end before the next).
fn lag_every(feed: &FeedConfig, duration: Duration) -> Duration {
    feed.lag_every.min(duration / 4).max(feed.lag_for * 2)
}

async fn story(
    server: &Server,
    registry: &Registry,
    args: &Args,
    display: &Arc<Display>,
    interrupted: CancellationToken,
) -> anyhow::Result<Report> {
    let mut story: Vec<String> = Vec::new();
    display.say(&format!("PostgreSQL: {}", server.described));
    let url = server.fresh_database(&args.database).await?;
    // The clients (two connections each: a racing retry holds two), the relay, the figures.
    let pool = projector_engine::db::pool(&url, 24)?;
    {
        let mut client = pool
            .get()
            .await
            .context("cannot connect to the demo database")?;
        projector_engine::migrate(&mut client, registry).await?;
    }
    let write_side = WriteSide::new(pool.clone())
        .await
        .context("cannot set up the write side's schema")?;
    // The producers start at version 1 of fills and busts and are upgraded to version 2
    // halfway (below): the topic holds both, interleaved for every account, and the views
    // read both through their upcaster.
    write_side.set_fill_version(1)?;
    // The flags' defaults of `projector simulate`, which a unit test there holds equal, except
    // that a short run sees at least four source lags: one lag in a 12 s run falls in a single
    // second, and a machine busy enough to stall the clients for that second told no story of
    // `stale at source` (a test's run once refused none).
    let defaults = FeedConfig::new(FeedSymbol::traded());
    let feed = FeedConfig {
        seed: args.seed,
        lag_every: lag_every(&defaults, args.duration),
        ..defaults
    };
    let gate = ReceiverConfig::new(
        FeedMode::Delta,
        Limits::default(),
        FeedSymbol::traded().into_iter().map(|s| s.name).collect(),
    );
    let quotes = crate::simulate::start_quotes(None, feed.clone(), gate).await?;
    let write_side = write_side.with_quotes(quotes.gate().clone());
    display.say(&format!(
        "quote feed (the built-in simulator, UDP on loopback) at {}: {} ticks/s per symbol, {} lost, a {} burst every {}, \
         a source {} behind for {} every {}, a clock {} ms off; orders are refused on a quote silent over {} ms, \
         over {} ms old at the source, or suspect",
        quotes.feed_addr(),
        feed.ticks_per_second,
        feed.loss,
        humantime::format_duration(feed.burst_for),
        humantime::format_duration(feed.burst_every),
        humantime::format_duration(feed.lag),
        humantime::format_duration(feed.lag_for),
        humantime::format_duration(feed.lag_every),
        feed.clock_skew_ms,
        Limits::default().stale_after_ms,
        Limits::default().source_stale_after_ms,
    ));
    display.say(&format!(
        "database {}: the write side's tables (positions, account_seq, outbox, ...) and the views {}",
        args.database,
        registry.names().into_iter().collect::<Vec<_>>().join(", ")
    ));
    let broker =
        DevBroker::start(1, &[(TOPIC, args.partitions)]).context("cannot start the dev broker")?;
    let brokers = broker.bootstrap_servers();
    display.say(&format!(
        "dev broker (librdkafka's mock cluster, in this process) on {brokers}: topic {TOPIC}, {} partitions",
        args.partitions
    ));

    let mut a = Engine::spawn("A", &brokers, TOPIC, &url)?;
    let tell = |story: &mut Vec<String>, note: String| {
        display.say(&note);
        story.push(format!("{:>7}  {note}", display.elapsed()));
    };
    tell(
        &mut story,
        format!("engine A (pid {}) `projector run` started", a.pid()),
    );

    let load = LoadConfig {
        rate: Some(args.rate),
        seed: args.seed,
        ..LoadConfig::new(args.accounts)
    };
    load.check()?;
    let relay = write_side.relay(RelayConfig {
        seed: args.seed,
        crash_percent: RELAY_CRASH_PERCENT,
        ..RelayConfig::new(brokers.clone(), TOPIC)
    });
    let (drain, relay_stop, load_stop) = (
        CancellationToken::new(),
        interrupted.child_token(),
        interrupted.child_token(),
    );
    let relay_task = {
        let (drain, stop) = (drain.clone(), relay_stop.clone());
        tokio::spawn(async move { relay.run(drain, stop).await })
    };
    let load_task = {
        let (write_side, load, stop) = (write_side.clone(), load.clone(), load_stop.clone());
        tokio::spawn(async move { write_side.run_load(&load, stop).await })
    };
    let reader_task = tokio::spawn(read_own_writes(
        write_side.clone(),
        pool.clone(),
        args.accounts,
        load_stop.clone(),
    ));
    display.say(&format!(
        "clients: {} requests/s over {} accounts ({} hot) for {}; {}% retried under the same idempotency key; \
         the relay crashes between publish and mark after {}% of its batches",
        args.rate,
        args.accounts,
        load.hot_accounts(),
        humantime::format_duration(args.duration),
        load.retry_percent,
        RELAY_CRASH_PERCENT
    ));
    let load_started = Instant::now();
    let at = |percent: u32| load_started + args.duration * percent / 100;
    let (join_at, rebuild_at, kill_at, load_end) = (at(20), at(35), at(60), at(100));
    let upgrade_at = at(50);

    let rebuild_progress = Arc::new(RebuildProgress {
        display: Arc::clone(display),
        lag: Mutex::new(None),
    });
    let mut kafka = KafkaConfig::new(brokers.clone(), TOPIC);
    kafka.properties = vec![
        ("session.timeout.ms".to_owned(), "3000".to_owned()),
        ("heartbeat.interval.ms".to_owned(), "300".to_owned()),
    ];
    // The rebuild reads the dev broker too.
    kafka.properties.extend(
        projector_devkit::devbroker::CONSUMER_PROPERTIES
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned())),
    );

    let mut b: Option<Engine> = None;
    let mut rebuild: Option<
        tokio::task::JoinHandle<Result<Outcome, projector_rebuild::RebuildError>>,
    > = None;
    let mut a_alive = true;
    let mut cut_over = false;
    let mut split_seen = false;
    let mut took_over_seen = false;
    let mut max_lag = 0i64;
    let mut ticker = tokio::time::interval(TICK);
    let client = pool
        .get()
        .await
        .context("cannot connect to the demo database")?;

    // The load phase: a tick reads the figures and moves the story on.
    loop {
        ticker.tick().await;
        let now = Instant::now();
        if a_alive {
            a.check_alive()?;
        }
        if let Some(b) = &mut b {
            b.check_alive()?;
        }
        let report = write_side.report();
        let views = view_stats(&client, &report.partitions).await?;
        if let Some(reference) = views
            .iter()
            .find(|v| v.state == "live" && v.name != REBUILT)
        {
            let mut engines: Vec<&Engine> = Vec::new();
            if a_alive {
                engines.push(&a);
            }
            if let Some(b) = &b {
                engines.push(b);
            }
            let own = ownership(reference, &engines);
            if !split_seen
                && a_alive
                && b.as_ref()
                    .is_some_and(|b| reference.owners.values().any(|o| b.committed(o)))
                && reference.owners.values().any(|o| a.committed(o))
            {
                split_seen = true;
                tell(
                    &mut story,
                    format!(
                        "the group rebalanced: partitions of {}  {own}",
                        reference.name
                    ),
                );
            }
            if !took_over_seen
                && !a_alive
                && b.as_ref().is_some_and(|b| {
                    (0..args.partitions).all(|p| {
                        report.partitions.get(&p).is_none_or(|n| *n == 0)
                            || reference.owners.get(&p).is_some_and(|o| b.committed(o))
                    })
                })
            {
                took_over_seen = true;
                tell(&mut story, format!("B took over every partition ({own})"));
            }
        }
        max_lag = max_lag.max(
            views
                .iter()
                .filter(|v| v.state == "live")
                .map(|v| v.lag)
                .max()
                .unwrap_or(0),
        );
        let lags = views
            .iter()
            .filter(|v| v.state != "retired")
            .map(|v| format!("{} v{} {}", v.name, v.version, v.lag))
            .collect::<Vec<_>>()
            .join(", ");
        let rebuild_lag = rebuild_progress
            .lag
            .lock()
            .ok()
            .and_then(|l| *l)
            .filter(|_| rebuild.as_ref().is_some_and(|r| !r.is_finished()))
            .map_or(String::new(), |l| format!(" (rebuild lag {l})"));
        let done = now
            .saturating_duration_since(load_started)
            .min(args.duration);
        display.figures(
            done.as_secs(),
            &format!(
                "events {} · published {} ({} redelivered) · refused on the quote {} · lag {lags}{rebuild_lag}",
                report.events(),
                report.published,
                report.redeliveries_injected,
                report.refused_on_quotes()
            ),
        );

        if write_side.fill_version() == 1 && now >= upgrade_at {
            write_side.set_fill_version(2)?;
            tell(
                &mut story,
                "the write side upgraded its producers: fills and busts are now version 2 (a signed qty, no side); the views read both".to_owned(),
            );
        }
        if b.is_none() && now >= join_at {
            let engine = Engine::spawn("B", &brokers, TOPIC, &url)?;
            tell(
                &mut story,
                format!(
                    "engine B (pid {}) `projector run` joined: the group rebalances",
                    engine.pid()
                ),
            );
            b = Some(engine);
        }
        if rebuild.is_none() && !cut_over && now >= rebuild_at {
            let options = projector_rebuild::Options {
                // A short margin: every message's time is this machine's clock.
                margin: Duration::from_secs(5),
                batch_messages: 2000,
                tick: Duration::from_millis(500),
                ..projector_rebuild::Options::new(REBUILT)
            };
            tell(
                &mut story,
                format!("rebuild of {REBUILT} into a new version from the write side's snapshot, while live"),
            );
            let (registry, url, kafka) = (registry.clone(), url.clone(), kafka.clone());
            let progress = Arc::clone(&rebuild_progress);
            let stop = interrupted.child_token();
            rebuild = Some(tokio::spawn(async move {
                projector_rebuild::rebuild(&registry, &url, kafka, &options, &*progress, stop).await
            }));
        }
        // A dies once B owns partitions of its own (or at the end of the load at the latest),
        // so that the kill moves partitions from one live process to another.
        if a_alive && now >= kill_at && (split_seen || now >= load_end) {
            a.kill()?;
            a_alive = false;
            tell(
                &mut story,
                format!(
                    "engine A (pid {}) killed with SIGKILL: its batches in flight roll back, its partitions move to B",
                    a.pid()
                ),
            );
        }
        if rebuild
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished)
        {
            if let Some(task) = rebuild.take() {
                cut_over = true;
                tell(&mut story, rebuilt(task.await)?);
            }
        }
        if load_task.is_finished() || now >= load_end {
            break;
        }
    }

    load_stop.cancel();
    load_task
        .await
        .context("the clients' task panicked")?
        .context("the clients stopped")?;
    let own_reads = reader_task
        .await
        .context("the reading client's task panicked")?
        .context("the reading client stopped")?;
    let ran = load_started.elapsed();
    let report = write_side.report();
    // No order comes any more: the feed's work is done.
    let quotes_report = quotes.report();
    quotes.stop().await.context("the quote feed stopped")?;
    display.say(&format!(
        "clients stopped after {} requests ({} refused on the quote); the relay publishes what is left",
        report.requests,
        report.refused_on_quotes()
    ));
    drain.cancel();
    let deadline = Instant::now() + FINISH_WITHIN;
    tokio::time::timeout_at(deadline, relay_task)
        .await
        .context("the relay did not publish the rest in time")?
        .context("the relay's task panicked")?
        .context("the relay stopped")?;

    if let Some(task) = rebuild {
        let outcome = tokio::time::timeout_at(deadline, task)
            .await
            .context("the rebuild did not finish in time")?;
        tell(&mut story, rebuilt(outcome)?);
    } else if !cut_over {
        anyhow::bail!("the rebuild never started: the load was too short");
    }

    // Caught up: every live version at the end of every partition.
    let mut b = b.context("engine B never started: the load was too short")?;
    let published = write_side.report().partitions;
    let views = loop {
        b.check_alive()?;
        let views = view_stats(&client, &published).await?;
        let live: Vec<&ViewStats> = views.iter().filter(|v| v.state == "live").collect();
        if !live.is_empty() && live.iter().all(|v| v.lag == 0) {
            break views;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the engines did not catch up in time: lag {:?}",
            live.iter().map(|v| (&v.name, v.lag)).collect::<Vec<_>>()
        );
        display.figures(
            args.duration.as_secs(),
            &format!(
                "catching up: lag {}",
                live.iter()
                    .map(|v| format!("{} v{} {}", v.name, v.version, v.lag))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        ticker.tick().await;
    };
    display.say("caught up: every live view is at the end of every partition");
    b.stop().await?;
    tell(
        &mut story,
        format!("engine B (pid {}) stopped with SIGTERM", b.pid()),
    );

    let dead_letters: i64 = client
        .query_one("SELECT count(*) FROM projector.dead_letters", &[])
        .await?
        .get(0);
    let parked: i64 = client
        .query_one("SELECT count(*) FROM projector.parked_accounts", &[])
        .await?
        .get(0);
    drop(client);
    let mut client = pool
        .get()
        .await
        .context("cannot connect to the demo database")?;
    let reconciled = reconcile(&mut client).await?;
    let trades_by_version = write_side.trades_by_version().await?;
    drop(broker);
    Ok(Report {
        wall: display.wall(),
        server: server.described.clone(),
        database: args.database.clone(),
        kept: server.cluster.is_none(),
        load,
        ran,
        write: write_side.report(),
        trades_by_version,
        quotes: quotes_report,
        story,
        views,
        max_lag,
        dead_letters,
        parked,
        reconciled,
        own_reads,
    })
}

#[cfg(test)]
mod tests {
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
