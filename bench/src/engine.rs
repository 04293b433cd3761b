//! The engine's phases: view versions consuming a topic of the dev broker through
//! `run_views`, exactly as `projector run` does, watched through the source's [`Observer`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use projector_devkit::publish::{check_line, PublishConfig, PublishReport};
use projector_engine::kafka::source::{run_views, KafkaConfig, Observer};
use projector_engine::Applier;
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer,
};
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use crate::error::{mismatch, stop, BenchError, Doing as _};

/// How long a phase may take before the bench gives up on it.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Default)]
struct State {
    /// (consumer, partition) -> committed next offset.
    committed: HashMap<(String, i32), i64>,
    /// Partitions assigned per consumer.
    assigned: HashMap<String, Vec<i32>>,
    first_assigned: Option<Instant>,
    /// When each consumer reached every end offset.
    finished: HashMap<String, Instant>,
    /// Every commit, when `log` is on: (when, partition, next offset).
    log: Vec<(Instant, i32, i64)>,
}

/// Records what the source reports, and when.
pub struct Watch {
    consumers: Vec<String>,
    ends: BTreeMap<i32, i64>,
    log: bool,
    state: Mutex<State>,
    changed: Notify,
    /// Told the index of every line the feed hands to the producer, and when (the
    /// read-your-writes phase's readers).
    sent: Mutex<Option<tokio::sync::mpsc::UnboundedSender<(usize, Instant)>>>,
}

impl Watch {
    /// Watches `consumers` until each has committed `ends` (partition -> next offset).
    pub fn new(consumers: Vec<String>, ends: BTreeMap<i32, i64>, log: bool) -> Arc<Self> {
        Arc::new(Self {
            consumers,
            ends,
            log,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            sent: Mutex::new(None),
        })
    }

    /// Tells `to` of every line the feed sends from now on: its index and when.
    pub fn tell_sent(&self, to: tokio::sync::mpsc::UnboundedSender<(usize, Instant)>) {
        *self.sent.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
    }

