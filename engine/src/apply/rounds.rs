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
use tokio_postgres::error::SqlState;
use tokio_postgres::Statement;

use crate::apply::plan::Work;
use crate::apply::types::{ApplyError, Counts};
use crate::apply::Applier;
use crate::event::Event;
use crate::projection::{render, Projection};
use crate::queries;

/// One event of a round: (account index, index into that account's emitted events).
pub(crate) type Slot = (usize, usize);

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

/// The parameters `$2..$7` of the statement: one array per column of `batch`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Columns<'a> {
    pub ids: Vec<&'a str>,
    pub accounts: Vec<i64>,
    pub seqs: Vec<i64>,
    pub types: Vec<&'a str>,
    pub times: Vec<DateTime<Utc>>,
    pub data: Vec<&'a str>,
    pub emit: Vec<bool>,
}

impl<'a> Columns<'a> {
    /// The columns of `events`, each with whether it may emit notices.
    pub(crate) fn new<I: IntoIterator<Item = (&'a Event, bool)>>(events: I) -> Self {
        let mut c = Columns::default();
        for (ev, emit) in events {
            c.ids.push(&ev.event_id);
            c.accounts.push(ev.account_id);
            c.seqs.push(ev.seq);
            c.types.push(&ev.event_type);
            c.times.push(ev.occurred_at);
            c.data.push(&ev.data);
            c.emit.push(emit);
        }
        c
    }
}

/// Errors caused by one event's content (a bad value, a constraint, an index entry too
/// large, a view's own `RAISE`), as opposed to trouble with the database or the statement
/// itself: the event is dead-lettered, never retried.
pub(crate) fn is_event_error(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else { return false };
    let c = code.code();
    c.starts_with("22")
        || c.starts_with("23")
        || c.starts_with("P0")
        || code == &SqlState::PROGRAM_LIMIT_EXCEEDED
        || code == &SqlState::CARDINALITY_VIOLATION
}

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

impl Applier {
    /// Key-disjoint rounds of the events sent to the statement. Order-independent views get
    /// one round with everything, unless `by_account` asks for rounds anyway (failure
    /// isolation).
    pub(crate) fn rounds(&self, work: &Work<'_>, by_account: bool) -> Vec<Vec<Slot>> {
        let mut rounds: Vec<Vec<Slot>> = Vec::new();
        let single = !self.ordered && !by_account;
        for (a, acc) in work.accounts.iter().enumerate() {
            let mut r = 0;
            for (k, &(_, item)) in acc.plan.emitted.iter().enumerate() {
                if work.repeated.contains(&item) || !work.event(item).is_some_and(|e| self.sends(e))
                {
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

    /// Runs the statement over the events of a round, in the round's order.
    async fn run_statement(
        &self,
        tx: &Transaction<'_>,
        statement: &Statement,
        work: &Work<'_>,
        round: &[Slot],
    ) -> Result<(i64, i64, i64), tokio_postgres::Error> {
        let c = Columns::new(round.iter().filter_map(|&(a, k)| {
            let acc = &work.accounts[a];
            let event = work.event(acc.plan.emitted[k].1)?;
            let past = acc.initial.emit_after.is_none_or(|after| event.seq > after);
            Some((event, work.live && past))
        }));
        let row = tx
            .query_one(
                statement,
                &[
                    &self.consumer,
                    &c.ids,
                    &c.accounts,
                    &c.seqs,
                    &c.types,
                    &c.times,
                    &c.data,
                    &c.emit,
                ],
            )
            .await?;
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
        match self.run_rounds_pipelined(tx, work, &rounds).await {
            Ok(results) => {
                for (round, result) in rounds.iter().zip(results) {
                    self.count_statement(&mut work.counts, round.len(), result);
                }
                Ok(true)
            }
            Err(first) => {
                tx.batch_execute(queries::ROLLBACK_BATCH_SAVEPOINT)
                    .await
                    .map_err(self.db("rolling back a savepoint"))?;
                tracing::debug!(error = %first, "a statement failed; isolating the event at fault");
                self.run_rounds_careful(tx, work).await?;
                Ok(true)
            }
        }
    }

    /// The fast path: the savepoint and every round's statement sent at once on the
    /// connection. PostgreSQL runs them in order; the first failure aborts the savepoint and
    /// the rest. The caller releases the savepoint (or rolls back to it).
    async fn run_rounds_pipelined(
        &self,
        tx: &Transaction<'_>,
        work: &Work<'_>,
        rounds: &[Vec<Slot>],
    ) -> Result<Vec<(i64, i64, i64)>, tokio_postgres::Error> {
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
        for round in self.rounds(work, true) {
            // In an order-dependent view nothing after an account's failed event is applied.
            let round: Vec<Slot> = round
                .into_iter()
                .filter(|&(a, _)| !self.ordered || work.accounts[a].failures.is_empty())
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
                account_id: 2,
                seq: 7,
                occurred_at: at("2026-11-29T10:15:00Z"),
                data: "{\"x\":1}".to_owned(),
            },
            Event {
                event_id: "a".to_owned(),
                event_type: "cash_adjusted".to_owned(),
                account_id: 1,
                seq: 3,
                occurred_at: at("2026-11-30T00:00:00Z"),
                data: "{}".to_owned(),
            },
        ];
        let c = Columns::new(events.iter().zip([true, false]));
        assert_eq!(c.ids, ["b", "a"]);
        assert_eq!(c.accounts, [2, 1]);
        assert_eq!(c.seqs, [7, 3]);
        assert_eq!(c.types, ["fill_executed", "cash_adjusted"]);
        assert_eq!(
            c.times,
            [at("2026-11-29T10:15:00Z"), at("2026-11-30T00:00:00Z")]
        );
        assert_eq!(c.data, ["{\"x\":1}", "{}"]);
        assert_eq!(c.emit, [true, false]);
        assert_eq!(Columns::new([]), Columns::default());
    }
}
