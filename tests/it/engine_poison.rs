//! Poison and odd messages: none panics, none is lost. Every offset ends applied, ignored,
//! dead-lettered (with its raw bytes) or waiting (with its raw bytes).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::support::Trail;
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Disposition, Registry, SourceOrdering};

const AT: &str = "2026-11-29T10:15:00Z";

fn raw(account: i64, body: &str) -> (Option<Vec<u8>>, Vec<u8>) {
    (
        Some(account.to_string().into_bytes()),
        body.as_bytes().to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_dead_lettered_with_its_bytes_and_nothing_is_lost() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier =
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier");

    let mut log = Partition::new("fills", 3);
    log.push_event(&fill(1, 1, AT, "EURUSD", "buy", "100", "1.08420", "0.50")); // 0
    log.push_raw(Some(b"1".to_vec()), b"\xff\xfe\x00 not utf-8".to_vec()); // 1
    let (k, p) = raw(1, r#"{"event_id": "x", "type": "fill_executed", "#); // 2: truncated JSON
    log.push_raw(k, p);
    let (k, p) = raw(
        2,
        r#"{"event_id":"no-seq","type":"fill_executed","account_id":2,"occurred_at":"2026-11-29T10:15:00Z","data":{"symbol":"EURUSD","side":"buy","qty":"1","price":"1"}}"#,
    ); // 3
    log.push_raw(k, p);
    let (k, p) = raw(
        3,
        r#"{"event_id":"qty-object","type":"fill_executed","account_id":3,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"symbol":"EURUSD","side":"buy","qty":{"value":"1"},"price":"1"}}"#,
    ); // 4
    log.push_raw(k, p);
    log.push_event(&EventSpec::new(
        "margin_call",
        1,
        2,
        AT,
        serde_json::json!({"level": "0.8"}),
    )); // 5
    let (k, p) = raw(
        1,
        r#"{"event_id":"number-price","type":"fill_executed","account_id":1,"seq":3,"occurred_at":"2026-11-29T10:15:01Z","data":{"symbol":"EURUSD","side":"buy","qty":2,"price":1.1}}"#,
    ); // 6
    log.push_raw(k, p);
    log.push_event(&fill(4, 1, AT, "GBPUSD", "sell", "5", "1.25", "0")); // 7
    log.push_event(&fill(3, 2, AT, "EURUSD", "buy", "7", "1.1", "0")); // 8: account 3's seq 1 was poison

    let mut client = db.client().await;
    let outcome = applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("apply");

    let by_offset: BTreeMap<i64, Disposition> = outcome.dispositions.iter().copied().collect();
    use Disposition::*;
    let expected = [
        Applied,
        DeadLettered,
        DeadLettered,
        DeadLettered,
        DeadLettered,
        Ignored,
        Applied,
        Applied,
        Waiting,
    ];
    assert_eq!(
        by_offset.len(),
        log.log.len(),
        "every offset has a disposition"
    );
    for (offset, want) in expected.iter().enumerate() {
        assert_eq!(by_offset[&(offset as i64)], *want, "offset {offset}");
    }
    let c = &outcome.counts;
    assert_eq!((c.applied, c.ignored, c.poison, c.waiting), (3, 1, 4, 1));
    assert_eq!(outcome.next_offset, 9);

    // Dead letters hold the exact bytes, where they came from and why.
    let rows = client
        .query(
            "SELECT \"offset\", kind, payload, message_key, error, topic, partition \
             FROM projector.dead_letters WHERE consumer = 'trail_v1' ORDER BY \"offset\"",
            &[],
        )
        .await
        .expect("dead letters");
    let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(offsets, [1, 2, 3, 4]);
    for r in &rows {
        let offset: i64 = r.get(0);
        let kind: &str = r.get(1);
        let payload: Vec<u8> = r.get(2);
        let key: Option<Vec<u8>> = r.get(3);
        let topic: &str = r.get(5);
        let partition: i32 = r.get(6);
        assert_eq!(kind, "poison");
        assert_eq!(
            payload, log.log[offset as usize].payload,
            "raw bytes of offset {offset}"
        );
        assert_eq!(key, log.log[offset as usize].key);
        assert_eq!((topic, partition), ("fills", 3));
    }
    let errors: Vec<&str> = rows.iter().map(|r| r.get(4)).collect();
    assert!(errors[0].contains("UTF-8"), "{}", errors[0]);
    assert!(errors[1].contains("invalid envelope"), "{}", errors[1]);
    assert!(errors[2].contains("missing field `seq`"), "{}", errors[2]);
    assert!(
        errors[3].contains("data.qty") && errors[3].contains("object"),
        "{}",
        errors[3]
    );

    // The event behind account 3's poison message never arrived, so its next one waits,
    // with its bytes, instead of being applied out of order.
    let waiting: Vec<u8> = client
        .query_one(
            "SELECT payload FROM projector.waiting_events WHERE consumer = 'trail_v1' AND account_id = 3 AND seq = 2",
            &[],
        )
        .await
        .expect("waiting event")
        .get(0);
    assert_eq!(waiting, log.log[8].payload);

    // The JSON number 1.1 is exactly 1.1, and the integer 2 exactly 2.
    let row = client
        .query_one(
            "SELECT trail, total_qty::text, last_price::text FROM trail_v1 WHERE account_id = 1",
            &[],
        )
        .await
        .expect("account 1");
    assert_eq!(row.get::<_, &str>(0), "1,3");
    assert_eq!(row.get::<_, &str>(1), "102");
    assert_eq!(row.get::<_, &str>(2), "1.1");

    // Redelivering the whole batch changes nothing and dead-letters nothing twice.
    let again = applier
        .apply(&mut client, &log.batch(9, 100))
        .await
        .expect("empty tail");
    assert_eq!(again.next_offset, 9);
    let count: i64 = client
        .query_one("SELECT count(*) FROM projector.dead_letters", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(count, 4);
}
