//! The inbox keyed by the event's own time (V0009): one partition per UTC day of
//! `occurred_at`, made ahead by `migrate` and on demand by a batch; an event's identity in it
//! is its id and its time; events outside the retained window are applied once and counted;
//! a day dropped under a running process is made again, never dead-letters an event; a binary
//! from before the layout cannot write it; and, over random schedules, redeliveries across a
//! UTC midnight and a replay after older days were pruned apply every event once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use projector_engine::inbox;
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{migrate, Applier, Disposition, Projection, Registry, SourceOrdering};
use projector_ops::prune::{prune_inbox, DayOutcome, PruneOptions};

use crate::support::{offsets, tally_fold, trail_fold, Tally, Trail};

/// The events, stamped as having occurred at `at`.
fn at(mut e: EventSpec, at: DateTime<Utc>) -> EventSpec {
    e.occurred_at = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
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

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

fn code(name: &str, version: i32) -> Arc<dyn Projection> {
    views().code_for(name, version).expect("the view's code")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_makes_the_days_from_yesterday_to_a_week_ahead() {
    let db = TestDb::new(&Registry::new()).await;
    let client = db.client().await;
    let today = inbox::day_of(server_now(&client).await);
    let days = attached(&client).await;
    for offset in -1..=inbox::AHEAD_DAYS {
        let day = today + chrono::Duration::days(offset);
        assert!(days.contains(&day), "{day} missing from {days:?}");
    }
    // The key leads with the consumer, then the event's time: new keys land at the right
    // edge of their day's index.
    let key: String = client
        .query_one(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i \
             WHERE i.indrelid = 'projector.inbox'::regclass AND i.indisprimary",
            &[],
        )
        .await
        .expect("the key")
        .get(0);
    assert!(key.contains("(consumer, occurred_at, event_id)"), "{key}");
}

/// An order-dependent view (portfolio): a copy of an applied event stamped with another
/// `occurred_at` is a conflict dead letter naming both times, whether it arrives in a later
/// batch or in the same one; the view shows the event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_with_another_time_is_a_conflict_for_an_order_dependent_view() {
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let applier = Applier::new(code("portfolio", 1), SourceOrdering::PerAccount).expect("app");
    let t1: DateTime<Utc> = "2026-11-29T10:15:00Z".parse().expect("time");
    let t2 = t1 + chrono::Duration::seconds(1);
    let e1 = at(fill(1, 1, "", "EURUSD", "buy", "10", "1.1", "0"), t1);
    let e2 = at(fill(1, 2, "", "EURUSD", "buy", "5", "1.2", "0"), t1);
    let restamped = |e: &EventSpec| at(e.clone(), t2);
    let mut log = Partition::from_events("fills", 0, [&e1, &e2]);
    let out = applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("apply");
    assert_eq!(out.counts.applied, 2);
    let before = dump(&client, &*code("portfolio", 1)).await;
    // A later batch: the last event re-stamped, and an earlier one re-stamped.
    log.push_event(&restamped(&e2));
    log.push_event(&restamped(&e1));
    // The same batch: a new event and its re-stamped copy.
    let e3 = at(fill(1, 3, "", "EURUSD", "sell", "1", "1.3", "0"), t1);
    log.push_event(&e3);
    log.push_event(&restamped(&e3));
    let out = applier
        .apply(&mut client, &log.batch(2, 10))
        .await
        .expect("apply");
    assert_eq!(
        out.dispositions.iter().map(|(_, d)| *d).collect::<Vec<_>>(),
        [
            Disposition::DeadLettered,
            Disposition::DeadLettered,
            Disposition::Applied,
            Disposition::DeadLettered
        ]
    );
    assert_eq!((out.counts.applied, out.counts.conflicts), (1, 3));
    let errors: Vec<String> = client
        .query(
            "SELECT error FROM projector.dead_letters WHERE consumer = 'portfolio_v1' \
             AND kind = 'conflict' ORDER BY \"offset\"",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    // The account's last event, and an event of the same batch: the time is what differs.
    for e in [&errors[0], &errors[2]] {
        assert!(
            e.contains("occurred_at is part of its identity") && e.contains("10:15:01"),
            "{e}"
        );
    }
    // An older one: the inbox knows no such event, whose id is not at hand.
    assert!(
        errors[1].contains("was applied before as another event"),
        "{}",
        errors[1]
    );
    // The view holds each event once: e1 and e2 as before, then e3.
    let expected_log = Partition::from_events("fills", 0, [&e1, &e2, &e3]);
    let oracle_db = TestDb::new(&views()).await;
    let mut oracle = oracle_db.client().await;
    let o = Applier::new(code("portfolio", 1), SourceOrdering::PerAccount).expect("app");
    o.apply(&mut oracle, &expected_log.batch(0, 10))
        .await
        .expect("oracle");
    assert_ne!(before, dump(&client, &*code("portfolio", 1)).await);
    assert_eq!(
        dump(&client, &*code("portfolio", 1)).await,
        dump(&oracle, &*code("portfolio", 1)).await
    );
}

/// An order-independent view (eod): the same id with another `occurred_at` is, to the inbox,
/// another event, and it is applied; the exact copy is a duplicate. A copy so stamped that
/// arrives after its account's later events (at or below the highest `seq` the view applied
/// for the account, unknown to the inbox) is counted, `below_seen`, in the batch's counts
/// and in the partition's exact counters; an exact copy there is not, nor a new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_with_another_time_is_another_event_for_an_order_independent_view() {
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let applier = Applier::new(code("eod", 1), SourceOrdering::PerAccount).expect("app");
    let t1: DateTime<Utc> = "2026-11-29T10:15:00Z".parse().expect("time");
    let e1 = at(fill(1, 1, "", "EURUSD", "buy", "10", "1.1", "0"), t1);
    let e2 = at(fill(1, 2, "", "EURUSD", "buy", "10", "1.1", "0"), t1);
    let e3 = at(fill(1, 3, "", "EURUSD", "buy", "10", "1.1", "0"), t1);
    let log = Partition::from_events(
        "fills",
        0,
        [
            e1.clone(),
            e1.clone(),
            at(e1.clone(), t1 + chrono::Duration::seconds(1)),
            e2.clone(),
            // A later batch: a copy of seq 1 stamped with yet another time, an exact copy of
            // seq 2, and a new event.
            at(e1.clone(), t1 + chrono::Duration::seconds(2)),
            e2.clone(),
            e3.clone(),
        ]
        .iter(),
    );
    let out = applier
        .apply(&mut client, &log.batch(0, 4))
        .await
        .expect("apply");
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (3, 1));
    assert_eq!(
        out.counts.below_seen, 0,
        "within the batch that first applies the account, nothing was seen before"
    );
    let out = applier
        .apply(&mut client, &log.batch(4, 3))
        .await
        .expect("apply");
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (2, 1));
    assert_eq!(out.counts.below_seen, 1, "the re-stamped copy of seq 1");
    let fills: i64 = client
        .query_one(
            "SELECT sum(fills)::bigint FROM eod_v1 WHERE account_id = 1",
            &[],
        )
        .await
        .expect("eod row")
        .get(0);
    assert_eq!(fills, 5, "three events, two re-stamped copies applied");
    let counted: i64 = client
        .query_one(
            "SELECT below_seen FROM projector.offsets WHERE consumer = 'eod_v1'",
            &[],
        )
        .await
        .expect("offsets")
        .get(0);
    assert_eq!(counted, 1);
}

