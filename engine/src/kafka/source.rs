//! The Kafka source: one consumer group per view version, offsets in PostgreSQL.
//!
//! Vocabulary: the *consumer* is a view version's name (`portfolio_v1`), the key of its
//! inbox rows, offsets and dead letters; the librdkafka handle that reads the topic for it
//! is its Kafka *client*, one member of the version's consumer group.
//!
//! Each view version runs one Kafka client on a dedicated thread (the *poll thread*) and
//! one tokio task per assigned partition (a *worker*). The poll thread only polls, routes
//! messages to workers and handles rebalances; workers batch and apply.
//!
//! - **Assignment.** The rebalance callback reads each new partition's `next_offset` from
//!   PostgreSQL and assigns the partition *at that offset* (earliest when the view version
//!   never committed it). Kafka's committed offsets are never used to resume.
//! - **Revocation.** The callback tells the partition's worker to stop and waits until its
//!   in-flight batch is committed or rolled back, then gives the partition up. The wait
//!   blocks the poll thread, never the async runtime.
//! - **Zombies.** A worker that lost its partition without noticing (a stall past the
//!   session timeout) finds its batch fenced by the offset row: it cannot commit.
//! - **Fencing never skips.** A fenced worker resumes exactly at the stored offset: from the
//!   messages it already holds when the offset lies among them (the later halves of a
//!   batch it split after an attempt timed out included), by dropping what another
//!   writer committed when it lies beyond, or by seeking the client back when it lies
//!   before them (messages fetched before the seek are told apart by an epoch).
//! - **Bounded waits.** A batch attempt that outlives [`KafkaConfig::attempt_timeout`] (a hung
//!   server or network) gives its connection up and is retried, so a revocation, which
//!   waits for in-flight batches, and a shutdown always finish.
//! - **Drains.** Waiting events a batch could not drain (it takes a thousand per account)
//!   are drained after it, step by step; one cut short stays parked at its next `seq`, and
//!   the partition's worker looks for such accounts when it starts and after a failed step.
//! - **Outages.** A batch that fails for database reasons is retried with backoff, with one
//!   log line when the incident starts and one when it ends; the offset never advances
//!   without the batch.
//! - **Kafka commits.** After a PostgreSQL commit, the offset is also committed to Kafka,
//!   asynchronously and only for lag tools; nothing reads it back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::apply::{Applier, ApplyError, Batch};
use crate::event::Message;

/// How a view version reads Kafka.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic every view reads.
    pub topic: String,
    /// Consumer groups are named `<group_prefix>.<view>_v<version>`.
    pub group_prefix: String,
    /// Static membership (`group.instance.id`): a restarted process takes its partitions back
    /// without a rebalance. Must be unique per process.
    pub instance_id: Option<String>,
    /// librdkafka properties passed through (`-X key=value`), applied last, so TLS, SASL and
    /// any tuning work against real brokers.
    pub properties: Vec<(String, String)>,
    /// A batch closes at this many messages...
    pub max_batch_messages: usize,
    /// ... or this many payload bytes ...
    pub max_batch_bytes: usize,
    /// ... or this long after its first message arrived, whichever comes first.
    pub linger: Duration,
    /// Commit offsets to Kafka too (after PostgreSQL), so lag tools see progress.
    pub commit_to_kafka: bool,
    /// The longest a batch attempt may take before its connection is given up and the batch
    /// retried; see [`crate::db::Settings::attempt_timeout`].
    pub attempt_timeout: Duration,
    /// At most this many messages a second for the view version, over all its partitions:
    /// a rebuild's budget, so that it never starves the live versions. `None`: no limit.
    pub max_rate: Option<u32>,
}

