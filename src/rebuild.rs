//! `projector rebuild`, `projector verify`, `projector cutover` and `projector retire`: a
//! view rebuilt into a new version while the live stream keeps flowing.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::Registry;
use projector_rebuild::{
    cutover, state, verify, Cutover, Options, Outcome, Progress, Source, Status,
};
use tokio_util::sync::CancellationToken;

use crate::config::parse_property;

/// Where the topic is, for the commands that read it.
#[derive(Debug, clap::Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub brokers: Option<String>,
    /// The topic of events.
    #[arg(long, env = "PROJECTOR_TOPIC")]
    pub topic: Option<String>,
    /// Consumer groups are named `<prefix>.<view>_v<version>`.
    #[arg(long, default_value = "projector")]
    pub group_prefix: String,
    /// A librdkafka property, repeatable: `-X security.protocol=SASL_SSL`.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,
}

impl KafkaArgs {
    /// The Kafka configuration, or a one-line reason it is incomplete.
    pub fn config(&self) -> anyhow::Result<KafkaConfig> {
        let Some(brokers) = &self.brokers else {
            anyhow::bail!("no Kafka brokers: pass --brokers or set KAFKA_BROKERS");
        };
        let Some(topic) = &self.topic else {
            anyhow::bail!("no topic: pass --topic or set PROJECTOR_TOPIC");
        };
        let mut c = KafkaConfig::new(brokers.clone(), topic.clone());
        c.group_prefix = self.group_prefix.clone();
        c.properties = self.properties.clone();
        Ok(c)
    }
}

/// Where a rebuild seeds from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum From {
    /// The write side's snapshot, then the Kafka tail from the snapshot's time.
    Snapshot,
    /// The whole retained log.
    Earliest,
}

/// Who cuts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CutoverMode {
    /// The rebuild, once the lag is under --cutover-lag.
    Auto,
    /// An engineer, with `projector cutover`.
    Manual,
}