/// Events far ahead of the server's clock and far behind every day kept: each applied once,
/// its day made by the batch, counted as outside the retained window; a redelivery of each is
/// a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_outside_the_window_are_applied_once_and_counted() {
    let registry = Registry::new().register(Tally::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = server_now(&client).await;
    let ahead = now + chrono::Duration::days(40);
    let behind = now - chrono::Duration::days(40);
    let events = [
        at(fill(1, 1, "", "EURUSD", "buy", "1", "1", "0"), ahead),
        at(fill(2, 1, "", "EURUSD", "buy", "2", "1", "0"), behind),
        at(fill(3, 1, "", "EURUSD", "buy", "3", "1", "0"), now),
    ];
    let mut log = Partition::from_events("fills", 0, events.iter());
    for e in &events {
        log.push_event(e);
    }
    let applier = Applier::new(Arc::new(Tally::new(1)), SourceOrdering::Unordered).expect("app");
    let out = applier
        .apply(&mut client, &log.batch(0, 3))
        .await
        .expect("apply");
    assert_eq!((out.counts.applied, out.counts.outside_window), (3, 2));
    let days = attached(&client).await;
    assert!(days.contains(&inbox::day_of(ahead)) && days.contains(&inbox::day_of(behind)));
    let out = applier
        .apply(&mut client, &log.batch(3, 3))
        .await
        .expect("redelivery");
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (0, 3));
    assert_eq!(
        crate::support::rows(&client, "tally_v1").await,
        tally_fold(&events)
    );
}

