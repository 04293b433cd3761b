//! The decode of `9badca3` (before the borrowing of strings, the key compared without
//! `to_string`, the digits read without a `String`), kept as an oracle: the current decode
//! must say the same thing, error for error, about every message. The built-in event types'
//! rules left the engine for `projector_views::events`, with their part of this oracle.

use super::*;

// The built-in types' names: to the engine, types like any other.
const FILL_EXECUTED: &str = "fill_executed";
const FILL_BUSTED: &str = "fill_busted";
const CASH_ADJUSTED: &str = "cash_adjusted";

fn old_decode(message: &Message) -> Result<Event, DecodeError> {
    let event = old_decode_envelope(message)?;
    old_check_data(&event)?;
    Ok(event)
}

fn old_decode_envelope(message: &Message) -> Result<Event, DecodeError> {
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
    if env.seq < 1 {
        return Err(field("seq", format!("must be 1 or more, got {}", env.seq)));
    }
    if let Some(key) = &message.key {
        let matches = key.as_slice() == env.account_id.to_string().as_bytes();
        if !matches {
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
    let occurred_at: String = serde_json::from_str(env.occurred_at.get())
        .map_err(|_| field("occurred_at", "must be an RFC 3339 string"))?;
    let occurred_at = DateTime::parse_from_rfc3339(&occurred_at)
        .map_err(|e| {
            field(
                "occurred_at",
                format!("{:?} is not RFC 3339: {e}", safe_text(&occurred_at, 64)),
            )
        })?
        .with_timezone(&Utc);
    // Since V0009 the decode keeps occurred_at to the microsecond, as PostgreSQL does (the
    // inbox is keyed by it): an intended change, made here too.
    let occurred_at =
        DateTime::from_timestamp_micros(occurred_at.timestamp_micros()).unwrap_or(occurred_at);
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
        type_version: 1,
        account_id: env.account_id,
        seq: env.seq,
        occurred_at,
        data: data.to_owned(),
    })
}

/// The old check of `data`, without the built-in types' rules, which left the engine for
/// `projector_views::events` (whose own oracle keeps them): what every type's data must pass.
fn old_check_data(event: &Event) -> Result<(), DecodeError> {
    let data = event.data.as_str();
    let mut de = serde_json::Deserializer::from_str(data);
    Storable
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| field("data", format!("cannot be stored as jsonb: {e}")))?;
    numbers_fit_jsonb(data)
}

