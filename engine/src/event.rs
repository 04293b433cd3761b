//! The wire format: decoding one Kafka message into an [`Event`], or saying exactly why not.
//!
//! A message that is not valid UTF-8 or JSON, lacks a required field, or has a field of the
//! wrong type is *poison*. Decoding never panics; the caller dead-letters poison with its raw
//! bytes in the same transaction that moves the offset past it.
//!
//! Money and quantities are decimal strings (`"1.08420"`) or JSON numbers read from their
//! text (`1.1` is exactly 1.1): nothing here goes through `f64`.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Event type of a fill.
pub const FILL_EXECUTED: &str = "fill_executed";
/// Event type of a bust: reverses the fill named by `data.fill_event_id`.
pub const FILL_BUSTED: &str = "fill_busted";
/// Event type of a cash movement.
pub const CASH_ADJUSTED: &str = "cash_adjusted";

/// One message as it came off the broker (or a test's hand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message's offset in its partition.
    pub offset: i64,
    /// The message key: the account id as a decimal UTF-8 string, when the producer set one.
    pub key: Option<Vec<u8>>,
    /// The raw value, kept byte for byte for the dead-letter and parked tables.
    pub payload: Vec<u8>,
}

impl Message {
    /// A message with the given offset, key and payload.
    pub fn new(offset: i64, key: Option<Vec<u8>>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            offset,
            key,
            payload: payload.into(),
        }
    }
}

/// A decoded event envelope. `data` stays raw JSON text: views read it in SQL
/// (`(data->>'qty')::numeric`, exact), and the engine has already checked its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Unique per logical event, identical on every redelivery or republish.
    pub event_id: String,
    /// The event type, e.g. `fill_executed`.
    pub event_type: String,
    /// The ordering key.
    pub account_id: i64,
    /// Per-account sequence assigned by the write side: 1, 2, 3, ... with no gaps.
    pub seq: i64,
    /// When the event happened on the write side.
    pub occurred_at: DateTime<Utc>,
    /// The `data` object as JSON text.
    pub data: String,
}

/// Why a message is poison. The message text is stored in the dead-letter table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The payload is not UTF-8.
    #[error("payload is not valid UTF-8: {0}")]
    Utf8(String),
    /// The payload is not JSON, or a field is missing or of the wrong type.
    #[error("invalid envelope: {0}")]
    Envelope(String),
    /// A field is present with the right JSON type but a value the engine cannot accept.
    #[error("invalid field `{field}`: {reason}")]
    Field {
        /// Dotted path of the field, e.g. `data.qty`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

fn field(field: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError::Field {
        field,
        reason: reason.into(),
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    event_id: String,
    #[serde(rename = "type")]
    event_type: String,
    account_id: i64,
    seq: i64,
    #[serde(borrow)]
    occurred_at: &'a RawValue,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// Decodes and validates one message. Built-in event types have their `data` checked too;
/// other types are passed on as long as the envelope is sound.
pub fn decode(message: &Message) -> Result<Event, DecodeError> {
    let text =
        std::str::from_utf8(&message.payload).map_err(|e| DecodeError::Utf8(e.to_string()))?;
    let env: Envelope<'_> =
        serde_json::from_str(text).map_err(|e| DecodeError::Envelope(e.to_string()))?;

    if env.event_id.is_empty() {
        return Err(field("event_id", "must not be empty"));
    }
    if env.event_type.is_empty() {
        return Err(field("type", "must not be empty"));
    }
    if env.seq < 1 {
        return Err(field("seq", format!("must be 1 or more, got {}", env.seq)));
    }
    if let Some(key) = &message.key {
        let matches = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.parse::<i64>().ok())
            .is_some_and(|k| k == env.account_id);
        if !matches {
            return Err(field(
                "account_id",
                format!(
                    "{} does not match the message key {:?}; the key decides the partition and so the order",
                    env.account_id,
                    String::from_utf8_lossy(key)
                ),
            ));
        }
    }
    let occurred_at: String = serde_json::from_str(env.occurred_at.get())
        .map_err(|_| field("occurred_at", "must be an RFC 3339 string"))?;
    let occurred_at = DateTime::parse_from_rfc3339(&occurred_at)
        .map_err(|e| {
            field(
                "occurred_at",
                format!("{occurred_at:?} is not RFC 3339: {e}"),
            )
        })?
        .with_timezone(&Utc);

    let data = env.data.get();
    if !data.starts_with('{') {
        return Err(field("data", "must be a JSON object"));
    }
    validate_builtin(&env.event_type, data)?;

    Ok(Event {
        event_id: env.event_id,
        event_type: env.event_type,
        account_id: env.account_id,
        seq: env.seq,
        occurred_at,
        data: data.to_owned(),
    })
}

/// The message key for a payload: its `account_id` in decimal, so that all events of an
/// account share a partition. `None` when the payload has no integer `account_id`; such a
/// message is poison anyway and is dead-lettered by every view.
pub fn account_key(payload: &[u8]) -> Option<Vec<u8>> {
    #[derive(Deserialize)]
    struct KeyOnly {
        account_id: i64,
    }
    let k: KeyOnly = serde_json::from_slice(payload).ok()?;
    Some(k.account_id.to_string().into_bytes())
}

#[derive(Deserialize)]
struct FillData<'a> {
    symbol: String,
    side: String,
    #[serde(borrow)]
    qty: &'a RawValue,
    #[serde(borrow)]
    price: &'a RawValue,
    #[serde(borrow, default)]
    fee: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct BustData<'a> {
    fill_event_id: String,
    symbol: String,
    side: String,
    #[serde(borrow)]
    qty: &'a RawValue,
    #[serde(borrow)]
    price: &'a RawValue,
}

#[derive(Deserialize)]
struct CashData<'a> {
    #[serde(borrow)]
    amount: &'a RawValue,
    reason: String,
}