/// A prune drops a day a running process believes attached: the next batch into that day
/// meets no partition for it (never a dead letter), reads the days again, makes the day and
/// applies the events once, in the same call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_dropped_under_a_running_process_is_made_again_without_a_dead_letter() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let t: DateTime<Utc> = "2026-06-30T12:00:00Z".parse().expect("time");
    let events: Vec<EventSpec> = (1..=4)
        .map(|seq| at(fill(1, seq, "", "EURUSD", "buy", "1", "1", "0"), t))
        .collect();
    let log = Partition::from_events("fills", 0, &events);
    let applier = Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("app");
    applier
        .apply(&mut client, &log.batch(0, 2))
        .await
        .expect("first half");
    // Behind its back: the day goes, with the two rows of the first half.
    let table = inbox::partition_name(inbox::day_of(t));
    client
        .batch_execute(&format!(
            "ALTER TABLE projector.inbox DETACH PARTITION projector.{table}; DROP TABLE projector.{table}"
        ))
        .await
        .expect("drop the day");
    let out = applier
        .apply(&mut client, &log.batch(2, 2))
        .await
        .expect("the day is made again");
    assert_eq!(out.counts.applied, 2);
    assert!(attached(&client).await.contains(&inbox::day_of(t)));
    let o = offsets(&client, "trail_v1").await;
    assert_eq!((o.applied, o.dead_lettered), (4, 0), "{o:?}");
    assert_eq!(
        crate::support::rows(&client, "trail_v1").await,
        trail_fold(&events)
    );
}

/// A binary from before V0009 inserts (consumer, event_id): it is refused with SQLSTATE
/// 55000, which the engine retries and never takes for an event's fault, and a message that
/// says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_from_before_the_layout_cannot_write_the_inbox() {
    let db = TestDb::new(&Registry::new()).await;
    let client = db.client().await;
    let err = client
        .execute(
            "INSERT INTO projector.inbox (consumer, event_id) VALUES ('portfolio_v1', 'e1')",
            &[],
        )
        .await
        .expect_err("refused");
    let db_err = err.as_db_error().expect("a database error");
    assert_eq!(db_err.code().code(), "55000");
    assert!(
        db_err.message().contains("upgrade it"),
        "{}",
        db_err.message()
    );
    let err = client
        .execute(
            "INSERT INTO projector.inbox_legacy (consumer, event_id) VALUES ('portfolio_v1', 'e1')",
            &[],
        )
        .await
        .expect_err("the inbox before the move takes no new row");
    assert_eq!(err.code().map(|c| c.code()), Some("23514"));
}

#[derive(Debug, Clone)]
enum Step {
    /// The consumer applies a batch of `len` from its stored offset.
    Deliver { len: usize },
    /// It applies a batch and crashes before committing.
    Crash { len: usize },
    /// The producer republishes an event of the two days around midnight at a new offset.
    Republish { index: usize },
    /// Retention drops the older day, once the consumer has read all of it.
    Prune,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..9).prop_map(|len| Step::Deliver { len }),
        1 => (1usize..9).prop_map(|len| Step::Crash { len }),
        2 => any::<usize>().prop_map(|index| Step::Republish { index }),
        1 => Just(Step::Prune),
    ]
}

