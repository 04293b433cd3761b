//! No message can wedge a view: each way one bad message (or two writers of one account)
//! used to stop a view for good, replayed against real PostgreSQL through the apply path.
//! The Kafka-level cases (fencing, bounded waits) are in `kafka_hardening.rs`.

use std::sync::Arc;

use crate::support::{applier_db, kinds, rows, Trail};
use projector_engine::testkit::{cash, fill, EventSpec, Partition, TestDb};
use projector_engine::{
    Applier, Batch, BatchOutcome, Disposition, Projection, Registry, SourceOrdering,
};
use projector_views::Eod;

use Disposition::*;

const AT: &str = "2026-11-29T10:15:00Z";

fn f(account: i64, seq: i64, qty: &str) -> EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

/// A raw envelope around `data`, for messages no well-behaved producer would send.
fn envelope(
    event_id: &str,
    event_type: &str,
    account: i64,
    seq: i64,
    at: &str,
    data: &str,
) -> Vec<u8> {
    let head = serde_json::json!({
        "event_id": event_id, "type": event_type, "account_id": account, "seq": seq, "occurred_at": at,
    })
    .to_string();
    format!("{},\"data\":{data}}}", &head[..head.len() - 1]).into_bytes()
}

fn key(account: i64) -> Option<Vec<u8>> {
    Some(account.to_string().into_bytes())
}

/// Every message counted once, waiting events twice (when they start and stop waiting).
fn assert_counts_add_up(outcome: &BatchOutcome, messages: usize) {
    let c = &outcome.counts;
    assert_eq!(
        c.applied + c.ignored + c.duplicates() + c.dead_lettered() + c.waiting - c.drained,
        messages as u64,
        "{c:?}"
    );
}

async fn trail(client: &deadpool_postgres::Client, view: &str, account: i64) -> Option<String> {
    client
        .query_opt(
            &format!("SELECT trail FROM {view} WHERE account_id = $1"),
            &[&account],
        )
        .await
        .expect("trail")
        .map(|r| r.get(0))
}

/// Dead letters of a consumer: (offset, kind, event id, account, seq, error, payload).
type DeadRow = (
    i64,
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    String,
    Vec<u8>,
);

async fn dead_letters(client: &deadpool_postgres::Client, consumer: &str) -> Vec<DeadRow> {
    client
        .query(
            "SELECT \"offset\", kind, event_id, account_id, seq, error, payload \
             FROM projector.dead_letters WHERE consumer = $1 ORDER BY \"offset\"",
            &[&consumer],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        })
        .collect()
}

