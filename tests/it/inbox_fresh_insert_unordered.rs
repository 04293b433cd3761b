//! An id the inbox already has, met by the plain (fresh) insert of an order-independent view
//! or of a view on an unordered source. Since 306babe every view with an inbox,
//! order-independent ones (eod, `Tally`, `Ledger` below) and views on an unordered source
//! included, runs the plain inbox insert first (`queries::FRESH_INBOX_CTES`); a unique
//! violation of the inbox rolls the batch back to `projector_batch` and runs the rounds again
//! with `ON CONFLICT DO NOTHING`, and any further failure takes the careful path.
//!
//! Each test drives one way an id the inbox has (or will have) meets the plain insert of an
//! order-independent view: republished batches, ids repeated in one batch or first carried by
//! a type the view ignores, a failing or poison event beside a reused id, a failed event and
//! its correction in one batch, a retried dead letter, waiting events left by an older
//! engine, the rebuild watermark, concurrent writers (one of which rolls its first try back,
//! or deadlocks on the new lock order), and the built-in `eod` against an oracle. Each checks
//! the outcome the `ON CONFLICT` statement gave before the change: every id applied once,
//! exactly the faulty event dead-lettered, counters that add up; they passed on 306babe and
//! on its parent 4c40089 alike. The review found, and these tests pinned before the fixes:
//! the plain insert's new lock order (view rows before the rest of the inbox rows: a
//! deadlock between two writers sharing an id and a view row; now every inbox row first),
//! and a hole older than the change: a failed event's identical copy in the same batch
//! resolved its dead letter as superseded (lost). One more older gap stays, `#[ignore]`d:
//! of two events sharing an id, the lowest account's wins inside a batch, not the first by
//! offset.

use std::sync::Arc;

use crate::support::{kinds, lock_waiters, offsets, rows, spawn_apply, tally_fold, Tally};
use projector_engine::testkit::{cash, fill, EventSpec, Partition, TestDb};
use projector_engine::{
    Applier, ApplySql, Batch, BatchOutcome, DedupMode, Disposition, Field, Projection, Registry,
    SourceOrdering,
};

use Disposition::*;

const AT: &str = "2026-11-29T10:15:00Z";
const LEDGER: &str = "ledger_v1";
const ORDERINGS: [SourceOrdering; 2] = [SourceOrdering::PerAccount, SourceOrdering::Unordered];

/// An order-independent view that keeps one row per event it applies (no key on the event
/// id: an event applied twice shows as two rows), with a CHECK that makes one event's
/// statement fail on purpose (`qty` of 1000000 or more).
#[derive(Debug, Clone)]
struct Ledger;

impl Projection for Ledger {
    fn name(&self) -> &str {
        "ledger"
    }
    fn version(&self) -> i32 {
        1
    }
    fn subscribes(&self) -> &[&str] {
        &["fill_executed"]
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        // The built-in types' rules, which the engine applied itself before they left it.
        projector_views::events::check_rules(event)
    }
    fn dedup(&self) -> DedupMode {
        DedupMode::Inbox
    }
    fn order_independent(&self) -> bool {
        true
    }
    fn fields(&self) -> Vec<Field> {
        vec![Field::Decimal("qty")]
    }
    fn ddl(&self) -> String {
        "CREATE TABLE IF NOT EXISTS ledger_v{v} (
            event_id   text    NOT NULL,
            account_id bigint  NOT NULL,
            seq        bigint  NOT NULL,
            qty        numeric NOT NULL CONSTRAINT ledger_qty_check CHECK (qty < 1000000))"
            .to_owned()
    }
    fn tables(&self) -> Vec<String> {
        vec!["ledger_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: String::new(),
            write: "INSERT INTO ledger_v{v} (event_id, account_id, seq, qty)
                    SELECT event_id, account_id, seq, qty FROM ev
                    RETURNING 1"
                .to_owned(),
        }
    }
    fn read_sql(&self) -> String {
        "SELECT event_id, account_id, seq, qty FROM ledger_v{v}".to_owned()
    }
}

/// [`Ledger`] that also emits a notice per event it writes (the engine does not refuse
/// notices from an order-independent view).
#[derive(Debug, Clone)]
struct Noisy;

impl Projection for Noisy {
    fn name(&self) -> &str {
        "noisy"
    }
    fn version(&self) -> i32 {
        1
    }
    fn subscribes(&self) -> &[&str] {
        Ledger.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        Ledger.check_data(event)
    }
    fn dedup(&self) -> DedupMode {
        DedupMode::Inbox
    }
    fn order_independent(&self) -> bool {
        true
    }
    fn fields(&self) -> Vec<Field> {
        Ledger.fields()
    }
    fn ddl(&self) -> String {
        Ledger.ddl().replace("ledger_", "noisy_")
    }
    fn tables(&self) -> Vec<String> {
        vec!["noisy_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: String::new(),
            write: "INSERT INTO noisy_v{v} (event_id, account_id, seq, qty)
                    SELECT event_id, account_id, seq, qty FROM ev
                    RETURNING event_id"
                .to_owned(),
        }
    }
    fn notices_sql(&self) -> Option<String> {
        Some(
            "INSERT INTO projector.notices (view_name, consumer, kind, event_id, account_id, seq, payload)
             SELECT 'noisy', $1, 'seen', ev.event_id, ev.account_id, ev.seq, '{}'::jsonb
             FROM written w JOIN ev USING (event_id)
             WHERE ev.emit
             ON CONFLICT (view_name, kind, event_id) DO NOTHING
             RETURNING 1"
                .to_owned(),
        )
    }
    fn read_sql(&self) -> String {
        "SELECT event_id, account_id, seq, qty FROM noisy_v{v}".to_owned()
    }
}

fn f(account: i64, seq: i64, qty: &str) -> EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

