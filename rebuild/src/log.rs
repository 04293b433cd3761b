//! What a rebuild asks of the Kafka log: its partitions, their watermarks, the offsets of a
//! moment in time, and whether it still starts at every account's first event.
//!
//! A client that joins no group does the asking, so a rebuild never disturbs a consumer
//! group. The calls block (librdkafka); callers run them on a blocking thread.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use projector_engine::event::salvage;
use projector_engine::kafka::source::KafkaConfig;
use projector_ops::topic::partitions_of;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::RebuildError;

const TIMEOUT: Duration = Duration::from_secs(10);

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

/// A groupless client of the topic.
pub struct Log {
    client: BaseConsumer,
    topic: String,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").field("topic", &self.topic).finish()
    }
}

fn kafka(doing: &'static str) -> impl Fn(KafkaError) -> RebuildError {
    move |source| RebuildError::Kafka { doing, source }
}

impl Log {
    /// A client of `config.topic` on `config.brokers`, with the passed-through properties.
    pub fn connect(config: &KafkaConfig) -> Result<Self, RebuildError> {
        let client: BaseConsumer = config
            .plain_client_config()
            .create()
            .map_err(kafka("creating a Kafka client"))?;
        Ok(Self {
            client,
            topic: config.topic.clone(),
        })
    }

    /// The topic's partitions, in order.
    pub fn partitions(&self) -> Result<Vec<i32>, RebuildError> {
        let out = partitions_of(&self.client, &self.topic, TIMEOUT)
            .map_err(kafka("reading the topic's metadata"))?;
        if out.is_empty() {
            return Err(RebuildError::NoTopic(self.topic.clone()));
        }
        Ok(out)
    }

    /// Every partition's low and high watermark.
    pub fn extents(&self) -> Result<Vec<Extent>, RebuildError> {
        self.partitions()?
            .into_iter()
            .map(|partition| {
                let (low, high) = self
                    .client
                    .fetch_watermarks(&self.topic, partition, TIMEOUT)
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
    /// milliseconds), or the high watermark when there is none.
    pub fn offsets_at(&self, millis: i64) -> Result<BTreeMap<i32, i64>, RebuildError> {
        let extents = self.extents()?;
        let mut tpl = TopicPartitionList::new();
        for e in &extents {
            tpl.add_partition_offset(&self.topic, e.partition, Offset::Offset(millis))
                .map_err(kafka("asking for offsets by time"))?;
        }
        let found = self
            .client
            .offsets_for_times(tpl, TIMEOUT)
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

    /// Reads every partition from its low to its high watermark and reports where the log
    /// no longer starts at the first event: partitions trimmed by retention, and accounts
    /// whose first retained `seq` is above 1.
    pub fn check_start(&self) -> Result<LogStart, RebuildError> {
        let extents = self.extents()?;
        let mut first_seq: HashMap<i64, i64> = HashMap::new();
        for e in &extents {
            if e.high <= e.low {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&self.topic, e.partition, Offset::Offset(e.low))
                .map_err(kafka("assigning a partition"))?;
            self.client
                .assign(&tpl)
                .map_err(kafka("assigning a partition"))?;
            let mut next = e.low;
            while next < e.high {
                match self.client.poll(TIMEOUT) {
                    Some(Ok(m)) => {
                        next = m.offset() + 1;
                        let s = salvage(m.payload().unwrap_or_default());
                        if let (Some(account), Some(seq)) = (s.account_id, s.seq) {
                            let entry = first_seq.entry(account).or_insert(seq);
                            *entry = (*entry).min(seq);
                        }
                    }
                    // The end of the partition (transaction markers may end it early).
                    Some(Err(KafkaError::PartitionEOF(_))) => break,
                    Some(Err(e)) => return Err(kafka("reading the log")(e)),
                    None => return Err(RebuildError::LogTimeout(e.partition)),
                }
            }
        }
        let _ = self.client.unassign();
        Ok(LogStart {
            trimmed: extents.into_iter().filter(|e| e.low > 0).collect(),
            accounts_past_first: first_seq.values().filter(|s| **s > 1).count(),
        })
    }
}

/// Where the log starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStart {
    /// Partitions whose log start offset is above 0.
    pub trimmed: Vec<Extent>,
    /// Accounts whose first retained event has a `seq` above 1.
    pub accounts_past_first: usize,
}

impl LogStart {
    /// True when the log holds every account's history from its first event.
    pub fn is_complete(&self) -> bool {
        self.trimmed.is_empty() && self.accounts_past_first == 0
    }
}
