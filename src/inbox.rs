//! `projector inbox prune`: inbox retention, in batches through the time index, each
//! consumer's rows measured on its own clock (`projector_engine::ops::clock`), refusing a
//! window shorter than the configured minimum or than the topic's retention.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::ops::clock::{self, Clock, ConsumerClock};
use projector_engine::ops::prune::{
    check_retention, humanize, prune_inbox, PruneOptions, DEFAULT_MIN_WINDOW,
};
use projector_engine::ops::topic::retention;

use crate::config::{parse_duration, parse_property, File};

/// `projector inbox ...`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Delete inbox rows older than a window on their consumer's clock, in batches, until
    /// none are left.
    Prune(PruneArgs),
}

/// The flags of `projector inbox prune`.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Delete rows applied longer than this before their consumer's clock (`7d`, `30d`).
    #[arg(long, value_parser = parse_duration)]
    pub older_than: Duration,
    /// Rows per batch: each batch is one short transaction.
    #[arg(long, default_value_t = 10_000)]
    pub batch: i64,
    /// The pause between batches.
    #[arg(long, value_parser = parse_duration, default_value = "20ms")]
    pub pause: Duration,
    /// The shortest window accepted: the broker's retention plus the longest a dead letter
    /// may wait for its replay. [default: the config file's [inbox] min_window, else 7d]
    #[arg(long, env = "PROJECTOR_INBOX_MIN_WINDOW", value_parser = parse_duration)]
    pub min_window: Option<Duration>,
    /// The TOML configuration file of `projector run` (for `[inbox] min_window`, the brokers,
    /// the topic and the Kafka properties).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Kafka bootstrap servers: the window is compared with the topics' retention, and each
    /// consumer's position in the log bounds its clock. Without them, each partition's clock
    /// is its last commit.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub brokers: Option<String>,
    /// The topic of events, whose retention the window must exceed (the topics the
    /// consumers committed are asked too).
    #[arg(long, env = "PROJECTOR_TOPIC")]
    pub topic: Option<String>,
    /// A librdkafka property, repeatable: `-X security.protocol=SASL_SSL`.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,
}

/// How long the brokers have to answer DescribeConfigs.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs an `inbox` command.
pub async fn run(command: Command, database_url: Option<String>) -> anyhow::Result<()> {
    let Command::Prune(args) = command;
    let file = File::load_opt(args.config.as_deref())?;
    let min_window = match (args.min_window, &file.inbox.min_window) {
        (Some(d), _) => d,
        (None, Some(text)) => {
            parse_duration(text).map_err(|e| anyhow!("config file: [inbox] min_window: {e}"))?
        }
        (None, None) => DEFAULT_MIN_WINDOW,
    };
    let options = PruneOptions {
        older_than: args.older_than,
        min_window,
        batch: args.batch,
        pause: args.pause,
    };
    // Refused before connecting: a wrong window is a mistake whatever the database holds.
    projector_engine::ops::prune::check_window(&options)?;
    let topic = args.topic.or(file.topic.clone());
    let kafka = args.brokers.or(file.brokers.clone()).map(|brokers| {
        crate::logging::redact_properties(args.properties.iter().map(|(k, v)| (k, v)));
        let mut kafka = KafkaConfig::new(brokers, topic.clone().unwrap_or_default());
        // File properties first, flags after them: librdkafka keeps the last value set.
        kafka.properties = file
            .kafka
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(args.properties)
            .collect();
        kafka
    });
    let url = database_url
        .or(file.database_url.clone())
        .unwrap_or_else(|| crate::config::DEFAULT_DATABASE_URL.to_owned());
    let pool = projector_engine::db::pool(&url, 1)?;
    let client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;

    let facts = clock::facts(&client).await?;
    let log = match &kafka {
        Some(kafka) => {
            let topics: BTreeSet<String> = topic
                .iter()
                .cloned()
                .chain(
                    facts
                        .iter()
                        .flat_map(|f| f.commits.iter().map(|c| c.topic.clone())),
                )
                .collect();
            for t in &topics {
                match retention(kafka, t, ADMIN_TIMEOUT).await {
                    Ok(kept) => check_retention(options.older_than, t, kept)?,
                    Err(e) => eprintln!(
                        "projector: inbox prune: the brokers did not report retention.ms of topic {t} ({e}); the minimum window {} stands",
                        humanize(options.min_window)
                    ),
                }
            }
            let (kafka, facts) = (kafka.clone(), facts.clone());
            let (log, problems) =
                tokio::task::spawn_blocking(move || clock::read_log(&kafka, &facts, ADMIN_TIMEOUT))
                    .await
                    .context("reading the log")?;
            for p in problems {
                eprintln!("projector: inbox prune: {p}");
            }
            log
        }
        None => {
            eprintln!(
                "projector: inbox prune: no brokers (--brokers, KAFKA_BROKERS or brokers in --config): the topic's retention is not compared with the window, and each partition's clock is its last commit"
            );
            clock::Log::new()
        }
    };
    let clocks: Vec<ConsumerClock> = facts
        .iter()
        .map(|f| ConsumerClock {
            consumer: f.consumer.clone(),
            clock: clock::clock(f, &log),
        })
        .collect();

    let mut last = Instant::now();
    let report = prune_inbox(&client, &options, &clocks, |p| {
        // A line a second at most: a large backlog is thousands of batches.
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let reached = p.reached.map_or(String::new(), |t| {
                format!(", up to {}", t.format("%Y-%m-%d %H:%M:%SZ"))
            });
            eprintln!(
                "projector: inbox prune: {} rows in {} batches{reached}",
                p.total, p.batches
            );
        }
    })
    .await?;
    for c in &report.consumers {
        match (&c.clock, c.cutoff) {
            (Clock::At { .. }, Some(cutoff)) => println!(
                "{}: {} row(s) applied before {} pruned; {}",
                c.consumer,
                c.deleted,
                cutoff.format("%Y-%m-%d %H:%M:%SZ"),
                c.clock.describe()
            ),
            // Paused while the run went on: what went before is counted.
            (Clock::At { .. }, None) => println!(
                "{}: {} row(s) pruned, then kept: a rebuild of it was paused",
                c.consumer, c.deleted
            ),
            _ => println!("{}: {}", c.consumer, c.clock.describe()),
        }
    }
    println!(
        "pruned {} inbox row(s) older than {} on their consumers' clocks in {} batch(es) of at most {}",
        report.deleted,
        humanize(options.older_than),
        report.batches,
        options.batch
    );
    Ok(())
}
