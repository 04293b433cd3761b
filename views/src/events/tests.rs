//! The built-in types' rules, as `decode` applies them (moved from the engine's tests with
//! the rules).

use super::*;

fn msg(payload: &str) -> Message {
    Message::new(0, Some(b"42".to_vec()), payload)
}

fn envelope(event_id: &str, event_type: &str, data: &str) -> String {
    serde_json::json!({
        "event_id": event_id, "type": event_type, "account_id": 42, "seq": 1,
        "occurred_at": "2026-11-29T10:15:00Z",
    })
    .to_string()
    .replacen('}', &format!(",\"data\":{data}}}"), 1)
}

fn versioned(version: &str, event_type: &str, data: &str) -> String {
    format!(
        r#"{{"event_id":"a","type":"{event_type}","type_version":{version},"account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{data}}}"#
    )
}

#[test]
fn the_rules_explain_poison() {
    let long_symbol = "S".repeat(MAX_SYMBOL_BYTES + 1);
    let symbol = envelope(
        "a",
        FILL_EXECUTED,
        &format!(r#"{{"symbol":"{long_symbol}","side":"buy","qty":"1","price":"1"}}"#),
    );
    let cases = [
            (&br#"{"event_id":"a","type":"fill_executed","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"symbol":"X","side":"buy","qty":{"v":1},"price":"1"}}"#[..], "data.qty"),
            (&br#"{"event_id":"a","type":"fill_executed","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"symbol":"X","side":"buy","qty":"1_000","price":"1"}}"#[..], "not a decimal"),
        (symbol.as_bytes(), "data.symbol"),
    ];
    for (payload, needle) in cases {
        let m = Message::new(0, Some(b"42".to_vec()), payload.to_vec());
        let err = decode(&m).expect_err("poison");
        assert!(
            err.to_string().contains(needle),
            "{err} should mention {needle}"
        );
        // The engine alone has no rule for the type: the envelope and the data are sound.
        assert!(projector_engine::decode(&m).is_ok(), "{needle}");
    }
}

#[test]
fn the_envelope_alone_ignores_data() {
    let bad_cash = envelope("a", CASH_ADJUSTED, r#"{"amount":"lots"}"#);
    let ev = decode_envelope(&msg(&bad_cash)).expect("a sound envelope");
    assert_eq!(ev.event_type, CASH_ADJUSTED);
    assert!(check_data(&ev).is_err());
}

#[test]
fn fill_version_2_has_a_signed_quantity_and_no_side() {
    let sell = versioned(
        "2",
        FILL_EXECUTED,
        r#"{"symbol":"EURUSD","qty":"-300.50","price":"1.08420","fee":"0.50"}"#,
    );
    let ev = decode(&msg(&sell)).expect("a version 2 sell");
    assert_eq!(
        (ev.type_version, ev.event_type.as_str()),
        (2, FILL_EXECUTED)
    );
    assert!(decode(&msg(&versioned(
        "2",
        FILL_EXECUTED,
        r#"{"symbol":"X","qty":3,"price":"1"}"#
    )))
    .is_ok());
    let bust = versioned(
        "2",
        FILL_BUSTED,
        r#"{"fill_event_id":"f-1","symbol":"EURUSD","qty":"-300.50","price":"1.08420"}"#,
    );
    assert!(
        decode(&msg(&bust)).is_ok(),
        "a bust repeats its fill's signed qty"
    );
    for (event_type, data, needle) in [
        (
            FILL_EXECUTED,
            r#"{"symbol":"X","side":"sell","qty":"3","price":"1"}"#,
            "`data.side`: is not part of fill_executed version 2",
        ),
        (
            FILL_BUSTED,
            r#"{"fill_event_id":"f","symbol":"X","side":"buy","qty":"3","price":"1"}"#,
            "`data.side`: is not part of fill_busted version 2",
        ),
        (
            FILL_EXECUTED,
            r#"{"symbol":"X","qty":"0","price":"1"}"#,
            "must not be zero",
        ),
        (
            FILL_EXECUTED,
            r#"{"symbol":"X","qty":"-0.00","price":"1"}"#,
            "must not be zero",
        ),
        (
            FILL_EXECUTED,
            r#"{"symbol":"X","qty":"1","price":"-1"}"#,
            "data.price",
        ),
        (
            FILL_EXECUTED,
            r#"{"symbol":"X","qty":"1","price":"1","fee":"-1"}"#,
            "data.fee",
        ),
        (
            FILL_EXECUTED,
            r#"{"symbol":"X","price":"1"}"#,
            "missing field `qty`",
        ),
        (
            FILL_BUSTED,
            r#"{"symbol":"X","qty":"1","price":"1"}"#,
            "fill_event_id",
        ),
    ] {
        let err = decode(&msg(&versioned("2", event_type, data)))
            .expect_err(data)
            .to_string();
        assert!(err.contains(needle), "{data}: {err}");
    }
    // Version 1 keeps its shape: a side, and a quantity above zero.
    let v1 = versioned(
        "1",
        FILL_EXECUTED,
        r#"{"symbol":"X","qty":"-3","price":"1"}"#,
    );
    assert!(decode(&msg(&v1)).is_err());
}

#[test]
fn a_producer_cannot_publish_a_built_in_type_at_a_version_this_build_does_not_know() {
    for (event_type, version) in [
        (FILL_EXECUTED, "3"),
        (FILL_BUSTED, "3"),
        (CASH_ADJUSTED, "2"),
    ] {
        let payload = versioned(version, event_type, "{}");
        let err = decode(&msg(&payload)).expect_err(&payload).to_string();
        assert!(
            err.contains(&format!("version {version} is unknown to this build")),
            "{err}"
        );
        // The envelope is sound: a view that reads the version decides.
        assert!(decode_envelope(&msg(&payload)).is_ok());
    }
    // A team's own type may be at any version; only its data's storability is checked.
    assert!(decode(&msg(&versioned("9", "memo", r#"{"x":1}"#))).is_ok());
}
