//! Running the view's statement: composing it, splitting the events into key-disjoint
//! rounds, building each round's columns, and isolating the event at fault when a round
//! fails.
//!
//! One statement may not touch a row twice (PostgreSQL: "ON CONFLICT DO UPDATE command
//! cannot affect row a second time"), and merging an account's deltas would lose their
//! order: round *i* holds the *i*-th event of each account. An order-independent view gets
//! the whole batch in one statement and aggregates with `GROUP BY`.

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;
use futures::future::try_join_all;
use std::sync::atomic::Ordering;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Statement;

use crate::apply::plan::Work;
use crate::apply::types::{describe_db_error, ApplyError, Counts};
use crate::apply::Applier;
use crate::event::Event;
use crate::event::FieldValue;
use crate::inbox;
use crate::projection::{render, Field, Projection};
use crate::queries;

/// One event of a round: (account index, index into that account's emitted events).
pub(crate) type Slot = (usize, usize);

/// How a statement's inbox insert treats an id the inbox already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxGuard {
    /// `ON CONFLICT DO NOTHING RETURNING`: the event is skipped, the others applied
    /// ([`queries::INBOX_CTES`]). Always correct; the careful path and the retry after a
    /// conflict use it.
    Skip,
    /// A plain insert: the statement fails, nothing of it is applied
    /// ([`queries::FRESH_INBOX_CTES`]). The fast path's first try, for events expected to
    /// be new; a conflict falls back to [`InboxGuard::Skip`].
    Fail,
    /// [`InboxGuard::Skip`], and an event found in the inbox before V0009
    /// (`projector.inbox_legacy`, by id alone) is skipped too ([`queries::LEGACY_INBOX_CTES`]):
    /// for a consumer that still has rows there.
    SkipLegacy,
}

/// The full statement for a view: the engine's inbox-guarded prefix, the view's CTEs and its
/// write, and a final count of events seen and rows written.
pub fn compose_statement(projection: &dyn Projection) -> String {
    compose_statement_with(projection, InboxGuard::Skip)
}

/// [`compose_statement`] with the given inbox guard (for a view with an inbox; a view
/// deduplicated by its version filter alone has none, whatever `guard` says).
pub fn compose_statement_with(projection: &dyn Projection, guard: InboxGuard) -> String {
    let sql = projection.apply_sql();
    let fields = projection.fields();
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    let mut select = Vec::new();
    let mut arrays = Vec::new();
    let mut names = Vec::new();
    for (i, (name, ty)) in queries::BATCH_ENVELOPE.iter().enumerate() {
        select.push(format!("b.{}", quote(name)));
        arrays.push(format!("${}::{ty}", i + 2));
        names.push(quote(name));
    }
    for (k, f) in fields.iter().enumerate() {
        let n = queries::BATCH_ENVELOPE.len() + 2 + k;
        arrays.push(format!("${n}::{}", f.sql_array()));
        names.push(quote(f.column()));
        select.push(match f {
            Field::Data => "b.data::jsonb AS data".to_owned(),
            _ => format!("b.{}", quote(f.column())),
        });
    }
    // Composed per view: its fields' columns and types, its inbox guard, its CTEs and write.
    let mut s = format!(
        "WITH batch AS (SELECT {} FROM unnest({}) AS b({})), ",
        select.join(", "),
        arrays.join(", "),
        names.join(", ")
    );
    s.push_str(match (projection.dedup().uses_inbox(), guard) {
        (true, InboxGuard::Skip) => queries::INBOX_CTES,
        (true, InboxGuard::Fail) => queries::FRESH_INBOX_CTES,
        (true, InboxGuard::SkipLegacy) => queries::LEGACY_INBOX_CTES,
        (false, _) => queries::NO_INBOX_CTES,
    });
    let ctes = sql.ctes.trim().trim_end_matches(',');
    if !ctes.is_empty() {
        s.push_str(",\n");
        s.push_str(&render(projection, ctes));
    }
    // Each part ends with a newline, so a view's SQL may end in a `--` comment.
    s.push_str("\n,\nwritten AS (");
    s.push_str(&render(projection, sql.write.trim().trim_end_matches(';')));
    s.push_str("\n)");
    match projection.notices_sql() {
        Some(notices) => {
            s.push_str(",\nnotified AS (");
            s.push_str(&render(projection, notices.trim().trim_end_matches(';')));
            s.push_str("\n)\nSELECT (SELECT count(*) FROM ev), (SELECT count(*) FROM written), (SELECT count(*) FROM notified)");
        }
        None => s.push_str(
            "\nSELECT (SELECT count(*) FROM ev), (SELECT count(*) FROM written), 0::bigint",
        ),
    }
    s
}

