//! The inbox by day under adversarial input and operations: `occurred_at` at the edges of
//! what the wire format accepts (the last day of year 9999, fractions below PostgreSQL's
//! microsecond), events older than every day kept, a binary from before the layout still
//! deleting rows, and a prune stopped between its detach and its drop.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};

use projector_engine::inbox;
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Disposition, Registry, SourceOrdering};

use crate::support::{offsets, rows, tally_fold, Tally, Trail};

/// The event stamped with `occurred_at` exactly as written (the wire format takes any RFC 3339
/// fraction).
fn stamped(mut e: EventSpec, occurred_at: &str) -> EventSpec {
    e.occurred_at = occurred_at.to_owned();
    e
}

async fn attached(client: &deadpool_postgres::Client) -> BTreeSet<NaiveDate> {
    inbox::partitions(client)
        .await
        .expect("partitions")
        .into_iter()
        .filter(|p| p.attachment == inbox::Attachment::Attached)
        .map(|p| p.day)
        .collect()
}

async fn server_now(client: &deadpool_postgres::Client) -> DateTime<Utc> {
    client
        .query_one("SELECT now()", &[])
        .await
        .expect("now")
        .get(0)
}

/// Applies `batch` the way a worker does: a retryable error is tried again, a few times.
async fn apply_retrying(
    applier: &Applier,
    client: &mut deadpool_postgres::Client,
    batch: &projector_engine::Batch,
) -> Result<projector_engine::BatchOutcome, String> {
    let mut last = String::new();
    for _ in 0..5 {
        match applier.apply(client, batch).await {
            Ok(out) => return Ok(out),
            Err(e) if e.is_retryable() => last = e.to_string(),
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(last)
}

/// The wire format takes any year from 1 to 9999, so an event may occur on 9999-12-31: its
/// day ends at the first moment of year 10000, a bound the partition's DDL must still be able
/// to name. The event is applied once; it never stops its view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_on_the_last_day_of_year_9999_is_applied_once() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let e = stamped(
        fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"),
        "9999-12-31T12:00:00Z",
    );
    let log = Partition::from_events("fills", 0, [&e, &e]);
    let applier = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    let out = apply_retrying(&applier, &mut client, &log.batch(0, 1))
        .await
        .expect("the view goes on");
    assert_eq!(out.counts.applied, 1);
    let out = apply_retrying(&applier, &mut client, &log.batch(1, 1))
        .await
        .expect("the copy");
    assert_eq!(out.counts.dup_inbox, 1);
    assert_eq!(rows(&client, "tally_v1").await, tally_fold(&[e]));
}

/// A producer that writes seven or nine fractional digits (.NET's round-trip format, Java's
/// `Instant`) sends an event PostgreSQL keys to the microsecond. An exact copy of it (the same
/// bytes, republished by a relay) is a duplicate to an order-dependent view, as it is with
/// three digits: never a conflict dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_copy_stamped_in_nanoseconds_is_a_duplicate_for_an_order_dependent_view() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let events: Vec<EventSpec> = (1..=3)
        .map(|seq| {
            stamped(
                fill(1, seq, "", "EURUSD", "buy", "1", "1", "0"),
                &format!("2026-11-29T10:15:0{seq}.123456789Z"),
            )
        })
        .collect();
    let mut log = Partition::from_events("fills", 0, &events);
    let applier = Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("app");
    let out = applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("apply");
    assert_eq!(out.counts.applied, 3);
    // The relay republishes an older event and the account's last one, byte for byte.
    log.push_event(&events[0]);
    log.push_event(&events[2]);
    let out = applier
        .apply(&mut client, &log.batch(3, 10))
        .await
        .expect("the copies");
    assert_eq!(
        out.dispositions.iter().map(|(_, d)| *d).collect::<Vec<_>>(),
        [Disposition::Duplicate, Disposition::Duplicate],
        "{:?}",
        client
            .query("SELECT error FROM projector.dead_letters", &[])
            .await
            .expect("dead letters")
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
    );
    let o = offsets(&client, "trail_v1").await;
    assert_eq!((o.duplicates, o.dead_lettered), (2, 0), "{o:?}");
}

/// An outbox that keeps `occurred_at` in a `timestamptz` republishes an event stamped to the
/// microsecond that the producer first sent in nanoseconds: to PostgreSQL's key both copies
/// are one event. An order-independent view folds them the same whether they arrive in one
/// batch or in two (exactly-once effect holds for any delivery schedule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_apart_by_less_than_a_microsecond_fold_the_same_in_one_batch_or_two() {
    let first = stamped(
        fill(1, 1, "", "EURUSD", "buy", "5", "1", "0"),
        "2026-11-29T10:15:00.123456789Z",
    );
    let republished = stamped(first.clone(), "2026-11-29T10:15:00.123456Z");
    let log = Partition::from_events("fills", 0, [&first, &republished]);
    let mut folds = Vec::new();
    for batch_len in [2usize, 1] {
        let registry = Registry::new().register(Tally::new(1)).expect("registry");
        let db = TestDb::new(&registry).await;
        let mut client = db.client().await;
        let applier =
            Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
        let mut at = 0;
        while at < 2 {
            at = applier
                .apply(&mut client, &log.batch(at, batch_len))
                .await
                .expect("apply")
                .next_offset;
        }
        folds.push(rows(&client, "tally_v1").await);
    }
    assert_eq!(folds[0], folds[1], "one batch, then two batches");
}

