//! Why a bench run stopped, and the `doing` context every step adds to it.

use projector_devkit::devbroker::DevBrokerError;
use projector_devkit::publish::PublishError;
use projector_engine::db::DbError;
use projector_engine::{SchemaError, ViewError};

/// Why a bench run stopped. Nothing is reported for a run that stopped: a figure comes only
/// from work that finished and was checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A step failed; `source` says why. The message names the step only, so that a report
    /// that walks the source chain (`{:#}` of `anyhow`) says each thing once.
    #[error("{doing}")]
    Step {
        /// What was being done, e.g. `phase engine`.
        doing: String,
        /// Why it failed.
        source: Box<BenchError>,
    },
    /// A phase's rows or counters differ from the fold of the events it consumed, or the
    /// topic does not hold what was published: the figure would come from unchecked work.
    #[error("{0}")]
    Mismatch(String),
    /// The run could not go on: a phase timed out, the views stopped, an option is out of
    /// range, or Ctrl-C.
    #[error("{0}")]
    Stopped(String),
    /// A statement failed.
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    /// No connection from the pool.
    #[error(transparent)]
    Connect(#[from] deadpool_postgres::PoolError),
    /// The pool could not be built (the URL, TLS).
    #[error(transparent)]
    Pool(#[from] DbError),
    /// A view was refused.
    #[error(transparent)]
    View(#[from] ViewError),
    /// A reader's `projector.wait_applied` failed.
    #[error(transparent)]
    Wait(#[from] projector_engine::WaitError),
    /// Migrating the scratch database failed.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The dev broker failed.
    #[error(transparent)]
    DevBroker(#[from] DevBrokerError),
    /// Publishing the events failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The feed's producer failed.
    #[error(transparent)]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The rebuild phase's rebuild failed.
    #[error(transparent)]
    Rebuild(#[from] projector_rebuild::RebuildError),
    /// The prune phase's prune failed.
    #[error(transparent)]
    Ops(#[from] projector_ops::OpsError),
    /// A task of the bench panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// A runtime could not be started.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A count does not fit the integer type it must be stored in.
    #[error(transparent)]
    TooLarge(#[from] std::num::TryFromIntError),
}

/// Says what was being done when a step failed: `.doing("vacuuming")?`.
pub(crate) trait Doing<T> {
    /// Wraps the error in [`BenchError::Step`].
    fn doing(self, what: impl Into<String>) -> Result<T, BenchError>;

    /// Like [`Doing::doing`], building the text only when there is an error.
    fn doing_with<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, BenchError>;
}

impl<T, E: Into<BenchError>> Doing<T> for Result<T, E> {
    fn doing(self, what: impl Into<String>) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::Step {
            doing: what.into(),
            source: Box::new(e.into()),
        })
    }

    fn doing_with<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::Step {
            doing: what().into(),
            source: Box::new(e.into()),
        })
    }
}

/// Returns [`BenchError::Stopped`] with a formatted message.
macro_rules! stop {
    ($($arg:tt)*) => {
        return Err($crate::error::BenchError::Stopped(format!($($arg)*)))
    };
}

/// Returns [`BenchError::Mismatch`] with a formatted message.
macro_rules! mismatch {
    ($($arg:tt)*) => {
        return Err($crate::error::BenchError::Mismatch(format!($($arg)*)))
    };
}

pub(crate) use {mismatch, stop};

/// An error and its sources on one line, `a: b: c`, for messages printed on the way.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