/// The flags of `projector rebuild`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The view to rebuild.
    pub view: String,
    /// The version to build (default: the one a rebuild under way builds, else the next free).
    #[arg(long)]
    pub to_version: Option<i32>,
    /// Where to seed from.
    #[arg(long, value_enum, default_value = "snapshot")]
    pub from: From,
    /// Who switches the stable read name to the new version.
    #[arg(long, value_enum, default_value = "auto")]
    pub cutover: CutoverMode,
    /// Cut over automatically once the total lag is at most this many messages.
    #[arg(long, default_value_t = 100)]
    pub cutover_lag: i64,
    /// The tail starts at the offsets of the snapshot's time minus this (clock skew between
    /// the write side and the producers).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub margin: Duration,
    /// Build --from earliest even when the log no longer starts at every account's first event.
    #[arg(long)]
    pub allow_gaps: bool,
    /// PostgreSQL connections the rebuild may use.
    #[arg(long, default_value_t = 2)]
    pub max_connections: usize,
    /// At most this many messages a second (default: as fast as the connections allow).
    #[arg(long)]
    pub max_rate: Option<u32>,
    /// Messages per batch (larger batches were slower, measured: docs/benchmarks.md).
    #[arg(long, default_value_t = 2_000)]
    pub batch_messages: usize,
    /// Pause the rebuild under way (its process stops consuming until --resume).
    #[arg(long, conflicts_with_all = ["resume", "cancel"])]
    pub pause: bool,
    /// Resume a paused rebuild.
    #[arg(long, conflicts_with = "cancel")]
    pub resume: bool,
    /// Cancel the rebuild under way and drop what it built.
    #[arg(long)]
    pub cancel: bool,
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// Runs `projector rebuild`.
pub async fn run(url: &str, registry: &Registry, args: Args) -> anyhow::Result<()> {
    let pool = projector_engine::db::pool(url, 2)?;
    let mut client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    projector_engine::migrate(&mut client, registry).await?;
    if args.pause || args.resume {
        let version = state::set_paused(&client, &args.view, args.pause).await?;
        let word = if args.pause { "paused" } else { "resumed" };
        println!("{word} the rebuild of {} into v{version}", args.view);
        return Ok(());
    }
    if args.cancel {
        let version = cutover::cancel(&mut client, registry, &args.view).await?;
        println!(
            "cancelled the rebuild of {} into v{version}; its tables, inbox rows and offsets are dropped",
            args.view
        );
        return Ok(());
    }
    drop(client);
    let kafka = args.kafka.config()?;
    let options = Options {
        view: args.view.clone(),
        to_version: args.to_version,
        source: match args.from {
            From::Snapshot => Source::Snapshot,
            From::Earliest => Source::Earliest,
        },
        cutover: match args.cutover {
            CutoverMode::Auto => Cutover::Auto,
            CutoverMode::Manual => Cutover::Manual,
        },
        cutover_lag: args.cutover_lag,
        margin: args.margin,
        allow_gaps: args.allow_gaps,
        connections: args.max_connections,
        max_rate: args.max_rate,
        batch_messages: args.batch_messages,
        ..Options::new(args.view.clone())
    };
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(crate::run::wait_for_signal(shutdown.clone()));
    let display = Display::new();
    let outcome =
        projector_rebuild::rebuild(registry, url, kafka, &options, &display, shutdown).await;
    signals.abort();
    display.finish();
    match outcome? {
        Outcome::CutOver(r) => {
            match r.old {
                Some(old) => println!("{}: v{} is live; v{old} is retired", r.name, r.new),
                None => println!("{}: v{} is live", r.name, r.new),
            }
            if r.accounts_ahead > 0 {
                println!(
                    "{} account(s) were further along in v{} than in the old version: notices for those events were not emitted",
                    r.accounts_ahead, r.new
                );
            }
            report_problems(url, &format!("{}_v{}", r.name, r.new)).await
        }
        Outcome::Stopped { version } => {
            println!(
                "{} v{version}: stopped; run the same command to resume, or `projector cutover {} --to-version {version}`",
                args.view, args.view
            );
            Ok(())
        }
        Outcome::Cancelled { version } => {
            println!("{} v{version}: cancelled", args.view);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Says what a rebuilt version could not apply: never park accounts in silence.
async fn report_problems(url: &str, consumer: &str) -> anyhow::Result<()> {
    let pool = projector_engine::db::pool(url, 1)?;
    let client = pool.get().await?;
    let parked = projector_engine::parked::count(&client, consumer).await?;
    let dead = projector_engine::dead_letters::count_open(&client, consumer).await?;
    if parked > 0 || dead > 0 {
        println!(
            "{consumer}: {parked} parked account(s), {dead} open dead letter(s); see projector.parked_accounts and projector.dead_letters"
        );
    }
    Ok(())
}

/// A progress bar on a terminal, a plain line every five seconds elsewhere.
struct Display {
    bar: Option<ProgressBar>,
    last_line: Mutex<Option<Instant>>,
}

impl Display {
    fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar
        });
        Self {
            bar,
            last_line: Mutex::new(None),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn describe(s: &Status) -> String {
    let lags = s
        .partitions
        .iter()
        .map(|p| format!("p{} {}", p.partition, p.lag()))
        .collect::<Vec<_>>()
        .join(" ");
    let eta = match s.eta() {
        Some(d) => format!("ETA {}", humantime::format_duration(d)),
        None => "ETA -".to_owned(),
    };
    let mut line = format!(
        "applied {}, lag {} ({lags}), {}/s, {eta}",
        s.applied,
        s.lag(),
        s.rate
    );
    if s.parked > 0 || s.dead_letters > 0 {
        line.push_str(&format!(
            ", parked {}, dead letters {}",
            s.parked, s.dead_letters
        ));
    }
    if s.paused {
        line.push_str(", PAUSED");
    }
    line
}

impl Progress for Display {
    fn message(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("rebuild: {line}"),
        }
    }

    fn status(&self, s: &Status) {
        match &self.bar {
            Some(bar) => {
                bar.set_prefix(s.consumer.clone());
                bar.set_length(u64::try_from(s.consumed + s.lag()).unwrap_or(0));
                bar.set_position(u64::try_from(s.consumed).unwrap_or(0));
                bar.set_message(describe(s));
            }
            None => {
                let Ok(mut last) = self.last_line.lock() else {
                    return;
                };
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                    *last = Some(Instant::now());
                    eprintln!("rebuild: {}: {}", s.consumer, describe(s));
                }
            }
        }
    }
}

/// The flags of `projector verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The view.
    pub view: String,
    /// The two versions to compare, e.g. `1,2`.
    #[arg(long, value_delimiter = ',', num_args = 1, required = true)]
    pub versions: Vec<i32>,
    /// The columns to compare (default: every column both versions show).
    #[arg(long, value_delimiter = ',')]
    pub columns: Vec<String>,
}

