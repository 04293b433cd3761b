//! What operations ask of the Kafka log: its partitions, their watermarks, and the time of
//! the oldest message a view version has not consumed yet.
//!
//! A client that joins no group does the asking, so no consumer group is disturbed, and the
//! answer is the same whether or not the source also commits its offsets to Kafka: the
//! view's position is the `next_offset` in PostgreSQL, never Kafka's committed offset. The
//! calls block (librdkafka); async callers run them on a blocking thread.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

use super::error::{kafka, OpsError};
use crate::kafka::source::KafkaConfig;

/// One partition's extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The partition.
    pub partition: i32,
    /// The first offset still in the log (above 0 once retention trimmed it).
    pub low: i64,
    /// The offset the next message will get.
    pub high: i64,
}

/// How long the brokers keep a topic's messages: its `retention.ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Messages older than this are deleted (a whole segment at a time, so some stay up to a
    /// segment's span longer).
    For(Duration),
    /// `retention.ms = -1`: never for their age.
    Forever,
}

/// `topic`'s `retention.ms`, asked with DescribeConfigs (Kafka's admin API) on the brokers
/// of `config`, waiting at most `timeout`. Fails where the brokers do not answer it:
/// librdkafka's mock cluster, for one, has no admin API.
pub async fn retention(
    config: &KafkaConfig,
    topic: &str,
    timeout: Duration,
) -> Result<Retention, OpsError> {
    let admin: AdminClient<DefaultClientContext> = config
        .plain_client_config()
        .create()
        .map_err(kafka("creating a Kafka admin client"))?;
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let asked = [ResourceSpecifier::Topic(topic)];
    // librdkafka times the request out itself; this bounds a client that never connects.
    let answers = tokio::time::timeout(
        timeout + Duration::from_secs(1),
        admin.describe_configs(&asked, &options),
    )
    .await
    .map_err(|_| OpsError::Unanswered(format!("no answer within {}s", timeout.as_secs())))?
    .map_err(kafka("describing the topic's configuration"))?;
    let resource = answers
        .into_iter()
        .next()
        .ok_or_else(|| OpsError::Unanswered("no configuration in the answer".to_owned()))?
        .map_err(|code| OpsError::Kafka {
            doing: "describing the topic's configuration",
            source: KafkaError::AdminOp(code),
        })?;
    let value = resource
        .get("retention.ms")
        .and_then(|e| e.value.as_deref())
        .ok_or_else(|| OpsError::Unanswered("the answer has no retention.ms".to_owned()))?;
    match value.trim().parse::<i64>() {
        Ok(ms) if ms < 0 => Ok(Retention::Forever),
        Ok(ms) => Ok(Retention::For(Duration::from_millis(ms.unsigned_abs()))),
        Err(_) => Err(OpsError::Unanswered(format!(
            "retention.ms is {value:?}, not a number"
        ))),
    }
}

