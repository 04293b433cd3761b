//! What a batch records besides the view's rows, in the same transaction: dead letters,
//! waiting events, parked accounts, per-account progress, and the fenced offset update with
//! the batch's counts. All of it goes out in one pipeline.

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;

use crate::apply::plan::{Decoded, Source, Work};
use crate::apply::types::{ApplyError, Counts};
use crate::apply::Applier;
use crate::event::{safe_text, Event, MAX_ID_BYTES};
use crate::queries;
use crate::sequencer::Item;

/// The longest error text stored on a dead letter.
const MAX_ERROR_BYTES: usize = 2000;

/// Where the offset moves when the batch commits.
#[derive(Debug, Clone)]
pub(crate) struct Advance<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub start_offset: i64,
    pub next_offset: i64,
}

/// One dead letter. Text columns get a safe rendering: writing a dead letter must never fail
/// because of what the message holds (its raw bytes go in as `bytea`).
struct DeadLetter<'a> {
    source: Source<'a>,
    kind: &'static str,
    event_id: Option<String>,
    account_id: Option<i64>,
    seq: Option<i64>,
    error: String,
}

/// Dead letters as the columns of [`queries::INSERT_DEAD_LETTERS`].
#[derive(Default)]
struct DeadLetters<'a> {
    topic: Vec<&'a str>,
    partition: Vec<i32>,
    offset: Vec<i64>,
    kind: Vec<&'static str>,
    key: Vec<Option<&'a [u8]>>,
    payload: Vec<&'a [u8]>,
    event_id: Vec<Option<String>>,
    account_id: Vec<Option<i64>>,
    seq: Vec<Option<i64>>,
    error: Vec<String>,
    seen: std::collections::HashSet<(&'a str, i32, i64)>,
}

impl Advance<'_> {
    /// The fenced offset update, adding the batch's counts. Returns the rows updated: 1, or
    /// 0 when the partition is not where the batch started.
    async fn run(
        &self,
        tx: &Transaction<'_>,
        statement: &tokio_postgres::Statement,
        consumer: &str,
        owner: &str,
        counts: &Counts,
    ) -> Result<u64, tokio_postgres::Error> {
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        tx.execute(
            statement,
            &[
                &consumer,
                &self.topic,
                &self.partition,
                &self.next_offset,
                &self.start_offset,
                &as_i64(counts.applied),
                &as_i64(counts.ignored),
                &as_i64(counts.duplicates()),
                &as_i64(counts.dead_lettered()),
                &as_i64(counts.waiting),
                &as_i64(counts.drained),
                &owner,
                &as_i64(counts.dup_seq),
                &as_i64(counts.dup_watermark),
                &as_i64(counts.dup_inbox),
                &as_i64(counts.dup_version_filter),
                &as_i64(counts.outside_window),
                &as_i64(counts.below_seen),
            ],
        )
        .await
    }
}

impl<'a> DeadLetters<'a> {
    fn push(&mut self, d: DeadLetter<'a>) {
        // One row per message: the insert's conflict clause updates the open row, and one
        // statement may not update a row twice.
        if !self
            .seen
            .insert((d.source.topic, d.source.partition, d.source.offset))
        {
            return;
        }
        self.topic.push(d.source.topic);
        self.partition.push(d.source.partition);
        self.offset.push(d.source.offset);
        self.kind.push(d.kind);
        self.key.push(d.source.key);
        self.payload.push(d.source.payload);
        self.event_id
            .push(d.event_id.map(|id| safe_text(&id, MAX_ID_BYTES)));
        self.account_id.push(d.account_id);
        self.seq.push(d.seq);
        self.error.push(safe_text(&d.error, MAX_ERROR_BYTES));
    }

    fn is_empty(&self) -> bool {
        self.topic.is_empty()
    }
}

/// Waiting events as the columns of [`queries::INSERT_WAITING`].
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
    /// For an event held for its version: its type and version.
    held_type: Vec<Option<&'a str>>,
    held_version: Vec<Option<i32>>,
}

impl<'a> Waiting<'a> {
    fn push(
        &mut self,
        account: i64,
        seq: i64,
        event_id: &'a str,
        source: Source<'a>,
        held: Option<&'a Event>,
    ) {
        self.held_type.push(held.map(|e| e.event_type.as_str()));
        self.held_version.push(held.map(|e| e.type_version));
        self.account.push(account);
        self.seq.push(seq);
        self.event_id.push(event_id);
        self.topic.push(source.topic);
        self.partition.push(source.partition);
        self.offset.push(source.offset);
        self.key.push(source.key);
        self.payload.push(source.payload);
    }
}

