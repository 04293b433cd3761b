//! `projector status`: every view version's state, lag, throughput, duplicates, dead
//! letters, parked accounts and the inbox, as a table that fits a terminal or as stable
//! JSON (`--json`, documented in docs/operations.md). Exits 1 when the health rule finds a
//! problem that pages: the same rule, the same code, as `projector run`'s `/health`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use projector_engine::kafka::log::{LogReader, Reading};
use projector_engine::versions::VersionState;
use projector_ops::health::human_seconds;
use projector_ops::status::{nonzero, Status, VersionStatus};
use projector_ops::{collect, HealthRule, Severity, StatusOptions};

use crate::config::{kafka_config, parse_duration, parse_property, stall_after, File};

/// The flags of `projector status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the stable JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub brokers: Option<String>,
    /// The topic of events.
    #[arg(long, env = "PROJECTOR_TOPIC")]
    pub topic: Option<String>,
    /// The TOML configuration file of `projector run`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A librdkafka property, repeatable: `-X security.protocol=SASL_SSL`.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,
    /// Comma-separated view names to show (default: every view).
    #[arg(long, value_delimiter = ',')]
    pub views: Vec<String>,
    /// The health rule: a live view's partition that has not committed for this long while
    /// its oldest waiting message is at least this old is stalled. [default: 2m]
    #[arg(long, value_parser = parse_duration)]
    pub stall_after: Option<Duration>,
    /// Measure throughput over this long; 0s to skip.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub sample: Duration,
    /// Parked accounts listed per version, oldest first.
    #[arg(long, default_value_t = 5)]
    pub parked: i64,
    /// List every partition (default: only those lagging, stalled or behind retention).
    #[arg(long)]
    pub partitions: bool,
}

/// Prints the status; `Ok(false)` when it is unhealthy.
pub async fn run(args: Args, database_url: Option<String>) -> anyhow::Result<bool> {
    let file = File::load_opt(args.config.as_deref())?;
    let kafka = kafka_config(args.brokers, args.topic, None, args.properties, &file)?;
    let url = database_url
        .or(file.database_url.clone())
        .unwrap_or_else(|| crate::config::DEFAULT_DATABASE_URL.to_owned());
    let pool = projector_engine::db::pool(&url, 2)?;
    let probe = Arc::new(
        LogReader::connect(&kafka, Duration::from_secs(5), Reading::Samples)
            .context("cannot create a Kafka client")?,
    );
    let options = StatusOptions {
        names: args.views,
        rule: HealthRule {
            stall_after: stall_after(args.stall_after, &file)?,
            ..HealthRule::default()
        },
        parked_limit: args.parked,
        sample: (!args.sample.is_zero()).then_some(args.sample),
        local: None,
    };
    let status = collect(&pool, &probe, &options).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", render(&status, args.partitions));
    }
    Ok(status.healthy)
}

