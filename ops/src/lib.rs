//! Operations: what an operator asks of a running system, and the housekeeping it needs.
//!
//! They read the engine's tables and the Kafka log from outside the apply path: the engine
//! never calls them (`projector_engine` does not depend on this crate).
//!
//! - [`status`]: a snapshot of every view version (state, lag per partition in messages and
//!   seconds, throughput, counters, dead letters, parked accounts, the inbox) with its
//!   problems; `projector status` prints it, `projector run` publishes it.
//! - [`health`]: the one health rule both use: no progress while input waits pages, a slow
//!   but progressing view (or a rebuild) does not.
//! - [`topic`]: how long the brokers keep a topic's messages. Lag (watermarks, message times)
//!   is read by the engine's groupless `projector_engine::kafka::log::LogReader`.
//! - [`monitor`]: the running process's periodic snapshot, gauges and `/health` answer.
//! - [`gauges`]: the gauges set from each snapshot (the engine's counters are its own).
//! - [`clock`]: each consumer's clock, up to when it has read the log: what inbox retention
//!   measures its window from, and why a paused or stopped version keeps its rows.
//! - [`prune`]: inbox retention in small batches through the time index.
//! - [`reconcile`]: the write side's counts and sums against a view's, per time window.

// The engine's modules ops reads, under the paths they had while ops was a module of the
// engine (`crate::inbox`, `crate::kafka`, `crate::processes`).
use projector_engine::{inbox, kafka, processes};

pub mod clock;
mod error;
pub mod gauges;
pub mod health;
pub mod monitor;
pub mod prune;
pub mod reconcile;
pub mod status;
pub mod topic;

pub use error::OpsError;
pub use health::{HealthRule, Problem, ProblemKind, Severity};
pub use status::{collect, Status, StatusOptions};

/// Writes the help text of every metric a running process exports (the engine's counters
/// and these gauges), for an exporter that shows it (Prometheus's `# HELP`). Call it once,
/// after installing the recorder.
pub fn describe_metrics() {
    projector_engine::metrics::describe();
    gauges::describe();
}