    /// Stops telling (the receiver then sees the end).
    pub fn stop_telling(&self) {
        *self.sent.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn sent(&self, index: usize, at: Instant) {
        if let Some(to) = &*self.sent.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = to.send((index, at));
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock means an observer call panicked; the data is still usable.
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Events committed so far, summed over consumers.
    pub fn committed_total(&self) -> i64 {
        self.with(|s| s.committed.values().sum())
    }

    /// Every commit, for the latency phase.
    pub fn take_log(&self) -> Vec<(Instant, i32, i64)> {
        self.with(|s| std::mem::take(&mut s.log))
    }

    /// Waits until every consumer has committed something: the first event of a live feed
    /// is visible, and the feed goes on.
    pub async fn first_visible(&self) -> Result<(), BenchError> {
        let consumers = self.consumers.clone();
        self.wait("the first event to be visible", |s| {
            consumers.iter().all(|c| {
                s.committed
                    .iter()
                    .any(|((consumer, _), next)| consumer == c && *next > 0)
            })
        })
        .await
    }

    /// Waits until the consumers have committed `events` events in all: a paced feed is
    /// in its steady state.
    pub async fn committed_at_least(&self, events: i64) -> Result<(), BenchError> {
        self.wait(&format!("{events} events to be visible"), |s| {
            s.committed.values().sum::<i64>() >= events
        })
        .await
    }

    async fn wait(&self, what: &str, done: impl Fn(&State) -> bool) -> Result<(), BenchError> {
        let deadline = tokio::time::Instant::now() + PHASE_TIMEOUT;
        loop {
            let notified = self.changed.notified();
            if self.with(|s| done(s)) {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                stop!("timed out after {PHASE_TIMEOUT:?} waiting for {what}");
            }
        }
    }
}

impl Observer for Watch {
    fn committed(&self, consumer: &str, partition: i32, next_offset: i64) {
        let now = Instant::now();
        self.with(|s| {
            s.committed
                .insert((consumer.to_owned(), partition), next_offset);
            if self.log {
                s.log.push((now, partition, next_offset));
            }
            let done = self.ends.iter().all(|(p, end)| {
                s.committed
                    .get(&(consumer.to_owned(), *p))
                    .copied()
                    .unwrap_or(0)
                    >= *end
            });
            if done {
                s.finished.entry(consumer.to_owned()).or_insert(now);
            }
        });
        self.changed.notify_waiters();
    }

    fn assigned(&self, consumer: &str, partitions: &[i32]) {
        let now = Instant::now();
        self.with(|s| {
            s.first_assigned.get_or_insert(now);
            s.assigned
                .entry(consumer.to_owned())
                .or_default()
                .extend_from_slice(partitions);
        });
        self.changed.notify_waiters();
    }

    fn fenced(&self, consumer: &str, partition: i32, start: i64, stored: i64) {
        // A single consumer per group is never fenced; if it happens, the log says so.
        tracing::warn!(
            consumer,
            partition,
            start,
            stored,
            "bench: a batch was fenced"
        );
    }
}

/// What to feed the topic while the views run.
pub enum Feed {
    /// Nothing: the topic is already full (catch-up from the earliest offset).
    Backlog,
    /// These JSON lines, published while the views run: the first alone, and once it is
    /// visible, the rest as fast as the producer takes them.
    Live(Vec<String>),
    /// The first line alone, and once it is visible, the rest at this rate per second.
    Paced(Vec<String>, u64),
}

/// What a phase measured.
pub struct Run {
    /// Events each view applied inside the timed window.
    pub events: u64,
    /// The timed window: from the assignment (backlog) or from the moment the first event
    /// was visible (live feeds), to the last commit.
    pub elapsed: Duration,
    /// For a fed topic, when each line was handed to the producer.
    pub sent_at: Vec<Instant>,
    /// Every commit, when the watch logs them.
    pub commits: Vec<(Instant, i32, i64)>,
}

/// Runs `appliers` on `config.topic` until each has committed `watch`'s end offsets, feeding
/// the topic as `feed` says, and stops them cleanly.
pub async fn run(
    label: &str,
    pool: &Pool,
    appliers: Vec<Arc<Applier>>,
    config: KafkaConfig,
    watch: Arc<Watch>,
    feed: Feed,
) -> Result<Run, BenchError> {
    let per_view: i64 = watch.ends.values().sum();
    let total = per_view * appliers.len() as i64;
    let partitions = config_partitions(&watch);
    let token = CancellationToken::new();
    let mut task = tokio::spawn(run_views(
        appliers,
        pool.clone(),
        config.clone(),
        watch.clone(),
        token.clone(),
    ));
    let ticker = tokio::spawn(progress(label.to_owned(), watch.clone(), total));

    let result = async {
        let consumers = watch.consumers.clone();
        watch
            .wait("every partition to be assigned", |s| {
                consumers.iter().all(|c| {
                    s.assigned
                        .get(c)
                        .is_some_and(|a| partitions.iter().all(|p| a.contains(p)))
                })
            })
            .await?;
        let (released_tx, released_rx) = oneshot::channel();
        let (producer, warm_up) = match feed {
            Feed::Backlog => (None, 0),
            Feed::Live(lines) => (Some(produce(&config, lines, None, &watch, released_tx)), 1),
            Feed::Paced(lines, rate) => (
                Some(produce(&config, lines, Some(rate), &watch, released_tx)),
                1,
            ),
        };
        let started = match &producer {
            None => watch.with(|s| s.first_assigned).unwrap_or_else(Instant::now),
            Some(_) => match released_rx.await {
                Ok(at) => at,
                // The producer gave up before its first event was visible: say why.
                Err(_) => match producer {
                    Some(p) => {
                        p.await.doing("the producer thread failed")??;
                        stop!("the producer stopped before its first event was visible")
                    }
                    None => stop!("no producer"),
                },
            },
        };
        let consumers = watch.consumers.clone();
        let done = watch.wait("every event to be committed", |s| {
            consumers.iter().all(|c| s.finished.contains_key(c))
        });
        tokio::select! {
            r = done => r?,
            // A view that stops early (a fatal error) ends run_views; say why.
            r = &mut task => {
                match r {
                    Ok(Ok(())) => stop!("the views stopped before consuming everything"),
                    Ok(Err(errors)) => stop!("the views stopped: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")),
                    Err(e) => stop!("the view task failed: {e}"),
                }
            }
        }
        let sent_at = match producer {
            None => Vec::new(),
            Some(p) => {
                let (report, sent_at) = p.await.doing("the producer thread failed")??;
                same_partitions(&report, &watch.ends)?;
                sent_at
            }
        };
        let finished = watch.with(|s| s.finished.values().max().copied());
        let elapsed = finished
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(started);
        Ok(Run {
            events: u64::try_from(per_view - warm_up).unwrap_or(0),
            elapsed,
            sent_at,
            commits: watch.take_log(),
        })
    }
    .await;

    ticker.abort();
    token.cancel();
    if !task.is_finished() {
        match tokio::time::timeout(Duration::from_secs(60), &mut task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(errors))) if result.is_ok() => stop!(
                "{label}: the views stopped with errors: {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            Ok(_) => {}
            Err(_) => stop!("{label}: the views did not stop within a minute"),
        }
    }
    result.doing_with(|| format!("phase {label}"))
}

