//! The write side's quote gate: prices at most once over UDP, checked before every order
//! (seed 000's first half, beside the intake's at-least-once orders: the same system needs
//! both guarantees, each on the side where the other would be wrong).
//!
//! ```text
//!  feed (built-in simulator, or --quotes ADDR) ──UDP: tick, heartbeat, snapshot, pong──▶ receiver
//!       ▲  loss, duplicates, reordering, bursts, a lagging source, a skewed clock          │
//!       └────────────── UDP: subscribe (start, reconnect), ping ◀─────────────────────────┤
//!                                                                                         ▼
//!  order ──▶ intake: key claimed ─▶ check ─▶ account locked ─▶ check: its quote prices the fill
//!                                    │                               ─▶ fill written ─▶ check ─▶ commit
//!                                    └─ refused at any check: undone back to the claim; the reason is
//!                                       the key's reply
//! ```
//!
//! # Layout
//!
//! - [`gate`]: the pure state machine per symbol (the seed's rules for ticks, heartbeats and
//!   snapshots, the three checks, the clock offset from pings). No I/O, no clock.
//! - [`wire`]: one JSON datagram per message, prices as decimal strings.
//! - [`feed`]: the built-in feed simulator with its faults.
//! - [`receiver`]: the gate's UDP side: subscribes, reconnects a suspect delta symbol (or any
//!   symbol whose numbering may have been reset) for a snapshot, pings for the clock offset, feeds every datagram to the gate, and records the
//!   metrics.
//! - this module: the [`LocalClock`], the shared [`QuoteGate`] the intake checks, and [`Quotes`],
//!   which runs a feed and a receiver together.
//!
//! # Metrics
//!
//! Through the `metrics` facade, as the engine's; the process installs the exporter.
//!
//! | metric | labels | counts |
//! | --- | --- | --- |
//! | `projector_quote_ticks_lost_total` | symbol | ticks never received: every forward gap a tick or heartbeat showed (the seed's total) |
//! | `projector_quote_ticks_dropped_total` | symbol, kind (`duplicate`, `late`) | ticks at or below the last sequence, dropped |
//! | `projector_quote_suspect_symbols` | | (gauge) symbols suspect now |
//! | `projector_quote_reconnects_total` | | snapshots asked for again (a suspect delta symbol, a lost snapshot, a heartbeat behind, an overtaken snapshot) |
//! | `projector_quote_datagrams_invalid_total` | | datagrams that do not parse, go the wrong way or come from another address, and a full feed's ticks without both prices |
//! | `projector_quote_clock_offset_ms` | | (gauge) the measured offset, our clock minus the feed's |
//! | `projector_orders_refused_total` | reason (`stale_quote`, `stale_at_source`, `suspect`) | orders the gate refused (first answers; a retry gets the stored one) |

pub mod feed;
pub mod gate;
mod metrics;
pub mod receiver;
pub mod wire;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use feed::{Feed, FeedConfig, FeedReport, FeedStats, FeedSymbol, Percent};
pub use gate::{
    Awaited, ClockEstimate, ClockOffset, FeedMode, Gate, HeartbeatVerdict, Limits, Millis, Quote,
    Refusal, Snapshot, SnapshotVerdict, Stats, SymbolState, Tick, TickVerdict,
};
pub(crate) use metrics::order_refused;
pub use receiver::{Receiver, ReceiverConfig};

use super::error::WriteSideError;

/// The local clock the gate measures with: the wall clock read once at the start, moved on by
/// the monotonic clock. Silence is a difference of two readings and must never go negative
/// when the wall clock is stepped back; source times are the feed's wall clock and are compared
/// with ours, so the readings stay milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy)]
pub struct LocalClock {
    wall_at_start: Millis,
    start: std::time::Instant,
}

impl LocalClock {
    /// A clock that reads the wall clock now.
    pub fn start() -> Self {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Self {
            wall_at_start: wall,
            start: std::time::Instant::now(),
        }
    }

    /// ms since the Unix epoch, never going back.
    pub fn now(&self) -> Millis {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.wall_at_start.saturating_add(elapsed)
    }
}

