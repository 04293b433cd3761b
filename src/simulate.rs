//! `projector simulate`: a write side producing to Kafka, built the way the source documents
//! say one must be (`projector_devkit::writeside`): clients with idempotency keys that retry on
//! purpose, one transaction per event with the account's seq counter row, positions, the event
//! and an outbox row, and a relay that publishes the outbox with the idempotent producer and
//! crashes on purpose between publish and mark. Before an order is accepted, the quote gate
//! checks the price feed (`projector_devkit::writeside::quotes`): the built-in simulator on a
//! loopback UDP port, or another feed given with `--quotes`. Progress goes to standard error;
//! the final report to standard output.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::time::Duration;

use anyhow::Context as _;
use projector_devkit::writeside::quotes::{
    FeedConfig, FeedMode, FeedSymbol, Limits, Percent, Quotes, QuotesReport, ReceiverConfig,
};
use projector_devkit::writeside::{LoadConfig, RelayConfig, RelayExit, Report, WriteSide};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kafka bootstrap servers, e.g. `localhost:9092`.
    #[arg(long, env = "KAFKA_BROKERS")]
    brokers: String,
    /// The topic to publish to; it must exist (the dev broker creates it).
    #[arg(long)]
    topic: String,
    /// Accounts 1 to N.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..))]
    accounts: i64,
    /// Requests per second over all clients (retries not counted).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// How long to run, e.g. `30s` or `5m`; without it, until SIGINT or SIGTERM.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Seed of the clients' and the relay's dice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Clients sending at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    clients: u16,
    /// Percent of requests a client sends again under the same idempotency key.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=100))]
    retry_percent: u8,
    /// Percent of relay batches after which the relay "crashes" between publish and mark, so
    /// that the batch is published again at new offsets (at most 99).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=99))]
    relay_crash_percent: u8,
    /// Percent of the accounts that are hot.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=100))]
    hot_percent: u8,
    /// Percent of the requests that go to the hot accounts.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    hot_traffic_percent: u8,
    /// Percent of the requests that bust an earlier fill of the account.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=100))]
    bust_percent: u8,
    /// Percent of the requests that move cash in or out.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=100))]
    cash_percent: u8,
    /// Percent of the requests after which a client reuses its key for a different request
    /// (a client bug the intake must refuse).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=100))]
    misuse_percent: u8,
    /// The version of their shape fills and busts are written at: 1 (`data.side` and a
    /// positive `data.qty`) or 2 (a signed `data.qty`, no side; docs/wire-format.md).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(i32).range(1..=2))]
    fill_version: i32,
    /// Outbox rows the relay publishes per batch.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    relay_batch: i64,
    /// How often progress is printed on standard error.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    progress: Duration,
    /// After the clients stop, how long the relay may take to publish what is left.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// A librdkafka property for the relay's producer, applied last; repeat for more.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = crate::config::parse_property)]
    properties: Vec<(String, String)>,
    #[command(flatten)]
    quotes: QuoteArgs,
}