/// Before 2000 a fraction below the microsecond rounds towards 2000 on its way to PostgreSQL,
/// so an event a tenth of a microsecond before a midnight is routed to the next day's
/// partition while the engine makes the day it computed. The event is applied all the same;
/// its view does not stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_a_fraction_of_a_microsecond_before_a_midnight_before_2000_is_applied() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let e = stamped(
        fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"),
        "1999-12-31T23:59:59.9999999Z",
    );
    let log = Partition::from_events("fills", 0, [&e]);
    let applier = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    let out = apply_retrying(&applier, &mut client, &log.batch(0, 1))
        .await
        .expect("the view goes on");
    assert_eq!(out.counts.applied, 1);
    assert_eq!(rows(&client, "tally_v1").await, tally_fold(&[e]));
}

/// An event whose day is older than every day the inbox keeps is outside the retained window
/// and counted, also when its day lies just before the oldest day kept: making its day for it
/// does not bring it inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_a_day_older_than_every_day_kept_is_counted_outside_the_window() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = server_now(&client).await;
    let oldest = *attached(&client)
        .await
        .first()
        .expect("days made by migrate");
    let before = oldest
        .pred_opt()
        .expect("a day")
        .and_hms_opt(12, 0, 0)
        .expect("noon")
        .and_utc();
    assert!(before < now);
    let e = stamped(
        fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"),
        &before.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    );
    let log = Partition::from_events("fills", 0, [&e]);
    let applier = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    let out = applier
        .apply(&mut client, &log.batch(0, 1))
        .await
        .expect("apply");
    assert_eq!(out.counts.applied, 1);
    assert_eq!(out.counts.outside_window, 1, "older than every day kept");
}

/// RFC 3339 lets a producer name a leap second (`23:59:60`); the event belongs to the day
/// whose last second it is, and is applied once without stopping its view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stamped_in_a_leap_second_is_applied_once() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let e = stamped(
        fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"),
        "2016-12-31T23:59:60.5Z",
    );
    let log = Partition::from_events("fills", 0, [&e, &e]);
    let applier = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    let out = apply_retrying(&applier, &mut client, &log.batch(0, 1))
        .await
        .expect("the view goes on");
    assert_eq!(out.counts.applied, 1);
    let out = apply_retrying(&applier, &mut client, &log.batch(1, 1))
        .await
        .expect("the copy");
    assert_eq!(out.counts.dup_inbox, 1);
    assert_eq!(rows(&client, "tally_v1").await, tally_fold(&[e]));
}

/// Rows of `consumer` in the inbox.
async fn inbox_rows(client: &deadpool_postgres::Client, consumer: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM projector.inbox WHERE consumer = $1",
            &[&consumer],
        )
        .await
        .expect("count")
        .get(0)
}

/// A binary from before V0009 still running through a rolling upgrade (its `retire --drop`,
/// its `inbox prune` from cron) deletes inbox rows by `ctid`, which names a row only within one
/// table: on the inbox by day it would take the rows of other consumers, in other days, that
/// sit at the same place in their own table, and with them their dedup. The layout refuses
/// such a delete as it refuses such a binary's insert: every other consumer keeps its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_from_before_the_layout_cannot_delete_another_consumers_inbox_rows() {
    let db = TestDb::new(&Registry::new()).await;
    let client = db.client().await;
    let today = inbox::day_of(server_now(&client).await);
    let yesterday = today.pred_opt().expect("a day");
    let noon = |d: NaiveDate| d.and_hms_opt(12, 0, 0).expect("noon").and_utc();
    // The first row of two days: each at ctid (0,1) of its own table.
    for (consumer, day) in [("eod_v1", yesterday), ("eod_v2", today)] {
        client
            .execute(
                "INSERT INTO projector.inbox (consumer, occurred_at, event_id) VALUES ($1, $2, 'e1')",
                &[&consumer, &noon(day)],
            )
            .await
            .expect("a row");
    }
    // What a binary from before the move runs (rebuild/src/cutover.rs, engine/src/ops/prune.rs
    // before V0009): `retire --drop eod v2`, and a prune of eod_v2's rows.
    let old_drop = "DELETE FROM projector.inbox WHERE ctid = ANY(ARRAY( \
                    SELECT ctid FROM projector.inbox WHERE consumer = $1 LIMIT 10000))";
    let old_prune = "WITH doomed AS ( \
             SELECT ctid FROM projector.inbox \
             WHERE applied_at < $1 AND applied_at >= $2 \
               AND applied_at < ($4::timestamptz[])[array_position($3::text[], consumer::text)] \
             ORDER BY applied_at LIMIT $5), \
         deleted AS ( \
             DELETE FROM projector.inbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed)) \
             RETURNING consumer, applied_at) \
         SELECT consumer::text, count(*), max(applied_at) FROM deleted GROUP BY consumer";
    let far = Utc::now() + chrono::Duration::days(1);
    let long_ago = Utc::now() - chrono::Duration::days(1000);
    let _ = client.execute(old_drop, &[&"eod_v2"]).await;
    assert_eq!(
        inbox_rows(&client, "eod_v1").await,
        1,
        "the old drop of eod_v2"
    );
    let _ = client
        .query(
            old_prune,
            &[
                &far,
                &long_ago,
                &vec!["eod_v2".to_owned()],
                &vec![far],
                &10_000i64,
            ],
        )
        .await;
    assert_eq!(
        inbox_rows(&client, "eod_v1").await,
        1,
        "the old prune of eod_v2"
    );
}

