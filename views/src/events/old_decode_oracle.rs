//! The built-in types' rules as the decode of `9badca3` applied them (before the borrowing
//! of strings), kept as an oracle: [`decode`](super::decode) must say the same thing, error
//! for error, about every message. The envelope, the decimals and the storable check are the
//! engine's, held to the same old decode by the engine's own oracle
//! (`projector_engine::event`'s `old_decode_oracle`), where this one began.

use super::*;

#[derive(Deserialize)]
struct OldFillData<'a> {
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
struct OldBustData<'a> {
    fill_event_id: String,
    symbol: String,
    side: String,
    #[serde(borrow)]
    qty: &'a RawValue,
    #[serde(borrow)]
    price: &'a RawValue,
}

#[derive(Deserialize)]
struct OldCashData<'a> {
    #[serde(borrow)]
    amount: &'a RawValue,
    reason: String,
}

fn old_decode(message: &Message) -> Result<Event, DecodeError> {
    // The envelope, and the decimals, as the engine reads them: its own oracle holds them to
    // the old decode's.
    let event = decode_envelope(message)?;
    old_check_data(&event)?;
    Ok(event)
}

fn old_check_data(event: &Event) -> Result<(), DecodeError> {
    let bad = |e: serde_json::Error| DecodeError::Envelope(format!("data: {e}"));
    let data = event.data.as_str();
    match event.event_type.as_str() {
        FILL_EXECUTED => {
            let d: OldFillData<'_> = serde_json::from_str(data).map_err(bad)?;
            old_check_trade(&d.symbol, &d.side, d.qty, d.price)?;
            if let Some(fee) = d.fee {
                if exact_decimal("data.fee", fee)? < Decimal::ZERO {
                    return Err(DecodeError::field("data.fee", "must not be negative"));
                }
            }
        }
        FILL_BUSTED => {
            let d: OldBustData<'_> = serde_json::from_str(data).map_err(bad)?;
            check_id("data.fill_event_id", &d.fill_event_id)?;
            old_check_trade(&d.symbol, &d.side, d.qty, d.price)?;
        }
        CASH_ADJUSTED => {
            let d: OldCashData<'_> = serde_json::from_str(data).map_err(bad)?;
            exact_decimal("data.amount", d.amount)?;
            check_text("data.reason", &d.reason, MAX_TEXT_BYTES)?;
        }
        _ => {}
    }
    check_storable(event)
}

fn old_check_trade(
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

/// splitmix64: reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.below(10) as u8))
            .collect()
    }
}

/// The same value written the same way: `Decimal`'s `==` ignores the scale, which
/// PostgreSQL's `numeric` keeps.
fn decimal_text(rng: &mut Rng) -> String {
    let mut s = String::new();
    if rng.below(3) == 0 {
        s.push('-');
    }
    match rng.below(6) {
        0 => s.push('0'),
        1 => {
            let zeros = rng.below(4);
            s.push_str(&"0".repeat(zeros));
            let n = 1 + rng.below(3);
            s.push_str(&rng.digits(n));
        }
        2 => {
            let n = 1 + rng.below(40);
            s.push_str(&rng.digits(n));
        }
        3 => {
            let n = 25 + rng.below(10);
            s.push_str(&rng.digits(n));
        }
        4 => {}
        _ => {
            let n = 1 + rng.below(8);
            s.push_str(&rng.digits(n));
        }
    }
    if rng.below(2) == 0 {
        s.push('.');
        let n = match rng.below(4) {
            0 => rng.below(3),
            1 => 26 + rng.below(5),
            2 => rng.below(40),
            _ => 1 + rng.below(6),
        };
        s.push_str(&rng.digits(n));
        if rng.below(4) == 0 {
            let zeros = rng.below(30);
            s.push_str(&"0".repeat(zeros));
        }
    }
    if rng.below(2) == 0 {
        s.push(rng.pick(&['e', 'E']));
        s.push_str(rng.pick(&["", "+", "-"]));
        let e = match rng.below(6) {
            0 => rng.below(50).to_string(),
            1 => rng
                .pick(&["28", "29", "30", "40", "41", "0", "00", "012"])
                .to_string(),
            2 => rng
                .pick(&[
                    "9223372036854775807",
                    "9223372036854775808",
                    "9223372036854775806",
                    "99999999999999999999",
                ])
                .to_string(),
            3 => {
                let n = 1 + rng.below(25);
                rng.digits(n)
            }
            4 => String::new(),
            _ => rng.below(10).to_string(),
        };
        s.push_str(&e);
    }
    if rng.below(40) == 0 {
        let at = rng.below(s.len() + 1);
        let stray = rng.pick(&['x', ' ', '+', '.', 'e', '-', '٣']);
        s.insert(at, stray);
    }
    s
}

