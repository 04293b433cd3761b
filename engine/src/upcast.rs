//! Event evolution: a view reads each event type at one version, and upcasters bring the
//! older versions of the type to it.
//!
//! A write side changes the shape of its events while the topic still holds the old ones, and
//! a rebuild replays a year written by older producers. So an event carries the version of
//! its type's shape (`type_version` in the envelope, 1 when absent), and a view declares the
//! [`Upcaster`]s it reads through (`Projection::upcasters`): each turns one type's `data` from
//! version `n` into version `n + 1`, and they chain. A view reads a type at the newest version
//! its upcasters reach, 1 when it has none.
//!
//! The engine upcasts in one place, where a message is decoded for a view version
//! (`Applier::decode`), after the envelope and before the view's own checks; every path goes
//! through it: the live stream, a rebuild's tail (snapshot or earliest), a dead letter
//! retried, waiting events drained. What is stored keeps the bytes as received (dead letters,
//! waiting events): they are upcast again whenever they are read, by the code that reads them.
//!
//! An event newer than the version a view reads cannot be read by it: there is no way down.
//! The view's policy ([`crate::projection::UnknownVersion`]) parks the account behind it
//! (the default) or dead-letters it.
//!
//! An upcaster sees `data` as [`Data`]: its members, each kept as the JSON text it arrived
//! as. Decimals are read and written exactly (`rust_decimal`, never a float), and every member
//! an upcaster leaves alone reaches the view byte for byte. The shape is deliberately small
//! (a type, a version, a function over members) so that upcasters declared in files can be
//! built into the same thing.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use rust_decimal::Decimal;
use serde::de::{MapAccess, Visitor};
use serde::Deserializer;
use serde_json::value::RawValue;

use crate::event::{exact_decimal, Event};

/// What an upcaster does to one event's `data`.
type Step = dyn Fn(&mut Data) -> Result<(), String> + Send + Sync;

/// Turns `data` of one event type from version `from` into version `from + 1`.
#[derive(Clone)]
pub struct Upcaster {
    event_type: String,
    from: i32,
    step: Arc<Step>,
}

impl fmt::Debug for Upcaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Upcaster({} {} -> {})",
            self.event_type,
            self.from,
            self.from + 1
        )
    }
}

impl Upcaster {
    /// An upcaster of `event_type` from version `from` to `from + 1`. `step` changes the
    /// members it must and returns an error, which makes the event poison for the view, when
    /// the data cannot be read as version `from`.
    pub fn new(
        event_type: &str,
        from: i32,
        step: impl Fn(&mut Data) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            event_type: event_type.to_owned(),
            from,
            step: Arc::new(step),
        }
    }

    /// The event type it reads.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The version it reads.
    pub fn from(&self) -> i32 {
        self.from
    }

    /// The version it writes.
    pub fn to(&self) -> i32 {
        self.from.saturating_add(1)
    }
}

/// Why a set of upcasters cannot be chained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// Versions start at 1.
    #[error("an upcaster of {event_type} from version {from}: versions start at 1")]
    BadVersion {
        /// The type.
        event_type: String,
        /// The version given.
        from: i32,
    },
    /// Two upcasters for one step.
    #[error("two upcasters of {event_type} from version {from}")]
    Duplicate {
        /// The type.
        event_type: String,
        /// The step.
        from: i32,
    },
    /// A step is missing: an event of an earlier version could not be read.
    #[error("no upcaster of {event_type} from version {missing}, but one from version {from}: an event of version {missing} could not be read")]
    Gap {
        /// The type.
        event_type: String,
        /// The missing step.
        missing: i32,
        /// A later step that exists.
        from: i32,
    },
}

/// Why an event could not be upcast.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpcastError {
    /// The event is newer than the version its type is read at.
    #[error("{event_type} version {version} is newer than the version this view reads ({reads})")]
    Unknown {
        /// The type.
        event_type: String,
        /// The event's version.
        version: i32,
        /// The version read.
        reads: i32,
    },
    /// An upcaster refused the data.
    #[error("{event_type} version {from} -> {}: {reason}", from + 1)]
    Step {
        /// The type.
        event_type: String,
        /// The step that refused it.
        from: i32,
        /// Its reason.
        reason: String,
    },
}

