//! The ledger: one event written in one transaction, the way the source documents say a write
//! side must.
//!
//! In the caller's transaction (the intake's, which also holds the idempotency key):
//!
//! 1. the account's counter row in `account_seq` is bumped (`lock`), which assigns the `seq`
//!    and locks the account until commit, so its events are numbered in commit order with no
//!    gaps. This is where a write waits, for as long as the account's other transactions
//!    take; what comes after waits on no lock, so a caller that must decide something as late
//!    as possible (the quote gate's price) decides it between the two (`write_locked`);
//! 2. the event is built as its exact wire JSON, fills and busts at the write side's current
//!    version of their shape (`WriteSide::set_fill_version`: 1, with `side` and a positive
//!    `qty`, or 2, the signed `qty` alone; docs/wire-format.md), and checked with the
//!    engine's own decoder, so the write side never stores what a view would dead-letter;
//! 3. a fill or a bust moves `positions` by the portfolio rules (`book_trade` in
//!    `writeside.sql`), a bust claims its fill in `writeside.busts` (once only);
//! 4. the event is stored with its unique `event_id`, and an outbox row is added.
//!
//! A refusal (a bust of a fill already busted) returns an error and the caller's transaction
//! rolls back, the seq bump with it: no gap.

use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use deadpool_postgres::Transaction;
use projector_engine::Message;
use projector_views::events::{
    decode, CASH_ADJUSTED, FILL_BUSTED, FILL_EXECUTED, MAX_SYMBOL_BYTES,
};
use rust_decimal::{Decimal, RoundingStrategy};
use serde::{Deserialize, Serialize};

use super::error::{db, WriteSideError};
use super::sql;

/// Buy or sell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// Buys add to the position.
    Buy,
    /// Sells take from it.
    Sell,
}

impl Side {
    /// The wire text: `buy` or `sell`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Buy => "buy",
            Self::Sell => "sell",
        }
    }

    /// The other side.
    pub fn opposite(self) -> Self {
        match self {
            Self::Buy => Self::Sell,
            Self::Sell => Self::Buy,
        }
    }
}

/// An order. The simulated exchange fills it at once, whole: at its price, or, behind a quote
/// gate, at the quote the gate accepts (the ask for a buy, the bid for a sell).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The instrument, e.g. `EURUSD`.
    pub symbol: String,
    /// Buy or sell.
    pub side: Side,
    /// Quantity, more than zero.
    pub qty: Decimal,
    /// The price the client saw, zero or more: the fill's price without a quote gate. Part of
    /// the request (its hash) either way.
    pub price: Decimal,
}

/// What a client asks the write side to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// Place an order; written as a `fill_executed`.
    Order(Order),
    /// Bust an earlier fill of the account; written as a `fill_busted` that reverses it.
    Bust {
        /// The `event_id` of the fill.
        fill_event_id: String,
    },
    /// Move cash in (positive) or out (negative); written as a `cash_adjusted`.
    Cash {
        /// Signed amount, not zero.
        amount: Decimal,
        /// Why, for the statement.
        reason: String,
    },
}

impl Command {
    /// The request's canonical text, whose hash is stored with its idempotency key. Decimals
    /// are normalized (`300.0` and `300` are the same order), fields are in a fixed order.
    pub fn canonical(&self) -> String {
        let normalized = match self {
            Self::Order(o) => Self::Order(Order {
                qty: o.qty.normalize(),
                price: o.price.normalize(),
                ..o.clone()
            }),
            Self::Cash { amount, reason } => Self::Cash {
                amount: amount.normalize(),
                reason: reason.clone(),
            },
            other => other.clone(),
        };
        // A struct of strings and enums: serialization cannot fail.
        serde_json::to_string(&normalized).unwrap_or_default()
    }

