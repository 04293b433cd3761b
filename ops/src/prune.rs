//! Inbox retention: whole days of the inbox, dropped once every consumer with rows in them
//! has read the log a window past them, each consumer measured on its own clock.
//!
//! Which consumer may lose what is not decided here: [`super::clock`] says, per consumer, up
//! to when it has read the log (and that a paused rebuild, or a consumer that never committed,
//! has no clock and keeps everything). A day of `projector.inbox` (one partition, the events
//! that occurred that UTC day: `crate::inbox`) goes when, for every consumer with rows in it,
//! the window before that consumer's clock lies past both the day's end and the day's latest
//! late write (`projector.inbox_late_writes`: a row written into a day that had already ended,
//! by a late event or a rebuild replaying old days, lives a whole window too). Today's day and
//! later days never go.
//!
//! How a day goes: `DETACH PARTITION ... CONCURRENTLY`, then `DROP TABLE`, in milliseconds and
//! without a lock the apply path waits for: the detach takes a SHARE UPDATE EXCLUSIVE lock on
//! the inbox, which inserts do not conflict with, and waits for the transactions that could
//! still see the day. Once detached, no insert can land in the day any more, so the rule is
//! judged again on its final rows, under the inbox's DDL lock: a consumer that wrote into the
//! day meanwhile (a late event) keeps it, and the day is attached again. Never one large
//! `DELETE`, which would hold its locks, bloat the table and the WAL, and leave millions of
//! dead rows to vacuum.
//!
//! The inbox before V0009 (`projector.inbox_legacy`, keyed by event id alone, measured by
//! `applied_at`) is emptied in one `TRUNCATE` once every consumer with rows there has its
//! clock a window past its newest row; until then it stays whole.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use deadpool_postgres::{Client, GenericClient};
use projector_engine::SqlFile;

use super::clock::{self, Clock, ConsumerClock};
use super::error::{pg, OpsError};
use super::topic::Retention;
use crate::inbox::{self, Attachment, Partition};

/// The statements of this module (`prune.sql`).
const SQL: SqlFile = SqlFile::new("ops/src/prune.sql", include_str!("prune.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// How retention runs.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Days that ended longer than this before the clock of every consumer with rows in them
    /// go.
    pub older_than: Duration,
    /// The shortest window allowed: the broker's retention plus the time dead letters may
    /// wait to be replayed. An event can be redelivered for that long; its inbox row must
    /// still be there when it is.
    pub min_window: Duration,
}

impl Default for PruneOptions {
    fn default() -> Self {
        Self {
            older_than: DEFAULT_MIN_WINDOW,
            min_window: DEFAULT_MIN_WINDOW,
        }
    }
}

/// Seven days: Kafka's default retention. Raise it by the longest a dead letter may wait
/// before it is replayed.
pub const DEFAULT_MIN_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// A late write is recorded when it happens, within this of when its row commits: the rule
/// reads it this much later than it says, so that a row written at the edge is never early.
const LATE_MARGIN: chrono::Duration = chrono::Duration::minutes(5);

/// What became of one day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DayOutcome {
    /// Detached and dropped, with PostgreSQL's estimate of its rows and its size.
    Dropped {
        /// `reltuples` before the drop.
        rows_estimate: i64,
        /// Bytes, indexes included.
        bytes: i64,
        /// How long the detach and the drop took.
        took: Duration,
    },
    /// Kept, and why, in one line.
    Kept(String),
}

/// One day of the inbox and what a run did with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayPrune {
    /// The day.
    pub day: NaiveDate,
    /// What became of it.
    pub outcome: DayOutcome,
}

/// What became of the inbox before V0009.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegacyOutcome {
    /// It holds no row.
    Empty,
    /// Emptied, with the rows it held.
    Emptied(i64),
    /// Kept whole, and why.
    Kept(String),
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Every consumer the run was given, with its clock and the moment before which its rows
    /// may go (`None`: none may).
    pub consumers: Vec<ConsumerPrune>,
    /// Every day that has ended, oldest first.
    pub days: Vec<DayPrune>,
    /// The inbox before V0009.
    pub legacy: LegacyOutcome,
}