/// The gate shared by the receiver, which feeds it, and the intake, which checks it. Cheap to
/// clone.
#[derive(Clone)]
pub struct QuoteGate {
    shared: Arc<Shared>,
}

struct Shared {
    /// Held for a few arithmetic steps at a time, never across an await.
    gate: Mutex<Gate>,
    clock: LocalClock,
    /// Bumped after every change, so that a waiter wakes on the datagram that changed it.
    changes: watch::Sender<u64>,
    reconnects: AtomicU64,
    invalid: AtomicU64,
}

impl fmt::Debug for QuoteGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuoteGate")
            .field("gate", &*self.lock())
            .finish_non_exhaustive()
    }
}

/// What the gate saw, for a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateReport {
    /// The feed's mode.
    pub mode: FeedMode,
    /// The gate's totals (ticks taken, lost, duplicates, late, ...).
    pub stats: Stats,
    /// Symbols suspect now.
    pub suspect_symbols: usize,
    /// The measured clock offset, our clock minus the feed's.
    pub clock_offset_ms: Option<Millis>,
    /// Snapshots asked for again.
    pub reconnects: u64,
    /// Datagrams not taken.
    pub invalid: u64,
}

impl QuoteGate {
    /// Shares `gate`, measuring with a clock started now.
    pub fn new(gate: Gate) -> Self {
        Self {
            shared: Arc::new(Shared {
                gate: Mutex::new(gate),
                clock: LocalClock::start(),
                changes: watch::Sender::new(0),
                reconnects: AtomicU64::new(0),
                invalid: AtomicU64::new(0),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Gate> {
        // A panic while holding the lock cannot leave the gate half-changed in a way that
        // accepts more than it should: every step is a plain assignment.
        self.shared
            .gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Now, on the gate's clock.
    pub fn now(&self) -> Millis {
        self.shared.clock.now()
    }

    /// The three checks for an order on `symbol`, now.
    pub fn check(&self, symbol: &str) -> Result<Quote, Refusal> {
        let gate = self.lock();
        gate.check(symbol, self.now()).cloned()
    }

    /// The symbol's quote as it stands, accepted or not.
    pub fn quote(&self, symbol: &str) -> Option<Quote> {
        self.lock().symbol(symbol).and_then(|s| s.quote.clone())
    }

    /// Reads the gate at the current time.
    pub fn read<R>(&self, f: impl FnOnce(&Gate, Millis) -> R) -> R {
        let gate = self.lock();
        f(&gate, self.now())
    }

    /// Changes the gate at the current time and wakes the waiters.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut Gate, Millis) -> R) -> R {
        let result = {
            let mut gate = self.lock();
            let now = self.now();
            f(&mut gate, now)
        };
        self.shared.changes.send_modify(|v| *v = v.wrapping_add(1));
        result
    }

    pub(crate) fn count_reconnects(&self, n: u64) {
        self.shared.reconnects.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn count_invalid(&self) {
        self.shared.invalid.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until `done` holds for the gate. Wakes on every datagram that changes it, and at
    /// the moments a silence or a source age crosses its threshold, which change the checks'
    /// answers with no datagram at all.
    pub async fn wait_until(&self, mut done: impl FnMut(&Gate, Millis) -> bool) {
        let mut changes = self.shared.changes.subscribe();
        loop {
            let (finished, wake_at, now) =
                self.read(|g, now| (done(g, now), g.next_change(now), now));
            if finished {
                return;
            }
            let until_change = wake_at.map(|at| {
                Duration::from_millis(u64::try_from(at.saturating_sub(now)).unwrap_or(0))
            });
            tokio::select! {
                // The sender lives as long as `self`: this never ends with an error.
                _ = changes.changed() => {}
                () = async {
                    match until_change {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// What the gate saw so far.
    pub fn report(&self) -> GateReport {
        let gate = self.lock();
        GateReport {
            mode: gate.mode(),
            stats: gate.stats(),
            suspect_symbols: gate.suspect_symbols(),
            clock_offset_ms: gate.clock_offset(),
            reconnects: self.shared.reconnects.load(Ordering::Relaxed),
            invalid: self.shared.invalid.load(Ordering::Relaxed),
        }
    }
}

/// What a feed and its gate did, for a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotesReport {
    /// Where the feed is.
    pub feed_addr: SocketAddr,
    /// What the built-in simulator sent; `None` for another feed.
    pub feed: Option<FeedReport>,
    /// What the gate saw.
    pub gate: GateReport,
}

/// A feed (the built-in simulator on loopback, or another one) and the gate's receiver,
/// running.
#[derive(Debug)]
pub struct Quotes {
    gate: QuoteGate,
    feed_addr: SocketAddr,
    feed: Option<Arc<FeedStats>>,
    symbols: Vec<String>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<Result<(), WriteSideError>>>,
}

impl Quotes {
    /// Starts the receiver against `feed`, or, when `feed` is `None`, the built-in simulator
    /// with `simulator` on a loopback port first.
    pub async fn start(
        feed: Option<SocketAddr>,
        simulator: FeedConfig,
        receiver: ReceiverConfig,
    ) -> Result<Self, WriteSideError> {
        receiver.check()?;
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let (feed_addr, stats) = match feed {
            Some(addr) => (addr, None),
            None => {
                let sim = Feed::bind(SocketAddr::from(([127, 0, 0, 1], 0)), simulator).await?;
                let addr = sim.local_addr();
                let stats = sim.stats();
                let stop = stop.clone();
                tasks.push(tokio::spawn(async move { sim.run(stop).await }));
                (addr, Some(stats))
            }
        };
        let symbols = receiver.symbols.clone();
        let receiver = match Receiver::bind(feed_addr, receiver).await {
            Ok(r) => r,
            Err(e) => {
                stop.cancel();
                return Err(e);
            }
        };
        let gate = receiver.gate();
        {
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move { receiver.run(stop).await }));
        }
        Ok(Self {
            gate,
            feed_addr,
            feed: stats,
            symbols,
            stop,
            tasks,
        })
    }

    /// The gate the intake checks.
    pub fn gate(&self) -> &QuoteGate {
        &self.gate
    }

    /// Where the feed is.
    pub fn feed_addr(&self) -> SocketAddr {
        self.feed_addr
    }

    /// What the built-in simulator sent; `None` for another feed.
    pub fn feed_report(&self) -> Option<FeedReport> {
        self.feed.as_ref().map(|s| s.report())
    }

    /// What the feed and the gate did so far.
    pub fn report(&self) -> QuotesReport {
        QuotesReport {
            feed_addr: self.feed_addr,
            feed: self.feed_report(),
            gate: self.gate.report(),
        }
    }

    /// Waits until an order on every symbol would be accepted, for at most `within`; the error
    /// names the first symbol that is not, and why.
    pub async fn ready(&self, within: Duration) -> Result<(), WriteSideError> {
        let symbols = self.symbols.clone();
        let all_accepted =
            move |g: &Gate, now: Millis| symbols.iter().all(|s| g.check(s, now).is_ok());
        if tokio::time::timeout(within, self.gate.wait_until(all_accepted))
            .await
            .is_ok()
        {
            return Ok(());
        }
        let why = self.gate.read(|g, now| {
            self.symbols
                .iter()
                .find_map(|s| g.check(s, now).err().map(|r| format!("{s}: {r}")))
                .unwrap_or_default()
        });
        Err(WriteSideError::Quotes(format!(
            "no usable quote from the feed at {} within {} ({why})",
            self.feed_addr,
            humanize(within)
        )))
    }

    /// Stops the receiver and the simulator, and returns the first failure of either.
    pub async fn stop(mut self) -> Result<(), WriteSideError> {
        self.stop.cancel();
        let mut first = Ok(());
        for task in std::mem::take(&mut self.tasks) {
            let result = task.await.unwrap_or_else(|e| {
                Err(WriteSideError::Quotes(format!(
                    "a quote task ended abnormally: {e}"
                )))
            });
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

impl Drop for Quotes {
    /// A feed and a receiver left running would serve a gate nobody reads.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn humanize(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}
