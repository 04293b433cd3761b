//! Why the write side refused or failed.

use rdkafka::error::KafkaError;

/// Why a request was refused or the write side could not do its work.
///
/// Refusals ([`WriteSideError::is_refusal`]) are answers to a client, like an HTTP 422: nothing
/// was written and retrying the same request gets the same answer. Everything else is a
/// failure of the machinery (database, broker) after which the request may be retried with the
/// same key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteSideError {
    /// The idempotency key was first used for a different request (seed 000: refused, never
    /// answered with the first request's reply).
    #[error("idempotency key {key:?} of account {account_id} was used for a different request")]
    KeyReused {
        /// The account.
        account_id: i64,
        /// The key.
        key: String,
    },
    /// A bust named a fill that is not a fill of the account, or that is already busted.
    #[error("cannot bust {fill_event_id:?} of account {account_id}: {reason}")]
    BustRefused {
        /// The account.
        account_id: i64,
        /// The fill named.
        fill_event_id: String,
        /// Why.
        reason: &'static str,
    },
    /// The request itself is malformed (a quantity that is not positive, an empty symbol ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A statement failed.
    #[error("while {doing}: {source}")]
    Database {
        /// What was being done.
        doing: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// No connection could be had from the pool.
    #[error("while getting a database connection: {0}")]
    Pool(#[source] deadpool_postgres::PoolError),
    /// The producer could not be created or a delivery failed.
    #[error("while {doing}: {source}")]
    Kafka {
        /// What was being done.
        doing: &'static str,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// Something the write side stored does not read back (a bug, or a hand edit).
    #[error("corrupt write-side data: {0}")]
    Corrupt(String),
}

impl WriteSideError {
    /// Whether this is an answer to the client (nothing written; the same request gets the same
    /// answer) rather than a failure.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::KeyReused { .. } | Self::BustRefused { .. } | Self::InvalidRequest(_)
        )
    }
}

/// Maps a driver error to [`WriteSideError::Database`] with what was being done.
pub(crate) fn db(doing: &'static str) -> impl FnOnce(tokio_postgres::Error) -> WriteSideError {
    move |source| WriteSideError::Database { doing, source }
}

/// Maps a librdkafka error to [`WriteSideError::Kafka`] with what was being done.
pub(crate) fn kafka(doing: &'static str) -> impl FnOnce(KafkaError) -> WriteSideError {
    move |source| WriteSideError::Kafka { doing, source }
}
