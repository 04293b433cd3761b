//! The producer side (`projector publish`): JSON lines in, one Kafka message per event.
//!
//! Every line is decoded exactly as the built-in views will decode it
//! (`projector_views::events::decode`: the envelope, storable data, and the built-in types'
//! rules), so poison never reaches the topic from here: a bad line is refused with its line
//! number, nothing after it is sent, and everything before it has been delivered (or has
//! failed) by the time the error is returned. Nothing is left half-sent.
//!
//! The producer settings are the ones the engine's guarantees rest on (per-account ordering,
//! see `docs/kafka.md`):
//!
//! - key = `account_id` in decimal, and `partitioner=murmur2_random`, librdkafka's name
//!   for the Java client's partitioner (see [`crate::partitioner`]), so all events of an
//!   account share one partition whichever client produced them;
//! - `enable.idempotence=true` and `acks=all`: producer retries neither duplicate nor
//!   reorder messages within a partition, and a delivered message survives a broker loss.
//!
//! Publishing the same file twice appends every event again at new offsets; the views'
//! inboxes drop the copies.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::time::Duration;

use futures::FutureExt as _;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _};

use projector_engine::event::{account_key, Message};
use projector_views::events::decode;

/// Delivery futures kept at most; beyond this the oldest is awaited before sending more,
/// so memory stays bounded whatever the input size.
const MAX_IN_FLIGHT: usize = 50_000;

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic to publish to.
    pub topic: String,
    /// librdkafka properties (`-X key=value`), applied after the defaults above, so TLS,
    /// SASL and tuning (`message.timeout.ms`, `linger.ms`, ...) work against real brokers.
    pub properties: Vec<(String, String)>,
}

impl PublishConfig {
    /// A configuration with no extra properties.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topic: topic.into(),
            properties: Vec::new(),
        }
    }

    /// The librdkafka configuration of this producer: the settings above, then
    /// [`PublishConfig::properties`]. For a producer of already checked, keyed messages (the
    /// bench's feed) that must behave exactly like `projector publish`'s.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "projector-publish")
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("acks", "all");
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

/// What a successful publish delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Events delivered (blank lines are not events).
    pub sent: u64,
    /// Events delivered per partition.
    pub partitions: BTreeMap<i32, u64>,
}

/// Why a publish stopped. Every variant is returned only after all messages already handed
/// to the producer were delivered or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// librdkafka refused the producer configuration.
    #[error("cannot create the Kafka producer: {0}")]
    Producer(#[source] KafkaError),
    /// A line is not a valid event.
    #[error("line {line} refused: {reason} ({delivered} events before it were delivered; nothing after it was sent)")]
    BadLine {
        /// 1-based line number in the input, blank lines counted.
        line: u64,
        /// Why the engine would treat it as poison.
        reason: String,
        /// Events delivered before it.
        delivered: u64,
    },
    /// The input could not be read.
    #[error("cannot read line {line}: {source} ({delivered} events before it were delivered)")]
    Read {
        /// 1-based number of the line being read.
        line: u64,
        /// The I/O error.
        #[source]
        source: std::io::Error,
        /// Events delivered before it.
        delivered: u64,
    },
    /// The broker did not accept a message. Sending stops at the first failure; messages
    /// already queued behind it were still awaited and are counted in `delivered`.
    #[error("line {line} was not delivered: {source} ({delivered} events were delivered; nothing after line {line} was read)")]
    Delivery {
        /// The line of the first message that failed.
        line: u64,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
        /// Events delivered, before and possibly after the failed one.
        delivered: u64,
    },
}

/// Checks one line as the built-in views would decode it and returns its message key, or the
/// reason it is poison (one line of text).
pub fn check_line(line: &[u8]) -> Result<Vec<u8>, String> {
    let key = account_key(line);
    decode(&Message::new(0, key.clone(), line))
        .map_err(|e| e.to_string().replace(['\n', '\r'], " "))?;
    // decode requires an integer account_id too, so this is only a second line of defence.
    key.ok_or_else(|| "no integer `account_id`".to_owned())
}

/// Publishes JSON lines (one event per line, blank lines skipped) to `config.topic`, and
/// returns once every message is delivered.
pub async fn publish_lines<R>(
    mut reader: R,
    config: &PublishConfig,
) -> Result<PublishReport, PublishError>
where
    R: AsyncBufRead + Unpin,
{
    let producer: FutureProducer = config
        .client_config()
        .create()
        .map_err(PublishError::Producer)?;
    let mut inflight = InFlight::default();
    let mut buf = Vec::new();
    let mut line = 0u64;

    let stopped = loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) => break None,
            Ok(_) => line += 1,
            Err(source) => break Some(Stop::Read(line + 1, source)),
        }
        let text = strip_line_end(&buf);
        if text.trim_ascii().is_empty() {
            continue;
        }
        let key = match check_line(text) {
            Ok(key) => key,
            Err(reason) => break Some(Stop::BadLine(line, reason)),
        };
        inflight
            .send(&producer, &config.topic, line, &key, text)
            .await;
        if inflight.failure.is_some() {
            break None;
        }
    };
    inflight.drain().await;

    let delivered = inflight.report.sent;
    // A lost message outranks a bad line: the caller must not believe what came before the
    // bad line arrived.
    if let Some((line, source)) = inflight.failure {
        return Err(PublishError::Delivery {
            line,
            source,
            delivered,
        });
    }
    match stopped {
        None => Ok(inflight.report),
        Some(Stop::BadLine(line, reason)) => Err(PublishError::BadLine {
            line,
            reason,
            delivered,
        }),
        Some(Stop::Read(line, source)) => Err(PublishError::Read {
            line,
            source,
            delivered,
        }),
    }
}

