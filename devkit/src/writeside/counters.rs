//! What the write side did, counted as it happens and read as a [`Report`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Live counters shared by the intake, the ledger, the relay and the clients of one
/// [`super::WriteSide`]. Relaxed atomics: each is a tally, none orders anything.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) deduplicated: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) refused_stale_quote: AtomicU64,
    pub(crate) refused_stale_at_source: AtomicU64,
    pub(crate) refused_suspect: AtomicU64,
    pub(crate) hot_requests: AtomicU64,
    pub(crate) fills: AtomicU64,
    pub(crate) busts: AtomicU64,
    pub(crate) cash: AtomicU64,
    pub(crate) published: AtomicU64,
    pub(crate) marked: AtomicU64,
    pub(crate) redeliveries_injected: AtomicU64,
    pub(crate) relay_crashes: AtomicU64,
    pub(crate) relay_errors: AtomicU64,
    pub(crate) partitions: Mutex<BTreeMap<i32, u64>>,
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Counters {
    /// Records one client retry: a request sent again under its key because the client did
    /// not trust (or did not get) the first reply. Clients of the intake other than the
    /// built-in load generator call this themselves.
    pub fn retry(&self) {
        add(&self.retries, 1);
    }

    pub(crate) fn published(&self, partitions: &BTreeMap<i32, u64>) {
        let n: u64 = partitions.values().sum();
        add(&self.published, n);
        // A poisoned lock only means another thread panicked while counting; the counts in it
        // are still whole numbers.
        let mut all = self
            .partitions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (p, k) in partitions {
            *all.entry(*p).or_default() += k;
        }
    }

    /// The counts as of now.
    pub fn report(&self) -> Report {
        Report {
            requests: get(&self.requests),
            retries: get(&self.retries),
            deduplicated: get(&self.deduplicated),
            refused: get(&self.refused),
            rejected: get(&self.rejected),
            refused_stale_quote: get(&self.refused_stale_quote),
            refused_stale_at_source: get(&self.refused_stale_at_source),
            refused_suspect: get(&self.refused_suspect),
            hot_requests: get(&self.hot_requests),
            fills: get(&self.fills),
            busts: get(&self.busts),
            cash: get(&self.cash),
            published: get(&self.published),
            marked_sent: get(&self.marked),
            redeliveries_injected: get(&self.redeliveries_injected),
            relay_crashes: get(&self.relay_crashes),
            relay_errors: get(&self.relay_errors),
            partitions: self
                .partitions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }
}

/// What one [`super::WriteSide`] did since it was created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Requests the intake received, retries included.
    pub requests: u64,
    /// Requests the clients sent again under the same key, on purpose.
    pub retries: u64,
    /// Requests answered with the stored first reply (no second write).
    pub deduplicated: u64,
    /// Requests refused because their key was first used for a different request.
    pub refused: u64,
    /// Requests refused by a business rule (a bust of a fill already busted, ...).
    pub rejected: u64,
    /// Orders the quote gate refused for silence (`stale quote: N ms`); first answers only,
    /// a retry's stored answer is `deduplicated`.
    pub refused_stale_quote: u64,
    /// Orders the quote gate refused as `stale at source`.
    pub refused_stale_at_source: u64,
    /// Orders the quote gate refused on a suspect symbol.
    pub refused_suspect: u64,
    /// Requests of the hot accounts (load generator only).
    pub hot_requests: u64,
    /// `fill_executed` events written.
    pub fills: u64,
    /// `fill_busted` events written.
    pub busts: u64,
    /// `cash_adjusted` events written.
    pub cash: u64,
    /// Messages the broker acknowledged, redeliveries included.
    pub published: u64,
    /// Outbox rows marked sent.
    pub marked_sent: u64,
    /// Messages published again because the relay "crashed" after the broker acknowledged
    /// them and before it marked them sent.
    pub redeliveries_injected: u64,
    /// Crashes injected into the relay.
    pub relay_crashes: u64,
    /// Relay passes that failed (broker or database) and were retried.
    pub relay_errors: u64,
    /// Acknowledged messages per partition, redeliveries included.
    pub partitions: BTreeMap<i32, u64>,
}

impl Report {
    /// Events written, all types.
    pub fn events(&self) -> u64 {
        self.fills + self.busts + self.cash
    }

    /// Orders the quote gate refused, every reason.
    pub fn refused_on_quotes(&self) -> u64 {
        self.refused_stale_quote + self.refused_stale_at_source + self.refused_suspect
    }

    /// Events written and not yet marked sent.
    pub fn backlog(&self) -> u64 {
        self.events().saturating_sub(self.marked_sent)
    }
}
