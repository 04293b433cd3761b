//! The inbox by day (V0009) at its edges, beside `inbox_layout.rs`: `occurred_at` at the
//! edges of what the wire format accepts (year 1, the last day of year 9999, fractions below
//! PostgreSQL's microsecond, a leap second, the same moment written in other zones), events
//! older than every day kept, a binary from before the layout still deleting rows, what
//! `status` says of the days ahead when no process makes them, and a prune that detaches or
//! drops a day while a batch writes into it, is stopped between its detach and its drop, or
//! drops a day under a process that still believes in it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};

use projector_devkit::devbroker::DevBroker;
use projector_engine::inbox;
use projector_engine::ops::prune::{prune_inbox, DayOutcome, PruneOptions};
use projector_engine::ops::status::{collect, StatusOptions};
use projector_engine::ops::{clock, ProblemKind, TopicProbe};
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Disposition, Registry, SourceOrdering};

use crate::support::kafka::config;
use crate::support::{lock_waiters, offsets, rows, tally_fold, Tally, Trail};

/// The event stamped with `occurred_at` exactly as written (the wire format takes any RFC 3339
/// fraction).
fn stamped(mut e: EventSpec, occurred_at: &str) -> EventSpec {
    e.occurred_at = occurred_at.to_owned();
    e
}