enum Stop {
    BadLine(u64, String),
    Read(u64, std::io::Error),
}

fn strip_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Messages handed to the producer and not yet reported on, oldest first.
#[derive(Default)]
struct InFlight {
    pending: VecDeque<(u64, DeliveryFuture)>,
    report: PublishReport,
    /// The first (lowest) line that failed.
    failure: Option<(u64, KafkaError)>,
}

impl InFlight {
    async fn send(
        &mut self,
        producer: &FutureProducer,
        topic: &str,
        line: u64,
        key: &[u8],
        payload: &[u8],
    ) {
        loop {
            self.reap();
            if self.pending.len() >= MAX_IN_FLIGHT {
                self.await_oldest().await;
                continue;
            }
            match producer.send_result(FutureRecord::to(topic).key(key).payload(payload)) {
                Ok(delivery) => {
                    self.pending.push_back((line, delivery));
                    return;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    if self.pending.is_empty() {
                        // librdkafka releases a queue slot just after our delivery future
                        // resolves, so the queue can look full for an instant with nothing
                        // left to await.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        self.await_oldest().await;
                    }
                }
                Err((source, _)) => {
                    self.fail(line, source);
                    return;
                }
            }
        }
    }

    /// Records the deliveries that have already completed, without waiting.
    fn reap(&mut self) {
        while let Some((line, delivery)) = self.pending.front_mut() {
            let line = *line;
            match delivery.now_or_never() {
                Some(result) => {
                    self.pending.pop_front();
                    self.record(line, result);
                }
                None => break,
            }
        }
    }

    async fn await_oldest(&mut self) {
        if let Some((line, delivery)) = self.pending.pop_front() {
            let result = delivery.await;
            self.record(line, result);
        }
    }

    async fn drain(&mut self) {
        while !self.pending.is_empty() {
            self.await_oldest().await;
        }
    }

    fn record(&mut self, line: u64, result: <DeliveryFuture as Future>::Output) {
        match result {
            Ok(Ok(delivery)) => {
                self.report.sent += 1;
                *self
                    .report
                    .partitions
                    .entry(delivery.partition)
                    .or_default() += 1;
            }
            Ok(Err((source, _))) => self.fail(line, source),
            // The producer is alive for as long as we await; this is librdkafka giving up.
            Err(_) => self.fail(line, KafkaError::Canceled),
        }
    }

    fn fail(&mut self, line: u64, source: KafkaError) {
        if self.failure.as_ref().is_none_or(|(first, _)| line < *first) {
            self.failure = Some((line, source));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"event_id":"e1","type":"cash_adjusted","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"amount":"10.00","reason":"deposit"}}"#;

    #[test]
    fn a_valid_line_is_keyed_by_its_account() {
        assert_eq!(check_line(GOOD.as_bytes()), Ok(b"42".to_vec()));
    }

    #[test]
    fn poison_is_refused_with_a_one_line_reason() {
        let valid = r#"{"event_id":"e1","type":"x","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#;
        assert_eq!(
            check_line(valid.as_bytes()),
            Ok(b"42".to_vec()),
            "a valid line is accepted, keyed by its account"
        );
        let cases = [
            ("{not json", "invalid envelope"),
            (
                r#"{"event_id":"e1","type":"x","seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#,
                "account_id",
            ),
            (
                r#"{"event_id":"e1","type":"x","account_id":"42","seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#,
                "expected i64",
            ),
            (
                r#"{"event_id":"e1","type":"cash_adjusted","account_id":42,"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{"amount":1e400,"reason":"x"}}"#,
                "data.amount",
            ),
        ];
        for (line, needle) in cases {
            let reason = check_line(line.as_bytes()).expect_err(line);
            assert!(reason.contains(needle), "{reason} should mention {needle}");
            assert!(!reason.contains('\n'));
        }
        assert!(check_line(b"\xff\xfe").is_err());
    }

    #[test]
    fn line_ends_are_stripped() {
        assert_eq!(strip_line_end(b"a\r\n"), b"a");
        assert_eq!(strip_line_end(b"a\n"), b"a");
        assert_eq!(strip_line_end(b"a"), b"a");
    }

    #[test]
    fn the_bad_line_error_is_one_line() {
        let e = PublishError::BadLine {
            line: 7,
            reason: "invalid envelope: missing field `seq`".to_owned(),
            delivered: 5,
        };
        let text = e.to_string();
        assert!(text.starts_with("line 7 refused:"), "{text}");
        assert!(!text.contains('\n'));
    }
}
