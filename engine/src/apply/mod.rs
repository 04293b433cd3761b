//! The hot path: one batch of one partition, applied to one view version, in one transaction.
//!
//! 1. Decode every message for this view: the envelope always, the data only for types the
//!    view subscribes to. Poison is dead-lettered with its raw bytes.
//! 2. Lock the partition's offset row and check that the batch starts where the last
//!    committed batch ended (fencing); lock and read the batch's accounts' progress,
//!    pipelined.
//! 3. Per account, decide what is applied now, what repeats a taken `seq` (a duplicate, or a
//!    conflict when its event id differs) and what waits ([`crate::sequencer`], [`plan`]).
//! 4. Split the events into key-disjoint rounds and run the view's statement once per
//!    round, pipelined ([`rounds`]). If a statement fails, isolate the event at fault with
//!    savepoints: it is dead-lettered with the database error; its account parks.
//! 5. Write dead letters, waiting events, parks, progress and the fenced offset update,
//!    pipelined ([`bookkeeping`]), and commit.
//!
//! Steps 2 to 5 run once per pass over the batch: usually one. A correction of an event whose
//! statement failed ends a pass before it, undone and run again up to there (`passes`); the
//! offset moves with the last pass.
//!
//! # Layout
//!
//! - [`types`]: batches, dispositions, counts and errors: what goes in and comes out.
//! - `plan` (private): what each message is for this view; per-account sequencing,
//!   duplicates and conflicts; settling statement failures into the plan.
//! - `rounds` (private): the composed statement, rounds, their columns, failure isolation.
//! - `bookkeeping` (private): everything a batch records besides the view's rows.
//! - `passes` (private): the passes over one batch (usually one; a correction of an event
//!   whose statement failed splits it) and what they add up to; pure.
//! - `repair` (private): retrying a dead letter, skipping a lost `seq`, draining a parked
//!   account, through the same path (`Applier::retry_dead_letter`, `skip_seq`,
//!   `drain_account`).

mod bookkeeping;
mod passes;
mod plan;
mod repair;
mod rounds;
pub mod types;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use deadpool_postgres::{Client, Transaction};
use tokio_postgres::types::ToSql;
use tokio_postgres::Statement;
use tracing::Instrument;

use crate::bell::Bell;
use crate::event::{check_storable, decode_envelope, extract_fields, salvage, Event, Message};
use crate::inbox;
use crate::metrics::ViewMetrics;
use crate::projection::{
    check_compatible, Field, Projection, SourceOrdering, UnknownVersion, ViewError,
};
use crate::queries;
use crate::upcast::{UpcastError, Upcasters};

use bookkeeping::Advance;
use passes::{Passes, Written};
use plan::{AccountState, Decoded, WaitingEvent, Work};

pub use repair::DeadLetterSkip;
pub use rounds::{compose_statement, compose_statement_with, InboxGuard, RUN_CAP};
pub(crate) use types::describe_db_error;
pub use types::{ApplyError, Batch, BatchOutcome, Counts, Disposition};

/// How long a consumer's rows in the inbox before V0009 are taken to be there before it is
/// asked again.
const LEGACY_ASK_AGAIN: std::time::Duration = std::time::Duration::from_secs(600);

/// [`Applier::legacy`]: not asked yet.
const LEGACY_UNKNOWN: u8 = 0;
/// [`Applier::legacy`]: the consumer has rows in `projector.inbox_legacy`.
const LEGACY_ROWS: u8 = 1;
/// [`Applier::legacy`]: it has none (or the view has no inbox).
const LEGACY_NONE: u8 = 2;

/// The most waiting events of one account a batch loads (and so drains): its work stays
/// bounded however long the account was parked.
const DRAIN_LIMIT: i64 = 1000;

/// The partition's offset row as the batch found it.
enum Fence {
    /// Locked by this transaction, at this next offset.
    Held(i64),
    /// Another writer created it meanwhile; it stands at this next offset.
    Lost(i64),
}

/// `<host>:<pid>`: who commits, for operators reading `projector.offsets`.
pub(crate) fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// A dead letter's error about an event's data, naming the version it came in (`seen`) and,
/// when it was upcast, the version it was read at: a producer must see which shape failed.
fn versioned(event: &Event, seen: i32, reads: i32, error: impl std::fmt::Display) -> String {
    if seen == reads {
        format!("{} version {seen}: {error}", event.event_type)
    } else {
        format!(
            "{} version {seen}, upcast to version {reads}: {error}",
            event.event_type
        )
    }
}

/// What a caught panic said, for a dead letter or a log line.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The statements every batch runs before the view's, prepared ([`Applier::prepare_batch`]).
struct BatchStatements {
    /// Locks the partition's offset row.
    lock: Statement,
    /// Reads whether the version is live, for a view that emits notices.
    is_live: Option<Statement>,
    /// Load the batch's accounts; `None` without per-account tracking.
    accounts: Option<AccountStatements>,
}

/// The prepared statements that load a batch's accounts.
struct AccountStatements {
    /// Creates missing progress rows and locks them all, then reads the `seq`s their open
    /// dead letters hold (order-dependent views).
    lock: Option<(Statement, Statement, Statement)>,
    read: Statement,
}

