//! A write side built the way the source documents say one must be: the system that *makes*
//! the events the engine consumes, for demos, load and tests (`projector simulate`).
//!
//! ```text
//!  clients ──(account, idempotency key, request)──▶ intake ──▶ ledger ──────────────┐
//!   retry on purpose; a few accounts are hot         │ one transaction:             │
//!                                                    │ key + hash + first reply,    │
//!                                                    │ account_seq bump (the seq),  │
//!                                                    │ positions, event, outbox row │
//!                                                    ▼                              │
//!  topic ◀──(key = account, murmur2, idempotent, acks=all)── relay ◀── outbox ◀─────┘
//!            publish, then mark sent; crashes on purpose in between
//! ```
//!
//! - **Intake** ([`Intake`], seed 000): client idempotency keys unique per account, stored with
//!   the request's hash and first reply; a retry gets that reply, a reused key with another
//!   request is refused, two racing requests under one key make one fill.
//! - **Ledger** ([`ledger`]): one transaction per event bumps the account's counter row in
//!   `account_seq` (the `seq`: consecutive, in commit order, never a bigserial), moves
//!   `positions` by the portfolio view's own rules, stores the event as its exact wire JSON
//!   under a unique `event_id`, and adds an outbox row (seeds 000, 001, 002).
//! - **Relay** ([`Relay`], seeds 002, 004): publishes the outbox in order per account with the
//!   idempotent producer and the Java-compatible partitioner, then marks rows sent; crashed on
//!   purpose between the two, so redeliveries at new offsets really happen.
//! - **Quote gate** ([`quotes`], seed 000's first half): prices at most once over UDP from a
//!   feed (a simulator with loss, copies, reordering, bursts, a lagging source and a skewed
//!   clock, or another feed), a per-symbol state machine of the seed's rules, and three checks
//!   before an order is accepted; a refused order's reason is its stored reply.
//! - **Clients** ([`load`]): a load generator at a given rate, with retries, key misuse, busts,
//!   cash movements and hot accounts.
//! - **Counters** ([`Counters`], [`Report`]): requests, retries, deduplicated, refused, events
//!   by type, published per partition, redeliveries injected.
//!
//! # Schema
//!
//! [`WriteSide::new`] creates it, idempotently. `positions` and `account_seq` are the snapshot
//! contract of `docs/views.md` and live in `public`, so that `projector rebuild --from snapshot`
//! against the same database finds them on the default `search_path`; everything else is in the
//! schema `writeside`. The statements are in `schema.sql` and `writeside.sql` beside this file.
//!
//! # Use in process
//!
//! ```no_run
//! # async fn demo(pool: deadpool_postgres::Pool) -> Result<(), projector_devkit::writeside::WriteSideError> {
//! use projector_devkit::writeside::{Order, RelayConfig, Side, WriteSide};
//! use tokio_util::sync::CancellationToken;
//!
//! let write_side = WriteSide::new(pool).await?;
//! let order = Order {
//!     symbol: "EURUSD".into(),
//!     side: Side::Buy,
//!     qty: "300".parse().expect("a decimal"),
//!     price: "1.08420".parse().expect("a decimal"),
//! };
//! let first = write_side.intake().place(42, "order-1", order.clone()).await?;
//! let retry = write_side.intake().place(42, "order-1", order).await?; // the same reply
//! assert_eq!(first.reply(), retry.reply());
//!
//! let relay = write_side.relay(RelayConfig::new("127.0.0.1:9092", "trades"));
//! let (drain, stop) = (CancellationToken::new(), CancellationToken::new());
//! drain.cancel(); // publish what is there, then return
//! relay.run(drain, stop).await?;
//! println!("{:?}", write_side.report());
//! # Ok(()) }
//! ```

pub mod counters;
mod error;
pub mod intake;
pub mod ledger;
pub mod load;
pub mod quotes;
pub mod relay;
mod sql;

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use counters::{Counters, Report};
pub use error::{OrderRefused, WriteSideError};
pub use intake::{Intake, Outcome};
pub use ledger::{Command, Order, Reply, Side};
pub use load::{LoadConfig, SYMBOLS};
pub use quotes::QuoteGate;
pub use relay::{Relay, RelayConfig, RelayExit};

use error::db;

/// One advisory lock key for every process creating the schema, so that two simulators
/// starting at once take turns instead of racing on `CREATE TABLE IF NOT EXISTS`.
const SCHEMA_LOCK: i64 = 0x7772_6974_6573_6964; // "writesid"

/// The columns `docs/views.md` gives `positions` and `account_seq`: (table, column, type).
const CONTRACT: [(&str, &str, &str); 10] = [
    ("account_seq", "account_id", "bigint"),
    ("account_seq", "last_seq", "bigint"),
    ("positions", "account_id", "bigint"),
    ("positions", "symbol", "text"),
    ("positions", "net_qty", "numeric"),
    ("positions", "avg_price", "numeric"),
    ("positions", "realized_pnl", "numeric"),
    ("positions", "last_price", "numeric"),
    ("positions", "last_trade_at", "timestamp with time zone"),
    ("positions", "last_seq", "bigint"),
];

/// The write side's schema (`public.positions`, `public.account_seq` and its own tables),
/// every statement idempotent: with [`book_trade_sql`], what the conformance suite's snapshot
/// schedule keeps the snapshot's relations with
/// (`projector_engine::testkit::conformance::WriteSide`), so that a view's snapshot statement
/// is checked against the positions this write side really keeps.
pub fn snapshot_schema_sql() -> &'static str {
    &sql::SCHEMA
}

