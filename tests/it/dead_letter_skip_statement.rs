//! The one "skip" statement on dead letters (`dead_letters::skip`), which replaced three
//! copies: given one id it gives up that dead letter only, given a consumer, account and seq
//! every open dead letter there and nothing else, and it never rewrites a resolution already
//! recorded (who resolved it, how and why stay as they were).

use projector_engine::dead_letters::{self, Skipped};
use projector_engine::testkit::TestDb;
use projector_engine::Registry;

/// A dead letter of `consumer` at `account`/`seq`, message `offset`; resolved as `retried`
/// by bob when `resolved`.
async fn dead_letter(
    client: &deadpool_postgres::Client,
    consumer: &str,
    offset: i64,
    account: i64,
    seq: i64,
    resolved: bool,
) -> i64 {
    client
        .query_one(
            "INSERT INTO projector.dead_letters \
                 (consumer, topic, partition, \"offset\", kind, payload, account_id, seq, error, \
                  resolved_at, resolution, resolved_by, resolution_note) \
             VALUES ($1, 'fills', 0, $2, 'apply_failed', '\\x00', $3, $4, 'boom', \
                     CASE WHEN $5 THEN now() END, CASE WHEN $5 THEN 'retried' END, \
                     CASE WHEN $5 THEN 'bob' END, CASE WHEN $5 THEN 'fixed' END) \
             RETURNING id",
            &[&consumer, &offset, &account, &seq, &resolved],
        )
        .await
        .expect("a dead letter")
        .get(0)
}

/// (id, resolution, resolved_by, note) of every dead letter, by id.
async fn resolutions(
    client: &deadpool_postgres::Client,
) -> Vec<(i64, Option<String>, Option<String>, Option<String>)> {
    client
        .query(
            "SELECT id, resolution, resolved_by, resolution_note FROM projector.dead_letters \
             ORDER BY id",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

fn open(id: i64) -> (i64, Option<String>, Option<String>, Option<String>) {
    (id, None, None, None)
}

fn as_(
    id: i64,
    resolution: &str,
    by: &str,
    note: &str,
) -> (i64, Option<String>, Option<String>, Option<String>) {
    (
        id,
        Some(resolution.to_owned()),
        Some(by.to_owned()),
        Some(note.to_owned()),
    )
}

#[tokio::test]
async fn skipping_one_dead_letter_touches_that_one_only_and_never_a_resolved_one() {
    let db = TestDb::new(&Registry::new()).await;
    let client = db.client().await;
    let a = dead_letter(&client, "trail_v1", 1, 7, 2, false).await;
    // The same account and seq, another message: an id names one dead letter.
    let b = dead_letter(&client, "trail_v1", 2, 7, 2, false).await;
    let done = dead_letter(&client, "trail_v1", 3, 8, 1, true).await;

    let n = dead_letters::skip(&client, Skipped::One(a), "alice", "lost")
        .await
        .expect("skip");
    assert_eq!(n, 1);
    let n = dead_letters::skip(&client, Skipped::One(done), "alice", "lost")
        .await
        .expect("skip");
    assert_eq!(n, 0, "a resolved dead letter is not skipped again");
    let n = dead_letters::skip(&client, Skipped::One(a), "carol", "again")
        .await
        .expect("skip");
    assert_eq!(n, 0, "nor one skipped already");
    assert_eq!(
        resolutions(&client).await,
        [
            as_(a, "skipped", "alice", "lost"),
            open(b),
            as_(done, "retried", "bob", "fixed")
        ]
    );
}

#[tokio::test]
async fn skipping_a_seq_touches_the_open_dead_letters_of_that_consumer_account_and_seq_only() {
    let db = TestDb::new(&Registry::new()).await;
    let client = db.client().await;
    let at_seq = dead_letter(&client, "trail_v1", 1, 7, 2, false).await;
    let at_seq_too = dead_letter(&client, "trail_v1", 2, 7, 2, false).await;
    let resolved_at_seq = dead_letter(&client, "trail_v1", 3, 7, 2, true).await;
    let other_seq = dead_letter(&client, "trail_v1", 4, 7, 3, false).await;
    let other_account = dead_letter(&client, "trail_v1", 5, 8, 2, false).await;
    let other_version = dead_letter(&client, "trail_v2", 1, 7, 2, false).await;

    let at = Skipped::AtSeq {
        consumer: "trail_v1",
        account: 7,
        seq: 2,
    };
    let n = dead_letters::skip(&client, at, "alice", "lost")
        .await
        .expect("skip");
    assert_eq!(n, 2);
    assert_eq!(
        resolutions(&client).await,
        [
            as_(at_seq, "skipped", "alice", "lost"),
            as_(at_seq_too, "skipped", "alice", "lost"),
            as_(resolved_at_seq, "retried", "bob", "fixed"),
            open(other_seq),
            open(other_account),
            open(other_version),
        ]
    );
}