/// The upcasters of a view, chained per type: from version 1 without a gap.
#[derive(Debug, Clone, Default)]
pub struct Upcasters {
    /// Per type, the step from version `i + 1` at index `i`.
    by_type: HashMap<String, Vec<Upcaster>>,
}

impl Upcasters {
    /// Chains `upcasters`, given in any order. Refused: a version below 1, two upcasters for
    /// one step, a missing step.
    pub fn new(upcasters: Vec<Upcaster>) -> Result<Self, ChainError> {
        let mut by_version: BTreeMap<&str, BTreeMap<i32, &Upcaster>> = BTreeMap::new();
        for u in &upcasters {
            if u.from < 1 {
                return Err(ChainError::BadVersion {
                    event_type: u.event_type.clone(),
                    from: u.from,
                });
            }
            if by_version
                .entry(&u.event_type)
                .or_default()
                .insert(u.from, u)
                .is_some()
            {
                return Err(ChainError::Duplicate {
                    event_type: u.event_type.clone(),
                    from: u.from,
                });
            }
        }
        let mut by_type = HashMap::new();
        for (event_type, steps) in by_version {
            let mut chain = Vec::with_capacity(steps.len());
            for (expected, (&from, u)) in (1..).zip(&steps) {
                if from != expected {
                    return Err(ChainError::Gap {
                        event_type: event_type.to_owned(),
                        missing: expected,
                        from,
                    });
                }
                chain.push((*u).clone());
            }
            by_type.insert(event_type.to_owned(), chain);
        }
        Ok(Self { by_type })
    }

    /// The version `event_type` is read at: the newest its upcasters reach, 1 without any.
    pub fn reads(&self, event_type: &str) -> i32 {
        self.by_type.get(event_type).map_or(1, |chain| {
            i32::try_from(chain.len()).map_or(i32::MAX, |n| n + 1)
        })
    }

    /// The types read at a version above 1, with that version, sorted.
    pub fn versions(&self) -> Vec<(String, i32)> {
        let mut out: Vec<(String, i32)> = self
            .by_type
            .keys()
            .map(|t| (t.clone(), self.reads(t)))
            .collect();
        out.sort();
        out
    }

    /// Brings `event` to the version its type is read at. An event at that version is left
    /// as it is; a newer one is [`UpcastError::Unknown`]; a step that refuses the data names
    /// itself.
    pub fn upcast(&self, event: &mut Event) -> Result<(), UpcastError> {
        let reads = self.reads(&event.event_type);
        if event.type_version > reads {
            return Err(UpcastError::Unknown {
                event_type: event.event_type.clone(),
                version: event.type_version,
                reads,
            });
        }
        if event.type_version == reads {
            return Ok(());
        }
        let Some(chain) = self.by_type.get(&event.event_type) else {
            return Ok(());
        };
        let step_error = |from: i32, reason: String| UpcastError::Step {
            event_type: event.event_type.clone(),
            from,
            reason,
        };
        let first = event.type_version;
        let mut data = Data::parse(&event.data).map_err(|e| step_error(first, e))?;
        for u in chain.iter().skip(usize::try_from(first - 1).unwrap_or(0)) {
            (u.step)(&mut data).map_err(|e| step_error(u.from, e))?;
        }
        event.data = data.to_json();
        event.type_version = reads;
        Ok(())
    }
}

/// An event's `data` object as its members, in order, each kept as the JSON text it arrived
/// as: what an upcaster reads and changes. A member named twice reads as its last value, as
/// everywhere in the engine; changing or removing it changes or removes every copy.
#[derive(Debug, Clone)]
pub struct Data {
    members: Vec<(String, Box<RawValue>)>,
}

