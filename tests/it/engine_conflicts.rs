//! Two events, one `seq`: the write side promises one event per `(account, seq)`, and an
//! event id is the same on every republish. So a second event id for a `seq` is a conflict,
//! not a correction, wherever the first one sits:
//!
//! - dead-lettered (poison, or its statement failed): a correction carries the dead
//!   letter's id and supersedes it; another id is a conflict, and the account stays where
//!   the dead letter holds it. A poison message whose envelope named no usable id
//!   (unreadable, or an id the wire format refuses) cannot be told from its correction:
//!   whatever is applied at its `seq` supersedes it. An order-independent view applies both
//!   events (two ids are two events to a sum), and the dead letter stays open;
//! - waiting beyond the first thousand waiting events of its account, which a batch does
//!   not load: the batch's event is still judged against it.

use crate::support::{applier_db, kinds, trail_db, trail_of, trail_parks};
use projector_engine::testkit::{fill, EventSpec, Partition};
use projector_engine::Disposition::{Applied, DeadLettered, Duplicate, Waiting};
use projector_engine::{Applier, SourceOrdering};

const AT: &str = "2026-11-29T10:15:00Z";

fn f(account: i64, seq: i64, qty: &str) -> EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

/// Dead letters of `consumer`: (offset, kind, event id, open).
async fn dead(
    client: &deadpool_postgres::Client,
    consumer: &str,
) -> Vec<(i64, String, Option<String>, bool)> {
    client
        .query(
            "SELECT \"offset\", kind, event_id, resolved_at IS NULL FROM projector.dead_letters \
             WHERE consumer = $1 ORDER BY \"offset\"",
            &[&consumer],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

async fn error_at(client: &deadpool_postgres::Client, offset: i64) -> String {
    client
        .query_one(
            "SELECT error FROM projector.dead_letters WHERE \"offset\" = $1",
            &[&offset],
        )
        .await
        .expect("dead letter")
        .get(0)
}

async fn park_names(client: &deadpool_postgres::Client) -> Vec<Option<i64>> {
    client
        .query(
            "SELECT d.\"offset\" FROM projector.parked_accounts k \
             LEFT JOIN projector.dead_letters d ON d.id = k.dead_letter_id ORDER BY k.account_id",
            &[],
        )
        .await
        .expect("parks")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Account 1: seq 1 applied; seq 2 poison (its quantity is no decimal) with the readable id
/// "p-2"; seq 3 waits behind it. Offsets 0, 1, 2.
fn poisoned() -> Partition {
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1"));
    log.push_event(&f(1, 2, "abc").with_id("p-2"));
    log.push_event(&f(1, 3, "3"));
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_id_for_a_poison_seq_is_a_conflict_and_its_correction_supersedes_it() {
    let (db, applier) = trail_db().await;
    let mut client = db.client().await;
    let mut log = poisoned();
    let out = applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    assert_eq!(kinds(&out), [Applied, DeadLettered, Waiting]);

    // Another event claims seq 2: a conflict, naming both ids; the account stays at the
    // poison, and the park still names it.
    log.push_event(&f(1, 2, "2").with_id("other-2"));
    let out = applier
        .apply(&mut client, &log.batch(3, 10))
        .await
        .expect("batch");
    assert_eq!(kinds(&out), [DeadLettered]);
    assert_eq!((out.counts.conflicts, out.counts.applied), (1, 0));
    let error = error_at(&client, 3).await;
    assert!(
        error.contains("\"p-2\"") && error.contains("\"other-2\""),
        "{error}"
    );
    assert_eq!(
        dead(&client, "trail_v1").await,
        [
            (1, "poison".to_owned(), Some("p-2".to_owned()), true),
            (3, "conflict".to_owned(), Some("other-2".to_owned()), true),
        ]
    );
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1"));
    assert_eq!(trail_parks(&client).await, [(1, 2)]);
    assert_eq!(
        park_names(&client).await,
        [Some(1)],
        "the poison holds seq 2"
    );

    // The correction, with the poison's id: applied, seq 3 follows, the poison superseded;
    // the conflict stays open for an engineer.
    log.push_event(&f(1, 2, "2").with_id("p-2"));
    let out = applier
        .apply(&mut client, &log.batch(4, 10))
        .await
        .expect("batch");
    assert_eq!(kinds(&out), [Applied]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2,3"));
    assert!(trail_parks(&client).await.is_empty());
    let open: Vec<i64> = dead(&client, "trail_v1")
        .await
        .into_iter()
        .filter(|d| d.3)
        .map(|d| d.0)
        .collect();
    assert_eq!(open, [3], "the poison is superseded, the conflict open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_seq_and_another_id_in_one_batch_are_judged_in_their_order() {
    // The poison first: the second id is a conflict, as across two batches.
    let (db, applier) = trail_db().await;
    let mut client = db.client().await;
    let mut log = poisoned();
    log.push_event(&f(1, 2, "2").with_id("other-2"));
    let out = applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    assert_eq!(kinds(&out), [Applied, DeadLettered, Waiting, DeadLettered]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1"));
    assert_eq!(
        park_names(&client).await,
        [Some(1)],
        "the poison holds seq 2"
    );

    // The sound event first: it holds seq 2 and is applied; the poison after it claims a
    // seq taken by another event and stays open (it is not what was applied).
    let (db, applier) = trail_db().await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1"));
    log.push_event(&f(1, 2, "2").with_id("other-2"));
    log.push_event(&f(1, 2, "abc").with_id("p-2"));
    log.push_event(&f(1, 3, "3"));
    let out = applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    assert_eq!(kinds(&out), [Applied, Applied, DeadLettered, Applied]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2,3"));
    assert_eq!(
        dead(&client, "trail_v1").await,
        [(2, "poison".to_owned(), Some("p-2".to_owned()), true)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_without_a_usable_id_is_superseded_by_what_is_applied_at_its_seq() {
    // event_id a number (no id at all), and one with a control character (refused by the
    // wire format: the rendering a dead letter could keep is no event's id).
    for (what, payload) in [
        (
            "a number",
            br#"{"event_id":17,"type":"fill_executed","account_id":1,"seq":2,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#.to_vec(),
        ),
        (
            "a control character",
            br#"{"event_id":"p\u0001-2","type":"fill_executed","account_id":1,"seq":2,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#.to_vec(),
        ),
    ] {
        let (db, applier) = trail_db().await;
        let mut client = db.client().await;
        let mut log = Partition::new("fills", 0);
        log.push_event(&f(1, 1, "1"));
        log.push_raw(Some(b"1".to_vec()), payload);
        log.push_event(&f(1, 3, "3"));
        let out = applier
            .apply(&mut client, &log.batch(0, 10))
            .await
            .expect("batch");
        assert_eq!(kinds(&out), [Applied, DeadLettered, Waiting], "{what}");
        assert_eq!(
            dead(&client, "trail_v1").await,
            [(1, "poison".to_owned(), None, true)],
            "{what}: the dead letter names no event id"
        );
        log.push_event(&f(1, 2, "2").with_id("fixed-2"));
        let out = applier
            .apply(&mut client, &log.batch(3, 10))
            .await
            .expect("batch");
        assert_eq!(kinds(&out), [Applied], "{what}");
        assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2,3"));
        assert_eq!(
            dead(&client, "trail_v1").await,
            [(1, "poison".to_owned(), None, false)],
            "{what}: superseded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_independent_view_applies_another_id_and_keeps_the_poison_open() {
    let registry = projector_views::registry().expect("registry");
    let db = projector_engine::testkit::TestDb::new(&registry).await;
    let eod = registry.select(&["eod".to_owned()]).expect("eod")[0].clone();
    let applier = Applier::new(eod, SourceOrdering::PerAccount).expect("applier");
    let mut client = db.client().await;
    let mut log = poisoned();
    log.push_event(&f(1, 2, "2").with_id("other-2"));
    let out = applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    assert_eq!(kinds(&out), [Applied, DeadLettered, Applied, Applied]);
    assert_eq!(
        dead(&client, "eod_v1").await,
        [(1, "poison".to_owned(), Some("p-2".to_owned()), true)],
        "another event's effect does not stand for the poison's"
    );
    // Its correction does.
    log.push_event(&f(1, 2, "2").with_id("p-2"));
    applier
        .apply(&mut client, &log.batch(4, 10))
        .await
        .expect("batch");
    assert_eq!(
        dead(&client, "eod_v1").await,
        [(1, "poison".to_owned(), Some("p-2".to_owned()), false)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_id_for_a_seq_waiting_beyond_the_first_thousand_is_a_conflict() {
    let (db, applier) = applier_db(crate::support::Trail::new(1)).await;
    let mut client = db.client().await;
    // Seq 1 applied; seq 2 lost; 3 to 1503 wait: more than a batch loads (1000).
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1"));
    for seq in 3..=1503 {
        log.push_event(&f(1, seq, "1"));
    }
    let out = applier
        .apply(&mut client, &log.batch(0, 2000))
        .await
        .expect("batch");
    assert_eq!(out.counts.waiting, 1501);
    // Seq 1200 again under another id, and seq 1300 again (a true repeat).
    log.push_event(&f(1, 1200, "5").with_id("impostor"));
    log.push_event(&f(1, 1300, "1"));
    let out = applier
        .apply(&mut client, &log.batch(1502, 10))
        .await
        .expect("batch");
    assert_eq!(kinds(&out), [DeadLettered, Duplicate]);
    assert_eq!(
        (out.counts.conflicts, out.counts.dup_seq, out.counts.waiting),
        (1, 1, 0)
    );
    let error = error_at(&client, 1502).await;
    assert!(
        error.contains("\"fill_executed-1-1200\"") && error.contains("\"impostor\""),
        "{error}"
    );
    let waiting: i64 = client
        .query_one("SELECT count(*) FROM projector.waiting_events", &[])
        .await
        .expect("waiting")
        .get(0);
    assert_eq!(waiting, 1501, "the waiting events are untouched");

    // Seq 2 arrives: everything drains, in steps, with the original seq 1200.
    log.push_event(&f(1, 2, "1"));
    let mut out = applier
        .apply(&mut client, &log.batch(1504, 10))
        .await
        .expect("batch");
    while !out.more_to_drain.is_empty() {
        let (_, more) = applier.drain_account(&mut client, 1).await.expect("drain");
        if !more {
            break;
        }
        out.more_to_drain = vec![1];
    }
    let trail = trail_of(&client, 1).await.expect("trail");
    let expected: Vec<String> = (1..=1503).map(|s| s.to_string()).collect();
    assert_eq!(trail, expected.join(","));
}
