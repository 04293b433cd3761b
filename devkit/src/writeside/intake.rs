//! Request intake with client idempotency keys (seed 000, "İlaç 1").
//!
//! The client makes the key, once per logical request (not per attempt), and sends it again on
//! every retry. The key is unique per account, not globally: a global key would let one
//! account's retry read another account's reply. With the key the write side keeps the hash of
//! the request and its first reply, in the transaction that writes the event:
//!
//! - first request under the key: the event is written and the reply stored;
//! - the same request again: the stored reply, unchanged, and nothing written (a "key exists"
//!   error would make the client believe it failed, and try again);
//! - a different request under the key: refused ([`WriteSideError::KeyReused`]), never
//!   answered with the first request's reply ("1 lot or 10 lots" must not pass in silence).
//!
//! The check is the `INSERT ... ON CONFLICT DO NOTHING RETURNING` on the key's primary key, not
//! a read before the write: two clients racing with one key serialize on that insert, and one
//! fill comes out.
//!
//! With a quote gate ([`super::WriteSide::with_quotes`]), an order is checked once its key is
//! claimed, again once its account is locked, and a last time right before the commit: a
//! stale, stale-at-source or suspect quote at any of the three refuses it. The account's lock
//! is the write's one wait, and it lasts as long as the account's other transactions do: a
//! check made only before it would let an order commit on a quote that went stale while it
//! queued. The refusal is stored as the key's reply in that transaction and committed with no
//! event, no seq and no position move (what was written after the lock is rolled back to a
//! savepoint), and every retry under the key gets that refusal again: the first answer is the
//! answer (seed 000), even once the quote is fresh. Checking before the claim would let a
//! retry racing the first attempt be checked on its own, later quote; the claim makes it wait
//! for the first attempt's answer instead.
//!
//! Behind the gate the fill's price is the quote the check after the lock accepted (the ask
//! for a buy, the bid for a sell), never the order's own: a client prices its order from the
//! quote it last saw, which may be one the gate refuses, and a price the gate never vouched
//! for must not become a fill once the symbol heals. The order's price stays part of the
//! request (its hash), and the reply says what it filled at. Busts and cash movements do not
//! depend on a price and are not checked.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use deadpool_postgres::{Pool, Transaction};
use rust_decimal::Decimal;
use tokio::sync::Notify;
use tokio_postgres::Statement;

use super::counters::{add, Counters};
use super::error::{db, OrderRefused, WriteSideError};
use super::ledger::{self, reply_from_json, Command, Order, Reply, Side};
use super::quotes::{self, Quote, QuoteGate, Refusal};
use super::sql;

/// The longest idempotency key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 128;

/// How a request was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// First time under this key: the event was written.
    Accepted(Reply),
    /// A retry: the first request's reply, nothing written.
    Replayed(Reply),
}

impl Outcome {
    /// The reply, either way.
    pub fn reply(&self) -> &Reply {
        match self {
            Self::Accepted(r) | Self::Replayed(r) => r,
        }
    }

    /// Whether this request wrote the event.
    pub fn is_accepted(&self) -> bool {
        matches!(self, Self::Accepted(_))
    }
}

/// The write side's front door. Cheap to clone; clones share the pool and counters.
#[derive(Debug, Clone)]
pub struct Intake {
    pub(crate) pool: Pool,
    pub(crate) instance: Arc<str>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) written: Arc<Notify>,
    /// Checked before every order when set.
    pub(crate) quotes: Option<QuoteGate>,
    /// The version fills and busts are written at (`WriteSide::set_fill_version`).
    pub(crate) fill_version: Arc<AtomicI32>,
}

/// How `handle` answered, before it is counted.
enum Handled {
    Done(Outcome),
    /// Refused by the quote gate; `replayed` when the refusal is the key's stored reply.
    QuoteRefused {
        refused: OrderRefused,
        replayed: bool,
    },
}

/// The stored reply of a refused order: `{"refused": {...}}`, which no [`Reply`] has.
const REFUSED: &str = "refused";

impl Intake {
    /// Places an order under the client's idempotency key.
    pub async fn place(
        &self,
        account_id: i64,
        key: &str,
        order: Order,
    ) -> Result<Outcome, WriteSideError> {
        self.submit(account_id, key, &Command::Order(order)).await
    }

