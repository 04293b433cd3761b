//! The broker a Kafka test runs against: librdkafka's mock cluster in the test process, or,
//! when `PROJECTOR_TEST_BROKERS` names one, an external Kafka-protocol broker (`tests/tansu.sh`
//! starts tansu and runs the tests that take a [`Broker`] against it).
//!
//! Tests run in parallel on one external broker, so each [`Broker`] gets names of its own:
//! its topics carry a tag unique to it, and so do the consumer groups of the configurations
//! and command lines it hands out (two tests both running `trail_v1` would otherwise be members
//! of one group and rebalance each other). On the mock cluster every name stays as the test
//! wrote it. Tests that inject faults (`request_errors`, `broker_down`) or lean on the mock's
//! own limits (it trims a partition past 5 MiB) take a [`DevBroker`] directly.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use projector_devkit::devbroker::{
    read_topic, ConsumedMessage, DevBroker, DevBrokerError, CONSUMER_PROPERTIES,
};
use projector_engine::kafka::source::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

/// The environment variable naming an external broker (`host:port[,host:port...]`).
pub const BROKERS_VAR: &str = "PROJECTOR_TEST_BROKERS";

/// How long creating the topics and seeing them in the metadata may take.
const CREATE: Duration = Duration::from_secs(60);

/// A broker with a test's topics on it.
pub struct Broker {
    /// `None` on an external broker.
    mock: Option<DevBroker>,
    kafka: Kafka,
}

/// A broker's address and the names a test uses on it, without the broker: cheap to clone
/// into a task. Derefs to the bootstrap address, so it goes wherever one does.
#[derive(Debug, Clone)]
pub struct Kafka {
    bootstrap: String,
    /// Appended to every topic and group name on an external broker; empty on the mock.
    tag: String,
}

impl Broker {
    /// The mock cluster with `topics` (name, partitions), or the external broker of
    /// `PROJECTOR_TEST_BROKERS` with topics of this broker's own names, created through the
    /// Kafka admin API.
    pub fn start(topics: &[(&str, i32)]) -> Self {
        match external() {
            None => Self::mock_only(topics),
            Some(bootstrap) => {
                let kafka = Kafka {
                    bootstrap,
                    tag: unique_tag(),
                };
                kafka.create(topics);
                Self { mock: None, kafka }
            }
        }
    }

    /// The mock cluster whatever `PROJECTOR_TEST_BROKERS` says, for a test that leans on
    /// what only the mock does (it trims a partition past 5 MiB) but shares helpers with
    /// tests that run anywhere.
    pub fn mock_only(topics: &[(&str, i32)]) -> Self {
        let mock = DevBroker::start(1, topics).expect("dev broker");
        let kafka = Kafka {
            bootstrap: mock.bootstrap_servers(),
            tag: String::new(),
        };
        Self {
            mock: Some(mock),
            kafka,
        }
    }

    /// The names, to move into a task.
    pub fn kafka(&self) -> Kafka {
        self.kafka.clone()
    }

    /// The mock cluster, for a test that also runs on the mock only.
    pub fn mock(&self) -> Option<&DevBroker> {
        self.mock.as_ref()
    }
}

impl std::ops::Deref for Broker {
    type Target = Kafka;
    fn deref(&self) -> &Kafka {
        &self.kafka
    }
}

impl std::ops::Deref for Kafka {
    type Target = str;
    fn deref(&self) -> &str {
        &self.bootstrap
    }
}

impl Kafka {
    /// Whether this is an external broker.
    pub fn is_external(&self) -> bool {
        !self.tag.is_empty()
    }

