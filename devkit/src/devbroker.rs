//! A Kafka-protocol broker in the process: librdkafka's mock cluster, for development,
//! demos (`projector dev-broker`) and tests that need real Kafka clients without a JVM.
//!
//! The mock cluster speaks the wire protocol on localhost listeners, so any Kafka client
//! can produce to it and consume from it: idempotent producers, consumer groups with
//! offset commits, and cooperative rebalances included. It also injects faults
//! ([`DevBroker::request_errors`], [`DevBroker::broker_down`]), which is what the source's
//! fault tests need.
//!
//! Two details of the mock cluster shape this wrapper:
//!
//! - Its group coordinator waits 3 s before the first join of a group completes, like
//!   Kafka's `group.initial.rebalance.delay.ms`. That makes every consumer test slow and
//!   timing-dependent, so [`DevBroker::start`] sets the delay to 0. rdkafka has no safe call
//!   for it and keeps the raw cluster pointer of `MockCluster::new` private, so the cluster
//!   is created by a client configured with `test.mock.num.brokers` instead, whose raw
//!   cluster librdkafka hands out.
//! - That client owns the cluster: it lives exactly as long as the [`DevBroker`]. It is a
//!   producer that never produces; its own connection errors (for example while a test
//!   has taken a broker down) are logged at debug level only, since they say nothing about
//!   the clients under test.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

/// Re-exported so that fault-injection tests in other crates name the same types as the
/// engine, whatever rdkafka version they would otherwise resolve.
pub use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

/// librdkafka accepts at most this many mock brokers.
const MAX_BROKERS: i32 = 9999;

/// What a consumer of the dev broker sets beyond the engine's defaults, which are a real
/// broker's: the mock cluster holds a fetch that finds no data for the whole
/// `fetch.wait.max.ms`, even when data arrives meanwhile, so librdkafka's 500 ms would add
/// about 250 ms to every event's latency. A real broker answers as soon as data arrives, where
/// 10 ms would only make every idle consumer ask about 100 times a second.
pub const CONSUMER_PROPERTIES: &[(&str, &str)] = &[("fetch.wait.max.ms", "10")];