/// The quote feed and the gate's thresholds (docs/write-side.md, "The quote gate").
#[derive(Debug, Clone, clap::Args)]
pub struct QuoteArgs {
    /// Another quote feed, HOST:PORT, instead of the built-in simulator; the `--quote-*` flags
    /// of the simulator are then unused, `--quote-feed` and the thresholds still apply.
    #[arg(long, value_name = "ADDR", value_parser = parse_quotes_addr)]
    quotes: Option<SocketAddr>,
    /// What a tick carries: `full` quotes or `delta`s (a gap in a delta feed is suspect until
    /// a snapshot, in a full feed until the next tick).
    #[arg(long, default_value = "delta", value_parser = parse_feed_mode)]
    quote_feed: FeedMode,
    /// Longest silence since the last tick or gap-free heartbeat before an order is refused
    /// with `stale quote: N ms`.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    quote_stale_after: Duration,
    /// Oldest quote source time accepted, on our clock after the measured clock offset, before
    /// an order is refused as `stale at source`.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    quote_source_stale_after: Duration,
    /// The simulator's ticks per second, per symbol.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    quote_rate: u32,
    /// Between two heartbeats of a symbol.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    quote_heartbeat: Duration,
    /// Percent of the simulator's datagrams lost (two decimals at most, e.g. `0.5`).
    #[arg(long, default_value = "0.5", value_parser = parse_percent)]
    quote_loss_percent: Percent,
    /// Percent of the simulator's datagrams sent twice.
    #[arg(long, default_value = "1", value_parser = parse_percent)]
    quote_duplicate_percent: Percent,
    /// Percent of the simulator's datagrams held back and sent after the next one.
    #[arg(long, default_value = "0.5", value_parser = parse_percent)]
    quote_reorder_percent: Percent,
    /// Between two loss bursts, each on the next symbol in turn; `0s` for none.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    quote_burst_every: Duration,
    /// How long a burst loses every datagram of its symbol.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    quote_burst_for: Duration,
    /// Between two source lags, each on the next symbol in turn; `0s` for none.
    #[arg(long, default_value = "7s", value_parser = humantime::parse_duration)]
    quote_lag_every: Duration,
    /// How long a source lag lasts.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    quote_lag_for: Duration,
    /// How old a lagging symbol's source times are.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    quote_lag: Duration,
    /// How long the simulator takes to answer a reconnect with its snapshot.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    quote_snapshot_delay: Duration,
    /// The simulator's clock minus ours, in milliseconds (negative: behind); the gate measures
    /// it and subtracts it from source ages.
    #[arg(long, default_value_t = -2500, allow_negative_numbers = true)]
    quote_clock_skew_ms: i64,
}

/// How long `simulate` and the demo wait for a usable quote on every symbol before the clients
/// start.
pub const QUOTES_READY_WITHIN: Duration = Duration::from_secs(10);

