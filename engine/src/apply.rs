//! The hot path: one batch of one partition, applied to one view version, in one transaction.
//!
//! 1. Decode every message; poison is dead-lettered with its raw bytes.
//! 2. Lock the partition's offset row and check that the batch starts where the last
//!    committed batch ended (fencing); read the batch's accounts' progress, pipelined.
//! 3. Per account, decide what is applied now, what is a duplicate and what waits
//!    ([`crate::sequencer`]).
//! 4. Split the events into key-disjoint rounds (round *i* holds the *i*-th event of each
//!    account), unless the view is order-independent, and run the view's statement once per
//!    round, pipelined. One statement may not touch a row twice, and merging an account's
//!    deltas would lose their order; rounds avoid both.
//! 5. If a statement fails, roll back to a savepoint and redo the rounds one savepoint per
//!    round, then one per event, to find the event at fault: it is dead-lettered with the
//!    database error and its account parked; every other account goes on.
//! 6. Write dead letters, parked events, progress and the fenced offset update, pipelined,
//!    and commit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::{Client, Transaction};
use futures::future::try_join_all;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Statement;
use tracing::Instrument;

use crate::event::{decode, Event, Message};
use crate::metrics::ViewMetrics;
use crate::projection::{check_compatible, render, Projection, SourceOrdering, ViewError};
use crate::queries;
use crate::sequencer::{self, Item, Park, Verdict};

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
    /// Its `seq` was already applied (or is already waiting).
    Duplicate,
    /// Its `seq` is at or below the rebuild watermark: the snapshot holds its effect.
    BelowWatermark,
    /// Stored in `projector.parked_events`, waiting for an earlier `seq` or an engineer.
    Waiting,
    /// Stored in `projector.dead_letters`: poison, or its statement failed.
    DeadLettered,
}

/// Counters of one batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events whose effect this batch wrote.
    pub applied: u64,
    /// Events of types the view does not subscribe to.
    pub ignored: u64,
    /// Duplicates dropped because their `seq` was already applied or waiting.
    pub dup_seq: u64,
    /// Events skipped because a rebuild snapshot already reflects them.
    pub dup_watermark: u64,
    /// Duplicates dropped by the inbox insert inside the statement.
    pub dup_inbox: u64,
    /// Duplicates dropped by the view's version filter inside the statement.
    pub dup_version_filter: u64,
    /// Messages dead-lettered as poison.
    pub poison: u64,
    /// Events dead-lettered because the view's statement failed on them.
    pub failed: u64,
    /// Events of this batch that now wait in `projector.parked_events`.
    pub parked: u64,
    /// Events that waited in earlier batches and were applied in this one.
    pub drained: u64,
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
        self.parked += c.parked;
        self.drained += c.drained;
    }
}

impl Counts {
    /// All duplicates, whatever caught them.
    pub fn duplicates(&self) -> u64 {
        self.dup_seq + self.dup_watermark + self.dup_inbox + self.dup_version_filter
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
}

/// Why a batch was not applied. Nothing of it was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// Another writer committed this partition past our start: we lost the partition, or
    /// must seek to `stored`.
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
    /// PostgreSQL failed in a way no single event explains (connection lost, deadlock, a
    /// broken view statement). The batch can be retried.
    #[error("{consumer}: while {doing}: {source}")]
    Database {
        /// View version.
        consumer: String,
        /// What the engine was doing.
        doing: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl ApplyError {
    /// True for errors where the same batch may succeed later (database trouble); false for
    /// fencing and malformed batches, where the caller must seek or stop.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ApplyError::Database { .. })
    }
}

/// Applies batches to one view version.
pub struct Applier {
    projection: Arc<dyn Projection>,
    consumer: String,
    /// With per-account ordering the engine tracks `seq`; without it, only the inbox dedups.
    seq_tracking: bool,
    subscribes: HashSet<String>,
    statement: String,
    metrics: ViewMetrics,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("consumer", &self.consumer)
            .field("seq_tracking", &self.seq_tracking)
            .finish_non_exhaustive()
    }
}