/// A JSON value for a decimal field: a number, a string (escaped or not), or another
/// kind of value.
fn decimal_json(rng: &mut Rng) -> String {
    let text = decimal_text(rng);
    match rng.below(10) {
        0..=3 => text,
        4..=7 => format!("\"{text}\""),
        8 => {
            // Escapes in a decimal string: \u0031 for '1', and so on.
            let escaped: String = text
                .chars()
                .map(|c| {
                    if c.is_ascii() && rng.below(3) == 0 {
                        format!("\\u{:04x}", c as u32)
                    } else {
                        c.to_string()
                    }
                })
                .collect();
            format!("\"{escaped}\"")
        }
        _ => rng
            .pick(&[
                "null",
                "true",
                "{}",
                "[1]",
                "\"\"",
                "\"\\ud800\"",
                "\"1\\n\"",
            ])
            .to_string(),
    }
}

/// Text for a JSON string: plain characters, multibyte ones, and every kind of escape,
/// a lone surrogate and a raw control character among them.
fn string_body(rng: &mut Rng) -> String {
    let pieces = [
        "a",
        "Z",
        "1",
        ":",
        "-",
        "T",
        " ",
        "é",
        "€",
        "😀",
        "\\\"",
        "\\\\",
        "\\/",
        "\\n",
        "\\t",
        "\\u0041",
        "\\u005a",
        "\\u0000",
        "\\ud83d\\ude00",
        "\\ud800",
        "\\udc00x",
        "\\x",
        "\u{1}",
        "\u{7f}",
    ];
    let n = rng.below(12);
    (0..n)
        .map(|_| {
            if rng.below(3) == 0 {
                rng.pick(&pieces)
            } else {
                rng.pick(&pieces[..10])
            }
        })
        .collect()
}

fn timestamp(rng: &mut Rng) -> String {
    let plain = rng
        .pick(&[
            "2026-11-29T10:15:00Z",
            "2026-11-29T10:15:00.123456789+02:00",
            "0001-01-01T00:00:00Z",
            "0000-12-31T23:59:59Z",
            "9999-12-31T23:59:59Z",
            "9999-12-31T23:59:59-01:00",
            "2026-02-30T10:15:00Z",
            "2026-11-29 10:15:00Z",
            "2026-11-29t10:15:00z",
            "",
            "not a time",
        ])
        .to_string();
    match rng.below(8) {
        0 => plain.replace('Z', "\\u005a").replace('T', "\\u0054"),
        1 => plain.replace('-', "\\u002d"),
        2 => plain.replace(':', "\\n"),
        3 => format!("{plain}\\ud800"),
        4 => rng.pick(&["1764411300", "null", "[]", "{}"]).to_string(),
        _ => plain,
    }
}

fn label(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => rng
            .pick(&["buy", "sell", "b\\u0075y", "s\\u0065ll", "BUY", ""])
            .to_string(),
        1 => "X".repeat(60 + rng.below(10)),
        2 => rng
            .pick(&["\\u0007", "a\\u0000b", "\\u00e9t\\u00e9", "\\ud800"])
            .to_string(),
        _ => string_body(rng),
    }
}