impl PruneReport {
    /// The days dropped.
    pub fn dropped(&self) -> impl Iterator<Item = &DayPrune> {
        self.days
            .iter()
            .filter(|d| matches!(d.outcome, DayOutcome::Dropped { .. }))
    }
}

/// One consumer's clock in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerPrune {
    /// The consumer.
    pub consumer: String,
    /// Its clock when the run started.
    pub clock: Clock,
    /// Its rows that occurred (for the inbox before V0009: were applied) before this may go;
    /// `None`: none may (no clock, or a rebuild of it was paused while the run went on).
    /// Fixed when the run starts.
    pub cutoff: Option<DateTime<Utc>>,
}

/// Refuses a window shorter than the minimum, in one line.
pub fn check_window(options: &PruneOptions) -> Result<(), OpsError> {
    if options.older_than < options.min_window {
        return Err(OpsError::Refused(format!(
            "refusing to prune the inbox younger than {}: the minimum window is {} (broker \
             retention plus dead-letter replay time); an event redelivered after its inbox row \
             is gone would be applied again",
            humanize(options.older_than),
            humanize(options.min_window)
        )));
    }
    Ok(())
}

/// Refuses a window no longer than the time the brokers keep `topic`'s messages, in one
/// line: a copy of an event can be read for as long as the log holds it.
pub fn check_retention(
    older_than: Duration,
    topic: &str,
    retention: Retention,
) -> Result<(), OpsError> {
    match retention {
        Retention::For(kept) if older_than < kept => Err(OpsError::Refused(format!(
            "refusing to prune the inbox younger than {}: topic {topic} keeps its messages for \
             {} (retention.ms), and the window must be at least that plus the dead-letter \
             replay time; an event redelivered after its inbox row is gone would be applied \
             again",
            humanize(older_than),
            humanize(kept)
        ))),
        Retention::For(_) => Ok(()),
        Retention::Forever => Err(OpsError::Refused(format!(
            "refusing to prune the inbox: topic {topic} keeps its messages for ever \
             (retention.ms -1), so a copy of any event can still be read; give the topic a \
             retention.ms and prune with a window of at least that plus the dead-letter \
             replay time"
        ))),
    }
}

/// `7d`, `36h`, `90m`, `45s`: the largest unit that divides the duration.
pub fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s % 86_400 == 0 {
        format!("{}d", s / 86_400)
    } else if s > 0 && s % 3600 == 0 {
        format!("{}h", s / 3600)
    } else if s > 0 && s % 60 == 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// The consumers with rows in one table of the inbox (a day, or the inbox before V0009):
/// its key leads with the consumer, walked one consumer at a time (an index probe each,
/// however many rows a consumer has). Inline: it names the table.
fn consumers_in(table: &str) -> String {
    format!(
        "WITH RECURSIVE c(consumer) AS ( \
             (SELECT consumer FROM projector.{table} ORDER BY consumer LIMIT 1) \
             UNION ALL \
             SELECT (SELECT t.consumer FROM projector.{table} t WHERE t.consumer > c.consumer \
                     ORDER BY t.consumer LIMIT 1) \
             FROM c WHERE c.consumer IS NOT NULL) \
         SELECT consumer::text FROM c WHERE consumer IS NOT NULL"
    )
}

/// Why a day (or the inbox before V0009) must stay, if it must: a consumer with rows in it
/// whose cutoff is not at or past `need`. `None`: every consumer with rows lets it go.
fn must_keep(
    consumers: &[String],
    cutoffs: &BTreeMap<String, Option<DateTime<Utc>>>,
    clocks: &BTreeMap<String, Clock>,
    paused: &BTreeSet<String>,
    need: DateTime<Utc>,
    window: chrono::Duration,
) -> Option<String> {
    for c in consumers {
        if paused.contains(c) {
            return Some(format!("kept for {c}: a rebuild of it is paused"));
        }
        match (cutoffs.get(c), clocks.get(c)) {
            (None, _) | (_, None) => {
                return Some(format!(
                    "kept for {c}: it wrote rows here after this run read the consumers' clocks"
                ))
            }
            (Some(None), Some(clock)) => {
                return Some(format!("kept for {c}: {}", clock.describe()))
            }
            (Some(Some(cutoff)), Some(clock)) if *cutoff < need => {
                return Some(format!(
                    "kept for {c}: its {}, and rows up to {} stay for {} after it",
                    clock.describe(),
                    need.format("%Y-%m-%d %H:%M:%SZ"),
                    humanize(window.to_std().unwrap_or_default()),
                ))
            }
            _ => {}
        }
    }
    None
}