fn parse_quotes_addr(s: &str) -> Result<SocketAddr, String> {
    s.to_socket_addrs()
        .map_err(|e| format!("{s:?} is not HOST:PORT of a quote feed: {e}"))?
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

fn parse_feed_mode(s: &str) -> Result<FeedMode, String> {
    match s {
        "full" => Ok(FeedMode::Full),
        "delta" => Ok(FeedMode::Delta),
        _ => Err(format!("{s:?} is not a feed mode: full or delta")),
    }
}

fn parse_percent(s: &str) -> Result<Percent, String> {
    s.parse()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl QuoteArgs {
    /// The built-in simulator's configuration (unused with `--quotes`).
    fn feed(&self, seed: u64) -> FeedConfig {
        FeedConfig {
            mode: self.quote_feed,
            ticks_per_second: self.quote_rate,
            heartbeat: self.quote_heartbeat,
            loss: self.quote_loss_percent,
            duplicate: self.quote_duplicate_percent,
            reorder: self.quote_reorder_percent,
            burst_every: self.quote_burst_every,
            burst_for: self.quote_burst_for,
            lag_every: self.quote_lag_every,
            lag_for: self.quote_lag_for,
            lag: self.quote_lag,
            snapshot_delay: self.quote_snapshot_delay,
            clock_skew_ms: self.quote_clock_skew_ms,
            seed,
            ..FeedConfig::new(FeedSymbol::traded())
        }
    }

    fn receiver(&self) -> ReceiverConfig {
        ReceiverConfig::new(
            self.quote_feed,
            Limits {
                stale_after_ms: millis(self.quote_stale_after),
                source_stale_after_ms: millis(self.quote_source_stale_after),
            },
            FeedSymbol::traded().into_iter().map(|s| s.name).collect(),
        )
    }
}

/// Starts the feed (unless `--quotes` names one) and the gate, and waits until every traded
/// symbol has a usable quote.
pub async fn start_quotes(
    feed: Option<SocketAddr>,
    simulator: FeedConfig,
    receiver: ReceiverConfig,
) -> anyhow::Result<Quotes> {
    let quotes = Quotes::start(feed, simulator, receiver).await?;
    if let Err(e) = quotes.ready(QUOTES_READY_WITHIN).await {
        let _ = quotes.stop().await;
        return Err(e).context(match feed {
            Some(_) => "the quote feed given with --quotes must answer subscribe and ping and quote every traded symbol (docs/write-side.md)",
            None => "the built-in quote feed did not start",
        });
    }
    Ok(quotes)
}

/// Runs the clients for the duration (or until a signal), lets the relay publish what is
/// left, and prints the report.
pub async fn run(args: Args, database_url: &str) -> anyhow::Result<()> {
    let load = LoadConfig {
        accounts: args.accounts,
        rate: Some(args.rate),
        clients: usize::from(args.clients),
        max_requests: None,
        seed: args.seed,
        retry_percent: args.retry_percent,
        hot_percent: args.hot_percent,
        hot_traffic_percent: args.hot_traffic_percent,
        bust_percent: args.bust_percent,
        cash_percent: args.cash_percent,
        misuse_percent: args.misuse_percent,
        close_percent: 10,
    };
    load.check()?;
    let relay_config = RelayConfig {
        properties: args.properties.clone(),
        batch_size: args.relay_batch,
        crash_percent: args.relay_crash_percent,
        seed: args.seed,
        ..RelayConfig::new(args.brokers.clone(), args.topic.clone())
    };

    let simulator = args.quotes.feed(args.seed);
    if args.quotes.quotes.is_none() {
        simulator.check()?;
    }
    let gate_config = args.quotes.receiver();
    gate_config.check()?;

    // Two connections per client: a racing retry holds two at once.
    let pool = projector_engine::db::pool(database_url, usize::from(args.clients) * 2 + 2)?;
    let write_side = WriteSide::new(pool)
        .await
        .context("cannot set up the write side's schema (check --database-url / DATABASE_URL; the database must exist)")?;
    write_side.set_fill_version(args.fill_version)?;
    let quotes = start_quotes(args.quotes.quotes, simulator, gate_config).await?;
    let write_side = write_side.with_quotes(quotes.gate().clone());
    eprintln!(
        "simulate: quotes from the {} feed at {}{}; orders are refused on a silence over {}, a source over {} old, or a suspect symbol",
        args.quotes.quote_feed.as_str(),
        quotes.feed_addr(),
        if args.quotes.quotes.is_some() { "" } else { " (built-in simulator)" },
        humantime::format_duration(args.quotes.quote_stale_after),
        humantime::format_duration(args.quotes.quote_source_stale_after),
    );

    let load_stop = CancellationToken::new();
    let drain = CancellationToken::new();
    let relay_stop = CancellationToken::new();
    let relay = write_side.relay(relay_config);
    let relay_task = {
        let (drain, stop, load_stop) = (drain.clone(), relay_stop.clone(), load_stop.clone());
        tokio::spawn(async move {
            let result = relay.run(drain, stop).await;
            if result.is_err() {
                // Writing on with nothing publishing only grows the outbox.
                load_stop.cancel();
            }
            result
        })
    };
    // First signal: the clients stop and the relay publishes what is left. Second: the relay
    // stops too, leaving unsent rows for the next run.
    {
        let (load_stop, relay_stop) = (load_stop.clone(), relay_stop.clone());
        tokio::spawn(async move {
            crate::run::wait_for_signal(load_stop).await;
            crate::run::wait_for_signal(relay_stop).await;
        });
    }
    if let Some(duration) = args.duration {
        let load_stop = load_stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(duration) => load_stop.cancel(),
                () = load_stop.cancelled() => {}
            }
        });
    }
    let started = Instant::now();
    let progress_stop = CancellationToken::new();
    let progress = tokio::spawn(print_progress(
        write_side.clone(),
        args.progress,
        started,
        progress_stop.clone(),
    ));
    eprintln!(
        "simulate: {} accounts ({} hot) at {} requests/s to {} on {}{}; stop with Ctrl-C",
        args.accounts,
        load.hot_accounts(),
        args.rate,
        args.topic,
        args.brokers,
        args.duration.map_or(String::new(), |d| format!(
            " for {}",
            humantime::format_duration(d)
        )),
    );

    let load_result = write_side.run_load(&load, load_stop.clone()).await;
    let ran = started.elapsed();
    drain.cancel();
    let relay_exit = {
        let timeout = tokio::time::sleep(args.drain_timeout);
        tokio::pin!(timeout);
        let mut relay_task = relay_task;
        tokio::select! {
            r = &mut relay_task => r,
            () = &mut timeout => {
                relay_stop.cancel();
                relay_task.await
            }
        }
    };
    progress_stop.cancel();
    let _ = progress.await;

    let report = write_side.report();
    let quotes_report = quotes.report();
    let quotes_result = quotes.stop().await;
    print!(
        "{}",
        render_report(&report, ran, &load, &args.topic, Some(&quotes_report))
    );
    load_result.context("the clients stopped")?;
    quotes_result.context("the quote feed stopped")?;
    let exit = relay_exit
        .context("the relay task ended abnormally")?
        .context("the relay stopped")?;
    if exit == RelayExit::Stopped && report.backlog() > 0 {
        eprintln!(
            "simulate: the relay stopped with {} events unpublished; they stay in the outbox for the next run",
            report.backlog()
        );
    }
    Ok(())
}