async fn parks(
    client: &deadpool_postgres::Client,
    consumer: &str,
) -> Vec<(i64, String, i64, Option<i64>)> {
    client
        .query(
            "SELECT account_id, reason, blocked_seq, dead_letter_id FROM projector.parked_accounts \
             WHERE consumer = $1 ORDER BY account_id",
            &[&consumer],
        )
        .await
        .expect("parks")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_postgresql_cannot_store_is_dead_lettered_in_the_batch_that_meets_it() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let fill_data = |symbol: &str, qty: &str| {
        format!(r#"{{"symbol":"{symbol}","side":"buy","qty":{qty},"price":"1"}}"#)
    };
    let long_id = "e".repeat(300);
    // The messages whose envelope names a usable event id claim seq 3, which no sound event
    // of the batch takes: at seq 2, each would be another event for the seq the sound event
    // after them claims, which would make that one a conflict (tests/it/engine_conflicts.rs).
    let bad: Vec<(i64, Vec<u8>)> = vec![
        (
            1,
            envelope(
                &long_id,
                "fill_executed",
                1,
                2,
                AT,
                &fill_data("X", "\"1\""),
            ),
        ),
        (
            1,
            envelope(
                "nul\u{0}id",
                "fill_executed",
                1,
                2,
                AT,
                &fill_data("X", "\"1\""),
            ),
        ),
        (
            1,
            envelope(
                "long-symbol",
                "fill_executed",
                1,
                3,
                AT,
                &fill_data(&"S".repeat(100), "\"1\""),
            ),
        ),
        (
            1,
            envelope(
                "nul-symbol",
                "fill_executed",
                1,
                3,
                AT,
                &fill_data("A\\u0000B", "\"1\""),
            ),
        ),
        (
            1,
            envelope(
                "nul-key",
                "fill_executed",
                1,
                3,
                AT,
                r#"{"symbol":"X","side":"buy","qty":"1","price":"1","n\u0000te":1}"#,
            ),
        ),
        (
            1,
            envelope(
                "places",
                "fill_executed",
                1,
                3,
                AT,
                &fill_data("X", "\"0.000000000000000000000000000001\""),
            ),
        ),
        (
            1,
            envelope("huge", "fill_executed", 1, 3, AT, &fill_data("X", "1e40")),
        ),
        (
            1,
            envelope(
                "year",
                "fill_executed",
                1,
                3,
                "+10000-01-01T00:00:00Z",
                &fill_data("X", "\"1\""),
            ),
        ),
        (
            1,
            envelope(
                "year-0",
                "fill_executed",
                1,
                3,
                "0000-01-01T00:00:00Z",
                &fill_data("X", "\"1\""),
            ),
        ),
        (1, vec![b' '; (1 << 20) + 1]),
    ];
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1"));
    for (account, payload) in &bad {
        log.push_raw(key(*account), payload.clone());
    }
    log.push_event(&f(1, 2, "2"));
    log.push_event(&f(2, 1, "10"));

    let outcome = applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("one batch, committed: no content makes it fail");
    let mut expected = vec![Applied];
    expected.extend(std::iter::repeat_n(DeadLettered, bad.len()));
    expected.extend([Applied, Applied]);
    assert_eq!(kinds(&outcome), expected);
    assert_counts_add_up(&outcome, log.log.len());
    assert_eq!(outcome.next_offset, log.log.len() as i64);

    let dead = dead_letters(&client, "trail_v1").await;
    assert_eq!(dead.len(), bad.len());
    for ((offset, kind, event_id, _, _, error, payload), (i, (_, sent))) in
        dead.iter().zip(bad.iter().enumerate())
    {
        assert_eq!(*offset, i as i64 + 1);
        assert_eq!(kind, "poison");
        assert_eq!(payload, sent, "raw bytes kept");
        assert!(!error.contains('\0') && !error.is_empty());
        assert!(event_id
            .as_deref()
            .is_none_or(|id| !id.contains('\0') && id.len() <= 300));
    }
    // The envelope yields the account and seq of most: the dead letter says which account.
    assert_eq!((dead[0].3, dead[0].4), (Some(1), Some(2)));
    assert_eq!(
        dead[1].2, None,
        "an id the wire format refuses is no event's id: none is kept"
    );
    assert!(dead[0].5.contains("event_id"), "{}", dead[0].5);
    assert!(dead[2].5.contains("data.symbol"), "{}", dead[2].5);
    assert!(
        dead[5].5.contains("more than 28 decimal places"),
        "{}",
        dead[5].5
    );
    assert!(dead[6].5.contains("out of range"), "{}", dead[6].5);
    assert!(dead[9].5.contains("limit"), "{}", dead[9].5);
    assert_eq!(
        rows(&client, "trail_v1").await,
        ["(1,2,\"1,2\",3,1.5,2)", "(2,1,1,10,1.5,1)"]
    );
}

/// A view whose statement can fail in the database for one event's content: it indexes a
/// free-text note (an index entry cannot exceed about 2.7 kB) and casts a count to int.
#[derive(Debug, Clone)]
struct Notes;

impl Projection for Notes {
    fn name(&self) -> &str {
        "notes"
    }
    fn version(&self) -> i32 {
        1
    }
    fn subscribes(&self) -> &[&str] {
        &["note_added"]
    }
    fn dedup(&self) -> projector_engine::DedupMode {
        projector_engine::DedupMode::Inbox
    }
    fn ddl(&self) -> String {
        "CREATE TABLE IF NOT EXISTS notes_v{v} (
             account_id bigint NOT NULL, seq bigint NOT NULL, note text NOT NULL, n int NOT NULL,
             PRIMARY KEY (account_id, seq));
         CREATE INDEX IF NOT EXISTS notes_v{v}_note ON notes_v{v} (note)"
            .to_owned()
    }
    fn tables(&self) -> Vec<String> {
        vec!["notes_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> projector_engine::ApplySql {
        projector_engine::ApplySql {
            ctes: String::new(),
            write: "INSERT INTO notes_v{v} SELECT account_id, seq, data->>'note', (data->>'n')::int FROM ev RETURNING 1"
                .to_owned(),
        }
    }
    fn read_sql(&self) -> String {
        "SELECT * FROM notes_v{v}".to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_errors_caused_by_one_event_dead_letter_it_and_park_its_account() {
    let (db, applier) = applier_db(Notes).await;
    let mut client = db.client().await;
    let note = |account: i64, seq: i64, text: &str, n: &str| {
        envelope(
            &format!("note-{account}-{seq}"),
            "note_added",
            account,
            seq,
            AT,
            &format!(r#"{{"note":"{text}","n":{n}}}"#),
        )
    };
    // Random text does not compress: the index entry is far beyond what a btree holds.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let incompressible: String = (0..6000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    let mut log = Partition::new("notes", 0);
    log.push_raw(key(1), note(1, 1, "fine", "1")); // 0
    log.push_raw(key(1), note(1, 2, &incompressible, "2")); // 1: 54000, index row too large
    log.push_raw(key(1), note(1, 3, "after", "3")); // 2: waits behind seq 2
    log.push_raw(key(2), note(2, 1, "overflow", "99999999999")); // 3: 22003, int out of range
    log.push_raw(key(3), note(3, 1, "other", "3")); // 4
    let outcome = applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("committed: the failures are the events', not the batch's");
    assert_eq!(
        kinds(&outcome),
        [Applied, DeadLettered, Waiting, DeadLettered, Applied]
    );
    assert_counts_add_up(&outcome, log.log.len());
    let dead = dead_letters(&client, "notes_v1").await;
    assert_eq!(dead.len(), 2);
    assert_eq!((dead[0].1.as_str(), dead[0].4), ("apply_failed", Some(2)));
    assert!(dead[0].5.contains("54000"), "{}", dead[0].5);
    assert!(dead[1].5.contains("22003"), "{}", dead[1].5);
    let parked = parks(&client, "notes_v1").await;
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (parked[0].0, parked[0].1.as_str(), parked[0].2),
        (1, "dead_letter", 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_a_view_does_not_read_cannot_block_it() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1"));
    // A malformed cash movement: poison for a view that reads cash, nothing to trail.
    log.push_raw(
        key(1),
        envelope(
            "cash-1-2",
            "cash_adjusted",
            1,
            2,
            AT,
            r#"{"amount":"lots","reason":""}"#,
        ),
    );
    log.push_event(&f(1, 3, "3"));
    let outcome = applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("batch");
    assert_eq!(kinds(&outcome), [Applied, Ignored, Applied]);
    assert_eq!(trail(&client, "trail_v1", 1).await.as_deref(), Some("1,3"));
    assert!(parks(&client, "trail_v1").await.is_empty());
    assert!(dead_letters(&client, "trail_v1").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_independent_views_are_not_parked_by_gaps() {
    let registry = Registry::new()
        .register(Eod::new(1))
        .and_then(|r| r.register(Eod::new(2)))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let gapped = Applier::new(Arc::new(Eod::new(1)), SourceOrdering::PerAccount).expect("v1");
    let in_order = Applier::new(Arc::new(Eod::new(2)), SourceOrdering::PerAccount).expect("v2");
    let mut client = db.client().await;
    let events = [
        f(1, 1, "1"),
        cash(1, 2, AT, "100", "deposit"),
        f(1, 3, "3"),
        f(1, 4, "4"),
    ];
    // Seq 2 is late: it comes last, and seq 4 comes twice.
    let mut log = Partition::new("fills", 0);
    for e in [&events[0], &events[2], &events[3], &events[3], &events[1]] {
        log.push_event(e);
    }
    let first = applier_apply(&gapped, &mut client, &log.batch(0, 3)).await;
    assert_eq!(kinds(&first), [Applied, Applied, Applied]);
    let second = applier_apply(&gapped, &mut client, &log.batch(3, 10)).await;
    // The repeat of seq 4 reaches the statement, whose inbox drops it: counted, and its
    // disposition says its effect is in the view.
    assert_eq!(kinds(&second), [Applied, Applied]);
    assert_eq!((second.counts.dup_inbox, second.counts.applied), (1, 1));
    assert!(parks(&client, "eod_v1").await.is_empty());

    let reference = Partition::from_events("fills", 0, &events);
    applier_apply(&in_order, &mut client, &reference.batch(0, 10)).await;
    assert_eq!(rows(&client, "eod_v1").await, rows(&client, "eod_v2").await);
}

async fn applier_apply(
    applier: &Applier,
    client: &mut deadpool_postgres::Client,
    batch: &Batch,
) -> BatchOutcome {
    applier.apply(client, batch).await.expect("batch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_says_whether_it_waits_for_a_lost_event_or_a_dead_letter() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1"));
    // Account 1: seq 2 is poison (its data), seq 3 waits behind it.
    log.push_raw(
        key(1),
        envelope(
            "fill_executed-1-2",
            "fill_executed",
            1,
            2,
            AT,
            r#"{"symbol":"X","side":"hold","qty":"1","price":"1"}"#,
        ),
    );
    log.push_event(&f(1, 3, "3"));
    // Account 2: seq 2 never arrives.
    log.push_event(&f(2, 1, "1"));
    log.push_event(&f(2, 3, "3"));
    applier_apply(&applier, &mut client, &log.batch(0, 100)).await;

    let dead = dead_letters(&client, "trail_v1").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].3, dead[0].4),
        (Some(1), Some(2)),
        "the dead letter names its account and seq"
    );
    let dead_id: i64 = client
        .query_one("SELECT id FROM projector.dead_letters", &[])
        .await
        .expect("id")
        .get(0);
    let parked = parks(&client, "trail_v1").await;
    assert_eq!(
        parked,
        [
            (1, "dead_letter".to_owned(), 2, Some(dead_id)),
            (2, "gap".to_owned(), 2, None)
        ]
    );
    let detail: String = client
        .query_one(
            "SELECT detail FROM projector.parked_accounts WHERE account_id = 1",
            &[],
        )
        .await
        .expect("detail")
        .get(0);
    assert!(
        detail.contains(&format!("dead letter {dead_id}")) && detail.contains("data.side"),
        "{detail}"
    );

    // A gap park whose missing seq later arrives as poison turns into a dead-letter park.
    log.push_raw(
        key(2),
        envelope(
            "fill_executed-2-2",
            "fill_executed",
            2,
            2,
            AT,
            r#"{"symbol":"X","side":"buy","qty":"-1","price":"1"}"#,
        ),
    );
    applier_apply(&applier, &mut client, &log.batch(5, 100)).await;
    let parked = parks(&client, "trail_v1").await;
    assert_eq!((parked[1].1.as_str(), parked[1].2), ("dead_letter", 2));
    assert!(parked[1].3.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_of_one_account_take_turns_and_leave_no_stale_park() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let applier = Arc::new(applier);
    let mut a = db.client().await;
    // After a partition-count change account 1's events arrive through two partitions.
    let mut p0 = Partition::new("fills", 0);
    for seq in 1..=5 {
        p0.push_event(&f(1, seq, "1"));
    }
    let mut p1 = Partition::new("fills", 1);
    p1.push_event(&f(1, 6, "1"));
    applier_apply(&applier, &mut a, &p0.batch(0, 4)).await;

    // Writer A applies seq 5 and has not committed yet...
    applier
        .make_days_for(&mut a, &p0.batch(4, 10))
        .await
        .expect("the inbox's days");
    let mut tx = a.transaction().await.expect("begin");
    let held = applier
        .apply_in(&mut tx, &p0.batch(4, 10))
        .await
        .expect("seq 5");
    assert_eq!(held.dispositions, [(4, Applied)]);
    // ...while writer B brings seq 6: it must wait for A, not park at 5.
    let b_task = {
        let (applier, pool, batch) = (applier.clone(), db.pool().clone(), p1.batch(0, 10));
        tokio::spawn(async move {
            let mut b = pool.get().await.expect("b");
            applier.apply(&mut b, &batch).await.expect("seq 6")
        })
    };
    let observer = db.client().await;
    let mut waited = false;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let blocked: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("activity")
            .get(0);
        if blocked > 0 {
            waited = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(waited, "writer B must wait on the account's progress row");
    tx.commit().await.expect("commit A");
    let b = b_task.await.expect("writer B");
    assert_eq!(b.dispositions, [(0, Applied)]);
    assert!(parks(&observer, "trail_v1").await.is_empty());
    assert_eq!(
        trail(&observer, "trail_v1", 1).await.as_deref(),
        Some("1,2,3,4,5,6")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_park_drains_when_its_account_comes_back() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    for seq in 1..=4 {
        log.push_event(&f(1, seq, "1"));
    }
    applier_apply(&applier, &mut client, &log.batch(0, 10)).await;
    // What an older engine could leave behind when two writers raced: parked at 4 (already
    // applied), with 5 and 6 waiting.
    let five = f(1, 5, "1");
    let six = f(1, 6, "1");
    for e in [&five, &six] {
        client
            .execute(
                "INSERT INTO projector.waiting_events (consumer, account_id, seq, event_id, topic, partition, \"offset\", message_key, payload) \
                 VALUES ('trail_v1', 1, $1, $2, 'fills', 9, $1, $3, $4)",
                &[&e.seq, &e.event_id, &e.key(), &e.payload()],
            )
            .await
            .expect("waiting");
    }
    client
        .execute(
            "INSERT INTO projector.parked_accounts (consumer, account_id, reason, blocked_seq, detail) \
             VALUES ('trail_v1', 1, 'gap', 4, 'stale')",
            &[],
        )
        .await
        .expect("park");
    log.push_event(&f(1, 8, "1"));
    let outcome = applier_apply(&applier, &mut client, &log.batch(4, 10)).await;
    assert_eq!(kinds(&outcome), [Waiting]);
    assert_eq!(outcome.counts.drained, 2);
    assert_eq!(
        trail(&client, "trail_v1", 1).await.as_deref(),
        Some("1,2,3,4,5,6")
    );
    assert_eq!(
        parks(&client, "trail_v1").await,
        [(1, "gap".to_owned(), 7, None)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_event_that_no_longer_decodes_is_dead_lettered_when_it_drains() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1"));
    log.push_event(&f(1, 3, "3"));
    applier_apply(&applier, &mut client, &log.batch(0, 10)).await;
    // An older engine accepted (and rounded) 30 decimal places; seq 3 waits with such a
    // payload. Today's decoding refuses it.
    let old = envelope(
        "fill_executed-1-3",
        "fill_executed",
        1,
        3,
        AT,
        r#"{"symbol":"EURUSD","side":"buy","qty":"0.000000000000000000000000000003","price":"1.5"}"#,
    );
    client
        .execute(
            "UPDATE projector.waiting_events SET payload = $1 WHERE consumer = 'trail_v1' AND seq = 3",
            &[&old],
        )
        .await
        .expect("tighten");
    log.push_event(&f(1, 2, "2"));
    let outcome = applier_apply(&applier, &mut client, &log.batch(2, 10)).await;
    assert_eq!(kinds(&outcome), [Applied]);
    assert_eq!(
        (
            outcome.counts.poison,
            outcome.counts.drained,
            outcome.counts.ignored
        ),
        (1, 1, 0)
    );
    let dead = dead_letters(&client, "trail_v1").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].0, dead[0].1.as_str(), dead[0].4),
        (1, "poison", Some(3))
    );
    assert!(dead[0].5.contains("no longer decoded"), "{}", dead[0].5);
    assert_eq!(dead[0].6, old, "the stored bytes");
    let waiting: i64 = client
        .query_one("SELECT count(*) FROM projector.waiting_events", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(waiting, 0);
    assert_eq!(trail(&client, "trail_v1", 1).await.as_deref(), Some("1,2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_id_twice_in_a_statement_is_applied_once() {
    // Order-independent: the whole batch is one statement.
    let registry = Registry::new().register(Eod::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let eod = Applier::new(Arc::new(Eod::new(1)), SourceOrdering::PerAccount).expect("eod");
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("same"));
    log.push_event(&f(2, 1, "2").with_id("same"));
    log.push_event(&f(2, 2, "3"));
    let outcome = applier_apply(&eod, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&outcome), [Applied, Duplicate, Applied]);
    assert_eq!((outcome.counts.applied, outcome.counts.dup_inbox), (2, 1));
    let fills: i64 = client
        .query_one("SELECT sum(fills)::bigint FROM eod_v1", &[])
        .await
        .expect("fills")
        .get(0);
    assert_eq!(fills, 2);

    // Order-dependent: one id at two seqs of one account, in one batch.
    let (db, trail_view) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("again"));
    log.push_event(&f(1, 2, "2").with_id("again"));
    let outcome = applier_apply(&trail_view, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&outcome), [Applied, Duplicate]);
    assert_eq!(trail(&client, "trail_v1", 1).await.as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_the_inbox_has_at_a_new_seq_is_skipped_and_the_rest_of_the_batch_applied() {
    // The fast path inserts the inbox rows of events past each account's `seq` without
    // `ON CONFLICT`: such events are new, unless a producer reused an id. A reused id fails
    // that statement; the batch must end exactly as the `ON CONFLICT DO NOTHING` statement
    // ends it: the reused id skipped as an inbox duplicate, every other event applied, no
    // dead letter, no park.
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("shared")); // 0
    applier_apply(&applier, &mut client, &log.batch(0, 10)).await;

    log.push_event(&f(2, 1, "2")); // 1
    log.push_event(&f(3, 1, "3")); // 2
    log.push_event(&f(2, 2, "4").with_id("shared")); // 3: account 2's seq 2 reuses the id
    log.push_event(&f(3, 2, "5")); // 4
    log.push_event(&f(2, 3, "6")); // 5
    let outcome = applier_apply(&applier, &mut client, &log.batch(1, 10)).await;
    // An event the statement's inbox skips went to the statement: its disposition says
    // Applied (its effect is in the view once), the counts say what the inbox did.
    assert_eq!(kinds(&outcome), [Applied; 5]);
    assert_eq!((outcome.counts.applied, outcome.counts.dup_inbox), (4, 1));
    assert_counts_add_up(&outcome, 5);
    assert!(dead_letters(&client, "trail_v1").await.is_empty());
    assert_eq!(trail(&client, "trail_v1", 2).await.as_deref(), Some("1,3"));
    assert_eq!(trail(&client, "trail_v1", 3).await.as_deref(), Some("1,2"));
    let parked: i64 = client
        .query_one("SELECT count(*) FROM projector.parked_accounts", &[])
        .await
        .expect("parked")
        .get(0);
    assert_eq!(parked, 0);

    // The next batch of account 2 follows its seq 3: the skipped event's seq was taken.
    log.push_event(&f(2, 4, "7")); // 6
    let next = applier_apply(&applier, &mut client, &log.batch(6, 10)).await;
    assert_eq!(kinds(&next), [Applied]);
    assert_eq!(
        trail(&client, "trail_v1", 2).await.as_deref(),
        Some("1,3,4")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_event_for_a_taken_seq_is_a_conflict_not_a_duplicate() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("first"));
    log.push_event(&f(1, 2, "2"));
    applier_apply(&applier, &mut client, &log.batch(0, 10)).await;

    log.push_event(&f(1, 2, "20").with_id("impostor")); // 2: seq 2 is held by fill_executed-1-2
    log.push_event(&f(1, 1, "10").with_id("older")); // 3: seq 1 was applied as "first"
    log.push_event(&f(1, 1, "1").with_id("first")); // 4: a true redelivery
    log.push_event(&f(1, 2, "2")); // 5: another
    let outcome = applier_apply(&applier, &mut client, &log.batch(2, 10)).await;
    assert_eq!(
        kinds(&outcome),
        [DeadLettered, DeadLettered, Duplicate, Duplicate]
    );
    assert_eq!((outcome.counts.conflicts, outcome.counts.dup_seq), (2, 2));
    assert_counts_add_up(&outcome, 4);
    let dead = dead_letters(&client, "trail_v1").await;
    assert_eq!(dead.len(), 2);
    assert_eq!(dead[0].1, "conflict");
    assert!(
        dead[0].5.contains("\"fill_executed-1-2\"") && dead[0].5.contains("\"impostor\""),
        "names both events: {}",
        dead[0].5
    );
    assert!(dead[1].5.contains("\"older\""), "{}", dead[1].5);
    assert_eq!(trail(&client, "trail_v1", 1).await.as_deref(), Some("1,2"));
    let duplicates: i64 = client
        .query_one("SELECT sum(duplicates)::bigint FROM projector.offsets", &[])
        .await
        .expect("duplicates")
        .get(0);
    assert_eq!(
        duplicates, 2,
        "only true duplicates are counted as duplicates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correction_of_a_waiting_event_that_fails_as_it_drains_releases_the_account() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1")); // 0
    log.push_event(&f(1, 3, "2000000")); // 1: waits for 2, and will break the CHECK
    let first = applier_apply(&applier, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&first), [Applied, Waiting]);
    log.push_event(&f(1, 2, "2")); // 2: fills the gap; the waiting 3 drains and fails
    log.push_event(&f(1, 3, "3")); // 3: seq 3 corrected, same event id
    let second = applier_apply(&applier, &mut client, &log.batch(2, 10)).await;
    assert_eq!(kinds(&second), [Applied, Applied]);
    assert_counts_add_up(&second, 2);
    assert_eq!(
        trail(&client, "trail_v1", 1).await.as_deref(),
        Some("1,2,3")
    );
    assert!(parks(&client, "trail_v1").await.is_empty());
    let dead = dead_letters(&client, "trail_v1").await;
    assert_eq!(dead.len(), 1, "the failed original is dead-lettered");
    assert_eq!((dead[0].0, dead[0].1.as_str()), (1, "apply_failed"));
    let resolution: Option<String> = client
        .query_one("SELECT resolution FROM projector.dead_letters", &[])
        .await
        .expect("resolution")
        .get(0);
    assert_eq!(
        resolution.as_deref(),
        Some("superseded"),
        "the correction resolves the dead letter it replaced"
    );
}

/// A view statement that can no longer be prepared (its table dropped under a running view,
/// which a service notices only at the next batch) fails the batch with PostgreSQL's reason,
/// not with the rollback of a savepoint that was never opened; nothing of the batch stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_that_cannot_be_prepared_fails_the_batch_with_its_own_reason() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    client
        .batch_execute("DROP TABLE trail_v1 CASCADE")
        .await
        .expect("drop the view's table");
    let mut log = Partition::new("trades", 0);
    log.push_event(&f(1, 1, "1"));
    let err = applier
        .apply(&mut client, &log.batch(0, 1))
        .await
        .expect_err("the batch fails");
    let text = err.to_string();
    assert!(
        text.contains("trail_v1") && text.contains("does not exist") && !text.contains("savepoint"),
        "{text}"
    );
    let stored: i64 = client
        .query_one("SELECT count(*) FROM projector.offsets", &[])
        .await
        .expect("offsets")
        .get(0);
    assert_eq!(stored, 0, "nothing of the batch committed");
}
