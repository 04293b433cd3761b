//! The wire format: decoding one Kafka message into an [`Event`], or saying exactly why not.
//!
//! A message that is not valid UTF-8 or JSON, lacks a required field, has a field of the
//! wrong type, or holds content PostgreSQL cannot store exactly is *poison*. Decoding never
//! panics; the caller dead-letters poison with its raw bytes in the same transaction that
//! moves the offset past it. Every limit below is decided here, in decoding, so that no
//! message can make a batch fail in the database again and again: a batch that cannot commit
//! stops its partition, and through back-pressure every partition of its view.
//!
//! The engine knows no event type. Decoding has two layers. [`decode_envelope`] checks what
//! every view needs: the envelope. For the types a view subscribes to, the view's own rules
//! for their `data` run ([`crate::Projection::check_data`]; the built-in types' are in
//! `projector_views::events`), then [`check_storable`], which every type's data must pass;
//! so a malformed event of a type a view does not read still advances that view's `seq`.
//! [`decode`] does the envelope and the storable check. This module also holds what rules
//! are written with: [`exact_decimal`], [`check_id`], [`check_label`], [`check_text`],
//! [`DecodeError::field`], and the declared fields' extraction ([`extract_fields`]).
//!
//! Money and quantities are decimal strings (`"1.08420"`) or JSON numbers read from their
//! text (`1.1` is exactly 1.1): nothing here goes through `f64`. The limits are listed, with
//! what a producer gets when it breaks one, in `docs/wire-format.md`.

use chrono::{DateTime, Datelike, Utc};
use rust_decimal::Decimal;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

use crate::field::Field;
pub use crate::field::FieldValue;

/// The largest `type_version` accepted: it is stored as an `int`.
pub const MAX_TYPE_VERSION: i32 = i32::MAX;

/// The largest payload decoded. Kafka's own default limit is about the same; a larger
/// message is dead-lettered whole, raw bytes and all.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// The longest `event_id` (and any id a type's data holds), in bytes. The inbox's primary key
/// holds it next to the consumer name, and a btree entry cannot exceed about 2.7 kB.
pub const MAX_ID_BYTES: usize = 256;
/// The longest event `type`, in bytes.
pub const MAX_TYPE_BYTES: usize = 64;
/// The longest free text (a `data.reason`, say), in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Decimal places a decimal may have: what `rust_decimal` holds exactly. A value with more
/// would be rounded in silence by a decimal type, so it is refused instead.
pub const MAX_DECIMAL_PLACES: u32 = 28;

/// One message as it came off the broker (or a test's hand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message's offset in its partition.
    pub offset: i64,
    /// The message key: the account id as a decimal UTF-8 string, when the producer set one.
    pub key: Option<Vec<u8>>,
    /// The raw value, kept byte for byte for the dead-letter and waiting tables.
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
/// (`(data->>'qty')::numeric`, exact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Unique per logical event, identical on every redelivery or republish.
    pub event_id: String,
    /// The event type, e.g. `fill_executed`.
    pub event_type: String,
    /// The version of the type's shape that `data` has: the envelope's `type_version` (1
    /// when absent) as decoded, and the version a view reads once its upcasters ran
    /// (`crate::upcast`).
    pub type_version: i32,
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
    /// The payload is larger than [`MAX_PAYLOAD_BYTES`].
    #[error("payload is {bytes} bytes; the limit is {MAX_PAYLOAD_BYTES}")]
    TooLarge {
        /// The payload's size.
        bytes: usize,
    },
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