    /// The event type this command writes.
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::Order(_) => FILL_EXECUTED,
            Self::Bust { .. } => FILL_BUSTED,
            Self::Cash { .. } => CASH_ADJUSTED,
        }
    }

    /// Refuses what cannot become a valid event, before anything is written.
    pub fn validate(&self) -> Result<(), WriteSideError> {
        let bad = |m: String| Err(WriteSideError::InvalidRequest(m));
        match self {
            Self::Order(o) => {
                if o.symbol.is_empty()
                    || o.symbol.len() > MAX_SYMBOL_BYTES
                    || o.symbol.chars().any(char::is_control)
                {
                    return bad(format!(
                        "symbol {:?} must be 1 to {MAX_SYMBOL_BYTES} bytes without control characters",
                        o.symbol
                    ));
                }
                if o.qty <= Decimal::ZERO {
                    return bad(format!("quantity {} must be more than zero", o.qty));
                }
                if o.price < Decimal::ZERO {
                    return bad(format!("price {} must not be negative", o.price));
                }
            }
            Self::Bust { fill_event_id } if fill_event_id.is_empty() => {
                return bad("a bust names the fill it reverses".to_owned());
            }
            Self::Bust { .. } => {}
            Self::Cash { amount, reason } => {
                if amount.is_zero() {
                    return bad("a cash adjustment of zero moves nothing".to_owned());
                }
                if reason.is_empty() || reason.len() > 1024 || reason.contains('\0') {
                    return bad("a reason must be 1 to 1024 bytes without NUL".to_owned());
                }
            }
        }
        Ok(())
    }
}

/// What the write side answered: the event written. Stored with the idempotency key as the
/// first reply and returned again, unchanged, to every retry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reply {
    /// The event written.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// The account.
    pub account_id: i64,
    /// Its per-account sequence number.
    pub seq: i64,
    /// Its `occurred_at`, as on the wire.
    pub occurred_at: String,
    /// The fee charged, for a fill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee: Option<Decimal>,
    /// The price filled at, for a fill: behind a quote gate it is the quote's, not the
    /// order's, so the client learns it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Decimal>,
}

/// The exchange's fee: 2 basis points of the notional, in cents, rounded half away from zero.
pub fn fee(qty: Decimal, price: Decimal) -> Decimal {
    let rate = Decimal::new(2, 4);
    qty.checked_mul(price)
        .and_then(|n| n.checked_mul(rate))
        .unwrap_or(Decimal::ZERO)
        .round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero)
}

/// The wire format's envelope, fields in the documented order.
#[derive(Serialize)]
struct Envelope<'a, D: Serialize> {
    event_id: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    /// Left out at version 1: a version 1 event is the bytes it always was.
    #[serde(skip_serializing_if = "Option::is_none")]
    type_version: Option<i32>,
    account_id: i64,
    seq: i64,
    occurred_at: &'a str,
    data: D,
}

/// `fill_executed`'s data; decimals as strings, with the scale they were given. Version 1
/// has the side and a positive quantity, version 2 no side and the quantity signed.
#[derive(Serialize)]
struct FillData<'a> {
    symbol: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    side: Option<&'static str>,
    qty: String,
    price: String,
    fee: String,
}

/// `fill_busted`'s data: the original's fields, copied as text.
#[derive(Serialize)]
struct BustData {
    fill_event_id: String,
    #[serde(flatten)]
    original: Traded,
}

/// What a bust copies from its fill: the text the fill was written with, so that the bust's
/// decimals are the fill's to the digit. At either version: `side` and a positive `qty`
/// (1), or no side and a signed `qty` (2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Traded {
    symbol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    side: Option<String>,
    qty: String,
    price: String,
}

impl Traded {
    /// The same trade at `version` of the shape, whatever version the fill was written at:
    /// a bust is written at the producer's current version, and repeats its fill's trade. The
    /// quantity's text is kept but for its sign, so its digits are the fill's.
    fn at_version(self, version: i32) -> Result<Self, String> {
        let (sell, digits) = match (self.side.as_deref(), self.qty.strip_prefix('-')) {
            (Some("buy"), None) => (false, self.qty.clone()),
            (Some("sell"), None) => (true, self.qty.clone()),
            (None, Some(digits)) => (true, digits.to_owned()),
            (None, None) => (false, self.qty.clone()),
            (side, _) => return Err(format!("side {side:?} with quantity {:?}", self.qty)),
        };
        let (side, qty) = if version >= 2 {
            (None, if sell { format!("-{digits}") } else { digits })
        } else {
            (Some(if sell { "sell" } else { "buy" }.to_owned()), digits)
        };
        Ok(Self { side, qty, ..self })
    }
}

/// `cash_adjusted`'s data.
#[derive(Serialize)]
struct CashData<'a> {
    amount: String,
    reason: &'a str,
}

