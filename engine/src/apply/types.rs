//! What goes into the apply path and what comes out: batches, dispositions, counts, errors.

use crate::event::Message;

/// Messages of one partition, in offset order, to be applied as one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Where the consumer started reading this batch: the stored `next_offset` it resumed
    /// from. The first message may sit later (compaction, transaction markers), never earlier.
    pub start_offset: i64,
    /// The messages, offsets strictly increasing.
    pub messages: Vec<Message>,
}

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Disposition {
    /// Its effect is in the view: applied now, or found in the inbox or under the version
    /// filter as applied before.
    Applied,
    /// A type this view does not subscribe to; it still advanced the account's `seq`.
    Ignored,
    /// The same event was already applied (or is already waiting).
    Duplicate,
    /// Its `seq` is at or below the rebuild watermark: the snapshot holds its effect.
    BelowWatermark,
    /// Stored in `projector.waiting_events`, waiting for an earlier `seq`.
    Waiting,
    /// Stored in `projector.dead_letters`: poison, its statement failed, or it claims a `seq`
    /// another event holds (a conflict).
    DeadLettered,
}

/// Counters of one batch. Every message of the batch is counted exactly once in `applied`,
/// `ignored`, one of the duplicate kinds, one of the dead-letter kinds or `waiting`; events
/// that waited in earlier batches are counted again when they leave (`drained`), in whatever
/// became of them. So `applied + ignored + duplicates() + dead_lettered() + waiting -
/// drained` is the number of messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events whose effect this batch wrote.
    pub applied: u64,
    /// Events of types the view does not subscribe to.
    pub ignored: u64,
    /// Duplicates dropped because their event already holds their `seq` (applied or waiting).
    pub dup_seq: u64,
    /// Events skipped because a rebuild snapshot already reflects them.
    pub dup_watermark: u64,
    /// Duplicates dropped by the inbox (inside the statement, or an event id repeated
    /// within the batch).
    pub dup_inbox: u64,
    /// Duplicates dropped by the view's version filter inside the statement.
    pub dup_version_filter: u64,
    /// Messages dead-lettered as poison.
    pub poison: u64,
    /// Events dead-lettered because the view's statement failed on them.
    pub failed: u64,
    /// Events dead-lettered because another event holds their `(account, seq)`.
    pub conflicts: u64,
    /// Events of this batch that now wait in `projector.waiting_events`.
    pub waiting: u64,
    /// Events that waited from earlier batches and left the waiting table in this one.
    pub drained: u64,
    /// Notices the view's statement emitted (the live version only).
    pub notices: u64,
    /// Events sent to the view's statement whose `occurred_at` lies outside the inbox's
    /// retained window: on a day older than every day kept, or further ahead of the server's
    /// clock than [`crate::inbox::FUTURE_BOUND`]. Applied once all the same (their day gets a
    /// partition); counted apart from the dispositions above, so a producer stamping wrong
    /// times shows.
    pub outside_window: u64,
    /// Events an order-independent view on a source ordered per account applied at or below
    /// the highest `seq` it had applied for their account, which its inbox did not know: a
    /// copy stamped with another `occurred_at` (the same id with another time is another
    /// event to the inbox), a copy whose day retention dropped, or a producer publishing an
    /// account's events out of order. Each is likely an event applied twice; counted apart
    /// from the dispositions above (they are `applied`).
    pub below_seen: u64,
}

impl std::ops::AddAssign<&Counts> for Counts {
    fn add_assign(&mut self, c: &Counts) {
        self.applied += c.applied;
        self.ignored += c.ignored;
        self.dup_seq += c.dup_seq;
        self.dup_watermark += c.dup_watermark;
        self.dup_inbox += c.dup_inbox;
        self.dup_version_filter += c.dup_version_filter;
        self.poison += c.poison;
        self.failed += c.failed;
        self.conflicts += c.conflicts;
        self.waiting += c.waiting;
        self.drained += c.drained;
        self.notices += c.notices;
        self.outside_window += c.outside_window;
        self.below_seen += c.below_seen;
    }
}

