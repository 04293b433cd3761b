//! The inbox by day, a second adversarial review (issue 23): what `status` says of the days
//! ahead when no process makes them, a prune that detaches a day while a batch is writing
//! into it, a day dropped under a process that still believes in it, and `occurred_at` at the
//! edges the first review did not reach (year 1, the same moment written in other zones).

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
use projector_engine::{Applier, Registry, SourceOrdering};

use crate::support::kafka::config;
use crate::support::{lock_waiters, offsets, rows, tally_fold, Tally, Trail};

/// The event stamped with `occurred_at` as written.
fn stamped(mut e: EventSpec, occurred_at: &str) -> EventSpec {
    e.occurred_at = occurred_at.to_owned();
    e
}

/// The event stamped at `at`, in UTC to the microsecond.
fn at(e: EventSpec, at: DateTime<Utc>) -> EventSpec {
    stamped(e, &at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
}

async fn server_now(client: &deadpool_postgres::Client) -> DateTime<Utc> {
    client
        .query_one("SELECT now()", &[])
        .await
        .expect("now")
        .get(0)
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
