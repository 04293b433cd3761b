//! The quote feed's datagrams: one JSON object per UDP datagram, its kind in `type`.
//!
//! JSON rather than a packed binary layout: a feed other than the built-in simulator
//! (`--quotes ADDR`) can be written in any language in a few lines, a datagram reads as it is
//! in a packet capture, and prices travel as decimal strings, exact, with the scale the feed
//! gave them, so no float comes near a price. What binary would save (a few dozen bytes and a
//! microsecond of parsing per datagram) is nothing at a few hundred datagrams a second. A
//! datagram is at most [`MAX_DATAGRAM_BYTES`], so that it fits one packet on any path and is
//! never fragmented (a lost fragment loses the whole datagram).
//!
//! Feed to gate: `tick`, `heartbeat`, `snapshot`, `pong`. Gate to feed: `subscribe` (at start,
//! and again as the reconnect that asks for a snapshot) and `ping` (for the clock offset).
//! Unknown fields are ignored, so either side can add some.

use std::str::FromStr;

use projector_views::events::MAX_SYMBOL_BYTES;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// The largest datagram either side sends or accepts: the IPv6 minimum MTU (1280) less its
/// headers, so no path fragments it.
pub const MAX_DATAGRAM_BYTES: usize = 1200;

/// The most symbols one `subscribe` names; more go in several datagrams.
pub const MAX_SUBSCRIBE_SYMBOLS: usize = 8;

/// One datagram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Datagram {
    /// A price update; in a delta feed only the prices that changed are present.
    Tick {
        /// The instrument.
        symbol: String,
        /// The provider's increasing number for this symbol.
        seq: i64,
        /// The bid, a decimal string.
        #[serde(default, with = "opt_price", skip_serializing_if = "Option::is_none")]
        bid: Option<Decimal>,
        /// The ask, a decimal string.
        #[serde(default, with = "opt_price", skip_serializing_if = "Option::is_none")]
        ask: Option<Decimal>,
        /// The provider's time stamp, ms since the Unix epoch on its clock.
        source_ms: i64,
    },
    /// The provider is alive; `next_seq` is the sequence of its next tick of the symbol.
    Heartbeat {
        /// The instrument.
        symbol: String,
        /// The next tick's sequence.
        next_seq: i64,
    },
    /// The whole quote; the stream continues at `seq + 1`.
    Snapshot {
        /// The instrument.
        symbol: String,
        /// The sequence the stream continues from.
        seq: i64,
        /// The bid, a decimal string.
        #[serde(with = "price")]
        bid: Decimal,
        /// The ask, a decimal string.
        #[serde(with = "price")]
        ask: Decimal,
        /// The provider's time stamp, ms since the Unix epoch on its clock.
        source_ms: i64,
    },
    /// Gate to feed: (re)start these symbols' streams with a snapshot each; the feed sends to
    /// the address this came from.
    Subscribe {
        /// The instruments.
        symbols: Vec<String>,
    },
    /// Gate to feed: answer with a `pong` carrying the same id.
    Ping {
        /// Matches the answer to the ping.
        id: u64,
    },
    /// Feed to gate: the feed's clock when it answered the ping `id`.
    Pong {
        /// The ping's id.
        id: u64,
        /// ms since the Unix epoch on the feed's clock.
        feed_ms: i64,
    },
}

/// Why a datagram was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Longer than [`MAX_DATAGRAM_BYTES`].
    #[error("a datagram of {0} bytes is over the {MAX_DATAGRAM_BYTES}-byte limit")]
    TooLarge(usize),
    /// Not one of the datagrams above, in JSON.
    #[error("not a quote datagram: {0}")]
    Malformed(String),
    /// The right shape with a value out of range.
    #[error("invalid quote datagram: {0}")]
    Invalid(String),
}

impl Datagram {
    /// The symbol of a market datagram (tick, heartbeat, snapshot).
    pub fn symbol(&self) -> Option<&str> {
        match self {
            Self::Tick { symbol, .. }
            | Self::Heartbeat { symbol, .. }
            | Self::Snapshot { symbol, .. } => Some(symbol),
            _ => None,
        }
    }