/// RFC 3339 in UTC with milliseconds, as the wire examples write it.
pub fn wire_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The event id: the type's prefix, the database's tag, the account and the seq. Unique
/// because (account, seq) is, and identical on every republish because it is stored.
pub fn event_id(event_type: &str, instance: &str, account_id: i64, seq: i64) -> String {
    let prefix = match event_type {
        FILL_EXECUTED => "fill",
        FILL_BUSTED => "bust",
        _ => "cash",
    };
    format!("{prefix}-{instance}-{account_id}-{seq}")
}

fn envelope<D: Serialize>(
    event_id: &str,
    event_type: &str,
    version: i32,
    account_id: i64,
    seq: i64,
    occurred_at: &str,
    data: D,
) -> Result<String, WriteSideError> {
    let payload = serde_json::to_string(&Envelope {
        event_id,
        event_type,
        type_version: (version > 1).then_some(version),
        account_id,
        seq,
        occurred_at,
        data,
    })
    .map_err(|e| WriteSideError::InvalidRequest(format!("cannot write the event: {e}")))?;
    // The built-in views' decoder: whatever they would dead-letter is refused here instead.
    decode(&Message::new(
        0,
        Some(account_id.to_string().into_bytes()),
        payload.as_bytes(),
    ))
    .map_err(|e| WriteSideError::InvalidRequest(e.to_string()))?;
    Ok(payload)
}

/// The account's counter row, bumped and locked by [`lock`]: the event's seq and time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Locked {
    seq: i64,
    now: DateTime<Utc>,
}

/// Bumps `account_id`'s counter row in `tx`: its next seq, and its lock until `tx` ends. This
/// waits for the account's other transactions, however long they take.
pub(crate) async fn lock(tx: &Transaction<'_>, account_id: i64) -> Result<Locked, WriteSideError> {
    let next = tx
        .prepare_cached(&sql::NEXT_SEQ)
        .await
        .map_err(db("preparing the seq bump"))?;
    let row = tx
        .query_one(&next, &[&account_id])
        .await
        .map_err(db("bumping the account's seq"))?;
    Ok(Locked {
        seq: row.get(0),
        now: row.get(1),
    })
}

/// Writes `command` for `account_id` in `tx` and returns the reply, a fill or a bust at
/// version `fill_version` of its shape. Nothing is visible until the caller commits; an error
/// leaves `tx` to be rolled back.
pub(crate) async fn write(
    tx: &Transaction<'_>,
    instance: &str,
    fill_version: i32,
    account_id: i64,
    command: &Command,
) -> Result<Reply, WriteSideError> {
    command.validate()?;
    let locked = lock(tx, account_id).await?;
    write_locked(
        tx,
        instance,
        fill_version,
        account_id,
        locked,
        command,
        None,
    )
    .await
}

