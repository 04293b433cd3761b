//! [`decode`](super::decode) held to a frozen corpus: `decode_corpus.jsonl`, beside this
//! file, holds messages and the verdict the decode of `9badca3` gave each, the built-in types'
//! rules included (the envelope, decimals and keys have the engine's own corpus,
//! `projector_engine`'s `event/decode_corpus.jsonl`). That decode was kept here as an oracle
//! until commit 342e2af ("decode: write a frozen corpus ..."), whose `old_decode_oracle.rs`
//! wrote this file from its random generator (`write_the_corpus`): of 100,000 messages, up to
//! 8 of each of the 176 verdict classes (decoded per type, or the error message without its
//! digits and quoted text) and every 100th. The corpus is frozen on purpose, not regenerated:
//! it is what the decode said, and the decode must go on saying it.
//!
//! Its first line counts the lines: 131 `fill_executed`, 111 `fill_busted`, 136
//! `cash_adjusted` and 165 `memo` decoded, and 1,168 poison. Each line after it is a JSON
//! object: `key` (text, or null), `payload` and `verdict`, `{"ok": <the event>}` or
//! `{"err": "<the error's text>"}`.

use super::*;
use serde_json::{json, Value};

const CORPUS: &str = include_str!("decode_corpus.jsonl");

fn text(v: &Value) -> &str {
    v.as_str().expect("a string")
}

#[test]
fn the_decode_gives_every_verdict_of_the_frozen_corpus() {
    let mut lines = CORPUS.lines();
    let header: Value = serde_json::from_str(lines.next().expect("a header")).expect("JSON");
    let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
    for (i, line) in lines.enumerate() {
        let line: Value = serde_json::from_str(line).expect("JSON");
        let key = line["key"].as_str().map(|k| k.as_bytes().to_vec());
        let m = Message::new(0, key, text(&line["payload"]));
        let (outcome, got) = match decode(&m) {
            Ok(e) => (
                format!("decoded {}", e.event_type),
                json!({ "ok": {
                    "event_id": e.event_id,
                    "type": e.event_type,
                    "type_version": e.type_version,
                    "account_id": e.account_id,
                    "seq": e.seq,
                    "occurred_at": e.occurred_at.to_rfc3339(),
                    "data": e.data,
                }}),
            ),
            Err(e) => ("poison".to_owned(), json!({ "err": e.to_string() })),
        };
        assert_eq!(got, line["verdict"], "line {}: {line}", i + 2);
        *counts.entry(format!("message: {outcome}")).or_default() += 1;
    }
    // The header (and the module's documentation) says what the corpus covers.
    assert_eq!(json!(counts), header["lines"]);
}
