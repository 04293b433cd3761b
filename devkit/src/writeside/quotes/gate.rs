//! The quote gate: the state of one at-most-once price feed, per symbol, and the three checks
//! an order passes before it is accepted (seed 000, "At-most-once: kaybolan tick meselesi").
//!
//! Pure logic, no I/O and no clock: every time is passed in, in milliseconds of the local clock
//! ([`super::LocalClock`]); source times are the feed's own clock, and the measured
//! [`ClockOffset`] between the two is set by the caller.
//!
//! Prices travel at most once because a tick's retry is worthless: a newer price is already
//! there, and the time a retransmission costs delays the whole stream instead of saving data.
//! So ticks may be lost, duplicated or reordered, and an order must never be accepted on a
//! price that is stale or that the gate cannot vouch for. The rules are the seed's, in its
//! order; the sequence number is the reliable key, never the time:
//!
//! - **Tick**: drop first, then look for a gap. A tick at or below the last sequence is a
//!   duplicate (equal) or a late old tick (below) and is dropped. Only a *forward* gap counts
//!   (`seq > last + 1` adds `seq - last - 1` to the ticks lost; a tick behind never subtracts).
//!   On a gap a *delta* feed marks the symbol suspect until a snapshot: the changes in the
//!   lost ticks are gone, so the price rebuilt from the deltas is wrong. A *full-quote* feed
//!   clears suspicion with every tick it takes, gap or not: the tick is the whole current price.
//!   The tick is then the quote, and the symbol is alive now.
//! - **Heartbeat**: the price did not change but the provider is alive. It carries the next
//!   sequence the provider will send. If that shows a forward gap, the lost ticks are counted,
//!   the last sequence moves to `next - 1` so that the next tick does not count the same gap
//!   again, the symbol turns suspect (delta: until a snapshot; full: until the next tick), and
//!   liveness is **not** refreshed: otherwise, while ticks are being lost, heartbeats would keep
//!   showing an old price as fresh. Announcing exactly the tick after the last, the symbol is
//!   alive now; behind the last, see below.
//! - **Snapshot**: the state is rebuilt; suspicion is cleared and the sequence is set to the
//!   snapshot's. A provider resets its numbering on reconnect and at the start of the day;
//!   without this, the "at or below the last" rule would drop every tick after the reset. (One
//!   overtaken by a newer tick is dropped, see below.)
//! - **Check** before an order, in this order: the silence since the last tick *or gap-free
//!   heartbeat* over [`Limits::stale_after_ms`] refuses with `stale quote: N ms`; the quote's
//!   source time, aged on our clock after subtracting the measured clock offset (two clocks),
//!   over [`Limits::source_stale_after_ms`] (a separate, more tolerant threshold), or ahead of
//!   our clock by more than the offset can be wrong, refuses with `stale at source`; a suspect
//!   symbol refuses with `suspect`.
//!
//! What the seed leaves open, decided here:
//!
//! - Before the first tick or snapshot of a symbol there is no last sequence: the first tick
//!   counts nothing lost (nobody knows where the stream began), and a heartbeat is ignored
//!   (there is no price to keep alive). A delta symbol starts suspect: it has no base to apply
//!   deltas to until its first snapshot.
//! - A snapshot sets the quote (it carries the whole price) but not liveness: the seed's
//!   silence counts from a tick or a gap-free heartbeat only, and a provider follows a
//!   snapshot with its stream at once.
//! - A heartbeat refreshes liveness, not the quote's source time: a price that rested longer
//!   than the source threshold is refused as stale at source, as the seed's check reads.
//! - A tick equal to the last sequence is counted a duplicate, one below it late; a copy of an
//!   older tick cannot be told from a late one and counts as late.
//! - No clock offset measured yet: the source age is unknown, refused as stale at source.
//!
//! Where the gate goes beyond the seed's literal text, each time because the literal rule
//! would accept an order on a price it cannot vouch for:
//!
//! - **A heartbeat behind the stream.** The seed refreshes liveness on every heartbeat that
//!   shows no forward gap (`next <= last + 1`). Here only `next == last + 1` does: that one
//!   says "nothing was sent after the tick you hold". A heartbeat with `next <= last` announces
//!   a tick the gate has already passed: either it was overtaken by the ticks after it, or the
//!   provider restarted its numbering and its snapshot was lost, so that every new tick is
//!   dropped as late while its heartbeats, read literally, would keep the old price fresh:
//!   the very thing the seed's gap rule is there to prevent. The two cannot be told apart
//!   from the datagram, so a heartbeat behind refreshes nothing, marks the symbol suspect and
//!   asks for a snapshot ([`SymbolState::resync`]), in both modes: only a snapshot resets a
//!   numbering. A heartbeat merely overtaken costs a reconnect, never a wrong price.
//! - **A snapshot overtaken by a newer tick.** The seed takes every snapshot. But a snapshot
//!   restarts the numbering, so the sequence cannot say whether a tick came before or after
//!   it, and a datagram can be overtaken on the way (the simulator's reorder fault does it
//!   to the snapshot of a reconnect and tick 1 after it): taken after a newer tick, it rolls
//!   the quote back and clears suspicion. So a snapshot stamped before the newest source time
//!   the gate has seen on the symbol (of any tick, taken or dropped, or snapshot) is dropped,
//!   and the symbol turns suspect and asks for a snapshot. The provider's stamp is all that
//!   is left to order a snapshot by, and it is used only to refuse, never to accept: a stamp
//!   that jumps back (a clock stepped back, a lagging source) holds the symbol's snapshots
//!   back until the stamps pass the newest again, refusing orders meanwhile. Equal stamps
//!   are not ordered. A stream id on the wire would order them without a clock.
//! - **A source time in the future.** The seed refuses an age over the threshold; an age
//!   below zero passes and would go on passing until the price is that much older, while
//!   heartbeats keep it alive. A correct stamp is never ahead of our clock by more than the
//!   clock offset's error, so a quote ahead by more ([`ClockEstimate::error_ms`] and
//!   [`READING_SLACK_MS`]) has an unknown age: `stale at source`.
//! - **A full feed's tick without both prices.** In a full feed a tick is the whole quote;
//!   one without a bid or an ask is invalid. Its sequence is used up (it arrived, so it is
//!   not counted lost), it is not the quote and refreshes no liveness, and the symbol is
//!   suspect until the next whole tick: a newer price exists that the gate does not have.
//!   An accepted quote always has both prices.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch: on the local clock for arrivals and "now", on the
/// feed's clock for source times.
pub type Millis = i64;

/// What one tick carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedMode {
    /// Every tick is the whole quote (bid and ask).
    Full,
    /// A tick carries only what changed; the quote is rebuilt from a snapshot and the deltas
    /// after it, so a lost delta leaves it wrong until the next snapshot.
    Delta,
}

impl FeedMode {
    /// `full` or `delta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Delta => "delta",
        }
    }
}

