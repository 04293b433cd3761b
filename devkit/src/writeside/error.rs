//! Why the write side refused or failed.

use rdkafka::error::KafkaError;
use serde::{Deserialize, Serialize};

use super::quotes::Refusal;

/// An order the quote gate refused, as stored in the key's reply (`{"refused": ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRefused {
    /// The order's symbol.
    pub symbol: String,
    /// Why, with its figure (`reason`, and `silence_ms` or `age_ms`).
    #[serde(flatten)]
    pub refusal: Refusal,
    /// The refusal as the client reads it: `stale quote: 812 ms`, `stale at source`,
    /// `suspect: waiting for a snapshot`.
    pub message: String,
}

impl OrderRefused {
    /// The refusal of an order on `symbol`.
    pub fn new(symbol: &str, refusal: Refusal) -> Self {
        Self {
            symbol: symbol.to_owned(),
            message: refusal.to_string(),
            refusal,
        }
    }
}

impl std::fmt::Display for OrderRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "order on {} refused: {}", self.symbol, self.message)
    }
}

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
    /// The quote gate refused the order (stale quote, stale at source, suspect). The refusal is
    /// the key's stored reply: a retry under the same key gets it again, unchanged, even once
    /// the feed has healed.
    #[error("{0}")]
    QuoteRefused(OrderRefused),
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
    /// A socket could not be bound or used.
    #[error("while {doing}: {source}")]
    Io {
        /// What was being done.
        doing: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The quote feed gave nothing usable.
    #[error("quote feed: {0}")]
    Quotes(String),
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
            Self::KeyReused { .. }
                | Self::BustRefused { .. }
                | Self::QuoteRefused(_)
                | Self::InvalidRequest(_)
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