/// The parameters of the statement from `$2`: one array per column of `batch`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Columns<'a> {
    pub ids: Vec<&'a str>,
    pub accounts: Vec<i64>,
    pub seqs: Vec<i64>,
    pub types: Vec<&'a str>,
    pub times: Vec<DateTime<Utc>>,
    pub emit: Vec<bool>,
    /// One column per declared field, in declaration order.
    pub fields: Vec<FieldColumn<'a>>,
}

/// One declared field's column.
#[derive(Debug, PartialEq)]
pub(crate) enum FieldColumn<'a> {
    Text(Vec<Option<&'a str>>),
    Decimal(Vec<Option<rust_decimal::Decimal>>),
    /// The `data` text, cast to `jsonb` in SQL.
    Data(Vec<&'a str>),
}

impl<'a> Columns<'a> {
    /// The columns of `events` (each with its fields' values and whether it may emit
    /// notices), for a view that declares `fields`.
    pub(crate) fn new<I>(fields: &[Field], events: I) -> Self
    where
        I: IntoIterator<Item = (&'a Event, &'a [FieldValue], bool)>,
    {
        let events = events.into_iter();
        // Every column has one entry per event: sized once, not grown by doubling.
        let (low, high) = events.size_hint();
        let n = high.unwrap_or(low);
        let mut c = Columns {
            ids: Vec::with_capacity(n),
            accounts: Vec::with_capacity(n),
            seqs: Vec::with_capacity(n),
            types: Vec::with_capacity(n),
            times: Vec::with_capacity(n),
            emit: Vec::with_capacity(n),
            fields: fields
                .iter()
                .map(|f| match f {
                    Field::Text(_) => FieldColumn::Text(Vec::with_capacity(n)),
                    Field::Decimal(_) => FieldColumn::Decimal(Vec::with_capacity(n)),
                    Field::Data => FieldColumn::Data(Vec::with_capacity(n)),
                })
                .collect(),
        };
        for (ev, values, emit) in events {
            c.ids.push(&ev.event_id);
            c.accounts.push(ev.account_id);
            c.seqs.push(ev.seq);
            c.types.push(&ev.event_type);
            c.times.push(ev.occurred_at);
            c.emit.push(emit);
            for (k, column) in c.fields.iter_mut().enumerate() {
                match (column, values.get(k)) {
                    (FieldColumn::Text(v), Some(FieldValue::Text(t))) => v.push(t.as_deref()),
                    (FieldColumn::Decimal(v), Some(FieldValue::Decimal(d))) => v.push(*d),
                    (FieldColumn::Data(v), _) => v.push(&ev.data),
                    (FieldColumn::Text(v), _) => v.push(None),
                    (FieldColumn::Decimal(v), _) => v.push(None),
                }
            }
        }
        c
    }

    /// The statement's parameters: the consumer name, then every column.
    pub(crate) fn params<'s>(&'s self, consumer: &'s String) -> Vec<&'s (dyn ToSql + Sync)> {
        let mut p: Vec<&(dyn ToSql + Sync)> = vec![
            consumer,
            &self.ids,
            &self.accounts,
            &self.seqs,
            &self.types,
            &self.times,
            &self.emit,
        ];
        for column in &self.fields {
            p.push(match column {
                FieldColumn::Text(v) => v,
                FieldColumn::Decimal(v) => v,
                FieldColumn::Data(v) => v,
            });
        }
        p
    }
}

/// Errors caused by one event's content (a bad value, a constraint, an index entry too
/// large, a view's own `RAISE`), as opposed to trouble with the database or the statement
/// itself: the event is dead-lettered, never retried.
pub(crate) fn is_event_error(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else { return false };
    // No partition of the inbox for the event's day: a prune dropped one this process thought
    // attached. The event is not at fault; the retry makes the day.
    if inbox::is_missing_partition(e) {
        return false;
    }
    let c = code.code();
    c.starts_with("22")
        || c.starts_with("23")
        || c.starts_with("P0")
        || code == &SqlState::PROGRAM_LIMIT_EXCEEDED
        || code == &SqlState::CARDINALITY_VIOLATION
}

/// A unique violation of the inbox's key: the fast path's plain insert met an id the inbox
/// has.
fn is_inbox_conflict(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        db.code() == &SqlState::UNIQUE_VIOLATION
            && db.schema() == Some("projector")
            && inbox::is_inbox_table(db.table())
    })
}

