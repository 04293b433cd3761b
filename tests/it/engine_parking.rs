//! Gaps and failing statements park an account; its later events wait in order in
//! PostgreSQL; other accounts go on.

use crate::support::{rows, trail_db, trail_fold, trail_of};
use projector_engine::testkit::{fill, Partition};
use projector_engine::Disposition;

const AT: &str = "2026-11-29T10:15:00Z";

async fn parked(client: &deadpool_postgres::Client) -> Vec<(i64, String, i64)> {
    client
        .query(
            "SELECT account_id, reason, blocked_seq FROM projector.parked_accounts ORDER BY account_id",
            &[],
        )
        .await
        .expect("parked")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

async fn waiting(client: &deadpool_postgres::Client, account: i64) -> Vec<i64> {
    client
        .query(
            "SELECT seq FROM projector.waiting_events WHERE account_id = $1 ORDER BY seq",
            &[&account],
        )
        .await
        .expect("waiting")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn f(account: i64, seq: i64, qty: &str) -> projector_engine::testkit::EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_parks_the_account_until_the_missing_event_arrives() {
    let (db, applier) = trail_db().await;
    let mut client = db.client().await;
    let all = [
        f(1, 1, "1"),
        f(1, 2, "2"),
        f(1, 3, "3"),
        f(1, 4, "4"),
        f(1, 5, "5"),
        f(1, 6, "6"),
        f(2, 1, "10"),
        f(2, 2, "20"),
        f(2, 3, "30"),
        f(2, 4, "40"),
    ];
    let [a1, a2, a3, a4, a5, a6, b1, b2, b3, b4] = all.clone();
    // seq 3 of account 1 is late: it arrives in the last batch.
    let mut log = Partition::from_events("fills", 0, [&a1, &b1, &a2, &a4, &b2, &a5, &b3]);
    let first = applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("batch 1");
    assert_eq!(first.counts.waiting, 2);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2"));
    assert_eq!(
        trail_of(&client, 2).await.as_deref(),
        Some("1,2,3"),
        "other accounts go on"
    );
    assert_eq!(parked(&client).await, [(1, "gap".to_owned(), 3)]);
    assert_eq!(waiting(&client, 1).await, [4, 5]);

    log.push_event(&a6);
    log.push_event(&b4);
    log.push_event(&a4); // a duplicate of a waiting event
    let second = applier
        .apply(&mut client, &log.batch(7, 100))
        .await
        .expect("batch 2");
    assert_eq!(second.counts.waiting, 1);
    assert_eq!(second.counts.dup_seq, 1);
    assert_eq!(waiting(&client, 1).await, [4, 5, 6]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2"));

    log.push_event(&a3);
    let third = applier
        .apply(&mut client, &log.batch(10, 100))
        .await
        .expect("batch 3");
    assert_eq!(third.dispositions, [(10, Disposition::Applied)]);
    assert_eq!(third.counts.drained, 3);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2,3,4,5,6"));
    assert!(parked(&client).await.is_empty());
    assert!(waiting(&client, 1).await.is_empty());

    let rows: Vec<String> = rows(&client, "trail_v1").await;
    assert_eq!(rows, trail_fold(&all), "the rows equal the in-order fold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_statement_dead_letters_that_event_and_parks_only_its_account() {
    let (db, applier) = trail_db().await;
    let mut client = db.client().await;
    // qty 2000000 violates the view's CHECK constraint: the statement fails for that event.
    let log = Partition::from_events(
        "fills",
        0,
        &[
            f(1, 1, "1"),
            f(2, 1, "10"),
            f(1, 2, "2000000"),
            f(2, 2, "20"),
            f(1, 3, "3"),
            f(2, 3, "30"),
        ],
    );
    let outcome = applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("batch");
    use Disposition::*;
    assert_eq!(
        outcome.dispositions.iter().map(|d| d.1).collect::<Vec<_>>(),
        [Applied, Applied, DeadLettered, Applied, Waiting, Applied]
    );
    assert_eq!(outcome.counts.failed, 1);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1"));
    assert_eq!(trail_of(&client, 2).await.as_deref(), Some("1,2,3"));
    assert_eq!(parked(&client).await, [(1, "dead_letter".to_owned(), 2)]);
    assert_eq!(waiting(&client, 1).await, [3]);

    let row = client
        .query_one(
            "SELECT kind, error, seq, payload FROM projector.dead_letters WHERE consumer = 'trail_v1'",
            &[],
        )
        .await
        .expect("one dead letter");
    assert_eq!(row.get::<_, &str>(0), "apply_failed");
    assert!(
        row.get::<_, &str>(1).contains("check constraint"),
        "{}",
        row.get::<_, &str>(1)
    );
    assert_eq!(row.get::<_, i64>(2), 2);
    assert_eq!(row.get::<_, Vec<u8>>(3), log.log[2].payload);

    // Later events of the account keep waiting in order. A redelivery of the failed event
    // fails again and is dead-lettered again (at its new offset); the park names the newest.
    let mut log = log;
    log.push_event(&f(1, 4, "4"));
    log.push_event(&f(1, 2, "2000000"));
    let later = applier
        .apply(&mut client, &log.batch(6, 100))
        .await
        .expect("later");
    assert_eq!(
        later.dispositions.iter().map(|d| d.1).collect::<Vec<_>>(),
        [Waiting, DeadLettered]
    );
    assert_eq!(waiting(&client, 1).await, [3, 4]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1"));
    let (reason, dead_letter, newest): (String, Option<i64>, i64) = client
        .query_one(
            "SELECT k.reason, k.dead_letter_id, (SELECT max(id) FROM projector.dead_letters) \
             FROM projector.parked_accounts k WHERE k.account_id = 1",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .expect("parked");
    assert_eq!(
        (reason.as_str(), dead_letter),
        ("dead_letter", Some(newest))
    );

    // The producer republishes seq 2 corrected (same event id): it is applied, and what
    // waited behind it drains in order.
    log.push_event(&f(1, 2, "2"));
    let fixed = applier
        .apply(&mut client, &log.batch(8, 100))
        .await
        .expect("fixed");
    assert_eq!(fixed.dispositions, [(8, Applied)]);
    assert_eq!(fixed.counts.drained, 2);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2,3,4"));
    assert!(parked(&client).await.is_empty());
    assert!(waiting(&client, 1).await.is_empty());
}