impl DecodeError {
    /// A field with a value the rules refuse: `DecodeError::field("data.qty", "must not be
    /// zero")`.
    pub fn field(field: &'static str, reason: impl Into<String>) -> Self {
        DecodeError::Field {
            field,
            reason: reason.into(),
        }
    }
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
    /// Present or not, told apart from `null`: `null` is not an absent version but a wrong one.
    #[serde(borrow, default, deserialize_with = "present")]
    type_version: Option<&'a RawValue>,
    account_id: i64,
    seq: i64,
    #[serde(borrow)]
    occurred_at: &'a RawValue,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// A member that is present, whatever its value (`null` included): for
/// `#[serde(borrow, default, deserialize_with = "present")]` on an `Option<&RawValue>`, which
/// tells an absent member from one that is `null`.
pub fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// Decodes the envelope and checks that its `data` can be stored ([`check_storable`]): what
/// the engine can say of any event without knowing its type. The rules of an event type's
/// `data` are its views' ([`crate::Projection::check_data`]); `projector_views::events::decode`
/// adds the built-in types'.
pub fn decode(message: &Message) -> Result<Event, DecodeError> {
    let event = decode_envelope(message)?;
    check_storable(&event)?;
    Ok(event)
}

/// The envelope's `type_version`: absent means 1; otherwise a JSON integer from 1 to
/// [`MAX_TYPE_VERSION`], written without a fraction or an exponent. Anything else (`null`,
/// `"2"`, `2.0`, `0`) is poison: a producer that means a version must say one.
fn type_version(raw: Option<&RawValue>) -> Result<i32, DecodeError> {
    let Some(raw) = raw else {
        return Ok(1);
    };
    let text = raw.get();
    let shown = || safe_text(text, 32);
    let integer = text.strip_prefix('-').unwrap_or(text);
    if integer.is_empty() || !integer.bytes().all(|b| b.is_ascii_digit()) {
        return Err(field(
            "type_version",
            format!(
                "must be an integer of 1 or more (absent means 1), got {}",
                shown()
            ),
        ));
    }
    match text.parse::<i64>() {
        Ok(v) if v < 1 => Err(field("type_version", format!("must be 1 or more, got {v}"))),
        Ok(v) if v <= i64::from(MAX_TYPE_VERSION) => Ok(v as i32),
        _ => Err(field(
            "type_version",
            format!("{} is larger than {MAX_TYPE_VERSION}", shown()),
        )),
    }
}

/// Decodes and checks the envelope only: what every view needs, whatever the type.
pub fn decode_envelope(message: &Message) -> Result<Event, DecodeError> {
    if message.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(DecodeError::TooLarge {
            bytes: message.payload.len(),
        });
    }
    let text =
        std::str::from_utf8(&message.payload).map_err(|e| DecodeError::Utf8(e.to_string()))?;
    let env: Envelope<'_> =
        serde_json::from_str(text).map_err(|e| DecodeError::Envelope(e.to_string()))?;

    check_id("event_id", &env.event_id)?;
    check_label("type", &env.event_type, MAX_TYPE_BYTES)?;
    let type_version = type_version(env.type_version)?;
    if env.seq < 1 {
        return Err(field("seq", format!("must be 1 or more, got {}", env.seq)));
    }
    if let Some(key) = &message.key {
        // The key must be the account id's canonical text: "042" or "+42" name the same
        // account but hash to another partition, splitting its events across two writers.
        if !is_canonical_text(key, env.account_id) {
            return Err(field(
                "account_id",
                format!(
                    "{} does not match the message key {:?}; the key decides the partition and so the order",
                    env.account_id,
                    safe_text(&String::from_utf8_lossy(key), 64)
                ),
            ));
        }
    }
    let occurred_at = json_str(env.occurred_at)
        .map_err(|_| field("occurred_at", "must be an RFC 3339 string"))?;
    let occurred_at = DateTime::parse_from_rfc3339(&occurred_at)
        .map_err(|e| {
            field(
                "occurred_at",
                format!("{:?} is not RFC 3339: {e}", safe_text(&occurred_at, 64)),
            )
        })?
        .with_timezone(&Utc);
    // To the microsecond, as PostgreSQL keeps it: the inbox is keyed and partitioned by this
    // time, so the engine must compute the key and the day PostgreSQL will store, not a finer
    // one. Two copies nanoseconds apart are one event to the inbox (and must be one to the
    // engine's own comparisons); a leap second (`23:59:60.5`) is the next day's first second,
    // as PostgreSQL reads it; and a fraction below a microsecond is dropped here, where the
    // driver would round one before 2000 towards 2000 (into the next day at a midnight).
    let occurred_at =
        DateTime::from_timestamp_micros(occurred_at.timestamp_micros()).unwrap_or(occurred_at);
    // PostgreSQL's timestamptz reaches further, but not as far as chrono: years 1 to 9999
    // are what every reader (and every other language's date type) agrees on.
    if !(1..=9999).contains(&occurred_at.year()) {
        return Err(field(
            "occurred_at",
            format!("year {} is outside 1 to 9999", occurred_at.year()),
        ));
    }

    let data = env.data.get();
    if !data.starts_with('{') {
        return Err(field("data", "must be a JSON object"));
    }

    Ok(Event {
        event_id: env.event_id,
        event_type: env.event_type,
        type_version,
        account_id: env.account_id,
        seq: env.seq,
        occurred_at,
        data: data.to_owned(),
    })
}

/// Checks that the `data` of an event whose envelope decoded can be stored as `jsonb`,
/// whatever its type: no NUL character, numbers within range, nesting within serde_json's
/// limit of 128. The fields a type must have are its views' rules
/// ([`crate::Projection::check_data`]), run before this.
pub fn check_storable(event: &Event) -> Result<(), DecodeError> {
    let data = event.data.as_str();
    let mut de = serde_json::Deserializer::from_str(data);
    Storable
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| field("data", format!("cannot be stored as jsonb: {e}")))?;
    numbers_fit_jsonb(data)
}

