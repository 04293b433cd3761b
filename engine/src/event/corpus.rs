//! The decode held to a frozen corpus: `decode_corpus.jsonl`, beside this file, holds inputs
//! and the verdict the decode of `9badca3` gave each (before its strings were borrowed, the key
//! compared without `to_string` and the digits read without a `String`). That decode was kept
//! here as an oracle until commit 342e2af ("decode: write a frozen corpus ..."), whose
//! `old_decode_oracle.rs` wrote this file from its random generators (`write_the_corpus`):
//! of 200,000 decimals, 300,000 keys, 200,000 JSON strings and 100,000 messages, a dozen or
//! so of each verdict class (the error message without its digits and quoted text) and an even
//! sample of the rest. The corpus is frozen on purpose, not regenerated: it is what the decode
//! said, and the decode must go on saying it.
//!
//! Its first line counts the lines of each kind: 416 decimals read and 2,528 refused (every
//! refusal: not a decimal, out of range, too many places, the exponent, not a number or a
//! string), 310 keys that match the account id and 1,558 that do not, 949 JSON strings read
//! and 488 refused, and 932 messages: about 100 decoded of each type and 529 poison (the
//! envelope's JSON, the key, `occurred_at`, `data` that cannot be stored).
//!
//! Each line is a JSON object: `kind` (`decimal`, `key`, `json_str` or `message`), its input
//! (`text`; `key` and `account_id`; `key` and `payload`, a key that is not UTF-8 written as
//! `{"bytes": [...]}`), and `verdict`: `{"ok": ...}` or `{"err": "<the error's text>"}` (a
//! key's verdict is whether it matches).

use super::*;
use serde_json::{json, Value};

const CORPUS: &str = include_str!("decode_corpus.jsonl");

fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        _ => v["bytes"]
            .as_array()
            .expect("a key is text or {\"bytes\": [...]}")
            .iter()
            .map(|b| {
                b.as_u64()
                    .and_then(|b| u8::try_from(b).ok())
                    .expect("a byte")
            })
            .collect(),
    }
}

fn text(v: &Value) -> &str {
    v.as_str().expect("a string")
}

fn err(e: impl std::fmt::Display) -> Value {
    json!({ "err": e.to_string() })
}

/// The verdict of one line, as the decode says it today.
fn verdict(line: &Value) -> Value {
    match text(&line["kind"]) {
        "decimal" => {
            let raw: &RawValue = serde_json::from_str(text(&line["text"])).expect("valid JSON");
            match exact_decimal("x", raw) {
                Ok(d) => json!({ "ok": format!("{}e-{}", d.mantissa(), d.scale()) }),
                Err(e) => err(e),
            }
        }
        "key" => {
            let n = line["account_id"].as_i64().expect("an account id");
            Value::Bool(is_canonical_text(&bytes(&line["key"]), n))
        }
        "json_str" => {
            let raw: &RawValue = serde_json::from_str(text(&line["text"])).expect("valid JSON");
            match json_str(raw) {
                Ok(s) => json!({ "ok": s }),
                Err(e) => err(e),
            }
        }
        "message" => {
            let key = (!line["key"].is_null()).then(|| bytes(&line["key"]));
            let m = Message::new(0, key, text(&line["payload"]));
            match decode(&m) {
                Ok(e) => json!({ "ok": {
                    "event_id": e.event_id,
                    "type": e.event_type,
                    "type_version": e.type_version,
                    "account_id": e.account_id,
                    "seq": e.seq,
                    "occurred_at": e.occurred_at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                    "data": e.data,
                }}),
                Err(e) => err(e),
            }
        }
        other => panic!("unknown kind {other:?}"),
    }
}

#[test]
fn the_decode_gives_every_verdict_of_the_frozen_corpus() {
    let mut lines = CORPUS.lines();
    let header: Value = serde_json::from_str(lines.next().expect("a header")).expect("JSON");
    let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
    for (i, line) in lines.enumerate() {
        let line: Value = serde_json::from_str(line).expect("JSON");
        let got = verdict(&line);
        assert_eq!(got, line["verdict"], "line {}: {line}", i + 2);
        let outcome = match (text(&line["kind"]), &got) {
            ("key", Value::Bool(true)) => "matches".to_owned(),
            ("key", _) => "differs".to_owned(),
            ("message", v) if v.get("ok").is_some() => {
                format!("decoded {}", text(&v["ok"]["type"]))
            }
            ("message", _) => "poison".to_owned(),
            ("json_str", v) if v.get("ok").is_some() => "read".to_owned(),
            ("decimal", v) if v.get("ok").is_some() => "accepted".to_owned(),
            _ => "refused".to_owned(),
        };
        *counts
            .entry(format!("{}: {outcome}", text(&line["kind"])))
            .or_default() += 1;
    }
    // The header (and the module's documentation) says what the corpus covers.
    assert_eq!(json!(counts), header["lines"]);
}