/// The event stamped at `at`, in UTC to the microsecond.
fn at(e: EventSpec, at: DateTime<Utc>) -> EventSpec {
    stamped(e, &at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
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

/// Detaches and drops `day`'s table, as a prune that found it a window behind every clock.
async fn drop_day(client: &deadpool_postgres::Client, day: NaiveDate) {
    let table = inbox::partition_name(day);
    client
        .batch_execute(&format!(
            "ALTER TABLE projector.inbox DETACH PARTITION projector.{table}; \
             DROP TABLE projector.{table}"
        ))
        .await
        .expect("drop the day");
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

/// `status` warns when the days ahead run out: the engine makes seven ahead, and less than
/// one left means no `projector run` made them (it cannot create tables, or none runs). An
/// event stamped weeks ahead (a producer's clock gone wrong) gets a day of its own that far
/// out; the days between today and it are still missing, and every batch of tomorrow will
/// need one. The horizon is where the days stop, not the newest day there is: status warns,
/// and the gauge says under a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_warns_of_missing_days_ahead_though_a_far_day_was_made_for_one_event() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = server_now(&client).await;
    let today = inbox::day_of(now);
    let far = at(
        fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"),
        now + chrono::Duration::days(60),
    );
    let applier = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    apply_retrying(
        &applier,
        &mut client,
        &Partition::from_events("fills", 0, [&far]).batch(0, 1),
    )
    .await
    .expect("the far event");
    // The days the engine made ahead, gone: what a week without a process that can make
    // them leaves (every day from tomorrow on is missing but the far one).
    for d in 1..=inbox::AHEAD_DAYS {
        drop_day(&client, today + chrono::Duration::days(d)).await;
    }
    let broker = DevBroker::start(1, &[("fills", 1)]).expect("broker");
    let probe = Arc::new(
        TopicProbe::connect(
            &config(&broker.bootstrap_servers(), "fills"),
            Duration::from_secs(5),
        )
        .expect("probe"),
    );
    let status = collect(db.pool(), &probe, &StatusOptions::default())
        .await
        .expect("status");
    let inbox_status = status.inbox.as_ref().expect("the inbox's status");
    assert!(
        inbox_status
            .partitions_ahead_seconds
            .is_some_and(|s| s < 86_400),
        "{inbox_status:?}"
    );
    assert!(
        status
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::InboxPartitionsBehind),
        "{:?}",
        status.problems
    );
}

/// A prune judges a day a window behind every clock and detaches it, while a batch that
/// started before the detach writes a late event into that day. The detach waits for the
/// batch; once detached, the day's rows are judged again: the late write keeps it, and it is
/// attached again with both rows. Copies of both events that follow are duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_during_the_detach_keeps_the_day_and_its_copies_are_duplicates() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = server_now(&client).await;
    let old = now - chrono::Duration::days(20);
    let day = inbox::day_of(old);
    let first = at(fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"), old);
    let late = at(
        fill(2, 1, "", "EURUSD", "buy", "2", "1", "0"),
        old + chrono::Duration::seconds(1),
    );
    let mut log = Partition::from_events("fills", 0, [&first, &late]);
    let applier =
        Arc::new(Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app"));
    apply_retrying(&applier, &mut client, &log.batch(0, 1))
        .await
        .expect("the first event");
    // Long ago, as the test's clock goes: written 20 days back, the consumer's clock now.
    client
        .batch_execute(
            "UPDATE projector.inbox_late_writes SET written_at = now() - interval '20 days'; \
             UPDATE projector.offsets SET updated_at = now()",
        )
        .await
        .expect("age the write");
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");

    // A batch with the late event, open while the prune detaches the day.
    let mut writer = db.client().await;
    let mut tx = writer.transaction().await.expect("tx");
    let out = applier
        .apply_in(&mut tx, &log.batch(1, 1))
        .await
        .expect("the late event");
    assert_eq!(out.counts.applied, 1);
    let pool = db.pool().clone();
    let prune = tokio::spawn(async move {
        let mut client = pool.get().await.expect("client");
        prune_inbox(&mut client, &PruneOptions::default(), &clocks, |_| {})
            .await
            .expect("prune")
    });
    lock_waiters(&client, 1).await;
    tx.commit().await.expect("the late event commits");
    let report = prune.await.expect("prune task");
    let outcome = report
        .days
        .iter()
        .find(|d| d.day == day)
        .map(|d| d.outcome.clone());
    assert!(matches!(outcome, Some(DayOutcome::Kept(_))), "{outcome:?}");
    assert!(attached(&client).await.contains(&day));
    log.push_event(&first);
    log.push_event(&late);
    let out = apply_retrying(&applier, &mut client, &log.batch(2, 2))
        .await
        .expect("the copies");
    assert_eq!(
        (out.counts.applied, out.counts.dup_inbox),
        (0, 2),
        "{out:?}"
    );
    assert_eq!(rows(&client, "tally_v1").await, tally_fold(&[first, late]));
}

/// Two processes apply one view (two Kafka partitions, say). A prune drops an old day the
/// first has written into, and moves the retained window's first day past it; the second
/// meets a late event of that day, makes the day again and counts the event outside the
/// window. When the first meets one there too, it still knows the day (made again since) and
/// must count it outside the window as well: the window it remembers from before the prune is
/// not the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_in_a_day_pruned_and_made_again_is_counted_outside_by_every_process() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = server_now(&client).await;
    let today = inbox::day_of(now);
    // The window began a month ago, as if the first `migrate` ran then.
    client
        .execute(
            "UPDATE projector.inbox_retention SET retained_from = $1",
            &[&(today - chrono::Duration::days(30))],
        )
        .await
        .expect("a month of window");
    let old = now - chrono::Duration::days(20);
    let day = inbox::day_of(old);
    let events: Vec<EventSpec> = (1..=3)
        .map(|a| {
            at(
                fill(a, 1, "", "EURUSD", "buy", "1", "1", "0"),
                old + chrono::Duration::seconds(a),
            )
        })
        .collect();
    let first = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    let second = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    let p0 = Partition::from_events("fills", 0, [&events[0], &events[2]]);
    let p1 = Partition::from_events("fills", 1, [&events[1]]);
    let out = apply_retrying(&first, &mut client, &p0.batch(0, 1))
        .await
        .expect("inside the window");
    assert_eq!(out.counts.outside_window, 0);
    // A window later on every clock: the prune drops the day.
    client
        .batch_execute(
            "UPDATE projector.inbox_late_writes SET written_at = now() - interval '20 days'; \
             UPDATE projector.offsets SET updated_at = now()",
        )
        .await
        .expect("age the write");
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
    let report = prune_inbox(&mut client, &PruneOptions::default(), &clocks, |_| {})
        .await
        .expect("prune");
    assert!(report.dropped().any(|d| d.day == day), "{:?}", report.days);
    let out = apply_retrying(&second, &mut client, &p1.batch(0, 1))
        .await
        .expect("the second process");
    assert_eq!(out.counts.outside_window, 1, "made again, outside");
    let out = apply_retrying(&first, &mut client, &p0.batch(1, 1))
        .await
        .expect("the first process");
    assert_eq!(out.counts.applied, 1);
    assert_eq!(
        out.counts.outside_window, 1,
        "the first process counts by the window before the prune"
    );
}

/// The wire format takes any year from 1: an event on the first day of year 1 gets a day of
/// its own, is applied once, and its copy is a duplicate; the view goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_on_the_first_day_of_year_1_is_applied_once() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let e = stamped(
        fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"),
        "0001-01-01T00:00:00Z",
    );
    let log = Partition::from_events("fills", 0, [&e, &e]);
    let applier = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app");
    let out = apply_retrying(&applier, &mut client, &log.batch(0, 1))
        .await
        .expect("the view goes on");
    assert_eq!((out.counts.applied, out.counts.outside_window), (1, 1));
    let out = apply_retrying(&applier, &mut client, &log.batch(1, 1))
        .await
        .expect("the copy");
    assert_eq!(out.counts.dup_inbox, 1);
    assert_eq!(rows(&client, "tally_v1").await, tally_fold(&[e]));
}

