//! Test support: a database per test, event builders, a simulated partition log, and the
//! conformance suite every projection must pass. Enabled by the `testkit` feature.

pub mod conformance;
mod database;
mod feed;

pub use database::{admin_url, TestDb};
pub use feed::{bust, cash, consume, consume_with_crashes, fill, EventSpec, Partition};