fn quoted_or_not(rng: &mut Rng, text: String) -> String {
    match rng.below(12) {
        0 => rng.pick(&["1", "null", "[]", "{}"]).to_string(),
        _ => format!("\"{text}\""),
    }
}

/// A message: its key, its type, its time, its account and every field of its data drawn
/// among sound and unsound forms, escapes included.
fn message(rng: &mut Rng) -> Message {
    // Half the messages are meant to be sound (in many spellings): a random field is
    // unsound so often that a fill would hardly ever decode.
    let good = rng.below(2) == 0;
    let account: i64 = match rng.below(4) {
        0 => rng.pick(&[0, 1, -1, 42, i64::MAX, i64::MIN]),
        1 => rng.next() as i64,
        _ => rng.below(100) as i64,
    };
    let event_type = rng.pick(&[FILL_EXECUTED, FILL_BUSTED, CASH_ADJUSTED, "memo"]);
    let type_json = match rng.below(6) {
        0 => event_type.replace('_', "\\u005f"),
        _ => event_type.to_owned(),
    };
    let mut members: Vec<String> = Vec::new();
    let names: &[&str] = match event_type {
        FILL_EXECUTED => &["symbol", "side", "qty", "price", "fee"],
        FILL_BUSTED => &["fill_event_id", "symbol", "side", "qty", "price"],
        CASH_ADJUSTED => &["amount", "reason"],
        _ => &["note", "qty"],
    };
    for name in names {
        if !good && rng.below(25) == 0 {
            continue;
        }
        let value = match *name {
            "qty" | "price" | "fee" | "amount" if good => rng
                .pick(&[
                    "1",
                    "\"1\"",
                    "\"0.5\"",
                    "1.10",
                    "\"1.10\"",
                    "\"\\u0031.5\"",
                    "12e-1",
                    "1E+2",
                    "0.0000000000000000000000000001",
                    "\"79228162514264337593543950335\"",
                    "\"0001.50\"",
                ])
                .to_owned(),
            "side" if good => rng
                .pick(&["\"buy\"", "\"sell\"", "\"b\\u0075y\"", "\"s\\u0065ll\""])
                .to_owned(),
            _ if good => rng
                .pick(&[
                    "\"EURUSD\"",
                    "\"\\u0045URUSD\"",
                    "\"\\u00e9t\\u00e9\"",
                    "\"fill-1\"",
                    "\"a\\\"b\"",
                ])
                .to_owned(),
            "qty" | "price" | "fee" | "amount" => decimal_json(rng),
            "side" => {
                let side = label(rng);
                quoted_or_not(rng, side)
            }
            _ => {
                let text = if rng.below(2) == 0 {
                    rng.pick(&["EURUSD", "fill-1", "deposit"]).to_string()
                } else {
                    label(rng)
                };
                quoted_or_not(rng, text)
            }
        };
        let name = if rng.below(20) == 0 {
            name.replacen('e', "\\u0065", 1)
        } else {
            (*name).to_owned()
        };
        members.push(format!("\"{name}\":{value}"));
        if !good && rng.below(30) == 0 {
            // A repeated member.
            members.push(format!("\"{name}\":{}", decimal_json(rng)));
        }
    }
    let data = format!("{{{}}}", members.join(","));
    let payload = format!(
        r#"{{"event_id":"e-{}","type":"{type_json}","account_id":{account},"seq":{},"occurred_at":{},"data":{data}}}"#,
        rng.below(1000),
        1 + rng.below(5),
        {
            let t = if good {
                rng.pick(&[
                    "2026-11-29T10:15:00Z",
                    "2026-11-29T10:15:00.5\\u002b01:00",
                    "2026-11-29\\u005410:15:00Z",
                ])
                .to_owned()
            } else {
                timestamp(rng)
            };
            if t.starts_with(['[', '{', 'n']) || t.bytes().all(|b| b.is_ascii_digit()) {
                t
            } else {
                format!("\"{t}\"")
            }
        }
    );
    let key = match rng.below(8) {
        _ if good => Some(account.to_string().into_bytes()),
        0 => None,
        1 => Some(format!("0{account}").into_bytes()),
        2 => Some(format!("+{account}").into_bytes()),
        3 => Some(account.wrapping_add(1).to_string().into_bytes()),
        4 => Some(format!("-{account}").into_bytes()),
        _ => Some(account.to_string().into_bytes()),
    };
    Message::new(0, key, payload)
}