impl KafkaConfig {
    /// Defaults for the given brokers and topic.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topic: topic.into(),
            group_prefix: "projector".to_owned(),
            instance_id: None,
            properties: Vec::new(),
            max_batch_messages: 2000,
            max_batch_bytes: 4 << 20,
            // Under load the next batch is already waiting when one commits, so the linger
            // only matters to a stream that trickles in: there it is pure latency, and the
            // bench measured no throughput lost below 5 ms. 1 ms still lets the rest of a
            // fetch response arrive before the batch closes.
            linger: Duration::from_millis(1),
            commit_to_kafka: true,
            attempt_timeout: crate::db::Settings::default().attempt_timeout(),
            max_rate: None,
        }
    }

    /// The group id of a view version.
    pub fn group_id(&self, consumer: &str) -> String {
        format!("{}.{}", self.group_prefix, consumer)
    }

    /// A configuration for a client that joins no group (reading metadata, watermarks,
    /// offsets for a time): the brokers and every passed-through property, so TLS and SASL
    /// apply to it too.
    pub fn plain_client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("group.id", format!("{}.tools", self.group_prefix))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .set_log_level(RDKafkaLogLevel::Error);
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    fn client_config(&self, consumer: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("group.id", self.group_id(consumer))
            .set("client.id", format!("projector.{consumer}"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // Used only when the stored offset is no longer retained.
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            // Events of aborted transactions never reach a view.
            .set("isolation.level", "read_committed")
            // `fetch.wait.max.ms` stays librdkafka's (500 ms): a real broker answers a held
            // fetch as soon as data arrives (fetch.min.bytes=1), so the wait only sets how
            // often an idle consumer asks, twice a second per broker. A short wait is for
            // brokers that hold an empty fetch: librdkafka's mock cluster (the dev broker)
            // holds it for the whole wait even when data arrives meanwhile, about 250 ms of
            // every event's latency at 500 ms, so its users pass `-X fetch.wait.max.ms=10`
            // (`projector_devkit::devbroker::CONSUMER_PROPERTIES`). See docs/kafka.md.
            .set_log_level(RDKafkaLogLevel::Warning);
        if let Some(id) = &self.instance_id {
            c.set("group.instance.id", id);
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

/// Why a source stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// librdkafka refused the configuration or the subscription.
    #[error("{consumer}: kafka: {source}")]
    Kafka {
        /// View version.
        consumer: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The poll thread could not be started or panicked.
    #[error("{consumer}: {message}")]
    Thread {
        /// View version.
        consumer: String,
        /// What happened.
        message: String,
    },
    /// A batch could not be applied for a reason retrying cannot fix.
    #[error(transparent)]
    Apply(#[from] ApplyError),
}

/// Signals that tests and tools use to observe the source without sleeping.
#[async_trait::async_trait]
pub trait Observer: Send + Sync + 'static {
    /// A batch is about to be applied. A test can hold the worker here (a stall).
    async fn before_apply(&self, _consumer: &str, _batch: &Batch) {}
    /// A batch was committed to PostgreSQL.
    fn committed(&self, _consumer: &str, _partition: i32, _next_offset: i64) {}
    /// A batch was refused by fencing: another writer had committed past its start.
    fn fenced(&self, _consumer: &str, _partition: i32, _start: i64, _stored: i64) {}
    /// Kafka became unreachable or failed a request; called once per incident.
    fn kafka_trouble(&self, _consumer: &str, _error: &str) {}
    /// Partitions were assigned (after their offsets were read from PostgreSQL).
    fn assigned(&self, _consumer: &str, _partitions: &[i32]) {}
    /// Partitions were revoked (after their in-flight batches finished).
    fn revoked(&self, _consumer: &str, _partitions: &[i32]) {}
    /// A step draining the waiting events of `account` ended: committed (`Ok(more)`: true
    /// when another step follows), or failed (`Err`).
    fn drain_step(
        &self,
        _consumer: &str,
        _partition: i32,
        _account: i64,
        _result: Result<bool, &str>,
    ) {
    }
}

/// An observer that observes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;
impl Observer for NoObserver {}

/// A message on its way from the poll thread to a worker, with the partition's epoch when
/// it was polled: the epoch grows with every seek, and a worker that asked for a seek drops
/// what was fetched before it.
struct Fetched {
    epoch: u64,
    message: Message,
}

/// A worker's request to move its partition's fetch position (after a fencing that left
/// the stored offset before the messages it holds).
struct Seek {
    partition: i32,
    offset: i64,
}

struct WorkerHandle {
    messages: mpsc::Sender<Fetched>,
    /// The partition's epoch: how many seeks the poll thread has done for it.
    epoch: u64,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
}

struct Shared {
    applier: Arc<Applier>,
    pool: Pool,
    config: KafkaConfig,
    runtime: tokio::runtime::Handle,
    workers: Mutex<HashMap<i32, WorkerHandle>>,
    committed: std::sync::mpsc::Sender<(i32, i64)>,
    seeks: std::sync::mpsc::Sender<Seek>,
    observer: Arc<dyn Observer>,
    shutdown: CancellationToken,
    /// A fatal error from a worker, reported by `run`.
    fatal: Mutex<Option<SourceError>>,
    /// The next moment a batch may start under `config.max_rate`.
    rate_slot: tokio::sync::Mutex<tokio::time::Instant>,
}

impl Shared {
    /// Under a rate limit, the moment a batch of `messages` may start: slots are handed out
    /// in turn across the view's partitions, each as long as its messages take at the rate.
    async fn reserve(&self, messages: usize) -> Option<tokio::time::Instant> {
        let rate = self.config.max_rate.filter(|r| *r > 0)?;
        let cost = rate_cost(messages, rate);
        let mut next = self.rate_slot.lock().await;
        let start = (*next).max(tokio::time::Instant::now());
        *next = start + cost;
        Some(start)
    }
}

/// How long `messages` take at `rate` a second (integer arithmetic: no floats in this crate).
fn rate_cost(messages: usize, rate: u32) -> Duration {
    let nanos = (messages as u128) * 1_000_000_000 / u128::from(rate.max(1));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

struct Context {
    shared: Arc<Shared>,
    kafka_down: AtomicBool,
}

impl ClientContext for Context {
    fn error(&self, error: KafkaError, reason: &str) {
        // librdkafka repeats transport errors on every retry; say it once per incident.
        if !self.kafka_down.swap(true, Ordering::Relaxed) {
            tracing::warn!(consumer = %self.shared.applier.consumer(), %error, reason, "kafka unreachable; retrying");
            self.shared
                .observer
                .kafka_trouble(self.shared.applier.consumer(), &error.to_string());
        }
    }
}

impl ConsumerContext for Context {
    fn rebalance(
        &self,
        base: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(base.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut starts = Vec::with_capacity(partitions.len());
                for &p in &partitions {
                    let Some(stored) = self.stored_offset(p) else {
                        return; // shutting down: leave the assignment to the next owner
                    };
                    let offset = stored.map_or(Offset::Beginning, Offset::Offset);
                    if let Err(e) = tpl.set_partition_offset(&self.shared.config.topic, p, offset) {
                        tracing::error!(partition = p, error = %e, "cannot set the start offset");
                    }
                    starts.push((p, stored));
                }
                let result = if cooperative {
                    base.incremental_assign(tpl)
                } else {
                    base.assign(tpl)
                };
                if let Err(e) = result {
                    tracing::error!(consumer = %self.shared.applier.consumer(), error = %e, "assign failed");
                    return;
                }
                for (p, stored) in starts {
                    self.start_worker(p, stored);
                }
                tracing::info!(consumer = %self.shared.applier.consumer(), ?partitions, "partitions assigned");
                self.shared
                    .observer
                    .assigned(self.shared.applier.consumer(), &partitions);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // Eager revocation takes everything; cooperative only the listed partitions.
                let revoked: Vec<i32> = if cooperative {
                    partitions
                } else {
                    self.shared
                        .workers
                        .lock()
                        .map(|w| w.keys().copied().collect())
                        .unwrap_or_default()
                };
                self.stop_workers(&revoked);
                let result = if cooperative {
                    base.incremental_unassign(tpl)
                } else {
                    base.unassign()
                };
                if let Err(e) = result {
                    tracing::warn!(consumer = %self.shared.applier.consumer(), error = %e, "unassign failed");
                }
                tracing::info!(consumer = %self.shared.applier.consumer(), partitions = ?revoked, lost = base.assignment_lost(), "partitions revoked");
                self.shared
                    .observer
                    .revoked(self.shared.applier.consumer(), &revoked);
            }
            other => {
                tracing::error!(consumer = %self.shared.applier.consumer(), error = ?other, "rebalance error; dropping the assignment");
                let all: Vec<i32> = self
                    .shared
                    .workers
                    .lock()
                    .map(|w| w.keys().copied().collect())
                    .unwrap_or_default();
                self.stop_workers(&all);
                let _ = base.unassign();
            }
        }
    }
}

impl Context {
    /// The stored offset of a partition (`Some(None)`: never committed), retried while the
    /// database is down; `None` when shutting down first.
    fn stored_offset(&self, partition: i32) -> Option<Option<i64>> {
        let shared = &self.shared;
        let mut backoff = Backoff::new();
        loop {
            let read = async {
                let client = shared.pool.get().await.map_err(|e| e.to_string())?;
                shared
                    .applier
                    .stored_offset(&client, &shared.config.topic, partition)
                    .await
                    .map_err(|e| e.to_string())
            };
            let result = shared.runtime.block_on(async {
                tokio::time::timeout(shared.config.attempt_timeout, read)
                    .await
                    .unwrap_or_else(|_| Err("timed out".to_owned()))
            });
            match result {
                Ok(stored) => {
                    backoff.recovered(shared.applier.consumer(), "reading offsets");
                    return Some(stored);
                }
                Err(e) => {
                    backoff.failed(shared.applier.consumer(), "reading offsets", &e);
                    if shared.runtime.block_on(backoff.wait(&shared.shutdown)) {
                        return None;
                    }
                }
            }
        }
    }

    fn start_worker(&self, partition: i32, stored: Option<i64>) {
        let shared = self.shared.clone();
        let (tx, rx) = mpsc::channel(shared.config.max_batch_messages.max(1) * 2);
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let worker = Worker {
            shared: shared.clone(),
            partition,
            position: stored,
            epoch: 0,
            drain_due: Some(tokio::time::Instant::now()),
            drain_backoff: Backoff::new(),
        };
        let watched = shared.clone();
        shared.runtime.spawn(async move {
            let shared = watched;
            // A worker that panics (a bug) would leave its partition assigned and unread, the
            // poll thread dropping its messages, while the view looks alive. The panic ends
            // the view's attempt instead, as a fatal error: it is started again and reported.
            let ended = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
                worker.run(rx, stop_rx),
            ))
            .await;
            if let Err(panic) = ended {
                let message = crate::apply::panic_message(&*panic);
                tracing::error!(consumer = %shared.applier.consumer(), partition, %message, "a partition's worker panicked; stopping the view to start it again");
                if let Ok(mut fatal) = shared.fatal.lock() {
                    fatal.get_or_insert(SourceError::Thread {
                        consumer: shared.applier.consumer().to_owned(),
                        message: format!("the worker of partition {partition} panicked: {message}"),
                    });
                }
                shared.shutdown.cancel();
            }
            let _ = done_tx.send(());
        });
        let handle = WorkerHandle {
            messages: tx,
            epoch: 0,
            stop: Some(stop_tx),
            done: Some(done_rx),
        };
        if let Ok(mut workers) = self.shared.workers.lock() {
            workers.insert(partition, handle);
        };
    }

    /// Stops workers and waits until each has committed or rolled back its in-flight batch.
    fn stop_workers(&self, partitions: &[i32]) {
        let handles: Vec<WorkerHandle> = match self.shared.workers.lock() {
            Ok(mut workers) => partitions
                .iter()
                .filter_map(|p| workers.remove(p))
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut waits = Vec::new();
        for mut h in handles {
            if let Some(stop) = h.stop.take() {
                let _ = stop.send(());
            }
            if let Some(done) = h.done.take() {
                waits.push(done);
            }
        }
        for done in waits {
            let _ = done.blocking_recv();
        }
    }
}

struct Worker {
    shared: Arc<Shared>,
    partition: i32,
    /// The next offset to apply; `None` until the first batch of a never-committed partition.
    position: Option<i64>,
    /// Messages of older epochs were fetched before the last seek this worker asked for.
    epoch: u64,
    /// When to look for drains left unfinished on this partition ([`Worker::resume_drains`]):
    /// when the worker starts (the last owner may have stopped in the middle of one), and
    /// again after a drain step failed. `None`: none is known to be left.
    drain_due: Option<tokio::time::Instant>,
    /// Spaces the looks after failures, one log line per incident.
    drain_backoff: Backoff,
}

/// How draining waiting events ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// Everything that could follow was applied.
    Done,
    /// A step failed: what is left stays parked, and the worker looks again later.
    CutShort,
    /// The worker must end (revoked, or shutting down); the partition's next worker looks
    /// when it starts.
    Stop,
}

/// What the worker waits for between batches.
enum Next {
    Message(Message),
    /// It is time to look for drains left unfinished.
    DrainDue,
    /// The worker must end.
    End,
}

/// Whether the worker was told to stop. Consumes the signal: the worker must end at once,
/// and never poll `stop` again.
fn stop_requested(stop: &mut oneshot::Receiver<()>) -> bool {
    !matches!(stop.try_recv(), Err(oneshot::error::TryRecvError::Empty))
}

/// At most this many accounts' unfinished drains are looked up at a time.
const DRAINS_PER_LOOK: i64 = 100;

/// What the worker does after a batch was fenced at `stored`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resume {
    /// Apply the messages of the batch from `stored` on, now.
    Tail(Batch),
    /// Another writer committed past the batch: drop what arrives below `stored`.
    Skip,
    /// `stored` lies before the batch: the client must fetch again from there.
    SeekBack,
}

/// Where to resume after a fencing, so that no offset is skipped: the batch read
/// `[start, last]`; the partition is committed up to `stored`.
fn resume(batch: &Batch, stored: i64) -> Resume {
    if stored < batch.start_offset {
        return Resume::SeekBack;
    }
    let tail: Vec<Message> = batch
        .messages
        .iter()
        .filter(|m| m.offset >= stored)
        .cloned()
        .collect();
    if tail.is_empty() {
        Resume::Skip
    } else {
        Resume::Tail(Batch {
            topic: batch.topic.clone(),
            partition: batch.partition,
            start_offset: stored,
            messages: tail,
        })
    }
}

/// What a worker holds of the messages it read: the part it applies now and, after attempts
/// that timed out, the later parts of the batch it was cut from, the next one on top. The
/// parts are contiguous: each starts where the one before ends.
///
/// A fencing is judged against all of it, as one run: the stored offset may lie in any part,
/// and judged against the current part alone, an offset past it would read as "another
/// writer committed past the batch" and the later parts would be dropped, their offsets
/// skipped for good by the next batch, which starts at the stored offset.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    current: Batch,
    later: Vec<Batch>,
}

