//! No message can wedge a view or make it skip offsets, through the real Kafka source on the
//! mock cluster and real PostgreSQL:
//!
//! - a fenced worker resumes exactly at the stored offset, whether that lies inside the batch
//!   it holds (it applies the rest from memory) or before it (it fetches again);

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::kafka::{add, config, held, publish, Hold, Progress};
use crate::support::{fills, offsets, rows, trail_fold, Trail};
use deadpool_postgres::Pool;
use projector_devkit::devbroker::DevBroker;
use projector_engine::kafka::source::{run_view, KafkaConfig, Observer, SourceError};
use projector_engine::testkit::{Partition, TestDb};
use projector_engine::{Applier, Batch, Registry, SourceOrdering};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Deadline for every awaited signal: generous, since nothing here waits for time to pass.
const LIMIT: Duration = Duration::from_secs(120);

async fn trail_db() -> (TestDb, Arc<Applier>) {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    (db, trail_applier())
}

fn trail_applier() -> Arc<Applier> {
    Arc::new(Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"))
}

fn spawn_view(
    applier: &Arc<Applier>,
    pool: &Pool,
    cfg: &KafkaConfig,
    observer: Arc<dyn Observer>,
) -> (CancellationToken, JoinHandle<Result<(), SourceError>>) {
    let token = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier.clone(),
        pool.clone(),
        cfg.clone(),
        observer,
        token.clone(),
    ));
    (token, task)
}

async fn stop_view(token: CancellationToken, task: JoinHandle<Result<(), SourceError>>) {
    token.cancel();
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the view stops")
        .expect("view task")
        .expect("the view ran without errors");
}

// ---------------------------------------------------------------------------------------
// Fencing never skips

/// The scenario: the partition is committed up to 100; the worker, assigned at 100,
/// holds [100, 2100); a zombie (another writer of the same view version that still believes
/// it owns the partition) commits [100, 110). The worker is fenced at 110 and must apply
/// 110..2099 from the batch it holds, not skip to 2100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_inside_the_batch_applies_the_rest_of_it() {
    let (db, applier) = trail_db().await;
    let broker = DevBroker::start(1, &[("fills", 1)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    // 21 accounts, round-robin: the first 2100 events are seq 1 to 100 of every account.
    let events = fills(21, 110);
    let (first, later) = events.split_at(2100);
    let mut ends = publish(&bootstrap, "fills", first).await;
    let log = Partition::from_events("fills", 0, first);
    let mut client = db.client().await;
    applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("the partition committed up to 100");

    let progress = Arc::new(Progress::default());
    let (hold, mut held_rx) = Hold::new(progress.clone(), |b: &Batch| b.start_offset == 100);
    let mut cfg = config(&bootstrap, "fills");
    cfg.max_batch_messages = 2000;
    // Everything up to 2100 is on the topic already: the batch fills up well within this.
    cfg.linger = Duration::from_secs(1);
    let (stop, task) = spawn_view(&applier, db.pool(), &cfg, hold);

    let held = held(&mut held_rx, LIMIT).await;
    let batch = held.batch.clone();
    assert_eq!(
        batch.messages[0].payload, log.log[100].payload,
        "the worker resumed at the stored offset 100"
    );
    assert!(
        batch.messages.len() > 10,
        "the held batch reaches past the zombie's commit: {} messages",
        batch.messages.len()
    );
    let zombie = trail_applier();
    let zombie_batch = Batch {
        messages: batch.messages[..10].to_vec(),
        ..batch.clone()
    };
    let committed = zombie
        .apply(&mut client, &zombie_batch)
        .await
        .expect("the zombie commits [100, 110)");
    assert_eq!(committed.next_offset, 110);
    // More arrives meanwhile, so that a worker that skipped past its batch would have
    // something to commit beyond the hole.
    add(&mut ends, &publish(&bootstrap, "fills", later).await);
    held.release();

    progress.wait_for_ends(&ends, LIMIT).await;
    stop_view(stop, task).await;

    assert_eq!(progress.fenced_list(), [(0, 100, 110)]);
    let o = offsets(&client, "trail_v1").await;
    let total = events.len() as i64;
    assert_eq!(
        o.next,
        BTreeMap::from([(0, total)]),
        "every offset committed"
    );
    assert_eq!(o.accounted(), total, "every offset accounted for: {o:?}");
    assert_eq!(
        (o.applied, o.duplicates, o.dead_lettered, o.waiting),
        (total, 0, 0, 0),
        "each event applied once, by the zombie or the worker"
    );
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
}

/// The stored offset goes back behind the batch the worker holds (an operator rewinds the
/// view, or a writer that lost a race committed less). Fenced with the stored offset before
/// its batch, the worker must seek back and read again from there: what it reads twice is
/// counted as duplicates, and nothing is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_behind_the_batch_fetches_again_from_the_stored_offset() {
    let (db, applier) = trail_db().await;
    let broker = DevBroker::start(1, &[("fills", 1)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(20, 100);
    let ends = publish(&bootstrap, "fills", &events).await;

    let progress = Arc::new(Progress::default());
    let (hold, mut held_rx) = Hold::new(progress.clone(), |b: &Batch| b.start_offset >= 1000);
    let (stop, task) = spawn_view(&applier, db.pool(), &config(&bootstrap, "fills"), hold);

    let held = held(&mut held_rx, LIMIT).await;
    let start = held.batch.start_offset;
    let rewound = start - 600;
    let client = db.client().await;
    let moved = client
        .execute(
            "UPDATE projector.offsets SET next_offset = $1 \
             WHERE consumer = 'trail_v1' AND topic = 'fills' AND partition = 0 AND next_offset = $2",
            &[&rewound, &start],
        )
        .await
        .expect("rewind");
    assert_eq!(moved, 1, "the partition stood at the held batch's start");
    held.release();

    progress.wait_for_ends(&ends, LIMIT).await;
    stop_view(stop, task).await;

    assert_eq!(progress.fenced_list(), [(0, start, rewound)]);
    let o = offsets(&client, "trail_v1").await;
    let total = events.len() as i64;
    let read_twice = start - rewound;
    assert_eq!(
        o.next,
        BTreeMap::from([(0, total)]),
        "every offset committed"
    );
    assert_eq!(
        (o.applied, o.duplicates, o.dead_lettered, o.waiting),
        (total, read_twice, 0, 0),
        "what was read again is counted as duplicates, nothing else"
    );
    assert_eq!(o.accounted(), total + read_twice, "{o:?}");
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
}