/// How much per-account state a view version keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracking {
    /// Unordered source: the inbox alone judges.
    None,
    /// An order-independent view on an ordered source: the rebuild watermark counts, gaps do
    /// not park.
    Watermark,
    /// An order-dependent view on an ordered source: `seq` order, gaps park.
    Seq,
}

/// Applies batches to one view version.
pub struct Applier {
    projection: Arc<dyn Projection>,
    consumer: String,
    tracking: Tracking,
    /// True for an order-dependent view: rounds, and nothing after an account's failed event.
    ordered: bool,
    /// An order-dependent view whose statement folds an account's run of events in `seq`
    /// order ([`Projection::many_per_account`]): the fast path sends one round, or more for an
    /// account with more than [`RUN_CAP`] events in the batch.
    many_per_account: bool,
    /// A handful of types: compared one by one, cheaper than hashing each event's type
    /// (asked several times per event).
    subscribes: Vec<String>,
    statement: String,
    /// The statement of the fast path for a view with an inbox, which expects the events it
    /// sends to be new ([`InboxGuard::Fail`]); `None` (no inbox): the fast path runs
    /// `statement` too.
    fresh_statement: Option<String>,
    /// `statement` that also looks events up in the inbox before V0009
    /// (`projector.inbox_legacy`, by id alone), for a consumer that has rows there; `None`
    /// for a view without an inbox.
    legacy_statement: Option<String>,
    /// Whether this consumer has rows in `projector.inbox_legacy`: [`LEGACY_UNKNOWN`] until
    /// the first batch (or [`Applier::prepare`]) asks; then for good, since that table takes
    /// no new rows. While it does, every statement is `legacy_statement` and the fast path's
    /// plain insert, which cannot see those rows, is never tried.
    legacy: AtomicU8,
    /// When `legacy` was last asked.
    legacy_asked: std::sync::Mutex<Instant>,
    /// The inbox's days this applier knows to be attached (`crate::inbox`).
    days: inbox::Days,
    /// A hint shared by the workers of every partition: the last batch met ids the inbox
    /// had, so the next goes straight to `statement` instead of paying a failed first try;
    /// cleared by a batch that meets none. Either statement is exact.
    expect_duplicates: AtomicBool,
    metrics: ViewMetrics,
    /// Recorded on every offset this applier moves (`projector.offsets.committed_by`).
    owner: String,
    /// The view emits notices: each batch reads (and holds shared) whether it is live.
    emits: bool,
    /// The fields of `data` the view reads, decoded here, passed as typed columns.
    fields: Vec<Field>,
    /// The view's upcasters, chained: every event of a subscribed type is brought to the
    /// version the view reads here, in [`Applier::decode`], which every path goes through.
    upcasters: Upcasters,
    /// What an event newer than that version becomes: it waits (and parks its account) or
    /// is dead-lettered. Without per-account tracking (an unordered source) nothing can
    /// wait, and it is dead-lettered.
    unknown_version: UnknownVersion,
    /// Rung after every commit: wakes the readers waiting for this view
    /// (`projector.wait_applied`, [`crate::bell`]). Silent unless [`Applier::with_bell`].
    bell: Bell,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("consumer", &self.consumer)
            .field("tracking", &self.tracking)
            .finish_non_exhaustive()
    }
}

impl Applier {
    /// An applier for `projection` reading a source with the given ordering. Refuses a view
    /// whose dedup mode or order dependence the source cannot support.
    pub fn new(
        projection: Arc<dyn Projection>,
        ordering: SourceOrdering,
    ) -> Result<Self, ViewError> {
        check_compatible(&*projection, ordering)?;
        let consumer = projection.consumer();
        let ordered = !projection.order_independent();
        let many_per_account = projection.many_per_account();
        let emits = projection.notices_sql().is_some();
        let fields = projection.fields();
        let upcasters = Upcasters::new(projection.upcasters())
            .map_err(|e| ViewError::Upcasters(consumer.clone(), e))?;
        let tracking = match (ordering, ordered) {
            (SourceOrdering::Unordered, _) => Tracking::None,
            (SourceOrdering::PerAccount, false) => Tracking::Watermark,
            (SourceOrdering::PerAccount, true) => Tracking::Seq,
        };
        let unknown_version = match tracking {
            Tracking::None => UnknownVersion::DeadLetter,
            _ => projection.unknown_version(),
        };
        // Every view with an inbox tries the plain insert first: the events a batch sends are
        // new far more often than not (a redelivered batch never met the inbox: its rows
        // would have committed with its offset). An order-dependent view on an ordered
        // source sends only events past each account's locked `last_seq`, so only a reused
        // id fails it; for the others (eod) an event published again at a new offset does
        // too. Either way the fallback runs the same rounds with `ON CONFLICT`.
        let uses_inbox = projection.dedup().uses_inbox();
        let fresh_statement =
            uses_inbox.then(|| compose_statement_with(&*projection, InboxGuard::Fail));
        let legacy_statement =
            uses_inbox.then(|| compose_statement_with(&*projection, InboxGuard::SkipLegacy));
        Ok(Self {
            statement: compose_statement(&*projection),
            fresh_statement,
            legacy_statement,
            legacy: AtomicU8::new(if uses_inbox {
                LEGACY_UNKNOWN
            } else {
                LEGACY_NONE
            }),
            legacy_asked: std::sync::Mutex::new(Instant::now()),
            days: inbox::Days::new(),
            expect_duplicates: AtomicBool::new(false),
            subscribes: projection
                .subscribes()
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            metrics: ViewMetrics::new(&consumer),
            tracking,
            ordered,
            many_per_account,
            consumer,
            projection,
            owner: default_owner(),
            emits,
            fields,
            upcasters,
            unknown_version,
            bell: Bell::silent(),
        })
    }