impl Held {
    fn new(batch: Batch) -> Self {
        Self {
            current: batch,
            later: Vec::new(),
        }
    }

    /// The part to apply now.
    fn current(&self) -> &Batch {
        &self.current
    }

    /// After an attempt timed out: the same work would time out the same way, so the first
    /// half goes now and the second after it.
    fn halve(&mut self) {
        let (first, rest) = halve(&self.current);
        self.later.push(rest);
        self.current = first;
    }

    /// After the current part committed: moves on to the next; false when none is left.
    fn advance(&mut self) -> bool {
        match self.later.pop() {
            Some(next) => {
                self.current = next;
                true
            }
            None => false,
        }
    }

    /// Where to resume after the current part was fenced at `stored`: everything held, from
    /// the current part's start to the last part's end, is one batch to [`resume`].
    fn fenced(self, stored: i64) -> Resume {
        let Held { current, later } = self;
        let mut run = current;
        for part in later.into_iter().rev() {
            run.messages.extend(part.messages);
        }
        resume(&run, stored)
    }
}

impl Worker {
    /// The next message of the current epoch, or the moment to look for unfinished drains.
    async fn next(
        &self,
        rx: &mut mpsc::Receiver<Fetched>,
        stop: &mut oneshot::Receiver<()>,
    ) -> Next {
        let due = self.drain_due;
        loop {
            let fetched = tokio::select! {
                biased;
                _ = &mut *stop => return Next::End,
                _ = self.shared.shutdown.cancelled() => return Next::End,
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => return Next::End,
                },
                // An idle partition looks too: the account whose drain was cut short may
                // never receive another event.
                _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                    return Next::DrainDue
                }
            };
            if fetched.epoch >= self.epoch {
                return Next::Message(fetched.message);
            }
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Fetched>, mut stop: oneshot::Receiver<()>) {
        let config = self.shared.config.clone();
        loop {
            let due = self
                .drain_due
                .is_some_and(|at| at <= tokio::time::Instant::now());
            if due && self.resume_drains(&mut stop).await == Drained::Stop {
                return;
            }
            let first = match self.next(&mut rx, &mut stop).await {
                Next::Message(m) => m,
                Next::DrainDue => continue,
                Next::End => return,
            };
            let mut messages = vec![first];
            let mut bytes = messages[0].payload.len();
            // The linger counts from the first message, so a batch waits at most that long
            // however the rest trickle in: a steady trickle must not hold a batch open until
            // it is full. Under load the channel already holds the next batch and nothing
            // waits at all.
            let deadline = tokio::time::Instant::now() + config.linger;
            while messages.len() < config.max_batch_messages && bytes < config.max_batch_bytes {
                let fetched = match rx.try_recv() {
                    Ok(f) => f,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        match tokio::time::timeout_at(deadline, rx.recv()).await {
                            Ok(Some(f)) => f,
                            _ => break,
                        }
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                };
                if fetched.epoch >= self.epoch {
                    bytes += fetched.message.payload.len();
                    messages.push(fetched.message);
                }
            }
            // After a fencing, messages below the stored offset were applied by someone else.
            let start = self.position.unwrap_or(messages[0].offset);
            messages.retain(|m| m.offset >= start);
            // librdkafka may move the fetch position back on its own (log truncation,
            // KIP-320): what it reads again is not new. A batch's offsets only increase.
            let mut floor = start - 1;
            messages.retain(|m| {
                let keep = m.offset > floor;
                floor = floor.max(m.offset);
                keep
            });
            if messages.is_empty() {
                continue;
            }
            let mut held = Held::new(Batch {
                topic: config.topic.clone(),
                partition: self.partition,
                start_offset: start,
                messages,
            });
            loop {
                match self.apply(held.current(), &mut stop).await {
                    Applied::Committed => {
                        if !held.advance() {
                            break;
                        }
                    }
                    Applied::Shrink => held.halve(),
                    Applied::Stop => return,
                    Applied::Fenced(stored) => match held.fenced(stored) {
                        Resume::Tail(tail) => held = Held::new(tail),
                        // Another writer committed past everything held.
                        Resume::Skip => {
                            self.position = Some(stored);
                            break;
                        }
                        // What is held is dropped: the client reads it again, from `stored`.
                        Resume::SeekBack => {
                            tracing::warn!(consumer = %self.shared.applier.consumer(), partition = self.partition, stored, "the stored offset is behind what this worker read; fetching again from it");
                            self.position = Some(stored);
                            self.epoch += 1;
                            let _ = self.shared.seeks.send(Seek {
                                partition: self.partition,
                                offset: stored,
                            });
                            break;
                        }
                    },
                }
            }
        }
    }

    /// Applies one batch, retrying database failures until it commits, is fenced, or the
    /// worker is told to stop. Each attempt is bounded: one that outlives the attempt
    /// timeout gives its connection up (the server ends its transaction) and is retried.
    async fn apply(&mut self, batch: &Batch, stop: &mut oneshot::Receiver<()>) -> Applied {
        let shared = self.shared.clone();
        let consumer = shared.applier.consumer().to_owned();
        let mut backoff = Backoff::new();
        if let Some(slot) = shared.reserve(batch.messages.len()).await {
            tokio::select! {
                _ = &mut *stop => return Applied::Stop,
                _ = shared.shutdown.cancelled() => return Applied::Stop,
                _ = tokio::time::sleep_until(slot) => {}
            }
        }
        shared.observer.before_apply(&consumer, batch).await;
        loop {
            let result = match shared.pool.get().await {
                Ok(mut client) => {
                    let attempt = tokio::time::timeout(
                        shared.config.attempt_timeout,
                        shared.applier.apply(&mut client, batch),
                    )
                    .await;
                    match attempt {
                        Ok(result) => result.map_err(Some),
                        Err(_) => {
                            // The answer is not coming: close the connection rather than
                            // hand it to the next batch.
                            drop(deadpool_postgres::Object::take(client));
                            backoff.failed(
                                &consumer,
                                "applying a batch",
                                "no answer from PostgreSQL within the attempt timeout",
                            );
                            // The same work would time out the same way: try half of it.
                            if batch.messages.len() > 1 {
                                return Applied::Shrink;
                            }
                            Err(None)
                        }
                    }
                }
                Err(e) => {
                    backoff.failed(&consumer, "connecting to PostgreSQL", &e.to_string());
                    Err(None)
                }
            };
            match result {
                Ok(outcome) => {
                    backoff.recovered(&consumer, "applying batches");
                    self.position = Some(outcome.next_offset);
                    let _ = shared.committed.send((self.partition, outcome.next_offset));
                    shared
                        .observer
                        .committed(&consumer, self.partition, outcome.next_offset);
                    if self.drain(&outcome.more_to_drain, stop).await == Drained::Stop {
                        return Applied::Stop;
                    }
                    return Applied::Committed;
                }
                Err(Some(ApplyError::Fenced { stored, start, .. })) => {
                    shared
                        .observer
                        .fenced(&consumer, self.partition, start, stored);
                    tracing::warn!(%consumer, partition = self.partition, start, stored, "fenced: another writer committed this partition; resuming at its offset");
                    return Applied::Fenced(stored);
                }
                Err(Some(e)) if e.is_retryable() => {
                    backoff.failed(&consumer, "applying a batch", &e.to_string())
                }
                Err(Some(e)) => {
                    tracing::error!(%consumer, partition = self.partition, error = %e, "cannot apply; stopping this view");
                    if let Ok(mut fatal) = shared.fatal.lock() {
                        fatal.get_or_insert(SourceError::Apply(e));
                    }
                    shared.shutdown.cancel();
                    return Applied::Stop;
                }
                Err(None) => {}
            }
            tokio::select! {
                _ = &mut *stop => return Applied::Stop,
                // A shutdown must not wait for a batch that cannot commit: the poll thread
                // may be blocked sending to this worker and never deliver `stop`.
                _ = shared.shutdown.cancelled() => return Applied::Stop,
                _ = backoff.sleep() => {}
            }
        }
    }

    /// Drains, step by bounded step, accounts whose waiting backlog one batch could not take
    /// all of. Nothing is lost when it stops short: each account stays parked at its next
    /// `seq` until all of it is drained, and that is what [`Worker::resume_drains`] looks
    /// for. So an account whose step fails is left for a look the failure schedules (the
    /// others go on; without a connection at all, none does), and a stop or a shutdown ends
    /// the drain at once, instead of holding a revocation for the whole backlog.
    async fn drain(&mut self, accounts: &[i64], stop: &mut oneshot::Receiver<()>) -> Drained {
        let shared = self.shared.clone();
        let consumer = shared.applier.consumer();
        let mut failed = false;
        'accounts: for &account in accounts {
            loop {
                if shared.shutdown.is_cancelled() || stop_requested(stop) {
                    return Drained::Stop;
                }
                let mut client = match shared.pool.get().await {
                    Ok(client) => client,
                    Err(e) => {
                        let e = e.to_string();
                        shared
                            .observer
                            .drain_step(consumer, self.partition, account, Err(&e));
                        self.drain_backoff
                            .failed(consumer, "connecting to PostgreSQL", &e);
                        failed = true;
                        break 'accounts;
                    }
                };
                let step = tokio::time::timeout(
                    shared.config.attempt_timeout,
                    shared.applier.drain_account(&mut client, account),
                )
                .await;
                let step = match step {
                    Ok(result) => result.map(|(_, more)| more).map_err(|e| e.to_string()),
                    Err(_) => {
                        drop(deadpool_postgres::Object::take(client));
                        Err("no answer from PostgreSQL within the attempt timeout".to_owned())
                    }
                };
                shared.observer.drain_step(
                    consumer,
                    self.partition,
                    account,
                    step.as_ref().map(|more| *more).map_err(String::as_str),
                );
                match step {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        self.drain_backoff
                            .failed(consumer, "draining waiting events", &e);
                        failed = true;
                        break;
                    }
                }
            }
        }
        if failed {
            self.drain_due = Some(tokio::time::Instant::now() + self.drain_backoff.delay());
            return Drained::CutShort;
        }
        Drained::Done
    }

    /// Drains what drains cut short left on this partition, without waiting for the
    /// accounts' next events (`queries::DRAINABLE_ACCOUNTS`): the last owner stopped in the
    /// middle of one, or a step failed.
    async fn resume_drains(&mut self, stop: &mut oneshot::Receiver<()>) -> Drained {
        let shared = self.shared.clone();
        let consumer = shared.applier.consumer();
        let look = async {
            let client = shared.pool.get().await.map_err(|e| e.to_string())?;
            shared
                .applier
                .drainable_accounts(
                    &client,
                    &shared.config.topic,
                    self.partition,
                    DRAINS_PER_LOOK,
                )
                .await
                .map_err(|e| e.to_string())
        };
        let looked = tokio::time::timeout(shared.config.attempt_timeout, look)
            .await
            .unwrap_or_else(|_| {
                Err("no answer from PostgreSQL within the attempt timeout".to_owned())
            });
        let accounts = match looked {
            Ok(accounts) => accounts,
            Err(e) => {
                self.drain_backoff
                    .failed(consumer, "looking for drains left unfinished", &e);
                self.drain_due = Some(tokio::time::Instant::now() + self.drain_backoff.delay());
                return Drained::CutShort;
            }
        };
        // A full page may have more behind it: look again at once.
        self.drain_due = (accounts.len() as i64 >= DRAINS_PER_LOOK).then(tokio::time::Instant::now);
        if !accounts.is_empty() {
            tracing::info!(%consumer, partition = self.partition, accounts = accounts.len(), "draining waiting events a drain left unfinished");
        }
        let drained = self.drain(&accounts, stop).await;
        if drained == Drained::Done {
            self.drain_backoff
                .recovered(consumer, "draining waiting events");
        }
        drained
    }
}