/// The most events of one account an order-dependent view that takes many events per
/// account ([`Projection::many_per_account`](crate::Projection::many_per_account)) gets in
/// one statement; an account with more in a batch is sent in rounds of this many, in `seq`
/// order, each folding from the row the round before it wrote in the same transaction.
///
/// A fold whose steps join the run again (portfolio's recursive CTE) costs about the square
/// of its longest run: 12,000 events of one position in one statement took 8.3 s, in rounds
/// of 256 0.34 s (docs/benchmarks.md, "Ninth round"). A batch of the usual shape (2,000
/// events over hundreds of accounts) never has this many of one account, and stays one
/// statement.
pub const RUN_CAP: usize = 256;

impl Applier {
    /// Key-disjoint rounds of the events sent to the statement. Order-independent views get
    /// one round with everything, and order-dependent ones that take many events per account
    /// (each account's in `seq` order) one round of up to [`RUN_CAP`] events per account, the
    /// rest in more rounds, unless `by_account` asks for rounds of one event per account
    /// anyway (failure isolation).
    pub(crate) fn rounds(&self, work: &Work<'_>, by_account: bool) -> Vec<Vec<Slot>> {
        let mut rounds: Vec<Vec<Slot>> = Vec::new();
        let per_round = if by_account {
            1
        } else if !self.ordered {
            usize::MAX
        } else if self.many_per_account {
            RUN_CAP
        } else {
            1
        };
        for (a, acc) in work.accounts().iter().enumerate() {
            let mut r = 0;
            for (k, &(_, item)) in acc.plan.emitted.iter().enumerate() {
                if work.is_repeat(item) || !work.sends(item) {
                    continue;
                }
                let slot = r / per_round;
                if rounds.len() <= slot {
                    rounds.push(Vec::new());
                }
                rounds[slot].push((a, k));
                r += 1;
            }
        }
        rounds
    }

    /// What the inbox needs before the rounds write into it, in the batch's transaction:
    /// whether this consumer still has rows in the inbox before V0009 (asked once), a
    /// partition for the day of every event sent (when one is missing, an event older than
    /// every day kept or far ahead, the batch stops with [`ApplyError::InboxDaysMissing`]
    /// before it writes, and its caller makes the day), and a record of writes into days that
    /// have ended, so that retention keeps them a whole window. Counts the events outside the
    /// window.
    async fn prepare_inbox(
        &self,
        tx: &Transaction<'_>,
        work: &mut Work<'_>,
        rounds: &[Vec<Slot>],
    ) -> Result<(), ApplyError> {
        if !self.projection.dedup().uses_inbox() {
            return Ok(());
        }
        self.legacy_rows(tx).await?;
        let now = Utc::now();
        let ahead = now + inbox::FUTURE_BOUND;
        let mut days = std::collections::BTreeSet::new();
        let mut far_ahead = 0u64;
        for &(a, k) in rounds.iter().flatten() {
            if let Some(event) = work.event(work.accounts()[a].plan.emitted[k].1) {
                days.insert(inbox::day_of(event.occurred_at));
                far_ahead += u64::from(event.occurred_at > ahead);
            }
        }
        let missing = self
            .days
            .missing_in(tx, &days)
            .await
            .map_err(self.db("reading the inbox's partitions"))?;
        if !missing.is_empty() {
            return Err(ApplyError::InboxDaysMissing {
                consumer: self.consumer.clone(),
                days: missing,
            });
        }
        // A day that has ended, inside the window as this process last read it, may have
        // been dropped by a prune and made again by another process while this one still
        // knew it: the window's first day is read again for such a batch (a late event, a
        // rebuild replaying recent days, a few minutes after midnight; one key lookup). Never
        // for a batch of today's events, nor of days already before the window, which only
        // moves forward.
        let today = inbox::day_of(now);
        let window_start = self.days.window_start();
        if days
            .iter()
            .any(|d| *d < today && window_start.is_none_or(|start| *d >= start))
        {
            self.days
                .read_window(tx)
                .await
                .map_err(self.db("reading the inbox's retained window"))?;
        }
        // Older than the retained window: retention has left such days behind, or never kept
        // them (a rebuild replaying old days).
        let behind = self.days.window_start().map_or(0, |start| {
            rounds
                .iter()
                .flatten()
                .filter_map(|&(a, k)| work.event(work.accounts()[a].plan.emitted[k].1))
                .filter(|e| inbox::day_of(e.occurred_at) < start)
                .count() as u64
        });
        work.counts_mut().outside_window += behind + far_ahead;
        // A day that has ended, or ends within five minutes by this process's clock: the
        // margin covers a clock behind PostgreSQL's, whose midnight decides which writes come
        // late; a mark too many only keeps a day a few minutes longer.
        let soon = now + chrono::Duration::minutes(5);
        let late: Vec<chrono::NaiveDate> = days
            .into_iter()
            .filter(|d| inbox::bounds(*d).1 <= soon)
            .collect();
        inbox::mark_late_in(tx, &self.consumer, work.topic(), work.partition(), &late)
            .await
            .map_err(self.db("recording late writes into the inbox"))
    }

