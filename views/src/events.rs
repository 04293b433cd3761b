//! The built-in event types, `fill_executed`, `fill_busted` and `cash_adjusted`, and the rules
//! of their `data`: the trading domain the built-in views read. The engine knows no event
//! type; it decodes the envelope, extracts declared fields and checks that any type's data can
//! be stored (`projector_engine::event`). Each built-in view applies these rules to the types
//! it subscribes to ([`check_rules`], through `Projection::check_data`), so a message the
//! rules refuse is poison for it. A producer of these types checks with [`decode`].
//!
//! The shapes and limits are listed, with what a producer gets when it breaks one, in
//! `docs/wire-format.md`.

use std::borrow::Cow;

use projector_engine::event::{
    check_id, check_label, check_storable, check_text, decode_envelope, exact_decimal, present,
    safe_text, DecodeError, Event, Message, MAX_TEXT_BYTES,
};
use rust_decimal::Decimal;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Event type of a fill.
pub const FILL_EXECUTED: &str = "fill_executed";
/// Event type of a bust: reverses the fill named by `data.fill_event_id`.
pub const FILL_BUSTED: &str = "fill_busted";
/// Event type of a cash movement.
pub const CASH_ADJUSTED: &str = "cash_adjusted";

/// The newest version of each built-in event type this build knows the shape of:
/// `fill_executed` and `fill_busted` have versions 1 (`side` and a positive `qty`) and 2 (a
/// signed `qty`, no `side`); `cash_adjusted` has version 1. A type not listed here is a
/// team's own: its shapes are its views' business, and the engine checks only that its data
/// can be stored.
pub const BUILT_IN_VERSIONS: [(&str, i32); 3] =
    [(FILL_EXECUTED, 2), (FILL_BUSTED, 2), (CASH_ADJUSTED, 1)];

/// The longest `data.symbol`, in bytes; view tables key on it.
pub const MAX_SYMBOL_BYTES: usize = 64;

/// Decodes the envelope and checks the `data` of the built-in event types ([`check_data`]):
/// what a producer checks before publishing, so that no built-in view can refuse the message. A built-in type at a
/// version this build does not know the shape of is refused too: the built-in views would
/// park its account ([`BUILT_IN_VERSIONS`]).
pub fn decode(message: &Message) -> Result<Event, DecodeError> {
    let event = decode_envelope(message)?;
    if let Some(&(_, newest)) = BUILT_IN_VERSIONS
        .iter()
        .find(|(t, _)| *t == event.event_type)
    {
        if event.type_version > newest {
            return Err(DecodeError::field(
                "type_version",
                format!(
                    "{} has versions 1 to {newest}; version {} is unknown to this build",
                    event.event_type, event.type_version
                ),
            ));
        }
    }
    check_data(&event)?;
    Ok(event)
}

/// The `data` of an event whose envelope decoded: the built-in types' rules ([`check_rules`]),
/// then what every type's data must pass ([`check_storable`]). What the engine runs for a
/// built-in view, on the event as it came and again once upcast.
pub fn check_data(event: &Event) -> Result<(), DecodeError> {
    check_rules(event)?;
    check_storable(event)
}

/// The rules of the built-in types' `data`, at the event's `type_version` (a version this
/// build does not know the shape of, or a type not built in, has none): what the built-in
/// views return from [`Projection::check_data`](projector_engine::Projection::check_data).
pub fn check_rules(event: &Event) -> Result<(), DecodeError> {
    let bad = |e: serde_json::Error| DecodeError::Envelope(format!("data: {e}"));
    let data = event.data.as_str();
    match (event.event_type.as_str(), event.type_version) {
        (FILL_EXECUTED, 1) => {
            let d: FillData<'_> = serde_json::from_str(data).map_err(bad)?;
            check_trade(&d.symbol, &d.side, d.qty, d.price)?;
            check_fee(d.fee)?;
        }
        (FILL_EXECUTED, 2) => {
            let d: SignedFillData<'_> = serde_json::from_str(data).map_err(bad)?;
            check_signed_trade(event, &d.symbol, d.side, d.qty, d.price)?;
            check_fee(d.fee)?;
        }
        (FILL_BUSTED, 1) => {
            let d: BustData<'_> = serde_json::from_str(data).map_err(bad)?;
            check_id("data.fill_event_id", &d.fill_event_id)?;
            check_trade(&d.symbol, &d.side, d.qty, d.price)?;
        }
        (FILL_BUSTED, 2) => {
            let d: SignedBustData<'_> = serde_json::from_str(data).map_err(bad)?;
            check_id("data.fill_event_id", &d.fill_event_id)?;
            check_signed_trade(event, &d.symbol, d.side, d.qty, d.price)?;
        }
        (CASH_ADJUSTED, 1) => {
            let d: CashData<'_> = serde_json::from_str(data).map_err(bad)?;
            exact_decimal("data.amount", d.amount)?;
            check_text("data.reason", &d.reason, MAX_TEXT_BYTES)?;
        }
        _ => {}
    }
    Ok(())
}