/// A price update. In a full feed both prices are set; in a delta feed only those that
/// changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// The provider's increasing number, per symbol.
    pub seq: i64,
    /// The bid, if the tick carries it.
    pub bid: Option<Decimal>,
    /// The ask, if the tick carries it.
    pub ask: Option<Decimal>,
    /// The provider's stamp, on its clock.
    pub source_ms: Millis,
}

/// The whole quote of a symbol and the sequence its stream continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The next tick is `seq + 1`.
    pub seq: i64,
    /// The bid.
    pub bid: Decimal,
    /// The ask.
    pub ask: Decimal,
    /// The provider's stamp, on its clock.
    pub source_ms: Millis,
}

/// The price as the gate knows it. Decimals, as the feed wrote them: the seed allows a
/// `double` for a quote, but nothing here needs one and the workspace denies float arithmetic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quote {
    /// The bid, once known.
    pub bid: Option<Decimal>,
    /// The ask, once known.
    pub ask: Option<Decimal>,
    /// The source time of the tick or snapshot that last set it, on the feed's clock.
    pub source_ms: Millis,
}

/// The thresholds of the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest silence since the last tick or gap-free heartbeat, in ms.
    pub stale_after_ms: Millis,
    /// Oldest source time accepted, after the clock offset, in ms: a separate and more
    /// tolerant threshold (the seed's example: 2 s), since it also carries the clock offset's
    /// error.
    pub source_stale_after_ms: Millis,
}

impl Default for Limits {
    /// 500 ms of silence; 2 s at the source, the seed's example.
    fn default() -> Self {
        Self {
            stale_after_ms: 500,
            source_stale_after_ms: 2000,
        }
    }
}

/// One symbol's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolState {
    /// The last sequence taken (tick or snapshot) or skipped to (a heartbeat's gap); `None`
    /// before the first.
    pub last_seq: Option<i64>,
    /// The price.
    pub quote: Option<Quote>,
    /// When the last tick or gap-free heartbeat arrived: silence is measured from here.
    pub alive_at: Option<Millis>,
    /// Set by a gap (delta: until a snapshot; full: until the next tick), a heartbeat behind
    /// the stream, an overtaken snapshot, or a full tick without both prices.
    pub suspect: bool,
    /// The numbering may have been reset behind the gate's back (a heartbeat behind the last
    /// sequence, an overtaken snapshot): the receiver asks for a snapshot, in either mode,
    /// since nothing else resets a numbering. Cleared by a snapshot, or in a full feed by the
    /// next tick taken (a sequence past the last is a numbering the gate follows again).
    pub resync: bool,
    /// The newest source time seen on the symbol, on any tick (taken or dropped) or snapshot
    /// taken: a snapshot stamped before it is overtaken.
    pub newest_source_ms: Option<Millis>,
}

/// What happened to a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickVerdict {
    /// Taken as the quote; `lost` ticks were skipped before it (a forward gap).
    Applied {
        /// Ticks never received between the last one and this one.
        lost: u64,
    },
    /// The same sequence as the last tick: dropped.
    Duplicate,
    /// Below the last sequence, an old tick overtaken by newer ones: dropped.
    Late,
    /// A full feed's tick without a bid or an ask: not the quote; its sequence is used up and
    /// the symbol is suspect until the next whole tick. `lost` ticks were skipped before it.
    Incomplete {
        /// Ticks never received between the last one and this one.
        lost: u64,
    },
}

/// What happened to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatVerdict {
    /// No gap: the symbol is alive now.
    Alive,
    /// Ticks were lost before it: counted, the sequence moved past them, the symbol suspect,
    /// liveness not refreshed.
    Gap {
        /// Ticks the heartbeat showed lost.
        lost: u64,
    },
    /// It announces a tick at or below the last sequence: overtaken by the ticks after it, or
    /// a numbering restarted whose snapshot was lost. No liveness; the symbol suspect and
    /// resynchronized.
    Behind,
    /// The symbol has no sequence yet (no tick, no snapshot): nothing to keep alive.
    Unknown,
}

/// What happened to a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotVerdict {
    /// Taken: suspicion cleared, the sequence and the quote set.
    Taken,
    /// Stamped before a tick or snapshot already seen: dropped, the symbol suspect and
    /// resynchronized.
    Overtaken,
}

/// What a suspect symbol waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Awaited {
    /// A delta feed: only a snapshot rebuilds the price.
    Snapshot,
    /// A full feed: the next tick is the whole current price.
    Tick,
}

/// Why the gate refused an order. Stored as the order's reply (JSON, the reason in `reason`)
/// and returned unchanged to every retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    /// Too long since the last tick or gap-free heartbeat; `None` when there never was one.
    StaleQuote {
        /// The silence, in ms.
        silence_ms: Option<Millis>,
    },
    /// The quote's source time is too old on our clock; `None` when no clock offset has been
    /// measured yet.
    StaleAtSource {
        /// The quote's age after the clock offset, in ms.
        age_ms: Option<Millis>,
    },
    /// A gap was seen and not yet healed.
    Suspect {
        /// What heals it.
        waiting_for: Awaited,
    },
}

impl Refusal {
    /// The reason's name: `stale_quote`, `stale_at_source` or `suspect` (the JSON's `reason`
    /// and the metric's label).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::StaleQuote { .. } => "stale_quote",
            Self::StaleAtSource { .. } => "stale_at_source",
            Self::Suspect { .. } => "suspect",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StaleQuote {
                silence_ms: Some(ms),
            } => write!(f, "stale quote: {ms} ms"),
            Self::StaleQuote { silence_ms: None } => {
                f.write_str("stale quote: no tick or gap-free heartbeat yet")
            }
            Self::StaleAtSource { .. } => f.write_str("stale at source"),
            Self::Suspect {
                waiting_for: Awaited::Snapshot,
            } => f.write_str("suspect: waiting for a snapshot"),
            Self::Suspect {
                waiting_for: Awaited::Tick,
            } => f.write_str("suspect: waiting for a new tick"),
        }
    }
}

/// Running totals since the gate was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ticks taken.
    pub ticks: u64,
    /// Ticks never received: every forward gap, seen by a tick or a heartbeat (the seed's
    /// total).
    pub lost: u64,
    /// Ticks dropped for repeating the last sequence.
    pub duplicates: u64,
    /// Ticks dropped for being below the last sequence.
    pub late: u64,
    /// Heartbeats that showed a gap.
    pub heartbeat_gaps: u64,
    /// Heartbeats behind the last sequence.
    pub heartbeats_behind: u64,
    /// Snapshots taken.
    pub snapshots: u64,
    /// Snapshots dropped as overtaken.
    pub snapshots_overtaken: u64,
    /// Full ticks without both prices, dropped.
    pub incomplete: u64,
}

/// Our clock minus the feed's, and how far off that can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockEstimate {
    /// Local clock minus the feed's, in ms.
    pub offset_ms: Millis,
    /// At most this far from the true offset, in ms (half the round trip it was measured
    /// with).
    pub error_ms: Millis,
}

