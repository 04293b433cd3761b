//! The tail: the new version consumes the topic under its own consumer name and group,
//! within a budget, while the live version keeps serving.
//!
//! Every tick it measures progress (events applied, lag per partition against the log's
//! high watermarks, rate, ETA) and looks at its registry row: paused (stop consuming until
//! resumed), cancelled (stop), cut over by someone else (stop). With automatic cutover it
//! stops consuming once the lag is under the threshold and cuts over; the running services
//! pick the new live version up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use projector_engine::kafka::log::{Extent, LogReader};
use projector_engine::kafka::running::{self, Session};
use projector_engine::kafka::source::{run_view, KafkaConfig, Observer, SourceError};
use projector_engine::progress;
use projector_engine::versions::VersionState;
use projector_engine::{Applier, Projection, Registry, SourceOrdering};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{db, RebuildError};
use crate::log;
use crate::state::{self, Cutover};
use crate::{cutover, Options, Outcome};

/// One partition's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLag {
    /// The partition.
    pub partition: i32,
    /// Where the new version is: its next offset (the log's start before its first batch).
    pub next_offset: i64,
    /// The log's high watermark.
    pub high: i64,
}

impl PartitionLag {
    /// Messages still to consume.
    pub fn lag(&self) -> i64 {
        (self.high - self.next_offset).max(0)
    }
}

/// A rebuild's progress, measured once a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The version's consumer name.
    pub consumer: String,
    /// Events applied so far.
    pub applied: i64,
    /// Messages consumed so far (applied, ignored, duplicates, dead letters, waiting).
    pub consumed: i64,
    /// Dead letters so far.
    pub dead_letters: i64,
    /// Accounts parked now.
    pub parked: i64,
    /// Per partition.
    pub partitions: Vec<PartitionLag>,
    /// Messages consumed per second over the last tick.
    pub rate: i64,
    /// Paused by an engineer.
    pub paused: bool,
}

impl Status {
    /// Messages still to consume, over every partition.
    pub fn lag(&self) -> i64 {
        self.partitions.iter().map(PartitionLag::lag).sum()
    }

    /// Time left at the current rate, when there is one.
    pub fn eta(&self) -> Option<Duration> {
        let rate = u64::try_from(self.rate).ok().filter(|r| *r > 0)?;
        let lag = u64::try_from(self.lag()).unwrap_or(0);
        Some(Duration::from_secs(lag.div_ceil(rate)))
    }
}

/// Where a rebuild reports: a progress bar on a terminal, plain lines elsewhere.
pub trait Progress: Send + Sync {
    /// A step worth a line of its own.
    fn message(&self, line: &str);
    /// The tick's measurement.
    fn status(&self, status: &Status);
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {
    fn message(&self, _: &str) {}
    fn status(&self, _: &Status) {}
}

struct Consuming {
    token: CancellationToken,
    task: JoinHandle<Result<(), SourceError>>,
}

impl Consuming {
    /// Stops the tail: its batches commit or roll back first. Returns the error it ended
    /// with, if any: only the tail that ended by itself says why it failed; a tail stopped on
    /// purpose (a pause, a cutover, a shutdown) is logged, never made the rebuild's error.
    async fn stop(self) -> Option<String> {
        self.token.cancel();
        match self.task.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Stops the tail on purpose; an error it ended with is logged.
    async fn stop_logged(self, consumer: &str) {
        if let Some(error) = self.stop().await {
            tracing::warn!(%consumer, %error, "the tail ended with an error as it was stopped");
        }
    }
}

/// When a tail that stopped with an error starts again: after 1 s, doubling up to a minute
/// for failures in a row; a tail that consumes for a minute starts the count afresh.
struct Restart {
    not_before: Option<Instant>,
    delay: Duration,
    consuming_since: Option<Instant>,
}

impl Restart {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    fn new() -> Self {
        Self {
            not_before: None,
            delay: Self::FIRST,
            consuming_since: None,
        }
    }

