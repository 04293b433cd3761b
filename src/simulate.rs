//! `projector simulate`: a write side producing to Kafka, built the way the source documents
//! say one must be (`projector_devkit::writeside`): clients with idempotency keys that retry on
//! purpose, one transaction per event with the account's seq counter row, positions, the event
//! and an outbox row, and a relay that publishes the outbox with the idempotent producer and
//! crashes on purpose between publish and mark. Progress goes to standard error; the final
//! report to standard output.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
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

    // Two connections per client: a racing retry holds two at once.
    let pool = projector_engine::db::pool(database_url, usize::from(args.clients) * 2 + 2)?;
    let write_side = WriteSide::new(pool)
        .await
        .context("cannot set up the write side's schema (check --database-url / DATABASE_URL; the database must exist)")?;

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
    print!("{}", render_report(&report, ran, &load, &args.topic));
    load_result.context("the clients stopped")?;
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
            "[{}] requests {} ({}/s) events {} published {} backlog {} redeliveries {}",
            seconds(ms),
            r.requests,
            r.requests * 1000 / ms,
            r.events(),
            r.published,
            r.backlog(),
            r.redeliveries_injected,
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

/// The final report, one fact per line, each line starting with its name.
pub fn render_report(r: &Report, ran: Duration, load: &LoadConfig, topic: &str) -> String {
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
        let text = render_report(
            &report,
            Duration::from_millis(2500),
            &LoadConfig::new(100),
            "trades",
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8, "{text}");
        assert!(
            lines[0].contains("2.5s against topic trades, 100 accounts"),
            "{text}"
        );
        assert!(
            lines[1].contains("1000 (400/s; retries 50, deduplicated 50, refused 9"),
            "{text}"
        );
        assert!(lines[2].contains("5 of 100 made 50.0%"), "{text}");
        assert!(lines[3].contains("960 (fill_executed 900, fill_busted 20, cash_adjusted 40)"));
        assert!(lines[4].contains("redeliveries injected 40 in 2 relay crashes"));
        assert!(lines[5].contains("960 marked sent, 0 left"));
        assert_eq!(lines[6], "partition 0   600 (60.0%)");
    }

    #[test]
    fn percentages_without_floats() {
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(0, 0), "0.0%");
        assert_eq!(seconds(61_050), "61.0s");
    }
}
