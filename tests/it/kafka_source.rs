//! The Kafka source against a real Kafka-protocol broker (librdkafka's mock cluster in this
//! process, or `PROJECTOR_TEST_BROKERS`) and real PostgreSQL: rebalances, zombies and
//! republishes.

use std::sync::Arc;
use std::time::Duration;

use crate::support::broker::Broker;
use crate::support::kafka::{add, publish, Progress, Tee};
use crate::support::{fills, rows, trail_fold, Trail};
use projector_engine::kafka::source::{run_view, Observer};
use projector_engine::testkit::{EventSpec, TestDb};
use projector_engine::{Applier, Batch, Registry, SourceOrdering};
use tokio_util::sync::CancellationToken;

const MINUTES: Duration = Duration::from_secs(180);

async fn setup() -> (TestDb, Arc<Applier>) {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = Arc::new(
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"),
    );
    (db, applier)
}

/// `events` plus duplicates of earlier events, republished later in the stream.
fn with_duplicates(events: &[EventSpec], every: usize) -> Vec<EventSpec> {
    let mut out = Vec::with_capacity(events.len() + events.len() / every);
    for (i, e) in events.iter().enumerate() {
        out.push(e.clone());
        if i % every == every - 1 {
            out.push(events[(i * 7919) % (i + 1)].clone());
        }
    }
    out
}

/// Awaits a consumer's task once it is cancelled: it must stop cleanly, and within
/// `MINUTES`, so that a consumer that never stops fails the test by name instead of holding
/// the suite until CI's limit.
async fn stopped(who: &str, task: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(MINUTES, task)
        .await
        .unwrap_or_else(|_| panic!("{who} did not stop within {MINUTES:?} of its cancellation"))
        .unwrap_or_else(|e| panic!("{who} stopped cleanly: {e}"));
}