impl Counts {
    /// All duplicates, whatever caught them.
    pub fn duplicates(&self) -> u64 {
        self.dup_seq + self.dup_watermark + self.dup_inbox + self.dup_version_filter
    }

    /// All dead letters, whatever their kind.
    pub fn dead_lettered(&self) -> u64 {
        self.poison + self.failed + self.conflicts
    }
}

/// The result of a committed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// The offset the next batch of this partition starts at.
    pub next_offset: i64,
    /// What the batch did.
    pub counts: Counts,
    /// What became of each message, by offset, in batch order.
    pub dispositions: Vec<(i64, Disposition)>,
    /// Accounts with more waiting events than one batch drains, whose next ones may follow
    /// now: drain them with [`crate::Applier::drain_account`] until it says none are left.
    pub more_to_drain: Vec<i64>,
}

/// Why a batch was not applied. Nothing of it was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// Another writer committed this partition to another offset than our start: we lost
    /// the partition, or must resume at `stored`.
    #[error("{consumer} {topic}/{partition}: fenced: the batch starts at offset {start} but the committed next offset is {stored}")]
    Fenced {
        /// View version.
        consumer: String,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Where the batch started.
        start: i64,
        /// Where PostgreSQL says the partition is.
        stored: i64,
    },
    /// The batch's offsets are not strictly increasing from its start offset.
    #[error("{consumer} {topic}/{partition}: batch offsets must increase strictly from the start offset {start}; found {offset}")]
    BadBatch {
        /// View version.
        consumer: String,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The batch's start offset.
        start: i64,
        /// The first offset out of place.
        offset: i64,
    },
    /// A repair that the account's state does not allow (skipping a `seq` it does not wait
    /// for, say). Nothing was written.
    #[error("{consumer}: {reason}")]
    Refused {
        /// View version.
        consumer: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The inbox has no partition for the day of some events of the batch (`crate::inbox`):
    /// nothing was written. A day is made in a transaction of its own, never inside a batch's
    /// (DDL there would hold its locks until the batch commits, and a batch left open would
    /// hold every other batch that needs a new day): [`crate::Applier::apply`] and the
    /// repairs make the days and try again by themselves; a caller of
    /// [`crate::Applier::apply_in`] calls [`crate::Applier::make_days`] with these, then
    /// tries again.
    #[error("{consumer}: the inbox has no partition yet for the day(s) {days:?} (make them with Applier::make_days, or use Applier::apply)")]
    InboxDaysMissing {
        /// View version.
        consumer: String,
        /// The days missing.
        days: Vec<chrono::NaiveDate>,
    },
    /// PostgreSQL failed in a way no single event explains (connection lost, deadlock, a
    /// broken view statement). The batch can be retried.
    #[error("{consumer}: while {doing}: {}", describe_db_error(.error))]
    Database {
        /// View version.
        consumer: String,
        /// What the engine was doing.
        doing: &'static str,
        /// The driver's error, already described in the message.
        error: tokio_postgres::Error,
    },
}

impl ApplyError {
    /// True for errors where the same batch may succeed later (database trouble); false for
    /// fencing and malformed batches, where the caller must seek or stop.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ApplyError::Database { .. } | ApplyError::InboxDaysMissing { .. }
        )
    }
}

/// A database error as a dead letter or a log line shows it: the server's message, its
/// SQLSTATE and its detail; the driver's own text for an error that did not come from the
/// server.
pub(crate) fn describe_db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                s.push_str(": ");
                s.push_str(detail);
            }
            s
        }
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_by_kind() {
        let mut total = Counts::default();
        let batch = Counts {
            applied: 5,
            dup_seq: 1,
            dup_inbox: 2,
            poison: 1,
            conflicts: 2,
            failed: 1,
            ..Counts::default()
        };
        total += &batch;
        total += &batch;
        assert_eq!(total.applied, 10);
        assert_eq!(total.duplicates(), 6);
        assert_eq!(total.dead_lettered(), 8);
    }
}
