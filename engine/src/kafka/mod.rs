//! Kafka: the source that feeds the apply path, and the live service that runs the live
//! version of every view. The producer side and a local broker for development and tests are
//! in the `projector-devkit` crate.
//!
//! - [`source`]: one view version's consumer group: poll thread, workers, fencing, timeouts.
//! - [`supervisor`]: the live versions of the selected views, following the view registry.
//! - [`log`]: a groupless reader of a topic's log (partitions, watermarks, message times,
//!   offsets by time, whole partitions), which operations and rebuilds ask.
//! - [`running`]: the lock a process holds while it runs a view version, so that nobody
//!   drops a version under it.

pub mod log;
pub mod running;
pub mod source;
pub mod supervisor;