/// Splits a batch in two halves; the second starts where the first ends.
fn halve(batch: &Batch) -> (Batch, Batch) {
    let mid = batch.messages.len() / 2;
    let first = Batch {
        topic: batch.topic.clone(),
        partition: batch.partition,
        start_offset: batch.start_offset,
        messages: batch.messages[..mid].to_vec(),
    };
    let rest_start = first
        .messages
        .last()
        .map_or(batch.start_offset, |m| m.offset + 1);
    let rest = Batch {
        topic: batch.topic.clone(),
        partition: batch.partition,
        start_offset: rest_start,
        messages: batch.messages[mid..].to_vec(),
    };
    (first, rest)
}

/// How one batch ended.
enum Applied {
    Committed,
    /// Its attempt timed out: apply it in halves.
    Shrink,
    /// Fenced: the partition is committed up to this offset.
    Fenced(i64),
    /// The worker must end.
    Stop,
}

/// Exponential backoff with one log line per incident.
struct Backoff {
    delay: Duration,
    failures: u32,
}

impl Backoff {
    fn new() -> Self {
        Self {
            delay: Duration::from_millis(50),
            failures: 0,
        }
    }

    fn failed(&mut self, consumer: &str, doing: &str, error: &str) {
        if self.failures == 0 {
            tracing::warn!(%consumer, error, "{doing} failed; retrying with backoff");
        }
        self.failures += 1;
    }