/// The full statement for a view: the engine's inbox-guarded prefix, the view's CTEs and its
/// write, and a final count of events seen and rows written.
pub fn compose_statement(projection: &dyn Projection) -> String {
    let sql = projection.apply_sql();
    let mut s = String::from(queries::STATEMENT_PREFIX);
    s.push_str(if projection.dedup().uses_inbox() {
        queries::INBOX_CTES
    } else {
        queries::NO_INBOX_CTES
    });
    let ctes = sql.ctes.trim().trim_end_matches(',');
    if !ctes.is_empty() {
        s.push_str(",\n");
        s.push_str(&render(projection, ctes));
    }
    // Each part ends with a newline, so a view's SQL may end in a `--` comment.
    s.push_str("\n,\nwritten AS (");
    s.push_str(&render(projection, sql.write.trim().trim_end_matches(';')));
    s.push_str("\n)\nSELECT (SELECT count(*) FROM ev), (SELECT count(*) FROM written)");
    s
}

struct StoredEvent {
    account_id: i64,
    seq: i64,
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    event: Result<Event, String>,
}

/// One account's work in this batch.
struct AccountWork {
    account_id: i64,
    initial: sequencer::Stored,
    plan: sequencer::Plan,
    /// Indexes into `plan.emitted` of events whose statement failed, with the error. With
    /// `seq` tracking there is at most one: the account is parked at the first failure.
    failures: Vec<(usize, String)>,
}

/// Everything known about a batch while it is being applied.
struct Work<'b> {
    batch: &'b Batch,
    decoded: Vec<Result<Event, String>>,
    stored: Vec<StoredEvent>,
    accounts: Vec<AccountWork>,
    dispositions: Vec<Disposition>,
    counts: Counts,
}

