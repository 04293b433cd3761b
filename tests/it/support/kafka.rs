//! Kafka helpers for tests: publishing through the real producer path, and an observer that
//! lets a test await progress instead of sleeping.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use projector_devkit::devbroker::CONSUMER_PROPERTIES;
use projector_devkit::publish::{publish_lines, PublishConfig};
use projector_engine::kafka::source::Observer;
use projector_engine::testkit::EventSpec;
use projector_engine::Batch;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use tokio::sync::{mpsc, oneshot, Notify};

/// Publishes events (JSON lines through `publish_lines`) and returns messages per partition.
pub async fn publish(bootstrap: &str, topic: &str, events: &[EventSpec]) -> BTreeMap<i32, u64> {
    let mut lines = Vec::new();
    for e in events {
        lines.extend_from_slice(&e.payload());
        lines.push(b'\n');
    }
    let mut config = PublishConfig::new(bootstrap, topic);
    config.properties = super::broker::producer_properties();
    let report = publish_lines(&lines[..], &config).await.expect("publish");
    assert_eq!(report.sent, events.len() as u64);
    report.partitions
}

/// A message as it goes on the wire, poison included: the key, and the value's bytes.
pub type Raw = (Option<Vec<u8>>, Vec<u8>);

/// Publishes raw messages, in order, with the producer settings of `projector publish` (the
/// Java client's partitioner, idempotence, acks=all) but none of its checks, so poison
/// reaches the topic. Returns where each message landed: (partition, offset).
pub async fn publish_raw(bootstrap: &str, topic: &str, messages: &[Raw]) -> Vec<(i32, i64)> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .set("acks", "all");
    for (k, v) in super::broker::producer_properties() {
        config.set(k, v);
    }
    let producer: FutureProducer = config.create().expect("producer");
    let mut deliveries = Vec::with_capacity(messages.len());
    for (key, payload) in messages {
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(&payload[..]);
        if let Some(key) = key {
            record = record.key(&key[..]);
        }
        deliveries.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .expect("queue"),
        );
    }
    let mut landed = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let delivery = d
            .await
            .expect("delivery report")
            .map_err(|(e, _)| e)
            .expect("delivered");
        landed.push((delivery.partition, delivery.offset));
    }
    landed
}

/// The end offset of each partition after messages landed where `landed` says.
pub fn ends_of(landed: &[(i32, i64)]) -> BTreeMap<i32, u64> {
    let mut ends = BTreeMap::new();
    for &(partition, offset) in landed {
        let end = ends.entry(partition).or_insert(0u64);
        *end = (*end).max(offset as u64 + 1);
    }
    ends
}

/// Adds per-partition counts.
pub fn add(into: &mut BTreeMap<i32, u64>, more: &BTreeMap<i32, u64>) {
    for (p, n) in more {
        *into.entry(*p).or_default() += n;
    }
}

/// Records what the source reports.
#[derive(Default)]
pub struct Progress {
    committed: Mutex<HashMap<i32, i64>>,
    batches: Mutex<u64>,
    fenced: Mutex<Vec<(i32, i64, i64)>>,
    assigned: Mutex<Vec<i32>>,
    kafka_troubles: Mutex<u64>,
    changed: Notify,
}

impl Progress {
    pub fn kafka_troubles(&self) -> u64 {
        *self.kafka_troubles.lock().expect("lock")
    }

    pub fn committed_total(&self) -> i64 {
        self.committed.lock().expect("lock").values().sum()
    }

    pub fn fenced_list(&self) -> Vec<(i32, i64, i64)> {
        self.fenced.lock().expect("lock").clone()
    }

    pub fn assigned_now(&self) -> Vec<i32> {
        let mut a = self.assigned.lock().expect("lock").clone();
        a.sort();
        a
    }

    /// Waits until `done` holds, or panics at the deadline with `what`.
    pub async fn wait(&self, what: &str, timeout: Duration, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if done(self) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("timed out waiting for {what}");
            }
        }
    }

    /// Waits until every partition's committed offset reaches `ends`.
    pub async fn wait_for_ends(&self, ends: &BTreeMap<i32, u64>, timeout: Duration) {
        self.wait("every partition to be consumed", timeout, |p| {
            let c = p.committed.lock().expect("lock");
            ends.iter()
                .all(|(part, end)| c.get(part).copied().unwrap_or(0) >= *end as i64)
        })
        .await;
    }
}

impl Observer for Progress {
    fn committed(&self, _consumer: &str, partition: i32, next_offset: i64) {
        {
            let mut c = self.committed.lock().expect("lock");
            let e = c.entry(partition).or_default();
            *e = (*e).max(next_offset);
            *self.batches.lock().expect("lock") += 1;
        }
        self.changed.notify_waiters();
    }