/// Decimal places a number in `jsonb` may be written with: its numbers are `numeric`, whose
/// display scale stops at 16383.
const MAX_JSONB_DECIMAL_PLACES: i64 = 16_383;
/// The exponent from which PostgreSQL's `numeric` input refuses a number, zero included
/// (`INT_MAX / 2`).
const MAX_JSONB_EXPONENT: i64 = 1_073_741_823;

/// Refuses a number in `json` (text known to be valid JSON) that `f64` holds but `jsonb`
/// does not: written with more than [`MAX_JSONB_DECIMAL_PLACES`] decimal places (`1e-16384`
/// or `0.1e-16383`, which serde_json reads as 0), or with an exponent of
/// [`MAX_JSONB_EXPONENT`] or more (`0e1073741823`). Numbers too large for `jsonb` are too
/// large for `f64` first, and [`Storable`] refuses those.
fn numbers_fit_jsonb(json: &str) -> Result<(), DecodeError> {
    let bytes = json.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // A string: skip to its closing quote; a backslash escapes the next byte.
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                check_jsonb_number(&json[start..i])?;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// One JSON number against `numeric`'s input limits, judged from its text as PostgreSQL
/// does: decimal places are those written minus the exponent.
fn check_jsonb_number(number: &str) -> Result<(), DecodeError> {
    let (mantissa, exponent) = match number.find(['e', 'E']) {
        Some(i) => (&number[..i], &number[i + 1..]),
        None => (number, ""),
    };
    let written = mantissa.split_once('.').map_or(0, |(_, f)| f.len());
    let (negative, digits) = match exponent.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, exponent.strip_prefix('+').unwrap_or(exponent)),
    };
    // Saturating: an exponent of any length is judged without being parsed.
    let magnitude = digits
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0i64, |n, d| {
            n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
        });
    let exponent = if negative { -magnitude } else { magnitude };
    let places = i64::try_from(written)
        .unwrap_or(i64::MAX)
        .saturating_sub(exponent);
    if exponent >= MAX_JSONB_EXPONENT || places > MAX_JSONB_DECIMAL_PLACES {
        return Err(field(
            "data",
            format!(
                "cannot be stored as jsonb: the number {} is beyond PostgreSQL's numeric (at most {MAX_JSONB_DECIMAL_PLACES} decimal places)",
                safe_text(number, 64)
            ),
        ));
    }
    Ok(())
}

/// Reads the declared fields of an event's `data`. A field with the wrong JSON type (a text
/// field holding a number, a decimal that is not exact) is an error: the event is poison for
/// the view that declared it.
pub fn extract_fields(event: &Event, fields: &[Field]) -> Result<Vec<FieldValue>, DecodeError> {
    if fields.iter().all(|f| *f == Field::Data) {
        return Ok(fields.iter().map(|_| FieldValue::Data).collect());
    }
    let names: Vec<&str> = fields.iter().map(|f| f.column()).collect();
    let mut de = serde_json::Deserializer::from_str(&event.data);
    let found = Members { names: &names }
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found))
        .map_err(|e| DecodeError::Envelope(format!("data: {e}")))?;
    fields
        .iter()
        .zip(found)
        .map(|(f, raw)| {
            let raw = raw.filter(|r| r.get() != "null");
            Ok(match *f {
                Field::Data => FieldValue::Data,
                Field::Text(name) => FieldValue::Text(match raw {
                    None => None,
                    Some(r) => {
                        let text: String = serde_json::from_str(r.get())
                            .map_err(|_| field(name, "must be a string"))?;
                        if text.contains('\0') {
                            return Err(field(name, "must not contain the NUL character"));
                        }
                        Some(text)
                    }
                }),
                Field::Decimal(name) => FieldValue::Decimal(match raw {
                    None => None,
                    Some(r) => Some(exact_decimal(name, r)?),
                }),
            })
        })
        .collect()
}

/// The raw value of the top-level member of a JSON object named by each of `names` (`None`:
/// absent), in one pass without building a map of every member: the last of a repeated
/// member wins, as it would in a map.
struct Members<'n> {
    names: &'n [&'n str],
}