impl Work<'_> {
    fn event(&self, item: Item) -> Option<&Event> {
        match item {
            Item::Batch(i) => self.decoded[i].as_ref().ok(),
            Item::Stored(i) => self.stored[i].event.as_ref().ok(),
        }
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
        Ok(Self {
            statement: compose_statement(&*projection),
            subscribes: projection
                .subscribes()
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            metrics: ViewMetrics::new(&consumer),
            seq_tracking: ordering == SourceOrdering::PerAccount,
            consumer,
            projection,
        })
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
        move |source| ApplyError::Database {
            consumer: self.consumer.clone(),
            doing,
            source,
        }
    }

    /// Prepares the view's statement, so that a broken view fails at start, not mid-stream.
    pub async fn prepare(&self, client: &Client) -> Result<(), ApplyError> {
        client
            .prepare_cached(&self.statement)
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
            let mut tx = client.transaction().await.map_err(self.db("beginning the transaction"))?;
            let outcome = self.apply_in(&mut tx, batch).await?;
            tx.commit().await.map_err(self.db("committing"))?;
            self.metrics.record(&outcome.counts, started.elapsed());
            tracing::debug!(next_offset = outcome.next_offset, counts = ?outcome.counts, "batch committed");
            Ok(outcome)
        }
        .instrument(span)
        .await
    }

    /// Applies a batch inside the caller's transaction without committing it. Dropping the
    /// transaction afterwards is a crash between apply and commit: nothing stays.
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
            });
        };
        let next_offset = last.offset + 1;
        let decoded: Vec<Result<Event, String>> =
            batch.messages.iter().map(|m| self.decode(m)).collect();

        let mut account_ids: Vec<i64> = decoded
            .iter()
            .filter_map(|e| e.as_ref().ok().map(|e| e.account_id))
            .collect();
        account_ids.sort_unstable();
        account_ids.dedup();
        let tracked: &[i64] = if self.seq_tracking { &account_ids } else { &[] };

        let (stored_offset, account_rows) =
            futures::try_join!(self.lock_offset(tx, batch), self.load_accounts(tx, tracked))?;
        if stored_offset != batch.start_offset {
            return Err(ApplyError::Fenced {
                consumer: self.consumer.clone(),
                topic: batch.topic.clone(),
                partition: batch.partition,
                start: batch.start_offset,
                stored: stored_offset,
            });
        }

        let mut work = Work {
            batch,
            dispositions: vec![Disposition::DeadLettered; decoded.len()],
            decoded,
            stored: Vec::new(),
            accounts: Vec::new(),
            counts: Counts::default(),
        };
        work.counts.poison = work.decoded.iter().filter(|d| d.is_err()).count() as u64;
        self.plan(tx, &mut work, account_rows).await?;

        let rounds = self.rounds(&work, false);
        // The fast path's savepoint is opened in the same pipeline as the rounds and released
        // in the same pipeline as the bookkeeping: two round trips fewer per batch than
        // awaiting each, which matters most for the small batches of a live stream.
        let mut release = false;
        if !rounds.is_empty() {
            match self.run_rounds_pipelined(tx, &work, &rounds).await {
                Ok(results) => {
                    release = true;
                    for (round, result) in rounds.iter().zip(results) {
                        self.count_statement(&mut work.counts, round.len(), result);
                    }
                }
                Err(first) => {
                    tx.batch_execute(queries::ROLLBACK_BATCH_SAVEPOINT)
                        .await
                        .map_err(self.db("rolling back a savepoint"))?;
                    tracing::debug!(error = %first, "a statement failed; isolating the event at fault");
                    self.run_rounds_careful(tx, &mut work).await?;
                }
            }
        }

        self.settle(&mut work);
        let counts = self
            .write_bookkeeping(tx, &work, next_offset, release)
            .await?;
        work.counts = counts;
        let dispositions = batch
            .messages
            .iter()
            .zip(&work.dispositions)
            .map(|(m, d)| (m.offset, *d))
            .collect();
        Ok(BatchOutcome {
            next_offset,
            counts: work.counts,
            dispositions,
        })
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

    fn decode(&self, message: &Message) -> Result<Event, String> {
        let event = decode(message).map_err(|e| e.to_string())?;
        if self.subscribes.contains(&event.event_type) {
            self.projection
                .validate(&event)
                .map_err(|e| format!("rejected by view {}: {e}", self.consumer))?;
        }
        Ok(event)
    }

    async fn lock_offset(&self, tx: &Transaction<'_>, batch: &Batch) -> Result<i64, ApplyError> {
        let key: [&(dyn ToSql + Sync); 3] = [&self.consumer, &batch.topic, &batch.partition];
        let err = self.db("locking the offset row");
        // Cached per connection: a plain string would cost a parse round trip (and a plan) on
        // every batch before the query itself.
        let lock = tx
            .prepare_cached(queries::LOCK_OFFSET)
            .await
            .map_err(&err)?;
        if let Some(row) = tx.query_opt(&lock, &key).await.map_err(&err)? {
            return Ok(row.get(0));
        }
        let created = tx
            .query_opt(
                queries::CREATE_OFFSET,
                &[
                    &self.consumer,
                    &batch.topic,
                    &batch.partition,
                    &batch.start_offset,
                ],
            )
            .await
            .map_err(&err)?;
        if let Some(row) = created {
            return Ok(row.get(0));
        }
        let row = tx.query_one(&lock, &key).await.map_err(&err)?;
        Ok(row.get(0))
    }

    async fn load_accounts(
        &self,
        tx: &Transaction<'_>,
        accounts: &[i64],
    ) -> Result<Vec<tokio_postgres::Row>, ApplyError> {
        if accounts.is_empty() {
            return Ok(Vec::new());
        }
        let err = self.db("loading account progress");
        let load = tx
            .prepare_cached(queries::LOAD_ACCOUNTS)
            .await
            .map_err(&err)?;
        tx.query(&load, &[&self.consumer, &accounts])
            .await
            .map_err(&err)
    }

    /// Decides, per account, what is applied now, what is a duplicate and what waits.
    async fn plan(
        &self,
        tx: &Transaction<'_>,
        work: &mut Work<'_>,
        rows: Vec<tokio_postgres::Row>,
    ) -> Result<(), ApplyError> {
        let mut incoming: BTreeMap<i64, Vec<(i64, Item)>> = BTreeMap::new();
        for (i, d) in work.decoded.iter().enumerate() {
            if let Ok(ev) = d {
                incoming
                    .entry(ev.account_id)
                    .or_default()
                    .push((ev.seq, Item::Batch(i)));
            }
        }

        if !self.seq_tracking {
            // No ordering promise: every event goes to the statement, where the inbox is the
            // only judge. Only a repeat of an event_id within the batch is dropped here, because
            // one statement must not see an event twice.
            let mut seen = HashSet::new();
            for (account_id, events) in incoming {
                let mut emitted = Vec::new();
                for (seq, item) in events {
                    let Item::Batch(i) = item else { continue };
                    let id = work.decoded[i]
                        .as_ref()
                        .map(|e| e.event_id.as_str())
                        .unwrap_or_default();
                    if seen.insert(id.to_owned()) {
                        work.dispositions[i] = Disposition::Applied;
                        emitted.push((seq, item));
                    } else {
                        work.dispositions[i] = Disposition::Duplicate;
                        work.counts.dup_inbox += 1;
                    }
                }
                work.accounts.push(AccountWork {
                    account_id,
                    initial: sequencer::Stored::default(),
                    plan: sequencer::Plan {
                        emitted,
                        ..sequencer::Plan::default()
                    },
                    failures: Vec::new(),
                });
            }
            return Ok(());
        }

        let mut stored_state: HashMap<i64, sequencer::Stored> = HashMap::with_capacity(rows.len());
        let mut drainable = Vec::new();
        for row in rows {
            let account_id: i64 = row.get(0);
            let park = match (row.get::<_, Option<&str>>(3), row.get::<_, Option<i64>>(4)) {
                (Some("failed"), Some(b)) => Some(Park::Failed { blocked_seq: b }),
                (Some(_), Some(b)) => Some(Park::Gap { blocked_seq: b }),
                _ => None,
            };
            // Waiting events are loaded only when this batch brings the one they wait for.
            if let Some(Park::Gap { blocked_seq }) = park {
                if incoming
                    .get(&account_id)
                    .is_some_and(|evs| evs.iter().any(|(s, _)| *s == blocked_seq))
                {
                    drainable.push(account_id);
                }
            }
            stored_state.insert(
                account_id,
                sequencer::Stored {
                    last_seq: row.get::<_, Option<i64>>(1).unwrap_or(0),
                    watermark: row.get(2),
                    park,
                    waiting: BTreeMap::new(),
                },
            );
        }

        if !drainable.is_empty() {
            let rows = tx
                .query(queries::LOAD_WAITING, &[&self.consumer, &drainable])
                .await
                .map_err(self.db("loading waiting events"))?;
            for row in rows {
                let message = Message::new(row.get(4), row.get(5), row.get::<_, Vec<u8>>(6));
                let event = self.decode(&message);
                let stored = StoredEvent {
                    account_id: row.get(0),
                    seq: row.get(1),
                    topic: row.get(2),
                    partition: row.get(3),
                    offset: message.offset,
                    key: message.key,
                    payload: message.payload,
                    event,
                };
                if let Some(state) = stored_state.get_mut(&stored.account_id) {
                    state
                        .waiting
                        .insert(stored.seq, Item::Stored(work.stored.len()));
                }
                work.stored.push(stored);
            }
        }

        for (account_id, events) in incoming {
            let initial = stored_state.remove(&account_id).unwrap_or_default();
            let plan = sequencer::plan(initial.clone(), &events);
            for (&(_, item), verdict) in events.iter().zip(&plan.verdicts) {
                let Item::Batch(i) = item else { continue };
                work.dispositions[i] = match verdict {
                    Verdict::Emit => Disposition::Applied,
                    Verdict::Duplicate => {
                        work.counts.dup_seq += 1;
                        Disposition::Duplicate
                    }
                    Verdict::Watermark => {
                        work.counts.dup_watermark += 1;
                        Disposition::BelowWatermark
                    }
                    Verdict::Wait => Disposition::Waiting,
                };
            }
            work.accounts.push(AccountWork {
                account_id,
                initial,
                plan,
                failures: Vec::new(),
            });
        }
        Ok(())
    }

    fn subscribed(&self, work: &Work<'_>, item: Item) -> bool {
        work.event(item)
            .is_some_and(|e| self.subscribes.contains(&e.event_type))
    }

    /// Key-disjoint rounds of (account index, emitted index). Order-independent views get one
    /// round with everything, unless `by_account` asks for rounds anyway (failure isolation).
    fn rounds(&self, work: &Work<'_>, by_account: bool) -> Vec<Vec<(usize, usize)>> {
        let mut rounds: Vec<Vec<(usize, usize)>> = Vec::new();
        let single = self.projection.order_independent() && !by_account;
        for (a, acc) in work.accounts.iter().enumerate() {
            let mut r = 0;
            for (k, &(_, item)) in acc.plan.emitted.iter().enumerate() {
                if !self.subscribed(work, item) {
                    continue;
                }
                let slot = if single { 0 } else { r };
                if rounds.len() <= slot {
                    rounds.push(Vec::new());
                }
                rounds[slot].push((a, k));
                r += 1;
            }
        }
        rounds
    }

    async fn run_statement(
        &self,
        tx: &Transaction<'_>,
        statement: &Statement,
        work: &Work<'_>,
        round: &[(usize, usize)],
    ) -> Result<(i64, i64), tokio_postgres::Error> {
        let n = round.len();
        let (mut ids, mut accounts, mut seqs, mut types, mut times, mut data) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for &(a, k) in round {
            let item = work.accounts[a].plan.emitted[k].1;
            if let Some(ev) = work.event(item) {
                ids.push(ev.event_id.as_str());
                accounts.push(ev.account_id);
                seqs.push(ev.seq);
                types.push(ev.event_type.as_str());
                times.push(ev.occurred_at);
                data.push(ev.data.as_str());
            }
        }
        let row = tx
            .query_one(
                statement,
                &[
                    &self.consumer,
                    &ids,
                    &accounts,
                    &seqs,
                    &types,
                    &times,
                    &data,
                ],
            )
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    fn count_statement(&self, counts: &mut Counts, sent: usize, (fresh, written): (i64, i64)) {
        let sent = sent as u64;
        let fresh = fresh.max(0) as u64;
        let written = written.max(0) as u64;
        counts.dup_inbox += sent.saturating_sub(fresh);
        let filtered = if self.projection.dedup().uses_version_filter() {
            fresh.saturating_sub(written)
        } else {
            0
        };
        counts.dup_version_filter += filtered;
        counts.applied += fresh - filtered;
    }

    /// The fast path: the savepoint and every round's statement sent at once on the
    /// connection. PostgreSQL runs them in order; the first failure aborts the savepoint and
    /// the rest. The caller releases the savepoint (or rolls back to it).
    async fn run_rounds_pipelined(
        &self,
        tx: &Transaction<'_>,
        work: &Work<'_>,
        rounds: &[Vec<(usize, usize)>],
    ) -> Result<Vec<(i64, i64)>, tokio_postgres::Error> {
        let statement = tx.prepare_cached(&self.statement).await?;
        // try_join! polls in order, and tokio-postgres sends a request when it is first
        // polled: the savepoint goes out before the rounds.
        let open = tx.batch_execute(queries::OPEN_BATCH_SAVEPOINT);
        let rounds = try_join_all(
            rounds
                .iter()
                .map(|round| self.run_statement(tx, &statement, work, round)),
        );
        let ((), results) = futures::try_join!(open, rounds)?;
        Ok(results)
    }

    /// The slow path after a failure: one savepoint per round, and per event inside a round
    /// that failed, so that exactly the events at fault are dead-lettered.
    async fn run_rounds_careful(
        &self,
        tx: &mut Transaction<'_>,
        work: &mut Work<'_>,
    ) -> Result<(), ApplyError> {
        let statement = tx
            .prepare_cached(&self.statement)
            .await
            .map_err(self.db("preparing the view statement"))?;
        let rounds = self.rounds(work, true);
        for round in rounds {
            let round: Vec<(usize, usize)> = round
                .into_iter()
                .filter(|&(a, _)| !self.seq_tracking || work.accounts[a].failures.is_empty())
                .collect();
            if round.is_empty() {
                continue;
            }
            let sp = tx
                .savepoint("projector_round")
                .await
                .map_err(self.db("opening a savepoint"))?;
            match self.run_statement(&sp, &statement, work, &round).await {
                Ok(result) => {
                    sp.commit()
                        .await
                        .map_err(self.db("releasing a savepoint"))?;
                    self.count_statement(&mut work.counts, round.len(), result);
                    continue;
                }
                Err(e) if is_event_error(&e) => {
                    sp.rollback()
                        .await
                        .map_err(self.db("rolling back a savepoint"))?;
                }
                Err(e) => return Err(self.db("applying a round")(e)),
            }
            for (a, k) in round {
                let sp = tx
                    .savepoint("projector_event")
                    .await
                    .map_err(self.db("opening a savepoint"))?;
                match self.run_statement(&sp, &statement, work, &[(a, k)]).await {
                    Ok(result) => {
                        sp.commit()
                            .await
                            .map_err(self.db("releasing a savepoint"))?;
                        self.count_statement(&mut work.counts, 1, result);
                    }
                    Err(e) if is_event_error(&e) => {
                        sp.rollback()
                            .await
                            .map_err(self.db("rolling back a savepoint"))?;
                        let message = describe_db_error(&e);
                        tracing::warn!(consumer = %self.consumer, account = work.accounts[a].account_id, error = %message, "view statement failed; event dead-lettered");
                        work.accounts[a].failures.push((k, message));
                    }
                    Err(e) => return Err(self.db("applying one event")(e)),
                }
            }
        }
        Ok(())
    }

    /// Folds statement failures into each account's plan and fills in the dispositions.
    fn settle(&self, work: &mut Work<'_>) {
        for a in 0..work.accounts.len() {
            let acc = &work.accounts[a];
            let failed: HashSet<usize> = acc.failures.iter().map(|(k, _)| *k).collect();
            // With seq tracking, nothing after the first failure is applied: it waits.
            let cut = match (self.seq_tracking, acc.failures.first()) {
                (true, Some((k, _))) => *k,
                _ => acc.plan.emitted.len(),
            };
            let emitted = acc.plan.emitted.clone();
            for (k, &(_, item)) in emitted.iter().enumerate() {
                let subscribed = self.subscribed(work, item);
                if failed.contains(&k) {
                    work.counts.failed += 1;
                    if let Item::Batch(i) = item {
                        work.dispositions[i] = Disposition::DeadLettered;
                    }
                } else if k > cut {
                    if let Item::Batch(i) = item {
                        work.dispositions[i] = Disposition::Waiting;
                    }
                } else if let Item::Stored(_) = item {
                    work.counts.drained += 1;
                    work.counts.ignored += u64::from(!subscribed);
                } else if let (Item::Batch(i), false) = (item, subscribed) {
                    work.dispositions[i] = Disposition::Ignored;
                    work.counts.ignored += 1;
                }
            }
            if cut == emitted.len() {
                continue;
            }
            let acc = &mut work.accounts[a];
            acc.plan.last_seq = if cut == 0 {
                acc.initial.last_seq
            } else {
                emitted[cut - 1].0
            };
            acc.plan.park = Some(Park::Failed {
                blocked_seq: emitted[cut].0,
            });
            acc.plan.waiting.extend(emitted[cut + 1..].iter().copied());
            acc.plan.emitted.truncate(cut + 1);
        }
        work.counts.parked = work
            .dispositions
            .iter()
            .filter(|d| **d == Disposition::Waiting)
            .count() as u64;
    }

    /// Dead letters, waiting events, parked accounts, progress and the fenced offset update,
    /// sent together. Returns the batch's final counts, which the offset row adds up.
    async fn write_bookkeeping(
        &self,
        tx: &Transaction<'_>,
        work: &Work<'_>,
        next_offset: i64,
        release: bool,
    ) -> Result<Counts, ApplyError> {
        let batch = work.batch;
        let mut dead = DeadLetters::default();
        for (i, d) in work.decoded.iter().enumerate() {
            if let Err(error) = d {
                let m = &batch.messages[i];
                dead.push(
                    &batch.topic,
                    batch.partition,
                    m.offset,
                    "poison",
                    m.key.as_deref(),
                    &m.payload,
                    None,
                    error,
                );
            }
        }

        let mut wait = Waiting::default();
        let (mut done_accounts, mut done_seqs) = (Vec::new(), Vec::new());
        let mut progress = (Vec::new(), Vec::new());
        let mut park = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut unpark = Vec::new();

        for acc in &work.accounts {
            for (k, error) in &acc.failures {
                let item = acc.plan.emitted[*k].1;
                let ev = work.event(item);
                let (topic, partition, offset, key, payload) = match item {
                    Item::Batch(i) => {
                        let m = &batch.messages[i];
                        (
                            batch.topic.as_str(),
                            batch.partition,
                            m.offset,
                            m.key.as_deref(),
                            m.payload.as_slice(),
                        )
                    }
                    Item::Stored(i) => {
                        let s = &work.stored[i];
                        (
                            s.topic.as_str(),
                            s.partition,
                            s.offset,
                            s.key.as_deref(),
                            s.payload.as_slice(),
                        )
                    }
                };
                dead.push(
                    topic,
                    partition,
                    offset,
                    "apply_failed",
                    key,
                    payload,
                    ev,
                    error,
                );
            }
            if !self.seq_tracking {
                continue;
            }
            // Stored events no longer waiting were applied or dead-lettered: remove them.
            for &(seq, item) in &acc.plan.emitted {
                if let Item::Stored(_) = item {
                    done_accounts.push(acc.account_id);
                    done_seqs.push(seq);
                }
            }
            for (&seq, &item) in &acc.plan.waiting {
                if let Item::Batch(i) = item {
                    let m = &batch.messages[i];
                    let ev = work.event(item);
                    wait.push(acc.account_id, seq, ev, &batch.topic, batch.partition, m);
                }
            }
            if acc.plan.last_seq != acc.initial.last_seq {
                progress.0.push(acc.account_id);
                progress.1.push(acc.plan.last_seq);
            }
            match (acc.initial.park, acc.plan.park) {
                (Some(_), None) => unpark.push(acc.account_id),
                (before, Some(now)) if before != Some(now) => {
                    park.0.push(acc.account_id);
                    park.1.push(now.reason());
                    park.2.push(now.blocked_seq());
                    park.3.push(match (now, acc.failures.first()) {
                        (Park::Failed { .. }, Some((_, e))) => {
                            format!("seq {} failed to apply: {e}", now.blocked_seq())
                        }
                        (Park::Failed { .. }, None) => {
                            format!("seq {} failed to apply", now.blocked_seq())
                        }
                        (Park::Gap { .. }, _) => format!(
                            "waiting for seq {}; {} later event(s) wait",
                            now.blocked_seq(),
                            acc.plan.waiting.len()
                        ),
                    });
                }
                _ => {}
            }
        }

        let err = self.db("writing progress and offsets");
        let c = &self.consumer;
        let dead_letters = async {
            if dead.topic.is_empty() {
                return Ok(0);
            }
            dead.write(tx, c).await
        };
        let mut counts = work.counts.clone();
        if !wait.account.is_empty() {
            let inserted = tx
                .execute(
                    queries::INSERT_WAITING,
                    &[
                        c,
                        &wait.account,
                        &wait.seq,
                        &wait.event_id,
                        &wait.topic,
                        &wait.partition,
                        &wait.offset,
                        &wait.key,
                        &wait.payload,
                    ],
                )
                .await
                .map_err(&err)?;
            // An event already waiting from an earlier batch is a duplicate: the insert
            // skipped it. Known before the offset row adds up the counts.
            counts.dup_seq += counts.parked.saturating_sub(inserted);
            counts.parked = inserted;
        }
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let (applied, ignored, duplicates, dead_lettered, parked) = (
            as_i64(counts.applied),
            as_i64(counts.ignored),
            as_i64(counts.duplicates()),
            as_i64(counts.poison + counts.failed),
            as_i64(counts.parked),
        );
        let waiting_delete = async {
            if done_accounts.is_empty() {
                return Ok(0);
            }
            tx.execute(queries::DELETE_WAITING, &[c, &done_accounts, &done_seqs])
                .await
        };
        let parks = async {
            if park.0.is_empty() {
                return Ok(0);
            }
            tx.execute(
                queries::PARK_ACCOUNTS,
                &[c, &park.0, &park.1, &park.2, &park.3],
            )
            .await
        };
        let unparks = async {
            if unpark.is_empty() {
                return Ok(0);
            }
            tx.execute(queries::UNPARK_ACCOUNTS, &[c, &unpark]).await
        };
        // The two statements of every batch are cached per connection (no parse round trip
        // or plan per batch); the rare ones above are not worth a cache slot.
        let save_statement = tx
            .prepare_cached(queries::SAVE_PROGRESS)
            .await
            .map_err(&err)?;
        let advance_statement = tx
            .prepare_cached(queries::ADVANCE_OFFSET)
            .await
            .map_err(&err)?;
        let save_progress = async {
            if progress.0.is_empty() {
                return Ok(0);
            }
            tx.execute(&save_statement, &[c, &progress.0, &progress.1])
                .await
        };
        let advance = async {
            tx.execute(
                &advance_statement,
                &[
                    c,
                    &batch.topic,
                    &batch.partition,
                    &next_offset,
                    &batch.start_offset,
                    &applied,
                    &ignored,
                    &duplicates,
                    &dead_lettered,
                    &parked,
                ],
            )
            .await
        };
        // Sent first: the fast path's savepoint, if it is still open. Everything here commits
        // or rolls back together with it, so where exactly it is released does not matter.
        let released = async {
            if release {
                tx.batch_execute(queries::RELEASE_BATCH_SAVEPOINT).await?;
            }
            Ok(0)
        };
        let (_, _, _, _, _, _, advanced) = futures::try_join!(
            released,
            dead_letters,
            waiting_delete,
            parks,
            unparks,
            save_progress,
            advance
        )
        .map_err(&err)?;
        if advanced != 1 {
            // Cannot happen while we hold the row lock; refuse to commit if it ever does.
            return Err(ApplyError::Fenced {
                consumer: self.consumer.clone(),
                topic: batch.topic.clone(),
                partition: batch.partition,
                start: batch.start_offset,
                stored: -1,
            });
        }
        Ok(counts)
    }
}