/// RFC 3339 names a moment in any zone: a relay that re-renders `occurred_at` in another zone
/// (`+05:30`, `-00:00`, `z`) sends the same moment, which is the same event to the inbox: a
/// duplicate to an order-independent view and to an order-dependent one, also across the UTC
/// midnight the zone's text hides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_moment_written_in_another_zone_is_a_duplicate() {
    let first = stamped(
        fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"),
        "2026-11-29T23:59:59.5Z",
    );
    let copies = [
        "2026-11-30T05:29:59.5+05:30",
        "2026-11-29T23:59:59.500-00:00",
        "2026-11-29t23:59:59.5z",
        "2026-11-29T19:59:59.500000-04:00",
    ]
    .map(|t| stamped(first.clone(), t));
    let mut log = Partition::from_events("fills", 0, [&first]);
    for c in &copies {
        log.push_event(c);
    }
    for ordered in [false, true] {
        let (registry, view): (Registry, Arc<dyn projector_engine::Projection>) = if ordered {
            (
                Registry::new().register(Trail::new(1)).expect("registry"),
                Arc::new(Trail::new(1)),
            )
        } else {
            (
                Registry::new().register(Tally::new(1)).expect("registry"),
                Arc::new(Tally::new(1)),
            )
        };
        let db = TestDb::new(&registry).await;
        let mut client = db.client().await;
        let applier = Applier::new(view, SourceOrdering::PerAccount).expect("app");
        let out = apply_retrying(&applier, &mut client, &log.batch(0, 1))
            .await
            .expect("the event");
        assert_eq!(out.counts.applied, 1);
        let out = apply_retrying(&applier, &mut client, &log.batch(1, copies.len()))
            .await
            .expect("the copies");
        assert_eq!(
            (out.counts.applied, out.counts.dead_lettered()),
            (0, 0),
            "ordered: {ordered}: {out:?}"
        );
        let o = offsets(&client, if ordered { "trail_v1" } else { "tally_v1" }).await;
        assert_eq!(
            o.duplicates,
            copies.len() as i64,
            "ordered: {ordered}: {o:?}"
        );
    }
}

/// An account parks on an event its view refuses; the event behind it occurred on a day the
/// inbox no longer has (dropped by a prune, or never kept). Skipping the refused event drains
/// the one behind it through a repair, which makes the day it lacks and applies it once; a
/// copy of it that follows is a duplicate, and the account goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_a_parked_event_drains_the_next_one_into_a_day_that_is_gone() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = server_now(&client).await;
    let old = now - chrono::Duration::days(20);
    let day = inbox::day_of(old);
    // Refused by the view: its running total breaks trail's CHECK.
    let refused = at(fill(1, 1, "", "EURUSD", "buy", "2000000", "1", "0"), old);
    let behind = at(
        fill(1, 2, "", "EURUSD", "buy", "1", "1", "0"),
        old + chrono::Duration::seconds(1),
    );
    let next = at(fill(1, 3, "", "EURUSD", "buy", "1", "1", "0"), now);
    let mut log = Partition::from_events("fills", 0, [&refused, &behind]);
    let applier = Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("app");
    let out = apply_retrying(&applier, &mut client, &log.batch(0, 2))
        .await
        .expect("the batch");
    assert_eq!(
        (out.counts.failed, out.counts.waiting),
        (1, 1),
        "{:?}",
        out.counts
    );
    // The day is gone by the time the operator skips.
    if attached(&client).await.contains(&day) {
        drop_day(&client, day).await;
    }
    applier
        .skip_seq(&mut client, 1, 1, "review", "refused by the view")
        .await
        .expect("the skip drains the day that is gone");
    assert!(attached(&client).await.contains(&day), "made for the drain");
    log.push_event(&behind);
    log.push_event(&next);
    let out = apply_retrying(&applier, &mut client, &log.batch(2, 2))
        .await
        .expect("a copy and the next event");
    assert_eq!(
        (
            out.counts.applied,
            out.counts.dup_seq + out.counts.dup_inbox
        ),
        (1, 1),
        "{:?}",
        out.counts
    );
    let trail: Vec<String> = rows(&client, "trail_v1").await;
    assert_eq!(
        trail,
        crate::support::trail_fold(&[behind, next]),
        "the refused event skipped, the others once each"
    );
}