impl Data {
    /// The members of a JSON object.
    pub fn parse(json: &str) -> Result<Self, String> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Vec<(String, Box<RawValue>)>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    out.push((k, v));
                }
                Ok(out)
            }
        }
        let mut de = serde_json::Deserializer::from_str(json);
        let members = de
            .deserialize_map(Members)
            .and_then(|m| de.end().map(|()| m))
            .map_err(|e| format!("data: {e}"))?;
        Ok(Self { members })
    }

    /// The JSON text of member `name`, if present.
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.members
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.get())
    }

    /// Member `name` as text: `None` when absent or null, an error when it is not a string.
    pub fn text(&self, name: &str) -> Result<Option<String>, String> {
        match self.raw(name) {
            None | Some("null") => Ok(None),
            Some(raw) => serde_json::from_str::<String>(raw)
                .map(Some)
                .map_err(|_| format!("data.{name} must be a string")),
        }
    }

    /// Member `name` as an exact decimal (a decimal string or a JSON number read from its
    /// text): `None` when absent or null.
    pub fn decimal(&self, name: &str) -> Result<Option<Decimal>, String> {
        let raw = match self.members.iter().rev().find(|(k, _)| k == name) {
            None => return Ok(None),
            Some((_, raw)) if raw.get() == "null" => return Ok(None),
            Some((_, raw)) => raw,
        };
        // The engine's reading of decimals, names and all; its messages say `data.<name>`.
        exact_decimal("data", raw).map(Some).map_err(|e| {
            e.to_string()
                .replacen("`data`", &format!("`data.{name}`"), 1)
        })
    }

    /// Removes member `name` (every copy); returns whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.members.len();
        self.members.retain(|(k, _)| k != name);
        self.members.len() != before
    }

    /// Sets member `name` to the JSON text `json`, in the place of its last copy (at the end
    /// when absent). Refuses text that is not one JSON value.
    pub fn set_raw(&mut self, name: &str, json: &str) -> Result<(), String> {
        let value =
            RawValue::from_string(json.to_owned()).map_err(|e| format!("data.{name}: {e}"))?;
        self.set(name, value);
        Ok(())
    }

    /// Sets member `name` to a string.
    pub fn set_text(&mut self, name: &str, text: &str) {
        self.set(name, string(text));
    }

    /// Sets member `name` to a decimal string, its scale kept (`-300.50`).
    pub fn set_decimal(&mut self, name: &str, value: Decimal) {
        self.set(name, string(&value.to_string()));
    }

    /// Renames member `from` to `to` (every copy), replacing any member `to`.
    pub fn rename(&mut self, from: &str, to: &str) {
        if from == to || self.raw(from).is_none() {
            return;
        }
        self.members.retain(|(k, _)| k != to);
        for (k, _) in &mut self.members {
            if k == from {
                to.clone_into(k);
            }
        }
    }

    /// The object as JSON text.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k).unwrap_or_default());
            out.push(':');
            out.push_str(v.get());
        }
        out.push('}');
        out
    }

    fn set(&mut self, name: &str, value: Box<RawValue>) {
        match self.members.iter().rposition(|(k, _)| k == name) {
            Some(last) => {
                self.members[last].1 = value;
                let mut i = 0;
                self.members.retain(|(k, _)| {
                    i += 1;
                    k != name || i - 1 == last
                });
            }
            None => self.members.push((name.to_owned(), value)),
        }
    }
}

