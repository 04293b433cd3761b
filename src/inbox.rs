//! `projector inbox prune`: inbox retention, in batches through the time index, refusing a
//! window shorter than the configured minimum.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use projector_engine::ops::prune::{humanize, prune_inbox, PruneOptions, DEFAULT_MIN_WINDOW};

use crate::config::{parse_duration, File};

/// `projector inbox ...`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Delete inbox rows older than a window, in batches, until none are left.
    Prune(PruneArgs),
}

/// The flags of `projector inbox prune`.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Delete rows applied longer ago than this (`7d`, `30d`).
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
    /// The TOML configuration file of `projector run` (for `[inbox] min_window`).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

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
    let url = database_url
        .or(file.database_url.clone())
        .unwrap_or_else(|| crate::config::DEFAULT_DATABASE_URL.to_owned());
    let pool = projector_engine::db::pool(&url, 1)?;
    let client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    let mut last = Instant::now();
    let report = prune_inbox(&client, &options, |p| {
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
    println!(
        "pruned {} inbox row(s) applied before {} (older than {}) in {} batch(es) of at most {}",
        report.deleted,
        report.cutoff.format("%Y-%m-%d %H:%M:%SZ"),
        humanize(options.older_than),
        report.batches,
        options.batch
    );
    Ok(())
}
