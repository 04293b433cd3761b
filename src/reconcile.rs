//! `projector reconcile VIEW --source SQL --window 5m`: the write side's counts and sums
//! against the view's, per time window; exits 1 naming the windows that differ by more than
//! the threshold. The contract of the two queries is in docs/operations.md.

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use chrono::{DateTime, Utc};
use projector_engine::Registry;
use projector_ops::reconcile::{parse_threshold, reconcile, ReconcileSpec};

use crate::config::parse_duration;

/// The flags of `projector reconcile`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The view.
    pub view: String,
    /// The write side's query: a column `at` and measure columns (integer or numeric).
    #[arg(long)]
    pub source: String,
    /// The write side's database (default: --database-url).
    #[arg(long, env = "PROJECTOR_SOURCE_URL", hide_env_values = true)]
    pub source_url: Option<String>,
    /// The view side's query, same contract (default: the view's own, for the views that
    /// have one: eod).
    #[arg(long)]
    pub view_sql: Option<String>,
    /// Read this version's table instead of the stable read name (the live version).
    #[arg(long)]
    pub version: Option<i32>,
    /// The window length.
    #[arg(long, value_parser = parse_duration)]
    pub window: Duration,
    /// From this time (RFC 3339) or this long ago.
    #[arg(long, default_value = "1d")]
    pub since: String,
    /// To this time (RFC 3339) or this long ago: leave the views time to catch up.
    #[arg(long, default_value = "1m")]
    pub until: String,
    /// The largest difference tolerated, relative to the source: `0.001` or `0.1%`.
    #[arg(long, default_value = "0.1%")]
    pub threshold: String,
}

/// A built-in view's side of the comparison, and the time grain of its rows.
fn builtin(view: &str, table: &str) -> Option<(String, Duration)> {
    match view {
        // Per account and UTC trading day; `at` is the day's midnight UTC.
        "eod" => Some((
            projector_views::Eod::reconcile_sql(table),
            Duration::from_secs(86_400),
        )),
        _ => None,
    }
}

fn time_arg(text: &str, now: DateTime<Utc>, flag: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text.trim()) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(text).map_err(|_| {
        anyhow!("{flag}: expected an RFC 3339 time or a duration ago (such as 1d), got {text:?}")
    })?;
    Ok(now - chrono::Duration::from_std(ago).context("too long ago")?)
}

/// Compares; `Ok(false)` when a window differs.
pub async fn run(args: Args, database_url: &str, registry: &Registry) -> anyhow::Result<bool> {
    registry.select(std::slice::from_ref(&args.view))?;
    let table = match args.version {
        Some(v) => format!("{}_v{v}", args.view),
        None => args.view.clone(),
    };
    let view_sql = match (&args.view_sql, builtin(&args.view, &table)) {
        (Some(sql), _) => sql.clone(),
        (None, Some((sql, grain))) => {
            if args.window.as_secs() % grain.as_secs() != 0 {
                bail!(
                    "{} keeps one row per {}: --window must be a multiple of it (or pass --view-sql)",
                    args.view,
                    humantime::format_duration(grain)
                );
            }
            sql
        }
        (None, None) => bail!(
            "{} has no built-in side for reconcile (it holds state, not flows per time): pass \
             --view-sql; see docs/operations.md",
            args.view
        ),
    };
    let now = Utc::now();
    let spec = ReconcileSpec {
        source_sql: args.source.clone(),
        view_sql,
        window: args.window,
        since: time_arg(&args.since, now, "--since")?,
        until: time_arg(&args.until, now, "--until")?,
        threshold: parse_threshold(&args.threshold)?,
    };
    let view_pool = projector_engine::db::pool(database_url, 1)?;
    let mut view = view_pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    let source_pool = match &args.source_url {
        Some(url) => {
            crate::logging::redact_url(url);
            projector_engine::db::pool(url, 1)?
        }
        None => projector_engine::db::pool(database_url, 1)?,
    };
    let mut source = source_pool
        .get()
        .await
        .context("cannot connect to the source database")?;
    let report = reconcile(&mut source, &mut view, &spec).await?;
    println!(
        "reconcile {}: {} window(s) of {} from {} to {} ({} with rows), measures {}, threshold {}",
        args.view,
        report.windows,
        humantime::format_duration(args.window),
        report.from.format("%Y-%m-%dT%H:%M:%SZ"),
        report.to.format("%Y-%m-%dT%H:%M:%SZ"),
        report.windows_with_data,
        report.measures.join(", "),
        args.threshold
    );
    for w in &report.differing {
        for m in &w.measures {
            println!(
                "DIFFERS {} .. {}  {}: source {}, view {}{}",
                w.start.format("%Y-%m-%dT%H:%M:%SZ"),
                w.end.format("%Y-%m-%dT%H:%M:%SZ"),
                m.measure,
                m.source,
                m.view,
                m.relative
                    .as_ref()
                    .map_or(" (the source has none)".to_owned(), |r| format!(
                        " (off by {r} of the source)"
                    ))
            );
        }
    }
    if report.differing.is_empty() {
        println!("every window matches");
        Ok(true)
    } else {
        println!(
            "{} of {} window(s) differ beyond the threshold",
            report.differing.len(),
            report.windows
        );
        Ok(false)
    }
}