impl<'de> DeserializeSeed<'de> for Members<'_> {
    type Value = Vec<Option<&'de RawValue>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Members<'_> {
    type Value = Vec<Option<&'de RawValue>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = vec![None; self.names.len()];
        while let Some(key) = map.next_key_seed(MemberName)? {
            if self.names.contains(&key.as_ref()) {
                let value = map.next_value::<&'de RawValue>()?;
                for (name, slot) in self.names.iter().zip(&mut found) {
                    if *name == key.as_ref() {
                        *slot = Some(value);
                    }
                }
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// A member name, borrowed from the input unless it holds an escape.
struct MemberName;

impl<'de> DeserializeSeed<'de> for MemberName {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MemberName {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v))
    }
}

/// What a poison message's envelope still yields, for the dead-letter row: an operator must
/// see which account a dead letter blocks. Lenient: any field that is missing or of the
/// wrong type is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Salvage {
    /// The `event_id`, when it is one the wire format accepts: then it is the event's id,
    /// which its corrected republish carries too, and another id at the same `seq` is
    /// another event (a conflict). An id the wire format refuses (empty, over-long, control
    /// characters) is `None` like a missing one: a rendering of it would name no event, and
    /// its correction necessarily carries another id.
    pub event_id: Option<String>,
    /// The `account_id`, when it is an integer.
    pub account_id: Option<i64>,
    /// The `seq`, when it is an integer.
    pub seq: Option<i64>,
}

/// Reads what it can of a poison message's envelope.
pub fn salvage(payload: &[u8]) -> Salvage {
    #[derive(Deserialize)]
    struct Loose {
        event_id: Option<serde_json::Value>,
        account_id: Option<serde_json::Value>,
        seq: Option<serde_json::Value>,
    }
    let Ok(loose) = serde_json::from_slice::<Loose>(payload) else {
        return Salvage::default();
    };
    Salvage {
        event_id: loose
            .event_id
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .filter(|s| check_id("event_id", s).is_ok())
            .map(str::to_owned),
        account_id: loose
            .account_id
            .as_ref()
            .and_then(serde_json::Value::as_i64),
        seq: loose.seq.as_ref().and_then(serde_json::Value::as_i64),
    }
}