/// What a source time may be ahead of our clock beyond the offset's error: the readings are
/// whole milliseconds of two clocks, each made of two truncated parts ([`super::LocalClock`]),
/// so a difference of readings is a few milliseconds off at most. Nothing next to a source
/// threshold of seconds.
pub const READING_SLACK_MS: Millis = 5;

/// The gate over every symbol of one feed.
#[derive(Debug, Clone)]
pub struct Gate {
    mode: FeedMode,
    limits: Limits,
    symbols: BTreeMap<String, SymbolState>,
    /// Local clock minus the feed's clock, as last measured.
    clock: Option<ClockEstimate>,
    stats: Stats,
}

/// The state of `name`, made on first sight. A function of the map alone, so that the caller
/// can count in the gate's stats while it holds the state.
fn entry<'a>(
    symbols: &'a mut BTreeMap<String, SymbolState>,
    mode: FeedMode,
    name: &str,
) -> &'a mut SymbolState {
    symbols
        .entry(name.to_owned())
        .or_insert_with(|| SymbolState {
            last_seq: None,
            quote: None,
            alive_at: None,
            // A delta symbol has nothing to apply deltas to before its first snapshot.
            suspect: mode == FeedMode::Delta,
            resync: false,
            newest_source_ms: None,
        })
}

/// `seq - last - 1` as a count, 0 when `seq` is not ahead of `last + 1`; never negative and
/// never overflowing, whatever a feed sends.
fn forward_gap(last: i64, seq: i64) -> u64 {
    let gap = i128::from(seq) - i128::from(last) - 1;
    u64::try_from(gap.max(0)).unwrap_or(u64::MAX)
}

impl Gate {
    /// A gate over a feed of `mode`, with no symbol known yet and no clock offset.
    pub fn new(mode: FeedMode, limits: Limits) -> Self {
        Self {
            mode,
            limits,
            symbols: BTreeMap::new(),
            clock: None,
            stats: Stats::default(),
        }
    }

    /// The feed's mode.
    pub fn mode(&self) -> FeedMode {
        self.mode
    }

    /// The thresholds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A symbol's state, once it has one.
    pub fn symbol(&self, name: &str) -> Option<&SymbolState> {
        self.symbols.get(name)
    }

    /// The totals.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Local clock minus the feed's clock, as last measured.
    pub fn clock_offset(&self) -> Option<Millis> {
        self.clock.map(|c| c.offset_ms)
    }

    /// Sets the measured offset and its error.
    pub fn set_clock(&mut self, clock: Option<ClockEstimate>) {
        self.clock = clock;
    }

    /// Sets an exact offset (local clock minus the feed's), as when both clocks are one.
    pub fn set_clock_offset(&mut self, offset: Option<Millis>) {
        self.clock = offset.map(|offset_ms| ClockEstimate {
            offset_ms,
            error_ms: 0,
        });
    }

    /// Symbols suspect now.
    pub fn suspect_symbols(&self) -> usize {
        self.symbols.values().filter(|s| s.suspect).count()
    }

    /// A tick of `symbol` arrived at `now`.
    pub fn tick(&mut self, symbol: &str, tick: &Tick, now: Millis) -> TickVerdict {
        let mode = self.mode;
        let state = entry(&mut self.symbols, mode, symbol);
        // Every tick's stamp, dropped or not: a tick of a new stream dropped as late is still
        // newer than a snapshot that arrives after it.
        state.newest_source_ms = state.newest_source_ms.max(Some(tick.source_ms));
        let mut lost = 0;
        if let Some(last) = state.last_seq {
            // Drop first: a duplicate or an old tick overtaken by newer ones.
            if tick.seq == last {
                self.stats.duplicates += 1;
                return TickVerdict::Duplicate;
            }
            if tick.seq < last {
                self.stats.late += 1;
                return TickVerdict::Late;
            }
            // Then the gap, forward only.
            lost = forward_gap(last, tick.seq);
            if lost > 0 && mode == FeedMode::Delta {
                state.suspect = true;
            }
        }
        self.stats.lost = self.stats.lost.saturating_add(lost);
        if mode == FeedMode::Full && (tick.bid.is_none() || tick.ask.is_none()) {
            // It arrived, so it is not lost, and its copies are duplicates; but the price the
            // gate holds is now known to be older than the provider's.
            state.last_seq = Some(tick.seq);
            state.suspect = true;
            self.stats.incomplete += 1;
            return TickVerdict::Incomplete { lost };
        }
        if mode == FeedMode::Full {
            state.suspect = false;
            state.resync = false;
        }
        state.quote = Some(match (mode, state.quote.take()) {
            (FeedMode::Delta, Some(before)) => Quote {
                bid: tick.bid.or(before.bid),
                ask: tick.ask.or(before.ask),
                source_ms: tick.source_ms,
            },
            _ => Quote {
                bid: tick.bid,
                ask: tick.ask,
                source_ms: tick.source_ms,
            },
        });
        state.last_seq = Some(tick.seq);
        state.alive_at = Some(now);
        self.stats.ticks += 1;
        TickVerdict::Applied { lost }
    }

    /// A heartbeat of `symbol` saying the next tick will be `next_seq` arrived at `now`.
    pub fn heartbeat(&mut self, symbol: &str, next_seq: i64, now: Millis) -> HeartbeatVerdict {
        let Some(state) = self.symbols.get_mut(symbol) else {
            return HeartbeatVerdict::Unknown;
        };
        let Some(last) = state.last_seq else {
            return HeartbeatVerdict::Unknown;
        };
        if next_seq <= last {
            // Beyond the seed's literal rule (the module doc): announcing a tick already
            // passed, it vouches for nothing the gate holds.
            state.suspect = true;
            state.resync = true;
            self.stats.heartbeats_behind += 1;
            return HeartbeatVerdict::Behind;
        }
        let lost = forward_gap(last, next_seq);
        if lost == 0 {
            state.alive_at = Some(now);
            return HeartbeatVerdict::Alive;
        }
        // Counted once: the next tick (next_seq) finds no gap.
        state.last_seq = Some(next_seq.saturating_sub(1));
        state.suspect = true;
        self.stats.lost = self.stats.lost.saturating_add(lost);
        self.stats.heartbeat_gaps += 1;
        HeartbeatVerdict::Gap { lost }
    }

    /// A snapshot of `symbol` arrived.
    pub fn snapshot(&mut self, symbol: &str, snapshot: &Snapshot) -> SnapshotVerdict {
        let state = entry(&mut self.symbols, self.mode, symbol);
        if state
            .newest_source_ms
            .is_some_and(|newest| snapshot.source_ms < newest)
        {
            // Taken, it would roll the quote back past a newer tick, or lose the change a
            // dropped one carried, and clear suspicion on top (the module doc).
            state.suspect = true;
            state.resync = true;
            self.stats.snapshots_overtaken += 1;
            return SnapshotVerdict::Overtaken;
        }
        state.suspect = false;
        state.resync = false;
        state.last_seq = Some(snapshot.seq);
        state.newest_source_ms = Some(snapshot.source_ms);
        state.quote = Some(Quote {
            bid: Some(snapshot.bid),
            ask: Some(snapshot.ask),
            source_ms: snapshot.source_ms,
        });
        self.stats.snapshots += 1;
        SnapshotVerdict::Taken
    }

