//! Repairs an engineer makes, through the same guarded apply path as the stream: a dead
//! letter retried from its stored bytes, a lost `seq` skipped on purpose, a parked account's
//! waiting events drained. Each runs in one transaction that locks the account's progress
//! row like a batch does, so it takes turns with the live stream; none moves an offset (the
//! stream's counters say what happened when each message was consumed). Each holds the
//! version's running lock shared for its transaction, as a running consumer holds it for its
//! session (`kafka/running.rs`): a drop waits for a repair in flight, and a repair of a
//! version being dropped, or dropped, is refused.

use deadpool_postgres::{Client, Transaction};

use crate::apply::plan::Work;
use crate::apply::types::{ApplyError, Batch, Counts, Disposition};
use crate::apply::Applier;
use crate::dead_letters::{self, Skipped};
use crate::event::Message;
use crate::kafka::running;
use crate::queries;
use crate::{parked, progress};

/// What [`Applier::skip_dead_letter`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSkip {
    /// Its `seq` was the one its account waited for: skipped (recorded in
    /// `projector.skips`), and the account resumed after it; `counts` is what waited and was
    /// applied in the first step (drain the rest with [`Applier::drain_account`]).
    Resumed {
        /// The account.
        account: i64,
        /// The skipped `seq`.
        seq: i64,
        /// What the first drain step did.
        counts: Counts,
    },
    /// It held no `seq` its account still waits for: resolved as skipped, nothing else.
    Resolved,
}

