//! Inbox retention: rows older than a window, measured on each consumer's own clock, are
//! deleted in small batches through the index on `applied_at`, with a short pause between
//! batches, until none are left.
//!
//! Which rows may go is not decided here: [`super::clock`] says, per consumer, up to when it
//! has read the log (and that a paused rebuild, or a consumer that never committed, has no
//! clock and keeps everything); a row goes when it was applied longer than the window before
//! its consumer's clock. This module only deletes.
//!
//! Never one large `DELETE`: one statement over millions of rows is one long transaction
//! that holds its row locks, bloats the table and the WAL at once, and keeps vacuum from
//! reclaiming anything until it ends. A batch is a transaction of its own (a few thousand
//! rows, milliseconds), so the apply path, which inserts new inbox rows all the while, never
//! waits for retention for longer than one batch.
//!
//! The inbox is not partitioned by `applied_at` on purpose: a partitioned table's primary
//! key must contain the partition key, so the key would become `(consumer, event_id,
//! applied_at)`; `applied_at` is `now()` at insert, different for every redelivery, so the
//! redelivered event would never conflict with its first row and would be applied again.
//! Deduplication would stop in silence (docs/operations.md).

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Client;

use super::clock::{self, Clock, ConsumerClock};
use super::error::{pg, OpsError};
use super::topic::Retention;

/// How retention runs.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Rows applied longer than this before their consumer's clock go.
    pub older_than: Duration,
    /// The shortest window allowed: the broker's retention plus the time dead letters may
    /// wait to be replayed. An event can be redelivered for that long; its inbox row must
    /// still be there when it is.
    pub min_window: Duration,
    /// Rows deleted per batch.
    pub batch: i64,
    /// The pause between batches: room for the apply path and for replication to keep up.
    pub pause: Duration,
}

impl Default for PruneOptions {
    fn default() -> Self {
        Self {
            older_than: DEFAULT_MIN_WINDOW,
            min_window: DEFAULT_MIN_WINDOW,
            batch: 10_000,
            pause: Duration::from_millis(20),
        }
    }
}

/// Seven days: Kafka's default retention. Raise it by the longest a dead letter may wait
/// before it is replayed.
pub const DEFAULT_MIN_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// One batch done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneProgress {
    /// Batches so far, this one included.
    pub batches: u64,
    /// Rows this batch deleted.
    pub deleted: u64,
    /// Rows deleted so far.
    pub total: u64,
    /// The newest `applied_at` this batch deleted.
    pub reached: Option<DateTime<Utc>>,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Every consumer the run was given, in the order given.
    pub consumers: Vec<ConsumerPrune>,
    /// Batches that deleted rows.
    pub batches: u64,
    /// Rows deleted.
    pub deleted: u64,
}

/// What a run did to one consumer's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerPrune {
    /// The consumer.
    pub consumer: String,
    /// Its clock when the run started.
    pub clock: Clock,
    /// Its rows applied before this went; `None`: none of them could (no clock, or a rebuild
    /// of it was paused while the run went on). Fixed when the run starts, so rows that age
    /// past the window while it runs stay for the next run.
    pub cutoff: Option<DateTime<Utc>>,
    /// Its rows deleted.
    pub deleted: u64,
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
    if options.batch < 1 {
        return Err(OpsError::Refused(
            "the batch size must be at least 1".to_owned(),
        ));
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

/// One batch: the oldest `$5` rows from `$2` on (the previous batch's newest: the index scan
/// starts past the dead entries earlier batches left for vacuum) and before `$1`, the latest
/// of the cutoffs, of the consumers `$3` each applied before its own cutoff in `$4`; a row of
/// any other consumer is passed over. Rows are addressed by `ctid`: inbox rows are never
/// updated, so a row's `ctid` is stable, and the delete is a TID scan of exactly the rows the
/// index scan found.
const DELETE_BATCH: &str = "WITH doomed AS ( \
         SELECT ctid FROM projector.inbox \
         WHERE applied_at < $1 AND applied_at >= $2 \
           AND applied_at < ($4::timestamptz[])[array_position($3::text[], consumer::text)] \
         ORDER BY applied_at LIMIT $5), \
     deleted AS ( \
         DELETE FROM projector.inbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed)) \
         RETURNING consumer, applied_at) \
     SELECT consumer::text, count(*), max(applied_at) FROM deleted GROUP BY consumer";

/// Deletes the inbox rows of each consumer of `clocks` applied longer than the window before
/// its clock, batch by batch, calling `progress` after each, until a batch finds none. Before
/// every batch the paused rebuilds are read again: a consumer paused meanwhile keeps the rest
/// of its rows.
pub async fn prune_inbox(
    client: &Client,
    options: &PruneOptions,
    clocks: &[ConsumerClock],
    mut progress: impl FnMut(&PruneProgress),
) -> Result<PruneReport, OpsError> {
    check_window(options)?;
    let window = chrono::Duration::from_std(options.older_than)
        .map_err(|_| OpsError::Refused("the window is too long".to_owned()))?;
    let mut report = PruneReport {
        consumers: clocks
            .iter()
            .map(|c| ConsumerPrune {
                consumer: c.consumer.clone(),
                clock: c.clock.clone(),
                cutoff: c.clock.cutoff(window),
                deleted: 0,
            })
            .collect(),
        batches: 0,
        deleted: 0,
    };
    let statement = client
        .prepare(DELETE_BATCH)
        .await
        .map_err(pg("preparing the batch delete"))?;
    // The oldest row, through the index: where the first batch's index scan starts.
    let oldest: Option<DateTime<Utc>> = client
        .query_one("SELECT min(applied_at) FROM projector.inbox", &[])
        .await
        .map_err(pg("finding the oldest inbox row"))?
        .get(0);
    let Some(mut from) = oldest else {
        return Ok(report);
    };
    loop {
        let paused = clock::paused(client).await?;
        let mut consumers = Vec::new();
        let mut cutoffs = Vec::new();
        for c in &mut report.consumers {
            if paused.contains(&c.consumer) {
                c.cutoff = None;
            }
            if let Some(cutoff) = c.cutoff {
                consumers.push(c.consumer.clone());
                cutoffs.push(cutoff);
            }
        }
        let Some(latest) = cutoffs.iter().max().copied() else {
            break;
        };
        let rows = client
            .query(
                &statement,
                &[&latest, &from, &consumers, &cutoffs, &options.batch],
            )
            .await
            .map_err(pg("deleting a batch of inbox rows"))?;
        let mut deleted = 0u64;
        let mut reached: Option<DateTime<Utc>> = None;
        for row in &rows {
            let consumer: &str = row.get(0);
            let n = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
            let newest: Option<DateTime<Utc>> = row.get(2);
            deleted += n;
            reached = reached.max(newest);
            if let Some(c) = report.consumers.iter_mut().find(|c| c.consumer == consumer) {
                c.deleted += n;
            }
        }
        if deleted == 0 {
            break;
        }
        if let Some(r) = reached {
            from = r;
        }
        report.batches += 1;
        report.deleted += deleted;
        progress(&PruneProgress {
            batches: report.batches,
            deleted,
            total: report.deleted,
            reached,
        });
        if !options.pause.is_zero() {
            tokio::time::sleep(options.pause).await;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

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