    /// The three checks before an order on `symbol` at `now`, in the seed's order: the quote,
    /// or why not. An accepted quote has both prices.
    pub fn check(&self, symbol: &str, now: Millis) -> Result<&Quote, Refusal> {
        let state = self.symbols.get(symbol);
        let (Some(state), Some(alive_at)) = (state, state.and_then(|s| s.alive_at)) else {
            return Err(Refusal::StaleQuote { silence_ms: None });
        };
        let silence = now.saturating_sub(alive_at);
        if silence > self.limits.stale_after_ms {
            return Err(Refusal::StaleQuote {
                silence_ms: Some(silence),
            });
        }
        let suspect = Refusal::Suspect {
            waiting_for: match self.mode {
                FeedMode::Delta => Awaited::Snapshot,
                FeedMode::Full => Awaited::Tick,
            },
        };
        // Alive with no price: a full feed whose only ticks lacked one.
        let Some(quote) = &state.quote else {
            return Err(suspect);
        };
        let Some(clock) = self.clock else {
            return Err(Refusal::StaleAtSource { age_ms: None });
        };
        // Two clocks: the source time is the feed's, now is ours.
        let age = now
            .saturating_sub(quote.source_ms)
            .saturating_sub(clock.offset_ms);
        if age > self.limits.source_stale_after_ms || age < -ahead_tolerance(clock) {
            return Err(Refusal::StaleAtSource { age_ms: Some(age) });
        }
        if state.suspect || quote.bid.is_none() || quote.ask.is_none() {
            return Err(suspect);
        }
        Ok(quote)
    }

    /// The earliest time after `now` at which a check's answer could change with no datagram
    /// arriving (silence or source age crossing its threshold, or a stamp from ahead of our
    /// clock coming within the tolerance); `None` when no such time is ahead. Everything else
    /// that changes an answer is a datagram.
    pub fn next_change(&self, now: Millis) -> Option<Millis> {
        let clock = self.clock;
        self.symbols
            .values()
            .flat_map(|s| {
                let silence = s.alive_at.map(|at| {
                    at.saturating_add(self.limits.stale_after_ms)
                        .saturating_add(1)
                });
                let (ages, ahead) = s
                    .quote
                    .as_ref()
                    .zip(clock)
                    .map(|(q, clock)| {
                        let on_our_clock = q.source_ms.saturating_add(clock.offset_ms);
                        let ages = on_our_clock
                            .saturating_add(self.limits.source_stale_after_ms)
                            .saturating_add(1);
                        let ahead = on_our_clock.saturating_sub(ahead_tolerance(clock));
                        (Some(ages), Some(ahead))
                    })
                    .unwrap_or_default();
                [silence, ages, ahead]
            })
            .flatten()
            .filter(|&t| t > now)
            .min()
    }
}

/// How far a source time may be ahead of our clock and still be a correct stamp.
fn ahead_tolerance(clock: ClockEstimate) -> Millis {
    clock.error_ms.max(0).saturating_add(READING_SLACK_MS)
}

/// The offset between our clock and the feed's, measured by pings (NTP's way): a ping leaves
/// at `sent` on our clock, the feed answers with its clock's reading, the answer arrives at
/// `received`. If the two legs take as long, the feed read its clock at `sent + rtt / 2`, so
/// `offset = sent + rtt / 2 - feed`, with an error of at most `rtt / 2`. Of the last samples,
/// the one with the shortest round trip has the smallest error bound, and it is the one used.
///
/// Measured apart from the quotes on purpose: an offset taken from the ticks' own stamps would
/// absorb a provider that falls behind, the very thing the source-age check is there to see.
#[derive(Debug, Clone)]
pub struct ClockOffset {
    /// (round trip, offset), newest last.
    samples: VecDeque<(Millis, Millis)>,
    keep: usize,
}

impl ClockOffset {
    /// Keeps the last `keep` samples (at least one).
    pub fn new(keep: usize) -> Self {
        Self {
            samples: VecDeque::new(),
            keep: keep.max(1),
        }
    }

    /// Adds the sample of a ping sent at `sent`, answered with the feed's `feed`, received at
    /// `received` (our clock), and returns the estimate. A sample that arrives before it was
    /// sent is ignored.
    pub fn sample(&mut self, sent: Millis, feed: Millis, received: Millis) -> Option<Millis> {
        let rtt = received.saturating_sub(sent);
        if rtt >= 0 {
            if self.samples.len() == self.keep {
                self.samples.pop_front();
            }
            let offset = sent.saturating_add(rtt / 2).saturating_sub(feed);
            self.samples.push_back((rtt, offset));
        }
        self.offset()
    }

    /// The offset of the sample with the shortest round trip (the newest among equals).
    pub fn offset(&self) -> Option<Millis> {
        self.estimate().map(|e| e.offset_ms)
    }

    /// That offset with its error: the feed read its clock somewhere between `sent` and
    /// `received`, so the offset is within half the round trip (rounded up) of the estimate.
    pub fn estimate(&self) -> Option<ClockEstimate> {
        self.samples
            .iter()
            .rev()
            .min_by_key(|(rtt, _)| *rtt)
            .map(|&(rtt, offset_ms)| ClockEstimate {
                offset_ms,
                error_ms: rtt.saturating_sub(rtt / 2),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        stale_after_ms: 500,
        source_stale_after_ms: 2000,
    };

    fn dec(text: &str) -> Decimal {
        text.parse().expect("a decimal")
    }

    fn full(seq: i64, bid: &str, ask: &str, source_ms: Millis) -> Tick {
        Tick {
            seq,
            bid: Some(dec(bid)),
            ask: Some(dec(ask)),
            source_ms,
        }
    }

    fn snapshot(seq: i64, source_ms: Millis) -> Snapshot {
        Snapshot {
            seq,
            bid: dec("1.08418"),
            ask: dec("1.08422"),
            source_ms,
        }
    }

    /// A gate whose clocks agree (offset 0).
    fn gate(mode: FeedMode) -> Gate {
        let mut g = Gate::new(mode, LIMITS);
        g.set_clock_offset(Some(0));
        g
    }

    #[test]
    fn a_forward_gap_counts_the_ticks_lost_and_only_forward() {
        let mut g = gate(FeedMode::Full);
        assert_eq!(
            g.tick("EURUSD", &full(7, "1.1", "1.2", 0), 0),
            TickVerdict::Applied { lost: 0 },
            "the first tick counts nothing: nobody knows where the stream began"
        );
        assert_eq!(
            g.tick("EURUSD", &full(8, "1.1", "1.2", 0), 1),
            TickVerdict::Applied { lost: 0 }
        );
        assert_eq!(
            g.tick("EURUSD", &full(12, "1.1", "1.2", 0), 2),
            TickVerdict::Applied { lost: 3 },
            "9, 10 and 11 never came"
        );
        // 10 arrives after all: dropped, and the total is not lowered.
        assert_eq!(
            g.tick("EURUSD", &full(10, "1.1", "1.2", 0), 3),
            TickVerdict::Late
        );
        assert_eq!(g.stats().lost, 3);
        assert_eq!(g.symbol("EURUSD").and_then(|s| s.last_seq), Some(12));
        // Sequences are per symbol.
        assert_eq!(
            g.tick("GBPUSD", &full(1, "1.2", "1.3", 0), 3),
            TickVerdict::Applied { lost: 0 }
        );
    }

    #[test]
    fn a_duplicate_is_dropped_and_changes_nothing_but_the_newest_stamp() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(1, "1.1", "1.2", 100), 100);
        let before = g.symbol("EURUSD").cloned().expect("state");
        assert_eq!(
            g.tick("EURUSD", &full(1, "9.9", "9.9", 400), 400),
            TickVerdict::Duplicate
        );
        let after = g.symbol("EURUSD").cloned().expect("state");
        assert_eq!(
            SymbolState {
                newest_source_ms: before.newest_source_ms,
                ..after.clone()
            },
            before,
            "not even liveness"
        );
        // A tick 1 stamped later may be a new numbering's: a snapshot older than it is
        // overtaken.
        assert_eq!(after.newest_source_ms, Some(400));
        assert_eq!((g.stats().duplicates, g.stats().ticks), (1, 1));
    }