/// The producer of `projector publish`, with lz4 compression: the mock cluster keeps at
/// most 5 MiB of message sets per partition and drops the oldest beyond that (a limit
/// librdkafka hard-codes in the mock cluster, not configurable), and compressed sets let a partition hold about four
/// times as many events. Consumers decompress, as they would against a real cluster.
fn producer(brokers: &str, topic: &str) -> PublishConfig {
    let mut config = PublishConfig::new(brokers, topic);
    config
        .properties
        .push(("compression.type".to_owned(), "lz4".to_owned()));
    config
}

type Produced = Result<(PublishReport, Vec<Instant>), BenchError>;

/// Publishes `lines` while the views run, on a thread and runtime of its own, as a producer
/// in another process would be (on the engine's runtime, the sending loop would hold a
/// worker thread for whole bursts and starve the engine's tasks).
///
/// Every line is checked and keyed as `projector publish` does before anything is sent, so
/// that the timed window holds the engine's work and librdkafka's sending, not the feed's
/// own decoding (which cost about as much CPU per event as the engine's consumer, on the same
/// two cores). The first line goes alone, and nothing more until every view has committed
/// it: a new idempotent librdkafka producer waits about half a second for its producer id
/// before it delivers anything, and that start-up belongs to the producer, not to the
/// engine. Then `released` gets the time, and the rest goes as fast as the producer takes
/// it, or at `rate` per second. Returns when each line was handed to the producer.
fn produce(
    config: &KafkaConfig,
    lines: Vec<String>,
    rate: Option<u64>,
    watch: &Arc<Watch>,
    released: oneshot::Sender<Instant>,
) -> tokio::task::JoinHandle<Produced> {
    let (brokers, topic) = (config.brokers.clone(), config.topic.clone());
    let watch = watch.clone();
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .doing("cannot start the producer's runtime")?
            .block_on(feed(brokers, topic, lines, rate, watch, released))
    })
}

/// Counts the feed's deliveries per partition, and keeps the first failure.
#[derive(Default)]
struct Deliveries {
    report: Mutex<PublishReport>,
    failure: Mutex<Option<KafkaError>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        match result {
            Ok(message) => {
                let mut report = self.report.lock().unwrap_or_else(|e| e.into_inner());
                report.sent += 1;
                *report.partitions.entry(message.partition()).or_default() += 1;
            }
            Err((error, _)) => {
                let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
                failure.get_or_insert_with(|| error.clone());
            }
        }
    }
}

/// The feed's producer: `projector publish`'s settings, sending messages checked and keyed
/// beforehand.
type FeedProducer = ThreadedProducer<Deliveries>;