/// Accounts that end parked, as the columns of [`queries::PARK_ACCOUNTS`].
#[derive(Default)]
struct Parks<'a> {
    account: Vec<i64>,
    blocked: Vec<i64>,
    /// Events that wait.
    waiting: Vec<i64>,
    /// When the event at the blocked `seq` is held for its version: its type, its version and
    /// why (the park's reason is then `unknown_version`).
    held_type: Vec<Option<&'a str>>,
    held_version: Vec<Option<i32>>,
    held_why: Vec<Option<&'a str>>,
}

impl<'a> Parks<'a> {
    fn push(
        &mut self,
        account: i64,
        blocked: i64,
        waiting: i64,
        held: Option<(&'a Event, &'a str)>,
    ) {
        self.account.push(account);
        self.blocked.push(blocked);
        self.waiting.push(waiting);
        self.held_type
            .push(held.map(|(e, _)| e.event_type.as_str()));
        self.held_version.push(held.map(|(e, _)| e.type_version));
        self.held_why.push(held.map(|(_, why)| why));
    }
}

/// Everything the bookkeeping pipeline writes, gathered from the settled work.
#[derive(Default)]
struct Rows<'a> {
    dead: DeadLetters<'a>,
    wait: Waiting<'a>,
    /// Waiting events that leave the table: (account, seq).
    drained: (Vec<i64>, Vec<i64>),
    /// Accounts that end parked.
    parks: Parks<'a>,
    unparks: Vec<i64>,
    /// Poison of accounts the batch holds no sound event of: (account, seq).
    relabel: (Vec<i64>, Vec<i64>),
    /// The (account, seq, event id) of every event this batch applied: open dead letters of
    /// the same event at that seq are superseded.
    superseded: (Vec<i64>, Vec<i64>, Vec<&'a str>),
    /// Accounts whose `last_seq` moved: (account, last seq, event holding it, its time).
    progress: Progress<'a>,
    /// For an order-independent view: the highest `seq` applied or ignored per account
    /// (account, seq), sorted by account ([`queries::SAVE_SEEN`]).
    seen: (Vec<i64>, Vec<i64>),
}

/// The columns of [`queries::SAVE_PROGRESS`].
type Progress<'a> = (
    Vec<i64>,
    Vec<i64>,
    Vec<Option<&'a str>>,
    Vec<Option<DateTime<Utc>>>,
);