fn spawn(
    applier: &Arc<Applier>,
    db: &TestDb,
    cfg: &projector_engine::kafka::source::KafkaConfig,
    observer: Arc<dyn Observer>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let token = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier.clone(),
        db.pool().clone(),
        cfg.clone(),
        observer,
        token.clone(),
    ));
    let handle = tokio::spawn(async move {
        task.await
            .expect("view task")
            .expect("view ran without errors");
    });
    (token, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consumers_joining_and_leaving_give_the_fold() {
    let (db, applier) = setup().await;
    let broker = Broker::start(&[("fills", 6)]);
    let topic = broker.topic("fills");
    let events = fills(200, 250);
    let stream = with_duplicates(&events, 20);
    let ends = publish(&broker.bootstrap_servers(), &topic, &stream).await;
    assert!(stream.len() >= 50_000);
    let cfg = broker.config(&topic);
    let shared = Arc::new(Progress::default());
    let total = stream.len() as i64;

    let own: Vec<Arc<Progress>> = (0..3).map(|_| Arc::new(Progress::default())).collect();
    let observer =
        |i: usize| -> Arc<dyn Observer> { Arc::new(Tee(shared.clone(), own[i].clone())) };

    let (stop_a, a) = spawn(&applier, &db, &cfg, observer(0));
    shared
        .wait("a fifth of the stream", MINUTES, |p| {
            p.committed_total() >= total / 5
        })
        .await;
    let (stop_b, b) = spawn(&applier, &db, &cfg, observer(1));
    own[1]
        .wait("b to get partitions", MINUTES, |p| {
            !p.assigned_now().is_empty()
        })
        .await;
    shared
        .wait("two fifths", MINUTES, |p| {
            p.committed_total() >= 2 * total / 5
        })
        .await;
    let (stop_c, c) = spawn(&applier, &db, &cfg, observer(2));
    own[2]
        .wait("c to get partitions", MINUTES, |p| {
            !p.assigned_now().is_empty()
        })
        .await;
    shared
        .wait("three fifths", MINUTES, |p| {
            p.committed_total() >= 3 * total / 5
        })
        .await;
    stop_a.cancel();
    stopped("a", a).await;
    shared
        .wait("four fifths", MINUTES, |p| {
            p.committed_total() >= 4 * total / 5
        })
        .await;
    stop_b.cancel();
    stopped("b", b).await;
    own[2]
        .wait("c to take every partition", MINUTES, |p| {
            p.assigned_now().len() == 6
        })
        .await;
    shared.wait_for_ends(&ends, MINUTES).await;
    stop_c.cancel();
    stopped("c", c).await;

    let client = db.client().await;
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
    // Nothing lost, nothing waiting, and the stream's duplicates were all counted.
    let (applied, duplicates, dead, waiting): (i64, i64, i64, i64) = {
        let r = client
            .query_one(
                "SELECT sum(applied)::bigint, sum(duplicates)::bigint, sum(dead_lettered)::bigint, sum(waiting)::bigint \
                 FROM projector.offsets WHERE consumer = 'trail_v1'",
                &[],
            )
            .await
            .expect("counters");
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    assert_eq!(applied, events.len() as i64);
    assert_eq!(duplicates, (stream.len() - events.len()) as i64);
    assert_eq!((dead, waiting), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republished_events_are_dropped() {
    let (db, applier) = setup().await;
    let broker = Broker::start(&[("fills", 3)]);
    let topic = broker.topic("fills");
    let events = fills(30, 20);
    let mut ends = publish(&broker.bootstrap_servers(), &topic, &events).await;
    let progress = Arc::new(Progress::default());
    let (stop, task) = spawn(&applier, &db, &broker.config(&topic), progress.clone());
    progress.wait_for_ends(&ends, MINUTES).await;
    // The producer republishes everything: same event ids, new offsets.
    add(
        &mut ends,
        &publish(&broker.bootstrap_servers(), &topic, &events).await,
    );
    progress.wait_for_ends(&ends, MINUTES).await;
    stop.cancel();
    stopped("the consumer", task).await;

    let client = db.client().await;
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
    let duplicates: i64 = client
        .query_one("SELECT sum(duplicates)::bigint FROM projector.offsets", &[])
        .await
        .expect("duplicates")
        .get(0);
    assert_eq!(duplicates, events.len() as i64);
}

/// Holds the first batch of partition 0 until released: a consumer that stalls while
/// holding a batch.
struct Stall {
    progress: Arc<Progress>,
    stalled: tokio::sync::Notify,
    release: tokio::sync::Notify,
    once: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Observer for Stall {
    async fn before_apply(&self, _consumer: &str, batch: &Batch) {
        if batch.partition == 0 && !self.once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let released = self.release.notified();
            self.stalled.notify_one();
            released.await;
        }
    }
    fn committed(&self, c: &str, partition: i32, next_offset: i64) {
        self.progress.committed(c, partition, next_offset);
    }
    fn fenced(&self, c: &str, partition: i32, start: i64, stored: i64) {
        self.progress.fenced(c, partition, start, stored);
    }
    fn assigned(&self, c: &str, partitions: &[i32]) {
        self.progress.assigned(c, partitions);
    }
    fn revoked(&self, c: &str, partitions: &[i32]) {
        self.progress.revoked(c, partitions);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_cannot_commit_after_its_partition_moved() {
    let (db, applier) = setup().await;
    let broker = Broker::start(&[("fills", 1)]);
    let topic = broker.topic("fills");
    let events = fills(10, 100);
    let ends = publish(&broker.bootstrap_servers(), &topic, &events).await;
    let mut zombie_cfg = broker.config(&topic);
    zombie_cfg.max_batch_messages = 10;
    // The stalled worker fills its queue, the poll thread blocks behind it and stops polling;
    // past max.poll.interval.ms librdkafka leaves the group and the partition moves.
    zombie_cfg
        .properties
        .push(("max.poll.interval.ms".to_owned(), "4000".to_owned()));

    let zombie_progress = Arc::new(Progress::default());
    let stall = Arc::new(Stall {
        progress: zombie_progress.clone(),
        stalled: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
        once: std::sync::atomic::AtomicBool::new(false),
    });
    let (stop_zombie, zombie) = spawn(&applier, &db, &zombie_cfg, stall.clone());
    stall.stalled.notified().await;

    let heir_progress = Arc::new(Progress::default());
    let (stop_heir, heir) = spawn(&applier, &db, &broker.config(&topic), heir_progress.clone());
    heir_progress.wait_for_ends(&ends, MINUTES).await;

    // The zombie wakes up and tries to apply the batch it held: fenced, nothing committed.
    stall.release.notify_one();
    zombie_progress
        .wait("the zombie to be fenced", MINUTES, |p| {
            !p.fenced_list().is_empty()
        })
        .await;
    let (partition, start, stored) = zombie_progress.fenced_list()[0];
    assert_eq!((partition, start), (0, 0));
    assert!(stored > 0);
    assert_eq!(
        zombie_progress.committed_total(),
        0,
        "the zombie committed nothing"
    );

    stop_zombie.cancel();
    stop_heir.cancel();
    zombie.await.expect("zombie stopped");
    heir.await.expect("heir stopped");
    let client = db.client().await;
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
}