    fn recovered(&mut self, consumer: &str, doing: &str) {
        if self.failures > 0 {
            tracing::warn!(%consumer, attempts = self.failures, "{doing} recovered");
        }
        self.failures = 0;
        self.delay = Duration::from_millis(50);
    }

    /// The wait before the next try; each is twice the last, up to five seconds.
    fn delay(&mut self) -> Duration {
        let delay = self.delay;
        self.delay = (self.delay * 2).min(Duration::from_secs(5));
        delay
    }

    async fn sleep(&mut self) {
        tokio::time::sleep(self.delay()).await;
    }

    /// Sleeps, unless shutdown comes first; returns true on shutdown.
    async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = self.sleep() => false,
        }
    }
}

/// Consumes the topic into one view version until `shutdown` is cancelled (or a batch fails
/// in a way retrying cannot fix). In-flight batches are committed or rolled back first.
pub async fn run_view(
    applier: Arc<Applier>,
    pool: Pool,
    config: KafkaConfig,
    observer: Arc<dyn Observer>,
    shutdown: CancellationToken,
) -> Result<(), SourceError> {
    match start_view(applier, pool, config, observer, shutdown).await? {
        Some(view) => view.finish().await,
        None => Ok(()),
    }
}

/// A view version whose statements are prepared and whose Kafka client has subscribed and
/// polls: it consumes until its `shutdown` is cancelled, or a worker cancels it with a fatal
/// error. [`RunningView::finish`] must be awaited: dropped, the poll thread would run on
/// until `shutdown` is cancelled, with nobody to report its error.
pub struct RunningView {
    consumer: String,
    shared: Arc<Shared>,
    poll: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for RunningView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningView")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

/// Starts consuming the topic into one view version: a connection, the view's statements
/// prepared (a broken view, or a table another session holds locked past the statement
/// timeout, fails here, before anything is consumed), the Kafka client subscribed and its
/// poll thread started. Consumption goes on until `shutdown` is cancelled; await
/// [`RunningView::finish`] for its end. `None`: `shutdown` was cancelled before the view
/// started; a start that waits on a lock does not hold a shutdown or a cutover up.
pub async fn start_view(
    applier: Arc<Applier>,
    pool: Pool,
    config: KafkaConfig,
    observer: Arc<dyn Observer>,
    shutdown: CancellationToken,
) -> Result<Option<RunningView>, SourceError> {
    let consumer_name = applier.consumer().to_owned();
    let kafka_error = |source| SourceError::Kafka {
        consumer: consumer_name.clone(),
        source,
    };
    {
        let connect = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            c = pool.get() => c,
        };
        let client = connect.map_err(|e| SourceError::Thread {
            consumer: consumer_name.clone(),
            message: format!("cannot connect to PostgreSQL: {e}"),
        })?;
        tokio::select! {
            _ = shutdown.cancelled() => {
                // The statement still waits on the server: the connection goes with it
                // rather than back to the pool, where the next batch would queue behind it.
                drop(deadpool_postgres::Object::take(client));
                return Ok(None);
            }
            prepared = applier.prepare(&client) => prepared?,
        }
    }
    let (committed_tx, committed_rx) = std::sync::mpsc::channel();
    let (seeks_tx, seeks_rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared {
        applier,
        pool,
        runtime: tokio::runtime::Handle::current(),
        workers: Mutex::new(HashMap::new()),
        committed: committed_tx,
        seeks: seeks_tx,
        observer,
        shutdown: shutdown.clone(),
        fatal: Mutex::new(None),
        rate_slot: tokio::sync::Mutex::new(tokio::time::Instant::now()),
        config,
    });
    let context = Context {
        shared: shared.clone(),
        kafka_down: AtomicBool::new(false),
    };
    let client: BaseConsumer<Context> = shared
        .config
        .client_config(&consumer_name)
        .create_with_context(context)
        .map_err(kafka_error)?;
    client
        .subscribe(&[&shared.config.topic])
        .map_err(kafka_error)?;

