//! Test support: a database per test, event builders, a simulated partition log, and the
//! conformance suite every projection must pass. Enabled by the `testkit` feature.

pub mod conformance;
mod database;
mod feed;

pub use database::{admin_url, drop_databases_of_this_process, TestDb};
pub use feed::{bust, cash, consume, consume_with_crashes, fill, fill_v2, EventSpec, Partition};

/// The project's one generator ([`crate::rng::Rng`]), under the name the tests have always
/// called it by.
pub use crate::rng::Rng as Lcg;