/// The partitions of `topic` from the broker's metadata, in order; none when the broker
/// does not know the topic (or reports an error for it).
pub fn partitions_of(
    client: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>, KafkaError> {
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    let mut partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    partitions.sort_unstable();
    Ok(partitions)
}

/// A groupless client of one topic. Message times are cached by (partition, offset): a
/// message's time never changes, and a stuck view asks for the same one every time.
pub struct TopicProbe {
    client: BaseConsumer,
    topic: String,
    timeout: Duration,
    times: Mutex<HashMap<(i32, i64), Option<i64>>>,
}

impl std::fmt::Debug for TopicProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicProbe")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// Entries kept in the time cache; past this it starts over (a long-running process asks
/// about ever new offsets).
const CACHE_LIMIT: usize = 10_000;

impl TopicProbe {
    /// A client of `config.topic` on `config.brokers`, with the passed-through properties (TLS,
    /// SASL). Each request waits at most `timeout`.
    pub fn connect(config: &KafkaConfig, timeout: Duration) -> Result<Self, OpsError> {
        let mut c = config.plain_client_config();
        // One message per partition is read at a time: no need to prefetch megabytes.
        c.set("max.partition.fetch.bytes", "65536")
            .set("queued.max.messages.kbytes", "1024")
            .set("fetch.wait.max.ms", "10")
            // Below the log start (retention trimmed it), the oldest message still there.
            .set("auto.offset.reset", "earliest");
        let client: BaseConsumer = c.create().map_err(kafka("creating a Kafka client"))?;
        Ok(Self {
            client,
            topic: config.topic.clone(),
            timeout,
            times: Mutex::new(HashMap::new()),
        })
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Every partition's low and high watermark, in partition order. Fails when the brokers
    /// cannot be reached or do not know the topic.
    pub fn extents(&self) -> Result<Vec<Extent>, OpsError> {
        let partitions = partitions_of(&self.client, &self.topic, self.timeout)
            .map_err(kafka("reading the topic's metadata"))?;
        if partitions.is_empty() {
            return Err(OpsError::NoTopic(self.topic.clone()));
        }
        partitions
            .into_iter()
            .map(|partition| {
                let (low, high) = self
                    .client
                    .fetch_watermarks(&self.topic, partition, self.timeout)
                    .map_err(kafka("reading watermarks"))?;
                Ok(Extent {
                    partition,
                    low,
                    high,
                })
            })
            .collect()
    }

    /// The timestamp (Unix milliseconds, as the broker stores it: the producer's create time
    /// or the broker's append time) of the first message at or after each `(partition,
    /// offset)`. `None` for a position with no message yet, or one whose message could not
    /// be read within the timeout, or that carries no timestamp.
    pub fn times_at(&self, wanted: &[(i32, i64)]) -> BTreeMap<(i32, i64), Option<i64>> {
        let mut out = BTreeMap::new();
        let mut missing: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        {
            let cache = self.times.lock().unwrap_or_else(|e| e.into_inner());
            for &(p, o) in wanted {
                match cache.get(&(p, o)) {
                    Some(t) => {
                        out.insert((p, o), *t);
                    }
                    None => missing.entry(p).or_default().push(o),
                }
            }
        }
        // Rounds of at most one offset per partition: a client holds one position per
        // partition at a time.
        loop {
            let round: Vec<(i32, i64)> = missing
                .iter_mut()
                .filter_map(|(p, offsets)| offsets.pop().map(|o| (*p, o)))
                .collect();
            if round.is_empty() {
                break;
            }
            let found = self.read_round(&round);
            let mut cache = self.times.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() > CACHE_LIMIT {
                cache.clear();
            }
            for (key, time) in found {
                // Only a definite answer is cached: a timeout may succeed next time.
                if let Some(Some(t)) = time {
                    cache.insert(key, Some(t));
                }
                out.insert(key, time.flatten());
            }
        }
        out
    }

    /// Reads the first message at or after each position; `None` for a position that timed
    /// out, `Some(None)` for one with no message or no timestamp.
    #[allow(clippy::type_complexity)]
    fn read_round(&self, round: &[(i32, i64)]) -> Vec<((i32, i64), Option<Option<i64>>)> {
        let mut answers: HashMap<i32, Option<Option<i64>>> = HashMap::new();
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in round {
            if tpl
                .add_partition_offset(&self.topic, p, Offset::Offset(o))
                .is_err()
            {
                answers.insert(p, Some(None));
            }
        }
        if self.client.assign(&tpl).is_ok() {
            let deadline = Instant::now() + self.timeout;
            while answers.len() < round.len() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match self.client.poll(left) {
                    Some(Ok(m)) => {
                        answers
                            .entry(m.partition())
                            .or_insert(Some(m.timestamp().to_millis()));
                    }
                    Some(Err(KafkaError::PartitionEOF(p))) => {
                        answers.entry(p).or_insert(Some(None));
                    }
                    // A transient error: keep polling until the deadline.
                    Some(Err(_)) => {}
                    None => break,
                }
            }
            let _ = self.client.unassign();
        }
        round
            .iter()
            .map(|&(p, o)| ((p, o), answers.get(&p).copied().flatten()))
            .collect()
    }
}