async fn print_progress(
    write_side: WriteSide,
    every: Duration,
    started: Instant,
    stop: CancellationToken,
) {
    let every = every.max(Duration::from_millis(100));
    let mut tick = tokio::time::interval_at(started + every, every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        let r = write_side.report();
        let ms = u64::try_from(started.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        eprintln!(
            "[{}] requests {} ({}/s) events {} published {} backlog {} redeliveries {} refused on the quote {}",
            seconds(ms),
            r.requests,
            r.requests * 1000 / ms,
            r.events(),
            r.published,
            r.backlog(),
            r.redeliveries_injected,
            r.refused_on_quotes(),
        );
    }
}

/// Milliseconds as seconds with one decimal, without floating point.
fn seconds(ms: u64) -> String {
    format!("{}.{}s", ms / 1000, ms % 1000 / 100)
}

/// `part` of `whole` as a percentage with one decimal, without floating point.
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.0%".to_owned();
    }
    let per_mille = part * 1000 / whole;
    format!("{}.{}%", per_mille / 10, per_mille % 10)
}

/// The quote line: the feed's mode and address, the ticks the built-in simulator sent (when it
/// is the feed), what the gate took, lost and dropped, its reconnects and clock offset.
pub fn render_quotes(q: &QuotesReport) -> String {
    let g = &q.gate;
    let sent = q
        .feed
        .map_or(String::new(), |f| format!("ticks sent {} (", f.ticks));
    let close = if q.feed.is_some() { ")" } else { "" };
    format!(
        "{} feed at {}: {sent}taken {}, lost {}, duplicates {}, late {}{close}; reconnects {}; clock offset {}",
        g.mode.as_str(),
        q.feed_addr,
        g.stats.ticks,
        g.stats.lost,
        g.stats.duplicates,
        g.stats.late,
        g.reconnects,
        g.clock_offset_ms
            .map_or("not measured".to_owned(), |o| format!("{o} ms")),
    )
}

/// The orders the gate refused, by reason.
pub fn render_refused(r: &Report) -> String {
    format!(
        "{} (stale {}, stale at source {}, suspect {})",
        r.refused_on_quotes(),
        r.refused_stale_quote,
        r.refused_stale_at_source,
        r.refused_suspect
    )
}