/// A database with `view` migrated, and its applier on a source with `ordering`.
async fn db_with(
    view: impl Projection + Clone,
    ordering: SourceOrdering,
) -> (TestDb, Arc<Applier>) {
    let registry = Registry::new().register(view.clone()).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = Applier::new(Arc::new(view), ordering).expect("applier");
    (db, Arc::new(applier))
}

async fn apply(
    applier: &Applier,
    client: &mut deadpool_postgres::Client,
    b: &Batch,
) -> BatchOutcome {
    applier.apply(client, b).await.expect("batch")
}

async fn one(client: &deadpool_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// `(event_id, account, rows)` of the ledger: every event applied once has one row.
async fn ledger(client: &deadpool_postgres::Client) -> Vec<(String, i64, i64)> {
    client
        .query(
            "SELECT event_id, account_id, count(*) FROM ledger_v1 \
             GROUP BY event_id, account_id ORDER BY event_id",
            &[],
        )
        .await
        .expect("ledger")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Event ids applied more than once (rows) or whose inbox row is missing or extra.
async fn ledger_matches_inbox(client: &deadpool_postgres::Client) {
    let twice = one(
        client,
        "SELECT count(*) FROM (SELECT event_id FROM ledger_v1 GROUP BY event_id \
         HAVING count(*) > 1) x",
    )
    .await;
    assert_eq!(
        twice,
        0,
        "an event applied twice: {:?}",
        ledger(client).await
    );
    let apart = one(
        client,
        "SELECT count(*) FROM (SELECT event_id FROM ledger_v1 \
         FULL JOIN (SELECT event_id FROM projector.inbox WHERE consumer = 'ledger_v1') i \
         USING (event_id) WHERE ledger_v1.event_id IS NULL OR i.event_id IS NULL) x",
    )
    .await;
    assert_eq!(apart, 0, "the inbox and the ledger disagree");
}

/// `(offset, kind, open)` of every dead letter of `consumer`.
async fn dead_letters(
    client: &deadpool_postgres::Client,
    consumer: &str,
) -> Vec<(i64, String, bool)> {
    client
        .query(
            "SELECT \"offset\", kind, resolved_at IS NULL FROM projector.dead_letters \
             WHERE consumer = $1 ORDER BY partition, \"offset\"",
            &[&consumer],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Every message counted once in `projector.offsets`, waiting ones twice.
async fn assert_offsets_add_up(client: &deadpool_postgres::Client, consumer: &str, messages: i64) {
    let o = offsets(client, consumer).await;
    assert_eq!(o.accounted(), messages, "{o:?}");
}

/// `(applied, dup_inbox, ignored, failed, poison)` of a batch.
fn tally(out: &BatchOutcome) -> (u64, u64, u64, u64, u64) {
    let c = &out.counts;
    (c.applied, c.dup_inbox, c.ignored, c.failed, c.poison)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_republished_repeated_and_ignored_ids_apply_once() {
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Ledger, ordering).await;
        let mut client = db.client().await;
        let mut log = Partition::new("fills", 0);
        let first = [f(1, 1, "1"), f(2, 1, "2"), f(1, 2, "3"), f(2, 2, "4")];
        for e in &first {
            log.push_event(e);
        }
        let out = apply(&applier, &mut client, &log.batch(0, 4)).await;
        assert_eq!(tally(&out), (4, 0, 0, 0, 0), "{ordering:?}");

        let second = [
            first[0].clone(),                            // 4: republished
            cash(3, 1, AT, "5", "deposit").with_id("x"), // 5: ignored type, id x
            f(3, 2, "5").with_id("x"),                   // 6: x, first sent
            f(3, 3, "6").with_id("y"),                   // 7: new
            f(4, 1, "7").with_id("y"),                   // 8: y again, other account
            f(3, 4, "8"),                                // 9: new
            f(9, 1, "abc").with_id("p"),                 // 10: poison, id p
            f(9, 2, "9").with_id("p"),                   // 11: p, sound
            f(9, 3, "10").with_id("q"),                  // 12: q, sound
            f(9, 4, "abc").with_id("q"),                 // 13: q, poison
            first[3].clone(),                            // 14: republished, last
        ];
        for e in &second {
            log.push_event(e);
        }
        let out = apply(&applier, &mut client, &log.batch(4, 20)).await;
        assert_eq!(
            kinds(&out),
            [
                Applied,
                Ignored,
                Applied,
                Applied,
                Duplicate,
                Applied,
                DeadLettered,
                Applied,
                Applied,
                DeadLettered,
                Applied
            ],
            "{ordering:?}"
        );
        assert_eq!(
            tally(&out),
            (5, 3, 1, 0, 2),
            "{ordering:?} {:?}",
            out.counts
        );

        // The whole second batch published again: nothing applied twice.
        for e in &second {
            log.push_event(e);
        }
        let out = apply(&applier, &mut client, &log.batch(15, 20)).await;
        assert_eq!(
            tally(&out),
            (0, 8, 1, 0, 2),
            "{ordering:?} {:?}",
            out.counts
        );

        let ids: Vec<String> = ledger(&client).await.into_iter().map(|r| r.0).collect();
        assert_eq!(
            ids,
            [
                "fill_executed-1-1",
                "fill_executed-1-2",
                "fill_executed-2-1",
                "fill_executed-2-2",
                "fill_executed-3-4",
                "p",
                "q",
                "x",
                "y"
            ],
            "{ordering:?}"
        );
        ledger_matches_inbox(&client).await;
        assert_offsets_add_up(&client, LEDGER, 26).await;
        let poison: Vec<i64> = dead_letters(&client, LEDGER)
            .await
            .into_iter()
            .map(|(offset, kind, open)| {
                assert_eq!((kind.as_str(), open), ("poison", true));
                offset
            })
            .collect();
        assert_eq!(poison, [10, 13, 21, 24], "{ordering:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_a_failing_event_beside_a_reused_id_is_the_only_dead_letter() {
    // The plain insert meets the reused id and the failing event in one statement, in every
    // order (which error comes first depends on where each sits); the careful path must
    // dead-letter exactly the failing event and skip exactly the reused one.
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Ledger, ordering).await;
        let mut client = db.client().await;
        let mut log = Partition::new("fills", 0);
        log.push_event(&f(1, 1, "1").with_id("r"));
        apply(&applier, &mut client, &log.batch(0, 1)).await;
        let mut expected_ids = vec!["r".to_owned()];
        let mut expected_dead = Vec::new();
        let orders: [[usize; 4]; 8] = [
            [0, 1, 2, 3],
            [2, 1, 0, 3],
            [1, 0, 2, 3],
            [1, 2, 0, 3],
            [2, 0, 1, 3],
            [0, 2, 1, 3],
            [3, 2, 1, 0],
            [3, 0, 2, 1],
        ];
        for (k, order) in orders.iter().enumerate() {
            for same_account in [true, false] {
                let n = i64::try_from(k).expect("k") * 2 + i64::from(same_account);
                let account = |a: i64| if same_account { 1 } else { a + 10 * n };
                let start = log.log.len() as i64;
                // R: the reused id (first applied above), B: fails the CHECK, N: new, P: poison.
                let events: [Option<EventSpec>; 4] = [
                    Some(f(account(1), 1, "1").with_id("r")),
                    Some(f(account(2), 1000 + n, "1000000").with_id(&format!("bad-{n}"))),
                    Some(f(account(3), 2000 + n, "2").with_id(&format!("new-{n}"))),
                    None,
                ];
                let mut want = Vec::new();
                for &i in order {
                    match &events[i] {
                        Some(e) => log.push_event(e),
                        None => log.push_raw(Some(b"1".to_vec()), b"not json".to_vec()),
                    }
                    let offset = start + want.len() as i64;
                    want.push(match i {
                        1 | 3 => DeadLettered,
                        _ => Applied,
                    });
                    match i {
                        1 => expected_dead.push((offset, "apply_failed".to_owned(), true)),
                        3 => expected_dead.push((offset, "poison".to_owned(), true)),
                        _ => {}
                    }
                }
                expected_ids.push(format!("new-{n}"));
                let out = apply(&applier, &mut client, &log.batch(start, 4)).await;
                assert_eq!(kinds(&out), want, "{ordering:?} {order:?} {same_account}");
                assert_eq!(
                    tally(&out),
                    (1, 1, 0, 1, 1),
                    "{ordering:?} {order:?} {same_account} {:?}",
                    out.counts
                );
            }
        }
        expected_ids.sort();
        let ids: Vec<String> = ledger(&client).await.into_iter().map(|r| r.0).collect();
        assert_eq!(ids, expected_ids, "{ordering:?}");
        ledger_matches_inbox(&client).await;
        expected_dead.sort_by_key(|d| d.0);
        assert_eq!(dead_letters(&client, LEDGER).await, expected_dead);
        let errors = one(
            &client,
            "SELECT count(*) FROM projector.dead_letters \
             WHERE kind = 'apply_failed' AND error LIKE '%ledger_qty_check%' \
             AND event_id LIKE 'bad-%'",
        )
        .await;
        assert_eq!(errors, 16, "{ordering:?}");
        assert_offsets_add_up(&client, LEDGER, log.log.len() as i64).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_a_failed_event_and_its_correction_around_a_reused_id() {
    // The correction of a failed event, in the same batch, behind a reused id: the pass is
    // split before the correction (`Work::split_point`), each part tries the plain insert.
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Ledger, ordering).await;
        let mut client = db.client().await;
        let mut log = Partition::new("fills", 0);
        log.push_event(&f(1, 1, "1").with_id("r")); // 0
        apply(&applier, &mut client, &log.batch(0, 1)).await;
        log.push_event(&f(2, 5, "1000000").with_id("c")); // 1: fails
        log.push_event(&f(3, 1, "1").with_id("r")); // 2: reused
        log.push_event(&f(2, 5, "7").with_id("c")); // 3: its correction
        log.push_event(&f(1, 1, "1").with_id("r")); // 4: republished
        log.push_event(&f(4, 1, "8").with_id("n")); // 5: new
        let out = apply(&applier, &mut client, &log.batch(1, 10)).await;
        assert_eq!(
            kinds(&out),
            [DeadLettered, Applied, Applied, Applied, Applied],
            "{ordering:?}"
        );
        assert_eq!(
            tally(&out),
            (2, 2, 0, 1, 0),
            "{ordering:?} {:?}",
            out.counts
        );
        assert_eq!(
            ledger(&client).await,
            [
                ("c".to_owned(), 2, 1),
                ("n".to_owned(), 4, 1),
                ("r".to_owned(), 1, 1)
            ],
            "{ordering:?}"
        );
        let qty: String = client
            .query_one("SELECT qty::text FROM ledger_v1 WHERE event_id = 'c'", &[])
            .await
            .expect("c")
            .get(0);
        assert_eq!(qty, "7");
        // Superseded by its correction (same account and seq).
        assert_eq!(
            dead_letters(&client, LEDGER).await,
            [(1, "apply_failed".to_owned(), false)],
            "{ordering:?}"
        );
        ledger_matches_inbox(&client).await;
        assert_offsets_add_up(&client, LEDGER, 6).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_retrying_dead_letters_whose_id_the_inbox_has_or_lacks() {
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Ledger, ordering).await;
        let mut client = db.client().await;
        let mut log = Partition::new("fills", 0);
        log.push_event(&f(1, 1, "1000000").with_id("d")); // 0: fails
        log.push_event(&f(2, 1, "1").with_id("d")); // 1: another account applies the id
        log.push_event(&f(3, 1, "1000000").with_id("e")); // 2: fails
        let out = apply(&applier, &mut client, &log.batch(0, 10)).await;
        assert_eq!(kinds(&out), [DeadLettered, Applied, DeadLettered]);
        let id_of = |offset: i64| {
            let client = &client;
            async move {
                client
                    .query_one(
                        "SELECT id FROM projector.dead_letters WHERE consumer = 'ledger_v1' \
                         AND \"offset\" = $1",
                        &[&offset],
                    )
                    .await
                    .expect("dead letter")
                    .get::<_, i64>(0)
            }
        };
        let (d, e) = (id_of(0).await, id_of(2).await);

        // d: the inbox has its id. Skipped, never written; the dead letter is resolved (as
        // the `ON CONFLICT` statement alone did).
        let (disposition, counts) = applier
            .retry_dead_letter(&mut client, d, "review")
            .await
            .expect("retry d");
        assert_eq!(disposition, Applied, "{ordering:?}");
        assert_eq!((counts.applied, counts.dup_inbox), (0, 1), "{counts:?}");

        // e still fails: it stays open with its error.
        let (disposition, counts) = applier
            .retry_dead_letter(&mut client, e, "review")
            .await
            .expect("retry e");
        assert_eq!(disposition, DeadLettered, "{ordering:?}");
        assert_eq!((counts.applied, counts.failed), (0, 1), "{counts:?}");

        // Once the view accepts it, e is applied once.
        client
            .batch_execute("ALTER TABLE ledger_v1 DROP CONSTRAINT ledger_qty_check")
            .await
            .expect("drop check");
        let (disposition, counts) = applier
            .retry_dead_letter(&mut client, e, "review")
            .await
            .expect("retry e again");
        assert_eq!(disposition, Applied, "{ordering:?}");
        assert_eq!((counts.applied, counts.dup_inbox), (1, 0), "{counts:?}");
        assert!(applier
            .retry_dead_letter(&mut client, d, "review")
            .await
            .is_err());

        assert_eq!(
            ledger(&client).await,
            [("d".to_owned(), 2, 1), ("e".to_owned(), 3, 1)],
            "{ordering:?}"
        );
        ledger_matches_inbox(&client).await;
        assert_eq!(
            dead_letters(&client, LEDGER).await,
            [
                (0, "apply_failed".to_owned(), false),
                (2, "apply_failed".to_owned(), false)
            ]
        );
        let resolutions = one(
            &client,
            "SELECT count(*) FROM projector.dead_letters WHERE resolution = 'retried'",
        )
        .await;
        assert_eq!(resolutions, 2);
        // The stream's counters are the stream's: repairs move no offset.
        assert_offsets_add_up(&client, LEDGER, 3).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_events_an_older_engine_left_waiting_drain_once() {
    // An order-independent view never parks; an older engine did. Its waiting events drain
    // with the account's next batch: one whose id the inbox has is skipped, one whose id the
    // batch repeats is applied once (the stored one goes first).
    let (db, applier) = db_with(Ledger, SourceOrdering::PerAccount).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(6, 1, "1").with_id("w1")); // 0: w1 reaches the inbox
    apply(&applier, &mut client, &log.batch(0, 1)).await;

    let mut stale = Partition::new("fills", 0);
    stale.push_event(&f(5, 3, "2").with_id("w1")); // waits, its id applied since
    stale.push_event(&f(5, 4, "3").with_id("w2")); // waits, its id new
    for (i, (seq, id)) in [(3_i64, "w1"), (4, "w2")].into_iter().enumerate() {
        let m = &stale.log[i];
        client
            .execute(
                "INSERT INTO projector.waiting_events \
                 (consumer, account_id, seq, event_id, topic, partition, \"offset\", message_key, payload) \
                 VALUES ('ledger_v1', 5, $1, $2, 'old', 0, $3, $4, $5)",
                &[&seq, &id, &(100 + i as i64), &m.key, &m.payload],
            )
            .await
            .expect("waiting");
    }
    client
        .batch_execute(
            "INSERT INTO projector.parked_accounts (consumer, account_id, reason, blocked_seq, detail) \
             VALUES ('ledger_v1', 5, 'gap', 2, 'waiting for seq 2; 2 later event(s) wait')",
        )
        .await
        .expect("park");

    log.push_event(&f(5, 5, "4").with_id("w2")); // 1: repeats a stored id
    log.push_event(&f(5, 6, "5").with_id("n")); // 2
    let out = apply(&applier, &mut client, &log.batch(1, 10)).await;
    assert_eq!(kinds(&out), [Duplicate, Applied]);
    assert_eq!(
        (out.counts.applied, out.counts.dup_inbox, out.counts.drained),
        (2, 2, 2),
        "{:?}",
        out.counts
    );
    assert_eq!(
        ledger(&client).await,
        [
            ("n".to_owned(), 5, 1),
            ("w1".to_owned(), 6, 1),
            ("w2".to_owned(), 5, 1)
        ]
    );
    let qty: String = client
        .query_one("SELECT qty::text FROM ledger_v1 WHERE event_id = 'w2'", &[])
        .await
        .expect("w2")
        .get(0);
    assert_eq!(qty, "3", "the stored event goes first");
    ledger_matches_inbox(&client).await;
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.waiting_events").await,
        0
    );
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
        0
    );
    assert_offsets_add_up(&client, LEDGER, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_the_rebuild_watermark_and_republished_ids() {
    // A rebuilt version's watermark drops what the snapshot holds; above it, republished
    // and repeated ids meet the plain insert.
    let (db, applier) = db_with(Ledger, SourceOrdering::PerAccount).await;
    let mut client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO projector.account_progress (consumer, account_id, last_seq, watermark_seq) \
             VALUES ('ledger_v1', 1, 2, 2)",
        )
        .await
        .expect("watermark");
    let mut log = Partition::new("fills", 0);
    let events = [
        f(1, 1, "1"),
        f(1, 2, "2"),
        f(1, 3, "3"),
        f(1, 3, "3"),
        f(2, 1, "4"),
        f(1, 4, "5").with_id("fill_executed-2-1"),
    ];
    for e in &events {
        log.push_event(e);
    }
    let out = apply(&applier, &mut client, &log.batch(0, 10)).await;
    use Disposition::BelowWatermark as Below;
    // Within a batch the repeat of an id is judged in account order, not offset order
    // (`Work::mark_repeated_ids` walks the accounts sorted): account 1's event keeps the id.
    assert_eq!(
        kinds(&out),
        [Below, Below, Applied, Duplicate, Duplicate, Applied]
    );
    assert_eq!(
        (
            out.counts.applied,
            out.counts.dup_inbox,
            out.counts.dup_watermark
        ),
        (2, 2, 2)
    );
    for e in &events {
        log.push_event(e);
    }
    let out = apply(&applier, &mut client, &log.batch(6, 10)).await;
    assert_eq!(
        (
            out.counts.applied,
            out.counts.dup_inbox,
            out.counts.dup_watermark
        ),
        (0, 4, 2)
    );
    assert_eq!(
        ledger(&client).await,
        [
            ("fill_executed-1-3".to_owned(), 1, 1),
            ("fill_executed-2-1".to_owned(), 1, 1)
        ]
    );
    ledger_matches_inbox(&client).await;
    assert_offsets_add_up(&client, LEDGER, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_a_concurrent_writer_of_the_same_id_beside_a_failing_event() {
    // Writer A holds an uncommitted inbox row; writer B's batch (another partition) has the
    // same id, a new event and a failing one: B waits, then skips the id (A committed) or
    // applies it (A rolled back), and dead-letters exactly the failing event.
    for ordering in ORDERINGS {
        for a_commits in [true, false] {
            let (db, applier) = db_with(Ledger, ordering).await;
            let mut a = db.client().await;
            let mut p0 = Partition::new("fills", 0);
            p0.push_event(&f(1, 1, "1").with_id("shared"));
            let mut p1 = Partition::new("fills", 1);
            p1.push_event(&f(2, 1, "2"));
            p1.push_event(&f(2, 2, "3").with_id("shared"));
            p1.push_event(&f(2, 3, "1000000"));

            applier
                .make_days_for(&mut a, &p0.batch(0, 10))
                .await
                .expect("the inbox's days");
            let mut tx = a.transaction().await.expect("begin");
            let held = applier
                .apply_in(&mut tx, &p0.batch(0, 10))
                .await
                .expect("A");
            assert_eq!(kinds(&held), [Applied]);
            let b_task = spawn_apply(&applier, &db, p1.batch(0, 10));
            let observer = db.client().await;
            lock_waiters(&observer, 1).await;
            if a_commits {
                tx.commit().await.expect("commit A");
            } else {
                tx.rollback().await.expect("rollback A");
            }
            let b = b_task.await.expect("B");
            assert_eq!(kinds(&b), [Applied, Applied, DeadLettered]);
            assert_eq!(
                tally(&b),
                if a_commits {
                    (1, 1, 0, 1, 0)
                } else {
                    (2, 0, 0, 1, 0)
                },
                "{ordering:?} {a_commits} {:?}",
                b.counts
            );
            let shared_account = if a_commits { 1 } else { 2 };
            assert_eq!(
                ledger(&observer).await,
                [
                    ("fill_executed-2-1".to_owned(), 2, 1),
                    ("shared".to_owned(), shared_account, 1)
                ],
                "{ordering:?} {a_commits}"
            );
            ledger_matches_inbox(&observer).await;
            assert_eq!(
                dead_letters(&observer, LEDGER).await,
                [(2, "apply_failed".to_owned(), true)]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_a_writer_whose_first_try_rolls_back_frees_the_id_it_held() {
    // A's plain insert has written its first inbox row (s) when its statement waits on a
    // view row; B (another partition) waits on s. A then fails on a reused id and rolls its
    // first try back: s is free, B takes it, A's retry skips it. Before the change A wrote s
    // for good and B skipped it. Either way s is applied exactly once.
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Tally::new(1), ordering).await;
        let mut client = db.client().await;
        let mut p0 = Partition::new("fills", 0);
        p0.push_event(&f(1, 1, "1").with_id("r")); // 0: r reaches the inbox, account 1's row
        apply(&applier, &mut client, &p0.batch(0, 1)).await;
        p0.push_event(&f(1, 2, "2").with_id("s")); // 1: new, first in the batch
        p0.push_event(&f(1, 3, "1").with_id("r")); // 2: reused
        let mut p1 = Partition::new("fills", 1);
        p1.push_event(&f(2, 1, "4").with_id("s")); // 0: the same id, account 2

        let observer = db.client().await;
        let mut holder = db.client().await;
        let hold = holder.transaction().await.expect("begin");
        hold.execute(
            "SELECT 1 FROM tally_v1 WHERE account_id = 1 FOR UPDATE",
            &[],
        )
        .await
        .expect("lock");
        let a = spawn_apply(&applier, &db, p0.batch(1, 10));
        lock_waiters(&observer, 1).await;
        let b = spawn_apply(&applier, &db, p1.batch(0, 10));
        lock_waiters(&observer, 2).await;
        hold.commit().await.expect("release");
        let (a, b) = (a.await.expect("A"), b.await.expect("B"));

        let (a, b) = (a.counts, b.counts);
        assert_eq!(a.applied + b.applied, 1, "{ordering:?} {a:?} {b:?}");
        assert_eq!(a.dup_inbox + b.dup_inbox, 2, "{ordering:?} {a:?} {b:?}");
        let mut all = vec![f(1, 1, "1").with_id("r")];
        if a.applied == 1 {
            all.push(f(1, 2, "2").with_id("s"));
        } else {
            all.push(f(2, 1, "4").with_id("s"));
        }
        assert_eq!(rows(&observer, "tally_v1").await, tally_fold(&all));
        assert_eq!(
            one(
                &observer,
                "SELECT count(*) FROM projector.inbox WHERE consumer = 'tally_v1'"
            )
            .await,
            2
        );
        assert_offsets_add_up(&observer, "tally_v1", 4).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_two_writers_that_deadlock_on_the_plain_inserts_lock_order() {
    // The plain insert writes its first inbox row, then the view's rows, then the rest of
    // its inbox rows (the EXISTS reads one row of `fresh`; PostgreSQL finishes the insert at
    // the end of the statement). A holds account 1's row and needs s; B holds s and needs
    // account 1's row: a deadlock, which the `ON CONFLICT` statement (all inbox rows first)
    // did not have. The victim's first try fails (40P01) and the careful path applies its
    // batch; the outcome is still exactly once.
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Tally::new(1), ordering).await;
        let mut client = db.client().await;
        // The statement sends a batch's events in account order: A's first inbox row is a1,
        // then account 5's row (held below), then x and s; B's first is s, then account 5.
        let mut p0 = Partition::new("fills", 0);
        p0.push_event(&f(5, 1, "1").with_id("seed")); // 0: account 5's row
        apply(&applier, &mut client, &p0.batch(0, 1)).await;
        p0.push_event(&f(1, 1, "2").with_id("a1")); // 1
        p0.push_event(&f(5, 2, "3").with_id("x")); // 2: account 5
        p0.push_event(&f(8, 1, "4").with_id("s")); // 3: s
        let mut p1 = Partition::new("fills", 1);
        p1.push_event(&f(2, 1, "5").with_id("s")); // 0: s
        p1.push_event(&f(5, 3, "6").with_id("b1")); // 1: account 5

        let observer = db.client().await;
        let mut holder = db.client().await;
        let hold = holder.transaction().await.expect("begin");
        hold.execute(
            "SELECT 1 FROM tally_v1 WHERE account_id = 5 FOR UPDATE",
            &[],
        )
        .await
        .expect("lock");
        let a = spawn_apply(&applier, &db, p0.batch(1, 10));
        lock_waiters(&observer, 1).await;
        let b = spawn_apply(&applier, &db, p1.batch(0, 10));
        lock_waiters(&observer, 2).await;
        hold.commit().await.expect("release");
        let (a, b) = (a.await.expect("A"), b.await.expect("B"));
        let (a, b) = (a.counts, b.counts);
        assert_eq!(a.applied + b.applied, 4, "{ordering:?} {a:?} {b:?}");
        assert_eq!(a.dup_inbox + b.dup_inbox, 1, "{ordering:?} {a:?} {b:?}");
        let mut all = vec![
            f(5, 1, "1").with_id("seed"),
            f(1, 1, "2").with_id("a1"),
            f(5, 2, "3").with_id("x"),
            f(5, 3, "6").with_id("b1"),
        ];
        if a.applied == 3 {
            all.push(f(8, 1, "4").with_id("s"));
        } else {
            all.push(f(2, 1, "5").with_id("s"));
        }
        assert_eq!(rows(&observer, "tally_v1").await, tally_fold(&all));
        assert_offsets_add_up(&observer, "tally_v1", 6).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_the_plain_insert_writes_every_inbox_row_before_the_view_rows() {
    // The lock order the deadlock above came from: the plain insert's `ev` read one row of
    // `fresh`, so the view's rows were written before the rest of the inbox rows. Every
    // inbox row must be in (and locked) before the statement touches a view row, as with
    // `ON CONFLICT`. A waits on account 1's view row; by then it must hold the inbox row of
    // its second event, so a probe inserting that id waits for A (and times out) instead of
    // getting in first.
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Tally::new(1), ordering).await;
        let applier = Arc::new(applier);
        let mut client = db.client().await;
        let mut p0 = Partition::new("fills", 0);
        p0.push_event(&f(1, 1, "1").with_id("seed"));
        apply(&applier, &mut client, &p0.batch(0, 1)).await;
        p0.push_event(&f(1, 2, "2").with_id("a1"));
        p0.push_event(&f(8, 1, "3").with_id("s"));

        let observer = db.client().await;
        let mut holder = db.client().await;
        let hold = holder.transaction().await.expect("begin");
        hold.execute(
            "SELECT 1 FROM tally_v1 WHERE account_id = 1 FOR UPDATE",
            &[],
        )
        .await
        .expect("lock");
        let a = spawn_apply(&applier, &db, p0.batch(1, 10));
        lock_waiters(&observer, 1).await;

        let mut prober = db.client().await;
        let probe = prober.transaction().await.expect("begin probe");
        probe
            .batch_execute("SET LOCAL lock_timeout = '200ms'")
            .await
            .expect("lock_timeout");
        let got_in = probe
            .execute(
                "INSERT INTO projector.inbox (consumer, occurred_at, event_id) \
                 VALUES ('tally_v1', $1::text::timestamptz, 's') ON CONFLICT DO NOTHING",
                &[&AT],
            )
            .await;
        let code = got_in.as_ref().err().and_then(|e| e.code()).cloned();
        assert_eq!(
            code,
            Some(tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
            "{ordering:?}: the probe should wait on A's inbox row of s, got {got_in:?}"
        );
        probe.rollback().await.expect("rollback probe");
        hold.commit().await.expect("release");
        let a = a.await.expect("A");
        assert_eq!(
            (a.counts.applied, a.counts.dup_inbox),
            (2, 0),
            "{ordering:?}"
        );
        let all = [
            f(1, 1, "1").with_id("seed"),
            f(1, 2, "2").with_id("a1"),
            f(8, 1, "3").with_id("s"),
        ];
        assert_eq!(rows(&observer, "tally_v1").await, tally_fold(&all));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_eod_matches_its_fold_of_distinct_events() {
    // The built-in eod, typed fields and all, fed republished, repeated and reused ids and
    // ids first carried by a type it ignores, in several batches, on both source orderings:
    // its rows are those of the distinct events applied once, in one batch, elsewhere.
    for ordering in ORDERINGS {
        let (db, applier) = db_with(projector_views::Eod::new(1), ordering).await;
        let (oracle_db, oracle) = db_with(projector_views::Eod::new(1), ordering).await;
        let mut client = db.client().await;
        let mut oracle_client = oracle_db.client().await;
        let day2 = "2026-11-30T09:00:00Z";
        let base = crate::support::fills(3, 3);
        let memo = |account: i64, seq: i64, id: &str| {
            EventSpec::new("memo", account, seq, AT, serde_json::json!({"note": "n"})).with_id(id)
        };
        let mut feed: Vec<EventSpec> = base.clone();
        feed.extend(base[..4].iter().cloned()); // republished
        feed.push(memo(1, 10, "m1")); // ignored type first
        feed.push(fill(1, 11, day2, "EURUSD", "sell", "2", "1.2", "0.1").with_id("m1"));
        feed.push(cash(2, 10, day2, "-30", "fee").with_id("c1"));
        feed.push(cash(3, 10, day2, "30", "deposit").with_id("c1")); // repeated, other account
        feed.push(projector_engine::testkit::bust(&base[0], 12, day2));
        feed.extend(base[4..].iter().cloned()); // republished
                                                // An id of the first day reused on the second: to the inbox, keyed by id and
                                                // occurred_at, another event, which an order-independent view applies.
        feed.push(fill(2, 13, day2, "EURUSD", "buy", "5", "1.1", "0").with_id(&base[1].event_id));

        let mut log = Partition::new("fills", 0);
        for e in &feed {
            log.push_event(e);
        }
        let mut start = 0_i64;
        for len in [5_usize, 7, 1, 9, 100] {
            let out = apply(&applier, &mut client, &log.batch(start, len)).await;
            start = out.next_offset;
        }
        assert_eq!(start, feed.len() as i64);

        let subscribed = ["fill_executed", "fill_busted", "cash_adjusted"];
        let mut seen = std::collections::HashSet::new();
        let distinct: Vec<EventSpec> = feed
            .iter()
            .filter(|e| subscribed.contains(&e.event_type.as_str()))
            .filter(|e| seen.insert((e.event_id.clone(), e.occurred_at.clone())))
            .cloned()
            .collect();
        let once = Partition::from_events("fills", 0, &distinct);
        let out = apply(&oracle, &mut oracle_client, &once.batch(0, 1000)).await;
        assert_eq!(out.counts.applied, distinct.len() as u64);
        assert_eq!(
            rows(&client, "eod_v1").await,
            rows(&oracle_client, "eod_v1").await,
            "{ordering:?}"
        );
        let o = offsets(&client, "eod_v1").await;
        assert_eq!(o.applied, distinct.len() as i64, "{o:?}");
        assert_eq!(o.ignored, 1, "{o:?}");
        assert_eq!(o.accounted(), feed.len() as i64, "{o:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_an_order_independent_view_emits_once_per_event() {
    // A first try that fails on a reused id has emitted notices for every event of the batch
    // (`ev` is the whole batch); they roll back with it, and the retry emits for the new
    // events only.
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Noisy, ordering).await;
        let mut client = db.client().await;
        let mut log = Partition::new("fills", 0);
        for e in [f(1, 1, "1"), f(2, 1, "2"), f(3, 1, "3")] {
            log.push_event(&e);
        }
        let out = apply(&applier, &mut client, &log.batch(0, 10)).await;
        assert_eq!((out.counts.applied, out.counts.notices), (3, 3));
        log.push_event(&f(4, 1, "4")); // 3: new
        log.push_event(&f(1, 1, "1")); // 4: republished
        log.push_event(&f(5, 1, "5").with_id("fill_executed-2-1")); // 5: reused
        log.push_event(&f(6, 1, "1000000")); // 6: fails
        log.push_event(&f(7, 1, "7").with_id("k")); // 7: new
        log.push_event(&f(8, 1, "8").with_id("k")); // 8: repeated
        let out = apply(&applier, &mut client, &log.batch(3, 10)).await;
        assert_eq!(
            kinds(&out),
            [Applied, Applied, Applied, DeadLettered, Applied, Duplicate],
            "{ordering:?}"
        );
        assert_eq!(
            (
                out.counts.applied,
                out.counts.dup_inbox,
                out.counts.failed,
                out.counts.notices
            ),
            (2, 3, 1, 2),
            "{ordering:?} {:?}",
            out.counts
        );
        let notices = client
            .query(
                "SELECT event_id, account_id FROM projector.notices ORDER BY event_id",
                &[],
            )
            .await
            .expect("notices")
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
            .collect::<Vec<_>>();
        assert_eq!(
            notices,
            [
                ("fill_executed-1-1".to_owned(), 1),
                ("fill_executed-2-1".to_owned(), 2),
                ("fill_executed-3-1".to_owned(), 3),
                ("fill_executed-4-1".to_owned(), 4),
                ("k".to_owned(), 7)
            ],
            "{ordering:?}"
        );
        assert_offsets_add_up(&client, "noisy_v1", 9).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_random_republishes_poison_failures_and_crashes_apply_each_id_once() {
    // A random log: new events, exact republishes of earlier ones (near or far), events the
    // view's statement refuses (and their republishes), undecodable messages; consumed in
    // batches of several sizes, with crashes between apply and commit (the batch is
    // redelivered). Every sound id is applied exactly once, no refused one ever.
    use projector_engine::testkit::{consume_with_crashes, Lcg};
    for ordering in ORDERINGS {
        for (seed, batch_len) in [(1_u64, 1_usize), (2, 7), (3, 32), (4, 500)] {
            let (db, applier) = db_with(Ledger, ordering).await;
            let mut client = db.client().await;
            let mut rng = Lcg(seed);
            let mut log = Partition::new("fills", 0);
            let mut published: Vec<EventSpec> = Vec::new();
            let mut sound = std::collections::BTreeSet::new();
            let mut refused = std::collections::BTreeSet::new();
            let mut next_seq = std::collections::HashMap::new();
            while log.log.len() < 300 {
                let roll = rng.below(100);
                if roll < 30 && !published.is_empty() {
                    let near = published.len().saturating_sub(1 + rng.below(12));
                    let i = if rng.chance(50) {
                        near
                    } else {
                        rng.below(published.len())
                    };
                    log.push_event(&published[i].clone());
                } else if roll < 35 {
                    log.push_raw(Some(b"1".to_vec()), b"{\"not\": \"an event\"}".to_vec());
                } else {
                    let account = 1 + rng.int(6);
                    let seq = next_seq.entry(account).or_insert(0_i64);
                    *seq += 1;
                    let bad = rng.chance(8);
                    let qty = if bad {
                        "1000000".to_owned()
                    } else {
                        format!("{}.{}", 1 + rng.int(50), rng.int(10))
                    };
                    let e = f(account, *seq, &qty);
                    if bad {
                        refused.insert(e.event_id.clone());
                    } else {
                        sound.insert(e.event_id.clone());
                    }
                    log.push_event(&e);
                    published.push(e);
                }
            }
            consume_with_crashes(&applier, &mut client, &log, batch_len, |_| rng.chance(25)).await;
            let applied: Vec<String> = ledger(&client)
                .await
                .into_iter()
                .map(|(id, _, n)| {
                    assert_eq!(n, 1, "{ordering:?} seed {seed}: {id} applied {n} times");
                    id
                })
                .collect();
            let expected: Vec<String> = sound.iter().cloned().collect();
            assert_eq!(applied, expected, "{ordering:?} seed {seed}");
            ledger_matches_inbox(&client).await;
            let open_refused = one(
                &client,
                "SELECT count(DISTINCT event_id) FROM projector.dead_letters \
                 WHERE kind = 'apply_failed'",
            )
            .await;
            assert_eq!(
                open_refused,
                refused.len() as i64,
                "{ordering:?} seed {seed}"
            );
            let o = offsets(&client, LEDGER).await;
            assert_eq!(
                o.applied,
                sound.len() as i64,
                "{ordering:?} seed {seed} {o:?}"
            );
            assert_eq!(o.accounted(), log.log.len() as i64, "{o:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known gap: inside a batch the lowest account's event keeps a reused id, across batches the first by offset; ranking by offset (tried) lost a waiting event whose first carrier failed (tests/it/reused_ids_first_carrier.rs)"]
async fn unordered_inbox_the_first_of_two_events_sharing_an_id_wins_whatever_the_batching() {
    // Two different events under one id (a producer bug): the inbox keeps the first one.
    // Across batches the first by offset wins; inside one batch `Work::mark_repeated_ids`
    // keeps the one of the lowest account, so a live view and a rebuild of it (other batch
    // boundaries) can keep different events.
    let feed = [f(5, 1, "1").with_id("z"), f(3, 1, "2").with_id("z")];
    let mut seen = Vec::new();
    for batch_len in [1_usize, 2] {
        let (db, applier) = db_with(Tally::new(1), SourceOrdering::PerAccount).await;
        let mut client = db.client().await;
        let log = Partition::from_events("fills", 0, &feed);
        projector_engine::testkit::consume(&applier, &mut client, &log, batch_len).await;
        seen.push(rows(&client, "tally_v1").await);
    }
    assert_eq!(seen[0], tally_fold(&feed), "one event per batch");
    assert_eq!(seen[1], seen[0], "both events in one batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_inbox_a_failed_event_and_its_identical_copy_in_one_batch_leave_it_open() {
    // An order-independent view emits both copies (no seq tracking); the second is a repeat
    // of the first's id, not sent to the statement, but still among the account's emitted
    // events, and the bookkeeping marks every emitted event that did not fail as holding its
    // (account, seq) (`RESOLVE_SUPERSEDED`). So the failed event's dead letter, written in
    // the same pipeline, is resolved "superseded: a later event for the same seq was
    // applied" although nothing was: the event is in neither the view nor the open dead
    // letters.
    let mut seen = Vec::new();
    for ordering in ORDERINGS {
        let (db, applier) = db_with(Ledger, ordering).await;
        let mut client = db.client().await;
        let mut log = Partition::new("fills", 0);
        let e = f(1, 1, "1000000");
        log.push_event(&e);
        log.push_event(&e);
        let out = apply(&applier, &mut client, &log.batch(0, 10)).await;
        assert_eq!(kinds(&out), [DeadLettered, Duplicate], "{ordering:?}");
        assert!(ledger(&client).await.is_empty());
        let resolution: Option<String> = client
            .query_one("SELECT resolution FROM projector.dead_letters", &[])
            .await
            .expect("dead letter")
            .get(0);
        seen.push((ordering, dead_letters(&client, LEDGER).await, resolution));
    }
    for (ordering, dead, resolution) in &seen {
        assert_eq!(
            (dead.as_slice(), resolution.as_deref()),
            (&[(0, "apply_failed".to_owned(), true)][..], None),
            "{ordering:?}: the failed event's dead letter must stay open; all: {seen:?}"
        );
    }
}