fn old_exact_decimal(name: &'static str, raw: &RawValue) -> Result<Decimal, DecodeError> {
    let text = raw.get();
    if text.starts_with('"') {
        let s: String = serde_json::from_str(text).map_err(|e| field(name, e.to_string()))?;
        if !is_plain_decimal(&s) {
            return Err(field(
                name,
                format!("{:?} is not a decimal number", safe_text(&s, 64)),
            ));
        }
        old_exact_from_text(name, &s)
    } else if text.starts_with('-') || text.starts_with(|c: char| c.is_ascii_digit()) {
        old_exact_from_text(name, text)
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

/// The old digits-in-a-String reading, with the exponent's overflow fixed as in 9addc83
/// (the old subtraction panicked in a debug build).
fn old_exact_from_text(name: &'static str, text: &str) -> Result<Decimal, DecodeError> {
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
    let mut digits: String = int.chars().chain(frac.chars()).collect();
    if scale < 0 {
        let zeros = usize::try_from(-scale).unwrap_or(usize::MAX);
        if zeros > 40 {
            return Err(out_of_range(name, &shown()));
        }
        digits.extend(std::iter::repeat_n('0', zeros));
    }
    let significant = digits.trim_start_matches('0');
    if significant.len() > 30 {
        return Err(out_of_range(name, &shown()));
    }
    let magnitude: i128 = if significant.is_empty() {
        0
    } else {
        significant
            .parse()
            .map_err(|_| field(name, format!("{} is not a decimal number", shown())))?
    };
    let value = if negative { -magnitude } else { magnitude };
    let scale = u32::try_from(scale.max(0)).unwrap_or(u32::MAX);
    Decimal::try_from_i128_with_scale(value, scale).map_err(|_| out_of_range(name, &shown()))
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
fn same(a: &Result<Decimal, DecodeError>, b: &Result<Decimal, DecodeError>) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => x.mantissa() == y.mantissa() && x.scale() == y.scale(),
        (Err(x), Err(y)) => x == y,
        _ => false,
    }
}

/// A decimal's text: a sign, leading zeros, any number of digits, a fraction, an
/// exponent of any size and sign, and now and then a stray byte.
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

#[test]
fn decimals_read_as_the_old_decode_read_them() {
    let mut rng = Rng(0x5eed_0001);
    let mut fixed: Vec<String> = [
        "0",
        "-0",
        "0.0",
        "-0.000",
        "00",
        "1e-9223372036854775808",
        "0e-9223372036854775808",
        "1e9223372036854775807",
        "0e9223372036854775807",
        "1e40",
        "0e40",
        "0e41",
        "1e41",
        "1.5e40",
        "79228162514264337593543950335",
        "79228162514264337593543950336",
        "-79228162514264337593543950335",
        "999999999999999999999999999999",
        "9999999999999999999999999999999",
        "0.0000000000000000000000000001",
        "0.00000000000000000000000000001",
        "1e-28",
        "1e-29",
        "100e-30",
        "12345e-2",
        "1.10",
        "1.100000000000000000000000000000",
        "123456789012345678901234567890",
        "1234567890123456789012345678901",
        "0000000000000000000000000000000000001",
        "1e29",
        "1e28",
        "-1e28",
        "1E+2",
        "1e+0002",
        "1.0e-1",
    ]
    .iter()
    .flat_map(|t| [t.to_string(), format!("\"{t}\"")])
    .collect();
    fixed.extend((0..200_000).map(|_| decimal_json(&mut rng)));
    let mut compared = 0;
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    for text in &fixed {
        let Ok(raw) = serde_json::from_str::<&RawValue>(text) else {
            continue;
        };
        compared += 1;
        let old = old_exact_decimal("x", raw);
        let new = exact_decimal("x", raw);
        assert!(same(&old, &new), "{text}: old {old:?}, new {new:?}");
        let kind = match &new {
            Ok(_) => "accepted".to_owned(),
            Err(e) => {
                let e = e.to_string();
                [
                    "exponent",
                    "out of range",
                    "decimal places",
                    "not a decimal",
                    "expected",
                ]
                .into_iter()
                .find(|k| e.contains(k))
                .unwrap_or("other")
                .to_owned()
            }
        };
        *seen.entry(kind).or_default() += 1;
    }
    assert!(compared > 100_000, "{compared} inputs were valid JSON");
    // Every outcome is well represented, or the comparison proves little.
    for kind in [
        "accepted",
        "out of range",
        "decimal places",
        "exponent",
        "not a decimal",
        "expected",
    ] {
        assert!(seen.get(kind).copied().unwrap_or(0) > 500, "{seen:?}");
    }
}

#[test]
fn keys_match_as_the_canonical_text_matched() {
    let mut rng = Rng(0x5eed_0002);
    let edges = [
        0,
        1,
        -1,
        9,
        10,
        -10,
        i64::MAX,
        i64::MIN,
        i64::MAX - 1,
        i64::MIN + 1,
        1_000_000_000_000_000_000,
        -1_000_000_000_000_000_000,
        999_999_999_999_999_999,
    ];
    for round in 0..300_000 {
        let n: i64 = match round % 4 {
            0 => rng.pick(&edges),
            1 => rng.next() as i64,
            2 => (rng.next() % 2000) as i64 - 1000,
            _ => (rng.next() as i64) >> rng.below(63),
        };
        let text = n.to_string();
        let mut key: Vec<u8> = text.clone().into_bytes();
        match rng.below(12) {
            0 => {}
            1 => key.insert(usize::from(n < 0), b'0'),
            2 => key.insert(0, b'+'),
            3 => key.insert(0, b'-'),
            4 => {
                let at = rng.below(key.len());
                key.remove(at);
            }
            5 => {
                let at = rng.below(key.len());
                key[at] = b'0' + rng.below(10) as u8;
            }
            6 => key.push(b'0' + rng.below(10) as u8),
            7 => {
                let at = rng.below(key.len());
                key[at] = rng.pick(&[b' ', b'/', b':', b'a', 0xff, b'-']);
            }
            8 => key = (rng.next() as i64).to_string().into_bytes(),
            9 => key = u64::MAX.to_string().into_bytes(),
            10 => {
                // 19 or 20 digits, the first of them anything.
                let n = 19 + rng.below(2);
                key = rng.digits(n).into_bytes();
                if rng.below(2) == 0 {
                    key.insert(0, b'-');
                }
            }
            _ => {
                key = rng
                    .pick(&["", "-", "-0", "0", "00", "-00"])
                    .as_bytes()
                    .to_vec()
            }
        }
        assert_eq!(
            is_canonical_text(&key, n),
            key == text.as_bytes(),
            "{:?} against {n}",
            String::from_utf8_lossy(&key)
        );
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

#[test]
fn json_strings_read_as_serde_reads_them() {
    let mut rng = Rng(0x5eed_0003);
    let mut compared = 0;
    for _ in 0..200_000 {
        let text = match rng.below(10) {
            0 => rng
                .pick(&["1", "null", "[\"a\"]", "{}", "true", "-2.5"])
                .to_string(),
            _ => format!("\"{}\"", string_body(&mut rng)),
        };
        let Ok(raw) = serde_json::from_str::<&RawValue>(&text) else {
            continue;
        };
        compared += 1;
        let old = serde_json::from_str::<String>(raw.get()).map_err(|e| e.to_string());
        let new = json_str(raw)
            .map(Cow::into_owned)
            .map_err(|e| e.to_string());
        assert_eq!(old, new, "{text}");
    }
    assert!(compared > 50_000, "{compared} inputs were valid JSON");
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

fn bytes_json(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => serde_json::Value::from(s),
        Err(_) => serde_json::json!({ "bytes": bytes }),
    }
}

fn decimal_verdict(r: &Result<Decimal, DecodeError>) -> serde_json::Value {
    match r {
        Ok(d) => serde_json::json!({ "ok": format!("{}e-{}", d.mantissa(), d.scale()) }),
        Err(e) => serde_json::json!({ "err": e.to_string() }),
    }
}

fn event_verdict(r: &Result<Event, DecodeError>) -> serde_json::Value {
    match r {
        Ok(e) => serde_json::json!({ "ok": {
            "event_id": e.event_id,
            "type": e.event_type,
            "type_version": e.type_version,
            "account_id": e.account_id,
            "seq": e.seq,
            "occurred_at": e.occurred_at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            "data": e.data,
        }}),
        Err(e) => serde_json::json!({ "err": e.to_string() }),
    }
}

/// The class of an error message, for sampling: its digits, quoted text and the end after
/// a second colon left out, so "x is out of range" counts once whatever x is.
pub(super) fn error_class(e: &str) -> String {
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

/// What a sample keeps: up to `per_class` lines of each class, and then every `every`th.
pub(super) struct Sampler {
    seen: std::collections::BTreeMap<String, usize>,
    per_class: usize,
    every: usize,
    n: usize,
}

impl Sampler {
    pub(super) fn new(per_class: usize, every: usize) -> Self {
        Self {
            seen: Default::default(),
            per_class,
            every,
            n: 0,
        }
    }
    pub(super) fn keep(&mut self, class: String) -> bool {
        self.n += 1;
        let count = self.seen.entry(class).or_default();
        *count += 1;
        *count <= self.per_class || self.n % self.every == 0
    }
}

fn shape(text: &str) -> String {
    let first = match text.as_bytes().first() {
        Some(b'"') => "string",
        Some(b'-') => "negative",
        Some(b'0'..=b'9') => "number",
        _ => "other",
    };
    let mut s = first.to_owned();
    for (needle, name) in [
        ("e", "+e"),
        ("E", "+E"),
        (".", "+point"),
        ("\\u", "+escape"),
    ] {
        if text.contains(needle) {
            s.push_str(name);
        }
    }
    s
}

#[test]
#[ignore = "writes the frozen corpus: run once, by hand"]
fn write_the_corpus() {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    let mut lines: Vec<String> = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut push = |kind: &str,
                    class: String,
                    line: serde_json::Value,
                    counts: &mut BTreeMap<String, usize>| {
        *counts.entry(format!("{kind}: {class}")).or_default() += 1;
        lines.push(line.to_string());
    };

    // Decimals: the fixed edges, then the random texts.
    let mut rng = Rng(0x5eed_0001);
    let mut texts: Vec<String> = [
        "0",
        "-0",
        "0.0",
        "-0.000",
        "00",
        "1e-9223372036854775808",
        "0e-9223372036854775808",
        "1e9223372036854775807",
        "0e9223372036854775807",
        "1e40",
        "0e40",
        "0e41",
        "1e41",
        "1.5e40",
        "79228162514264337593543950335",
        "79228162514264337593543950336",
        "-79228162514264337593543950335",
        "999999999999999999999999999999",
        "9999999999999999999999999999999",
        "0.0000000000000000000000000001",
        "0.00000000000000000000000000001",
        "1e-28",
        "1e-29",
        "100e-30",
        "12345e-2",
        "1.10",
        "1.100000000000000000000000000000",
        "123456789012345678901234567890",
        "1234567890123456789012345678901",
        "0000000000000000000000000000000000001",
        "1e29",
        "1e28",
        "-1e28",
        "1E+2",
        "1e+0002",
        "1.0e-1",
    ]
    .iter()
    .flat_map(|t| [t.to_string(), format!("\"{t}\"")])
    .collect();
    let fixed = texts.len();
    texts.extend((0..200_000).map(|_| decimal_json(&mut rng)));
    let mut sampler = Sampler::new(12, 250);
    for (i, text) in texts.iter().enumerate() {
        let Ok(raw) = serde_json::from_str::<&RawValue>(text) else {
            continue;
        };
        let old = old_exact_decimal("x", raw);
        assert!(same(&old, &exact_decimal("x", raw)), "{text}");
        let class = match &old {
            Ok(_) => format!("ok ({})", shape(text)),
            Err(e) => format!("{} ({})", error_class(&e.to_string()), shape(text)),
        };
        if i < fixed || sampler.keep(class.clone()) {
            let verdict = decimal_verdict(&old);
            let kind = if old.is_ok() { "accepted" } else { "refused" };
            push(
                "decimal",
                kind.into(),
                serde_json::json!({"kind": "decimal", "text": text, "verdict": verdict}),
                &mut counts,
            );
        }
    }

    // Keys against account ids: the spec is the canonical text.
    let mut rng = Rng(0x5eed_0002);
    let edges = [
        0,
        1,
        -1,
        9,
        10,
        -10,
        i64::MAX,
        i64::MIN,
        i64::MAX - 1,
        i64::MIN + 1,
        1_000_000_000_000_000_000,
        -1_000_000_000_000_000_000,
        999_999_999_999_999_999,
    ];
    let mut sampler = Sampler::new(40, 400);
    for round in 0..300_000 {
        let n: i64 = match round % 4 {
            0 => rng.pick(&edges),
            1 => rng.next() as i64,
            2 => (rng.next() % 2000) as i64 - 1000,
            _ => (rng.next() as i64) >> rng.below(63),
        };
        let text = n.to_string();
        let mut key: Vec<u8> = text.clone().into_bytes();
        let how = rng.below(12);
        match how {
            0 => {}
            1 => key.insert(usize::from(n < 0), b'0'),
            2 => key.insert(0, b'+'),
            3 => key.insert(0, b'-'),
            4 => {
                let at = rng.below(key.len());
                key.remove(at);
            }
            5 => {
                let at = rng.below(key.len());
                key[at] = b'0' + rng.below(10) as u8;
            }
            6 => key.push(b'0' + rng.below(10) as u8),
            7 => {
                let at = rng.below(key.len());
                key[at] = rng.pick(&[b' ', b'/', b':', b'a', 0xff, b'-']);
            }
            8 => key = (rng.next() as i64).to_string().into_bytes(),
            9 => key = u64::MAX.to_string().into_bytes(),
            10 => {
                let n = 19 + rng.below(2);
                key = rng.digits(n).into_bytes();
                if rng.below(2) == 0 {
                    key.insert(0, b'-');
                }
            }
            _ => {
                key = rng
                    .pick(&["", "-", "-0", "0", "00", "-00"])
                    .as_bytes()
                    .to_vec()
            }
        }
        let verdict = key == text.as_bytes();
        assert_eq!(is_canonical_text(&key, n), verdict);
        let class = format!(
            "{verdict} (mutation {how}, {})",
            if n < 0 { "negative" } else { "not negative" }
        );
        if sampler.keep(class) {
            let kind = if verdict { "matches" } else { "differs" };
            push(
                "key",
                kind.into(),
                serde_json::json!({"kind": "key", "key": bytes_json(&key), "account_id": n, "verdict": verdict}),
                &mut counts,
            );
        }
    }

    // JSON strings, as serde reads them.
    let mut rng = Rng(0x5eed_0003);
    let mut sampler = Sampler::new(25, 150);
    for _ in 0..200_000 {
        let text = match rng.below(10) {
            0 => rng
                .pick(&["1", "null", "[\"a\"]", "{}", "true", "-2.5"])
                .to_string(),
            _ => format!("\"{}\"", string_body(&mut rng)),
        };
        let Ok(raw) = serde_json::from_str::<&RawValue>(&text) else {
            continue;
        };
        let old = serde_json::from_str::<String>(raw.get()).map_err(|e| e.to_string());
        let new = json_str(raw)
            .map(Cow::into_owned)
            .map_err(|e| e.to_string());
        assert_eq!(old, new, "{text}");
        let class = match &old {
            Ok(_) => format!("ok ({})", shape(&text)),
            Err(e) => error_class(e),
        };
        if sampler.keep(class) {
            let (kind, verdict) = match &old {
                Ok(s) => ("read", serde_json::json!({ "ok": s })),
                Err(e) => ("refused", serde_json::json!({ "err": e })),
            };
            push(
                "json_str",
                kind.into(),
                serde_json::json!({"kind": "json_str", "text": text, "verdict": verdict}),
                &mut counts,
            );
        }
    }

    // Messages.
    let mut rng = Rng(0x5eed_0004);
    let mut sampler = Sampler::new(8, 150);
    for _ in 0..100_000 {
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
        if sampler.keep(class) {
            let key = m.key.as_deref().map(bytes_json);
            let payload = std::str::from_utf8(&m.payload).expect("generated as text");
            push(
                "message",
                kind,
                serde_json::json!({"kind": "message", "key": key, "payload": payload, "verdict": event_verdict(&old)}),
                &mut counts,
            );
        }
    }

    let mut out = String::new();
    let header = serde_json::json!({
        "corpus": "projector_engine::event decode verdicts, frozen from the decode of 9badca3 (engine/src/event/old_decode_oracle.rs)",
        "lines": counts,
    });
    writeln!(out, "{header}").expect("string");
    for l in &lines {
        writeln!(out, "{l}").expect("string");
    }
    std::fs::write(
        concat!(env!("CARGO_MANIFEST_DIR"), "/src/event/decode_corpus.jsonl"),
        out,
    )
    .expect("write");
}