/// Runs `projector verify`; the result says whether the versions match.
pub async fn run_verify(url: &str, registry: &Registry, args: VerifyArgs) -> anyhow::Result<bool> {
    let [a, b] = args.versions[..] else {
        anyhow::bail!("--versions takes two versions, e.g. --versions 1,2");
    };
    let pool = projector_engine::db::pool(url, 1)?;
    let client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    let r = verify::verify(&client, registry, &args.view, (a, b), &args.columns).await?;
    println!(
        "{} v{a}: {} rows; v{b}: {} rows; compared on {}",
        args.view,
        r.rows.0,
        r.rows.1,
        r.columns.join(", ")
    );
    if r.matches() {
        println!("the versions match");
    } else {
        println!(
            "{} row(s) only in v{a}, {} only in v{b}",
            r.only.0, r.only.1
        );
        for row in &r.first.0 {
            println!("  only in v{a}: {row}");
        }
        for row in &r.first.1 {
            println!("  only in v{b}: {row}");
        }
    }
    Ok(r.matches())
}

/// The flags of `projector cutover`.
#[derive(Debug, clap::Args)]
pub struct CutoverArgs {
    /// The view.
    pub view: String,
    /// The version to make live.
    #[arg(long)]
    pub to_version: i32,
    /// Refuse when the version trails the live one by more than this many messages.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..))]
    pub max_behind: i64,
    /// Cut over however far the version trails the live one.
    #[arg(long)]
    pub force: bool,
}

/// Runs `projector cutover`.
pub async fn run_cutover(url: &str, registry: &Registry, args: CutoverArgs) -> anyhow::Result<()> {
    let pool = projector_engine::db::pool(url, 1)?;
    let mut client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    projector_engine::migrate(&mut client, registry).await?;
    let r = cutover::cutover(
        &mut client,
        registry,
        &args.view,
        args.to_version,
        (!args.force).then_some(args.max_behind),
    )
    .await?;
    match r.old {
        Some(old) => println!("{}: v{} is live; v{old} is retired", r.name, r.new),
        None => println!("{}: v{} is live", r.name, r.new),
    }
    Ok(())
}

/// The flags of `projector retire`.
#[derive(Debug, clap::Args)]
pub struct RetireArgs {
    /// The view.
    pub view: String,
    /// The version to retire.
    #[arg(long)]
    pub version: i32,
    /// Also drop its tables, inbox rows, offsets and dead letters.
    #[arg(long)]
    pub drop: bool,
}

/// Runs `projector retire`.
pub async fn run_retire(url: &str, registry: &Registry, args: RetireArgs) -> anyhow::Result<()> {
    let pool = projector_engine::db::pool(url, 1)?;
    let mut client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    cutover::retire(&mut client, registry, &args.view, args.version, args.drop).await?;
    if args.drop {
        println!("{} v{}: retired and dropped", args.view, args.version);
    } else {
        println!("{} v{}: retired", args.view, args.version);
    }
    Ok(())
}