    /// Runs the statement over the events of a round, in the round's order.
    async fn run_statement(
        &self,
        tx: &Transaction<'_>,
        statement: &Statement,
        work: &Work<'_>,
        round: &[Slot],
    ) -> Result<(i64, i64, i64), tokio_postgres::Error> {
        let c = Columns::new(
            &self.fields,
            round.iter().filter_map(|&(a, k)| {
                let acc = &work.accounts()[a];
                let item = acc.plan.emitted[k].1;
                let event = work.event(item)?;
                let past = acc.initial.emit_after.is_none_or(|after| event.seq > after);
                Some((event, work.values(item), work.live() && past))
            }),
        );
        let row = tx.query_one(statement, &c.params(&self.consumer)).await?;
        Ok((row.get(0), row.get(1), row.get(2)))
    }

    /// Counts what one statement did with the `sent` events: `|batch| - |ev|` were already in
    /// the inbox; with a version filter, `|ev| - |written|` were dropped by it.
    fn count_statement(
        &self,
        counts: &mut Counts,
        sent: usize,
        (fresh, written, notified): (i64, i64, i64),
    ) {
        counts.notices += u64::try_from(notified).unwrap_or(0);
        let sent = sent as u64;
        let fresh = u64::try_from(fresh).unwrap_or(0);
        let written = u64::try_from(written).unwrap_or(0);
        counts.dup_inbox += sent.saturating_sub(fresh);
        let filtered = if self.projection.dedup().uses_version_filter() {
            fresh.saturating_sub(written)
        } else {
            0
        };
        counts.dup_version_filter += filtered;
        counts.applied += fresh - filtered;
    }