/// The statement that moves `public.positions` for a fill or a bust, given the event's wire
/// JSON as `$1` (text), by the portfolio rules: the one the write side runs in the event's
/// transaction.
pub fn book_trade_sql() -> &'static str {
    &sql::BOOK_TRADE
}

/// A write side over one database: its intake, relay, load generator and counters.
#[derive(Debug, Clone)]
pub struct WriteSide {
    pool: Pool,
    /// This database's tag, part of every event id (see `writeside.meta`).
    instance: Arc<str>,
    counters: Arc<Counters>,
    /// Woken after each committed write, so that a relay in this process publishes at once
    /// instead of at its next poll.
    written: Arc<Notify>,
    /// Checked before every order, when set.
    quotes: Option<QuoteGate>,
    /// The version of their shape fills and busts are written at: 2 (a signed `qty`) unless
    /// set otherwise, shared by every clone, so that a running write side can be upgraded.
    fill_version: Arc<AtomicI32>,
}

impl WriteSide {
    /// Creates the schema when it is missing (idempotent) and returns the write side.
    ///
    /// Refuses a `public.positions` or `public.account_seq` that exists with other columns than
    /// the snapshot contract's.
    pub async fn new(pool: Pool) -> Result<Self, WriteSideError> {
        let mut client = pool.get().await.map_err(WriteSideError::Pool)?;
        let tx = client
            .transaction()
            .await
            .map_err(db("starting the schema transaction"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
            .await
            .map_err(db("taking the schema lock"))?;
        tx.batch_execute(&sql::SCHEMA)
            .await
            .map_err(db("creating the write side's schema"))?;
        let shape: Vec<(String, String, String)> = tx
            .query(*sql::POSITIONS_SHAPE, &[])
            .await
            .map_err(db("reading the shape of positions and account_seq"))?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let expected: Vec<(String, String, String)> = CONTRACT
            .iter()
            .map(|(t, c, ty)| ((*t).to_owned(), (*c).to_owned(), (*ty).to_owned()))
            .collect();
        if shape != expected {
            return Err(WriteSideError::InvalidConfig(format!(
                "public.positions or public.account_seq exists with columns other than docs/views.md's snapshot contract: {shape:?}"
            )));
        }
        let instance: String = tx
            .query_one(*sql::INSTANCE, &[])
            .await
            .map_err(db("reading the write side's tag"))?
            .get(0);
        tx.commit()
            .await
            .map_err(db("committing the write side's schema"))?;
        drop(client);
        Ok(Self {
            pool,
            instance: instance.into(),
            counters: Arc::new(Counters::default()),
            written: Arc::new(Notify::new()),
            quotes: None,
            fill_version: Arc::new(AtomicI32::new(2)),
        })
    }

    /// Writes fills and busts at `version` of their shape from now on, in every clone and
    /// intake of this write side: 1 (`side` and a positive `qty`) or 2 (a signed `qty`, no
    /// side; the default). An upgrade of the producer in the middle of a run: the topic then
    /// holds both. A bust is written at the version current when it is written, repeating its
    /// fill's trade whatever version the fill was written at.
    pub fn set_fill_version(&self, version: i32) -> Result<(), WriteSideError> {
        if !(1..=2).contains(&version) {
            return Err(WriteSideError::InvalidConfig(format!(
                "fill version {version}: the write side writes versions 1 and 2"
            )));
        }
        self.fill_version.store(version, Ordering::Relaxed);
        Ok(())
    }

    /// The version fills and busts are written at now.
    pub fn fill_version(&self) -> i32 {
        self.fill_version.load(Ordering::Relaxed)
    }

    /// Fills and busts stored so far at version 1 and at version 2.
    pub async fn trades_by_version(&self) -> Result<(i64, i64), WriteSideError> {
        let client = self.pool.get().await.map_err(WriteSideError::Pool)?;
        let row = client
            .query_one(*sql::TRADES_BY_VERSION, &[])
            .await
            .map_err(db("counting fills and busts by version"))?;
        Ok((row.get(0), row.get(1)))
    }

    /// Checks every order against `gate` before it is accepted (see [`quotes`]); a refused
    /// order stores its reason as the key's reply and writes nothing else.
    pub fn with_quotes(mut self, gate: QuoteGate) -> Self {
        self.quotes = Some(gate);
        self
    }

    /// The quote gate orders are checked against, if any.
    pub fn quotes(&self) -> Option<&QuoteGate> {
        self.quotes.as_ref()
    }

    /// This database's tag, as it appears in event ids (`fill-<tag>-<account>-<seq>`).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The pool it writes through.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The request intake.
    pub fn intake(&self) -> Intake {
        Intake {
            pool: self.pool.clone(),
            instance: Arc::clone(&self.instance),
            counters: Arc::clone(&self.counters),
            written: Arc::clone(&self.written),
            quotes: self.quotes.clone(),
            fill_version: Arc::clone(&self.fill_version),
        }
    }

    /// An outbox relay publishing with `config`.
    pub fn relay(&self, config: RelayConfig) -> Relay {
        Relay {
            pool: self.pool.clone(),
            counters: Arc::clone(&self.counters),
            written: Arc::clone(&self.written),
            config,
        }
    }

    /// Runs simulated clients against the intake until `stop` is cancelled or
    /// [`LoadConfig::max_requests`] requests were made; see [`load`].
    pub async fn run_load(
        &self,
        config: &LoadConfig,
        stop: CancellationToken,
    ) -> Result<(), WriteSideError> {
        load::run(self.intake(), config, stop).await
    }

    /// The live counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// The counts as of now.
    pub fn report(&self) -> Report {
        self.counters.report()
    }
}
