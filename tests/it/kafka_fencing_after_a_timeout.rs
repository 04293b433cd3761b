//! A worker whose batch timed out applies it in halves; when one of the halves is then fenced,
//! the stored offset may lie anywhere in what the worker still holds, the later halves
//! included. Through the real Kafka source on the mock cluster and real PostgreSQL: the
//! worker resumes exactly at the stored offset and skips nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::kafka::{add, config, held, publish, Hold, Progress};
use crate::support::{fills, offsets, rows, trail_fold, with_options, Trail};
use projector_devkit::devbroker::DevBroker;
use projector_engine::db;
use projector_engine::kafka::source::run_view;
use projector_engine::testkit::{Partition, TestDb};
use projector_engine::{Applier, Batch, Registry, SourceOrdering};
use tokio_util::sync::CancellationToken;

/// Deadline for every awaited signal: generous, since nothing here waits for time to pass.
const LIMIT: Duration = Duration::from_secs(120);

fn trail_applier() -> Arc<Applier> {
    Arc::new(Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"))
}

/// The partition is committed up to 100 and locked by another session, so the worker's first
/// attempt at [100, end) times out and it goes on with the first half, [100, mid), keeping
/// [mid, end) for later. While it holds that half, the lock goes and a zombie commits
/// [100, z) with mid < z < end: the half is fenced at z, beyond itself but inside the half
/// the worker keeps. The worker must apply [z, end) from what it holds, not drop it and
/// commit the next batch from z.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halved_batch_fenced_past_its_first_half_applies_the_rest() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = trail_applier();
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

    // A session of its own that holds the partition's offset row, idle in its transaction.
    let locker_pool = db::pool(
        &with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")]),
        1,
    )
    .expect("locker pool");
    let locker = locker_pool.get().await.expect("locker session");
    locker
        .batch_execute(
            "BEGIN; SELECT 1 FROM projector.offsets WHERE consumer = 'trail_v1' FOR UPDATE",
        )
        .await
        .expect("lock the offset row");

    // The worker's first batch is recorded; the second that starts at 100 (its first half,
    // after the attempt timed out) is held.
    let whole: Arc<Mutex<Option<Batch>>> = Arc::default();
    let starts_at_100 = AtomicUsize::new(0);
    let record = whole.clone();
    let progress = Arc::new(Progress::default());
    let (hold, mut held_rx) = Hold::new(progress.clone(), move |b: &Batch| {
        if b.start_offset != 100 {
            return false;
        }
        if starts_at_100.fetch_add(1, Ordering::SeqCst) == 0 {
            *record.lock().expect("lock") = Some(b.clone());
            return false;
        }
        true
    });
    let mut cfg = config(&bootstrap, "fills");
    cfg.max_batch_messages = 2000;
    // Everything up to 2100 is on the topic already: the batch fills up well within this.
    cfg.linger = Duration::from_secs(1);
    cfg.attempt_timeout = Duration::from_secs(1);
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier.clone(),
        db.pool().clone(),
        cfg,
        hold,
        stop.clone(),
    ));

    let half = held(&mut held_rx, LIMIT).await;
    let whole = whole
        .lock()
        .expect("lock")
        .clone()
        .expect("the first batch");
    let end = whole.messages.last().expect("messages").offset + 1;
    let mid = half.batch.messages.last().expect("messages").offset + 1;
    assert!(
        whole.messages.len() >= 8 && mid < end,
        "the worker holds a batch of {} messages and applies its first half [100, {mid})",
        whole.messages.len()
    );
    let z = mid + (end - mid) / 2;
    locker
        .batch_execute("ROLLBACK")
        .await
        .expect("release the lock");
    let zombie = trail_applier();
    let committed = zombie
        .apply(&mut client, &log.batch(100, (z - 100) as usize))
        .await
        .expect("the zombie commits [100, z)");
    assert_eq!(committed.next_offset, z);
    // More arrives meanwhile, so that a worker that dropped what it held would have
    // something to commit beyond the hole.
    add(&mut ends, &publish(&bootstrap, "fills", later).await);
    half.release();

    progress.wait_for_ends(&ends, LIMIT).await;
    stop.cancel();
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the view stops")
        .expect("view task")
        .expect("the view ran without errors");

    assert_eq!(progress.fenced_list(), [(0, 100, z)]);
    let o = offsets(&client, "trail_v1").await;
    let total = events.len() as i64;
    assert_eq!(
        o.next,
        BTreeMap::from([(0, total)]),
        "every offset committed"
    );
    assert_eq!(
        (o.applied, o.duplicates, o.dead_lettered, o.waiting),
        (total, 0, 0, 0),
        "each event applied once, by the zombie or the worker: [{z}, {end}) was not skipped"
    );
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
}