fn gather<'a>(work: &'a Work<'_>, track_seq: bool) -> Rows<'a> {
    let mut rows = Rows::default();
    let mut seen: Vec<(i64, i64)> = Vec::new();
    for (i, d) in work.decoded().iter().enumerate() {
        if let Decoded::Poison { error, salvage } = d {
            if let (Some(account), Some(seq)) = (salvage.account_id, salvage.seq) {
                if !work.accounts().iter().any(|a| a.account_id == account) {
                    rows.relabel.0.push(account);
                    rows.relabel.1.push(seq);
                }
            }
            rows.dead.push(DeadLetter {
                source: work.source(Item::Batch(i)),
                kind: "poison",
                event_id: salvage.event_id.clone(),
                account_id: salvage.account_id,
                seq: salvage.seq,
                error: error.clone(),
            });
        }
    }
    for i in work.waiting_poison() {
        let s = work.waiting_event(i);
        let Decoded::Poison { error, salvage } = &s.decoded else {
            continue;
        };
        rows.dead.push(DeadLetter {
            source: work.source(Item::Waiting(i)),
            kind: "poison",
            event_id: salvage.event_id.clone(),
            account_id: Some(s.account_id),
            seq: Some(s.seq),
            error: format!("waited for an earlier seq, then no longer decoded: {error}"),
        });
        rows.drained.0.push(s.account_id);
        rows.drained.1.push(s.seq);
    }
    for c in work.conflicts() {
        let ev = work.decoded()[c.index].event();
        rows.dead.push(DeadLetter {
            source: work.source(Item::Batch(c.index)),
            kind: "conflict",
            event_id: ev.map(|e| e.event_id.clone()),
            account_id: ev.map(|e| e.account_id),
            seq: ev.map(|e| e.seq),
            error: c.error.clone(),
        });
    }

    // The batch's events whose statement failed.
    let failed_items: std::collections::HashSet<Item> = work
        .accounts()
        .iter()
        .flat_map(|acc| acc.failures.iter().map(|(k, _)| acc.plan.emitted[*k].1))
        .collect();
    for acc in work.accounts() {
        for (k, error) in &acc.failures {
            let item = acc.plan.emitted[*k].1;
            let ev = work.event(item);
            rows.dead.push(DeadLetter {
                source: work.source(item),
                kind: "apply_failed",
                event_id: ev.map(|e| e.event_id.clone()),
                account_id: ev.map(|e| e.account_id),
                seq: ev.map(|e| e.seq),
                error: error.clone(),
            });
        }
        // Loaded waiting events that no longer wait were applied, ignored, dead-lettered, or found
        // stale (their seq applied meanwhile).
        for &(seq, item) in acc.plan.emitted.iter().chain(&acc.plan.stale) {
            if let Item::Waiting(_) = item {
                rows.drained.0.push(acc.account_id);
                rows.drained.1.push(seq);
            }
        }
        for (&seq, &item) in &acc.plan.waiting {
            if let (Item::Batch(_), Some(ev)) = (item, work.event(item)) {
                let held = work.held(item).map(|(e, _)| e);
                rows.wait
                    .push(acc.account_id, seq, &ev.event_id, work.source(item), held);
            }
        }
        let failed: std::collections::HashSet<usize> =
            acc.failures.iter().map(|(k, _)| *k).collect();
        // A repeat of an id earlier in the batch was never sent: it holds its seq as an inbox
        // duplicate does, unless its first carrier failed: an identical copy of a failed event
        // would otherwise resolve the original's own dead letter. (A carrier held back to wait
        // is applied when it drains; its repeat is its duplicate, as before.)
        for (k, &(seq, item)) in acc.plan.emitted.iter().enumerate() {
            let holds = match work.repeat_of(item) {
                Some(carrier) => !failed_items.contains(&carrier),
                None => true,
            };
            if let (false, true, Some(ev)) = (failed.contains(&k), holds, work.event(item)) {
                rows.superseded.0.push(acc.account_id);
                rows.superseded.1.push(seq);
                rows.superseded.2.push(&ev.event_id);
            }
        }
        match acc.blocked_seq() {
            Some(blocked) => {
                let held = acc
                    .plan
                    .waiting
                    .get(&blocked)
                    .and_then(|&item| work.held(item));
                rows.parks
                    .push(acc.account_id, blocked, acc.plan.waiting.len() as i64, held);
            }
            // More waited than were loaded, and every loaded one left: the account stays
            // parked at its next seq, so that the next step (the drain that follows, or the
            // account's next batch) loads the rest. Unparked, nothing would load them: only
            // a parked account's waiting events are read.
            None if work.is_truncated(acc.account_id) => {
                rows.parks
                    .push(acc.account_id, acc.plan.last_seq + 1, 0, None);
            }
            None if acc.initial.blocked.is_some() => rows.unparks.push(acc.account_id),
            None => {}
        }
        if !track_seq {
            // Applied or ignored now (a failed event is not; a held one waits, unemitted).
            let top = acc
                .plan
                .emitted
                .iter()
                .enumerate()
                .filter(|(k, _)| !failed.contains(k))
                .map(|(_, &(seq, _))| seq)
                .max();
            if let Some(top) = top {
                seen.push((acc.account_id, top));
            }
        }
        if track_seq && acc.plan.last_seq != acc.initial.last_seq {
            rows.progress.0.push(acc.account_id);
            rows.progress.1.push(acc.plan.last_seq);
            let (id, at) = work.last_event(acc).unzip();
            rows.progress.2.push(id);
            rows.progress.3.push(at.flatten());
        }
    }
    seen.sort_unstable();
    // One row per account (the highest), in account order: two writers of one account take
    // the rows' locks in the same order.
    seen.dedup_by(|later, earlier| {
        later.0 == earlier.0 && {
            earlier.1 = earlier.1.max(later.1);
            true
        }
    });
    rows.seen = seen.into_iter().unzip();
    rows
}