/// The rows of one day must stay until every consumer's cutoff is past this: the day's end,
/// or its latest late write (plus [`LATE_MARGIN`]) if later.
async fn need_of(client: &impl GenericClient, day: NaiveDate) -> Result<DateTime<Utc>, OpsError> {
    let late: Option<DateTime<Utc>> = client
        .query_one(statement("latest_late_write"), &[&day])
        .await
        .map_err(pg("reading the inbox's late writes"))?
        .get(0);
    let end = inbox::bounds(day).1;
    Ok(late.map_or(end, |l| end.max(l + LATE_MARGIN)))
}

/// Drops the days of the inbox that every consumer with rows in them has left a window
/// behind on its own clock (`clocks`, read by the caller before the run), oldest first,
/// calling `progress` after each day it judged, then empties the inbox before V0009 when it
/// may. Before each day the paused rebuilds are read again: a consumer paused meanwhile keeps
/// its days.
pub async fn prune_inbox(
    client: &mut Client,
    options: &PruneOptions,
    clocks: &[ConsumerClock],
    mut progress: impl FnMut(&DayPrune),
) -> Result<PruneReport, OpsError> {
    check_window(options)?;
    let window = chrono::Duration::from_std(options.older_than)
        .map_err(|_| OpsError::Refused("the window is too long".to_owned()))?;
    let consumers: Vec<ConsumerPrune> = clocks
        .iter()
        .map(|c| ConsumerPrune {
            consumer: c.consumer.clone(),
            clock: c.clock.clone(),
            cutoff: c.clock.cutoff(window),
        })
        .collect();
    let cutoffs: BTreeMap<String, Option<DateTime<Utc>>> = consumers
        .iter()
        .map(|c| (c.consumer.clone(), c.cutoff))
        .collect();
    let by_name: BTreeMap<String, Clock> = clocks
        .iter()
        .map(|c| (c.consumer.clone(), c.clock.clone()))
        .collect();
    // A detach waits for every transaction that holds a lock on the inbox (a batch: a moment;
    // a report or a dump: as long as it runs); interrupted by a statement timeout it would
    // leave the day detach-pending. Retention is an operator's command: it waits.
    client
        .batch_execute(statement("no_statement_timeout"))
        .await
        .map_err(pg("lifting the statement timeout for the prune"))?;
    let now: DateTime<Utc> = client
        .query_one(statement("now"), &[])
        .await
        .map_err(pg("reading the server's clock"))?
        .get(0);
    let today = inbox::day_of(now);
    let mut days = Vec::new();
    for partition in inbox::partitions(&*client)
        .await
        .map_err(pg("listing the inbox's days"))?
    {
        if partition.day >= today {
            continue;
        }
        // A day younger than the window on the server's own clock stays, rows or not: an
        // empty yesterday would otherwise go at once, and be made again by the first late
        // event.
        let outcome = if inbox::bounds(partition.day).1 > now - window {
            DayOutcome::Kept(format!(
                "younger than the window: it ended less than {} ago",
                humanize(options.older_than)
            ))
        } else {
            let paused = clock::paused(client).await?;
            prune_day(client, &partition, &cutoffs, &by_name, &paused, window).await?
        };
        let done = DayPrune {
            day: partition.day,
            outcome,
        };
        progress(&done);
        days.push(done);
    }
    let paused = clock::paused(client).await?;
    let legacy = prune_legacy(client, &cutoffs, &by_name, &paused, window).await?;
    Ok(PruneReport {
        consumers,
        days,
        legacy,
    })
}

