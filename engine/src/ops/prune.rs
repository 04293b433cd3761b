//! Inbox retention: rows older than a window are deleted in small batches through the index
//! on `applied_at`, with a short pause between batches, until none are left.
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

use super::error::{pg, OpsError};

/// How retention runs.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Rows applied longer ago than this go.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneReport {
    /// Rows applied before this moment were deleted; fixed when the run starts, so rows that
    /// age past the window while it runs stay for the next run.
    pub cutoff: DateTime<Utc>,
    /// Batches that deleted rows.
    pub batches: u64,
    /// Rows deleted.
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

/// One batch: the oldest `$3` rows from `$2` on (the previous batch's newest: the index scan
/// starts past the dead entries earlier batches left for vacuum) and before the cutoff `$1`.
/// Rows are addressed by `ctid`: inbox rows are never updated, so a row's `ctid` is stable,
/// and the delete is a TID scan of exactly the rows the index scan found.
const DELETE_BATCH: &str = "WITH doomed AS ( \
         SELECT ctid FROM projector.inbox \
         WHERE applied_at < $1 AND applied_at >= $2 \
         ORDER BY applied_at LIMIT $3), \
     deleted AS ( \
         DELETE FROM projector.inbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed)) \
         RETURNING applied_at) \
     SELECT count(*), max(applied_at) FROM deleted";

/// Deletes inbox rows applied longer ago than the window, batch by batch, calling
/// `progress` after each, until a batch finds none.
pub async fn prune_inbox(
    client: &Client,
    options: &PruneOptions,
    mut progress: impl FnMut(&PruneProgress),
) -> Result<PruneReport, OpsError> {
    check_window(options)?;
    let window = chrono::Duration::from_std(options.older_than)
        .map_err(|_| OpsError::Refused("the window is too long".to_owned()))?;
    let now: DateTime<Utc> = client
        .query_one("SELECT now()", &[])
        .await
        .map_err(pg("reading the time"))?
        .get(0);
    let cutoff = now - window;
    let statement = client
        .prepare(DELETE_BATCH)
        .await
        .map_err(pg("preparing the batch delete"))?;
    let mut report = PruneReport {
        cutoff,
        batches: 0,
        deleted: 0,
    };
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
        let row = client
            .query_one(&statement, &[&cutoff, &from, &options.batch])
            .await
            .map_err(pg("deleting a batch of inbox rows"))?;
        let deleted = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        if deleted == 0 {
            break;
        }
        let reached: Option<DateTime<Utc>> = row.get(1);
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
