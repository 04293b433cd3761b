//! The outbox relay: publishes unsent outbox rows, in order per account, and marks them sent
//! once the broker acknowledged them.
//!
//! Publish-then-mark is at-least-once on purpose: a relay that dies between the broker's
//! acknowledgement and the mark publishes the same events again when it restarts, at new
//! offsets, with the same `event_id`s; the views' inboxes drop the copies. The opposite order
//! (mark, then publish) would lose events. To show that the consumers cope, the relay can be
//! made to "crash" there on purpose ([`RelayConfig::crash_percent`]): after a batch is
//! acknowledged it forgets the batch, drops its producer as a dead process would, and starts
//! over from the unsent rows.
//!
//! Order per account holds through all of that:
//!
//! - one relay at a time per database (a session advisory lock on the relay's own connection);
//! - rows are read oldest first, and within one account the outbox ids follow `seq`;
//! - a batch is acknowledged completely before the next is read, and a crash republishes the
//!   whole unmarked batch in the same order, so an account's messages in the topic never skip
//!   ahead: each is either the next `seq` or a copy of one already there;
//! - the producer is idempotent (`enable.idempotence=true`, `acks=all`), so its own retries
//!   neither duplicate nor reorder; `enable.gapless.guarantee=true` makes it fail rather than
//!   leave a hole, and messages never time out in the queue (a timed-out message would be a
//!   hole a later message of the account could jump). A broker outage therefore stalls the
//!   relay instead of reordering anything; `stop` ends the wait.
//! - the partitioner is the Java client's murmur2 with the account id as the key
//!   ([`crate::partitioner`]), so every producer of the topic agrees on an account's partition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::counters::{add, Counters};
use super::error::{db, kafka, WriteSideError};
use super::sql;
use projector_engine::rng::Rng;

/// Where and how the relay publishes.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic; it must exist (or the cluster must create topics on first use).
    pub topic: String,
    /// librdkafka properties applied after the relay's own (TLS, SASL, tuning).
    pub properties: Vec<(String, String)>,
    /// Outbox rows read and published per batch.
    pub batch_size: i64,
    /// How long the relay waits for new rows when the outbox is empty and no write in this
    /// process woke it (writes by other processes are found this way).
    pub poll_interval: Duration,
    /// Percent of acknowledged batches after which the relay "crashes" before marking them
    /// sent, 0 to 99; each such batch is published again.
    pub crash_percent: u8,
    /// Seed of the crash dice.
    pub seed: u64,
}

impl RelayConfig {
    /// Defaults: batches of 500, a 50 ms poll, no crashes.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topic: topic.into(),
            properties: Vec::new(),
            batch_size: 500,
            poll_interval: Duration::from_millis(50),
            crash_percent: 0,
            seed: 0,
        }
    }

    fn check(&self) -> Result<(), WriteSideError> {
        if self.crash_percent > 99 {
            return Err(WriteSideError::InvalidConfig(format!(
                "the relay crash percent must be 0 to 99 (at 100 nothing is ever marked sent), got {}",
                self.crash_percent
            )));
        }
        if self.batch_size < 1 {
            return Err(WriteSideError::InvalidConfig(
                "the relay batch size must be at least 1".to_owned(),
            ));
        }
        Ok(())
    }

    fn producer(&self) -> Result<Producer, WriteSideError> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "projector-writeside-relay")
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("enable.gapless.guarantee", "true")
            // librdkafka's largest: in effect never. See the module documentation.
            .set("message.timeout.ms", "2147483647")
            .set("linger.ms", "5");
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c.create_with_context(Quiet)
            .map_err(kafka("creating the relay's producer"))
    }
}

/// The relay's producer.
type Producer = FutureProducer<Quiet>;

/// librdkafka's log lines, through `tracing`, except its warning that
/// `enable.gapless.guarantee` is experimental: the relay sets it on purpose, and a producer is
/// made again after every injected crash.
#[derive(Debug, Clone, Copy)]
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        let expected = fac == "CONFWARN" && log_message.contains("enable.gapless.guarantee");
        match level {
            _ if expected => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", fac, "{log_message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{log_message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }
}

/// How a relay run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayExit {
    /// `drain` was cancelled and the outbox was then found empty.
    Drained,
    /// `stop` was cancelled; unsent rows stay for the next run.
    Stopped,
}

/// The outbox relay of one write side.
#[derive(Debug, Clone)]
pub struct Relay {
    pub(crate) pool: Pool,
    pub(crate) counters: Arc<Counters>,
    pub(crate) written: Arc<Notify>,
    pub(crate) config: RelayConfig,
}

/// One unsent outbox row.
struct Row {
    id: i64,
    key: String,
    payload: String,
}