/// Text that PostgreSQL can always store and a terminal can always show: NUL and other
/// control characters escaped, cut at `max_bytes` (on a character boundary).
pub fn safe_text(s: &str, max_bytes: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_bytes));
    for c in s.chars() {
        let piece = if c.is_control() && c != '\n' && c != '\t' {
            c.escape_unicode().to_string()
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > max_bytes {
            out.push('…');
            break;
        }
        out.push_str(&piece);
    }
    out
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

/// An identifier: 1 to [`MAX_ID_BYTES`] bytes, no control characters.
pub fn check_id(name: &'static str, value: &str) -> Result<(), DecodeError> {
    check_label(name, value, MAX_ID_BYTES)
}

/// A short label (an id, a type, a symbol): not empty, at most `max` bytes, and printable,
/// because operators read it in listings and logs.
pub fn check_label(name: &'static str, value: &str, max: usize) -> Result<(), DecodeError> {
    if value.is_empty() {
        return Err(field(name, "must not be empty"));
    }
    if value.len() > max {
        return Err(field(
            name,
            format!("is {} bytes; the limit is {max}", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(field(name, "must not contain control characters"));
    }
    Ok(())
}

/// Free text: not empty, at most `max` bytes, no NUL (PostgreSQL's text cannot hold it).
pub fn check_text(name: &'static str, value: &str, max: usize) -> Result<(), DecodeError> {
    if value.is_empty() {
        return Err(field(name, "must not be empty"));
    }
    if value.len() > max {
        return Err(field(
            name,
            format!("is {} bytes; the limit is {max}", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(field(name, "must not contain the NUL character"));
    }
    Ok(())
}

/// Reads a decimal from a JSON string (`"1.08420"`) or a JSON number (`1.1`, `12e-1`), from
/// its text, exactly: a value `rust_decimal` cannot hold without rounding (more than
/// [`MAX_DECIMAL_PLACES`] decimal places, or a magnitude of 2^96 or more) is refused, never
/// rounded.
///
/// Strings must be plain decimals (`-12.50`, no exponent, no separators), so that PostgreSQL's
/// `numeric` input reads the same value the engine checked. Numbers follow JSON's grammar,
/// which `numeric` also reads exactly. The scale written is kept: `"1.10"` stays `1.10`.
pub fn exact_decimal(name: &'static str, raw: &RawValue) -> Result<Decimal, DecodeError> {
    let text = raw.get();
    if text.starts_with('"') {
        let s = json_str(raw).map_err(|e| field(name, e.to_string()))?;
        if !is_plain_decimal(&s) {
            return Err(field(
                name,
                format!("{:?} is not a decimal number", safe_text(&s, 64)),
            ));
        }
        exact_from_text(name, &s)
    } else if text.starts_with('-') || text.starts_with(|c: char| c.is_ascii_digit()) {
        exact_from_text(name, text)
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

/// A decimal from text already known to follow JSON's number grammar (a plain decimal is a
/// JSON number without an exponent).
fn exact_from_text(name: &'static str, text: &str) -> Result<Decimal, DecodeError> {
    let shown = || safe_text(text, 64);
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], Some(&unsigned[i + 1..])),
        None => (unsigned, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let exponent: i64 = match exponent {
        None => 0,
        Some(e) => e
            .parse()
            .map_err(|_| field(name, format!("{}: the exponent is out of range", shown())))?,
    };
    // value = digits * 10^-(frac.len() - exponent)
    let scale = i64::try_from(frac.len())
        .unwrap_or(i64::MAX)
        .saturating_sub(exponent);
    if scale > i64::from(MAX_DECIMAL_PLACES) {
        return Err(field(
            name,
            format!(
                "{} has more than {MAX_DECIMAL_PLACES} decimal places",
                shown()
            ),
        ));
    }
    // An integer written with a positive exponent gets its zeros appended, within reason.
    let zeros = usize::try_from(-scale.min(0)).unwrap_or(usize::MAX);
    if zeros > 40 {
        return Err(out_of_range(name, &shown()));
    }
    // The digits, int then frac then the zeros, read into an integer without writing them
    // out: at most 30 significant ones (more is out of range, and 30 fit an i128).
    let mut magnitude: i128 = 0;
    let mut significant = 0usize;
    for d in int
        .bytes()
        .chain(frac.bytes())
        .chain(std::iter::repeat_n(b'0', zeros))
    {
        if !d.is_ascii_digit() {
            return Err(field(name, format!("{} is not a decimal number", shown())));
        }
        if significant == 0 && d == b'0' {
            continue;
        }
        significant += 1;
        if significant > 30 {
            return Err(out_of_range(name, &shown()));
        }
        magnitude = magnitude * 10 + i128::from(d - b'0');
    }
    let value = if negative { -magnitude } else { magnitude };
    let scale = u32::try_from(scale.max(0)).unwrap_or(u32::MAX);
    Decimal::try_from_i128_with_scale(value, scale).map_err(|_| out_of_range(name, &shown()))
}

/// The text of a JSON string, borrowed from the message where it holds no escape (as
/// timestamps and decimals never do), unescaped into a new string where it does.
fn json_str(raw: &RawValue) -> Result<Cow<'_, str>, serde_json::Error> {
    let text = raw.get();
    // `raw` is valid JSON: a string without a backslash is its text between the quotes.
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        if !inner.contains('\\') {
            return Ok(Cow::Borrowed(inner));
        }
    }
    serde_json::from_str::<String>(text).map(Cow::Owned)
}

/// Whether `key` is the canonical decimal text of `n` ("42", "-7"; not "042" or "+42"),
/// compared without writing the text out.
fn is_canonical_text(key: &[u8], n: i64) -> bool {
    let (negative, digits) = match key.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, key),
    };
    if negative != (n < 0) || digits.is_empty() || digits.len() > 19 {
        return false;
    }
    // A leading zero ("01", and "-0": a negative n has a non-zero digit left at the end).
    if digits.len() > 1 && digits[0] == b'0' {
        return false;
    }
    let mut magnitude = n.unsigned_abs();
    for &d in digits.iter().rev() {
        if !d.is_ascii_digit() || u64::from(d - b'0') != magnitude % 10 {
            return false;
        }
        magnitude /= 10;
    }
    magnitude == 0
}

fn out_of_range(name: &'static str, shown: &str) -> DecodeError {
    field(
        name,
        format!("{shown} is out of range: a decimal holds at most 28 to 29 significant digits (below 2^96)"),
    )
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

/// Walks a JSON value without building it and refuses what `jsonb` cannot store: the NUL
/// character in a string or key (PostgreSQL's text cannot hold it) and numbers beyond `f64`'s
/// range (serde_json refuses those itself, before `jsonb` could fail on them).
struct Storable;

impl<'de> DeserializeSeed<'de> for Storable {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Storable {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        if s.contains('\0') {
            return Err(E::custom("a string holds the NUL character (\\u0000)"));
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Storable)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Storable)?.is_some() {
            map.next_value_seed(Storable)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn declared_fields_are_read_as_a_map_would_read_them() {
        use crate::field::Field;
        let fields = [
            Field::Text("symbol"),
            Field::Decimal("qty"),
            Field::Text("note"),
            Field::Data,
        ];
        let event = |data: &str| Event {
            event_id: "e".to_owned(),
            event_type: "custom".to_owned(),
            type_version: 1,
            account_id: 1,
            seq: 1,
            occurred_at: Utc::now(),
            data: data.to_owned(),
        };
        let text = |s: &str| FieldValue::Text(Some(s.to_owned()));
        let cases: [(&str, Vec<FieldValue>); 5] = [
            (
                r#"{"qty": "1.50", "x": {"symbol": "no"}, "symbol": "EURUSD"}"#,
                vec![
                    text("EURUSD"),
                    FieldValue::Decimal(Some(Decimal::new(150, 2))),
                    FieldValue::Text(None),
                    FieldValue::Data,
                ],
            ),
            // A repeated name: the last wins, as in a map.
            (
                r#"{"symbol": "A", "symbol": "B", "note": null}"#,
                vec![
                    text("B"),
                    FieldValue::Decimal(None),
                    FieldValue::Text(None),
                    FieldValue::Data,
                ],
            ),
            // An escaped name is the name it spells.
            (
                r#"{"sym\u0062ol": "C", "note": "n\"q"}"#,
                vec![
                    text("C"),
                    FieldValue::Decimal(None),
                    text("n\"q"),
                    FieldValue::Data,
                ],
            ),
            (
                r#"{}"#,
                vec![
                    FieldValue::Text(None),
                    FieldValue::Decimal(None),
                    FieldValue::Text(None),
                    FieldValue::Data,
                ],
            ),
            (
                r#"{"a": [1, {"b": 2}], "qty": 3}"#,
                vec![
                    FieldValue::Text(None),
                    FieldValue::Decimal(Some(Decimal::new(3, 0))),
                    FieldValue::Text(None),
                    FieldValue::Data,
                ],
            ),
        ];
        for (data, expected) in cases {
            assert_eq!(
                extract_fields(&event(data), &fields).expect(data),
                expected,
                "{data}"
            );
        }
        for bad in [
            r#"{"symbol": 1}"#,
            r#"{"qty": "x"}"#,
            r#"[1]"#,
            r#"{"a": 1} x"#,
        ] {
            assert!(extract_fields(&event(bad), &fields).is_err(), "{bad}");
        }
    }

    use super::*;

    // The built-in types' names: to the engine, types like any other.
    const FILL_EXECUTED: &str = "fill_executed";
    const CASH_ADJUSTED: &str = "cash_adjusted";

    fn msg(payload: &str) -> Message {
        Message::new(0, Some(b"42".to_vec()), payload)
    }

    fn dec(text: &str) -> Result<Decimal, DecodeError> {
        let raw: &RawValue = serde_json::from_str(text).expect("json");
        exact_decimal("x", raw)
    }

    const FILL: &str = r#"{"event_id":"fill-7f3a","type":"fill_executed","account_id":42,"seq":17,
        "occurred_at":"2026-11-29T10:15:00.123Z",
        "data":{"symbol":"EURUSD","side":"buy","qty":"300","price":"1.08420","fee":"0.50"}}"#;

    fn envelope(event_id: &str, event_type: &str, data: &str) -> String {
        serde_json::json!({
            "event_id": event_id, "type": event_type, "account_id": 42, "seq": 1,
            "occurred_at": "2026-11-29T10:15:00Z",
        })
        .to_string()
        .replacen('}', &format!(",\"data\":{data}}}"), 1)
    }

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
        assert_eq!(dec("1.1").expect("decimal").to_string(), "1.1");
        assert_eq!(dec("12e-1").expect("decimal").to_string(), "1.2");
        assert_eq!(dec("1.5E2").expect("decimal").to_string(), "150");
        assert_eq!(dec("\"1.10\"").expect("decimal").to_string(), "1.10");
        assert_eq!(dec("-0.0001").expect("decimal").to_string(), "-0.0001");
        assert_eq!(
            dec("\"79228162514264337593543950335\"")
                .expect("the largest decimal")
                .to_string(),
            "79228162514264337593543950335"
        );
    }

    #[test]
    fn decimals_that_would_be_rounded_are_refused() {
        for (text, needle) in [
            // 34 places: a decimal type would round it to 28 in silence.
            (
                "0.1000000000000000055511151231257827",
                "more than 28 decimal places",
            ),
            (
                "\"0.00000000000000000000000000001\"",
                "more than 28 decimal places",
            ),
            ("1e-29", "more than 28 decimal places"),
            ("\"79228162514264337593543950336\"", "out of range"),
            ("1e29", "out of range"),
            ("1e400", "out of range"),
            ("1e99999999999999999999", "exponent"),
            // The exponent's extremes: the places are computed without overflow.
            ("1e-9223372036854775808", "more than 28 decimal places"),
            ("1e9223372036854775807", "out of range"),
        ] {
            let err = dec(text).expect_err(text);
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn poison_is_explained() {
        let cases = [
            (&b"\xff\xfe"[..], "UTF-8"),
            (b"{not json", "invalid envelope"),
            (br#"{"event_id":"a","type":"fill_executed","account_id":42,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "missing field `seq`"),
            (br#"{"event_id":"a","type":"x","account_id":43,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "does not match the message key"),
            (br#"{"event_id":"a","type":"x","account_id":42,"seq":0,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "seq"),
            (br#"{"event_id":"a","type":"x","account_id":42,"seq":1,"occurred_at":"yesterday","data":{}}"#, "RFC 3339"),
            (br#"{"event_id":"a","type":"x","account_id":42,"seq":1,"occurred_at":"0000-01-01T00:00:00Z","data":{}}"#, "outside 1 to 9999"),
            (br#"{"event_id":"a","type":"x","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":[]}"#, "JSON object"),
            (br#"{"event_id":"a\u0000b","type":"x","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "control characters"),
            (br#"{"event_id":"","type":"x","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#, "must not be empty"),
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
    fn a_key_must_be_the_account_id_in_its_canonical_text() {
        let payload = r#"{"event_id":"a","type":"x","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#;
        for key in ["042", "+42", " 42"] {
            let m = Message::new(0, Some(key.as_bytes().to_vec()), payload);
            let err = decode(&m).expect_err(key);
            assert!(
                err.to_string().contains("does not match the message key"),
                "{err}"
            );
        }
        assert!(decode(&Message::new(0, Some(b"42".to_vec()), payload)).is_ok());
        assert!(decode(&Message::new(0, None, payload)).is_ok());
    }

    #[test]
    fn the_key_is_compared_as_the_canonical_text_would_be() {
        let numbers = [
            0,
            1,
            -1,
            7,
            10,
            -10,
            42,
            100,
            9,
            99,
            1_000_000_007,
            i64::MAX,
            i64::MIN,
        ];
        let keys = [
            "",
            "-",
            "0",
            "-0",
            "00",
            "01",
            "+1",
            "1",
            "-1",
            "7",
            "10",
            "-10",
            "010",
            "42",
            "42 ",
            "4a",
            "100",
            "1e2",
            "9",
            "99",
            "1000000007",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "19223372036854775807",
        ];
        for n in numbers {
            for key in keys {
                assert_eq!(
                    is_canonical_text(key.as_bytes(), n),
                    key == n.to_string(),
                    "{key:?} against {n}"
                );
            }
            assert!(is_canonical_text(n.to_string().as_bytes(), n), "{n}");
        }
    }

    #[test]
    fn escaped_strings_read_as_their_text() {
        let payload = r#"{"event_id":"a","type":"fill_executed","account_id":1,"seq":1,"occurred_at":"2026-11-29T10:15:00\u005a","data":{"symbol":"\u0041BC","side":"b\u0075y","qty":"\u0031.5","price":"2"}}"#;
        let event = decode(&Message::new(0, None, payload)).expect("escapes are text");
        assert_eq!(event.occurred_at.to_rfc3339(), "2026-11-29T10:15:00+00:00");
        let fields = [
            crate::field::Field::Text("symbol"),
            crate::field::Field::Decimal("qty"),
        ];
        assert_eq!(
            extract_fields(&event, &fields).expect("fields"),
            [
                FieldValue::Text(Some("ABC".to_owned())),
                FieldValue::Decimal(Some(Decimal::new(15, 1)))
            ]
        );
    }

    #[test]
    fn content_postgresql_cannot_store_is_poison() {
        let long_id = "e".repeat(MAX_ID_BYTES + 1);
        let cases = [
            (envelope(&long_id, "x", "{}"), "`event_id`: is 257 bytes"),
            (envelope("a", &"t".repeat(65), "{}"), "`type`: is 65 bytes"),
            (
                envelope(
                    "a",
                    FILL_EXECUTED,
                    r#"{"symbol":"X","side":"buy","qty":"1","price":"1","note":"a\u0000b"}"#,
                ),
                "NUL",
            ),
            (
                envelope("a", CASH_ADJUSTED, r#"{"amount":"1","reason":"a\u0000"}"#),
                "NUL",
            ),
            (envelope("a", "custom", r#"{"k\u0000":1}"#), "NUL"),
            (envelope("a", "custom", r#"{"big":1e400}"#), "jsonb"),
            // serde_json reads these as 0; jsonb's numeric refuses them.
            (envelope("a", "custom", r#"{"tiny":1e-16384}"#), "jsonb"),
            (
                envelope("a", "custom", r#"{"n":[1,{"t":0.1e-16383}]}"#),
                "jsonb",
            ),
            (envelope("a", "custom", r#"{"zero":0E1073741823}"#), "jsonb"),
            (
                envelope("a", "custom", r#"{"z":1e-99999999999999999999}"#),
                "jsonb",
            ),
            (
                envelope(
                    "a",
                    FILL_EXECUTED,
                    r#"{"symbol":"X","side":"buy","qty":"1","price":"1","note":1e-16384}"#,
                ),
                "jsonb",
            ),
            (
                envelope(
                    "a",
                    "custom",
                    &format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200)),
                ),
                "jsonb",
            ),
        ];
        for (payload, needle) in cases {
            let err = decode(&msg(&payload)).expect_err(&payload[..payload.len().min(120)]);
            assert!(
                err.to_string().contains(needle),
                "{err} should mention {needle}"
            );
        }
        let huge = Message::new(0, None, vec![b' '; MAX_PAYLOAD_BYTES + 1]);
        assert!(matches!(decode(&huge), Err(DecodeError::TooLarge { .. })));
    }

    #[test]
    fn numbers_at_the_edge_of_jsonb_are_stored() {
        // Exactly 16383 places, a zero with a large exponent, and numbers inside strings
        // (not numbers at all) are what PostgreSQL accepts.
        let ev = decode(&msg(&envelope(
            "a",
            "custom",
            r#"{"a":1e-16383,"b":0.5e-16382,"c":0e1073741822,"d":"1e-99999","e\"1e-99999":-12.5E+3}"#,
        )))
        .expect("storable");
        assert!(ev.data.contains("1e-16383"));
    }

    #[test]
    fn unknown_types_need_only_a_sound_envelope_and_storable_data() {
        let ev = decode(&msg(
            r#"{"event_id":"a","type":"margin_call","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"anything":[1,2.5,"x",null,true,{"deep":{}}]}}"#,
        ))
        .expect("valid");
        assert_eq!(ev.event_type, "margin_call");
        assert_eq!(ev.data, r#"{"anything":[1,2.5,"x",null,true,{"deep":{}}]}"#);
    }

    fn versioned(version: &str, event_type: &str, data: &str) -> String {
        format!(
            r#"{{"event_id":"a","type":"{event_type}","type_version":{version},"account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{data}}}"#
        )
    }

    #[test]
    fn type_version_is_an_integer_of_1_or_more_and_absent_means_1() {
        let ev = decode_envelope(&msg(&envelope("a", "memo", "{}"))).expect("absent");
        assert_eq!(ev.type_version, 1);
        for (text, version) in [("1", 1), ("2", 2), ("17", 17), ("2147483647", i32::MAX)] {
            let ev = decode_envelope(&msg(&versioned(text, "memo", "{}"))).expect(text);
            assert_eq!(ev.type_version, version, "{text}");
        }
        for (text, needle) in [
            (
                "null",
                "must be an integer of 1 or more (absent means 1), got null",
            ),
            (
                "\"2\"",
                "must be an integer of 1 or more (absent means 1), got \"2\"",
            ),
            ("2.0", "got 2.0"),
            ("1e1", "got 1e1"),
            ("true", "got true"),
            ("[2]", "got [2]"),
            ("0", "must be 1 or more, got 0"),
            ("-3", "must be 1 or more, got -3"),
            ("2147483648", "2147483648 is larger than 2147483647"),
            ("99999999999999999999", "is larger than"),
        ] {
            let err = decode_envelope(&msg(&versioned(text, "memo", "{}")))
                .expect_err(text)
                .to_string();
            assert!(
                err.starts_with("invalid field `type_version`: ") && err.contains(needle),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn salvage_reads_what_it_can() {
        let s = salvage(br#"{"event_id":"x-1","account_id":7,"seq":"nine"}"#);
        assert_eq!(s.event_id.as_deref(), Some("x-1"));
        assert_eq!(s.account_id, Some(7));
        assert_eq!(s.seq, None);
        assert_eq!(salvage(b"\xff"), Salvage::default());
    }

    #[test]
    fn salvage_keeps_no_id_the_wire_format_refuses() {
        let long = format!(
            r#"{{"event_id":"{}","seq":3}}"#,
            "e".repeat(MAX_ID_BYTES + 1)
        );
        for payload in [
            br#"{"event_id":"x\u0000y","seq":3}"#.to_vec(),
            br#"{"event_id":"","seq":3}"#.to_vec(),
            br#"{"event_id":17,"seq":3}"#.to_vec(),
            long.into_bytes(),
        ] {
            let s = salvage(&payload);
            assert_eq!((s.event_id, s.seq), (None, Some(3)));
        }
    }

    #[test]
    fn safe_text_escapes_and_cuts() {
        assert_eq!(safe_text("a\0b", 100), "a\\u{0}b");
        assert_eq!(safe_text("line\nnext", 100), "line\nnext");
        let cut = safe_text(&"é".repeat(10), 5);
        assert!(cut.len() <= 5 + '…'.len_utf8(), "{cut}");
        assert!(cut.ends_with('…'));
    }
}

// The decode held to the verdicts of the one before: a frozen corpus.
#[cfg(test)]
mod corpus;
