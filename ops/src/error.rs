use projector_engine::kafka::log::LogError;
use rdkafka::error::KafkaError;

/// Why an operations command or check failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// No connection to PostgreSQL could be had.
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("while {doing}: {source}")]
    Postgres {
        /// What was being done.
        doing: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A Kafka request failed.
    #[error("while {doing}: {source}")]
    Kafka {
        /// What was being done.
        doing: &'static str,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The topic is unknown to the brokers.
    #[error("topic {0:?} does not exist or has no partitions")]
    NoTopic(String),
    /// A blocking Kafka call could not be run.
    #[error("a blocking Kafka call failed: {0}")]
    Blocking(String),
    /// The brokers answered without what was asked.
    #[error("{0}")]
    Unanswered(String),
    /// A request the command refuses, with the reason in one line.
    #[error("{0}")]
    Refused(String),
}

/// The log reader's errors, in operations' words: the same as when ops had a reader of its own.
impl From<LogError> for OpsError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Kafka { doing, source } => OpsError::Kafka { doing, source },
            LogError::NoTopic(topic) => OpsError::NoTopic(topic),
            other => OpsError::Unanswered(other.to_string()),
        }
    }
}

pub(crate) fn pg(doing: &'static str) -> impl Fn(tokio_postgres::Error) -> OpsError {
    move |source| OpsError::Postgres { doing, source }
}

pub(crate) fn kafka(doing: &'static str) -> impl Fn(KafkaError) -> OpsError {
    move |source| OpsError::Kafka { doing, source }
}