/// The table: one line per version, then what needs attention. At most 80 columns for
/// version names up to 16 characters.
pub fn render(status: &Status, all_partitions: bool) -> String {
    let mut out = String::new();
    let verdict = if status.healthy {
        "HEALTHY"
    } else {
        "UNHEALTHY"
    };
    let kafka = match (status.kafka.reachable, status.kafka.partitions) {
        (true, Some(n)) => format!("{} ({n} partitions)", status.kafka.topic),
        _ => format!("{} (kafka unreachable)", status.kafka.topic),
    };
    let _ = writeln!(out, "{verdict}  {}  topic {kafka}", time(status.taken_at));
    if !status.views.is_empty() {
        let width = status
            .views
            .iter()
            .map(|v| v.consumer.len())
            .max()
            .unwrap_or(7)
            .max(7);
        let _ = writeln!(
            out,
            "{:width$}  {:8}  {:>8}  {:>6}  {:>6}  {:>7}  {:>5}  {:>4}  {:>6}",
            "VERSION", "STATE", "LAG", "AGE", "MSG/S", "APPLIED", "DUPS", "DEAD", "PARKED"
        );
        for v in &status.views {
            let _ = writeln!(out, "{}", version_line(v, width));
        }
    }
    if let Some(inbox) = &status.inbox {
        let rows = inbox
            .rows_estimate
            .map_or("? rows".to_owned(), |n| format!("~{} rows", compact(n)));
        let oldest = inbox.oldest_age_seconds.map_or("empty".to_owned(), |s| {
            format!("oldest {}", human_seconds(s))
        });
        let days = match (inbox.days, inbox.oldest_day, inbox.partitions_until) {
            (0, _, _) => "no days".to_owned(),
            (n, Some(first), Some(until)) => format!(
                "{n} day(s) from {first} to {}",
                (until - chrono::Duration::days(1)).format("%Y-%m-%d")
            ),
            (n, _, _) => format!("{n} day(s)"),
        };
        let legacy = if inbox.legacy_rows_estimate > 0 {
            format!(
                ", ~{} rows from before V0009",
                compact(inbox.legacy_rows_estimate)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "inbox  {rows}, {}, {oldest}, {days}{legacy}",
            bytes(inbox.bytes)
        );
    }
    let lagging: Vec<String> = status
        .views
        .iter()
        .flat_map(|v| {
            v.partitions
                .iter()
                .filter(move |p| {
                    all_partitions
                        || p.stalled
                        || p.lag_messages.unwrap_or(0) > 0
                        || matches!((p.next_offset, p.low_watermark), (Some(n), Some(l)) if n < l)
                })
                .map(move |p| {
                    let commit = p.last_commit_at.map_or("never committed".to_owned(), |t| {
                        format!(
                            "committed {} ago{}",
                            human_seconds((status.taken_at - t).num_seconds()),
                            p.committed_by
                                .as_ref()
                                .map_or(String::new(), |b| format!(" by {b}"))
                        )
                    });
                    format!(
                        "  {} p{}  next {}  end {}  lag {} / {}  {commit}{}",
                        v.consumer,
                        p.partition,
                        opt(p.next_offset),
                        opt(p.high_watermark),
                        opt(p.lag_messages),
                        p.lag_seconds.map_or("?".to_owned(), human_seconds),
                        if p.stalled { "  STALLED" } else { "" }
                    )
                })
        })
        .collect();
    if !lagging.is_empty() {
        let _ = writeln!(out, "partitions");
        for l in lagging {
            let _ = writeln!(out, "{l}");
        }
    }
    let details: Vec<String> = status
        .views
        .iter()
        .filter(|v| v.state != VersionState::Retired)
        .flat_map(|v| {
            let mut lines = Vec::new();
            let d = &v.counters.duplicates;
            if d.total > 0 {
                let mut kinds = vec![
                    ("seq", d.seq),
                    ("watermark", d.watermark),
                    ("inbox", d.inbox),
                    ("version_filter", d.version_filter),
                    ("unattributed", d.unattributed),
                ];
                kinds.retain(|(_, n)| *n > 0);
                let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
                lines.push(format!("  {} duplicates: {}", v.consumer, kinds.join(", ")));
            }
            if v.dead_letters.total > 0 {
                lines.push(format!(
                    "  {} dead letters: {} open ({}), {} in all",
                    v.consumer,
                    v.dead_letters.open,
                    nonzero(&v.dead_letters.open_by_kind),
                    v.dead_letters.total
                ));
            }
            for k in &v.parked.oldest {
                lines.push(format!(
                    "  {} account {} parked ({}) at seq {} for {}: {}",
                    v.consumer,
                    k.account_id,
                    k.reason,
                    k.blocked_seq,
                    human_seconds((status.taken_at - k.parked_at).num_seconds()),
                    k.detail
                ));
            }
            if v.parked.total > i64::try_from(v.parked.oldest.len()).unwrap_or(0) {
                lines.push(format!(
                    "  {} ... {} parked in all ({})",
                    v.consumer,
                    v.parked.total,
                    nonzero(&v.parked.by_reason)
                ));
            }
            lines
        })
        .collect();
    // Which process does what with which version: a version nobody consumes is named here
    // with the reason, instead of looking idle.
    let fresh: Vec<_> = status.processes.iter().filter(|p| p.fresh).collect();
    if !fresh.is_empty() {
        let _ = writeln!(out, "processes");
        for p in fresh {
            let views: Vec<String> = p
                .views
                .iter()
                .map(|v| match (v.state.as_str(), &v.detail) {
                    ("consuming", _) => v.consumer.clone(),
                    (state, Some(detail)) => format!("{} {state} ({detail})", v.consumer),
                    (state, None) => format!("{} {state}", v.consumer),
                })
                .collect();
            let _ = writeln!(
                out,
                "  {}  up {}  {}",
                p.instance,
                human_seconds((status.taken_at - p.started_at).num_seconds()),
                if views.is_empty() {
                    "serves nothing".to_owned()
                } else {
                    views.join(", ")
                }
            );
        }
    }
    if !details.is_empty() {
        let _ = writeln!(out, "details");
        for l in details {
            let _ = writeln!(out, "{l}");
        }
    }
    if !status.problems.is_empty() {
        let _ = writeln!(out, "problems");
        for p in &status.problems {
            let severity = match p.severity {
                Severity::Page => "PAGE",
                Severity::Warn => "warn",
            };
            let _ = writeln!(out, "  {severity} {}", p.message);
        }
    }
    out
}

fn version_line(v: &VersionStatus, width: usize) -> String {
    let state = match &v.rebuild {
        Some(r) if r.paused => "paused".to_owned(),
        _ if v.dropped => "dropped".to_owned(),
        _ => v.state.as_str().to_owned(),
    };
    let (lag, age) = match v.lag {
        Some(l) => (
            compact(l.messages),
            l.seconds.map_or("?".to_owned(), human_seconds),
        ),
        None => ("-".to_owned(), "-".to_owned()),
    };
    let rate = v
        .throughput
        .map_or("-".to_owned(), |t| compact(t.messages_per_second));
    let mark = if v.healthy { "" } else { "  !" };
    format!(
        "{:width$}  {:8}  {:>8}  {:>6}  {:>6}  {:>7}  {:>5}  {:>4}  {:>6}{mark}",
        v.consumer,
        state,
        lag,
        age,
        rate,
        compact(v.counters.applied),
        compact(v.counters.duplicates.total),
        compact(v.dead_letters.open),
        compact(v.parked.total),
    )
}

fn opt(n: Option<i64>) -> String {
    n.map_or("?".to_owned(), |n| n.to_string())
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// 1234567 as `1.2M`: integers only.
pub fn compact(n: i64) -> String {
    let a = n.unsigned_abs();
    let sign = if n < 0 { "-" } else { "" };
    let (unit, div) = match a {
        0..=9_999 => return n.to_string(),
        10_000..=999_999 => ("k", 1_000),
        1_000_000..=999_999_999 => ("M", 1_000_000),
        _ => ("G", 1_000_000_000),
    };
    let whole = a / div;
    let tenth = (a % div) / (div / 10);
    if whole >= 100 {
        format!("{sign}{whole}{unit}")
    } else {
        format!("{sign}{whole}.{tenth}{unit}")
    }
}

fn bytes(n: i64) -> String {
    let a = n.max(0);
    match a {
        0..=1_048_575 => format!("{} KiB", a / 1024),
        1_048_576..=1_073_741_823 => format!("{} MiB", a / 1_048_576),
        _ => format!("{} GiB", a / 1_073_741_824),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_compact() {
        assert_eq!(compact(0), "0");
        assert_eq!(compact(9_999), "9999");
        assert_eq!(compact(12_345), "12.3k");
        assert_eq!(compact(1_250_000), "1.2M");
        assert_eq!(compact(350_000_000), "350M");
        assert_eq!(compact(-12_345), "-12.3k");
        assert_eq!(bytes(3 * 1_048_576), "3 MiB");
    }
}