/// A prune killed between its `DETACH ... CONCURRENTLY` and its `DROP` leaves the day's table
/// detached; `retire --drop` (or a rebuild's cancel, which frees the version number for the
/// next rebuild) then deletes the version's rows from the inbox it can see, not from that
/// table. The next prune attaches the day again, rows and all: a dropped version keeps no
/// row in the inbox (none to make a rebuild under its number skip an event, none to hold a day
/// for ever for a consumer that will never commit again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_version_has_no_rows_in_a_day_a_stopped_prune_left_detached() {
    use projector_engine::ops::{clock, prune};
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let old = server_now(&client).await - chrono::Duration::days(20);
    let day = inbox::day_of(old);
    let events: Vec<EventSpec> = (1..=3)
        .map(|seq| {
            stamped(
                fill(1, seq, "", "EURUSD", "buy", "1", "1", "0"),
                &old.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            )
        })
        .collect();
    let view: Arc<dyn projector_engine::Projection> = Arc::new(Trail::new(1));
    let applier = Applier::new(Arc::clone(&view), SourceOrdering::PerAccount).expect("app");
    applier
        .apply(
            &mut client,
            &Partition::from_events("fills", 0, &events).batch(0, 10),
        )
        .await
        .expect("apply");
    assert_eq!(inbox_rows(&client, "trail_v1").await, 3);
    // What a prune killed after its detach leaves behind.
    client
        .batch_execute(&format!(
            "ALTER TABLE projector.inbox DETACH PARTITION projector.{} CONCURRENTLY",
            inbox::partition_name(day)
        ))
        .await
        .expect("the stopped prune's detach");
    projector_rebuild::cutover::drop_version(&mut client, &view)
        .await
        .expect("drop the version");
    assert_eq!(inbox_rows(&client, "trail_v1").await, 0);
    // The next prune (every consumer's clock read as the CLI reads them).
    let options = prune::PruneOptions::default();
    for _ in 0..2 {
        let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
        prune::prune_inbox(&mut client, &options, &clocks, |_| {})
            .await
            .expect("prune");
    }
    assert_eq!(
        inbox_rows(&client, "trail_v1").await,
        0,
        "rows of the dropped version, back in the inbox; days: {:?}",
        inbox::partitions(&client)
            .await
            .expect("partitions")
            .into_iter()
            .filter(|p| p.day == day)
            .collect::<Vec<_>>()
    );
}

/// An order-dependent view knows the event that holds each account's last `seq` by its id
/// (`projector.account_progress.last_event_id`), whatever retention did to the inbox. A
/// byte-for-byte copy of that event, arriving after its day was dropped, is a duplicate, as it
/// was before the layout; never a conflict dead letter blaming the write side for a time it
/// did not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_an_accounts_last_event_after_its_day_was_dropped_is_a_duplicate() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let old = server_now(&client).await - chrono::Duration::days(20);
    let events: Vec<EventSpec> = (1..=2)
        .map(|seq| {
            stamped(
                fill(1, seq, "", "EURUSD", "buy", "1", "1", "0"),
                &old.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            )
        })
        .collect();
    let mut log = Partition::from_events("fills", 0, &events);
    let applier = Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("app");
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("apply");
    // Retention takes the day (what `inbox prune` does once every clock is a window past it).
    let table = inbox::partition_name(inbox::day_of(old));
    client
        .batch_execute(&format!(
            "ALTER TABLE projector.inbox DETACH PARTITION projector.{table}; DROP TABLE projector.{table}"
        ))
        .await
        .expect("drop the day");
    log.push_event(&events[1]);
    let out = applier
        .apply(&mut client, &log.batch(2, 10))
        .await
        .expect("the copy");
    let errors: Vec<String> = client
        .query("SELECT error FROM projector.dead_letters", &[])
        .await
        .expect("dead letters")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        out.dispositions.iter().map(|(_, d)| *d).collect::<Vec<_>>(),
        [Disposition::Duplicate],
        "{errors:?}"
    );
}