    fn fenced(&self, _consumer: &str, partition: i32, start: i64, stored: i64) {
        self.fenced
            .lock()
            .expect("lock")
            .push((partition, start, stored));
        self.changed.notify_waiters();
    }

    fn kafka_trouble(&self, _consumer: &str, _error: &str) {
        *self.kafka_troubles.lock().expect("lock") += 1;
        self.changed.notify_waiters();
    }

    fn assigned(&self, _consumer: &str, partitions: &[i32]) {
        self.assigned
            .lock()
            .expect("lock")
            .extend_from_slice(partitions);
        self.changed.notify_waiters();
    }

    fn revoked(&self, _consumer: &str, partitions: &[i32]) {
        self.assigned
            .lock()
            .expect("lock")
            .retain(|p| !partitions.contains(p));
        self.changed.notify_waiters();
    }
}

/// Forwards to two observers: one shared by every consumer, one of this consumer's own.
pub struct Tee(pub std::sync::Arc<Progress>, pub std::sync::Arc<Progress>);

impl Observer for Tee {
    fn committed(&self, c: &str, partition: i32, next_offset: i64) {
        self.0.committed(c, partition, next_offset);
        self.1.committed(c, partition, next_offset);
    }
    fn fenced(&self, c: &str, partition: i32, start: i64, stored: i64) {
        self.0.fenced(c, partition, start, stored);
        self.1.fenced(c, partition, start, stored);
    }
    fn assigned(&self, c: &str, partitions: &[i32]) {
        self.0.assigned(c, partitions);
        self.1.assigned(c, partitions);
    }
    fn revoked(&self, c: &str, partitions: &[i32]) {
        self.0.revoked(c, partitions);
        self.1.revoked(c, partitions);
    }
}

/// Short sessions: a member that leaves or dies is out of its group in seconds, and on
/// tansu, whose first join of a group takes about half the session timeout, a group forms in
/// about 2 s instead of 23.
pub const SESSION_PROPERTIES: &[(&str, &str)] = &[
    ("session.timeout.ms", "3000"),
    ("heartbeat.interval.ms", "300"),
];

/// A consumer configuration for tests on the dev broker: short sessions
/// ([`SESSION_PROPERTIES`]), what the mock needs ([`CONSUMER_PROPERTIES`]), and small batches
/// so that rebalances happen mid-stream. [`super::broker::Kafka::config`] is the same for
/// any broker.
pub fn config(bootstrap: &str, topic: &str) -> projector_engine::kafka::source::KafkaConfig {
    let mut c = projector_engine::kafka::source::KafkaConfig::new(bootstrap, topic);
    c.properties = SESSION_PROPERTIES
        .iter()
        .chain(CONSUMER_PROPERTIES)
        .map(|&(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    c.max_batch_messages = 250;
    c
}

/// A batch held in `before_apply` by [`Hold`]; the worker goes on when this is released (or
/// dropped).
pub struct Held {
    pub batch: Batch,
    release: oneshot::Sender<()>,
}

impl Held {
    /// Lets the worker apply the batch.
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

/// Holds the first batch `when` picks in `before_apply`, hands it to the test and waits
/// until the test releases it: a worker stopped at a chosen instant, with a chosen batch in
/// its hands. Everything else goes to `progress`.
pub struct Hold {
    pub progress: std::sync::Arc<Progress>,
    when: Box<dyn Fn(&Batch) -> bool + Send + Sync>,
    /// Taken by the first batch held: only one is.
    to_test: Mutex<Option<mpsc::UnboundedSender<Held>>>,
}

impl Hold {
    /// The observer, and where the test receives the held batch.
    pub fn new(
        progress: std::sync::Arc<Progress>,
        when: impl Fn(&Batch) -> bool + Send + Sync + 'static,
    ) -> (std::sync::Arc<Self>, mpsc::UnboundedReceiver<Held>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let hold = Self {
            progress,
            when: Box::new(when),
            to_test: Mutex::new(Some(tx)),
        };
        (std::sync::Arc::new(hold), rx)
    }
}

#[async_trait::async_trait]
impl Observer for Hold {
    async fn before_apply(&self, _consumer: &str, batch: &Batch) {
        let to_test = if (self.when)(batch) {
            self.to_test.lock().expect("lock").take()
        } else {
            None
        };
        if let Some(to_test) = to_test {
            let (release, released) = oneshot::channel();
            let held = Held {
                batch: batch.clone(),
                release,
            };
            if to_test.send(held).is_ok() {
                let _ = released.await;
            }
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

/// Waits for the batch a [`Hold`] holds, or panics after `timeout`.
pub async fn held(rx: &mut mpsc::UnboundedReceiver<Held>, timeout: Duration) -> Held {
    tokio::time::timeout(timeout, rx.recv())
        .await
        .expect("timed out waiting for the worker to reach the batch to hold")
        .expect("the observer is gone")
}
