//! No message can wedge a view or make it skip offsets, through the real Kafka source on the
//! mock cluster and real PostgreSQL:
//!
//! - a fenced worker resumes exactly at the stored offset, whether that lies inside the batch
//!   it holds (it applies the rest from memory) or before it (it fetches again);
//! - a batch stuck behind a lock, or on a frozen connection, cannot hold a rebalance or a
//!   shutdown for ever;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::kafka::{add, config, held, publish, Hold, Progress, Tee};
use crate::support::proxy::{target_of, url_through, Proxy};
use crate::support::{fills, offsets, rows, trail_fold, with_options, Trail};
use deadpool_postgres::{Client, Pool};
use projector_devkit::devbroker::DevBroker;
use projector_engine::db::{self, Settings};
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

// ---------------------------------------------------------------------------------------
// Bounded waits

/// Waits until `at_least` engine sessions of `database` wait for a lock. PostgreSQL signals
/// no lock wait to anyone, so this polls `pg_stat_activity`.
async fn wait_for_lock_waiters(admin: &Client, database: &str, at_least: i64) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                 AND application_name = 'projector' AND wait_event_type = 'Lock'",
                &[&database],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if waiting >= at_least {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {at_least} engine sessions to wait for a lock ({waiting} do)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session of its own (not the engine's) that can lock every offset row of a view version
/// and idle while holding them, for as long as the test wants.
struct Locker {
    client: Client,
    pid: i32,
    _pool: Pool,
}

impl Locker {
    async fn new(db: &TestDb) -> Self {
        let url = format!(
            "{}&application_name=test_locker",
            with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")])
        );
        let pool = db::pool(&url, 1).expect("locker pool");
        let client = pool.get().await.expect("locker session");
        let pid = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        Self {
            client,
            pid,
            _pool: pool,
        }
    }

    /// Locks the offset rows of `consumer` and returns how many there are.
    async fn lock(&self, consumer: &str) -> usize {
        self.client.batch_execute("BEGIN").await.expect("begin");
        self.client
            .query(
                "SELECT partition FROM projector.offsets WHERE consumer = $1 FOR UPDATE",
                &[&consumer],
            )
            .await
            .expect("lock the offset rows")
            .len()
    }

    async fn release(&self) {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .expect("release");
    }

    /// The session's state as the server sees it.
    async fn state(&self, admin: &Client) -> String {
        admin
            .query_one(
                "SELECT state FROM pg_stat_activity WHERE pid = $1",
                &[&self.pid],
            )
            .await
            .expect("locker state")
            .get(0)
    }
}

/// Another session holds every offset row of the view version and idles, so the worker's
/// batches wait for the lock. A second consumer joins the group: the first one's revocation,
/// which waits for its in-flight batches, must finish while the lock is still held, because
/// the batch's statements time out (`statement_timeout` from the URL) and are retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_finishes_while_a_lock_holds_the_batch() {
    let (db, applier) = trail_db().await;
    let broker = DevBroker::start(1, &[("fills", 3)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(30, 40);
    let (first, later) = events.split_at(events.len() / 2);
    let mut ends = publish(&bootstrap, "fills", first).await;

    let url = with_options(db.url(), &[("statement_timeout", "1000")]);
    let pool = db::pool(&url, 8).expect("engine pool");
    let mut cfg = config(&bootstrap, "fills");
    cfg.attempt_timeout = Duration::from_secs(3);
    let shared = Arc::new(Progress::default());
    let (own_a, own_b) = (Arc::new(Progress::default()), Arc::new(Progress::default()));
    let (stop_a, a) = spawn_view(
        &applier,
        &pool,
        &cfg,
        Arc::new(Tee(shared.clone(), own_a.clone())),
    );
    shared.wait_for_ends(&ends, LIMIT).await;
    assert_eq!(own_a.assigned_now(), [0, 1, 2]);

    let admin = db.client().await;
    let locker = Locker::new(&db).await;
    assert_eq!(locker.lock("trail_v1").await, 3);
    add(&mut ends, &publish(&bootstrap, "fills", later).await);
    wait_for_lock_waiters(&admin, db.name(), 1).await;
    let committed_before = shared.committed_total();

    let (stop_b, b) = spawn_view(
        &applier,
        &pool,
        &cfg,
        Arc::new(Tee(shared.clone(), own_b.clone())),
    );
    own_a
        .wait("the first consumer to give partitions up", LIMIT, |p| {
            p.assigned_now().len() < 3
        })
        .await;
    own_b
        .wait("the second consumer to get partitions", LIMIT, |p| {
            !p.assigned_now().is_empty()
        })
        .await;
    assert_eq!(
        locker.state(&admin).await,
        "idle in transaction",
        "the lock was held throughout"
    );
    assert_eq!(
        shared.committed_total(),
        committed_before,
        "nothing committed while the lock was held"
    );

    locker.release().await;
    shared.wait_for_ends(&ends, LIMIT).await;
    stop_view(stop_a, a).await;
    stop_view(stop_b, b).await;

    assert_eq!(rows(&admin, "trail_v1").await, trail_fold(&events));
    let o = offsets(&admin, "trail_v1").await;
    let total = events.len() as i64;
    assert_eq!(
        o.next.values().sum::<i64>(),
        total,
        "every offset committed"
    );
    assert_eq!((o.applied, o.duplicates, o.accounted()), (total, 0, total));
}

/// The network to PostgreSQL freezes under batches in flight: their connections stay open
/// but nothing moves, so no TCP timeout fires. A shutdown, which waits for in-flight
/// batches, must still finish: the attempt timeout gives the frozen connections up. The
/// server ends the frozen transactions, which hold the offset rows, after
/// `idle_in_transaction_session_timeout`; a consumer started afterwards finishes the stream
/// exactly, over new connections of the same pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_connection_cannot_hold_a_shutdown() {
    let (db, applier) = trail_db().await;
    let broker = DevBroker::start(1, &[("fills", 3)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(30, 40);
    let (first, later) = events.split_at(events.len() / 2);
    let mut ends = publish(&bootstrap, "fills", first).await;

    let proxy = Proxy::start(target_of(db.url())).await;
    let url = with_options(
        &url_through(db.url(), proxy.addr()),
        &[("idle_in_transaction_session_timeout", "2000")],
    );
    let settings = Settings {
        max_size: 4,
        // Also how long the pool's check of an idle connection may take: frozen ones fail it.
        connect_timeout: Duration::from_secs(2),
        ..Settings::default()
    };
    let pool = db::pool_with(&url, &settings).expect("engine pool through the proxy");
    let mut cfg = config(&bootstrap, "fills");
    cfg.attempt_timeout = Duration::from_secs(4);
    let progress = Arc::new(Progress::default());
    let (stop, task) = spawn_view(&applier, &pool, &cfg, progress.clone());
    progress.wait_for_ends(&ends, LIMIT).await;

    // Every partition's next batch begins its transaction and waits for its offset row...
    let admin = db.client().await;
    let locker = Locker::new(&db).await;
    assert_eq!(locker.lock("trail_v1").await, 3);
    add(&mut ends, &publish(&bootstrap, "fills", later).await);
    wait_for_lock_waiters(&admin, db.name(), 3).await;
    // ... when the network freezes. Released, the frozen sessions take the offset rows and
    // then wait for a client that will never speak again.
    proxy.freeze();
    locker.release().await;

    stop_frozen_view(stop, task).await;

    let progress = Arc::new(Progress::default());
    let (stop, task) = spawn_view(&applier, &pool, &cfg, progress.clone());
    progress.wait_for_ends(&ends, LIMIT).await;
    stop_view(stop, task).await;

    assert_eq!(rows(&admin, "trail_v1").await, trail_fold(&events));
    let o = offsets(&admin, "trail_v1").await;
    let total = events.len() as i64;
    assert_eq!(
        o.next.values().sum::<i64>(),
        total,
        "every offset committed"
    );
    assert_eq!((o.applied, o.duplicates, o.accounted()), (total, 0, total));
    let frozen_left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
             AND application_name = 'projector' AND state = 'idle in transaction'",
            &[&db.name()],
        )
        .await
        .expect("sessions")
        .get(0);
    assert_eq!(frozen_left, 0, "the server ended the frozen transactions");
}

/// Shuts a view down and waits for it. With its batches on frozen connections, only the
/// attempt timeout can end them: without it, this never returns.
async fn stop_frozen_view(stop: CancellationToken, task: JoinHandle<Result<(), SourceError>>) {
    stop.cancel();
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the shutdown finished although its batches' connections froze")
        .expect("view task")
        .expect("the view stopped without errors");
}