    let thread_shared = shared.clone();
    let poll = std::thread::Builder::new()
        .name(format!("poll-{consumer_name}"))
        .spawn(move || poll_loop(client, thread_shared, committed_rx, seeks_rx))
        .map_err(|e| SourceError::Thread {
            consumer: consumer_name.clone(),
            message: format!("cannot start the poll thread: {e}"),
        })?;
    Ok(Some(RunningView {
        consumer: consumer_name,
        shared,
        poll,
    }))
}

impl RunningView {
    /// Waits until the view stops: its `shutdown` cancelled from outside (`Ok`), or by a
    /// worker's fatal error (that error). In-flight batches are committed or rolled back
    /// and the client has left the group when this returns.
    pub async fn finish(self) -> Result<(), SourceError> {
        let RunningView {
            consumer,
            shared,
            poll,
        } = self;
        shared.shutdown.cancelled().await;
        tokio::task::spawn_blocking(move || poll.join())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| SourceError::Thread {
                consumer: consumer.clone(),
                message: "the poll thread panicked".to_owned(),
            })?;
        let fatal = shared.fatal.lock().ok().and_then(|mut f| f.take());
        match fatal {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn poll_loop(
    client: BaseConsumer<Context>,
    shared: Arc<Shared>,
    committed: std::sync::mpsc::Receiver<(i32, i64)>,
    seeks: std::sync::mpsc::Receiver<Seek>,
) {
    let topic = shared.config.topic.clone();
    let mut pending_seeks: Vec<Seek> = Vec::new();
    while !shared.shutdown.is_cancelled() {
        pending_seeks.extend(seeks.try_iter());
        pending_seeks.retain(|seek| !perform_seek(&client, &shared, seek));
        match client.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                client.context().kafka_down.store(false, Ordering::Relaxed);
                let message = Message::new(
                    m.offset(),
                    m.key().map(<[u8]>::to_vec),
                    m.payload().unwrap_or_default(),
                );
                let sender = shared
                    .workers
                    .lock()
                    .ok()
                    .and_then(|w| w.get(&m.partition()).map(|h| (h.messages.clone(), h.epoch)));
                if let Some((sender, epoch)) = sender {
                    let message = Fetched { epoch, message };
                    // Blocks when the worker is behind: back-pressure instead of memory. The
                    // non-blocking attempt first spares the common case the cost of parking
                    // this thread on a future.
                    if let Err(mpsc::error::TrySendError::Full(message)) = sender.try_send(message)
                    {
                        let _ = sender.blocking_send(message);
                    }
                }
            }
            // One line per incident: librdkafka repeats the error on every retry.
            Some(Err(e)) if !client.context().kafka_down.swap(true, Ordering::Relaxed) => {
                tracing::warn!(consumer = %shared.applier.consumer(), error = %e, "kafka client error; retrying");
                shared
                    .observer
                    .kafka_trouble(shared.applier.consumer(), &e.to_string());
            }
            Some(Err(_)) => {}
        }
        if shared.config.commit_to_kafka {
            let mut latest: HashMap<i32, i64> = HashMap::new();
            while let Ok((p, next)) = committed.try_recv() {
                latest.insert(p, next);
            }
            if !latest.is_empty() {
                let mut tpl = TopicPartitionList::new();
                for (p, next) in latest {
                    let _ = tpl.add_partition_offset(&topic, p, Offset::Offset(next));
                }
                if let Err(e) = client.commit(&tpl, CommitMode::Async) {
                    tracing::debug!(error = %e, "kafka-side commit skipped (lag tools only)");
                }
            }
        }
    }
    // Finish or roll back every in-flight batch, then leave the group.
    let all: Vec<i32> = shared
        .workers
        .lock()
        .map(|w| w.keys().copied().collect())
        .unwrap_or_default();
    client.context().stop_workers(&all);
    client.unsubscribe();
    drop(client);
}

