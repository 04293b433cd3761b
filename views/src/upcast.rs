//! The built-in views' upcasters: `fill_executed` and `fill_busted` from version 1 to 2.
//!
//! Version 1 of a trade says its direction twice over: `data.side` (`"buy"` or `"sell"`) and
//! a positive `data.qty`. Version 2 says it once, in the sign of `data.qty` (positive buys,
//! negative sells), and has no `side`; every other member is as in version 1. A bust repeats
//! its fill's trade in its own version's shape: a version 2 bust carries the fill's signed
//! quantity, whatever version the fill came in, and a version 1 bust its side and quantity.
//!
//! The built-in views read both types at version 2, through [`upcasters`]: each returns them
//! from `Projection::upcasters`, so version 1 reaches them on every path (the stream, a
//! rebuild, a retried dead letter, a drain), and the two versions may be interleaved for one
//! account in any mix. The quantity is negated exactly (`rust_decimal`, its scale kept:
//! `"300.50"` sold is `"-300.50"`); the other members reach the views byte for byte.
//!
//! A view of your own that reads fills at version 2 returns these too; one that returns
//! none reads version 1, and a version 2 fill is an unknown version to it
//! (`docs/wire-format.md`).

use crate::events::{FILL_BUSTED, FILL_EXECUTED};
use projector_engine::upcast::{Data, Upcaster};

/// The upcasters of the built-in event types: `fill_executed` and `fill_busted`, 1 -> 2.
pub fn upcasters() -> Vec<Upcaster> {
    vec![
        Upcaster::new(FILL_EXECUTED, 1, side_into_sign),
        Upcaster::new(FILL_BUSTED, 1, side_into_sign),
    ]
}

/// A trade of version 1 into version 2: the quantity takes the side's sign, the side goes.
fn side_into_sign(data: &mut Data) -> Result<(), String> {
    let qty = data.decimal("qty")?.ok_or("data.qty is missing")?;
    if qty.is_zero() || qty.is_sign_negative() {
        return Err(format!("data.qty must be greater than zero, got {qty}"));
    }
    let signed = match data.text("side")?.as_deref() {
        Some("buy") => qty,
        Some("sell") => -qty,
        Some(other) => {
            return Err(format!(
                "data.side must be \"buy\" or \"sell\", got {:?}",
                projector_engine::event::safe_text(other, 32)
            ))
        }
        None => return Err("data.side is missing".to_owned()),
    };
    data.remove("side");
    data.set_decimal("qty", signed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::decode;
    use projector_engine::upcast::Upcasters;
    use projector_engine::Message;

    fn message(version: Option<i32>, event_type: &str, data: &str) -> Message {
        let version = version.map_or(String::new(), |v| format!(r#""type_version":{v},"#));
        Message::new(
            0,
            None,
            format!(
                r#"{{"event_id":"e","type":"{event_type}",{version}"account_id":1,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{data}}}"#
            ),
        )
    }

    #[test]
    fn version_1_becomes_version_2_with_the_side_in_the_sign() {
        let chain = Upcasters::new(upcasters()).expect("chain");
        assert_eq!(
            (chain.reads(FILL_EXECUTED), chain.reads(FILL_BUSTED)),
            (2, 2)
        );
        assert_eq!(chain.reads("cash_adjusted"), 1);
        for (event_type, data, expected) in [
            (
                FILL_EXECUTED,
                r#"{"symbol":"EURUSD","side":"sell","qty":"300.50","price":"1.08420","fee":"0.50"}"#,
                r#"{"symbol":"EURUSD","qty":"-300.50","price":"1.08420","fee":"0.50"}"#,
            ),
            (
                FILL_EXECUTED,
                r#"{"symbol":"X","side":"buy","qty":12.5,"price":1.1}"#,
                r#"{"symbol":"X","qty":"12.5","price":1.1}"#,
            ),
            (
                FILL_BUSTED,
                r#"{"fill_event_id":"f-1","symbol":"X","side":"sell","qty":"7","price":"2"}"#,
                r#"{"fill_event_id":"f-1","symbol":"X","qty":"-7","price":"2"}"#,
            ),
        ] {
            let mut event = decode(&message(None, event_type, data)).expect("version 1");
            chain.upcast(&mut event).expect(data);
            assert_eq!((event.type_version, event.data.as_str()), (2, expected));
            // What comes out is a sound version 2 event.
            let again = message(Some(2), event_type, &event.data);
            assert_eq!(decode(&again).expect("version 2").data, expected);
        }
        // A version 2 event is left as it came.
        let v2 = r#"{"symbol":"X","qty":"-1.0","price":"1"}"#;
        let mut event = decode(&message(Some(2), FILL_EXECUTED, v2)).expect("version 2");
        chain.upcast(&mut event).expect("as is");
        assert_eq!(event.data, v2);
    }

    #[test]
    fn a_version_1_trade_it_cannot_read_is_refused_with_its_reason() {
        let chain = Upcasters::new(upcasters()).expect("chain");
        for (data, needle) in [
            (
                r#"{"symbol":"X","side":"hold","qty":"1","price":"1"}"#,
                "data.side must be \"buy\" or \"sell\", got \"hold\"",
            ),
            (
                r#"{"symbol":"X","qty":"1","price":"1"}"#,
                "data.side is missing",
            ),
            (
                r#"{"symbol":"X","side":"buy","qty":"-1","price":"1"}"#,
                "greater than zero",
            ),
            (
                r#"{"symbol":"X","side":"buy","price":"1"}"#,
                "data.qty is missing",
            ),
        ] {
            let mut event = projector_engine::decode_envelope(&message(None, FILL_EXECUTED, data))
                .expect("envelope");
            let err = chain.upcast(&mut event).expect_err(data).to_string();
            assert!(
                err.starts_with("fill_executed version 1 -> 2: ") && err.contains(needle),
                "{err}"
            );
        }
    }
}