/// Writes `command` under the lock [`lock`] took; an order fills at `fill_price`, or at its
/// own price when `None`. Waits on no lock of the write side's.
pub(crate) async fn write_locked(
    tx: &Transaction<'_>,
    instance: &str,
    fill_version: i32,
    account_id: i64,
    locked: Locked,
    command: &Command,
    fill_price: Option<Decimal>,
) -> Result<Reply, WriteSideError> {
    command.validate()?;
    let Locked { seq, now } = locked;
    let occurred_at = wire_time(now);
    let event_type = command.event_type();
    let event_id = event_id(event_type, instance, account_id, seq);
    let mut fee_charged = None;
    let mut filled_at = None;

    let payload = match command {
        Command::Order(o) => {
            let price = fill_price.unwrap_or(o.price);
            let f = fee(o.qty, price);
            fee_charged = Some(f);
            filled_at = Some(price);
            let (side, qty) = match (fill_version >= 2, o.side) {
                (false, side) => (Some(side.as_str()), o.qty),
                (true, Side::Buy) => (None, o.qty),
                (true, Side::Sell) => (None, -o.qty),
            };
            let data = FillData {
                symbol: &o.symbol,
                side,
                qty: qty.to_string(),
                price: price.to_string(),
                fee: f.to_string(),
            };
            envelope(
                &event_id,
                event_type,
                fill_version,
                account_id,
                seq,
                &occurred_at,
                data,
            )?
        }
        Command::Bust { fill_event_id } => {
            let refused = |reason| WriteSideError::BustRefused {
                account_id,
                fill_event_id: fill_event_id.clone(),
                reason,
            };
            let find = tx
                .prepare_cached(&sql::FIND_FILL)
                .await
                .map_err(db("preparing the fill lookup"))?;
            let original = tx
                .query_opt(&find, &[fill_event_id, &account_id])
                .await
                .map_err(db("looking up the fill to bust"))?
                .ok_or_else(|| refused("no such fill of this account"))?;
            let data: serde_json::Value = original.get(0);
            let original: Traded = serde_json::from_value(data)
                .map_err(|e| e.to_string())
                .and_then(|t: Traded| t.at_version(fill_version))
                .map_err(|e| {
                    WriteSideError::Corrupt(format!(
                        "fill {fill_event_id:?} does not read back: {e}"
                    ))
                })?;
            let claim = tx
                .prepare_cached(&sql::CLAIM_BUST)
                .await
                .map_err(db("preparing the bust claim"))?;
            tx.query_opt(&claim, &[fill_event_id, &event_id])
                .await
                .map_err(db("claiming the fill for the bust"))?
                .ok_or_else(|| refused("the fill is already busted"))?;
            let data = BustData {
                fill_event_id: fill_event_id.clone(),
                original,
            };
            envelope(
                &event_id,
                event_type,
                fill_version,
                account_id,
                seq,
                &occurred_at,
                data,
            )?
        }
        Command::Cash { amount, reason } => {
            let data = CashData {
                amount: amount.to_string(),
                reason,
            };
            envelope(
                &event_id,
                event_type,
                1,
                account_id,
                seq,
                &occurred_at,
                data,
            )?
        }
    };

    let record = tx
        .prepare_cached(&sql::RECORD_EVENT)
        .await
        .map_err(db("preparing the event insert"))?;
    if matches!(command, Command::Cash { .. }) {
        tx.execute(&record, &[&payload])
            .await
            .map_err(db("storing the event and its outbox row"))?;
    } else {
        let book = tx
            .prepare_cached(&sql::BOOK_TRADE)
            .await
            .map_err(db("preparing the position update"))?;
        // Pipelined: both statements go out before either answer comes back.
        futures::try_join!(
            async {
                tx.execute(&record, &[&payload])
                    .await
                    .map_err(db("storing the event and its outbox row"))
            },
            async {
                tx.execute(&book, &[&payload])
                    .await
                    .map_err(db("moving the position"))
            },
        )?;
    }
    Ok(Reply {
        event_id,
        event_type: event_type.to_owned(),
        account_id,
        seq,
        occurred_at,
        fee: fee_charged,
        price: filled_at,
    })
}

/// Reads a stored reply back.
pub(crate) fn reply_from_json(value: serde_json::Value) -> Result<Reply, WriteSideError> {
    serde_json::from_value(value)
        .map_err(|e| WriteSideError::Corrupt(format!("a stored reply does not read back: {e}")))
}