/// A prune's detach of an old day waits for a long transaction on the inbox (a report, a
/// dump); meanwhile a late event of that day arrives. Its batch cannot write into a day half
/// detached: it makes the day, which finishes the detach (`FINALIZE`) once the report ends
/// and attaches the day again, or waits for the prune to decide it, whichever comes first.
/// Either way the event is applied once, the view goes on, a copy that follows is a
/// duplicate, and the prune ends with the day kept or dropped, never with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_event_of_a_day_held_half_detached_is_applied_once_the_detach_ends() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = server_now(&client).await;
    let old = now - chrono::Duration::days(20);
    let day = inbox::day_of(old);
    let first = at(fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"), old);
    let late = at(
        fill(2, 1, "", "EURUSD", "buy", "2", "1", "0"),
        old + chrono::Duration::seconds(1),
    );
    let mut log = Partition::from_events("fills", 0, [&first, &late]);
    let applier =
        Arc::new(Applier::new(Arc::new(Tally::new(1)), SourceOrdering::PerAccount).expect("app"));
    apply_retrying(&applier, &mut client, &log.batch(0, 1))
        .await
        .expect("the first event");
    client
        .batch_execute(
            "UPDATE projector.inbox_late_writes SET written_at = now() - interval '20 days'; \
             UPDATE projector.offsets SET updated_at = now()",
        )
        .await
        .expect("age the write");
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
    // A long report on the inbox.
    let report = db.client().await;
    report
        .batch_execute("BEGIN; SELECT count(*) FROM projector.inbox")
        .await
        .expect("the report");
    let pool = db.pool().clone();
    let prune = tokio::spawn(async move {
        let mut client = pool.get().await.expect("client");
        prune_inbox(&mut client, &PruneOptions::default(), &clocks, |_| {})
            .await
            .expect("prune")
    });
    crate::support::eventually(
        "the day half detached",
        || async {
            inbox::partitions(&client)
                .await
                .expect("partitions")
                .into_iter()
                .any(|p| p.day == day && p.attachment == inbox::Attachment::DetachPending)
        },
        |pending| *pending,
    )
    .await;
    let (pool, batch, worker) = (db.pool().clone(), log.batch(1, 1), Arc::clone(&applier));
    let apply = tokio::spawn(async move {
        let mut client = pool.get().await.expect("client");
        let mut errors = Vec::new();
        for _ in 0..20 {
            match worker.apply(&mut client, &batch).await {
                Ok(out) => return (out, errors),
                Err(e) if e.is_retryable() => errors.push(e.to_string()),
                Err(e) => panic!("not retryable: {e}"),
            }
        }
        panic!("the late event never went: {errors:?}")
    });
    // The batch tries while the day is half detached; then the report ends.
    tokio::time::sleep(Duration::from_millis(500)).await;
    report
        .batch_execute("COMMIT")
        .await
        .expect("the report ends");
    prune.await.expect("prune task");
    let (out, _errors) = apply.await.expect("apply task");
    assert_eq!(out.counts.applied, 1, "{out:?}");
    assert!(attached(&client).await.contains(&day));
    log.push_event(&late);
    let out = apply_retrying(&applier, &mut client, &log.batch(2, 1))
        .await
        .expect("the copy");
    assert_eq!(
        (out.counts.applied, out.counts.dup_inbox),
        (0, 1),
        "{out:?}"
    );
}

/// The days are read from the catalog by every batch that needs a day it does not know, by
/// the maintenance task, by `status` and by the prune, while a prune may drop a day at any
/// moment: a day listed by the catalog whose table is gone by the time its size is asked
/// (PostgreSQL answers NULL) is left out of the list, never a panic in the apply path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_the_days_while_a_prune_drops_one_leaves_it_out_without_a_panic() {
    let db = TestDb::new(&Registry::new()).await;
    let client = db.client().await;
    let today = inbox::day_of(server_now(&client).await);
    let gone = today + chrono::Duration::days(inbox::AHEAD_DAYS);
    let mut reader = db.client().await;
    let tx = reader
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .expect("a snapshot");
    // The snapshot is taken: the catalog it reads still lists the day dropped below.
    tx.query_one("SELECT count(*) FROM pg_catalog.pg_class", &[])
        .await
        .expect("the snapshot");
    drop_day(&client, gone).await;
    let days = inbox::partitions(&tx).await.expect("the days");
    assert!(days.iter().any(|p| p.day == today), "{days:?}");
    assert!(!days.iter().any(|p| p.day == gone), "{days:?}");
}
