//! Test support: a database per test, event builders, a simulated partition log, and the
//! conformance suite every projection must pass. Enabled by the `testkit` feature.

pub mod conformance;
mod database;
mod feed;

pub use database::{admin_url, drop_databases_of_this_process, TestDb};
pub use feed::{bust, cash, consume, consume_with_crashes, fill, fill_v2, EventSpec, Partition};

/// A small deterministic generator, so that random schedules are reproducible from a seed
/// without a dependency.
#[derive(Debug, Clone)]
pub struct Lcg(pub u64);

impl Lcg {
    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n.max(1) as u64) as usize
    }

    /// A number in `0..n`, signed, for building decimals.
    pub fn int(&mut self, n: usize) -> i64 {
        i64::try_from(self.below(n)).unwrap_or(i64::MAX)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}
