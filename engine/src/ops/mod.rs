//! Operations: what an operator asks of a running system, and the housekeeping it needs.
//!
//! - [`status`]: a snapshot of every view version (state, lag per partition in messages and
//!   seconds, throughput, counters, dead letters, parked accounts, the inbox) with its
//!   problems; `projector status` prints it, `projector run` publishes it.
//! - [`health`]: the one health rule both use: no progress while input waits pages, a slow
//!   but progressing view (or a rebuild) does not.
//! - [`topic`]: the groupless Kafka client behind lag: watermarks and message times.
//! - [`monitor`]: the running process's periodic snapshot, gauges and `/health` answer.
//! - [`clock`]: each consumer's clock, up to when it has read the log: what inbox retention
//!   measures its window from, and why a paused or stopped version keeps its rows.
//! - [`prune`]: inbox retention in small batches through the time index.
//! - [`reconcile`]: the write side's counts and sums against a view's, per time window.

pub mod clock;
mod error;
pub mod health;
pub mod monitor;
pub mod prune;
pub mod reconcile;
pub mod status;
pub mod topic;

pub use error::OpsError;
pub use health::{HealthRule, Problem, ProblemKind, Severity};
pub use status::{collect, Status, StatusOptions};
pub use topic::TopicProbe;

/// Writes the help text of every metric the engine exports, for an exporter that shows it
/// (Prometheus's `# HELP`). Call it once, after installing the recorder.
pub fn describe_metrics() {
    crate::metrics::describe();
}
