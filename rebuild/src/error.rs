//! Why a rebuild, a cutover, a retirement or a verification could not go on. Every message
//! is one line that says what to do.

use projector_engine::kafka::log::LogError;
use projector_engine::ViewError;

/// A rebuild's failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RebuildError {
    /// The view or its code for the version.
    #[error(transparent)]
    View(#[from] ViewError),
    /// This binary's code for the version is not the code that registered it.
    #[error(transparent)]
    Code(#[from] projector_engine::fingerprint::CodeError),
    /// A request that contradicts the registry's state.
    #[error("{0}")]
    Refused(String),
    /// `--from snapshot` for a view without a snapshot statement.
    #[error("view {0} has no snapshot statement (Projection::snapshot_sql); rebuild it with --from earliest")]
    NoSnapshot(String),
    /// The view's snapshot statement does not return what the contract asks for.
    #[error("the view's snapshot statement must return account_id and watermark_seq, both bigint and never NULL (docs/views.md): {0}")]
    SnapshotColumns(String),
    /// `--from earliest` on a log that no longer starts at every account's first event.
    #[error("the log no longer starts at the first event: {detail}; rebuild --from snapshot, or pass --allow-gaps to build anyway (those accounts park until an engineer resolves them)")]
    LogTrimmed {
        /// Which partitions start late and how many accounts start past seq 1.
        detail: String,
    },
    /// Retention dropped messages the rebuild had not consumed yet (it was stopped, or
    /// slower than retention): going on would skip them.
    #[error("retention dropped messages this rebuild had not consumed ({detail}); going on would skip them: cancel it and rebuild --from snapshot, or resume with --allow-gaps to go on without them (the accounts they belong to park)")]
    Overtaken {
        /// Each partition, where the rebuild is, and where the log starts now.
        detail: String,
    },
    /// The topic does not exist.
    #[error("topic {0:?} does not exist on the brokers")]
    NoTopic(String),
    /// A partition could not be read to its end in time.
    #[error("timed out reading partition {0} of the log")]
    LogTimeout(i32),
    /// Kafka failed.
    #[error("while {doing}: {source}")]
    Kafka {
        /// What was being done.
        doing: &'static str,
        /// librdkafka's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// PostgreSQL failed.
    #[error("while {doing}: {}", describe(.error))]
    Database {
        /// What was being done.
        doing: &'static str,
        /// The driver's error, already described in the message.
        error: tokio_postgres::Error,
    },
    /// No connection could be had.
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(String),
    /// The tail stopped with an error.
    #[error("the tail stopped: {0}")]
    Tail(String),
}

/// The log reader's errors, in a rebuild's words.
impl From<LogError> for RebuildError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Kafka { doing, source } => RebuildError::Kafka { doing, source },
            LogError::NoTopic(topic) => RebuildError::NoTopic(topic),
            LogError::Timeout(partition) => RebuildError::LogTimeout(partition),
            other => RebuildError::Tail(other.to_string()),
        }
    }
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Wraps a driver error with what was being done.
pub(crate) fn db(doing: &'static str) -> impl Fn(tokio_postgres::Error) -> RebuildError {
    move |error| RebuildError::Database { doing, error }
}