/// Errors caused by one event's data (bad value, constraint, a view's own `RAISE`), as
/// opposed to trouble with the database or the statement itself.
fn is_event_error(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else { return false };
    let c = code.code();
    c.starts_with("22")
        || c.starts_with("23")
        || c.starts_with("P0")
        || code == &SqlState::CARDINALITY_VIOLATION
}

fn describe_db_error(e: &tokio_postgres::Error) -> String {
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

#[derive(Default)]
struct DeadLetters<'a> {
    topic: Vec<&'a str>,
    partition: Vec<i32>,
    offset: Vec<i64>,
    kind: Vec<&'static str>,
    key: Vec<Option<&'a [u8]>>,
    payload: Vec<&'a [u8]>,
    event_id: Vec<Option<&'a str>>,
    account_id: Vec<Option<i64>>,
    seq: Vec<Option<i64>>,
    error: Vec<&'a str>,
}

impl<'a> DeadLetters<'a> {
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        topic: &'a str,
        partition: i32,
        offset: i64,
        kind: &'static str,
        key: Option<&'a [u8]>,
        payload: &'a [u8],
        event: Option<&'a Event>,
        error: &'a str,
    ) {
        self.topic.push(topic);
        self.partition.push(partition);
        self.offset.push(offset);
        self.kind.push(kind);
        self.key.push(key);
        self.payload.push(payload);
        self.event_id.push(event.map(|e| e.event_id.as_str()));
        self.account_id.push(event.map(|e| e.account_id));
        self.seq.push(event.map(|e| e.seq));
        self.error.push(error);
    }

    async fn write(
        &self,
        tx: &Transaction<'_>,
        consumer: &String,
    ) -> Result<u64, tokio_postgres::Error> {
        tx.execute(
            queries::INSERT_DEAD_LETTERS,
            &[
                consumer,
                &self.topic,
                &self.partition,
                &self.offset,
                &self.kind,
                &self.key,
                &self.payload,
                &self.event_id,
                &self.account_id,
                &self.seq,
                &self.error,
            ],
        )
        .await
    }
}

#[derive(Default)]
struct Waiting<'a> {
    account: Vec<i64>,
    seq: Vec<i64>,
    event_id: Vec<&'a str>,
    topic: Vec<&'a str>,
    partition: Vec<i32>,
    offset: Vec<i64>,
    key: Vec<Option<&'a [u8]>>,
    payload: Vec<&'a [u8]>,
}

impl<'a> Waiting<'a> {
    fn push(
        &mut self,
        account: i64,
        seq: i64,
        event: Option<&'a Event>,
        topic: &'a str,
        partition: i32,
        m: &'a Message,
    ) {
        self.account.push(account);
        self.seq.push(seq);
        self.event_id
            .push(event.map_or("", |e| e.event_id.as_str()));
        self.topic.push(topic);
        self.partition.push(partition);
        self.offset.push(m.offset);
        self.key.push(m.key.as_deref());
        self.payload.push(&m.payload);
    }
}