    /// Rings `bell` after every batch and repair this applier commits, for the readers
    /// waiting in `projector.wait_applied` ([`crate::bell`]).
    pub fn with_bell(mut self, bell: Bell) -> Self {
        self.bell = bell;
        self
    }

    /// Says a batch of this view committed (after the commit).
    pub(crate) fn rang(&self) {
        self.bell.ring(self.projection.name());
    }

    /// Names the process that commits through this applier (`--instance-id`); by default
    /// it is `<host>:<pid>`.
    pub fn owned_by(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// The view version's consumer name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The view this applier serves.
    pub fn projection(&self) -> &Arc<dyn Projection> {
        &self.projection
    }

    /// The composed statement run once per round.
    pub fn statement(&self) -> &str {
        &self.statement
    }

    fn db(&self, doing: &'static str) -> impl Fn(tokio_postgres::Error) -> ApplyError + '_ {
        move |error| {
            if inbox::is_missing_partition(&error) {
                // A prune dropped a day this process thought attached: read them again; the
                // batch's retry makes the day it needs.
                self.days.forget();
            }
            ApplyError::Database {
                consumer: self.consumer.clone(),
                doing,
                error,
            }
        }
    }

    /// Whether this consumer has rows in the inbox before V0009, asked once.
    pub(crate) async fn legacy_rows(
        &self,
        client: &impl deadpool_postgres::GenericClient,
    ) -> Result<bool, ApplyError> {
        match self.legacy.load(Ordering::Relaxed) {
            // Asked again now and then: `inbox prune` empties the table once no clock needs
            // it, and the fast path's plain insert comes back with that.
            LEGACY_ROWS
                if self
                    .legacy_asked
                    .lock()
                    .map_or(true, |at| at.elapsed() < LEGACY_ASK_AGAIN) =>
            {
                return Ok(true)
            }
            LEGACY_NONE => return Ok(false),
            _ => {}
        }
        if let Ok(mut at) = self.legacy_asked.lock() {
            *at = Instant::now();
        }
        let rows = inbox::has_legacy_rows(client, &self.consumer)
            .await
            .map_err(self.db("looking for rows in the inbox before V0009"))?;
        self.legacy.store(
            if rows { LEGACY_ROWS } else { LEGACY_NONE },
            Ordering::Relaxed,
        );
        Ok(rows)
    }

    /// The statement that skips events the inbox has, for this consumer.
    pub(crate) fn skip_statement(&self) -> &str {
        match (&self.legacy_statement, self.legacy.load(Ordering::Relaxed)) {
            (Some(legacy), LEGACY_ROWS | LEGACY_UNKNOWN) => legacy,
            _ => &self.statement,
        }
    }

    /// The statement the fast path runs: the fresh-events one where the plan allows it.
    pub(crate) fn fast_statement(&self) -> &str {
        match self.first_try() {
            Some(InboxGuard::Fail) => self.fresh_statement.as_deref().unwrap_or(&self.statement),
            _ => self.skip_statement(),
        }
    }

    /// How the next batch's first try inserts its inbox rows: [`InboxGuard::Fail`] (a plain
    /// insert, the rounds run again with `ON CONFLICT` if it meets an id the inbox has), or
    /// [`InboxGuard::Skip`] (`ON CONFLICT` at once) after a batch met such ids, until a batch
    /// meets none. `None` for a view without an inbox.
    pub fn first_try(&self) -> Option<InboxGuard> {
        self.fresh_statement.as_ref().map(|_| {
            // Asked before a batch's first statement (`prepare_inbox`); until then, what a
            // consumer without such rows would do.
            if self.legacy.load(Ordering::Relaxed) == LEGACY_ROWS {
                InboxGuard::SkipLegacy
            } else if self.expect_duplicates.load(Ordering::Relaxed) {
                InboxGuard::Skip
            } else {
                InboxGuard::Fail
            }
        })
    }

    /// Whether an event goes to the view's statement.
    fn sends(&self, event: &Event) -> bool {
        self.subscribes.contains(&event.event_type)
    }

    /// Prepares the view's statement, so that a broken view fails at start, not mid-stream.
    pub async fn prepare(&self, client: &Client) -> Result<(), ApplyError> {
        self.legacy_rows(client).await?;
        client
            .prepare_cached(self.skip_statement())
            .await
            .map_err(self.db("preparing the view statement"))?;
        client
            .prepare_cached(self.fast_statement())
            .await
            .map(drop)
            .map_err(self.db("preparing the view statement"))
    }

    /// The committed next offset of a partition, if any batch was ever committed for it.
    pub async fn stored_offset(
        &self,
        client: &Client,
        topic: &str,
        partition: i32,
    ) -> Result<Option<i64>, ApplyError> {
        let row = client
            .query_opt(queries::READ_OFFSET, &[&self.consumer, &topic, &partition])
            .await
            .map_err(self.db("reading the stored offset"))?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn read_offset(
        &self,
        tx: &Transaction<'_>,
        topic: &str,
        partition: i32,
    ) -> Result<Option<i64>, ApplyError> {
        let row = tx
            .query_opt(queries::READ_OFFSET, &[&self.consumer, &topic, &partition])
            .await
            .map_err(self.db("reading the stored offset"))?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Applies a batch in its own transaction and commits.
    pub async fn apply(
        &self,
        client: &mut Client,
        batch: &Batch,
    ) -> Result<BatchOutcome, ApplyError> {
        let span = tracing::info_span!(
            "batch",
            consumer = %self.consumer,
            topic = %batch.topic,
            partition = batch.partition,
            start = batch.start_offset,
            len = batch.messages.len(),
        );
        async {
            let started = Instant::now();
            let mut tries = 0;
            let outcome = loop {
                let mut tx = client
                    .transaction()
                    .await
                    .map_err(self.db("beginning the transaction"))?;
                match self.apply_in(&mut tx, batch).await {
                    Ok(outcome) => {
                        tx.commit().await.map_err(self.db("committing"))?;
                        self.rang();
                        break outcome;
                    }
                    // The inbox lacks a day (an event older than every day kept, or far
                    // ahead): made in a transaction of its own, then the batch again. A
                    // day made stays until a prune leaves it a window behind.
                    Err(ApplyError::InboxDaysMissing { days, .. }) if tries < 3 => {
                        tries += 1;
                        drop(tx);
                        self.make_days(client, &days).await?;
                    }
                    // A day this process knew was dropped under it by a prune: its days are
                    // forgotten (`Applier::db`); the next try reads them, and makes the day.
                    Err(ApplyError::Database { error, .. })
                        if tries < 3 && inbox::is_missing_partition(&error) =>
                    {
                        tries += 1;
                        drop(tx);
                    }
                    Err(e) => return Err(e),
                }
            };
            self.metrics.record(&outcome.counts, started.elapsed());
            tracing::debug!(next_offset = outcome.next_offset, counts = ?outcome.counts, "batch committed");
            Ok(outcome)
        }
        .instrument(span)
        .await
    }

    /// Makes the inbox's partitions for `days`, each in a transaction of its own on `client`
    /// (outside any): what a caller of [`Applier::apply_in`] does with the days of
    /// [`ApplyError::InboxDaysMissing`] before it tries again.
    pub async fn make_days(
        &self,
        client: &mut Client,
        days: &[chrono::NaiveDate],
    ) -> Result<(), ApplyError> {
        self.days
            .make(client, &days.iter().copied().collect())
            .await
            .map(drop)
            .map_err(self.db("making the inbox's partitions"))
    }

    /// Makes the inbox's partitions for the days of `batch`'s events (their envelopes' days;
    /// poison aside), each in a transaction of its own on `client`: for a caller of
    /// [`Applier::apply_in`] that opens the transaction itself. Events that waited in earlier
    /// batches may still need a day: [`ApplyError::InboxDaysMissing`] names it.
    pub async fn make_days_for(
        &self,
        client: &mut Client,
        batch: &Batch,
    ) -> Result<(), ApplyError> {
        if !self.projection.dedup().uses_inbox() {
            return Ok(());
        }
        let days: Vec<chrono::NaiveDate> = batch
            .messages
            .iter()
            .filter_map(|m| decode_envelope(m).ok())
            .map(|e| inbox::day_of(e.occurred_at))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if days.iter().all(|d| self.days.covers(&[*d].into())) {
            return Ok(());
        }
        self.make_days(client, &days).await
    }

    /// Applies a batch inside the caller's transaction without committing it. Dropping the
    /// transaction afterwards is a crash between apply and commit: nothing stays. When the
    /// inbox lacks a day for some of its events, it stops with
    /// [`ApplyError::InboxDaysMissing`] before writing: [`Applier::make_days`], then again.
    pub async fn apply_in(
        &self,
        tx: &mut Transaction<'_>,
        batch: &Batch,
    ) -> Result<BatchOutcome, ApplyError> {
        self.check_batch(batch)?;
        let Some(last) = batch.messages.last() else {
            return Ok(BatchOutcome {
                next_offset: batch.start_offset,
                counts: Counts::default(),
                dispositions: Vec::new(),
                more_to_drain: Vec::new(),
            });
        };
        let next_offset = last.offset + 1;
        // 1. Decode.
        let decoded: Vec<Decoded> = batch.messages.iter().map(|m| self.decode(m)).collect();
        let statements = self.prepare_batch(tx).await?;
        // Usually one pass over the whole batch; see `passes`.
        let mut passes = Passes::new(batch.messages.len());
        while let Some(pass) = passes.next_pass() {
            let run = pass.run.clone();
            let mut work = Work::pass(
                &batch.topic,
                batch.partition,
                &batch.messages[run.clone()],
                &decoded[run],
            )
            .draining(pass.drain.clone());
            // 2. Fence (the first pass), lock and load the accounts.
            let states = self
                .fence_and_load(tx, batch, &statements, &mut work, pass.first)
                .await?;
            // 3. Plan.
            self.plan(tx, &mut work, states).await?;
            // 4. Rounds.
            let release = self.execute(tx, &mut work).await?;
            work.settle(self.ordered);
            if passes.undo(&pass, release, || work.split_point()) {
                tx.batch_execute(queries::UNDO_BATCH_SAVEPOINT)
                    .await
                    .map_err(self.db("undoing a pass"))?;
                continue;
            }
            // 5. Bookkeeping, and the offset with the last pass.
            let advance = passes.is_last(&pass).then(|| Advance {
                topic: &batch.topic,
                partition: batch.partition,
                start_offset: batch.start_offset,
                next_offset,
            });
            let counts = self
                .write_bookkeeping(tx, &work, advance, release, passes.total())
                .await?;
            let written = Written {
                counts,
                dispositions: work.dispositions(),
                earlier: work.waiting_outcomes(),
                more_to_drain: work.more_to_drain(),
            };
            passes.written(&pass, &batch.messages, written);
        }
        let (counts, dispositions, more_to_drain) = passes.finish(&batch.messages);
        Ok(BatchOutcome {
            next_offset,
            counts,
            dispositions,
            more_to_drain,
        })
    }

    /// Prepares the statements every batch runs before the view's, each before any is sent:
    /// a prepared statement goes out when its future is first polled, so the offset row is
    /// locked before the accounts are, in every writer. A cache miss on one of them must not
    /// let the others overtake it.
    async fn prepare_batch(&self, tx: &Transaction<'_>) -> Result<BatchStatements, ApplyError> {
        let (lock, is_live, accounts) = futures::try_join!(
            self.prepare_lock(tx),
            self.prepare_is_live(tx),
            self.prepare_accounts(tx)
        )?;
        Ok(BatchStatements {
            lock,
            is_live,
            accounts,
        })
    }

    /// Step 2 of a pass: on the batch's `first` pass, locks the partition's offset row and
    /// checks that the batch starts where the last committed one ended; reads whether the
    /// version is live; locks and reads the pass's accounts' progress; all pipelined.
    async fn fence_and_load(
        &self,
        tx: &Transaction<'_>,
        batch: &Batch,
        statements: &BatchStatements,
        work: &mut Work<'_>,
        first: bool,
    ) -> Result<HashMap<i64, AccountState>, ApplyError> {
        let accounts = work.account_ids();
        let is_live = statements.is_live.as_ref();
        let account_statements = statements.accounts.as_ref();
        let states = if first {
            let (fence, live, states) = futures::try_join!(
                self.lock_offset(tx, batch, &statements.lock),
                self.is_live(tx, is_live),
                self.load_accounts(tx, account_statements, &accounts)
            )?;
            match fence {
                Fence::Held(stored) if stored == batch.start_offset => {}
                Fence::Held(stored) | Fence::Lost(stored) => {
                    return Err(ApplyError::Fenced {
                        consumer: self.consumer.clone(),
                        topic: batch.topic.clone(),
                        partition: batch.partition,
                        start: batch.start_offset,
                        stored,
                    })
                }
            }
            work.set_live(live);
            states
        } else {
            let (live, states) = futures::try_join!(
                self.is_live(tx, is_live),
                self.load_accounts(tx, account_statements, &accounts)
            )?;
            work.set_live(live);
            states
        };
        Ok(states)
    }

    fn check_batch(&self, batch: &Batch) -> Result<(), ApplyError> {
        let mut floor = batch.start_offset;
        for m in &batch.messages {
            if m.offset < floor {
                return Err(ApplyError::BadBatch {
                    consumer: self.consumer.clone(),
                    topic: batch.topic.clone(),
                    partition: batch.partition,
                    start: batch.start_offset,
                    offset: m.offset,
                });
            }
            floor = m.offset + 1;
        }
        Ok(())
    }

    /// Decodes one message for this view: the envelope always; the data, and the view's own
    /// checks, only for types it subscribes to. An event of another type advances the
    /// account's `seq` whatever its data holds, whatever its version.
    ///
    /// This is the one place an event is upcast, for every path: a batch of the stream or of
    /// a rebuild's tail, a waiting event read back, a dead letter retried. A subscribed event
    /// is checked at the version it came in (the view's rules for its type's data), brought to the
    /// version the view reads by the view's upcasters, and checked again at that version,
    /// before the view's declared fields are read and its own checks run. One newer than the
    /// view reads is held ([`Decoded::Held`]) or dead-lettered, by the view's policy. Every
    /// error of the data names the version seen.
    fn decode(&self, message: &Message) -> Decoded {
        let decoded = decode_envelope(message)
            .map_err(|e| e.to_string())
            .and_then(|mut event| {
                let sent = self.sends(&event);
                if !sent {
                    return Ok(Decoded::Event {
                        event,
                        values: Vec::new(),
                        sent: false,
                    });
                }
                let seen = event.type_version;
                let reads = self.upcasters.reads(&event.event_type);
                if seen > reads {
                    let why = UpcastError::Unknown {
                        event_type: event.event_type.clone(),
                        version: seen,
                        reads,
                    };
                    return match self.unknown_version {
                        UnknownVersion::Park => Ok(Decoded::Held {
                            why: format!(
                                "{why}: it waits for a build of {} that reads it",
                                self.consumer
                            ),
                            event,
                        }),
                        UnknownVersion::DeadLetter => Err(format!(
                            "{why}: dead-lettered (the view's policy for unknown versions); retry it once a build of {} that reads it runs",
                            self.consumer
                        )),
                    };
                }
                self.check_data(&event)
                    .map_err(|e| versioned(&event, seen, seen, e))?;
                if seen < reads {
                    // Upcasters are the view's own Rust code too: a panic in one poisons this
                    // event for the view, as one in `validate` does, instead of ending the
                    // partition's worker with the batch (met again on every restart).
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.upcasters.upcast(&mut event)
                    }))
                    .map_err(|panic| {
                        versioned(
                            &event,
                            seen,
                            reads,
                            format!(
                                "an upcaster of view {} panicked: {}",
                                self.consumer,
                                panic_message(&*panic)
                            ),
                        )
                    })?
                    .map_err(|e| e.to_string())?;
                    self.check_data(&event)
                        .map_err(|e| versioned(&event, seen, reads, e))?;
                }
                let values = extract_fields(&event, &self.fields)
                    .map_err(|e| versioned(&event, seen, reads, e))?;
                // A view's own Rust code: a panic in it poisons this event for the view,
                // instead of ending the partition's worker with the batch in its hands.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.projection.validate(&event)
                }))
                .map_err(|panic| {
                    let panic = format!(
                        "view {}'s validate panicked: {}",
                        self.consumer,
                        panic_message(&*panic)
                    );
                    versioned(&event, seen, reads, panic)
                })?
                .map_err(|e| {
                    let e = format!("rejected by view {}: {e}", self.consumer);
                    versioned(&event, seen, reads, e)
                })?;
                Ok(Decoded::Event {
                    event,
                    values,
                    sent: true,
                })
            });
        decoded.unwrap_or_else(|error| Decoded::Poison {
            error,
            salvage: salvage(&message.payload),
        })
    }

    /// The view's rules for the data of an event's type at the event's version
    /// ([`Projection::check_data`]), then what every type's data must pass
    /// ([`check_storable`]).
    ///
    /// The rules are the view's own Rust code: a panic in them poisons this event for the
    /// view, as one in `validate` or an upcaster does, instead of ending the partition's
    /// worker with the batch (met again on every restart).
    fn check_data(&self, event: &Event) -> Result<(), String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.projection.check_data(event)
        }))
        .map_err(|panic| {
            format!(
                "view {}'s check_data panicked: {}",
                self.consumer,
                panic_message(&*panic)
            )
        })?
        .map_err(|e| e.to_string())?;
        check_storable(event).map_err(|e| e.to_string())
    }

    /// The version the view reads each type it subscribes to at, for the drains that look
    /// for accounts parked on a version this build reads (`queries::DRAINABLE_ACCOUNTS`).
    fn read_versions(&self) -> (Vec<String>, Vec<i32>) {
        self.subscribes
            .iter()
            .map(|t| (t.clone(), self.upcasters.reads(t)))
            .unzip()
    }

    async fn prepare_lock(&self, tx: &Transaction<'_>) -> Result<Statement, ApplyError> {
        // Cached per connection: a plain string would cost a parse round trip (and a plan) on
        // every batch before the query itself.
        tx.prepare_cached(queries::LOCK_OFFSET)
            .await
            .map_err(self.db("locking the offset row"))
    }

    /// Locks (or creates) the partition's offset row and returns where the partition is.
    async fn lock_offset(
        &self,
        tx: &Transaction<'_>,
        batch: &Batch,
        lock: &Statement,
    ) -> Result<Fence, ApplyError> {
        let err = self.db("locking the offset row");
        let key: [&(dyn ToSql + Sync); 4] = [
            &self.consumer,
            &batch.topic,
            &batch.partition,
            &batch.start_offset,
        ];
        if let Some(row) = tx.query_opt(lock, &key).await.map_err(&err)? {
            return Ok(Fence::Held(row.get(0)));
        }
        // Another writer created the row meanwhile and committed: read where it is without
        // waiting (this transaction may hold accounts by now), and send the batch back.
        let stored = self
            .read_offset(tx, &batch.topic, batch.partition)
            .await?
            .unwrap_or(batch.start_offset);
        Ok(Fence::Lost(stored))
    }

    async fn prepare_is_live(&self, tx: &Transaction<'_>) -> Result<Option<Statement>, ApplyError> {
        if !self.emits {
            return Ok(None);
        }
        tx.prepare_cached(queries::VIEW_IS_LIVE)
            .await
            .map(Some)
            .map_err(self.db("reading the view's state"))
    }

    /// Whether this version is live, for a view that emits notices (held shared until the
    /// batch commits, so a cutover waits for it).
    async fn is_live(
        &self,
        tx: &Transaction<'_>,
        statement: Option<&Statement>,
    ) -> Result<bool, ApplyError> {
        let Some(statement) = statement else {
            return Ok(false);
        };
        let row = tx
            .query_opt(
                statement,
                &[&self.projection.name(), &self.projection.version()],
            )
            .await
            .map_err(self.db("reading the view's state"))?;
        Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// The statements that load the batch's accounts: for an order-dependent view, the one
    /// that creates missing progress rows and the one that locks them; for an
    /// order-independent one, a plain read.
    async fn prepare_accounts(
        &self,
        tx: &Transaction<'_>,
    ) -> Result<Option<AccountStatements>, ApplyError> {
        let err = self.db("loading account progress");
        match self.tracking {
            Tracking::None => Ok(None),
            Tracking::Watermark => {
                let read = tx
                    .prepare_cached(queries::READ_ACCOUNTS_SEEN)
                    .await
                    .map_err(&err)?;
                Ok(Some(AccountStatements { lock: None, read }))
            }
            Tracking::Seq => {
                let (ensure, lock, read, dead) = futures::try_join!(
                    tx.prepare_cached(queries::ENSURE_PROGRESS),
                    tx.prepare_cached(queries::LOCK_ACCOUNTS),
                    tx.prepare_cached(queries::READ_ACCOUNTS),
                    tx.prepare_cached(queries::LOAD_DEAD_SEQS)
                )
                .map_err(&err)?;
                Ok(Some(AccountStatements {
                    lock: Some((ensure, lock, dead)),
                    read,
                }))
            }
        }
    }

    /// The stored state of the batch's accounts (sorted), locked for an order-dependent view.
    async fn load_accounts(
        &self,
        tx: &Transaction<'_>,
        statements: Option<&AccountStatements>,
        accounts: &[i64],
    ) -> Result<HashMap<i64, AccountState>, ApplyError> {
        let Some(statements) = statements else {
            return Ok(HashMap::new());
        };
        if accounts.is_empty() {
            return Ok(HashMap::new());
        }
        let err = self.db("loading account progress");
        let params: [&(dyn ToSql + Sync); 2] = [&self.consumer, &accounts];
        let (ensure, lock, dead) = match &statements.lock {
            Some((ensure, lock, dead)) => (Some(ensure), Some(lock), Some(dead)),
            None => (None, None, None),
        };
        let ensure = async {
            match ensure {
                Some(ensure) => tx.execute(ensure, &params).await,
                None => Ok(0),
            }
        };
        let lock = async {
            match lock {
                Some(lock) => tx.execute(lock, &params).await,
                None => Ok(0),
            }
        };
        // After the lock, in the same pipeline: a dead letter another writer of the account
        // committed meanwhile is seen.
        let dead = async {
            match dead {
                Some(dead) => tx.query(dead, &params).await,
                None => Ok(Vec::new()),
            }
        };
        let (_, _, rows, dead) =
            futures::try_join!(ensure, lock, tx.query(&statements.read, &params), dead)
                .map_err(&err)?;
        let mut states: HashMap<i64, AccountState> = rows
            .iter()
            .map(|row| {
                (
                    row.get(0),
                    AccountState {
                        last_seq: row.get::<_, Option<i64>>(1).unwrap_or(0),
                        last_event_id: row.get(2),
                        last_occurred_at: row.get(6),
                        seen_seq: (row.len() > 7)
                            .then(|| row.get::<_, Option<i64>>(7))
                            .flatten(),
                        watermark: row.get(3),
                        blocked: row.get(4),
                        emit_after: row.get(5),
                        dead: Vec::new(),
                    },
                )
            })
            .collect();
        for row in dead {
            if let Some(state) = states.get_mut(&row.get::<_, i64>(0)) {
                state.dead.push((row.get(1), row.get(2)));
            }
        }
        Ok(states)
    }

    /// Waiting events, from rows of [`queries::LOAD_WAITING`], each decoded again.
    fn waiting_events(&self, rows: Vec<tokio_postgres::Row>) -> Vec<WaitingEvent> {
        rows.into_iter()
            .map(|row| {
                let message = Message::new(row.get(5), row.get(6), row.get::<_, Vec<u8>>(7));
                WaitingEvent {
                    account_id: row.get(0),
                    seq: row.get(1),
                    topic: row.get(3),
                    partition: row.get(4),
                    decoded: self.decode(&message),
                    message,
                }
            })
            .collect()
    }

    /// Decides, per account, what is applied now, what is a duplicate or a conflict, and
    /// what waits.
    async fn plan(
        &self,
        tx: &Transaction<'_>,
        work: &mut Work<'_>,
        states: HashMap<i64, AccountState>,
    ) -> Result<(), ApplyError> {
        // Every waiting event of a parked account in the batch is loaded: the batch may bring
        // what they wait for, repeat one of them, or find the park stale.
        let parked: Vec<i64> = states
            .iter()
            .filter(|(_, s)| s.blocked.is_some())
            .map(|(a, _)| *a)
            .collect();
        if !parked.is_empty() {
            let rows = tx
                .query(
                    queries::LOAD_WAITING,
                    &[&self.consumer, &parked, &DRAIN_LIMIT],
                )
                .await
                .map_err(self.db("loading waiting events"))?;
            work.load_waiting(self.waiting_events(rows), DRAIN_LIMIT);
            // A batch event past what was loaded of its account may land on a `seq` that
            // an event already waits at: that one is loaded too, so that the sequencer
            // judges the two by their ids (a duplicate, or a conflict).
            let (accounts, seqs) = work.beyond_loaded();
            if !accounts.is_empty() {
                let rows = tx
                    .query(
                        queries::LOAD_WAITING_AT,
                        &[&self.consumer, &accounts, &seqs],
                    )
                    .await
                    .map_err(self.db("loading waiting events"))?;
                work.add_waiting(self.waiting_events(rows));
            }
        }
        work.sequence(states, self.tracking == Tracking::Seq);

        let keys: Vec<(String, DateTime<Utc>)> = work
            .ids_to_check(self.projection.dedup().uses_inbox())
            .into_iter()
            .map(|(id, at)| (id.to_owned(), at))
            .collect();
        let mut known: HashSet<(String, DateTime<Utc>)> = HashSet::new();
        if !keys.is_empty() {
            let ids: Vec<&str> = keys.iter().map(|(id, _)| id.as_str()).collect();
            let times: Vec<DateTime<Utc>> = keys.iter().map(|(_, at)| *at).collect();
            let rows = tx
                .query(queries::IN_INBOX, &[&self.consumer, &ids, &times])
                .await
                .map_err(self.db("looking up the inbox"))?;
            for row in rows {
                let id: String = row.get(0);
                match row.get::<_, Option<DateTime<Utc>>>(1) {
                    Some(at) => {
                        known.insert((id, at));
                    }
                    // A row of the inbox before V0009 knows the id alone: it stands for
                    // every time that id was looked up with.
                    None => known.extend(keys.iter().filter(|(k, _)| *k == id).cloned()),
                }
            }
        }
        let checked: HashSet<(String, DateTime<Utc>)> = keys.into_iter().collect();
        work.classify_taken(&checked, &known);
        work.drop_held_copies(&known);
        work.mark_repeated_ids();
        if self.tracking == Tracking::Watermark && self.projection.dedup().uses_inbox() {
            self.count_below_seen(tx, work).await?;
        }
        Ok(())
    }

    /// Counts the events an order-independent view is about to apply at or below the
    /// highest `seq` it has applied for their account, that the inbox does not know: on a
    /// source ordered per account an event arrives there only as a copy, so each is a copy
    /// the inbox cannot recognise (the same id stamped with another `occurred_at`, or a copy
    /// whose day retention dropped) or a producer that published an account out of order.
    /// Applied all the same (the inbox is the only judge an order-independent view has);
    /// counted and logged so that it shows (`below_seen`). Looked up only for such events,
    /// which a healthy stream never has.
    async fn count_below_seen(
        &self,
        tx: &Transaction<'_>,
        work: &mut Work<'_>,
    ) -> Result<(), ApplyError> {
        let below = work.below_seen();
        if below.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = below.iter().map(|b| b.event_id).collect();
        let times: Vec<DateTime<Utc>> = below.iter().map(|b| b.occurred_at).collect();
        let rows = tx
            .query(queries::IN_INBOX, &[&self.consumer, &ids, &times])
            .await
            .map_err(self.db("looking up the inbox"))?;
        let mut known: HashSet<(String, Option<DateTime<Utc>>)> = HashSet::new();
        for row in rows {
            known.insert((row.get(0), row.get(1)));
        }
        let mut counted = 0;
        for b in &below {
            let id = b.event_id.to_owned();
            if known.contains(&(id.clone(), Some(b.occurred_at))) || known.contains(&(id, None)) {
                continue;
            }
            counted += 1;
            tracing::warn!(
                consumer = %self.consumer,
                account_id = b.account_id,
                seq = b.seq,
                seen_seq = b.seen_seq,
                event_id = b.event_id,
                occurred_at = %b.occurred_at.to_rfc3339(),
                "an order-independent view applies an event at or below the highest seq it has applied for the account, which its inbox does not know: a copy stamped with another occurred_at, a copy whose day was pruned, or events published out of order; it is counted (below_seen) and likely applied twice (see docs/operations.md)"
            );
        }
        work.counts_mut().below_seen += counted;
        Ok(())
    }
}
