//! Invariant 1 of the design (exactly-once effect) over random delivery schedules: any mix of
//! duplicates, republishes at new offsets, stale consumers redelivering old batches and
//! crashes between apply and commit ends with the fold of the distinct events in per-account
//! `seq` order, and with nothing lost.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::support::{trail_fold, Trail};
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{migrate, Applier, ApplyError, Disposition, Registry, SourceOrdering};

#[derive(Debug, Clone)]
enum Step {
    /// The owner consumes a batch of `len` from the stored offset.
    Deliver { len: usize },
    /// The owner applies a batch and crashes before committing.
    Crash { len: usize },
    /// A stale consumer applies a batch from an old position (`back` before the stored one).
    Stale { back: usize, len: usize },
    /// The producer republishes the message at `index % log length` at a new offset.
    Republish { index: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..12).prop_map(|len| Step::Deliver { len }),
        1 => (1usize..12).prop_map(|len| Step::Crash { len }),
        1 => (1usize..8, 1usize..8).prop_map(|(back, len)| Step::Stale { back, len }),
        2 => any::<usize>().prop_map(|index| Step::Republish { index }),
    ]
}

/// Events of 1 to 4 accounts, interleaved in a random order that keeps each account's `seq`
/// order (the per-partition guarantee).
fn events() -> impl Strategy<Value = Vec<EventSpec>> {
    (1i64..=4, 1i64..=10)
        .prop_flat_map(|(accounts, per)| {
            let total = (accounts * per) as usize;
            (
                Just((accounts, per)),
                proptest::collection::vec(0..accounts, total),
            )
        })
        .prop_map(|((accounts, per), picks)| {
            let mut next = vec![1i64; accounts as usize];
            let mut out = Vec::new();
            for pick in picks {
                // Take the picked account if it has events left, else the next one that does.
                let Some(a) = (0..accounts)
                    .map(|k| (pick + k) % accounts)
                    .find(|a| next[*a as usize] <= per)
                else {
                    break;
                };
                let seq = next[a as usize];
                next[a as usize] += 1;
                let qty = format!("{}.{}", seq * 3 + a, a);
                out.push(fill(
                    a + 1,
                    seq,
                    "2026-11-29T10:15:00Z",
                    "EURUSD",
                    "sell",
                    &qty,
                    "2.5",
                    "0",
                ));
            }
            out
        })
}

async fn stored(applier: &Applier, client: &deadpool_postgres::Client) -> i64 {
    applier
        .stored_offset(client, "fills", 0)
        .await
        .expect("offset")
        .unwrap_or(0)
}

static VERSION: AtomicI32 = AtomicI32::new(1);

async fn run_schedule(
    db: &TestDb,
    events: Vec<EventSpec>,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    // Each case is its own view version: own tables, inbox rows and offsets, one database.
    let view = Trail::new(VERSION.fetch_add(1, Ordering::Relaxed));
    let mut client = db.client().await;
    migrate(
        &mut client,
        &Registry::new().register(view.clone()).expect("registry"),
    )
    .await
    .expect("install the case's version");
    let applier =
        Applier::new(Arc::new(view.clone()), SourceOrdering::PerAccount).expect("applier");
    let mut stale = db.client().await;

    let mut log = Partition::from_events("fills", 0, &events);
    let mut dispositions = std::collections::BTreeMap::new();
    let mut record = |outcome: projector_engine::BatchOutcome| {
        for (offset, d) in outcome.dispositions {
            dispositions.insert(offset, d);
        }
    };

    for step in steps
        .into_iter()
        .chain(std::iter::once(Step::Deliver { len: usize::MAX }))
    {
        let at = stored(&applier, &client).await;
        match step {
            Step::Deliver { len } => {
                // The last step drains the log, whatever is left.
                let mut at = at;
                loop {
                    let batch = log.batch(at, len.min(1000));
                    if batch.messages.is_empty() {
                        break;
                    }
                    let outcome = applier
                        .apply(&mut client, &batch)
                        .await
                        .expect("owner apply");
                    at = outcome.next_offset;
                    record(outcome);
                    if len != usize::MAX {
                        break;
                    }
                }
            }
            Step::Crash { len } => {
                applier
                    .make_days_for(&mut client, &log.batch(at, len))
                    .await
                    .expect("the inbox's days");
                let mut tx = client.transaction().await.expect("begin");
                applier
                    .apply_in(&mut tx, &log.batch(at, len))
                    .await
                    .expect("apply before crash");
                drop(tx);
            }
            Step::Stale { back, len } => {
                let from = (at - back as i64).max(0);
                let batch = log.batch(from, len);
                match applier.apply(&mut stale, &batch).await {
                    // A stale consumer that happens to start exactly at the stored offset is
                    // simply the owner; anything else must be fenced.
                    Ok(outcome) => {
                        prop_assert_eq!(from, at, "a stale batch committed");
                        record(outcome);
                    }
                    Err(ApplyError::Fenced { stored, .. }) => prop_assert_eq!(stored, at),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Step::Republish { index } => {
                let m = log.log[index % log.log.len()].clone();
                log.push_raw(m.key, m.payload);
            }
        }
    }

    let rows: Vec<String> = client
        .query(
            &format!("SELECT t::text FROM trail_v{} t ORDER BY 1", view.version),
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    prop_assert_eq!(rows, trail_fold(&events));
    // Nothing lost: every offset of the log was committed with a disposition, and none of
    // them waits or was dead-lettered (the stream has no gaps and no poison).
    prop_assert_eq!(stored(&applier, &client).await, log.log.len() as i64);
    prop_assert_eq!(dispositions.len(), log.log.len());
    prop_assert!(dispositions
        .values()
        .all(|d| matches!(d, Disposition::Applied | Disposition::Duplicate)));
    Ok(())
}

#[test]
fn every_schedule_ends_with_the_fold_of_distinct_events() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let db = rt.block_on(TestDb::new(&Registry::new()));
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (events(), proptest::collection::vec(step(), 0..40));
    let result = runner.run(&strategy, |(events, steps)| {
        rt.block_on(run_schedule(&db, events, steps))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