    /// The datagram's bytes.
    pub fn encode(&self) -> Vec<u8> {
        // Strings, integers and decimals: serialization cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads and checks one datagram.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        if bytes.len() > MAX_DATAGRAM_BYTES {
            return Err(WireError::TooLarge(bytes.len()));
        }
        let datagram: Self =
            serde_json::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
        datagram.validate()?;
        Ok(datagram)
    }

    fn validate(&self) -> Result<(), WireError> {
        let bad = |m: String| Err(WireError::Invalid(m));
        let symbols: &[String] = match self {
            Self::Tick { symbol, .. }
            | Self::Heartbeat { symbol, .. }
            | Self::Snapshot { symbol, .. } => std::slice::from_ref(symbol),
            Self::Subscribe { symbols } => symbols,
            Self::Ping { .. } | Self::Pong { .. } => &[],
        };
        for s in symbols {
            if s.is_empty() || s.len() > MAX_SYMBOL_BYTES || s.chars().any(char::is_control) {
                return bad(format!(
                    "symbol {s:?} must be 1 to {MAX_SYMBOL_BYTES} bytes without control characters"
                ));
            }
        }
        // A quote's price is what an order fills at: it must be one a fill can carry.
        let prices: [Option<&Decimal>; 2] = match self {
            Self::Tick { bid, ask, .. } => [bid.as_ref(), ask.as_ref()],
            Self::Snapshot { bid, ask, .. } => [Some(bid), Some(ask)],
            _ => [None, None],
        };
        if let Some(p) = prices.into_iter().flatten().find(|p| p.is_sign_negative()) {
            return bad(format!("price {p} is negative"));
        }
        match self {
            Self::Tick { seq, .. } | Self::Snapshot { seq, .. } if *seq < 0 => {
                bad(format!("seq {seq} is negative"))
            }
            Self::Heartbeat { next_seq, .. } if *next_seq < 1 => {
                bad(format!("next_seq {next_seq} is below 1"))
            }
            Self::Tick {
                bid: None,
                ask: None,
                ..
            } => bad("a tick carries a bid, an ask or both".to_owned()),
            Self::Subscribe { symbols } if symbols.len() > MAX_SUBSCRIBE_SYMBOLS => bad(format!(
                "a subscribe names at most {MAX_SUBSCRIBE_SYMBOLS} symbols"
            )),
            _ => Ok(()),
        }
    }
}

/// A price as a JSON string, read exactly (never through a float): `"1.08420"`.
mod price {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(d: &Decimal, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(d)
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
        let text = String::deserialize(d)?;
        Decimal::from_str(&text).map_err(|e| {
            serde::de::Error::custom(format!("price {text:?} is not a decimal string: {e}"))
        })
    }
}

