//! `projector inbox prune`: inbox retention, whole days of the inbox dropped once every
//! consumer with rows in them has read the log a window past them, each on its own clock
//! (`projector_ops::clock`), refusing a window shorter than the configured minimum or
//! than the topic's retention.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use projector_engine::kafka::source::KafkaConfig;
use projector_ops::clock::{self, ConsumerClock};
use projector_ops::prune::{
    check_retention, humanize, prune_inbox, DayOutcome, LegacyOutcome, PruneOptions,
    DEFAULT_MIN_WINDOW,
};
use projector_ops::topic::retention;

use crate::config::{parse_duration, parse_property, File};

/// `projector inbox ...`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Drop the inbox's days that every consumer with rows in them has read a window past, on
    /// its own clock.
    Prune(PruneArgs),
}

/// The flags of `projector inbox prune`.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Drop days that end longer than this before the clock of every consumer with rows in
    /// them (`7d`, `30d`).
    #[arg(long, value_parser = parse_duration)]
    pub older_than: Duration,
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
    };
    // Refused before connecting: a wrong window is a mistake whatever the database holds.
    projector_ops::prune::check_window(&options)?;
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
    let mut client = pool
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

    let started = Instant::now();
    let report = prune_inbox(&mut client, &options, &clocks, |d| match &d.outcome {
        DayOutcome::Dropped {
            rows_estimate,
            bytes,
            took,
        } => eprintln!(
            "projector: inbox prune: {}: dropped (about {rows_estimate} rows, {} bytes) in {} ms",
            d.day,
            bytes,
            took.as_millis()
        ),
        DayOutcome::Kept(why) => eprintln!("projector: inbox prune: {}: {why}", d.day),
    })
    .await?;
    for c in &report.consumers {
        match c.cutoff {
            Some(cutoff) => println!(
                "{}: its rows before {} may go; {}",
                c.consumer,
                cutoff.format("%Y-%m-%d %H:%M:%SZ"),
                c.clock.describe()
            ),
            None => println!("{}: {}", c.consumer, c.clock.describe()),
        }
    }
    match &report.legacy {
        LegacyOutcome::Empty => {}
        LegacyOutcome::Emptied(rows) => println!(
            "the inbox before V0009 (keyed by event id alone) is emptied: about {rows} rows"
        ),
        LegacyOutcome::Kept(why) => println!("the inbox before V0009: {why}"),
    }
    let dropped: Vec<String> = report.dropped().map(|d| d.day.to_string()).collect();
    println!(
        "dropped {} day(s) of the inbox older than {} on their consumers' clocks in {} ms{}",
        dropped.len(),
        humanize(options.older_than),
        started.elapsed().as_millis(),
        if dropped.is_empty() {
            String::new()
        } else {
            format!(": {}", dropped.join(", "))
        }
    );
    Ok(())
}