/// A JSON string as a raw value.
fn string(text: &str) -> Box<RawValue> {
    serde_json::value::to_raw_value(text).expect("a string always serializes as JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn event(event_type: &str, version: i32, data: &str) -> Event {
        Event {
            event_id: "e".to_owned(),
            event_type: event_type.to_owned(),
            type_version: version,
            account_id: 1,
            seq: 1,
            occurred_at: Utc::now(),
            data: data.to_owned(),
        }
    }

    /// `memo`: version 2 renamed `text` to `note`; version 3 added `lang`.
    fn memo_chain() -> Vec<Upcaster> {
        vec![
            Upcaster::new("memo", 2, |d| d.set_raw("lang", "\"en\"")),
            Upcaster::new("memo", 1, |d| {
                d.rename("text", "note");
                Ok(())
            }),
        ]
    }

    #[test]
    fn a_chain_runs_every_step_from_the_event_version_to_the_version_read() {
        let chain = Upcasters::new(memo_chain()).expect("chain");
        assert_eq!(chain.reads("memo"), 3);
        assert_eq!(chain.reads("other"), 1);
        assert_eq!(chain.versions(), [("memo".to_owned(), 3)]);

        let mut v1 = event("memo", 1, r#"{"text":"hi","n":1.10}"#);
        chain.upcast(&mut v1).expect("v1");
        assert_eq!(
            (v1.type_version, v1.data.as_str()),
            (3, r#"{"note":"hi","n":1.10,"lang":"en"}"#)
        );

        let mut v2 = event("memo", 2, r#"{"note":"hi"}"#);
        chain.upcast(&mut v2).expect("v2");
        assert_eq!(v2.data, r#"{"note":"hi","lang":"en"}"#);

        let mut v3 = event("memo", 3, r#"{"note":"as is" , "lang":"tr"}"#);
        chain.upcast(&mut v3).expect("v3");
        assert_eq!(
            v3.data, r#"{"note":"as is" , "lang":"tr"}"#,
            "untouched, byte for byte"
        );

        let mut v4 = event("memo", 4, "{}");
        assert_eq!(
            chain.upcast(&mut v4),
            Err(UpcastError::Unknown {
                event_type: "memo".to_owned(),
                version: 4,
                reads: 3
            })
        );
        let mut other = event("other", 2, "{}");
        assert!(
            chain.upcast(&mut other).is_err(),
            "a type without upcasters is read at version 1"
        );
    }

    #[test]
    fn a_chain_must_start_at_1_without_gaps_or_doubles() {
        let gap = vec![Upcaster::new("memo", 2, |_| Ok(()))];
        assert!(matches!(
            Upcasters::new(gap),
            Err(ChainError::Gap {
                missing: 1,
                from: 2,
                ..
            })
        ));
        let double = vec![
            Upcaster::new("memo", 1, |_| Ok(())),
            Upcaster::new("memo", 1, |_| Ok(())),
        ];
        assert!(matches!(
            Upcasters::new(double),
            Err(ChainError::Duplicate { from: 1, .. })
        ));
        let zero = vec![Upcaster::new("memo", 0, |_| Ok(()))];
        assert!(Upcasters::new(zero).is_err());
        let message = Upcasters::new(vec![
            Upcaster::new("memo", 3, |_| Ok(())),
            Upcaster::new("memo", 1, |_| Ok(())),
        ])
        .expect_err("gap")
        .to_string();
        assert!(
            message.contains("no upcaster of memo from version 2"),
            "{message}"
        );
    }

    #[test]
    fn a_step_that_refuses_the_data_names_the_type_and_the_step() {
        let chain = Upcasters::new(vec![Upcaster::new("memo", 1, |d| {
            d.text("text")?.ok_or("data.text is missing")?;
            Ok(())
        })])
        .expect("chain");
        let mut e = event("memo", 1, r#"{"text":7}"#);
        let err = chain.upcast(&mut e).expect_err("refused").to_string();
        assert_eq!(err, "memo version 1 -> 2: data.text must be a string");
        assert_eq!(e.type_version, 1, "nothing changed");
    }

    #[test]
    fn data_keeps_what_it_does_not_touch_and_reads_decimals_exactly() {
        let mut d =
            Data::parse(r#"{"qty": 1.10, "x": {"a": [1, 2]}, "qty2": "-0.000001", "s": "a\"b"}"#)
                .expect("object");
        assert_eq!(
            d.decimal("qty")
                .expect("qty")
                .map(|q| q.to_string())
                .as_deref(),
            Some("1.10")
        );
        assert_eq!(
            d.decimal("qty2")
                .expect("qty2")
                .map(|q| q.to_string())
                .as_deref(),
            Some("-0.000001")
        );
        assert_eq!(d.text("s").expect("s").as_deref(), Some("a\"b"));
        let q = d.decimal("qty").expect("qty").expect("present");
        d.set_decimal("qty", -q);
        assert!(d.remove("s"));
        assert!(!d.remove("s"));
        assert_eq!(
            d.to_json(),
            r#"{"qty":"-1.10","x":{"a": [1, 2]},"qty2":"-0.000001"}"#
        );
        let err = Data::parse(r#"{"qty":"1e5"}"#)
            .expect("object")
            .decimal("qty")
            .expect_err("not a plain decimal");
        assert!(err.contains("data.qty"), "{err}");
        assert!(Data::parse("[1]").is_err());
        assert!(Data::parse("{} x").is_err());
    }

    #[test]
    fn a_member_named_twice_reads_as_its_last_and_changes_as_one() {
        let mut d = Data::parse(r#"{"a":1,"b":2,"a":3}"#).expect("object");
        assert_eq!(d.raw("a"), Some("3"));
        d.set_text("a", "x");
        assert_eq!(d.to_json(), r#"{"b":2,"a":"x"}"#);
        d.rename("b", "a");
        assert_eq!(d.to_json(), r#"{"a":2}"#);
    }
}
