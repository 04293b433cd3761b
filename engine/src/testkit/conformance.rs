//! The conformance suite: every projection, built in or plugin, must give the same rows
//! however its events are delivered.
//!
//! Each delivery schedule runs against its own version of the view (its own consumer name,
//! inbox rows, offsets and tables) in one database, and every version must end with rows
//! identical to the version fed each event exactly once. That also proves the inbox key
//! includes the consumer: with `event_id` alone, every version after the first would stay
//! empty.

use std::sync::Arc;

use crate::apply::Applier;
use crate::projection::{render, Projection, Registry, SourceOrdering};
use crate::testkit::{consume, consume_with_crashes, EventSpec, Lcg, Partition, TestDb};

/// Builds version `v` of the view under test.
pub type Factory = Arc<dyn Fn(i32) -> Arc<dyn Projection> + Send + Sync>;

/// The rows of one view version: per table (in `tables()` order), each row as text, sorted.
pub type Rows = Vec<Vec<String>>;

/// What the suite saw.
#[derive(Debug, Clone)]
pub struct Report {
    /// The rows every schedule produced.
    pub rows: Rows,
    /// The schedules that ran.
    pub schedules: Vec<&'static str>,
}

/// Reads all rows of version `view`'s tables.
pub async fn dump(client: &deadpool_postgres::Client, view: &dyn Projection) -> Rows {
    let mut out = Vec::new();
    for table in view.tables() {
        let table = render(view, &table);
        let rows = client
            .query(&format!("SELECT t::text FROM {table} t ORDER BY 1"), &[])
            .await
            .unwrap_or_else(|e| panic!("dump {table}: {e}"));
        out.push(rows.iter().map(|r| r.get::<_, String>(0)).collect());
    }
    out
}

/// Runs every schedule for the view built by `factory` over `events` (in per-account `seq`
/// order, one partition) and asserts identical rows. Returns the rows for further checks
/// (golden rows, a fold computed by the test).
pub async fn run(factory: Factory, events: &[EventSpec]) -> Report {
    type Schedule = (&'static str, i32);
    let schedules: [Schedule; 8] = [
        ("once", 1),
        ("twice (republished at new offsets)", 2),
        ("five times each", 3),
        ("interleaved duplicates", 4),
        ("crash between apply and commit", 5),
        ("one event per batch", 6),
        ("the whole stream in one batch", 7),
        ("three concurrent writers", 8),
    ];
    let mut registry = Registry::new();
    for (_, v) in schedules {
        registry
            .add(factory(v))
            .expect("register the view under test");
    }
    let db = TestDb::new(&registry).await;
    let topic = "conformance";
    let once = Partition::from_events(topic, 0, events);

    let mut twice = once.clone();
    for e in events {
        twice.push_event(e);
    }
    let mut five = Partition::new(topic, 0);
    for m in &once.log {
        for _ in 0..5 {
            five.push_raw(m.key.clone(), m.payload.clone());
        }
    }
    let mut interleaved = Partition::new(topic, 0);
    let mut rng = Lcg(0x5eed);
    for (i, m) in once.log.iter().enumerate() {
        interleaved.push_raw(m.key.clone(), m.payload.clone());
        if rng.below(3) == 0 {
            let earlier = &once.log[rng.below(i + 1)];
            interleaved.push_raw(earlier.key.clone(), earlier.payload.clone());
        }
    }

    let mut baseline: Option<Rows> = None;
    let mut ran = Vec::new();
    for (name, v) in schedules {
        let view = factory(v);
        let applier =
            Arc::new(Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier"));
        let mut client = db.client().await;
        match v {
            1 => drop(consume(&applier, &mut client, &once, 7).await),
            2 => drop(consume(&applier, &mut client, &twice, 7).await),
            3 => drop(consume(&applier, &mut client, &five, 7).await),
            4 => drop(consume(&applier, &mut client, &interleaved, 7).await),
            5 => drop(consume_with_crashes(&applier, &mut client, &once, 5, |n| n % 3 == 1).await),
            6 => drop(consume(&applier, &mut client, &once, 1).await),
            7 => drop(consume(&applier, &mut client, &once, once.log.len()).await),
            _ => {
                let log = Arc::new(twice.clone());
                let mut tasks = Vec::new();
                for writer in 0..3usize {
                    let (applier, log, pool) = (applier.clone(), log.clone(), db.pool().clone());
                    tasks.push(tokio::spawn(async move {
                        let mut client = pool.get().await.expect("connection");
                        consume(&applier, &mut client, &log, 3 + writer * 2).await
                    }));
                }
                for t in tasks {
                    t.await.expect("writer task");
                }
            }
        }
        let rows = dump(&client, &*view).await;
        match &baseline {
            None => {
                assert!(
                    rows.iter().any(|t| !t.is_empty()),
                    "{}: the events produced no rows at all",
                    view.consumer()
                );
                baseline = Some(rows);
            }
            Some(expected) => assert_eq!(
                &rows,
                expected,
                "{}: schedule {name:?} gave rows different from delivering each event once",
                view.consumer()
            ),
        }
        ran.push(name);
    }
    Report {
        rows: baseline.unwrap_or_default(),
        schedules: ran,
    }
}