    /// `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap.clone()
    }

    /// The name topic `name` has on this broker.
    pub fn topic(&self, name: &str) -> String {
        if self.tag.is_empty() {
            name.to_owned()
        } else {
            format!("{name}-{}", self.tag)
        }
    }

    /// The consumer group prefix of this broker's configurations (`--group-prefix`).
    pub fn group_prefix(&self) -> String {
        if self.tag.is_empty() {
            "projector".to_owned()
        } else {
            format!("projector-{}", self.tag)
        }
    }

    /// The librdkafka properties a consumer of this broker needs beyond the engine's
    /// defaults: the mock's short fetch wait; nothing for a real broker, whose defaults the
    /// engine's are.
    pub fn consumer_properties(&self) -> Vec<(String, String)> {
        if self.is_external() {
            Vec::new()
        } else {
            CONSUMER_PROPERTIES
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        }
    }

    /// [`super::kafka::config`] for `topic` (a name from [`Kafka::topic`]) on this broker:
    /// short sessions, small batches, this broker's group prefix and consumer properties.
    pub fn config(&self, topic: &str) -> KafkaConfig {
        let mut c = super::kafka::config(&self.bootstrap, topic);
        c.group_prefix = self.group_prefix();
        c.properties
            .retain(|(k, _)| !CONSUMER_PROPERTIES.iter().any(|(m, _)| m == k));
        c.properties.extend(self.consumer_properties());
        c
    }

    /// The flags of a `projector` command that reads `topic` on this broker, as the tests'
    /// in-process configurations do: brokers, topic, group prefix, short sessions and the
    /// consumer properties.
    pub fn cli_flags(&self, topic: &str) -> Vec<String> {
        let mut flags = vec![
            "--brokers".to_owned(),
            self.bootstrap.clone(),
            "--topic".to_owned(),
            topic.to_owned(),
            "--group-prefix".to_owned(),
            self.group_prefix(),
        ];
        let properties = super::kafka::SESSION_PROPERTIES
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .chain(self.consumer_properties());
        for (k, v) in properties {
            flags.push("-X".to_owned());
            flags.push(format!("{k}={v}"));
        }
        flags
    }

    /// Every message of `topic`, which nothing writes to meanwhile. On the mock, the dev
    /// broker's [`read_topic`]; on an external broker, up to where its fetches say each
    /// partition ends: tansu 0.6 answers a ListOffsets for the latest offset with one past the
    /// first offset of the last record batch, not one past the last offset, so a read that
    /// stops at the watermarks it lists would miss the rest of each last batch.
    pub fn read_topic(
        &self,
        topic: &str,
        timeout: Duration,
    ) -> Result<Vec<ConsumedMessage>, DevBrokerError> {
        if self.is_external() {
            Ok(read_to_end(&self.bootstrap, topic, timeout))
        } else {
            read_topic(&self.bootstrap, topic, timeout)
        }
    }

    /// Creates the topics and waits until the broker's metadata shows every partition. Runs
    /// on a thread of its own, so sync and async tests alike may call it.
    fn create(&self, topics: &[(&str, i32)]) {
        let bootstrap = self.bootstrap.clone();
        let topics: Vec<(String, i32)> = topics
            .iter()
            .map(|&(name, partitions)| (self.topic(name), partitions))
            .collect();
        std::thread::spawn(move || create_topics(&bootstrap, &topics))
            .join()
            .expect("creating the topics");
    }
}

/// What the tests' producers set beyond `projector publish`'s settings: on an external broker,
/// one message per record batch. tansu 0.6 answers a ListOffsets for the latest offset with
/// one past the first offset of the last record batch, not one past its last offset, so with
/// batches of many messages the lag, the rebuild's end of the log and a test's count of what
/// the topic holds would all read short (docs/kafka.md, "Against tansu").
pub fn producer_properties() -> Vec<(String, String)> {
    if external().is_some() {
        vec![("batch.num.messages".to_owned(), "1".to_owned())]
    } else {
        Vec::new()
    }
}

/// `PROJECTOR_TEST_BROKERS`, when set and not blank.
pub fn external() -> Option<String> {
    std::env::var(BROKERS_VAR)
        .ok()
        .map(|b| b.trim().to_owned())
        .filter(|b| !b.is_empty())
}

/// A tag no other [`Broker`] of this run or of an earlier run on the same broker has: the
/// process's start in seconds and its id, in base 36 (short, so that names still fit the
/// 80 columns of `projector status`), and a counter.
fn unique_tag() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static STARTED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    });
    format!(
        "{}{}-{}",
        base36(*started),
        base36(u64::from(std::process::id())),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn base36(mut n: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(char::from_digit((n % 36) as u32, 36).unwrap_or('0'));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.iter().rev().collect()
}

fn create_topics(bootstrap: &str, topics: &[(String, i32)]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(CREATE));
    let results = runtime
        .block_on(admin.create_topics(&new, &options))
        .unwrap_or_else(|e| panic!("creating topics on {bootstrap}: {e}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("creating topic {topic} on {bootstrap}: {code}");
        }
    }
    // The metadata may lag the creation: a producer or consumer that asks first would see
    // an unknown topic.
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("metadata client");
    let deadline = Instant::now() + CREATE;
    for (name, partitions) in topics {
        loop {
            let seen = probe
                .fetch_metadata(Some(name), Duration::from_secs(10))
                .ok()
                .and_then(|m| {
                    m.topics()
                        .iter()
                        .find(|t| t.name() == name && t.error().is_none())
                        .map(|t| t.partitions().len())
                });
            if seen == Some(*partitions as usize) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "topic {name} on {bootstrap}: metadata shows {seen:?} partitions, not {partitions}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Reads every partition of `topic` from its start until the broker's fetch reports its end
/// (librdkafka's partition EOF).
fn read_to_end(bootstrap: &str, topic: &str, timeout: Duration) -> Vec<ConsumedMessage> {
    let deadline = Instant::now() + timeout;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "projector-test-read")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("reader");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    assert!(!partitions.is_empty(), "topic {topic} on {bootstrap}");
    let mut tpl = TopicPartitionList::new();
    for &p in &partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let mut open: BTreeSet<i32> = partitions.into_iter().collect();
    let mut messages = Vec::new();
    while !open.is_empty() {
        assert!(
            Instant::now() < deadline,
            "reading {topic}: partitions {open:?} did not reach their end"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => messages.push(ConsumedMessage {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            }),
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
        }
    }
    messages.sort_by_key(|m| (m.partition, m.offset));
    messages
}