    #[test]
    fn a_late_tick_is_dropped_its_old_price_unused() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(1, "1.1", "1.2", 0), 0);
        g.tick("EURUSD", &full(3, "1.3", "1.4", 0), 10);
        assert_eq!(
            g.tick("EURUSD", &full(2, "1.2", "1.3", 0), 20),
            TickVerdict::Late
        );
        let quote = g.check("EURUSD", 20).expect("accepted");
        assert_eq!(quote.bid, Some(dec("1.3")), "the newest price stays");
        let s = g.symbol("EURUSD").expect("state");
        assert_eq!((s.last_seq, s.alive_at), (Some(3), Some(10)));
        assert_eq!((g.stats().late, g.stats().lost), (1, 1));
    }

    #[test]
    fn a_gap_in_a_delta_feed_is_suspect_until_a_snapshot() {
        let mut g = gate(FeedMode::Delta);
        g.tick(
            "EURUSD",
            &Tick {
                seq: 1,
                bid: Some(dec("1.1")),
                ask: None,
                source_ms: 0,
            },
            0,
        );
        assert_eq!(
            g.check("EURUSD", 0),
            Err(Refusal::Suspect {
                waiting_for: Awaited::Snapshot
            }),
            "no snapshot yet: nothing to apply deltas to"
        );
        g.snapshot("EURUSD", &snapshot(1, 0));
        assert!(g.check("EURUSD", 0).is_ok());
        // A delta moves only what it carries.
        g.tick(
            "EURUSD",
            &Tick {
                seq: 2,
                bid: None,
                ask: Some(dec("1.08425")),
                source_ms: 5,
            },
            5,
        );
        let q = g.check("EURUSD", 5).expect("in order");
        assert_eq!(
            (q.bid, q.ask, q.source_ms),
            (Some(dec("1.08418")), Some(dec("1.08425")), 5)
        );

        // 3 is lost: 4 is taken but the rebuilt price is wrong, and more ticks do not heal it.
        for seq in [4, 5, 6] {
            g.tick(
                "EURUSD",
                &Tick {
                    seq,
                    bid: Some(dec("1.2")),
                    ask: None,
                    source_ms: 10,
                },
                10,
            );
        }
        assert_eq!(g.stats().lost, 1);
        assert_eq!(
            g.check("EURUSD", 10),
            Err(Refusal::Suspect {
                waiting_for: Awaited::Snapshot
            })
        );
        assert_eq!(g.suspect_symbols(), 1);
        g.snapshot("EURUSD", &snapshot(6, 10));
        assert!(g.check("EURUSD", 10).is_ok());
        assert_eq!(g.suspect_symbols(), 0);
    }

    #[test]
    fn a_gap_in_a_full_feed_is_healed_by_the_tick_itself() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(1, "1.1", "1.2", 0), 0);
        assert_eq!(
            g.tick("EURUSD", &full(5, "1.5", "1.6", 0), 10),
            TickVerdict::Applied { lost: 3 }
        );
        let q = g
            .check("EURUSD", 10)
            .expect("a full tick is the current price");
        assert_eq!((q.bid, q.ask), (Some(dec("1.5")), Some(dec("1.6"))));
        assert_eq!(g.stats().lost, 3, "counted all the same");
    }

    #[test]
    fn a_heartbeat_without_a_gap_keeps_the_symbol_alive() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(4, "1.1", "1.2", 0), 0);
        assert_eq!(g.heartbeat("EURUSD", 5, 400), HeartbeatVerdict::Alive);
        assert_eq!(g.heartbeat("EURUSD", 5, 800), HeartbeatVerdict::Alive);
        assert!(
            g.check("EURUSD", 1200).is_ok(),
            "400 ms since the last heartbeat"
        );
        assert_eq!(
            g.check("EURUSD", 1301),
            Err(Refusal::StaleQuote {
                silence_ms: Some(501)
            })
        );
        assert_eq!(g.stats().lost, 0);
    }

    #[test]
    fn a_heartbeat_showing_a_gap_counts_it_once_and_does_not_keep_the_price_alive() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(4, "1.1", "1.2", 0), 0);
        // 5 and 6 were lost: the provider says 7 is next.
        assert_eq!(
            g.heartbeat("EURUSD", 7, 300),
            HeartbeatVerdict::Gap { lost: 2 }
        );
        assert_eq!(
            g.check("EURUSD", 300),
            Err(Refusal::Suspect {
                waiting_for: Awaited::Tick
            })
        );
        // Heartbeats go on arriving while the ticks are lost: no liveness from any of them.
        assert_eq!(
            g.heartbeat("EURUSD", 9, 450),
            HeartbeatVerdict::Gap { lost: 2 }
        );
        assert_eq!(
            g.check("EURUSD", 501),
            Err(Refusal::StaleQuote {
                silence_ms: Some(501)
            }),
            "silence counts from the last tick, the heartbeats with gaps refreshed nothing"
        );
        // The next tick finds no gap: each lost tick is counted once.
        assert_eq!(
            g.tick("EURUSD", &full(9, "1.3", "1.4", 520), 520),
            TickVerdict::Applied { lost: 0 }
        );
        assert_eq!(g.stats().lost, 4);
        assert_eq!(g.stats().heartbeat_gaps, 2);
        assert!(
            g.check("EURUSD", 520).is_ok(),
            "a full feed heals at the next tick"
        );
    }

    #[test]
    fn a_heartbeat_gap_in_a_delta_feed_waits_for_a_snapshot() {
        let mut g = gate(FeedMode::Delta);
        g.snapshot("EURUSD", &snapshot(0, 0));
        g.tick(
            "EURUSD",
            &Tick {
                seq: 1,
                bid: Some(dec("1.1")),
                ask: None,
                source_ms: 0,
            },
            0,
        );
        assert_eq!(
            g.heartbeat("EURUSD", 3, 100),
            HeartbeatVerdict::Gap { lost: 1 }
        );
        g.tick(
            "EURUSD",
            &Tick {
                seq: 3,
                bid: Some(dec("1.2")),
                ask: None,
                source_ms: 150,
            },
            150,
        );
        assert_eq!(
            g.check("EURUSD", 150),
            Err(Refusal::Suspect {
                waiting_for: Awaited::Snapshot
            }),
            "a delta after a lost delta is still a wrong price"
        );
    }

    #[test]
    fn a_heartbeat_before_any_sequence_is_ignored() {
        let mut g = gate(FeedMode::Full);
        assert_eq!(g.heartbeat("EURUSD", 40, 0), HeartbeatVerdict::Unknown);
        assert_eq!(
            g.check("EURUSD", 0),
            Err(Refusal::StaleQuote { silence_ms: None })
        );
        assert_eq!(g.stats().lost, 0);
    }

    #[test]
    fn a_snapshot_resets_the_sequence_and_clears_suspicion() {
        let mut g = gate(FeedMode::Delta);
        g.snapshot("EURUSD", &snapshot(500, 0));
        g.tick(
            "EURUSD",
            &Tick {
                seq: 502,
                bid: Some(dec("1.1")),
                ask: None,
                source_ms: 0,
            },
            0,
        );
        assert!(g.check("EURUSD", 0).is_err(), "501 was lost");
        // The provider reconnected and numbers from 0 again.
        g.snapshot("EURUSD", &snapshot(0, 10));
        let s = g.symbol("EURUSD").expect("state");
        assert_eq!((s.last_seq, s.suspect), (Some(0), false));
        assert_eq!(s.alive_at, Some(0), "a snapshot does not refresh liveness");
        // Without the reset, 1 would be dropped as far below 502.
        assert_eq!(
            g.tick(
                "EURUSD",
                &Tick {
                    seq: 1,
                    bid: None,
                    ask: Some(dec("1.09")),
                    source_ms: 20
                },
                20
            ),
            TickVerdict::Applied { lost: 0 }
        );
        let q = g.check("EURUSD", 20).expect("healed");
        assert_eq!(
            (q.bid, q.ask),
            (Some(dec("1.08418")), Some(dec("1.09"))),
            "the snapshot's bid, the delta's ask"
        );
        assert_eq!(g.stats().snapshots, 2);
    }

    #[test]
    fn silence_is_measured_from_a_tick_or_a_gap_free_heartbeat() {
        let mut g = gate(FeedMode::Full);
        assert_eq!(
            g.check("EURUSD", 0),
            Err(Refusal::StaleQuote { silence_ms: None })
        );
        assert_eq!(
            Refusal::StaleQuote { silence_ms: None }.to_string(),
            "stale quote: no tick or gap-free heartbeat yet"
        );
        g.tick("EURUSD", &full(1, "1.1", "1.2", 1000), 1000);
        assert!(g.check("EURUSD", 1500).is_ok(), "500 ms is not over 500");
        let refused = g.check("EURUSD", 1812).expect_err("stale");
        assert_eq!(refused.to_string(), "stale quote: 812 ms");
        assert_eq!(refused.reason(), "stale_quote");
    }

    #[test]
    fn source_age_subtracts_the_clock_offset() {
        let mut g = Gate::new(FeedMode::Full, LIMITS);
        // The feed's clock runs 2500 ms ahead of ours.
        g.tick("EURUSD", &full(1, "1.1", "1.2", 12_500), 10_000);
        assert_eq!(
            g.check("EURUSD", 10_000),
            Err(Refusal::StaleAtSource { age_ms: None }),
            "no offset measured: the age is unknown"
        );
        g.set_clock_offset(Some(-2500));
        assert!(g.check("EURUSD", 10_000).is_ok(), "0 ms old on our clock");
        // The provider falls behind: its tick was stamped 3 s before it was sent.
        g.tick("EURUSD", &full(2, "1.1", "1.2", 9600), 10_100);
        let refused = g.check("EURUSD", 10_100).expect_err("old at the source");
        assert_eq!(refused, Refusal::StaleAtSource { age_ms: Some(3000) });
        assert_eq!(refused.to_string(), "stale at source");
        // Compared as if the clocks agreed, the old price would pass (500 ms): the offset
        // matters.
        g.set_clock_offset(Some(0));
        assert!(g.check("EURUSD", 10_100).is_ok());
    }

    #[test]
    fn the_checks_run_in_the_seeds_order() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(1, "1.1", "1.2", -10_000), 0);
        g.heartbeat("EURUSD", 5, 100);
        // Silent, old at the source and suspect at once: silence wins.
        assert!(matches!(
            g.check("EURUSD", 600),
            Err(Refusal::StaleQuote { .. })
        ));
        // Alive, old and suspect: the source age.
        assert!(matches!(
            g.check("EURUSD", 400),
            Err(Refusal::StaleAtSource { .. })
        ));
    }

    #[test]
    fn next_change_is_when_silence_or_age_crosses_its_threshold() {
        let mut g = gate(FeedMode::Full);
        assert_eq!(g.next_change(0), None);
        g.tick("EURUSD", &full(1, "1.1", "1.2", 0), 100);
        // Silence passes 500 at 601; the source age passes 2000 at 2001.
        assert_eq!(g.next_change(100), Some(601));
        assert!(g.check("EURUSD", 600).is_ok());
        assert!(g.check("EURUSD", 601).is_err());
        assert_eq!(g.next_change(601), Some(2001));
        assert_eq!(g.next_change(2001), None);
    }

    #[test]
    fn sequences_from_anywhere_never_overflow() {
        let mut g = gate(FeedMode::Full);
        g.tick("X", &full(i64::MIN, "1", "2", 0), 0);
        assert_eq!(
            g.tick("X", &full(i64::MAX, "1", "2", 0), 0),
            TickVerdict::Applied { lost: u64::MAX - 1 }
        );
        assert_eq!(g.heartbeat("X", i64::MIN, 0), HeartbeatVerdict::Behind);
        g.set_clock_offset(Some(i64::MIN));
        let _ = g.check("X", i64::MAX);
        let _ = g.next_change(i64::MIN);
    }

    #[test]
    fn the_clock_offset_is_the_shortest_round_trips() {
        let mut c = ClockOffset::new(3);
        assert_eq!(c.offset(), None);
        // Sent at 1000, the feed read 7600, back at 1010: the feed is 6605 ms ahead.
        assert_eq!(c.sample(1000, 7600, 1010), Some(-6595));
        // A slow round trip does not displace it.
        assert_eq!(c.sample(2000, 8700, 2200), Some(-6595));
        assert_eq!(c.sample(3000, 9599, 3002), Some(-6598));
        // Answers from the future are ignored.
        assert_eq!(c.sample(4000, 0, 3999), Some(-6598));
        // The window moves on.
        c.sample(5000, 11_600, 5100);
        c.sample(6000, 12_600, 6100);
        c.sample(7000, 13_600, 7100);
        assert_eq!(c.offset(), Some(-6550));
    }

    #[test]
    fn a_refusal_reads_back_from_its_json() {
        for r in [
            Refusal::StaleQuote {
                silence_ms: Some(812),
            },
            Refusal::StaleQuote { silence_ms: None },
            Refusal::StaleAtSource { age_ms: Some(3012) },
            Refusal::Suspect {
                waiting_for: Awaited::Snapshot,
            },
        ] {
            let json = serde_json::to_value(&r).expect("json");
            assert_eq!(json["reason"], r.reason());
            assert_eq!(serde_json::from_value::<Refusal>(json).expect("back"), r);
        }
    }

    /// The simulator's reorder fault holds a datagram back behind the symbol's next one, and a
    /// reconnect's snapshot is followed by tick 1: the snapshot can arrive after the tick it
    /// precedes. Taken then, it rolls the quote back to an older price (full feed), or silently
    /// loses the change of the tick it overtook (delta feed), and clears suspicion either way.
    #[test]
    fn a_snapshot_overtaken_by_a_newer_tick_does_not_roll_the_quote_back() {
        // Full feed, at start: tick 1 arrives before the snapshot at 0 it follows.
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(1, "1.3", "1.4", 100), 100);
        g.snapshot("EURUSD", &snapshot(0, 50));
        let checked = g.check("EURUSD", 110).cloned();
        assert!(
            !matches!(&checked, Ok(q) if q.bid == Some(dec("1.08418"))),
            "an order is accepted on the snapshot's older price although tick 1 was newer: {checked:?}"
        );

        // Delta feed, at a reconnect: the old stream reached 57 and lost a delta (suspect); the
        // new stream's tick 1 (an ask) overtakes its snapshot at 0 and is dropped as late.
        let mut g = gate(FeedMode::Delta);
        g.snapshot("EURUSD", &snapshot(50, 0));
        g.tick(
            "EURUSD",
            &Tick {
                seq: 57,
                bid: Some(dec("1.2")),
                ask: None,
                source_ms: 0,
            },
            0,
        );
        assert!(g.check("EURUSD", 0).is_err(), "51 to 56 were lost");
        let new_stream_first = Tick {
            seq: 1,
            bid: None,
            ask: Some(dec("1.09")),
            source_ms: 100,
        };
        assert_eq!(g.tick("EURUSD", &new_stream_first, 100), TickVerdict::Late);
        // Until tick 2 or the next heartbeat shows the "gap", the price is wrong and trusted.
        g.snapshot("EURUSD", &snapshot(0, 90));
        let checked = g.check("EURUSD", 120).cloned();
        assert!(
            checked.is_err(),
            "the ask of tick 1 is lost, yet the rebuilt price is accepted: {checked:?}"
        );
    }

    /// The source check only refuses an age *over* the threshold; a source time ahead of our
    /// clock (a feed clock stepped forward that the min-round-trip offset has not followed yet,
    /// a broken stamp) gives a negative age, and heartbeats keep the resting price alive.
    #[test]
    fn a_quote_stamped_in_the_future_does_not_pass_the_source_check() {
        let mut g = gate(FeedMode::Full);
        // Stamped a minute ahead of our clock, offset subtracted.
        g.tick("EURUSD", &full(1, "1.1", "1.2", 60_000), 0);
        // No tick since, gap-free heartbeats only: the price rests.
        for at in (400..=3000).step_by(400) {
            assert_eq!(g.heartbeat("EURUSD", 2, at), HeartbeatVerdict::Alive);
        }
        // A price stamped at 0 would be refused from 2001; this one passes until 62_000.
        let checked = g.check("EURUSD", 3000).cloned();
        assert!(
            matches!(checked, Err(Refusal::StaleAtSource { .. })),
            "a price resting 3 s is accepted because its stamp is from the future: {checked:?}"
        );
    }

    /// A provider that resets its numbering (reconnect, start of the day) and whose snapshot is
    /// lost: every new tick is at or below the last seq and dropped, and the new stream's
    /// heartbeats (`next_seq` far behind) show "no forward gap", so they refresh liveness. The
    /// seed's reason for not refreshing on a gap is exactly this: heartbeats showing an old price
    /// fresh while its ticks are lost. Nothing reconnects a full feed, so it never heals either.
    #[test]
    fn a_heartbeat_behind_the_last_seq_does_not_keep_a_dropped_stream_alive() {
        let mut g = gate(FeedMode::Full);
        for seq in 1..=50 {
            g.tick("EURUSD", &full(seq, "1.1", "1.2", 1000), 1000);
        }
        // The provider numbers from 0 again; its snapshot was lost.
        for (seq, at) in [(1, 1100), (2, 1200), (3, 1300)] {
            assert_eq!(
                g.tick("EURUSD", &full(seq, "1.5", "1.6", at), at),
                TickVerdict::Late
            );
        }
        g.heartbeat("EURUSD", 4, 1350);
        // 600 ms since the last tick taken, over the 500 ms threshold.
        let checked = g.check("EURUSD", 1600).cloned();
        assert!(
            checked.is_err(),
            "the price of tick 50 is accepted while the provider's newer ticks are dropped: {checked:?}"
        );
    }

    /// The wire allows a tick with one price (a delta), and a full gate takes it as the whole
    /// quote: a feed that is not the mode `--quote-feed` says, or one tick short of a price, leaves
    /// an accepted quote with no ask (or bid), and the simulated clients then price a buy at a
    /// random price instead.
    #[test]
    fn a_full_tick_missing_a_price_is_not_an_accepted_quote() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(1, "1.1", "1.2", 0), 0);
        g.tick(
            "EURUSD",
            &Tick {
                seq: 2,
                bid: Some(dec("1.3")),
                ask: None,
                source_ms: 10,
            },
            10,
        );
        let checked = g.check("EURUSD", 10).cloned();
        assert!(
            !matches!(&checked, Ok(q) if q.ask.is_none() || q.bid.is_none()),
            "accepted with a price missing: {checked:?}"
        );
    }

    #[test]
    fn a_heartbeat_behind_the_last_seq_refreshes_nothing_and_asks_for_a_snapshot() {
        for mode in [FeedMode::Full, FeedMode::Delta] {
            let mut g = gate(mode);
            g.snapshot("EURUSD", &snapshot(0, 0));
            g.tick("EURUSD", &full(1, "1.1", "1.2", 0), 0);
            g.tick("EURUSD", &full(2, "1.1", "1.2", 0), 100);
            // Announces tick 2, which the gate holds already: overtaken by it, or a new
            // numbering.
            assert_eq!(
                g.heartbeat("EURUSD", 2, 200),
                HeartbeatVerdict::Behind,
                "{mode:?}"
            );
            let s = g.symbol("EURUSD").expect("state");
            assert_eq!(
                (s.alive_at, s.suspect, s.resync, s.last_seq),
                (Some(100), true, true, Some(2)),
                "{mode:?}: no liveness, suspect, a snapshot asked for, the seq kept"
            );
            assert!(matches!(
                g.check("EURUSD", 200),
                Err(Refusal::Suspect { .. })
            ));
            assert_eq!((g.stats().heartbeats_behind, g.stats().lost), (1, 0));
            match mode {
                // The next tick taken is the whole price, on a numbering the gate follows.
                FeedMode::Full => {
                    g.tick("EURUSD", &full(3, "1.3", "1.4", 300), 300);
                }
                // Only a snapshot rebuilds the price.
                FeedMode::Delta => {
                    g.tick("EURUSD", &full(3, "1.3", "1.4", 300), 300);
                    assert!(g.check("EURUSD", 300).is_err(), "a tick does not heal");
                    assert!(g.symbol("EURUSD").is_some_and(|s| s.resync));
                    g.snapshot("EURUSD", &snapshot(0, 300));
                }
            }
            let s = g.symbol("EURUSD").expect("state");
            assert_eq!((s.suspect, s.resync), (false, false), "{mode:?}");
            assert!(g.check("EURUSD", 300).is_ok(), "{mode:?}");
        }
    }

    #[test]
    fn a_snapshot_is_taken_unless_a_newer_stamp_was_seen() {
        let mut g = gate(FeedMode::Delta);
        assert_eq!(
            g.snapshot("EURUSD", &snapshot(0, 100)),
            SnapshotVerdict::Taken
        );
        g.tick(
            "EURUSD",
            &Tick {
                seq: 1,
                bid: Some(dec("1.2")),
                ask: None,
                source_ms: 200,
            },
            200,
        );
        // The same stamp as the newest is not ordered: taken.
        assert_eq!(
            g.snapshot("EURUSD", &snapshot(7, 200)),
            SnapshotVerdict::Taken
        );
        assert_eq!(g.symbol("EURUSD").and_then(|s| s.last_seq), Some(7));
        // A copy of the first snapshot, late: dropped, and the price stays the newest.
        let before = g.symbol("EURUSD").and_then(|s| s.quote.clone());
        assert_eq!(
            g.snapshot("EURUSD", &snapshot(0, 100)),
            SnapshotVerdict::Overtaken
        );
        let s = g.symbol("EURUSD").expect("state");
        assert_eq!((s.last_seq, s.quote.clone()), (Some(7), before));
        assert_eq!((s.suspect, s.resync), (true, true));
        assert_eq!((g.stats().snapshots, g.stats().snapshots_overtaken), (2, 1));
        // A newer one heals.
        assert_eq!(
            g.snapshot("EURUSD", &snapshot(0, 300)),
            SnapshotVerdict::Taken
        );
        let s = g.symbol("EURUSD").expect("state");
        assert_eq!((s.suspect, s.resync, s.last_seq), (false, false, Some(0)));
    }

    #[test]
    fn a_full_tick_without_both_prices_uses_up_its_seq_and_is_suspect_until_a_whole_one() {
        let mut g = gate(FeedMode::Full);
        g.tick("EURUSD", &full(1, "1.1", "1.2", 0), 0);
        let bid_only = Tick {
            seq: 3,
            bid: Some(dec("1.3")),
            ask: None,
            source_ms: 10,
        };
        assert_eq!(
            g.tick("EURUSD", &bid_only, 10),
            TickVerdict::Incomplete { lost: 1 },
            "2 never came"
        );
        let s = g.symbol("EURUSD").expect("state");
        assert_eq!(
            (s.last_seq, s.alive_at, s.suspect),
            (Some(3), Some(0), true),
            "its seq used up, no liveness"
        );
        assert_eq!(s.quote.as_ref().and_then(|q| q.bid), Some(dec("1.1")));
        assert_eq!(
            g.check("EURUSD", 10),
            Err(Refusal::Suspect {
                waiting_for: Awaited::Tick
            })
        );
        // Its copy is a duplicate; the next tick finds no gap.
        assert_eq!(g.tick("EURUSD", &bid_only, 11), TickVerdict::Duplicate);
        assert_eq!(
            g.tick("EURUSD", &full(4, "1.3", "1.4", 20), 20),
            TickVerdict::Applied { lost: 0 }
        );
        assert!(g.check("EURUSD", 20).is_ok());
        let stats = g.stats();
        assert_eq!((stats.lost, stats.incomplete, stats.ticks), (1, 1, 2));

        // The first tick of a symbol, incomplete: alive once a heartbeat says so, and still
        // no price to accept.
        g.tick(
            "GBPUSD",
            &Tick {
                ask: None,
                ..full(1, "1.2", "1.3", 0)
            },
            0,
        );
        assert_eq!(g.heartbeat("GBPUSD", 2, 5), HeartbeatVerdict::Alive);
        assert!(matches!(g.check("GBPUSD", 5), Err(Refusal::Suspect { .. })));

        // In a delta feed a tick with one price is the normal case.
        let mut g = gate(FeedMode::Delta);
        g.snapshot("EURUSD", &snapshot(0, 0));
        assert_eq!(
            g.tick(
                "EURUSD",
                &Tick {
                    ask: None,
                    ..full(1, "1.1", "1.2", 0)
                },
                0
            ),
            TickVerdict::Applied { lost: 0 }
        );
        assert!(g.check("EURUSD", 0).is_ok());
    }

    #[test]
    fn a_source_time_ahead_of_our_clock_is_tolerated_by_the_offsets_error_only() {
        let mut g = gate(FeedMode::Full);
        g.set_clock(Some(ClockEstimate {
            offset_ms: 0,
            error_ms: 20,
        }));
        let tolerance = 20 + READING_SLACK_MS;
        g.tick("EURUSD", &full(1, "1.1", "1.2", 1000 + tolerance), 1000);
        assert!(g.check("EURUSD", 1000).is_ok(), "within the offset's error");
        g.tick("EURUSD", &full(2, "1.1", "1.2", 1001 + tolerance), 1000);
        assert_eq!(
            g.check("EURUSD", 1000),
            Err(Refusal::StaleAtSource {
                age_ms: Some(-1 - tolerance)
            })
        );
        // Once our clock reaches it, the same quote is accepted: that is a change with no
        // datagram, and waiters must wake for it.
        assert_eq!(g.next_change(1000), Some(1001));
        assert!(g.check("EURUSD", 1001).is_ok());
        // And refused again once it is old.
        assert_eq!(g.next_change(1001), Some(1501), "silence first");
        g.heartbeat("EURUSD", 3, 1500);
        assert_eq!(g.next_change(1501), Some(2001), "silence again");
    }

    #[test]
    fn the_clock_offsets_error_is_half_the_round_trip_rounded_up() {
        let mut c = ClockOffset::new(2);
        assert_eq!(c.estimate(), None);
        c.sample(1000, 7600, 1011);
        assert_eq!(
            c.estimate(),
            Some(ClockEstimate {
                offset_ms: -6595,
                error_ms: 6
            })
        );
        c.sample(2000, 8600, 2000);
        assert_eq!(
            c.estimate(),
            Some(ClockEstimate {
                offset_ms: -6600,
                error_ms: 0
            })
        );
    }
}