    /// Runs every round. Returns true when the fast path's savepoint is still open (the
    /// bookkeeping releases it in its own pipeline).
    pub(crate) async fn execute(
        &self,
        tx: &mut Transaction<'_>,
        work: &mut Work<'_>,
    ) -> Result<bool, ApplyError> {
        let rounds = self.rounds(work, false);
        if rounds.is_empty() {
            return Ok(false);
        }
        // The fast path's savepoint is opened in the same pipeline as the rounds and released
        // in the same pipeline as the bookkeeping: two round trips fewer per batch than
        // awaiting each, which matters most for the small batches of a live stream.
        self.prepare_inbox(tx, work, &rounds).await?;
        let plain_first = self.first_try() == Some(InboxGuard::Fail);
        let first_statement = self.fast_statement();
        let mut result = self
            .run_rounds_pipelined(tx, work, &rounds, first_statement, true)
            .await;
        let mut met_inbox = false;
        if let Err(first) = result {
            let first = self.roll_back_fast_path(tx, first).await?;
            // An id the inbox already has (an event published again, which an
            // order-independent view does not filter by seq, or a reused id) failed the
            // plain insert: the same rounds again, pipelined, with the statement that
            // skips it.
            // Only a failure of that one takes the careful path, whose cost grows with the
            // rounds (a savepoint and a round trip each).
            result = if plain_first && is_inbox_conflict(&first) {
                met_inbox = true;
                tracing::debug!(error = %first, "an id the inbox already has; the rounds again with ON CONFLICT");
                match self
                    .run_rounds_pipelined(tx, work, &rounds, self.skip_statement(), false)
                    .await
                {
                    Err(second) => Err(self.roll_back_fast_path(tx, second).await?),
                    ok => ok,
                }
            } else {
                Err(first)
            };
        }
        match result {
            Ok(results) => {
                let mut skipped = 0;
                for (round, result) in rounds.iter().zip(results) {
                    skipped += round
                        .len()
                        .saturating_sub(usize::try_from(result.0).unwrap_or(0));
                    self.count_statement(work.counts_mut(), round.len(), result);
                }
                // Republished events come in runs (a relay resending what it sent before a
                // crash): while they last, each batch runs once, with `ON CONFLICT`.
                if met_inbox {
                    self.expect_duplicates.store(true, Ordering::Relaxed);
                } else if !plain_first && skipped == 0 {
                    self.expect_duplicates.store(false, Ordering::Relaxed);
                }
            }
            Err(first) => {
                tracing::debug!(error = %first, "a statement failed; isolating the event at fault");
                self.run_rounds_careful(tx, work).await?;
            }
        }
        Ok(true)
    }

    /// Rolls back to the fast path's savepoint after `failed`, and gives `failed` back. When
    /// the rollback fails too, the batch fails with `failed`, which says why: a statement
    /// that cannot be prepared (a table dropped under a running view) fails before the
    /// savepoint is opened, and the rollback's "savepoint does not exist" would hide it.
    async fn roll_back_fast_path(
        &self,
        tx: &Transaction<'_>,
        failed: tokio_postgres::Error,
    ) -> Result<tokio_postgres::Error, ApplyError> {
        match tx.batch_execute(queries::ROLLBACK_BATCH_SAVEPOINT).await {
            Ok(()) => Ok(failed),
            Err(rollback) => {
                tracing::debug!(error = %rollback, "the savepoint could not be rolled back either");
                Err(self.db("running the view statement")(failed))
            }
        }
    }