/// Judges one day and drops it when the rule lets it go (see the module documentation).
async fn prune_day(
    client: &mut Client,
    partition: &Partition,
    cutoffs: &BTreeMap<String, Option<DateTime<Utc>>>,
    clocks: &BTreeMap<String, Clock>,
    paused: &BTreeSet<String>,
    window: chrono::Duration,
) -> Result<DayOutcome, OpsError> {
    let day = partition.day;
    let name = inbox::partition_name(day);
    let judge =
        |consumers: Vec<String>, need| must_keep(&consumers, cutoffs, clocks, paused, need, window);
    let consumers: Vec<String> = client
        .query(&consumers_in(&name), &[])
        .await
        .map_err(pg(
            "reading which consumers have rows in a day of the inbox",
        ))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let need = need_of(&*client, day).await?;
    if let Some(reason) = judge(consumers, need) {
        if partition.attachment != Attachment::Attached {
            // A drop that stopped half-way decided on rows it could no longer see: attached
            // again, the next run decides afresh.
            let tx = client
                .transaction()
                .await
                .map_err(pg("reattaching a day"))?;
            tx.execute(statement("ddl_lock"), &[&inbox::DDL_LOCK])
                .await
                .map_err(pg("taking the inbox's DDL lock"))?;
            inbox::attach_again(&tx, day)
                .await
                .map_err(pg("attaching a day of the inbox again"))?;
            tx.commit()
                .await
                .map_err(pg("attaching a day of the inbox again"))?;
        }
        return Ok(DayOutcome::Kept(reason));
    }
    let started = std::time::Instant::now();
    match partition.attachment {
        Attachment::Attached => {
            // Outside any transaction, by PostgreSQL's rule for CONCURRENTLY. Inline: it
            // names the day's table.
            let detached = client
                .batch_execute(&format!(
                    "ALTER TABLE projector.inbox DETACH PARTITION projector.{name} CONCURRENTLY"
                ))
                .await;
            if let Err(e) = detached {
                // While the detach waited for older transactions, a batch that needed the day
                // may have finished it (`Days::make`: `DETACH ... FINALIZE`, then `ATTACH`), and
                // this one found nothing left to finish: the catalog says what became of the day.
                let now = inbox::partitions(&*client)
                    .await
                    .map_err(pg("listing the inbox's days"))?
                    .into_iter()
                    .find(|p| p.day == day)
                    .map(|p| p.attachment);
                match now {
                    Some(Attachment::Attached) => {
                        return Ok(DayOutcome::Kept(
                            "attached again by a batch that needed its day while it was being \
                             detached; the next run decides again"
                                .to_owned(),
                        ))
                    }
                    None => {
                        return Ok(DayOutcome::Kept(
                            "gone already: another prune dropped it".to_owned(),
                        ))
                    }
                    // Detached by the batch's FINALIZE, not attached again (yet): judged below.
                    Some(Attachment::Detached) => {}
                    Some(Attachment::DetachPending) => {
                        return Err(pg("detaching a day of the inbox")(e))
                    }
                }
            }
        }
        Attachment::DetachPending => {
            inbox::finalize_detach(&*client, day)
                .await
                .map_err(pg("finishing the detach of a day of the inbox"))?;
        }
        Attachment::Detached => {}
    }
    // Detached: no insert lands in it any more. Its rows are final; judge them again, under
    // the DDL lock, so that no batch attaches the day again in between.
    let tx = client.transaction().await.map_err(pg("dropping a day"))?;
    tx.execute(statement("ddl_lock"), &[&inbox::DDL_LOCK])
        .await
        .map_err(pg("taking the inbox's DDL lock"))?;
    let attached = inbox::partitions(&tx)
        .await
        .map_err(pg("listing the inbox's days"))?
        .into_iter()
        .find(|p| p.day == day)
        .map(|p| p.attachment);
    match attached {
        None => {
            tx.commit().await.map_err(pg("dropping a day"))?;
            return Ok(DayOutcome::Kept(
                "gone already: another prune dropped it".to_owned(),
            ));
        }
        Some(Attachment::Attached) => {
            tx.commit().await.map_err(pg("dropping a day"))?;
            return Ok(DayOutcome::Kept(
                "attached again by a batch that needed its day; the next run decides again"
                    .to_owned(),
            ));
        }
        Some(_) => {}
    }
    let consumers: Vec<String> = tx
        .query(&consumers_in(&name), &[])
        .await
        .map_err(pg(
            "reading which consumers have rows in a day of the inbox",
        ))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let need = need_of(&tx, day).await?;
    if let Some(reason) = judge(consumers, need) {
        inbox::attach_again(&tx, day)
            .await
            .map_err(pg("attaching a day of the inbox again"))?;
        tx.commit()
            .await
            .map_err(pg("attaching a day of the inbox again"))?;
        return Ok(DayOutcome::Kept(format!(
            "{reason} (written while it was detached; attached again)"
        )));
    }
    // Inline: it names the day's table.
    tx.batch_execute(&format!("DROP TABLE projector.{name}"))
        .await
        .map_err(pg("dropping a day of the inbox"))?;
    tx.execute(statement("forget_late_writes"), &[&day])
        .await
        .map_err(pg("forgetting a dropped day's late writes"))?;
    inbox::retain_from_after(&tx, day)
        .await
        .map_err(pg("moving the retained window past a dropped day"))?;
    tx.commit().await.map_err(pg("dropping a day"))?;
    Ok(DayOutcome::Dropped {
        rows_estimate: partition.rows_estimate,
        bytes: partition.bytes,
        took: started.elapsed(),
    })
}