/// Moves a partition's fetch position back to a fenced worker's stored offset. With a
/// timeout, librdkafka purges what it fetched for the old position before returning, so
/// every message polled afterwards belongs to the new epoch. Returns false to try again on
/// the next turn of the poll loop.
fn perform_seek(client: &BaseConsumer<Context>, shared: &Shared, seek: &Seek) -> bool {
    let Ok(mut workers) = shared.workers.lock() else {
        return true;
    };
    let Some(handle) = workers.get_mut(&seek.partition) else {
        return true; // revoked meanwhile: the next owner starts at the stored offset
    };
    match client.seek(
        &shared.config.topic,
        seek.partition,
        Offset::Offset(seek.offset),
        Duration::from_secs(5),
    ) {
        Ok(()) => {
            handle.epoch += 1;
            true
        }
        Err(e) => {
            tracing::warn!(consumer = %shared.applier.consumer(), partition = seek.partition, error = %e, "seek failed; retrying");
            false
        }
    }
}

/// Runs every given view version against the topic until `shutdown` is cancelled. Views are
/// independent: one that stops with an error does not stop the others; every error is
/// returned at the end.
pub async fn run_views(
    appliers: Vec<Arc<Applier>>,
    pool: Pool,
    config: KafkaConfig,
    observer: Arc<dyn Observer>,
    shutdown: CancellationToken,
) -> Result<(), Vec<SourceError>> {
    let mut tasks = Vec::new();
    for applier in appliers {
        // Each view gets its own token, so a fatal error in one cancels only that one.
        let token = shutdown.child_token();
        tasks.push(tokio::spawn(run_view(
            applier,
            pool.clone(),
            config.clone(),
            observer.clone(),
            token,
        )));
    }
    let mut errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(SourceError::Thread {
                consumer: "view task".to_owned(),
                message: e.to_string(),
            }),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(start: i64, offsets: &[i64]) -> Batch {
        Batch {
            topic: "t".to_owned(),
            partition: 0,
            start_offset: start,
            messages: offsets
                .iter()
                .map(|&o| Message::new(o, None, o.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_fencing_inside_the_batch_resumes_at_the_stored_offset() {
        // A zombie committed [100, 110) while this worker read [100, 120).
        let read = batch(100, &(100..120).collect::<Vec<_>>());
        let Resume::Tail(tail) = resume(&read, 110) else {
            panic!("the tail from 110 must be applied");
        };
        assert_eq!(tail.start_offset, 110);
        let offsets: Vec<i64> = tail.messages.iter().map(|m| m.offset).collect();
        assert_eq!(offsets, (110..120).collect::<Vec<_>>());
    }

    #[test]
    fn a_stored_offset_between_messages_keeps_every_later_one() {
        // Offsets 103 and 104 are transaction markers: no message carries them.
        let read = batch(100, &[100, 101, 102, 105, 106]);
        let Resume::Tail(tail) = resume(&read, 104) else {
            panic!("tail expected");
        };
        assert_eq!(tail.start_offset, 104);
        assert_eq!(tail.messages[0].offset, 105);
    }

    fn offsets_of(batch: &Batch) -> Vec<i64> {
        batch.messages.iter().map(|m| m.offset).collect()
    }

    /// [100, 120) halved twice: [100, 105) now, then [105, 110) and [110, 120).
    fn halved_twice() -> Held {
        let mut held = Held::new(batch(100, &(100..120).collect::<Vec<_>>()));
        held.halve();
        held.halve();
        held
    }

    #[test]
    fn halves_are_applied_in_offset_order() {
        let mut held = halved_twice();
        let mut parts = vec![(held.current().start_offset, offsets_of(held.current()))];
        while held.advance() {
            parts.push((held.current().start_offset, offsets_of(held.current())));
        }
        assert_eq!(
            parts,
            [
                (100, (100..105).collect::<Vec<_>>()),
                (105, (105..110).collect()),
                (110, (110..120).collect()),
            ]
        );
    }

    #[test]
    fn a_fencing_past_the_current_half_resumes_with_every_later_one() {
        // Fenced at 107 while applying [100, 105): 107..119 are still held, in two parts.
        let Resume::Tail(tail) = halved_twice().fenced(107) else {
            panic!("the rest from 107 must be applied");
        };
        assert_eq!(tail.start_offset, 107);
        assert_eq!(offsets_of(&tail), (107..120).collect::<Vec<_>>());

        // Fenced inside the last part.
        let Resume::Tail(tail) = halved_twice().fenced(115) else {
            panic!("the rest from 115 must be applied");
        };
        assert_eq!(
            (tail.start_offset, offsets_of(&tail)),
            (115, (115..120).collect())
        );
    }

    #[test]
    fn a_fencing_of_a_later_half_resumes_in_it_or_seeks_back() {
        let mut held = halved_twice();
        assert!(held.advance(), "[105, 110) is next");
        let Resume::Tail(tail) = held.clone().fenced(108) else {
            panic!("tail expected");
        };
        assert_eq!(
            (tail.start_offset, offsets_of(&tail)),
            (108, (108..120).collect())
        );
        // 100..104 committed and gone from memory: a stored offset among them is read again.
        assert_eq!(held.fenced(102), Resume::SeekBack);
    }

    #[test]
    fn a_fencing_past_everything_held_skips_it() {
        assert_eq!(halved_twice().fenced(120), Resume::Skip);
        assert_eq!(halved_twice().fenced(500), Resume::Skip);
        assert_eq!(halved_twice().fenced(99), Resume::SeekBack);
    }

    #[test]
    fn a_rate_limit_costs_messages_over_rate_seconds() {
        assert_eq!(rate_cost(500, 1000), Duration::from_millis(500));
        assert_eq!(rate_cost(3, 2), Duration::from_millis(1500));
        assert_eq!(rate_cost(1, 0), Duration::from_secs(1));
    }

    #[test]
    fn a_fencing_beyond_the_batch_skips_it_and_one_before_seeks_back() {
        let read = batch(100, &[100, 101]);
        assert_eq!(resume(&read, 102), Resume::Skip);
        assert_eq!(resume(&read, 500), Resume::Skip);
        assert_eq!(resume(&read, 99), Resume::SeekBack);
        assert_eq!(resume(&batch(100, &[]), 100), Resume::Skip);
    }

    // -----------------------------------------------------------------------------------
    // Review 8, hole 7: offsets that go back within one assignment stop the view for good.
    //
    // librdkafka itself moves a partition's fetch position back, without the application
    // asking: on log truncation detected through leader epochs (KIP-320, `rdkafka_offset.c`:
    // "Seek to the updated end offset") and on an offset reset. Messages of the same worker
    // epoch then arrive again at offsets the worker already holds. `Worker::run` builds the
    // batch from whatever the channel holds and only drops offsets below the batch's start,
    // so a batch can read [5, 6, 7, 5, 6, 7, 8]. `Applier::apply` refuses it as
    // `ApplyError::BadBatch`, which is not retryable: the worker records a fatal error and
    // cancels the whole view (`shared.shutdown`). One broker-side event stops every
    // partition of the view until the process is restarted. The worker should cut the
    // batch at the first offset that does not increase (and drop what it already holds).
    // -----------------------------------------------------------------------------------

    #[cfg(feature = "testkit")]
    #[derive(Debug)]
    struct Marks;

    #[cfg(feature = "testkit")]
    impl crate::projection::Projection for Marks {
        fn name(&self) -> &str {
            "marks"
        }
        fn version(&self) -> i32 {
            1
        }
        fn subscribes(&self) -> &[&str] {
            &["mark"]
        }
        fn dedup(&self) -> crate::projection::DedupMode {
            crate::projection::DedupMode::Inbox
        }
        fn ddl(&self) -> String {
            "CREATE TABLE IF NOT EXISTS marks_v{v} (account_id bigint PRIMARY KEY, n bigint NOT NULL)"
                .to_owned()
        }
        fn tables(&self) -> Vec<String> {
            vec!["marks_v{v}".to_owned()]
        }
        fn apply_sql(&self) -> crate::projection::ApplySql {
            crate::projection::ApplySql {
                ctes: String::new(),
                write: "INSERT INTO marks_v{v} AS m SELECT account_id, 1 FROM ev \
                        ON CONFLICT (account_id) DO UPDATE SET n = m.n + 1 RETURNING 1"
                    .to_owned(),
            }
        }
        fn read_sql(&self) -> String {
            "SELECT * FROM marks_v{v}".to_owned()
        }
    }

    #[cfg(feature = "testkit")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hole_g_offsets_that_go_back_do_not_stop_the_view() {
        let registry = crate::projection::Registry::new()
            .register(Marks)
            .expect("registry");
        let db = crate::testkit::TestDb::new(&registry).await;
        let applier = Arc::new(
            Applier::new(
                Arc::new(Marks),
                crate::projection::SourceOrdering::PerAccount,
            )
            .expect("applier"),
        );
        let (committed, _committed_rx) = std::sync::mpsc::channel();
        let (seeks, _seeks_rx) = std::sync::mpsc::channel();
        let mut config = KafkaConfig::new("unused:9092", "t");
        config.linger = Duration::from_millis(200);
        let shared = Arc::new(Shared {
            applier: applier.clone(),
            pool: db.pool().clone(),
            config,
            runtime: tokio::runtime::Handle::current(),
            workers: Mutex::new(HashMap::new()),
            committed,
            seeks,
            observer: Arc::new(NoObserver),
            shutdown: CancellationToken::new(),
            fatal: Mutex::new(None),
            rate_slot: tokio::sync::Mutex::new(tokio::time::Instant::now()),
        });
        let worker = Worker {
            shared: shared.clone(),
            partition: 0,
            position: Some(0),
            epoch: 0,
            drain_due: None,
            drain_backoff: Backoff::new(),
        };
        let message = |offset: i64| {
            let payload = serde_json::json!({
                "event_id": format!("m-{offset}"), "type": "mark", "account_id": 1, "seq": offset + 1,
                "occurred_at": "2026-11-29T10:15:00Z", "data": {},
            });
            Fetched {
                epoch: 0,
                message: Message::new(offset, Some(b"1".to_vec()), payload.to_string()),
            }
        };
        let (tx, rx) = mpsc::channel(100);
        // 0..=2, then librdkafka moves the fetch position back to 1 on its own: 1..=3.
        for offset in [0, 1, 2, 1, 2, 3] {
            tx.send(message(offset)).await.expect("send");
        }
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(worker.run(rx, stop_rx));
        let client = db.client().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut stored = None;
        while tokio::time::Instant::now() < deadline && !shared.shutdown.is_cancelled() {
            stored = applier
                .stored_offset(&client, "t", 0)
                .await
                .expect("offset");
            if stored == Some(4) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        let fatal = shared
            .fatal
            .lock()
            .expect("lock")
            .take()
            .map(|e| e.to_string());
        assert_eq!(
            (fatal, shared.shutdown.is_cancelled(), stored),
            (None, false, Some(4)),
            "the view must go on to offset 4, not stop"
        );
    }
}