/// The events of 1 to 3 accounts: first a few each on an older day, then a few each within
/// two minutes either side of a UTC midnight (each account's in `seq` and time order), in a
/// random interleaving that keeps each account's order.
fn schedule_events(
    older: DateTime<Utc>,
    midnight: DateTime<Utc>,
) -> impl Strategy<Value = Vec<EventSpec>> {
    (1i64..=3, 1i64..=3, 2i64..=6)
        .prop_flat_map(|(accounts, old, near)| {
            let n = (accounts * near) as usize;
            (
                Just((accounts, old, near)),
                proptest::collection::vec(0..accounts, n),
                proptest::collection::vec(-120i64..120, n),
            )
        })
        .prop_map(move |((accounts, old, near), picks, offsets)| {
            let mut out = Vec::new();
            for a in 1..=accounts {
                for seq in 1..=old {
                    out.push(at(
                        fill(a, seq, "", "EURUSD", "buy", &format!("{seq}.{a}"), "2", "0"),
                        older + chrono::Duration::minutes(seq),
                    ));
                }
            }
            let mut next = vec![old + 1; accounts as usize];
            let mut times: Vec<Vec<i64>> = vec![Vec::new(); accounts as usize];
            for (k, pick) in picks.iter().enumerate() {
                times[(*pick % accounts) as usize].push(offsets[k]);
            }
            for t in &mut times {
                t.sort_unstable();
            }
            let mut taken = vec![0usize; accounts as usize];
            for pick in picks {
                let a = pick % accounts;
                let i = a as usize;
                if taken[i] >= times[i].len() || next[i] > old + near {
                    continue;
                }
                let seq = next[i];
                next[i] += 1;
                let when = midnight + chrono::Duration::seconds(times[i][taken[i]]);
                taken[i] += 1;
                out.push(at(
                    fill(
                        a + 1,
                        seq,
                        "",
                        "GBPUSD",
                        "sell",
                        &format!("{seq}.{a}"),
                        "3",
                        "0",
                    ),
                    when,
                ));
            }
            out
        })
}

static VERSION: AtomicI32 = AtomicI32::new(1);