/// Empties the inbox before V0009 when every consumer with rows there has its cutoff past the
/// table's newest row.
async fn prune_legacy(
    client: &mut Client,
    cutoffs: &BTreeMap<String, Option<DateTime<Utc>>>,
    clocks: &BTreeMap<String, Clock>,
    paused: &BTreeSet<String>,
    window: chrono::Duration,
) -> Result<LegacyOutcome, OpsError> {
    let newest: Option<DateTime<Utc>> = client
        .query_one(statement("legacy_newest"), &[])
        .await
        .map_err(pg("reading the inbox before V0009"))?
        .get(0);
    let Some(newest) = newest else {
        return Ok(LegacyOutcome::Empty);
    };
    let consumers: Vec<String> = client
        .query(&consumers_in("inbox_legacy"), &[])
        .await
        .map_err(pg(
            "reading which consumers have rows in the inbox before V0009",
        ))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if let Some(reason) = must_keep(&consumers, cutoffs, clocks, paused, newest, window) {
        return Ok(LegacyOutcome::Kept(reason));
    }
    let rows: i64 = client
        .query_one(statement("legacy_rows"), &[])
        .await
        .map_err(pg("reading the inbox before V0009"))?
        .get(0);
    // A statement that still looks rows up there (a consumer's, until its process restarts)
    // holds the table for a moment: a short lock wait, a few tries, never a queue the apply
    // path waits behind for long.
    let mut tries = 0;
    loop {
        let tx = client
            .transaction()
            .await
            .map_err(pg("emptying the inbox before V0009"))?;
        tx.batch_execute(statement("short_lock_timeout"))
            .await
            .map_err(pg("emptying the inbox before V0009"))?;
        match tx.batch_execute(statement("empty_legacy")).await {
            Ok(()) => {
                tx.commit()
                    .await
                    .map_err(pg("emptying the inbox before V0009"))?;
                return Ok(LegacyOutcome::Emptied(rows));
            }
            Err(e)
                if tries < 20
                    && e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
            {
                tries += 1;
                drop(tx);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(pg("emptying the inbox before V0009")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "no_statement_timeout",
            "now",
            "ddl_lock",
            "latest_late_write",
            "forget_late_writes",
            "legacy_newest",
            "legacy_rows",
            "short_lock_timeout",
            "empty_legacy",
        ] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_window_below_the_topics_retention_is_refused_in_one_line() {
        let e = check_retention(7 * DAY, "fills", Retention::For(14 * DAY))
            .expect_err("7d under a retention of 14d");
        let text = e.to_string();
        assert!(
            text.contains("younger than 7d")
                && text.contains("topic fills keeps its messages for 14d (retention.ms)")
                && !text.contains('\n'),
            "{text}"
        );
        assert!(check_retention(14 * DAY, "fills", Retention::For(14 * DAY)).is_ok());
        assert!(check_retention(30 * DAY, "fills", Retention::For(14 * DAY)).is_ok());
        let e = check_retention(365 * DAY, "fills", Retention::Forever)
            .expect_err("no window is longer than for ever");
        assert!(e.to_string().contains("retention.ms -1"), "{e}");
    }
}