/// [`CONSUMER_PROPERTIES`] as `projector run` flags: `-X key=value ...`.
pub fn consumer_flags() -> String {
    CONSUMER_PROPERTIES
        .iter()
        .map(|(k, v)| format!("-X {k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why the dev broker could not do what it was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevBrokerError {
    /// An argument out of range (broker count, partition count).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The client that should own the mock cluster came up without one.
    #[error("librdkafka did not create a mock cluster")]
    NoMockCluster,
    /// librdkafka or the mock cluster refused an operation.
    #[error("{doing}: {source}")]
    Kafka {
        /// What was being done, e.g. `creating topic "events"`.
        doing: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The topic does not exist (or its metadata carries an error).
    #[error("topic {topic:?} is unknown to {bootstrap_servers}")]
    UnknownTopic {
        /// The topic asked for.
        topic: String,
        /// The brokers asked.
        bootstrap_servers: String,
    },
    /// Reading a topic did not reach its end before the deadline.
    #[error("reading topic {topic:?} timed out with {missing} messages still unread")]
    Timeout {
        /// The topic being read.
        topic: String,
        /// How many messages below the high watermarks were not read.
        missing: i64,
    },
}

fn kafka(doing: impl Into<String>) -> impl FnOnce(KafkaError) -> DevBrokerError {
    let doing = doing.into();
    move |source| DevBrokerError::Kafka { doing, source }
}

/// The context of the client that owns the mock cluster: quiet, and deaf to deliveries
/// (it never produces).
struct Owner;

impl ClientContext for Owner {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        tracing::debug!(target: "librdkafka", ?level, fac, "dev broker: {log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, reason, "dev broker's own client");
    }
}

impl ProducerContext for Owner {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// A running mock Kafka cluster. Dropping it shuts the cluster down; clients still
/// connected to it then see their brokers disappear.
///
/// `DevBroker` is `Send` and `Sync`: tests may keep it in a shared fixture or move it into
/// a task, and inject faults from any thread.
pub struct DevBroker {
    owner: ThreadedProducer<Owner>,
    bootstrap_servers: String,
    brokers: i32,
}

impl fmt::Debug for DevBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevBroker")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("brokers", &self.brokers)
            .finish_non_exhaustive()
    }
}

impl DevBroker {
    /// Starts a cluster of `brokers` brokers (ids 1 to `brokers`) with the given topics
    /// (name, partition count), and no initial rebalance delay for consumer groups.
    ///
    /// Topics not created here are created on first use by producers, with the mock
    /// cluster's default of 4 partitions.
    pub fn start(brokers: i32, topics: &[(&str, i32)]) -> Result<Self, DevBrokerError> {
        if !(1..=MAX_BROKERS).contains(&brokers) {
            return Err(DevBrokerError::InvalidArgument(format!(
                "the broker count must be between 1 and {MAX_BROKERS}, got {brokers}"
            )));
        }
        let owner: ThreadedProducer<Owner> = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .set("client.id", "projector-dev-broker")
            .create_with_context(Owner)
            .map_err(kafka("starting the mock cluster"))?;
        without_initial_rebalance_delay(owner.client())?;
        let bootstrap_servers = owner
            .client()
            .mock_cluster()
            .ok_or(DevBrokerError::NoMockCluster)?
            .bootstrap_servers();
        let broker = Self {
            owner,
            bootstrap_servers,
            brokers,
        };
        for &(name, partitions) in topics {
            broker.create_topic(name, partitions)?;
        }
        Ok(broker)
    }

    /// The `bootstrap.servers` list for clients, e.g. `127.0.0.1:40123,127.0.0.1:40125`.
    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap_servers.clone()
    }

    /// How many brokers the cluster has; their ids are 1 to this.
    pub fn broker_count(&self) -> i32 {
        self.brokers
    }

    /// Creates a topic, replicated on up to three brokers. The mock cluster has no
    /// CreateTopics API, so admin clients cannot do this.
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), DevBrokerError> {
        if partitions < 1 {
            return Err(DevBrokerError::InvalidArgument(format!(
                "topic {name:?} needs at least one partition, got {partitions}"
            )));
        }
        self.cluster()?
            .create_topic(name, partitions, self.brokers.min(3))
            .map_err(kafka(format!("creating topic {name:?}")))
    }

    /// Makes the next requests of type `api_key` fail, one per error, in order, on
    /// whichever broker receives them. `RD_KAFKA_RESP_ERR__TRANSPORT` disconnects the
    /// client instead of answering.
    pub fn request_errors(
        &self,
        api_key: RDKafkaApiKey,
        errors: &[RDKafkaRespErr],
    ) -> Result<(), DevBrokerError> {
        self.cluster()?.request_errors(api_key, errors);
        Ok(())
    }

    /// Drops the errors still queued for `api_key`.
    pub fn clear_request_errors(&self, api_key: RDKafkaApiKey) -> Result<(), DevBrokerError> {
        self.cluster()?.clear_request_errors(api_key);
        Ok(())
    }

    /// Disconnects a broker (-1: all) and refuses new connections to it. Partition
    /// leadership does not move: its partitions are unavailable until [`Self::broker_up`].
    pub fn broker_down(&self, broker_id: i32) -> Result<(), DevBrokerError> {
        self.cluster()?
            .broker_down(broker_id)
            .map_err(kafka(format!("taking broker {broker_id} down")))
    }

    /// Lets a broker (-1: all) accept connections again.
    pub fn broker_up(&self, broker_id: i32) -> Result<(), DevBrokerError> {
        self.cluster()?
            .broker_up(broker_id)
            .map_err(kafka(format!("bringing broker {broker_id} up")))
    }

    /// Every message of `topic` as of now; see [`read_topic`].
    pub fn read_topic(
        &self,
        topic: &str,
        timeout: Duration,
    ) -> Result<Vec<ConsumedMessage>, DevBrokerError> {
        read_topic(&self.bootstrap_servers, topic, timeout)
    }

    fn cluster(&self) -> Result<MockCluster<'_, Owner>, DevBrokerError> {
        self.owner
            .client()
            .mock_cluster()
            .ok_or(DevBrokerError::NoMockCluster)
    }
}

/// Lifts the mock group coordinator's wait before the first join of a group completes.
#[allow(unsafe_code)]
fn without_initial_rebalance_delay<C: ClientContext>(
    client: &Client<C>,
) -> Result<(), DevBrokerError> {
    // SAFETY: `native_ptr` is the live handle of `client`, which is borrowed for the whole
    // call; the function only reads the handle's mock-cluster field.
    let cluster = unsafe { rdkafka_sys::rd_kafka_handle_mock_cluster(client.native_ptr()) };
    if cluster.is_null() {
        return Err(DevBrokerError::NoMockCluster);
    }
    // SAFETY: the cluster is non-null and owned by `client` (it was created for
    // `test.mock.num.brokers`), so it outlives this borrow; the setter takes the cluster's
    // own lock, so the mock broker thread may run concurrently.
    unsafe { rdkafka_sys::rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, 0) };
    Ok(())
}