async fn run_schedule(
    db: &TestDb,
    ordered: bool,
    events: Vec<EventSpec>,
    steps: Vec<Step>,
    older_day: NaiveDate,
) -> Result<(), TestCaseError> {
    let version = VERSION.fetch_add(1, Ordering::Relaxed);
    let (view, table): (Arc<dyn Projection>, String) = if ordered {
        (Arc::new(Trail::new(version)), format!("trail_v{version}"))
    } else {
        (Arc::new(Tally::new(version)), format!("tally_v{version}"))
    };
    let consumer = table.clone();
    let mut client = db.client().await;
    let registry = if ordered {
        Registry::new().register(Trail::new(version))
    } else {
        Registry::new().register(Tally::new(version))
    }
    .expect("registry");
    migrate(&mut client, &registry).await.expect("install");
    let applier = Applier::new(view, SourceOrdering::PerAccount).expect("applier");
    let older_end = events
        .iter()
        .position(|e| !e.occurred_at.starts_with(&older_day.to_string()))
        .unwrap_or(events.len());
    let mut log = Partition::from_events("fills", 0, &events);
    let mut pruned = false;
    let mut dispositions = std::collections::BTreeMap::new();
    for step in steps
        .into_iter()
        .chain(std::iter::once(Step::Deliver { len: usize::MAX }))
    {
        let stored = applier
            .stored_offset(&client, "fills", 0)
            .await
            .expect("offset")
            .unwrap_or(0);
        match step {
            Step::Deliver { len } => {
                let mut from = stored;
                loop {
                    let batch = log.batch(from, len.min(1000));
                    if batch.messages.is_empty() {
                        break;
                    }
                    let out = applier.apply(&mut client, &batch).await.expect("apply");
                    from = out.next_offset;
                    dispositions.extend(out.dispositions);
                    if len != usize::MAX {
                        break;
                    }
                }
            }
            Step::Crash { len } => {
                let batch = log.batch(stored, len);
                applier
                    .make_days_for(&mut client, &batch)
                    .await
                    .expect("days");
                let mut tx = client.transaction().await.expect("begin");
                match applier.apply_in(&mut tx, &batch).await {
                    Ok(_) | Err(projector_engine::ApplyError::InboxDaysMissing { .. }) => {}
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
                drop(tx);
            }
            Step::Republish { index } => {
                let near = events.len() - older_end;
                if near > 0 {
                    let e = &events[older_end + index % near];
                    log.push_event(e);
                }
            }
            Step::Prune => {
                // Only once the consumer has read past every event of the older day (a
                // copy of those is no longer expected: they are outside the window).
                if pruned || stored < older_end as i64 {
                    continue;
                }
                // Its writes into that day happened long ago, as far as retention knows.
                client
                    .execute(
                        "UPDATE projector.inbox_late_writes SET written_at = now() - interval '30 days' \
                         WHERE day = $1",
                        &[&older_day],
                    )
                    .await
                    .expect("age the older day's writes");
                // Every consumer with rows (the cases share a database) at its latest commit.
                let (clocks, _) = projector_ops::clock::clocks(&client, None)
                    .await
                    .expect("clocks");
                prop_assert!(clocks.iter().any(|c| c.consumer == consumer));
                let report = prune_inbox(
                    &mut client,
                    &PruneOptions {
                        older_than: std::time::Duration::from_secs(7 * 86_400),
                        min_window: std::time::Duration::from_secs(7 * 86_400),
                    },
                    &clocks,
                    |_| {},
                )
                .await
                .expect("prune");
                let older_outcome = report.days.iter().find(|d| d.day == older_day);
                prop_assert!(
                    matches!(
                        older_outcome.map(|d| &d.outcome),
                        Some(DayOutcome::Dropped { .. })
                    ),
                    "{report:?}"
                );
                // The days around midnight stay: younger than the window.
                prop_assert!(report.dropped().all(|d| d.day == older_day));
                pruned = true;
            }
        }
    }
    let fold = if ordered {
        trail_fold(&events)
    } else {
        tally_fold(&events)
    };
    prop_assert_eq!(crate::support::rows(&client, &table).await, fold);
    let end = applier
        .stored_offset(&client, "fills", 0)
        .await
        .expect("offset")
        .unwrap_or(0);
    prop_assert_eq!(end, log.log.len() as i64);
    prop_assert_eq!(dispositions.len(), log.log.len());
    prop_assert!(dispositions
        .values()
        .all(|d| matches!(d, Disposition::Applied | Disposition::Duplicate)));
    Ok(())
}

/// Redeliveries across a UTC midnight (a copy of an event of the first day after the second
/// day's partition was made), crashes, and a replay after the older day was pruned: each
/// event applied once, by an order-dependent and an order-independent view.
#[test]
fn redeliveries_across_midnight_and_after_a_prune_apply_each_event_once() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let db = rt.block_on(TestDb::new(&Registry::new()));
    // Days of the last fortnight, none made ahead: every batch of a new day makes it.
    let today = Utc::now().date_naive();
    let midnight = (today - chrono::Duration::days(3))
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    let older = (today - chrono::Duration::days(12))
        .and_hms_opt(9, 0, 0)
        .expect("a morning")
        .and_utc();
    let older_day = older.date_naive();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(32);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        any::<bool>(),
        schedule_events(older, midnight),
        proptest::collection::vec(step(), 0..30),
    );
    let result = runner.run(&strategy, |(ordered, events, steps)| {
        rt.block_on(run_schedule(&db, ordered, events, steps, older_day))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    rt.block_on(async { drop(db) });
}