mod opt_price {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        d: &Option<Decimal>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(d),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Decimal>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "price")] Decimal);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|Wrapped(d)| d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(text: &str) -> Decimal {
        text.parse().expect("a decimal")
    }

    #[test]
    fn each_datagram_is_one_json_object_and_reads_back() {
        let tick = Datagram::Tick {
            symbol: "EURUSD".to_owned(),
            seq: 18,
            bid: Some(dec("1.08420")),
            ask: None,
            source_ms: 1_764_410_100_123,
        };
        let bytes = tick.encode();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            r#"{"type":"tick","symbol":"EURUSD","seq":18,"bid":"1.08420","source_ms":1764410100123}"#
        );
        assert_eq!(Datagram::decode(&bytes), Ok(tick));
        for d in [
            Datagram::Heartbeat {
                symbol: "EURUSD".to_owned(),
                next_seq: 19,
            },
            Datagram::Snapshot {
                symbol: "XAUUSD".to_owned(),
                seq: 0,
                bid: dec("2650.12"),
                ask: dec("2650.40"),
                source_ms: 5,
            },
            Datagram::Subscribe {
                symbols: vec!["EURUSD".to_owned(), "GBPUSD".to_owned()],
            },
            Datagram::Ping { id: 7 },
            Datagram::Pong { id: 7, feed_ms: -3 },
        ] {
            assert_eq!(Datagram::decode(&d.encode()), Ok(d.clone()), "{d:?}");
        }
    }

    #[test]
    fn prices_are_decimal_strings_never_numbers() {
        let number = br#"{"type":"tick","symbol":"EURUSD","seq":1,"bid":1.0842,"source_ms":0}"#;
        let e = Datagram::decode(number).expect_err("a JSON number");
        assert!(e.to_string().contains("string"), "{e}");
        let text = br#"{"type":"tick","symbol":"EURUSD","seq":1,"bid":"1.0842x","source_ms":0}"#;
        let e = Datagram::decode(text).expect_err("not a decimal");
        assert!(e.to_string().contains("not a decimal string"), "{e}");
        // The scale is kept: 1.08420 stays five places.
        let Ok(Datagram::Tick { bid: Some(bid), .. }) = Datagram::decode(
            br#"{"type":"tick","symbol":"EURUSD","seq":1,"bid":"1.08420","source_ms":0,"venue":"x"}"#,
        ) else {
            panic!("a tick, unknown fields ignored");
        };
        assert_eq!(bid.to_string(), "1.08420");
    }

    #[test]
    fn out_of_range_datagrams_are_refused_by_what_is_wrong() {
        let cases: [(&[u8], &str); 9] = [
            (
                br#"{"type":"tick","symbol":"E","seq":1,"ask":"-1.5","source_ms":0}"#,
                "price -1.5 is negative",
            ),
            (
                br#"{"type":"snapshot","symbol":"E","seq":1,"bid":"-0.01","ask":"1","source_ms":0}"#,
                "negative",
            ),
            (
                br#"{"type":"tick","symbol":"","seq":1,"bid":"1","source_ms":0}"#,
                "symbol",
            ),
            (
                br#"{"type":"tick","symbol":"E","seq":-1,"bid":"1","source_ms":0}"#,
                "negative",
            ),
            (
                br#"{"type":"tick","symbol":"E","seq":1,"source_ms":0}"#,
                "a bid, an ask",
            ),
            (
                br#"{"type":"heartbeat","symbol":"E","next_seq":0}"#,
                "below 1",
            ),
            (br#"{"type":"trade","symbol":"E"}"#, "not a quote datagram"),
            (b"\xff\xfe", "not a quote datagram"),
            (
                br#"{"type":"snapshot","symbol":"E","seq":1,"bid":"1","source_ms":0}"#,
                "ask",
            ),
        ];
        for (bytes, needle) in cases {
            let e = Datagram::decode(bytes).expect_err(needle).to_string();
            assert!(e.contains(needle), "{e}");
        }
        let big = vec![b' '; MAX_DATAGRAM_BYTES + 1];
        assert_eq!(
            Datagram::decode(&big),
            Err(WireError::TooLarge(MAX_DATAGRAM_BYTES + 1))
        );
        let many = Datagram::Subscribe {
            symbols: (0..=MAX_SUBSCRIBE_SYMBOLS)
                .map(|i| format!("S{i}"))
                .collect(),
        };
        assert!(Datagram::decode(&many.encode()).is_err());
    }

    #[test]
    fn the_largest_datagrams_fit_the_limit() {
        let symbol = "S".repeat(MAX_SYMBOL_BYTES);
        let big = Decimal::MAX;
        let snapshot = Datagram::Snapshot {
            symbol: symbol.clone(),
            seq: i64::MAX,
            bid: big,
            ask: big,
            source_ms: i64::MIN,
        };
        assert!(snapshot.encode().len() <= MAX_DATAGRAM_BYTES);
        let subscribe = Datagram::Subscribe {
            symbols: vec![symbol; MAX_SUBSCRIBE_SYMBOLS],
        };
        assert!(subscribe.encode().len() <= MAX_DATAGRAM_BYTES);
    }
}