#[derive(Deserialize)]
struct FillData<'a> {
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(borrow)]
    side: Cow<'a, str>,
    #[serde(borrow)]
    qty: &'a RawValue,
    #[serde(borrow)]
    price: &'a RawValue,
    #[serde(borrow, default)]
    fee: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct BustData<'a> {
    #[serde(borrow)]
    fill_event_id: Cow<'a, str>,
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(borrow)]
    side: Cow<'a, str>,
    #[serde(borrow)]
    qty: &'a RawValue,
    #[serde(borrow)]
    price: &'a RawValue,
}

/// `fill_executed` version 2: the side is the sign of `qty`.
#[derive(Deserialize)]
struct SignedFillData<'a> {
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    /// Must be absent; read only to refuse it.
    #[serde(borrow, default, deserialize_with = "present")]
    side: Option<&'a RawValue>,
    #[serde(borrow)]
    qty: &'a RawValue,
    #[serde(borrow)]
    price: &'a RawValue,
    #[serde(borrow, default)]
    fee: Option<&'a RawValue>,
}

/// `fill_busted` version 2: the original fill's signed `qty`.
#[derive(Deserialize)]
struct SignedBustData<'a> {
    #[serde(borrow)]
    fill_event_id: Cow<'a, str>,
    #[serde(borrow)]
    symbol: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "present")]
    side: Option<&'a RawValue>,
    #[serde(borrow)]
    qty: &'a RawValue,
    #[serde(borrow)]
    price: &'a RawValue,
}

#[derive(Deserialize)]
struct CashData<'a> {
    #[serde(borrow)]
    amount: &'a RawValue,
    #[serde(borrow)]
    reason: Cow<'a, str>,
}

fn check_trade(
    symbol: &str,
    side: &str,
    qty: &RawValue,
    price: &RawValue,
) -> Result<(), DecodeError> {
    check_label("data.symbol", symbol, MAX_SYMBOL_BYTES)?;
    if side != "buy" && side != "sell" {
        return Err(DecodeError::field(
            "data.side",
            format!("must be \"buy\" or \"sell\", got {:?}", safe_text(side, 32)),
        ));
    }
    if exact_decimal("data.qty", qty)? <= Decimal::ZERO {
        return Err(DecodeError::field("data.qty", "must be greater than zero"));
    }
    if exact_decimal("data.price", price)? < Decimal::ZERO {
        return Err(DecodeError::field("data.price", "must not be negative"));
    }
    Ok(())
}

/// A fill's optional fee: a decimal, not negative.
fn check_fee(fee: Option<&RawValue>) -> Result<(), DecodeError> {
    if let Some(fee) = fee {
        if exact_decimal("data.fee", fee)? < Decimal::ZERO {
            return Err(DecodeError::field("data.fee", "must not be negative"));
        }
    }
    Ok(())
}

/// A trade of version 2 (`fill_executed`, `fill_busted`): the quantity is signed, positive
/// for a buy and negative for a sell, and there is no `side`. A `side` is refused rather
/// than ignored: a producer that bumps the version but still writes version 1's shape would
/// have its sells read as buys.
fn check_signed_trade(
    event: &Event,
    symbol: &str,
    side: Option<&RawValue>,
    qty: &RawValue,
    price: &RawValue,
) -> Result<(), DecodeError> {
    check_label("data.symbol", symbol, MAX_SYMBOL_BYTES)?;
    if side.is_some() {
        return Err(DecodeError::field(
            "data.side",
            format!(
                "is not part of {} version 2: the sign of `qty` is the side (positive buys, negative sells)",
                event.event_type
            ),
        ));
    }
    if exact_decimal("data.qty", qty)?.is_zero() {
        return Err(DecodeError::field(
            "data.qty",
            "must not be zero: positive buys, negative sells",
        ));
    }
    if exact_decimal("data.price", price)? < Decimal::ZERO {
        return Err(DecodeError::field("data.price", "must not be negative"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

// The decode held to the verdicts of the one before: a frozen corpus.
#[cfg(test)]
mod corpus;