/// The final report, one fact per line, each line starting with its name.
pub fn render_report(
    r: &Report,
    ran: Duration,
    load: &LoadConfig,
    topic: &str,
    quotes: Option<&QuotesReport>,
) -> String {
    let ms = u64::try_from(ran.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "ran           {} against topic {topic}, {} accounts",
        seconds(ms),
        load.accounts
    ));
    line(format!(
        "requests      {} ({}/s; retries {}, deduplicated {}, refused {}, rejected {})",
        r.requests,
        r.requests * 1000 / ms,
        r.retries,
        r.deduplicated,
        r.refused,
        r.rejected
    ));
    if let Some(q) = quotes {
        line(format!("quotes        {}", render_quotes(q)));
        line(format!(
            "refused       orders on the quote {}",
            render_refused(r)
        ));
    }
    line(format!(
        "hot accounts  {} of {} made {} of the requests",
        load.hot_accounts(),
        load.accounts,
        percent(r.hot_requests, r.requests)
    ));
    line(format!(
        "events        {} (fill_executed {}, fill_busted {}, cash_adjusted {})",
        r.events(),
        r.fills,
        r.busts,
        r.cash
    ));
    line(format!(
        "published     {} (redeliveries injected {} in {} relay crashes; relay errors {})",
        r.published, r.redeliveries_injected, r.relay_crashes, r.relay_errors
    ));
    line(format!(
        "outbox        {} marked sent, {} left",
        r.marked_sent,
        r.backlog()
    ));
    let partitions: &BTreeMap<i32, u64> = &r.partitions;
    for (p, n) in partitions {
        line(format!(
            "partition {p:<3} {n} ({})",
            percent(*n, r.published)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_every_figure() {
        let report = Report {
            requests: 1000,
            retries: 50,
            deduplicated: 50,
            refused: 9,
            hot_requests: 500,
            fills: 900,
            busts: 20,
            cash: 40,
            published: 1000,
            marked_sent: 960,
            redeliveries_injected: 40,
            relay_crashes: 2,
            partitions: [(0, 600), (1, 400)].into_iter().collect(),
            ..Report::default()
        };
        let quotes = QuotesReport {
            feed_addr: SocketAddr::from(([127, 0, 0, 1], 4000)),
            feed: Some(projector_devkit::writeside::quotes::FeedReport {
                ticks: 1200,
                ..Default::default()
            }),
            gate: projector_devkit::writeside::quotes::GateReport {
                mode: FeedMode::Delta,
                stats: projector_devkit::writeside::quotes::Stats {
                    ticks: 1150,
                    lost: 9,
                    duplicates: 12,
                    late: 4,
                    ..Default::default()
                },
                suspect_symbols: 0,
                clock_offset_ms: Some(2500),
                reconnects: 7,
                invalid: 0,
            },
        };
        let report = Report {
            refused_stale_quote: 25,
            refused_stale_at_source: 40,
            refused_suspect: 18,
            ..report
        };
        let text = render_report(
            &report,
            Duration::from_millis(2500),
            &LoadConfig::new(100),
            "trades",
            Some(&quotes),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 10, "{text}");
        assert!(
            lines[0].contains("2.5s against topic trades, 100 accounts"),
            "{text}"
        );
        assert!(
            lines[1].contains("1000 (400/s; retries 50, deduplicated 50, refused 9"),
            "{text}"
        );
        assert_eq!(
            lines[2],
            "quotes        delta feed at 127.0.0.1:4000: ticks sent 1200 (taken 1150, lost 9, duplicates 12, late 4); reconnects 7; clock offset 2500 ms"
        );
        assert_eq!(
            lines[3],
            "refused       orders on the quote 83 (stale 25, stale at source 40, suspect 18)"
        );
        let lines = &lines[2..];
        assert!(lines[2].contains("5 of 100 made 50.0%"), "{text}");
        assert!(lines[3].contains("960 (fill_executed 900, fill_busted 20, cash_adjusted 40)"));
        assert!(lines[4].contains("redeliveries injected 40 in 2 relay crashes"));
        assert!(lines[5].contains("960 marked sent, 0 left"));
        assert_eq!(lines[6], "partition 0   600 (60.0%)");
    }

    /// The demo builds its feed and gate from `FeedConfig::new` and `Limits::default`: the
    /// flags' defaults must be those, or the demo would show another feed than `simulate`.
    #[test]
    fn the_quote_flags_default_to_the_demos_feed() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            quotes: QuoteArgs,
        }
        let flags = <Flags as clap::Parser>::try_parse_from(["simulate"]).expect("defaults");
        assert_eq!(
            flags.quotes.feed(7),
            FeedConfig {
                seed: 7,
                ..FeedConfig::new(FeedSymbol::traded())
            }
        );
        let receiver = flags.quotes.receiver();
        assert_eq!(receiver.limits, Limits::default());
        assert_eq!(receiver.mode, FeedMode::Delta);
        assert_eq!(flags.quotes.quotes, None);

        let flags = <Flags as clap::Parser>::try_parse_from([
            "simulate",
            "--quote-feed",
            "full",
            "--quote-clock-skew-ms",
            "-40",
            "--quote-loss-percent",
            "2.5",
            "--quotes",
            "127.0.0.1:9000",
        ])
        .expect("flags");
        assert_eq!(flags.quotes.quote_feed, FeedMode::Full);
        assert_eq!(flags.quotes.feed(1).clock_skew_ms, -40);
        assert_eq!(flags.quotes.feed(1).loss.basis_points(), 250);
        assert_eq!(
            flags.quotes.quotes,
            Some(SocketAddr::from(([127, 0, 0, 1], 9000)))
        );
    }

    #[test]
    fn percentages_without_floats() {
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(0, 0), "0.0%");
        assert_eq!(seconds(61_050), "61.0s");
    }
}