async fn feed(
    brokers: String,
    topic: String,
    lines: Vec<String>,
    rate: Option<u64>,
    watch: Arc<Watch>,
    released: oneshot::Sender<Instant>,
) -> Produced {
    let count = lines.len();
    let mut records = Vec::with_capacity(count);
    for (n, line) in lines.iter().enumerate() {
        match check_line(line.as_bytes()) {
            Ok(key) => records.push((key, line.as_str())),
            Err(reason) => mismatch!(
                "the bench generated a bad event on line {}: {reason}",
                n + 1
            ),
        }
    }
    let producer: FeedProducer = producer(&brokers, &topic)
        .client_config()
        .create_with_context(Deliveries::default())
        .doing("cannot create the feed's producer")?;
    let mut sent_at = Vec::with_capacity(count);
    let mut records = records.into_iter();
    let Some(first) = records.next() else {
        return Ok((PublishReport::default(), sent_at));
    };
    send(&producer, &topic, &first, &mut sent_at).await?;
    watch.first_visible().await?;
    let started = Instant::now();
    let _ = released.send(started);
    match rate {
        None => {
            for record in records {
                send(&producer, &topic, &record, &mut sent_at).await?;
            }
        }
        Some(rate) => {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let rest = count - 1;
            let mut done = 0usize;
            while done < rest {
                tick.tick().await;
                let due =
                    usize::try_from(started.elapsed().as_micros() * u128::from(rate) / 1_000_000)
                        .unwrap_or(usize::MAX)
                        .min(rest);
                while done < due {
                    let Some(record) = records.next() else { break };
                    send(&producer, &topic, &record, &mut sent_at).await?;
                    done += 1;
                    if let Some(&at) = sent_at.last() {
                        watch.sent(done, at);
                    }
                }
            }
        }
    }
    // Blocks this runtime's only thread, which has nothing else to do.
    producer
        .flush(PHASE_TIMEOUT)
        .doing_with(|| format!("waiting for the feed's deliveries to {topic}"))?;
    let deliveries = producer.context();
    if let Some(error) = deliveries
        .failure
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        return Err(error).doing_with(|| format!("publishing to {topic}"));
    }
    let report = deliveries
        .report
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if report.sent != count as u64 || sent_at.len() != count {
        mismatch!(
            "published {} of {count} events",
            report.sent.min(sent_at.len() as u64)
        );
    }
    Ok((report, sent_at))
}

/// Hands one checked message to the producer, waiting while its queue is full, and records
/// when it was handed over.
async fn send(
    producer: &FeedProducer,
    topic: &str,
    (key, payload): &(Vec<u8>, &str),
    sent_at: &mut Vec<Instant>,
) -> Result<(), BenchError> {
    sent_at.push(Instant::now());
    loop {
        match producer.send(BaseRecord::to(topic).key(key).payload(*payload)) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                // The producer's poll thread frees queue slots as deliveries come back.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err((error, _)) => {
                return Err(error).doing_with(|| format!("publishing to {topic}"));
            }
        }
    }
}

/// The producer must have put each event where the bench computed it would (murmur2 of the
/// account): the latency phase maps events to offsets by it.
fn same_partitions(report: &PublishReport, ends: &BTreeMap<i32, i64>) -> Result<(), BenchError> {
    let expected: BTreeMap<i32, u64> = ends
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(p, n)| (*p, n.unsigned_abs()))
        .collect();
    if report.partitions != expected {
        mismatch!(
            "the producer delivered {:?} events per partition; the bench expected {expected:?}",
            report.partitions
        );
    }
    Ok(())
}

fn config_partitions(watch: &Watch) -> Vec<i32> {
    watch.ends.keys().copied().collect()
}

/// Prints progress on stderr every few seconds.
async fn progress(label: String, watch: Arc<Watch>, total: i64) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.tick().await;
    loop {
        tick.tick().await;
        let done = watch.committed_total();
        eprintln!(
            "  {label}: {done} of {total} events committed after {} s",
            started.elapsed().as_secs()
        );
    }
}

/// Publish-to-visible latency of each paced event: the first commit of its partition whose
/// next offset passes the event's offset, minus when the event was handed to the producer.
pub fn latencies(
    placement: &[(i32, i64)],
    sent_at: &[Instant],
    commits: &[(Instant, i32, i64)],
) -> Result<Vec<Duration>, BenchError> {
    let mut by_partition: HashMap<i32, Vec<(i64, Instant)>> = HashMap::new();
    for &(at, p, next) in commits {
        by_partition.entry(p).or_default().push((next, at));
    }
    for list in by_partition.values_mut() {
        list.sort_by_key(|&(next, at)| (next, at));
    }
    let mut out = Vec::with_capacity(sent_at.len());
    for (&(p, offset), &sent) in placement.iter().zip(sent_at) {
        let list = by_partition.get(&p).map(Vec::as_slice).unwrap_or_default();
        let i = list.partition_point(|&(next, _)| next <= offset);
        let Some(&(_, visible)) = list.get(i) else {
            stop!("no commit covers partition {p} offset {offset}");
        };
        out.push(visible.saturating_duration_since(sent));
    }
    Ok(out)
}