/// Parses a decimal given as text, for command-line and test callers.
pub fn decimal(text: &str) -> Result<Decimal, WriteSideError> {
    Decimal::from_str(text)
        .map_err(|e| WriteSideError::InvalidRequest(format!("{text:?} is not a decimal: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(qty: &str) -> Command {
        Command::Order(Order {
            symbol: "EURUSD".to_owned(),
            side: Side::Buy,
            qty: decimal(qty).expect("qty"),
            price: decimal("1.08420").expect("price"),
        })
    }

    #[test]
    fn the_canonical_form_ignores_trailing_zeros_only() {
        assert_eq!(order("300").canonical(), order("300.00").canonical());
        assert_ne!(order("300").canonical(), order("301").canonical());
        let text = order("300").canonical();
        assert!(text.contains(r#""command":"order""#), "{text}");
        assert!(text.contains(r#""qty":"300""#), "{text}");
    }

    #[test]
    fn events_are_the_wire_format_and_decode() {
        let payload = envelope(
            "fill-ab12cd34-7-1",
            FILL_EXECUTED,
            1,
            7,
            1,
            "2026-11-29T10:15:00.123Z",
            FillData {
                symbol: "EURUSD",
                side: Some("buy"),
                qty: "300".to_owned(),
                price: "1.08420".to_owned(),
                fee: "0.07".to_owned(),
            },
        )
        .expect("valid");
        assert_eq!(
            payload,
            r#"{"event_id":"fill-ab12cd34-7-1","type":"fill_executed","account_id":7,"seq":1,"occurred_at":"2026-11-29T10:15:00.123Z","data":{"symbol":"EURUSD","side":"buy","qty":"300","price":"1.08420","fee":"0.07"}}"#
        );
        let poison = envelope(
            "fill-x-7-1",
            FILL_EXECUTED,
            1,
            7,
            1,
            "2026-11-29T10:15:00.123Z",
            FillData {
                symbol: "EURUSD",
                side: Some("buy"),
                qty: "-1".to_owned(),
                price: "1".to_owned(),
                fee: "0".to_owned(),
            },
        );
        assert!(
            matches!(poison, Err(WriteSideError::InvalidRequest(ref m)) if m.contains("data.qty")),
            "{poison:?}"
        );
    }

    #[test]
    fn a_version_2_fill_signs_its_quantity_and_drops_the_side() {
        let payload = envelope(
            "fill-ab12cd34-7-2",
            FILL_EXECUTED,
            2,
            7,
            2,
            "2026-11-29T10:15:00.123Z",
            FillData {
                symbol: "EURUSD",
                side: None,
                qty: "-300.50".to_owned(),
                price: "1.08420".to_owned(),
                fee: "0.07".to_owned(),
            },
        )
        .expect("valid");
        assert_eq!(
            payload,
            r#"{"event_id":"fill-ab12cd34-7-2","type":"fill_executed","type_version":2,"account_id":7,"seq":2,"occurred_at":"2026-11-29T10:15:00.123Z","data":{"symbol":"EURUSD","qty":"-300.50","price":"1.08420","fee":"0.07"}}"#
        );
    }

    #[test]
    fn a_bust_repeats_its_fill_at_the_producers_version_whatever_the_fill_was_written_at() {
        let traded = |side: Option<&str>, qty: &str| Traded {
            symbol: "X".to_owned(),
            side: side.map(str::to_owned),
            qty: qty.to_owned(),
            price: "1.5".to_owned(),
        };
        let sold_v1 = traded(Some("sell"), "10.50");
        let sold_v2 = traded(None, "-10.50");
        for original in [&sold_v1, &sold_v2] {
            assert_eq!(original.clone().at_version(1), Ok(sold_v1.clone()));
            assert_eq!(original.clone().at_version(2), Ok(sold_v2.clone()));
        }
        let bought_v1 = traded(Some("buy"), "3");
        assert_eq!(bought_v1.clone().at_version(2), Ok(traded(None, "3")));
        assert_eq!(traded(None, "3").at_version(1), Ok(bought_v1));
        assert!(traded(Some("sell"), "-3").at_version(2).is_err());
    }

    #[test]
    fn bad_requests_are_refused_before_any_write() {
        assert!(order("0").validate().is_err());
        assert!(order("0.01").validate().is_ok());
        let cash = |amount: &str, reason: &str| Command::Cash {
            amount: decimal(amount).expect("amount"),
            reason: reason.to_owned(),
        };
        assert!(cash("0", "x").validate().is_err());
        assert!(cash("-5.00", "").validate().is_err());
        assert!(cash("-5.00", "withdrawal").validate().is_ok());
        let err = order("0").validate().expect_err("zero");
        assert!(err.is_refusal());
    }

    #[test]
    fn fees_are_two_basis_points_in_cents() {
        assert_eq!(
            fee(decimal("300").expect("q"), decimal("1.08420").expect("p")),
            decimal("0.07").expect("f")
        );
        // 2500 * 1 * 0.0002 = 0.5 exactly; 25 * 1 * 0.0002 = 0.005 rounds away from zero.
        assert_eq!(
            fee(decimal("25").expect("q"), Decimal::ONE),
            decimal("0.01").expect("f")
        );
    }

    #[test]
    fn ids_and_times_are_stable_text() {
        assert_eq!(
            event_id(FILL_BUSTED, "ab12cd34", 42, 17),
            "bust-ab12cd34-42-17"
        );
        let at = DateTime::parse_from_rfc3339("2026-11-29T10:15:00.123456Z")
            .expect("time")
            .with_timezone(&Utc);
        assert_eq!(wire_time(at), "2026-11-29T10:15:00.123Z");
    }
}