    /// Handles one request: the first under `(account_id, key)` is written, a retry gets the
    /// first reply, a different request under the key is refused.
    pub async fn submit(
        &self,
        account_id: i64,
        key: &str,
        command: &Command,
    ) -> Result<Outcome, WriteSideError> {
        add(&self.counters.requests, 1);
        let result = self.handle(account_id, key, command).await;
        match &result {
            Ok(Handled::Done(Outcome::Accepted(_))) => {
                let counter = match command {
                    Command::Order(_) => &self.counters.fills,
                    Command::Bust { .. } => &self.counters.busts,
                    Command::Cash { .. } => &self.counters.cash,
                };
                add(counter, 1);
                self.written.notify_one();
            }
            Ok(Handled::Done(Outcome::Replayed(_)))
            | Ok(Handled::QuoteRefused { replayed: true, .. }) => {
                add(&self.counters.deduplicated, 1);
            }
            Ok(Handled::QuoteRefused {
                refused,
                replayed: false,
            }) => {
                let counter = match refused.refusal {
                    Refusal::StaleQuote { .. } => &self.counters.refused_stale_quote,
                    Refusal::StaleAtSource { .. } => &self.counters.refused_stale_at_source,
                    Refusal::Suspect { .. } => &self.counters.refused_suspect,
                };
                add(counter, 1);
                quotes::order_refused(refused.refusal.reason());
            }
            Err(WriteSideError::KeyReused { .. }) => add(&self.counters.refused, 1),
            Err(e) if e.is_refusal() => add(&self.counters.rejected, 1),
            Err(_) => {}
        }
        match result? {
            Handled::Done(outcome) => Ok(outcome),
            Handled::QuoteRefused { refused, .. } => Err(WriteSideError::QuoteRefused(refused)),
        }
    }

    /// The quote the gate holds for `symbol`, accepted or not; `None` without a gate. A client
    /// prices its order from it, as a screen shows a price; the fill is at the quote the gate
    /// accepts when the order is written.
    pub fn quote(&self, symbol: &str) -> Option<Quote> {
        self.quotes.as_ref().and_then(|g| g.quote(symbol))
    }

    async fn handle(
        &self,
        account_id: i64,
        key: &str,
        command: &Command,
    ) -> Result<Handled, WriteSideError> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
            return Err(WriteSideError::InvalidRequest(format!(
                "an idempotency key is 1 to {MAX_KEY_BYTES} bytes without control characters"
            )));
        }
        command.validate()?;
        let canonical = command.canonical();
        let mut client = self.pool.get().await.map_err(WriteSideError::Pool)?;
        let tx = client
            .transaction()
            .await
            .map_err(db("starting the request's transaction"))?;
        let claim = tx
            .prepare_cached(&sql::CLAIM_KEY)
            .await
            .map_err(db("preparing the key claim"))?;
        let claimed = tx
            .query_opt(&claim, &[&account_id, &key, &canonical])
            .await
            .map_err(db("claiming the idempotency key"))?;
        if claimed.is_none() {
            let stored = tx
                .prepare_cached(&sql::STORED_REPLY)
                .await
                .map_err(db("preparing the stored reply"))?;
            let row = tx
                .query_one(&stored, &[&account_id, &key, &canonical])
                .await
                .map_err(db("reading the key's first reply"))?;
            // Nothing was written; ending the transaction either way is the same.
            tx.rollback()
                .await
                .map_err(db("ending the retry's transaction"))?;
            let same: bool = row.get(0);
            if !same {
                return Err(WriteSideError::KeyReused {
                    account_id,
                    key: key.to_owned(),
                });
            }
            let reply: Option<serde_json::Value> = row.get(1);
            let mut reply = reply.ok_or_else(|| {
                WriteSideError::Corrupt(format!(
                    "key {key:?} of account {account_id} was committed without its reply"
                ))
            })?;
            if let Some(refused) = reply.get_mut(REFUSED).map(serde_json::Value::take) {
                let refused = serde_json::from_value(refused).map_err(|e| {
                    WriteSideError::Corrupt(format!(
                        "the stored refusal of key {key:?} of account {account_id} does not read back: {e}"
                    ))
                })?;
                return Ok(Handled::QuoteRefused {
                    refused,
                    replayed: true,
                });
            }
            return Ok(Handled::Done(Outcome::Replayed(reply_from_json(reply)?)));
        }
        let store = tx
            .prepare_cached(&sql::STORE_REPLY)
            .await
            .map_err(db("preparing the reply store"))?;
        if let (Command::Order(order), Some(gate)) = (command, &self.quotes) {
            return self
                .place_on_quote(tx, &store, account_id, key, order, gate)
                .await;
        }
        // A refusal or a failure returns here and drops `tx`, which rolls back the key claim
        // with everything else: the same request can come again.
        let version = self.fill_version.load(Ordering::Relaxed);
        let reply = ledger::write(&tx, &self.instance, version, account_id, command).await?;
        store_reply(&tx, &store, account_id, key, &reply).await?;
        tx.commit()
            .await
            .map_err(db("committing the request's transaction"))?;
        Ok(Handled::Done(Outcome::Accepted(reply)))
    }

    /// An order behind the quote gate, its key claimed in `tx`. Checked three times, each
    /// refusal stored as the key's reply and committed with nothing else:
    ///
    /// 1. at once, so that an order on a quote refused already does not queue for its account;
    /// 2. once the account's counter row is locked, after the only wait of the write, however
    ///    long: this check's quote is the fill's price (the ask for a buy, the bid for a
    ///    sell), whatever the order's own says;
    /// 3. with everything written, right before the commit: no wait is left but the commit's.
    ///
    /// A refusal at 2 or 3 rolls back to a savepoint set before the lock, which undoes the seq
    /// bump (no gap, the lock released), the event, its outbox row and the position move.
    async fn place_on_quote(
        &self,
        tx: Transaction<'_>,
        store: &Statement,
        account_id: i64,
        key: &str,
        order: &Order,
        gate: &QuoteGate,
    ) -> Result<Handled, WriteSideError> {
        if let Err(refusal) = gate.check(&order.symbol) {
            return refuse(tx, store, account_id, key, &order.symbol, refusal).await;
        }
        tx.batch_execute(&sql::SAVEPOINT_FILL)
            .await
            .map_err(db("setting the order's savepoint"))?;
        let locked = ledger::lock(&tx, account_id).await?;
        let price = match gate.check(&order.symbol) {
            Ok(quote) => fill_price(&quote, order)?,
            Err(refusal) => {
                return refuse_after_lock(tx, store, account_id, key, &order.symbol, refusal).await
            }
        };
        let command = Command::Order(order.clone());
        let reply = ledger::write_locked(
            &tx,
            &self.instance,
            self.fill_version.load(Ordering::Relaxed),
            account_id,
            locked,
            &command,
            Some(price),
        )
        .await?;
        store_reply(&tx, store, account_id, key, &reply).await?;
        if let Err(refusal) = gate.check(&order.symbol) {
            return refuse_after_lock(tx, store, account_id, key, &order.symbol, refusal).await;
        }
        tx.commit()
            .await
            .map_err(db("committing the request's transaction"))?;
        Ok(Handled::Done(Outcome::Accepted(reply)))
    }

    /// The current net quantity of a position (zero when the account never traded the
    /// symbol): what a client reads before it closes a position exactly.
    pub async fn net_qty(
        &self,
        account_id: i64,
        symbol: &str,
    ) -> Result<rust_decimal::Decimal, WriteSideError> {
        let client = self.pool.get().await.map_err(WriteSideError::Pool)?;
        let statement = client
            .prepare_cached(&sql::NET_QTY)
            .await
            .map_err(db("preparing the position read"))?;
        let row = client
            .query_opt(&statement, &[&account_id, &symbol])
            .await
            .map_err(db("reading a position"))?;
        match row {
            None => Ok(rust_decimal::Decimal::ZERO),
            Some(r) => r.try_get(0).map_err(|e| {
                WriteSideError::Corrupt(format!(
                    "position {symbol:?} of account {account_id} does not read back: {e}"
                ))
            }),
        }
    }
}

