//! A groupless reader of one topic's log: its partitions, their watermarks, the time of the
//! message at an offset, the offsets of a moment in time, and every message of a partition.
//!
//! Operations ask it for lag and for each consumer's clock (`projector-ops`), a rebuild for
//! where to start and whether the log still starts at every account's first event
//! (`projector-rebuild`). A client that joins no group does the asking, so no consumer group
//! is disturbed, and the answer is the same whether or not the source also commits its offsets
//! to Kafka: a view's position is the `next_offset` in PostgreSQL, never Kafka's committed
//! offset. The calls block (librdkafka); async callers run them on a blocking thread.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

use super::source::KafkaConfig;

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

/// Why the log could not be read. Operations and rebuilds turn it into their own error, each
/// with its own words for a missing topic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// A Kafka request failed.
    #[error("while {doing}: {source}")]
    Kafka {
        /// What was being done.
        doing: &'static str,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The topic is unknown to the brokers, or has no partitions.
    #[error("topic {0:?} does not exist or has no partitions")]
    NoTopic(String),
    /// A partition could not be read to its end within the timeout.
    #[error("timed out reading partition {0} of the log")]
    Timeout(i32),
}

fn kafka(doing: &'static str) -> impl Fn(KafkaError) -> LogError {
    move |source| LogError::Kafka { doing, source }
}

/// What a reader reads besides metadata, watermarks and offsets by time; it sets how the
/// client fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Single messages here and there ([`LogReader::times_at`]): small fetches, no
    /// prefetch, and below the log's start (retention trimmed it) the oldest message still
    /// there.
    Samples,
    /// Whole partitions from start to end ([`LogReader::read_partition`]): librdkafka's
    /// fetch defaults.
    Whole,
}

/// A groupless client of one topic. Each request waits at most the timeout it was made with.
/// Message times are cached by (partition, offset): a message's time never changes, and a
/// stuck view asks for the same one every time.
pub struct LogReader {
    client: BaseConsumer,
    topic: String,
    timeout: Duration,
    times: Mutex<HashMap<(i32, i64), Option<i64>>>,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// Entries kept in the time cache; past this it starts over (a long-running process asks
/// about ever new offsets).
const CACHE_LIMIT: usize = 10_000;

impl LogReader {
    /// A client of `config.topic` on `config.brokers`, with the passed-through properties (TLS,
    /// SASL), fetching for `reading`. Each request waits at most `timeout`.
    pub fn connect(
        config: &KafkaConfig,
        timeout: Duration,
        reading: Reading,
    ) -> Result<Self, LogError> {
        let mut c = config.plain_client_config();
        if reading == Reading::Samples {
            // One message per partition is read at a time: no need to prefetch megabytes.
            c.set("max.partition.fetch.bytes", "65536")
                .set("queued.max.messages.kbytes", "1024")
                .set("fetch.wait.max.ms", "10")
                // Below the log start (retention trimmed it), the oldest message still there.
                .set("auto.offset.reset", "earliest");
        }
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

    /// The topic's partitions from the brokers' metadata, in order. Fails when the brokers
    /// cannot be reached, or do not know the topic (or report an error for it).
    pub fn partitions(&self) -> Result<Vec<i32>, LogError> {
        let metadata = self
            .client
            .fetch_metadata(Some(&self.topic), self.timeout)
            .map_err(kafka("reading the topic's metadata"))?;
        let mut partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == self.topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(LogError::NoTopic(self.topic.clone()));
        }
        partitions.sort_unstable();
        Ok(partitions)
    }

    /// Every partition's low and high watermark, in partition order. Fails when the brokers
    /// cannot be reached or do not know the topic.
    pub fn extents(&self) -> Result<Vec<Extent>, LogError> {
        self.partitions()?
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

    /// Per partition, the offset of the first message at or after `millis` (Unix time in
    /// milliseconds), or the high watermark when there is none; never below the log's start.
    pub fn offsets_at(&self, millis: i64) -> Result<BTreeMap<i32, i64>, LogError> {
        let extents = self.extents()?;
        let mut tpl = TopicPartitionList::new();
        for e in &extents {
            tpl.add_partition_offset(&self.topic, e.partition, Offset::Offset(millis))
                .map_err(kafka("asking for offsets by time"))?;
        }
        let found = self
            .client
            .offsets_for_times(tpl, self.timeout)
            .map_err(kafka("reading offsets by time"))?;
        let mut out = BTreeMap::new();
        for e in extents {
            let offset = found
                .find_partition(&self.topic, e.partition)
                .and_then(|el| match el.offset() {
                    Offset::Offset(o) if o >= 0 => Some(o),
                    _ => None,
                })
                .unwrap_or(e.high);
            // Never before what the log still holds.
            out.insert(e.partition, offset.max(e.low));
        }
        Ok(out)
    }

    /// Reads `extent`'s partition from its low to its high watermark and hands each message's
    /// payload (empty when it has none) to `each`, in order. Transaction markers may end the
    /// partition early. Fails when a message does not arrive within the timeout
    /// ([`LogError::Timeout`]) or the brokers answer with an error.
    pub fn read_partition(
        &self,
        extent: &Extent,
        mut each: impl FnMut(&[u8]),
    ) -> Result<(), LogError> {
        if extent.high <= extent.low {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, extent.partition, Offset::Offset(extent.low))
            .map_err(kafka("assigning a partition"))?;
        self.client
            .assign(&tpl)
            .map_err(kafka("assigning a partition"))?;
        let mut next = extent.low;
        while next < extent.high {
            match self.client.poll(self.timeout) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    each(m.payload().unwrap_or_default());
                }
                // The end of the partition (transaction markers may end it early).
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(kafka("reading the log")(e)),
                None => return Err(LogError::Timeout(extent.partition)),
            }
        }
        let _ = self.client.unassign();
        Ok(())
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