impl Relay {
    /// Publishes the outbox until `stop` is cancelled, or until `drain` is cancelled and the
    /// outbox is empty (the writers should have stopped by then, or it may never be).
    ///
    /// Broker failures are retried with a fresh producer and counted; a database failure ends
    /// the run with an error, leaving unsent rows for the next run.
    pub async fn run(
        &self,
        drain: CancellationToken,
        stop: CancellationToken,
    ) -> Result<RelayExit, WriteSideError> {
        self.config.check()?;
        // The relay's own connection, out of the pool: the advisory lock lives as long as the
        // connection, and dropping the connection (however this future ends) releases it.
        let client = Object::take(self.pool.get().await.map_err(WriteSideError::Pool)?);
        let lock = client
            .prepare(&sql::RELAY_LOCK)
            .await
            .map_err(db("preparing the relay lock"))?;
        loop {
            let locked: bool = client
                .query_one(&lock, &[])
                .await
                .map_err(db("taking the relay lock"))?
                .get(0);
            if locked {
                break;
            }
            tracing::info!("another relay holds the outbox; waiting");
            tokio::select! {
                () = stop.cancelled() => return Ok(RelayExit::Stopped),
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
        let fetch = client
            .prepare(&sql::RELAY_FETCH)
            .await
            .map_err(db("preparing the outbox read"))?;
        let mark = client
            .prepare(&sql::RELAY_MARK)
            .await
            .map_err(db("preparing the outbox mark"))?;
        let mut dice = Rng::new(self.config.seed);
        let mut producer = self.config.producer()?;

        loop {
            if stop.is_cancelled() {
                retire(producer);
                return Ok(RelayExit::Stopped);
            }
            let draining = drain.is_cancelled();
            let rows: Vec<Row> = client
                .query(&fetch, &[&self.config.batch_size])
                .await
                .map_err(db("reading unsent outbox rows"))?
                .iter()
                .map(|r| Row {
                    id: r.get(0),
                    key: r.get::<_, i64>(1).to_string(),
                    payload: r.get(2),
                })
                .collect();
            if rows.is_empty() {
                if draining {
                    retire(producer);
                    return Ok(RelayExit::Drained);
                }
                tokio::select! {
                    () = self.written.notified() => {}
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                    () = stop.cancelled() => {}
                    () = drain.cancelled() => {}
                }
                continue;
            }

            let delivered = match self.publish(&producer, &rows, &stop).await {
                Published::All(d) => d,
                Published::Stopped => {
                    retire(producer);
                    return Ok(RelayExit::Stopped);
                }
                Published::Failed(e) => {
                    // Whatever was delivered stays in the topic and is published again with
                    // the rest: copies, never a hole (see the module documentation).
                    add(&self.counters.relay_errors, 1);
                    tracing::warn!(error = %e, "relay: a batch was not delivered; retrying with a new producer");
                    retire(producer);
                    tokio::select! {
                        () = stop.cancelled() => return Ok(RelayExit::Stopped),
                        () = tokio::time::sleep(self.config.poll_interval * 10) => {}
                    }
                    producer = self.config.producer()?;
                    continue;
                }
            };

            if self.config.crash_percent > 0 && dice.chance(usize::from(self.config.crash_percent))
            {
                // The injected crash: acknowledged, not marked. The batch's progress is lost
                // with the "process", and the next pass publishes it again.
                add(&self.counters.relay_crashes, 1);
                add(&self.counters.redeliveries_injected, rows.len() as u64);
                tracing::debug!(rows = rows.len(), "relay: injected crash before marking");
                retire(producer);
                producer = self.config.producer()?;
                continue;
            }

            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            let (partitions, offsets): (Vec<i32>, Vec<i64>) = delivered.into_iter().unzip();
            let marked = client
                .execute(&mark, &[&ids, &partitions, &offsets])
                .await
                .map_err(db("marking outbox rows sent"))?;
            add(&self.counters.marked, marked);
        }
    }

    /// Produces every row, in order, and waits for every acknowledgement.
    async fn publish(
        &self,
        producer: &Producer,
        rows: &[Row],
        stop: &CancellationToken,
    ) -> Published {
        let mut pending = Vec::with_capacity(rows.len());
        let mut failure = None;
        for row in rows {
            let record = FutureRecord::to(&self.config.topic)
                .key(&row.key)
                .payload(&row.payload);
            match producer.send_result(record) {
                Ok(delivery) => pending.push(delivery),
                Err((e, _)) => {
                    // Nothing after a refused message may be sent, or it would jump it.
                    failure = Some(e);
                    break;
                }
            }
        }
        let all = futures::future::join_all(pending);
        let results = tokio::select! {
            r = all => r,
            () = stop.cancelled() => return Published::Stopped,
        };
        let mut delivered = Vec::with_capacity(results.len());
        let mut partitions: BTreeMap<i32, u64> = BTreeMap::new();
        for result in results {
            match result {
                Ok(Ok(d)) => {
                    *partitions.entry(d.partition).or_default() += 1;
                    delivered.push((d.partition, d.offset));
                }
                Ok(Err((e, _))) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {
                    failure.get_or_insert(rdkafka::error::KafkaError::Canceled);
                }
            }
        }
        self.counters.published(&partitions);
        match failure {
            None => Published::All(delivered),
            Some(e) => Published::Failed(WriteSideError::Kafka {
                doing: "publishing outbox rows",
                source: e,
            }),
        }
    }
}

enum Published {
    /// Every row was acknowledged: (partition, offset) per row, in row order.
    All(Vec<(i32, i64)>),
    Stopped,
    Failed(WriteSideError),
}

/// Drops a producer off the async threads: librdkafka's destroy purges, flushes for up to
/// half a second and joins its threads.
fn retire(producer: Producer) {
    tokio::task::spawn_blocking(move || drop(producer));
}