impl Applier {
    /// Whether a repair that stopped with `result` should run again once the days it lacked
    /// are made, or once a day dropped under it is known gone (it runs in a transaction of
    /// its own; a few tries at most).
    async fn lacked_days<T>(
        &self,
        client: &mut Client,
        result: &Result<T, ApplyError>,
        tries: &mut u32,
    ) -> Result<bool, ApplyError> {
        match result {
            Err(ApplyError::InboxDaysMissing { days, .. }) if *tries < 3 => {
                *tries += 1;
                self.make_days(client, days).await?;
                Ok(true)
            }
            // A day this applier knew was dropped under it by a prune: its days are forgotten
            // (`Applier::db`), and the next try reads them and names the day to make.
            Err(ApplyError::Database { error, .. })
                if *tries < 3 && crate::inbox::is_missing_partition(error) =>
            {
                *tries += 1;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Retries dead letter `id` of this view version from its stored bytes, through the
    /// apply path, as if it arrived now: decoded again (validation may have changed, the
    /// producer's fix may be in a view's code), sequenced, guarded by the inbox. In the same
    /// transaction the dead letter is marked retried, unless it fails again: then it stays
    /// open with its new error. Its offset does not move. Returns what became of it.
    pub async fn retry_dead_letter(
        &self,
        client: &mut Client,
        id: i64,
        retried_by: &str,
    ) -> Result<(Disposition, Counts), ApplyError> {
        let mut tries = 0;
        loop {
            let result = self.retry_dead_letter_once(client, id, retried_by).await;
            if !self.lacked_days(client, &result, &mut tries).await? {
                return result;
            }
        }
    }

    /// Records `seq` of `account` as skipped (who and why, in `projector.skips`), resolves
    /// its open dead letters as skipped, and applies what waited behind it, in `seq` order
    /// (one bounded step: call [`Applier::drain_account`] for the rest).
    /// Refused unless the account is parked waiting for exactly that `seq`.
    pub async fn skip_seq(
        &self,
        client: &mut Client,
        account: i64,
        seq: i64,
        skipped_by: &str,
        reason: &str,
    ) -> Result<Counts, ApplyError> {
        let mut tries = 0;
        loop {
            let result = self
                .skip_seq_once(client, account, seq, skipped_by, reason)
                .await;
            if !self.lacked_days(client, &result, &mut tries).await? {
                return result;
            }
        }
    }

    /// Applies whatever waits for `account` and can go now (its park may be stale, a
    /// retried dead letter filled its gap, or a batch drained only its first part), one
    /// bounded step: the bool says whether more may follow (call again).
    pub async fn drain_account(
        &self,
        client: &mut Client,
        account: i64,
    ) -> Result<(Counts, bool), ApplyError> {
        let mut tries = 0;
        loop {
            let result = self.drain_account_once(client, account).await;
            if !self.lacked_days(client, &result, &mut tries).await? {
                return result;
            }
        }
    }

    /// Retries dead letter `id` of this view version from its stored bytes, through the
    /// apply path, as if it arrived now: decoded again (validation may have changed, the
    /// producer's fix may be in a view's code), sequenced, guarded by the inbox. In the same
    /// transaction the dead letter is marked retried, unless it fails again: then it stays
    /// open with its new error. Its offset does not move. Returns what became of it.
    async fn retry_dead_letter_once(
        &self,
        client: &mut Client,
        id: i64,
        retried_by: &str,
    ) -> Result<(Disposition, Counts), ApplyError> {
        let mut tx = client
            .transaction()
            .await
            .map_err(self.db("beginning the transaction"))?;
        self.hold_running(&tx).await?;
        let err = self.db("reading the dead letter");
        // The account's lock before the dead letter's, the order a batch takes them (it
        // locks its accounts, then resolves or updates their dead letters).
        if self.ordered {
            if let Some(Some(account)) = self.dead_letter_account(&tx, id).await? {
                self.lock_account(&tx, account).await?;
            }
        }
        let Some(row) = tx
            .query_opt(dead_letters::LOCK_FOR_RETRY, &[&id, &self.consumer])
            .await
            .map_err(&err)?
        else {
            return Err(ApplyError::Refused {
                consumer: self.consumer.clone(),
                reason: format!("no dead letter {id} for {}", self.consumer),
            });
        };
        if row.get::<_, bool>(5) {
            return Err(ApplyError::Refused {
                consumer: self.consumer.clone(),
                reason: format!("dead letter {id} is resolved already"),
            });
        }
        let offset: i64 = row.get(2);
        let batch = Batch {
            topic: row.get(0),
            partition: row.get(1),
            start_offset: offset,
            messages: vec![Message::new(offset, row.get(3), row.get::<_, Vec<u8>>(4))],
        };
        let decoded: Vec<_> = batch.messages.iter().map(|m| self.decode(m)).collect();
        let mut work = Work::new(&batch, &decoded);
        let counts = self.repair_in(&mut tx, &mut work).await?;
        let disposition = work.dispositions()[0];
        if disposition != Disposition::DeadLettered {
            // A retry that sent the event to wait resolves it too (nothing is left to retry
            // until the account gets there); should it fail when it drains, the note opens
            // the row again (`queries::INSERT_DEAD_LETTERS`).
            let note = match disposition {
                Disposition::Waiting => queries::RETRIED_WAITING_NOTE.to_owned(),
                d => format!("{d:?}").to_lowercase(),
            };
            tx.execute(dead_letters::RESOLVE_RETRIED, &[&id, &retried_by, &note])
                .await
                .map_err(self.db("resolving the dead letter"))?;
        }
        tx.commit().await.map_err(self.db("committing"))?;
        self.rang();
        Ok((disposition, counts))
    }

    /// Records `seq` of `account` as skipped (who and why, in `projector.skips`), resolves
    /// its open dead letters as skipped, and applies what waited behind it, in `seq` order
    /// (one bounded step: call [`Applier::drain_account`] for the rest).
    /// Refused unless the account is parked waiting for exactly that `seq`.
    async fn skip_seq_once(
        &self,
        client: &mut Client,
        account: i64,
        seq: i64,
        skipped_by: &str,
        reason: &str,
    ) -> Result<Counts, ApplyError> {
        if !self.ordered {
            return Err(ApplyError::Refused {
                consumer: self.consumer.clone(),
                reason: "the view is order-independent: nothing waits for a seq there".to_owned(),
            });
        }
        let mut tx = client
            .transaction()
            .await
            .map_err(self.db("beginning the transaction"))?;
        self.hold_running(&tx).await?;
        self.lock_account(&tx, account).await?;
        let (next, blocked) = self.waits_for(&tx, account).await?;
        if seq != next {
            return Err(ApplyError::Refused {
                consumer: self.consumer.clone(),
                reason: format!(
                    "account {account} waits for seq {next}, not {seq}; only the seq an account waits for can be skipped"
                ),
            });
        }
        // Only a parked account waits: an account that is not parked has simply not received
        // its next event yet (or a redelivery filled its gap a moment ago), and a skip would
        // turn that sound event, when it arrives, into a conflict never applied.
        if blocked != Some(seq) {
            return Err(ApplyError::Refused {
                consumer: self.consumer.clone(),
                reason: format!(
                    "account {account} is not parked at seq {seq} (its next event may simply not have arrived yet); only the seq a parked account waits for can be skipped"
                ),
            });
        }
        let counts = self
            .skip_in(&mut tx, account, seq, skipped_by, reason)
            .await?;
        tx.commit().await.map_err(self.db("committing"))?;
        self.rang();
        Ok(counts)
    }

    /// Gives dead letter `id` of this version up, recorded with who and why. When its `seq`
    /// is the one its account waits for (parked there, or not parked because nothing came
    /// after it yet), that `seq` is skipped as by [`Applier::skip_seq`] and the account
    /// resumes after it. A dead letter that holds no `seq` the account still needs (a
    /// conflict: the `seq` is another event's; a `seq` the account has passed; an
    /// order-independent view; a retired version; no account or `seq` salvaged) is only
    /// resolved. Refused while
    /// the account waits for a lower `seq`: skipped then, the dead letter would be resolved
    /// with nothing recorded, and the account would park at its `seq` later. Decided under
    /// the account's lock, like a batch.
    pub async fn skip_dead_letter(
        &self,
        client: &mut Client,
        id: i64,
        skipped_by: &str,
        reason: &str,
    ) -> Result<DeadLetterSkip, ApplyError> {
        let mut tries = 0;
        loop {
            let result = self
                .skip_dead_letter_once(client, id, skipped_by, reason)
                .await;
            if !self.lacked_days(client, &result, &mut tries).await? {
                return result;
            }
        }
    }

    async fn skip_dead_letter_once(
        &self,
        client: &mut Client,
        id: i64,
        skipped_by: &str,
        reason: &str,
    ) -> Result<DeadLetterSkip, ApplyError> {
        let mut tx = client
            .transaction()
            .await
            .map_err(self.db("beginning the transaction"))?;
        self.hold_running(&tx).await?;
        let err = self.db("skipping a dead letter");
        let refused = |reason: String| ApplyError::Refused {
            consumer: self.consumer.clone(),
            reason,
        };
        // The account's lock first, as a batch takes it before it writes dead letters: the
        // other order could deadlock with a batch resolving this very dead letter.
        let account = self
            .dead_letter_account(&tx, id)
            .await?
            .ok_or_else(|| refused(format!("no dead letter {id} of this view version")))?;
        let retired = crate::versions::is_retired(&tx, &self.consumer)
            .await
            .map_err(&err)?;
        let tracked = self.ordered && !retired;
        if let (Some(account), true) = (account, tracked) {
            self.lock_account(&tx, account).await?;
        }
        // Read again under the account's lock: it may have gone meanwhile (`retire --drop`
        // deletes a version's dead letters).
        let row = tx
            .query_opt(dead_letters::LOCK_FOR_SKIP, &[&id])
            .await
            .map_err(&err)?
            .ok_or_else(|| refused(format!("no dead letter {id} of this view version")))?;
        let (seq, kind): (Option<i64>, String) = (row.get(0), row.get(1));
        if row.get::<_, bool>(2) {
            return Err(refused(format!("dead letter {id} is resolved already")));
        }
        let held = match (account, seq) {
            (Some(account), Some(seq)) if tracked && kind != "conflict" => {
                let (next, _) = self.waits_for(&tx, account).await?;
                if seq > next {
                    return Err(refused(format!(
                        "dead letter {id} holds seq {seq} of account {account}, which waits for seq {next} first; skipped now, nothing would be recorded and the account would stop at seq {seq} later: skip it once the account has applied seq {}",
                        seq - 1
                    )));
                }
                (seq == next).then_some((account, seq))
            }
            _ => None,
        };
        let outcome = match held {
            Some((account, seq)) => DeadLetterSkip::Resumed {
                account,
                seq,
                counts: self
                    .skip_in(&mut tx, account, seq, skipped_by, reason)
                    .await?,
            },
            None => {
                dead_letters::skip(&tx, Skipped::One(id), skipped_by, reason)
                    .await
                    .map_err(&err)?;
                DeadLetterSkip::Resolved
            }
        };
        tx.commit().await.map_err(self.db("committing"))?;
        self.rang();
        Ok(outcome)
    }

    /// Holds the version's running lock shared until the repair's transaction ends, so that
    /// a drop (which takes it exclusively, then deletes the version's rows) cannot run
    /// under the repair, and refuses a version a drop holds or has dropped: its rows are
    /// going or gone, and a repair would only leave progress behind for a version that no
    /// longer exists. Taken first, before any row lock, and never waited for.
    async fn hold_running(&self, tx: &Transaction<'_>) -> Result<(), ApplyError> {
        let err = self.db("holding the version's running lock");
        let refused = |reason: &str| ApplyError::Refused {
            consumer: self.consumer.clone(),
            reason: reason.to_owned(),
        };
        if !running::try_hold_for_transaction(&**tx, &self.consumer)
            .await
            .map_err(&err)?
        {
            return Err(refused(
                "the version is being dropped (`retire --drop` or `rebuild --cancel` holds it); nothing was repaired",
            ));
        }
        // Read after the lock is held: a drop that finished just before has committed.
        let dropped = crate::versions::is_dropped(tx, &self.consumer)
            .await
            .map_err(&err)?;
        if dropped {
            return Err(refused(
                "the version was dropped: nothing of it is left to repair",
            ));
        }
        Ok(())
    }

    /// The account of this version's dead letter `id`, read without locking it (a repair
    /// locks the account first, the order a batch takes them): `None` when there is no
    /// such dead letter, `Some(None)` when its envelope named no account.
    async fn dead_letter_account(
        &self,
        tx: &Transaction<'_>,
        id: i64,
    ) -> Result<Option<Option<i64>>, ApplyError> {
        Ok(tx
            .query_opt(dead_letters::ACCOUNT_IN, &[&id, &self.consumer])
            .await
            .map_err(self.db("reading the dead letter's account"))?
            .map(|r| r.get(0)))
    }

    /// Locks `account`'s progress row (created if missing) for the transaction, as a batch
    /// does before it touches the account's events or dead letters.
    async fn lock_account(&self, tx: &Transaction<'_>, account: i64) -> Result<(), ApplyError> {
        let err = self.db("locking the account");
        tx.execute(queries::ENSURE_PROGRESS, &[&self.consumer, &vec![account]])
            .await
            .map_err(&err)?;
        tx.execute(queries::LOCK_ACCOUNTS, &[&self.consumer, &vec![account]])
            .await
            .map_err(&err)?;
        Ok(())
    }

    /// The `seq` a locked account waits for (past `last_seq` and the rebuild watermark),
    /// and the `seq` it is parked at, if any.
    async fn waits_for(
        &self,
        tx: &Transaction<'_>,
        account: i64,
    ) -> Result<(i64, Option<i64>), ApplyError> {
        let row = tx
            .query_one(queries::READ_ACCOUNTS, &[&self.consumer, &vec![account]])
            .await
            .map_err(self.db("reading the account"))?;
        let last_seq: i64 = row.get::<_, Option<i64>>(1).unwrap_or(0);
        let watermark: Option<i64> = row.get(3);
        Ok((last_seq.max(watermark.unwrap_or(0)) + 1, row.get(4)))
    }

    /// Skips `seq` of `account`, locked by the caller: progress moves to it, the skip is
    /// recorded, the open dead letters at it are resolved as skipped, and one bounded step of
    /// what waited behind it is applied.
    async fn skip_in(
        &self,
        tx: &mut Transaction<'_>,
        account: i64,
        seq: i64,
        skipped_by: &str,
        reason: &str,
    ) -> Result<Counts, ApplyError> {
        let err = self.db("skipping a seq");
        // A sound event at that seq waits (a corrected republish, held back behind a gap
        // that a bounded drain stopped short of): it can be applied, and a skip would drop
        // it as a stale duplicate.
        let waiting = tx
            .query_opt(parked::WAITS_AT, &[&self.consumer, &account, &seq])
            .await
            .map_err(&err)?;
        if waiting.is_some() {
            return Err(ApplyError::Refused {
                consumer: self.consumer.clone(),
                reason: format!(
                    "an event of account {account} at seq {seq} waits to be applied: nothing to skip; apply it with `projector parked retry {account} --view {} --version {}`",
                    self.projection.name(),
                    self.projection.version()
                ),
            });
        }
        tx.execute(progress::SKIP_TO, &[&self.consumer, &account, &seq])
            .await
            .map_err(&err)?;
        tx.execute(
            progress::RECORD_SKIP,
            &[&self.consumer, &account, &seq, &skipped_by, &reason],
        )
        .await
        .map_err(&err)?;
        let at = Skipped::AtSeq {
            consumer: &self.consumer,
            account,
            seq,
        };
        dead_letters::skip(tx, at, skipped_by, reason)
            .await
            .map_err(&err)?;
        // One bounded step; `drain_account` takes the rest.
        let (counts, _) = self.drain_step(tx, account).await?;
        Ok(counts)
    }

    /// Applies whatever waits for `account` and can go now (its park may be stale, a
    /// retried dead letter filled its gap, or a batch drained only its first part), one
    /// bounded step: the bool says whether more may follow (call again).
    async fn drain_account_once(
        &self,
        client: &mut Client,
        account: i64,
    ) -> Result<(Counts, bool), ApplyError> {
        let mut tx = client
            .transaction()
            .await
            .map_err(self.db("beginning the transaction"))?;
        self.hold_running(&tx).await?;
        let (counts, more) = self.drain_step(&mut tx, account).await?;
        tx.commit().await.map_err(self.db("committing"))?;
        self.rang();
        Ok((counts, more))
    }

    /// Up to `limit` parked accounts whose next `seq` already waits, among events read from
    /// `topic`/`partition`: drains left unfinished, and accounts parked on an event of a
    /// version this build reads and the one that parked them did not
    /// ([`queries::DRAINABLE_ACCOUNTS`]). The partition's consumer drains them with
    /// [`Applier::drain_account`] when it starts and without waiting for their next event.
    /// None for a view that never parks.
    pub async fn drainable_accounts(
        &self,
        client: &Client,
        topic: &str,
        partition: i32,
        limit: i64,
    ) -> Result<Vec<i64>, ApplyError> {
        if self.tracking == super::Tracking::None {
            return Ok(Vec::new());
        }
        let (types, versions) = self.read_versions();
        Ok(client
            .query(
                queries::DRAINABLE_ACCOUNTS,
                &[
                    &self.consumer,
                    &topic,
                    &partition,
                    &limit,
                    &types,
                    &versions,
                    &(self.tracking == super::Tracking::Watermark),
                ],
            )
            .await
            .map_err(self.db("looking for drains left unfinished"))?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn drain_step(
        &self,
        tx: &mut Transaction<'_>,
        account: i64,
    ) -> Result<(Counts, bool), ApplyError> {
        let mut work = Work::pass("", 0, &[], &[]).draining(vec![account]);
        let counts = self.repair_in(tx, &mut work).await?;
        Ok((counts, !work.more_to_drain().is_empty()))
    }

    /// The apply path without the partition's fence and offset: load (and lock) the
    /// accounts, plan, run the statements, write the bookkeeping.
    async fn repair_in(
        &self,
        tx: &mut Transaction<'_>,
        work: &mut Work<'_>,
    ) -> Result<Counts, ApplyError> {
        let accounts = work.account_ids();
        let (is_live, account_statements) =
            futures::try_join!(self.prepare_is_live(tx), self.prepare_accounts(tx))?;
        let (live, states) = futures::try_join!(
            self.is_live(tx, is_live.as_ref()),
            self.load_accounts(tx, account_statements.as_ref(), &accounts)
        )?;
        work.set_live(live);
        self.plan(tx, work, states).await?;
        let release = self.execute(tx, work).await?;
        work.settle(self.ordered);
        self.write_bookkeeping(tx, work, None, release, &Counts::default())
            .await
    }
}