/// The quote's price for `order`: what a buy pays (the ask), what a sell gets (the bid).
fn fill_price(quote: &Quote, order: &Order) -> Result<Decimal, WriteSideError> {
    let price = match order.side {
        Side::Buy => quote.ask,
        Side::Sell => quote.bid,
    };
    // The gate accepts no quote without both prices.
    price.ok_or_else(|| {
        WriteSideError::Corrupt(format!(
            "the quote gate accepted a quote of {} without a {} price",
            order.symbol,
            match order.side {
                Side::Buy => "ask",
                Side::Sell => "bid",
            }
        ))
    })
}

async fn store_reply(
    tx: &Transaction<'_>,
    store: &Statement,
    account_id: i64,
    key: &str,
    reply: &Reply,
) -> Result<(), WriteSideError> {
    let json = serde_json::to_value(reply)
        .map_err(|e| WriteSideError::Corrupt(format!("cannot store a reply: {e}")))?;
    tx.execute(store, &[&account_id, &key, &json])
        .await
        .map_err(db("storing the first reply"))?;
    Ok(())
}

/// Stores the gate's refusal as the key's reply and commits it: the key's answer for good.
async fn refuse(
    tx: Transaction<'_>,
    store: &Statement,
    account_id: i64,
    key: &str,
    symbol: &str,
    refusal: Refusal,
) -> Result<Handled, WriteSideError> {
    let refused = OrderRefused::new(symbol, refusal);
    let json = serde_json::json!({ REFUSED: refused });
    tx.execute(store, &[&account_id, &key, &json])
        .await
        .map_err(db("storing the refusal"))?;
    tx.commit().await.map_err(db("committing the refusal"))?;
    Ok(Handled::QuoteRefused {
        refused,
        replayed: false,
    })
}

/// [`refuse`], once the order's savepoint is set: everything after it is undone first.
async fn refuse_after_lock(
    tx: Transaction<'_>,
    store: &Statement,
    account_id: i64,
    key: &str,
    symbol: &str,
    refusal: Refusal,
) -> Result<Handled, WriteSideError> {
    tx.batch_execute(&sql::ROLLBACK_FILL)
        .await
        .map_err(db("rolling the refused order back"))?;
    refuse(tx, store, account_id, key, symbol, refusal).await
}