/// One message read back from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedMessage {
    /// The partition it is in.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
    /// Its key, if it has one.
    pub key: Option<Vec<u8>>,
    /// Its value (empty for a null value).
    pub payload: Vec<u8>,
}

/// [`read_topic`]'s consumer: reaching the end of a partition is how a read ends, so
/// librdkafka's report of it is not logged as an error.
struct ReadContext;

impl ClientContext for ReadContext {
    fn error(&self, error: KafkaError, reason: &str) {
        match error {
            KafkaError::Global(RDKafkaErrorCode::PartitionEOF) | KafkaError::PartitionEOF(_) => {
                tracing::debug!("librdkafka: {error}: {reason}");
            }
            _ => tracing::error!("librdkafka: {error}: {reason}"),
        }
    }
}

impl ConsumerContext for ReadContext {}

/// Reads every partition of `topic` from its low to its high watermark as of the call,
/// and returns the messages ordered by partition and offset. Works against any Kafka
/// cluster; joins no consumer group and commits nothing.
///
/// Blocks the calling thread for up to `timeout`.
pub fn read_topic(
    bootstrap_servers: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<ConsumedMessage>, DevBrokerError> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let consumer: BaseConsumer<ReadContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers)
        .set("group.id", "projector-read-topic")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set_log_level(RDKafkaLogLevel::Warning)
        .create_with_context(ReadContext)
        .map_err(kafka("creating a consumer"))?;

    let metadata = consumer
        .fetch_metadata(Some(topic), left())
        .map_err(kafka(format!("reading the metadata of {topic:?}")))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err(DevBrokerError::UnknownTopic {
            topic: topic.to_owned(),
            bootstrap_servers: bootstrap_servers.to_owned(),
        });
    }

    // Per partition: the next offset still to read, and the high watermark to read up to.
    let mut pending: HashMap<i32, (i64, i64)> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, left())
            .map_err(kafka(format!("reading the watermarks of {topic:?}/{p}")))?;
        if high > low {
            pending.insert(p, (low, high));
            tpl.add_partition_offset(topic, p, Offset::Offset(low))
                .map_err(kafka(format!("assigning {topic:?}/{p}")))?;
        }
    }
    consumer
        .assign(&tpl)
        .map_err(kafka(format!("assigning {topic:?}")))?;

    let mut messages = Vec::new();
    while !pending.is_empty() {
        let wait = left();
        if wait.is_zero() {
            return Err(DevBrokerError::Timeout {
                topic: topic.to_owned(),
                missing: pending.values().map(|(next, high)| high - next).sum(),
            });
        }
        match consumer.poll(wait.min(Duration::from_millis(200))) {
            None => {}
            Some(Ok(m)) => {
                let p = m.partition();
                let Some((next, high)) = pending.get_mut(&p) else {
                    continue;
                };
                if m.offset() >= *high {
                    // Produced after the snapshot: not part of this read.
                    pending.remove(&p);
                    continue;
                }
                *next = m.offset() + 1;
                messages.push(ConsumedMessage {
                    partition: p,
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                });
                if *next >= *high {
                    pending.remove(&p);
                }
            }
            // The end of the log: offsets below the watermark that were not messages
            // (transaction markers) are never delivered, so this is the other way to finish.
            Some(Err(KafkaError::PartitionEOF(p))) => {
                pending.remove(&p);
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, topic, "transient consumer error while reading");
            }
        }
    }
    messages.sort_by_key(|m| (m.partition, m.offset));
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::consumer::StreamConsumer;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::types::RDKafkaErrorCode;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn dev_broker_is_send_and_sync() {
        assert_send_sync::<DevBroker>();
    }

    #[test]
    fn arguments_are_checked() {
        assert!(matches!(
            DevBroker::start(0, &[]),
            Err(DevBrokerError::InvalidArgument(_))
        ));
        let broker = DevBroker::start(1, &[]).expect("start");
        assert!(matches!(
            broker.create_topic("t", 0),
            Err(DevBrokerError::InvalidArgument(_))
        ));
    }

    #[tokio::test]
    async fn clients_produce_and_read_back() {
        let broker = DevBroker::start(3, &[("t", 5)]).expect("start");
        assert_eq!(broker.bootstrap_servers().split(',').count(), 3);
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .create()
            .expect("producer");
        for (p, value) in [(0, "a"), (4, "b"), (4, "c")] {
            producer
                .send_result(FutureRecord::to("t").partition(p).key("k").payload(value))
                .map_err(|(e, _)| e)
                .expect("queued")
                .await
                .expect("not cancelled")
                .map_err(|(e, _)| e)
                .expect("delivered");
        }
        let read = broker
            .read_topic("t", Duration::from_secs(10))
            .expect("read");
        let got: Vec<(i32, i64, &[u8])> = read
            .iter()
            .map(|m| (m.partition, m.offset, m.payload.as_slice()))
            .collect();
        assert_eq!(
            got,
            vec![(0, 0, &b"a"[..]), (4, 0, &b"b"[..]), (4, 1, &b"c"[..])]
        );
        assert!(matches!(
            broker.read_topic("nope", Duration::from_secs(10)),
            Err(DevBrokerError::UnknownTopic { .. })
        ));
    }

    /// The mock coordinator otherwise holds the first join of a group for 3 s.
    #[tokio::test]
    async fn groups_join_without_the_initial_rebalance_delay() {
        let broker = DevBroker::start(1, &[("g", 2)]).expect("start");
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .set("group.id", "no-delay")
            .create()
            .expect("consumer");
        let started = Instant::now();
        consumer.subscribe(&["g"]).expect("subscribe");
        let deadline = Duration::from_secs(10);
        while consumer.assignment().map(|a| a.count()).unwrap_or(0) < 2 {
            assert!(started.elapsed() < deadline, "no assignment");
            // recv drives the group protocol; nothing is produced, so it only times out.
            let _ = tokio::time::timeout(Duration::from_millis(20), consumer.recv()).await;
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(2500),
            "the first join took {took:?}: the 3 s initial rebalance delay is still on"
        );
    }

    /// Produces one value to `f`/0 and returns its offset, or the delivery error.
    async fn produce(producer: &FutureProducer, value: &str) -> Result<i64, KafkaError> {
        producer
            .send_result(FutureRecord::to("f").partition(0).key("k").payload(value))
            .map_err(|(e, _)| e)?
            .await
            .expect("not cancelled")
            .map(|delivery| delivery.offset)
            .map_err(|(e, _)| e)
    }

    /// Injected errors and a broker outage reach a client, and the cluster recovers from
    /// each: after the queued error is used up, after the queue is cleared, after the broker
    /// is up again. Only the deliveries that succeeded are in the topic.
    #[tokio::test]
    async fn injected_faults_reach_clients_and_clear() {
        let broker = DevBroker::start(2, &[("f", 1)]).expect("start");
        // Without retries (and so without idempotence) a failed produce request fails the
        // delivery with the broker's error instead of being retried until it succeeds.
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap_servers())
            .set("enable.idempotence", "false")
            .set("retries", "0")
            .set("acks", "1")
            .set("message.timeout.ms", "1000")
            .set("reconnect.backoff.max.ms", "200")
            .create()
            .expect("producer");

        broker
            .request_errors(
                RDKafkaApiKey::Produce,
                &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS],
            )
            .expect("push an error");
        let refused = produce(&producer, "refused").await;
        assert!(
            matches!(
                refused,
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::NotEnoughReplicas
                ))
            ),
            "the injected error reaches the producer: {refused:?}"
        );
        assert_eq!(
            produce(&producer, "a").await.expect("the error is used up"),
            0
        );

        broker
            .request_errors(
                RDKafkaApiKey::Produce,
                &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 2],
            )
            .expect("push errors");
        broker
            .clear_request_errors(RDKafkaApiKey::Produce)
            .expect("clear");
        assert_eq!(produce(&producer, "b").await.expect("cleared"), 1);

        let metadata = producer
            .client()
            .fetch_metadata(Some("f"), Duration::from_secs(10))
            .expect("metadata");
        let leader = metadata.topics()[0].partitions()[0].leader();
        broker.broker_down(leader).expect("down");
        let lost = produce(&producer, "lost").await;
        assert!(
            lost.is_err(),
            "a produce to a partition whose leader is down fails: {lost:?}"
        );
        broker.broker_up(leader).expect("up");
        assert_eq!(
            produce(&producer, "c").await.expect("the leader is back"),
            2
        );

        let values: Vec<Vec<u8>> = broker
            .read_topic("f", Duration::from_secs(10))
            .expect("read")
            .into_iter()
            .map(|m| m.payload)
            .collect();
        assert_eq!(values, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert!(broker.broker_down(7).is_err(), "no broker 7");
    }
}
