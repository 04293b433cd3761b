//! What a rebuild asks of the Kafka log: its partitions, their watermarks, the offsets of a
//! moment in time, and whether it still starts at every account's first event.
//!
//! The engine's groupless [`LogReader`] does the asking, so a rebuild never disturbs a
//! consumer group; it reads whole partitions, each request waiting at most [`TIMEOUT`]. The
//! calls block (librdkafka); callers run them on a blocking thread.

use std::collections::HashMap;
use std::time::Duration;

use projector_engine::event::salvage;
use projector_engine::kafka::log::{Extent, LogReader, Reading};
use projector_engine::kafka::source::KafkaConfig;

use crate::error::RebuildError;

/// How long a rebuild waits for each request to the brokers.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A reader of `config.topic` on `config.brokers`, with the passed-through properties, as a
/// rebuild reads it: whole partitions, [`TIMEOUT`] per request.
pub fn connect(config: &KafkaConfig) -> Result<LogReader, RebuildError> {
    Ok(LogReader::connect(config, TIMEOUT, Reading::Whole)?)
}

/// Reads every partition from its low to its high watermark and reports where the log no
/// longer starts at the first event: partitions trimmed by retention, and accounts whose
/// first retained `seq` is above 1.
pub fn check_start(log: &LogReader) -> Result<LogStart, RebuildError> {
    let extents = log.extents()?;
    let mut first_seq: HashMap<i64, i64> = HashMap::new();
    for e in &extents {
        log.read_partition(e, |payload| {
            let s = salvage(payload);
            if let (Some(account), Some(seq)) = (s.account_id, s.seq) {
                let entry = first_seq.entry(account).or_insert(seq);
                *entry = (*entry).min(seq);
            }
        })?;
    }
    Ok(LogStart {
        trimmed: extents.into_iter().filter(|e| e.low > 0).collect(),
        accounts_past_first: first_seq.values().filter(|s| **s > 1).count(),
    })
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