    /// The fast path: the savepoint (when `open`; a retry runs inside the one rolled back
    /// to) and every round's `statement` sent at once on the connection. PostgreSQL runs
    /// them in order; the first failure aborts the savepoint and the rest. The caller
    /// releases the savepoint (or rolls back to it).
    async fn run_rounds_pipelined(
        &self,
        tx: &Transaction<'_>,
        work: &Work<'_>,
        rounds: &[Vec<Slot>],
        statement: &str,
        open: bool,
    ) -> Result<Vec<(i64, i64, i64)>, tokio_postgres::Error> {
        let statement = tx.prepare_cached(statement).await?;
        // try_join! polls in order, and tokio-postgres sends a request when it is first
        // polled: the savepoint goes out before the rounds.
        let open = async {
            if open {
                tx.batch_execute(queries::OPEN_BATCH_SAVEPOINT).await
            } else {
                Ok(())
            }
        };
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
            .prepare_cached(self.skip_statement())
            .await
            .map_err(self.db("preparing the view statement"))?;
        for round in self.rounds(work, true) {
            // In an order-dependent view nothing after an account's failed event is applied.
            let round: Vec<Slot> = round
                .into_iter()
                .filter(|&(a, _)| !self.ordered || work.accounts()[a].failures.is_empty())
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
                    self.count_statement(work.counts_mut(), round.len(), result);
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
                        self.count_statement(work.counts_mut(), 1, result);
                    }
                    Err(e) if is_event_error(&e) => {
                        sp.rollback()
                            .await
                            .map_err(self.db("rolling back a savepoint"))?;
                        let message = describe_db_error(&e);
                        tracing::warn!(consumer = %self.consumer, account = work.accounts()[a].account_id, error = %message, "view statement failed; event dead-lettered");
                        work.fail(a, k, message);
                    }
                    Err(e) => return Err(self.db("applying one event")(e)),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_keep_the_round_order() {
        let at = |s: &str| {
            DateTime::parse_from_rfc3339(s)
                .expect("time")
                .with_timezone(&Utc)
        };
        let events = [
            Event {
                event_id: "b".to_owned(),
                event_type: "fill_executed".to_owned(),
                type_version: 1,
                account_id: 2,
                seq: 7,
                occurred_at: at("2026-11-29T10:15:00Z"),
                data: "{\"x\":1}".to_owned(),
            },
            Event {
                event_id: "a".to_owned(),
                event_type: "cash_adjusted".to_owned(),
                type_version: 1,
                account_id: 1,
                seq: 3,
                occurred_at: at("2026-11-30T00:00:00Z"),
                data: "{}".to_owned(),
            },
        ];
        let values = [
            vec![
                FieldValue::Text(Some("EURUSD".to_owned())),
                FieldValue::Decimal(Some(rust_decimal::Decimal::new(15, 1))),
                FieldValue::Data,
            ],
            vec![
                FieldValue::Text(None),
                FieldValue::Decimal(None),
                FieldValue::Data,
            ],
        ];
        let fields = [Field::Text("symbol"), Field::Decimal("qty"), Field::Data];
        let c = Columns::new(
            &fields,
            events
                .iter()
                .zip(&values)
                .zip([true, false])
                .map(|((e, v), emit)| (e, v.as_slice(), emit)),
        );
        assert_eq!(c.ids, ["b", "a"]);
        assert_eq!(c.accounts, [2, 1]);
        assert_eq!(c.seqs, [7, 3]);
        assert_eq!(c.types, ["fill_executed", "cash_adjusted"]);
        assert_eq!(
            c.times,
            [at("2026-11-29T10:15:00Z"), at("2026-11-30T00:00:00Z")]
        );
        assert_eq!(
            c.fields,
            [
                FieldColumn::Text(vec![Some("EURUSD"), None]),
                FieldColumn::Decimal(vec![Some(rust_decimal::Decimal::new(15, 1)), None]),
                FieldColumn::Data(vec!["{\"x\":1}", "{}"]),
            ]
        );
        assert_eq!(c.emit, [true, false]);
        assert_eq!(c.params(&"v_1".to_owned()).len(), 10);
        assert_eq!(Columns::new(&[], []), Columns::default());
    }

    #[test]
    fn the_batch_has_a_typed_column_per_declared_field() {
        struct V;
        impl Projection for V {
            fn name(&self) -> &str {
                "v"
            }
            fn version(&self) -> i32 {
                1
            }
            fn subscribes(&self) -> &[&str] {
                &["t"]
            }
            fn dedup(&self) -> crate::projection::DedupMode {
                crate::projection::DedupMode::Inbox
            }
            fn fields(&self) -> Vec<Field> {
                vec![Field::Text("symbol"), Field::Decimal("qty")]
            }
            fn ddl(&self) -> String {
                String::new()
            }
            fn tables(&self) -> Vec<String> {
                Vec::new()
            }
            fn apply_sql(&self) -> crate::projection::ApplySql {
                crate::projection::ApplySql {
                    ctes: String::new(),
                    write: "SELECT 1 FROM ev".to_owned(),
                }
            }
            fn read_sql(&self) -> String {
                String::new()
            }
        }
        let s = compose_statement(&V);
        assert!(
            s.starts_with("WITH batch AS (SELECT b.\"event_id\", b.\"account_id\", b.\"seq\", b.\"type\", b.\"occurred_at\", b.\"emit\", b.\"symbol\", b.\"qty\" FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::timestamptz[], $7::boolean[], $8::text[], $9::numeric[])"),
            "{s}"
        );
        assert!(!s.contains("jsonb"));
        // The guard is in the statement either way: skipped by ON CONFLICT, or refused by
        // the unique key of a plain insert.
        assert!(
            s.contains("ON CONFLICT DO NOTHING RETURNING event_id"),
            "{s}"
        );
        let fresh = compose_statement_with(&V, InboxGuard::Fail);
        assert!(fresh.contains("INSERT INTO projector.inbox"), "{fresh}");
        assert!(!fresh.contains("ON CONFLICT"), "{fresh}");
        assert_eq!(
            fresh.replace(queries::FRESH_INBOX_CTES, queries::INBOX_CTES),
            s
        );
    }
}