    /// Whether a stopped tail may start now.
    fn due(&self) -> bool {
        self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// The tail stopped with an error: how long until it starts again.
    fn failed(&mut self) -> Duration {
        if self
            .consuming_since
            .take()
            .is_some_and(|since| since.elapsed() >= Self::MAX)
        {
            self.delay = Self::FIRST;
        }
        let wait = self.delay;
        self.not_before = Some(Instant::now() + wait);
        self.delay = (self.delay * 2).min(Self::MAX);
        wait
    }

    /// The tail runs.
    fn consuming(&mut self) {
        self.consuming_since.get_or_insert_with(Instant::now);
    }
}

/// The offsets the tail's commits reached as PostgreSQL acknowledged them, per partition.
///
/// A rebuild commits with `synchronous_commit = off`: a crash of PostgreSQL may undo commits
/// it had acknowledged. The rows, inbox rows and offsets of each such batch go together, so
/// the result stays exact, but the tail's Kafka client has read past them, and a client at the
/// end of a quiet log would wait for a next message before its fencing finds the stored offset
/// behind it (a cutover waiting for the lag in vain meanwhile). So every tick compares: a
/// stored offset below one acknowledged means commits were lost, and the tail starts again
/// from the offsets PostgreSQL kept. Read before the offsets are: whatever was acknowledged
/// then is visible to the tick's query unless it was lost.
#[derive(Debug, Default)]
struct Acknowledged(std::sync::Mutex<std::collections::HashMap<i32, i64>>);

impl Acknowledged {
    fn offsets(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<i32, i64>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Observer for Acknowledged {
    fn committed(&self, _consumer: &str, partition: i32, next_offset: i64) {
        let mut offsets = self.offsets();
        let reached = offsets.entry(partition).or_insert(next_offset);
        *reached = (*reached).max(next_offset);
    }
}

/// The version a tail builds, and the session that holds its running lock ([`running`]).
pub(crate) struct Held<'a> {
    pub code: &'a Arc<dyn Projection>,
    pub session: &'a mut Session,
}

impl Held<'_> {
    /// Holds the running lock again on a new session when its session was lost (a killed
    /// backend, a cut network): without it a cancel would drop the version at once, under
    /// the tail's batches. Refused when a drop took the lock meanwhile.
    async fn keep(&mut self, pool: &Pool) -> Result<(), RebuildError> {
        if self.session.alive().await {
            return Ok(());
        }
        let session = Session::open(pool)
            .await
            .map_err(|e| RebuildError::Connect(e.to_string()))?;
        let consumer = self.code.consumer();
        if !running::try_hold(session.client(), &consumer)
            .await
            .map_err(db("taking the running lock again"))?
        {
            return Err(RebuildError::Refused(format!(
                "{consumer} lost its running lock and is being dropped meanwhile; stopped"
            )));
        }
        *self.session = session;
        Ok(())
    }
}

/// Tails until cutover, cancellation or `shutdown`.
pub(crate) async fn run(
    registry: &Registry,
    pool: &Pool,
    kafka: KafkaConfig,
    options: &Options,
    mut held: Held<'_>,
    progress: &dyn Progress,
    shutdown: CancellationToken,
) -> Result<Outcome, RebuildError> {
    let code = held.code;
    let name = code.name().to_owned();
    let version = code.version();
    let consumer = code.consumer();
    let applier = Arc::new(
        Applier::new(Arc::clone(code), SourceOrdering::PerAccount).map_err(RebuildError::View)?,
    );
    let mut config = kafka.clone();
    config.max_batch_messages = options.batch_messages.max(1);
    config.max_batch_bytes = config.max_batch_bytes.max(16 << 20);
    // Large batches fill faster than a live stream trickles: wait a little for them.
    config.linger = config.linger.max(Duration::from_millis(20));
    config.max_rate = options.max_rate;
    if !options.allow_gaps {
        // A stored offset that retention has dropped must stop the partition, not move it
        // silently to the log's new start (librdkafka's `earliest`): the messages between
        // would never reach this version. The stalled partition is then found below the
        // log's start at the next tick, and the rebuild stops, saying so.
        config
            .properties
            .push(("auto.offset.reset".to_owned(), "error".to_owned()));
    }
    let log = {
        let k = kafka.clone();
        tokio::task::spawn_blocking(move || log::connect(&k))
            .await
            .map_err(|e| RebuildError::Tail(e.to_string()))??
    };
    let log = Arc::new(std::sync::Mutex::new(log));

    let mut consuming: Option<Consuming> = None;
    let acknowledged = Arc::new(Acknowledged::default());
    // A tail that stopped with an error (it could not start: a table locked past the
    // statement timeout, PostgreSQL away) starts again after a backoff, never gives up.
    let mut restart = Restart::new();
    let mut last: Option<(Instant, i64)> = None;
    // The log as it stood when the tail started: all of it is consumed before an automatic
    // cutover, so a small topic is never cut over with its whole backlog under the lag
    // threshold and unapplied.
    let extents: Vec<Extent> = {
        let log = Arc::clone(&log);
        tokio::task::spawn_blocking(move || match log.lock() {
            Ok(l) => l.extents().map_err(RebuildError::from),
            Err(_) => Err(RebuildError::Tail("the log client panicked".to_owned())),
        })
        .await
        .map_err(|e| RebuildError::Tail(e.to_string()))??
    };
    let backlog: Vec<(i32, i64)> = extents.iter().map(|e| (e.partition, e.high)).collect();
    place(pool, &consumer, &kafka.topic, &extents).await?;
    // Every error of a tick ends the loop through the same door as an outcome, so that the
    // tail is stopped (its batches committed or rolled back) before the rebuild returns and
    // lets go of its running lock; a tail left running would write after a drop.
    let result = loop {
        let tick = async {
            held.keep(pool).await?;
            let row = state::of_version(
                &pool
                    .get()
                    .await
                    .map_err(|e| RebuildError::Connect(e.to_string()))?,
                &name,
                version,
            )
            .await?;
            let Some(row) = row else {
                return Ok(Some(Outcome::Cancelled { version }));
            };
            match row.phase.as_str() {
                "cancelled" => return Ok(Some(Outcome::Cancelled { version })),
                "done" => {
                    progress.message(&format!("{name} v{version} was cut over"));
                    return Ok(Some(Outcome::Stopped { version }));
                }
                _ => {}
            }
            let live_now = state::versions(
                &pool
                    .get()
                    .await
                    .map_err(|e| RebuildError::Connect(e.to_string()))?,
                &name,
            )
            .await?
            .iter()
            .any(|v| v.version == version && v.state == VersionState::Live);
            if live_now {
                progress.message(&format!("{name} v{version} is live now"));
                return Ok(Some(Outcome::Stopped { version }));
            }
            let acked = acknowledged.offsets().clone();
            let (status, overtaken) = measure(pool, &log, &consumer, row.paused, &mut last).await?;
            let lost: Vec<String> = status
                .partitions
                .iter()
                .filter_map(|p| {
                    let acked = *acked.get(&p.partition)?;
                    (acked > p.next_offset).then(|| {
                        format!("partition {} at {} of {acked}", p.partition, p.next_offset)
                    })
                })
                .collect();
            if !lost.is_empty() {
                // Only a tail that is stopped forgets what it read: the next one is assigned
                // at the offsets PostgreSQL kept, at once (no backoff: nothing failed here).
                if let Some(c) = consuming.take() {
                    c.stop_logged(&consumer).await;
                }
                acknowledged.offsets().clear();
                tracing::warn!(%consumer, lost = %lost.join(", "), "PostgreSQL lost commits it had acknowledged (a crash, with the rebuild's synchronous_commit = off); the tail starts again from what it kept");
                progress.message(&format!(
                    "PostgreSQL lost the last commits of {consumer} ({}); reading them again",
                    lost.join(", ")
                ));
            }
            if !options.allow_gaps && !overtaken.is_empty() {
                return Err(RebuildError::Overtaken {
                    detail: overtaken
                        .iter()
                        .map(|o| {
                            format!(
                                "partition {} at offset {}, the log now starts at {}",
                                o.partition, o.position, o.low
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
            match (row.paused, consuming.is_some()) {
                (true, true) => {
                    if let Some(c) = consuming.take() {
                        c.stop_logged(&consumer).await;
                    }
                    progress.message(&format!(
                        "paused; resume with `projector rebuild {name} --resume`"
                    ));
                }
                (false, false) if restart.due() => {
                    let token = shutdown.child_token();
                    let task = tokio::spawn(run_view(
                        applier.clone(),
                        pool.clone(),
                        config.clone(),
                        acknowledged.clone(),
                        token.clone(),
                    ));
                    consuming = Some(Consuming { token, task });
                }
                _ => {}
            }
            if shutdown.is_cancelled() {
                // The tail's token is a child of `shutdown`: it ended because we were told
                // to stop, during this tick. Stopped, not failed; the tail is stopped below.
                return Ok(Some(Outcome::Stopped { version }));
            }
            if consuming.as_ref().is_some_and(|c| c.task.is_finished()) {
                let error = match consuming.take() {
                    Some(c) => c
                        .stop()
                        .await
                        .unwrap_or_else(|| "it stopped without an error".to_owned()),
                    None => String::new(),
                };
                let wait = restart.failed();
                tracing::error!(%consumer, %error, retry_in = ?wait, "the tail stopped consuming; starting it again after the backoff");
                progress.message(&format!(
                    "{consumer} stopped consuming ({error}); starting it again in {}s",
                    wait.as_secs().max(1)
                ));
            } else if consuming.is_some() {
                restart.consuming();
            }

            progress.status(&status);
            let backlog_done = backlog.iter().all(|(p, high)| {
                status
                    .partitions
                    .iter()
                    .find(|s| s.partition == *p)
                    .is_none_or(|s| s.next_offset >= *high)
            });
            if row.cutover == Cutover::Auto
                && !row.paused
                && backlog_done
                && status.lag() <= options.cutover_lag
            {
                if let Some(c) = consuming.take() {
                    c.stop_logged(&consumer).await;
                }
                let mut client = pool
                    .get()
                    .await
                    .map_err(|e| RebuildError::Connect(e.to_string()))?;
                let report = cutover::cutover(&mut client, registry, &name, version, None).await?;
                return Ok(Some(Outcome::CutOver(report)));
            }
            Ok(None)
        };
        match tick.await {
            Ok(Some(outcome)) => break Ok(outcome),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        tokio::select! {
            _ = shutdown.cancelled() => break Ok(Outcome::Stopped { version }),
            _ = tokio::time::sleep(options.tick) => {}
        }
    };
    // Stopped before the rebuild returns and lets go of its running lock. What the tail
    // ended with is not the rebuild's outcome: a start that was waiting on a lock when the
    // rebuild was told to stop, say.
    if let Some(c) = consuming.take() {
        c.stop_logged(&consumer).await;
    }
    result
}

/// Gives every partition of the log an offset row, at the log's start, where the version has
/// none yet, in a commit that waits for the WAL (`synchronous_commit = on` for it alone).
///
/// Why: the rebuild's batches commit with `synchronous_commit = off`, and the first batch of a
/// partition creates its offset row at the batch's start (`LOCK_OFFSET`). A crash of PostgreSQL
/// that undid every commit of a partition would take the row with it, and a tail that rode
/// the crash out, its Kafka client already past the lost batches, would create the row afresh
/// at its next batch's start: the lost messages skipped for good, their accounts parked. With
/// the row made durable before any batch, a crash can only take it back to an earlier offset,
/// which the next batch's fencing finds (`Fenced`, and the tail reads again from there). A
/// partition added to the topic while the rebuild runs gets its row from its first batch, as
/// before; the seed of a snapshot writes every row in its own commit, which waits too.
async fn place(
    pool: &Pool,
    consumer: &str,
    topic: &str,
    extents: &[Extent],
) -> Result<(), RebuildError> {
    let (partitions, lows): (Vec<i32>, Vec<i64>) =
        extents.iter().map(|e| (e.partition, e.low)).unzip();
    let mut client = pool
        .get()
        .await
        .map_err(|e| RebuildError::Connect(e.to_string()))?;
    let tx = client
        .transaction()
        .await
        .map_err(db("placing the tail's offsets"))?;
    // A setting of this transaction, no table's: its commit waits for the WAL.
    tx.batch_execute("SET LOCAL synchronous_commit = on")
        .await
        .map_err(db("placing the tail's offsets"))?;
    progress::place_missing_offsets(&tx, consumer, topic, &partitions, &lows)
        .await
        .map_err(db("placing the tail's offsets"))?;
    tx.commit().await.map_err(db("placing the tail's offsets"))
}

/// A partition whose log now starts past where the rebuild is: retention dropped messages
/// it had not consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Overtaken {
    partition: i32,
    /// The rebuild's next offset (0 before its first batch: it reads from the start).
    position: i64,
    /// The log's first offset.
    low: i64,
}

/// Reads the version's offsets and counters and the log's watermarks, and the partitions
/// retention has overtaken.
async fn measure(
    pool: &Pool,
    log: &Arc<std::sync::Mutex<LogReader>>,
    consumer: &str,
    paused: bool,
    last: &mut Option<(Instant, i64)>,
) -> Result<(Status, Vec<Overtaken>), RebuildError> {
    let extents: Vec<Extent> = {
        let log = Arc::clone(log);
        tokio::task::spawn_blocking(move || match log.lock() {
            Ok(l) => l.extents().map_err(RebuildError::from),
            Err(_) => Err(RebuildError::Tail("the log client panicked".to_owned())),
        })
        .await
        .map_err(|e| RebuildError::Tail(e.to_string()))??
    };
    let client = pool
        .get()
        .await
        .map_err(|e| RebuildError::Connect(e.to_string()))?;
    let rows = progress::offsets(&client, consumer)
        .await
        .map_err(db("reading the rebuild's offsets"))?;
    let parked = projector_engine::parked::count(&client, consumer)
        .await
        .map_err(db("counting parked accounts"))?;
    let (mut applied, mut consumed, mut dead) = (0i64, 0i64, 0i64);
    let mut partitions = Vec::new();
    let mut overtaken = Vec::new();
    for e in extents {
        let row = rows.iter().find(|r| r.partition == e.partition);
        let position = row.map_or(0, |r| r.next_offset);
        if position < e.low {
            overtaken.push(Overtaken {
                partition: e.partition,
                position,
                low: e.low,
            });
        }
        if let Some(r) = row {
            applied += r.applied;
            consumed += r.consumed;
            dead += r.dead_lettered;
        }
        partitions.push(PartitionLag {
            partition: e.partition,
            next_offset: row.map_or(e.low, |r| r.next_offset),
            high: e.high,
        });
    }
    let now = Instant::now();
    let rate = match *last {
        Some((at, before)) if now > at => {
            let ms = i64::try_from(now.duration_since(at).as_millis())
                .unwrap_or(i64::MAX)
                .max(1);
            (consumed - before).max(0) * 1000 / ms
        }
        _ => 0,
    };
    *last = Some((now, consumed));
    let status = Status {
        consumer: consumer.to_owned(),
        applied,
        consumed,
        dead_letters: dead,
        parked,
        partitions,
        rate,
        paused,
    };
    Ok((status, overtaken))
}