fn validate_builtin(event_type: &str, data: &str) -> Result<(), DecodeError> {
    let bad = |e: serde_json::Error| DecodeError::Envelope(format!("data: {e}"));
    match event_type {
        FILL_EXECUTED => {
            let d: FillData<'_> = serde_json::from_str(data).map_err(bad)?;
            check_trade(&d.symbol, &d.side, d.qty, d.price)?;
            if let Some(fee) = d.fee {
                if exact_decimal("data.fee", fee)? < Decimal::ZERO {
                    return Err(field("data.fee", "must not be negative"));
                }
            }
        }
        FILL_BUSTED => {
            let d: BustData<'_> = serde_json::from_str(data).map_err(bad)?;
            if d.fill_event_id.is_empty() {
                return Err(field("data.fill_event_id", "must not be empty"));
            }
            check_trade(&d.symbol, &d.side, d.qty, d.price)?;
        }
        CASH_ADJUSTED => {
            let d: CashData<'_> = serde_json::from_str(data).map_err(bad)?;
            exact_decimal("data.amount", d.amount)?;
            if d.reason.is_empty() {
                return Err(field("data.reason", "must not be empty"));
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_trade(
    symbol: &str,
    side: &str,
    qty: &RawValue,
    price: &RawValue,
) -> Result<(), DecodeError> {
    if symbol.is_empty() {
        return Err(field("data.symbol", "must not be empty"));
    }
    if side != "buy" && side != "sell" {
        return Err(field(
            "data.side",
            format!("must be \"buy\" or \"sell\", got {side:?}"),
        ));
    }
    if exact_decimal("data.qty", qty)? <= Decimal::ZERO {
        return Err(field("data.qty", "must be greater than zero"));
    }
    if exact_decimal("data.price", price)? < Decimal::ZERO {
        return Err(field("data.price", "must not be negative"));
    }
    Ok(())
}

/// Reads a decimal from a JSON string (`"1.08420"`) or a JSON number (`1.1`), from its text.
///
/// Strings must be plain decimals (`-12.50`, no exponent, no separators), so that PostgreSQL's
/// `numeric` input reads the same value the engine checked. Numbers follow JSON's grammar,
/// which `numeric` also reads exactly.
pub fn exact_decimal(name: &'static str, raw: &RawValue) -> Result<Decimal, DecodeError> {
    let text = raw.get();
    if text.starts_with('"') {
        let s: String = serde_json::from_str(text).map_err(|e| field(name, e.to_string()))?;
        if !is_plain_decimal(&s) {
            return Err(field(name, format!("{s:?} is not a decimal number")));
        }
        Decimal::from_str(&s).map_err(|e| field(name, format!("{s:?}: {e}")))
    } else if text.starts_with('-') || text.starts_with(|c: char| c.is_ascii_digit()) {
        let parsed = if text.contains(['e', 'E']) {
            Decimal::from_scientific(text)
        } else {
            Decimal::from_str(text)
        };
        parsed.map_err(|e| field(name, format!("{text}: {e}")))
    } else {
        let kind = match text.as_bytes().first() {
            Some(b'{') => "an object",
            Some(b'[') => "an array",
            Some(b't' | b'f') => "a boolean",
            Some(b'n') => "null",
            _ => "something else",
        };
        Err(field(
            name,
            format!("expected a decimal string or number, found {kind}"),
        ))
    }
}

fn is_plain_decimal(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match digits.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (digits, None),
    };
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(payload: &str) -> Message {
        Message::new(0, Some(b"42".to_vec()), payload)
    }

    const FILL: &str = r#"{"event_id":"fill-7f3a","type":"fill_executed","account_id":42,"seq":17,
        "occurred_at":"2026-11-29T10:15:00.123Z",
        "data":{"symbol":"EURUSD","side":"buy","qty":"300","price":"1.08420","fee":"0.50"}}"#;

    #[test]
    fn decodes_the_design_example() {
        let ev = decode(&msg(FILL)).expect("valid");
        assert_eq!(ev.event_id, "fill-7f3a");
        assert_eq!(ev.account_id, 42);
        assert_eq!(ev.seq, 17);
        assert_eq!(ev.occurred_at.to_rfc3339(), "2026-11-29T10:15:00.123+00:00");
        assert!(ev.data.contains("1.08420"));
    }

    #[test]
    fn json_numbers_are_read_from_their_text() {
        let raw: &RawValue = serde_json::from_str("1.1").expect("json");
        assert_eq!(exact_decimal("x", raw).expect("decimal").to_string(), "1.1");
        let raw: &RawValue =
            serde_json::from_str("0.1000000000000000055511151231257827").expect("json");
        assert_eq!(
            exact_decimal("x", raw).expect("decimal").to_string(),
            "0.1000000000000000055511151231"
        );
        let raw: &RawValue = serde_json::from_str("12e-1").expect("json");
        assert_eq!(exact_decimal("x", raw).expect("decimal").to_string(), "1.2");
    }

    #[test]
    fn poison_is_explained() {
        let cases = [
            (&b"\xff\xfe"[..], "UTF-8"),
            (b"{not json", "invalid envelope"),
            (br#"{"event_id":"a","type":"fill_executed","account_id":42,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "missing field `seq`"),
            (br#"{"event_id":"a","type":"fill_executed","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"symbol":"X","side":"buy","qty":{"v":1},"price":"1"}}"#, "data.qty"),
            (br#"{"event_id":"a","type":"fill_executed","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"symbol":"X","side":"buy","qty":"1_000","price":"1"}}"#, "not a decimal"),
            (br#"{"event_id":"a","type":"x","account_id":43,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "does not match the message key"),
            (br#"{"event_id":"a","type":"x","account_id":42,"seq":0,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "seq"),
            (br#"{"event_id":"a","type":"x","account_id":42,"seq":1,"occurred_at":"yesterday","data":{}}"#, "RFC 3339"),
            (br#"{"event_id":"a","type":"x","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":[]}"#, "JSON object"),
        ];
        for (payload, needle) in cases {
            let err = decode(&Message::new(0, Some(b"42".to_vec()), payload.to_vec()))
                .expect_err("poison");
            assert!(
                err.to_string().contains(needle),
                "{err} should mention {needle}"
            );
        }
    }

    #[test]
    fn unknown_types_need_only_a_sound_envelope() {
        let ev = decode(&msg(
            r#"{"event_id":"a","type":"margin_call","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"anything":[1,2]}}"#,
        ))
        .expect("valid");
        assert_eq!(ev.event_type, "margin_call");
    }
}