#[test]
fn messages_decode_as_the_old_decode_decoded_them() {
    let mut rng = Rng(0x5eed_0004);
    let mut sound: std::collections::BTreeMap<String, usize> = Default::default();
    let mut poison = 0;
    for _ in 0..100_000 {
        let m = message(&mut rng);
        let old = old_decode(&m);
        let new = decode(&m);
        assert_eq!(old, new, "{}", String::from_utf8_lossy(&m.payload));
        match new {
            Ok(e) => *sound.entry(e.event_type).or_default() += 1,
            Err(_) => poison += 1,
        }
    }
    // Sound events of every type and poison are well represented, or the comparison
    // proves little.
    for t in [FILL_EXECUTED, FILL_BUSTED, CASH_ADJUSTED, "memo"] {
        assert!(sound.get(t).copied().unwrap_or(0) > 200, "{sound:?}");
    }
    assert!(poison > 2_000, "{poison} poison");
}

// ---- The frozen corpus: written once from this oracle, then this file is deleted. ----

fn error_class(e: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    let mut last_digit = false;
    for c in e.chars() {
        if c == '"' {
            quoted = !quoted;
            if quoted {
                out.push_str("\"…\"");
            }
            continue;
        }
        if quoted {
            continue;
        }
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('#');
            }
            last_digit = true;
            continue;
        }
        last_digit = false;
        out.push(c);
    }
    out.chars().take(90).collect()
}

#[test]
#[ignore = "writes the frozen corpus: run once, by hand"]
fn write_the_corpus() {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    let mut lines: Vec<String> = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut rng = Rng(0x5eed_0004);
    for n in 0..100_000usize {
        let m = message(&mut rng);
        let old = old_decode(&m);
        assert_eq!(old, decode(&m));
        let (kind, class) = match &old {
            Ok(e) => (
                format!("decoded {}", e.event_type),
                format!("ok {}", e.event_type),
            ),
            Err(e) => ("poison".to_owned(), error_class(&e.to_string())),
        };
        let count = seen.entry(class).or_default();
        *count += 1;
        if *count <= 8 || n % 100 == 0 {
            *counts.entry(format!("message: {kind}")).or_default() += 1;
            let key = m
                .key
                .as_deref()
                .map(|k| std::str::from_utf8(k).expect("text"));
            let payload = std::str::from_utf8(&m.payload).expect("generated as text");
            let verdict = match &old {
                Ok(e) => serde_json::json!({ "ok": {
                    "event_id": e.event_id,
                    "type": e.event_type,
                    "type_version": e.type_version,
                    "account_id": e.account_id,
                    "seq": e.seq,
                    "occurred_at": e.occurred_at.to_rfc3339(),
                    "data": e.data,
                }}),
                Err(e) => serde_json::json!({ "err": e.to_string() }),
            };
            lines.push(serde_json::json!({"kind": "message", "key": key, "payload": payload, "verdict": verdict}).to_string());
        }
    }
    let mut out = String::new();
    let header = serde_json::json!({
        "corpus": "projector_views::events::decode verdicts (the built-in types' rules), frozen from the decode of 9badca3 (views/src/events/old_decode_oracle.rs)",
        "lines": counts,
        "classes": seen.len(),
    });
    writeln!(out, "{header}").expect("string");
    for l in &lines {
        writeln!(out, "{l}").expect("string");
    }
    std::fs::write(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/events/decode_corpus.jsonl"
        ),
        out,
    )
    .expect("write");
}