impl Applier {
    /// Writes everything the batch records besides the view's rows, in one pipeline, and
    /// moves the offset when `advance` is given. Returns the batch's final counts.
    pub(crate) async fn write_bookkeeping(
        &self,
        tx: &Transaction<'_>,
        work: &Work<'_>,
        advance: Option<Advance<'_>>,
        release_savepoint: bool,
        earlier: &Counts,
    ) -> Result<Counts, ApplyError> {
        let rows = gather(work, self.ordered);
        let err = self.db("writing progress and offsets");
        let c = &self.consumer;
        // Every statement is prepared once per connection: on a cache hit preparing costs
        // nothing, and prepared statements go out on the first poll, so the pipeline below
        // reaches PostgreSQL in the order written (a park reads this batch's dead letters).
        let prepare = |sql: &'static str| async move { tx.prepare_cached(sql).await };
        let (
            insert_dead,
            insert_waiting,
            delete_waiting,
            park,
            relabel,
            unpark,
            save,
            save_seen,
            advance_stmt,
            superseded,
        ) = futures::try_join!(
            prepare(queries::INSERT_DEAD_LETTERS),
            prepare(queries::INSERT_WAITING),
            prepare(queries::DELETE_WAITING),
            prepare(queries::PARK_ACCOUNTS),
            prepare(queries::RELABEL_PARKS),
            prepare(queries::UNPARK_ACCOUNTS),
            prepare(queries::SAVE_PROGRESS),
            prepare(queries::SAVE_SEEN),
            prepare(queries::ADVANCE_OFFSET),
            prepare(queries::RESOLVE_SUPERSEDED),
        )
        .map_err(&err)?;

        let mut counts = work.counts().clone();
        // Sent first: the fast path's savepoint, if it is still open. Everything here commits
        // or rolls back together with it, so where exactly it is released does not matter.
        let released = async {
            if release_savepoint {
                tx.batch_execute(queries::RELEASE_BATCH_SAVEPOINT).await?;
            }
            Ok(0)
        };
        let d = &rows.dead;
        let dead_letters = async {
            if d.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &insert_dead,
                &[
                    c,
                    &d.topic,
                    &d.partition,
                    &d.offset,
                    &d.kind,
                    &d.key,
                    &d.payload,
                    &d.event_id,
                    &d.account_id,
                    &d.seq,
                    &d.error,
                ],
            )
            .await
        };
        let w = &rows.wait;
        let waiting = async {
            if w.account.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &insert_waiting,
                &[
                    c,
                    &w.account,
                    &w.seq,
                    &w.event_id,
                    &w.topic,
                    &w.partition,
                    &w.offset,
                    &w.key,
                    &w.payload,
                    &w.held_type,
                    &w.held_version,
                ],
            )
            .await
        };
        let drained = async {
            if rows.drained.0.is_empty() {
                return Ok(0);
            }
            tx.execute(&delete_waiting, &[c, &rows.drained.0, &rows.drained.1])
                .await
        };
        let p = &rows.parks;
        let parks = async {
            if p.account.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &park,
                &[
                    c,
                    &p.account,
                    &p.blocked,
                    &p.waiting,
                    &p.held_type,
                    &p.held_version,
                    &p.held_why,
                ],
            )
            .await
        };
        let unparks = async {
            if !rows.superseded.0.is_empty() {
                let (a, s, e) = &rows.superseded;
                tx.execute(&superseded, &[c, a, s, e]).await?;
            }
            let relabelled = if rows.relabel.0.is_empty() {
                0
            } else {
                tx.execute(&relabel, &[c, &rows.relabel.0, &rows.relabel.1])
                    .await?
            };
            if rows.unparks.is_empty() {
                return Ok(relabelled);
            }
            tx.execute(&unpark, &[c, &rows.unparks]).await
        };
        let progress = async {
            if !rows.seen.0.is_empty() {
                tx.execute(&save_seen, &[c, &rows.seen.0, &rows.seen.1])
                    .await?;
            }
            if rows.progress.0.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &save,
                &[
                    c,
                    &rows.progress.0,
                    &rows.progress.1,
                    &rows.progress.2,
                    &rows.progress.3,
                ],
            )
            .await
        };
        let advance = advance.as_ref();
        let advance_offset = |counts: Counts| async move {
            let mut counts = counts;
            counts += earlier;
            match advance {
                Some(adv) => adv
                    .run(tx, &advance_stmt, c, &self.owner, &counts)
                    .await
                    .map(|n| n == 1),
                None => Ok(true),
            }
        };
        let advanced = if w.account.is_empty() {
            let (_, _, _, _, _, _, advanced) = futures::try_join!(
                released,
                dead_letters,
                drained,
                parks,
                unparks,
                progress,
                advance_offset(counts.clone())
            )
            .map_err(&err)?;
            advanced
        } else {
            // Only when events start waiting: their insert is awaited before the offset row
            // adds up the counts. The accounts are locked and their waiting events loaded
            // (past the limit, those at the seqs the batch's events would wait at), so an
            // event already waiting is caught before this insert, as a duplicate or a
            // conflict; the conflict clause is a second line, and whatever it skipped is
            // counted as a duplicate.
            // Drained rows go first: a new event may wait at the seq of a stored one that
            // left (it no longer decoded), and must not collide with it.
            let (_, _, _, inserted) =
                futures::try_join!(released, dead_letters, drained, waiting).map_err(&err)?;
            let expected = w.account.len() as u64;
            if inserted < expected {
                counts.dup_seq += expected - inserted;
                counts.waiting = counts.waiting.saturating_sub(expected - inserted);
            }
            let (_, _, _, advanced) =
                futures::try_join!(parks, unparks, progress, advance_offset(counts.clone()))
                    .map_err(&err)?;
            advanced
        };
        if let (false, Some(adv)) = (advanced, advance) {
            // Cannot happen while this transaction holds the row lock; if it ever does, say
            // where the partition really is and refuse to commit.
            let stored = self.read_offset(tx, adv.topic, adv.partition).await?;
            return Err(ApplyError::Fenced {
                consumer: self.consumer.clone(),
                topic: adv.topic.to_owned(),
                partition: adv.partition,
                start: adv.start_offset,
                stored: stored.unwrap_or(adv.start_offset),
            });
        }
        Ok(counts)
    }
}
