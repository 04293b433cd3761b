//! The built-in quote feed: a price provider on a UDP port, with the faults of a real one.
//!
//! It serves one receiver, the address of the last `subscribe`. Per symbol it sends ticks at
//! [`FeedConfig::ticks_per_second`] (a random walk of bid and ask in whole price units, so the
//! prices are exact decimals) and a heartbeat every [`FeedConfig::heartbeat`] carrying the next
//! sequence. A `subscribe` (the receiver's start, or its reconnect after a gap) stops the
//! symbol's stream for [`FeedConfig::snapshot_delay`], then sends a snapshot at sequence 0 and
//! numbers the ticks after it from 1 again: the sequence reset of a reconnect, which the gate's
//! snapshot rule exists for. A `ping` is answered with a `pong` at once, with the feed's clock,
//! which runs [`FeedConfig::clock_skew_ms`] off ours.
//!
//! The faults, on ticks, heartbeats and snapshots (never on pongs, so the offset measured is the
//! skew):
//!
//! - each datagram is lost with [`FeedConfig::loss`], sent twice with
//!   [`FeedConfig::duplicate`], or held back and sent after the symbol's next datagram with
//!   [`FeedConfig::reorder`];
//! - every [`FeedConfig::burst_every`], one symbol in turn loses everything for
//!   [`FeedConfig::burst_for`]: a burst long enough for silence to refuse orders, and the gap
//!   after it makes the symbol suspect;
//! - every [`FeedConfig::lag_every`], one symbol in turn falls behind for
//!   [`FeedConfig::lag_for`]: its ticks carry source times [`FeedConfig::lag`] old, which only
//!   the source-age check sees (the datagrams keep arriving).
//!
//! Bursts and lags are periodic rather than random so that a run of any length past the
//! period shows each refusal, and a test can count on them. A held datagram is dropped when the
//! symbol's stream restarts: it belongs to the connection that ended.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rust_decimal::Decimal;
use tokio::net::UdpSocket;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::gate::{FeedMode, Millis};
use super::wire::{Datagram, MAX_DATAGRAM_BYTES};
use super::LocalClock;
use crate::writeside::error::WriteSideError;
use projector_engine::rng::Rng;

/// A percentage with up to two decimals (`0.5`, `12.25`), held as basis points so that no
/// float is needed to roll against it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Percent(u16);

impl Percent {
    /// 0%.
    pub const ZERO: Self = Self(0);

    /// `bp` hundredths of a percent, at most 10000.
    pub fn from_basis_points(bp: u16) -> Option<Self> {
        (bp <= 10_000).then_some(Self(bp))
    }

    /// Hundredths of a percent.
    pub fn basis_points(self) -> u16 {
        self.0
    }
}

impl FromStr for Percent {
    type Err = String;

    /// `0` to `100`, with at most two decimals.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a percentage from 0 to 100 with at most two decimals");
        let (whole, fraction) = s.split_once('.').unwrap_or((s, ""));
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(whole) || (s.contains('.') && !digits(fraction)) || fraction.len() > 2 {
            return Err(bad());
        }
        let whole: u32 = whole.parse().map_err(|_| bad())?;
        let fraction: u32 = format!("{fraction:0<2}").parse().map_err(|_| bad())?;
        let bp = whole
            .checked_mul(100)
            .and_then(|w| w.checked_add(fraction))
            .filter(|&bp| bp <= 10_000)
            .ok_or_else(bad)?;
        Ok(Self(u16::try_from(bp).map_err(|_| bad())?))
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, fraction) = (self.0 / 100, self.0 % 100);
        match fraction {
            0 => write!(f, "{whole}%"),
            n if n % 10 == 0 => write!(f, "{whole}.{}%", n / 10),
            n => write!(f, "{whole}.{n:02}%"),
        }
    }
}

/// A symbol the feed quotes: its first bid in units of `10^-scale`, and its scale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedSymbol {
    /// The instrument.
    pub name: String,
    /// The first bid, in price units.
    pub bid_units: i64,
    /// Decimal places of the price.
    pub scale: u32,
}

impl FeedSymbol {
    /// The symbols the simulated clients trade ([`crate::writeside::SYMBOLS`]), at the prices
    /// they trade around.
    pub fn traded() -> Vec<Self> {
        crate::writeside::SYMBOLS
            .iter()
            .map(|(name, units, scale)| Self {
                name: (*name).to_owned(),
                bid_units: *units,
                scale: *scale,
            })
            .collect()
    }
}

/// How the simulated feed behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedConfig {
    /// The symbols quoted.
    pub symbols: Vec<FeedSymbol>,
    /// Full quotes or deltas.
    pub mode: FeedMode,
    /// Ticks per second, per symbol.
    pub ticks_per_second: u32,
    /// Between two heartbeats of a symbol.
    pub heartbeat: Duration,
    /// Datagrams lost.
    pub loss: Percent,
    /// Datagrams sent twice.
    pub duplicate: Percent,
    /// Datagrams held back and sent after the next one.
    pub reorder: Percent,
    /// Between two loss bursts (each on the next symbol in turn); zero: none.
    pub burst_every: Duration,
    /// How long a burst loses everything of its symbol.
    pub burst_for: Duration,
    /// Between two source lags (each on the next symbol in turn); zero: none.
    pub lag_every: Duration,
    /// How long a lag lasts.
    pub lag_for: Duration,
    /// How old a lagging symbol's source times are.
    pub lag: Duration,
    /// How long a reconnect takes before its snapshot is sent.
    pub snapshot_delay: Duration,
    /// The feed's clock minus ours, in ms.
    pub clock_skew_ms: i64,
    /// Seed of the feed's dice.
    pub seed: u64,
}

impl FeedConfig {
    /// The demo's feed over `symbols`: a delta feed of 10 ticks a second per symbol, a
    /// heartbeat every 250 ms, 0.5% loss, 1% duplicates, 0.5% reordering, a 1 s burst every 5 s,
    /// a 3 s source lag for 1 s every 7 s, reconnects answered in 300 ms, and a clock 2.5 s
    /// behind ours (past the source threshold, so that an offset not subtracted would refuse
    /// every order).
    pub fn new(symbols: Vec<FeedSymbol>) -> Self {
        Self {
            symbols,
            mode: FeedMode::Delta,
            ticks_per_second: 10,
            heartbeat: Duration::from_millis(250),
            loss: Percent(50),
            duplicate: Percent(100),
            reorder: Percent(50),
            burst_every: Duration::from_secs(5),
            burst_for: Duration::from_secs(1),
            lag_every: Duration::from_secs(7),
            lag_for: Duration::from_secs(1),
            lag: Duration::from_secs(3),
            snapshot_delay: Duration::from_millis(300),
            clock_skew_ms: -2500,
            seed: 1,
        }
    }

    /// The same feed with no fault at all (no loss, copies, reordering, bursts or lags).
    pub fn faultless(symbols: Vec<FeedSymbol>) -> Self {
        Self {
            loss: Percent::ZERO,
            duplicate: Percent::ZERO,
            reorder: Percent::ZERO,
            burst_every: Duration::ZERO,
            lag_every: Duration::ZERO,
            ..Self::new(symbols)
        }
    }

    /// Refuses values out of range, naming the setting.
    pub fn check(&self) -> Result<(), WriteSideError> {
        let bad = |m: String| Err(WriteSideError::InvalidConfig(m));
        if self.symbols.is_empty() {
            return bad("the quote feed needs at least one symbol".to_owned());
        }
        if !(1..=1000).contains(&self.ticks_per_second) {
            return bad(format!(
                "the quote rate must be 1 to 1000 ticks per second, got {}",
                self.ticks_per_second
            ));
        }
        if self.heartbeat < Duration::from_millis(10) {
            return bad("the quote heartbeat must be at least 10ms".to_owned());
        }
        for (name, every, length) in [
            ("burst", self.burst_every, self.burst_for),
            ("lag", self.lag_every, self.lag_for),
        ] {
            if !every.is_zero() && length >= every {
                return bad(format!(
                    "a quote {name} must be shorter than the time between two, got {}ms every {}ms",
                    length.as_millis(),
                    every.as_millis()
                ));
            }
        }
        Ok(())
    }
}

/// What the feed did, counted as it happens.
#[derive(Debug, Default)]
pub struct FeedStats {
    ticks: AtomicU64,
    heartbeats: AtomicU64,
    snapshots: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    subscribes: AtomicU64,
    pings: AtomicU64,
}

/// [`FeedStats`] as of one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedReport {
    /// Ticks numbered and sent (lost ones included: the network lost them, not the feed).
    pub ticks: u64,
    /// Heartbeats sent.
    pub heartbeats: u64,
    /// Snapshots sent.
    pub snapshots: u64,
    /// Datagrams lost on purpose (random loss and bursts).
    pub lost: u64,
    /// Datagrams sent twice.
    pub duplicated: u64,
    /// Datagrams held back behind the next one.
    pub reordered: u64,
    /// `subscribe` datagrams received.
    pub subscribes: u64,
    /// `ping` datagrams answered.
    pub pings: u64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl FeedStats {
    /// The counts as of now.
    pub fn report(&self) -> FeedReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FeedReport {
            ticks: get(&self.ticks),
            heartbeats: get(&self.heartbeats),
            snapshots: get(&self.snapshots),
            lost: get(&self.lost),
            duplicated: get(&self.duplicated),
            reordered: get(&self.reordered),
            subscribes: get(&self.subscribes),
            pings: get(&self.pings),
        }
    }
}

/// Which symbol a periodic episode hits at `elapsed`: episode k (from 1) starts at
/// `k * every`, lasts `length`, and hits symbol `(k - 1 + shift) % symbols`.
fn episode(
    elapsed: Duration,
    every: Duration,
    length: Duration,
    symbols: usize,
    shift: usize,
) -> Option<usize> {
    let every = every.as_millis();
    if every == 0 || symbols == 0 {
        return None;
    }
    let at = elapsed.as_millis();
    let k = at / every;
    if k == 0 || at - k * every >= length.as_millis() {
        return None;
    }
    usize::try_from((k - 1) % symbols as u128)
        .ok()
        .map(|i| (i + shift) % symbols)
}

/// One symbol's stream.
#[derive(Debug)]
struct Stream {
    name: String,
    scale: u32,
    bid: i64,
    ask: i64,
    /// The last tick's sequence (the snapshot's when none followed).
    seq: i64,
    /// Subscribed at least once: the feed sends nothing before.
    subscribed: bool,
    /// A reconnect in progress: the snapshot is due then, and the stream is silent until.
    resync_at: Option<Duration>,
    /// A datagram held back to be sent after the next one.
    held: Option<Vec<u8>>,
}

/// The feed's logic, apart from its socket: what to send, and when.
struct Sim {
    config: FeedConfig,
    rng: Rng,
    streams: Vec<Stream>,
    subscriber: Option<SocketAddr>,
    stats: Arc<FeedStats>,
}

/// What the feed sends now.
type Out = Vec<(Vec<u8>, SocketAddr)>;

impl Sim {
    fn new(config: FeedConfig, stats: Arc<FeedStats>) -> Self {
        let streams = config
            .symbols
            .iter()
            .map(|s| Stream {
                name: s.name.clone(),
                scale: s.scale,
                bid: s.bid_units.max(1),
                ask: s.bid_units.max(1) + 2,
                seq: 0,
                subscribed: false,
                resync_at: None,
                held: None,
            })
            .collect();
        Self {
            rng: Rng::new(config.seed),
            config,
            streams,
            subscriber: None,
            stats,
        }
    }

    /// A request from a receiver.
    fn on_request(
        &mut self,
        bytes: &[u8],
        from: SocketAddr,
        elapsed: Duration,
        feed_ms: Millis,
    ) -> Out {
        match Datagram::decode(bytes) {
            Ok(Datagram::Subscribe { symbols }) => {
                bump(&self.stats.subscribes);
                self.subscriber = Some(from);
                let due = elapsed + self.config.snapshot_delay;
                for s in &mut self.streams {
                    if symbols.is_empty() || symbols.contains(&s.name) {
                        s.subscribed = true;
                        s.held = None;
                        s.resync_at.get_or_insert(due);
                    }
                }
                Vec::new()
            }
            Ok(Datagram::Ping { id }) => {
                bump(&self.stats.pings);
                vec![(Datagram::Pong { id, feed_ms }.encode(), from)]
            }
            Ok(other) => {
                tracing::debug!(?other, %from, "quote feed: not a request, ignored");
                Vec::new()
            }
            Err(e) => {
                tracing::debug!(error = %e, %from, "quote feed: a request that does not parse");
                Vec::new()
            }
        }
    }

    /// One tick time: a tick of every live symbol, or its snapshot once its reconnect is due.
    fn on_tick(&mut self, elapsed: Duration, feed_ms: Millis) -> Out {
        let mut out = Vec::new();
        for i in 0..self.streams.len() {
            let source_ms = self.source_ms(i, elapsed, feed_ms);
            let (bid_moved, ask_moved) = self.walk(i);
            let s = &mut self.streams[i];
            if !s.subscribed {
                continue;
            }
            if let Some(due) = s.resync_at {
                if elapsed < due {
                    continue;
                }
                s.resync_at = None;
                s.seq = 0;
                let snapshot = Datagram::Snapshot {
                    symbol: s.name.clone(),
                    seq: 0,
                    bid: Decimal::new(s.bid, s.scale),
                    ask: Decimal::new(s.ask, s.scale),
                    source_ms,
                };
                bump(&self.stats.snapshots);
                self.emit(i, &snapshot, elapsed, &mut out);
                continue;
            }
            s.seq += 1;
            let (bid, ask) = (Decimal::new(s.bid, s.scale), Decimal::new(s.ask, s.scale));
            let full = self.config.mode == FeedMode::Full;
            let tick = Datagram::Tick {
                symbol: s.name.clone(),
                seq: s.seq,
                // A delta carries what moved (the bid when nothing did: a tick is never empty).
                bid: (full || bid_moved || !ask_moved).then_some(bid),
                ask: (full || ask_moved).then_some(ask),
                source_ms,
            };
            bump(&self.stats.ticks);
            self.emit(i, &tick, elapsed, &mut out);
        }
        out
    }

    /// One heartbeat time: every live symbol says which tick comes next.
    fn on_heartbeat(&mut self, elapsed: Duration) -> Out {
        let mut out = Vec::new();
        for i in 0..self.streams.len() {
            let s = &self.streams[i];
            if !s.subscribed || s.resync_at.is_some() {
                continue;
            }
            let heartbeat = Datagram::Heartbeat {
                symbol: s.name.clone(),
                next_seq: s.seq + 1,
            };
            bump(&self.stats.heartbeats);
            self.emit(i, &heartbeat, elapsed, &mut out);
        }
        out
    }

    fn source_ms(&self, i: usize, elapsed: Duration, feed_ms: Millis) -> Millis {
        let c = &self.config;
        match episode(elapsed, c.lag_every, c.lag_for, self.streams.len(), 1) {
            Some(lagging) if lagging == i => {
                feed_ms.saturating_sub(i64::try_from(c.lag.as_millis()).unwrap_or(i64::MAX))
            }
            _ => feed_ms,
        }
    }

    /// Moves one symbol's bid, ask or both by 1 to 3 units, keeping both positive and the ask
    /// above the bid; says which moved.
    fn walk(&mut self, i: usize) -> (bool, bool) {
        let step = 1 + self.rng.int(3);
        let step = if self.rng.chance(50) { step } else { -step };
        let which = self.rng.below(3);
        let s = &mut self.streams[i];
        let (bid, ask) = (s.bid, s.ask);
        if which != 1 {
            s.bid = (s.bid + step).max(1);
        }
        if which != 0 {
            s.ask += step;
        }
        if s.ask <= s.bid {
            s.ask = s.bid + 1;
        }
        (s.bid != bid, s.ask != ask)
    }

    /// Sends `datagram` of symbol `i` through the faults.
    fn emit(&mut self, i: usize, datagram: &Datagram, elapsed: Duration, out: &mut Out) {
        let Some(to) = self.subscriber else { return };
        let c = &self.config;
        let in_burst =
            episode(elapsed, c.burst_every, c.burst_for, self.streams.len(), 0) == Some(i);
        let (loss, duplicate, reorder) = (c.loss, c.duplicate, c.reorder);
        if in_burst || self.rng.chance_bp(loss.basis_points()) {
            bump(&self.stats.lost);
            return;
        }
        let bytes = datagram.encode();
        if let Some(held) = self.streams[i].held.take() {
            out.push((bytes, to));
            out.push((held, to));
        } else if self.rng.chance_bp(reorder.basis_points()) {
            bump(&self.stats.reordered);
            self.streams[i].held = Some(bytes);
        } else if self.rng.chance_bp(duplicate.basis_points()) {
            bump(&self.stats.duplicated);
            out.push((bytes.clone(), to));
            out.push((bytes, to));
        } else {
            out.push((bytes, to));
        }
    }
}

/// The simulated feed on its socket.
#[derive(Debug)]
pub struct Feed {
    socket: UdpSocket,
    config: FeedConfig,
    stats: Arc<FeedStats>,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("subscriber", &self.subscriber)
            .finish_non_exhaustive()
    }
}

impl Feed {
    /// Binds the feed's socket (`127.0.0.1:0` for any free loopback port).
    pub async fn bind(addr: SocketAddr, config: FeedConfig) -> Result<Self, WriteSideError> {
        config.check()?;
        let socket = UdpSocket::bind(addr)
            .await
            .map_err(|source| WriteSideError::Io {
                doing: "binding the quote feed's socket",
                source,
            })?;
        Ok(Self {
            socket,
            config,
            stats: Arc::new(FeedStats::default()),
        })
    }

    /// The address receivers subscribe to.
    pub fn local_addr(&self) -> SocketAddr {
        // A bound socket has an address.
        self.socket
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Its counters, live.
    pub fn stats(&self) -> Arc<FeedStats> {
        Arc::clone(&self.stats)
    }

    /// Serves until `stop`.
    pub async fn run(self, stop: CancellationToken) -> Result<(), WriteSideError> {
        let Self {
            socket,
            config,
            stats,
        } = self;
        let clock = LocalClock::start();
        let start = tokio::time::Instant::now();
        let skew = config.clock_skew_ms;
        let feed_ms = move || clock.now().saturating_add(skew);
        let mut ticks =
            tokio::time::interval(Duration::from_secs(1) / config.ticks_per_second.max(1));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut heartbeats = tokio::time::interval(config.heartbeat);
        heartbeats.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut sim = Sim::new(config, stats);
        let mut buf = vec![0u8; MAX_DATAGRAM_BYTES + 1];
        loop {
            let out = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                received = socket.recv_from(&mut buf) => match received {
                    Ok((n, from)) => sim.on_request(&buf[..n], from, start.elapsed(), feed_ms()),
                    Err(e) => {
                        // A receiver that went away can make the next read fail (ICMP); the
                        // feed serves on.
                        tracing::debug!(error = %e, "quote feed: receive failed");
                        Vec::new()
                    }
                },
                _ = ticks.tick() => sim.on_tick(start.elapsed(), feed_ms()),
                _ = heartbeats.tick() => sim.on_heartbeat(start.elapsed()),
            };
            for (bytes, to) in out {
                if let Err(e) = socket.send_to(&bytes, to).await {
                    // At most once: a datagram that cannot be sent is lost like any other.
                    tracing::debug!(error = %e, %to, "quote feed: send failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbols(n: usize) -> Vec<FeedSymbol> {
        (0..n)
            .map(|i| FeedSymbol {
                name: format!("S{i}"),
                bid_units: 100_000,
                scale: 5,
            })
            .collect()
    }

    const RECEIVER: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9);

    fn decoded(out: &Out) -> Vec<Datagram> {
        out.iter()
            .map(|(b, to)| {
                assert_eq!(*to, RECEIVER);
                Datagram::decode(b).expect("valid")
            })
            .collect()
    }

    fn subscribe(sim: &mut Sim, at: Duration) {
        let out = sim.on_request(
            &Datagram::Subscribe { symbols: vec![] }.encode(),
            RECEIVER,
            at,
            0,
        );
        assert!(out.is_empty());
    }

    #[test]
    fn percentages_take_two_decimals_at_most() {
        for (text, bp) in [
            ("0", 0),
            ("0.5", 50),
            ("1", 100),
            ("12.25", 1225),
            ("100", 10_000),
            ("7.0", 700),
        ] {
            assert_eq!(text.parse::<Percent>(), Ok(Percent(bp)), "{text}");
        }
        for bad in ["", ".5", "5.", "-1", "100.01", "0.125", "1e2", "x"] {
            assert!(bad.parse::<Percent>().is_err(), "{bad:?}");
        }
        assert_eq!(Percent(50).to_string(), "0.5%");
        assert_eq!(Percent(1225).to_string(), "12.25%");
        assert_eq!(Percent(300).to_string(), "3%");
        assert_eq!(Percent(5).to_string(), "0.05%");
    }

    #[test]
    fn episodes_come_round_each_symbol_in_turn() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let every = s(5);
        let length = s(1);
        assert_eq!(
            episode(ms(4999), every, length, 3, 0),
            None,
            "none before the first period"
        );
        assert_eq!(episode(s(5), every, length, 3, 0), Some(0));
        assert_eq!(episode(ms(5999), every, length, 3, 0), Some(0));
        assert_eq!(episode(s(6), every, length, 3, 0), None);
        assert_eq!(episode(s(10), every, length, 3, 0), Some(1));
        assert_eq!(episode(s(20), every, length, 3, 0), Some(0), "round again");
        assert_eq!(episode(s(5), every, length, 3, 1), Some(1), "shifted");
        assert_eq!(episode(s(5), Duration::ZERO, length, 3, 0), None, "off");
    }

    #[test]
    fn a_subscribe_starts_each_stream_with_a_snapshot_at_sequence_zero() {
        let mut config = FeedConfig::faultless(symbols(2));
        config.snapshot_delay = Duration::from_millis(300);
        let mut sim = Sim::new(config, Arc::default());
        assert!(
            sim.on_tick(Duration::ZERO, 0).is_empty(),
            "nobody subscribed"
        );
        subscribe(&mut sim, Duration::ZERO);
        assert!(
            sim.on_tick(Duration::from_millis(100), 0).is_empty(),
            "reconnecting"
        );
        assert!(sim.on_heartbeat(Duration::from_millis(100)).is_empty());
        let out = decoded(&sim.on_tick(Duration::from_millis(300), 7));
        assert!(
            matches!(
                &out[..],
                [
                    Datagram::Snapshot {
                        seq: 0,
                        source_ms: 7,
                        ..
                    },
                    Datagram::Snapshot { seq: 0, .. }
                ]
            ),
            "{out:?}"
        );
        let out = decoded(&sim.on_tick(Duration::from_millis(400), 8));
        assert!(
            matches!(
                &out[..],
                [Datagram::Tick { seq: 1, .. }, Datagram::Tick { seq: 1, .. }]
            ),
            "{out:?}"
        );
        let out = decoded(&sim.on_heartbeat(Duration::from_millis(450)));
        assert!(
            matches!(&out[0], Datagram::Heartbeat { next_seq: 2, .. }),
            "{out:?}"
        );

        // A reconnect of one symbol numbers its stream from 0 again; the other goes on.
        for t in 5..9 {
            sim.on_tick(Duration::from_millis(t * 100), 0);
        }
        let again = Datagram::Subscribe {
            symbols: vec!["S0".to_owned()],
        };
        sim.on_request(&again.encode(), RECEIVER, Duration::from_millis(900), 0);
        let out = decoded(&sim.on_tick(Duration::from_millis(1000), 0));
        assert!(
            matches!(&out[..], [Datagram::Tick { symbol, seq: 6, .. }] if symbol == "S1"),
            "{out:?}"
        );
        let out = decoded(&sim.on_tick(Duration::from_millis(1200), 0));
        assert!(
            matches!(&out[0], Datagram::Snapshot { symbol, seq: 0, .. } if symbol == "S0"),
            "{out:?}"
        );
        let report = sim.stats.report();
        assert_eq!((report.subscribes, report.snapshots), (2, 3));
    }

    #[test]
    fn a_delta_tick_carries_what_moved_and_a_full_tick_everything() {
        for mode in [FeedMode::Delta, FeedMode::Full] {
            let mut config = FeedConfig::faultless(symbols(1));
            config.mode = mode;
            config.snapshot_delay = Duration::ZERO;
            let mut sim = Sim::new(config, Arc::default());
            subscribe(&mut sim, Duration::ZERO);
            sim.on_tick(Duration::ZERO, 0);
            let (mut partial, mut prices) = (0, None);
            for t in 1..200 {
                for d in decoded(&sim.on_tick(Duration::from_millis(t), 0)) {
                    let Datagram::Tick { bid, ask, .. } = d else {
                        panic!("{d:?}")
                    };
                    assert!(bid.is_some() || ask.is_some());
                    partial += usize::from(bid.is_none() || ask.is_none());
                    if let (Some(b), Some(a)) = (bid, ask) {
                        assert!(a > b, "the ask stays above the bid");
                        prices = Some((b, a));
                    }
                }
            }
            match mode {
                FeedMode::Delta => assert!(partial > 50, "{partial}"),
                FeedMode::Full => assert_eq!(partial, 0),
            }
            assert!(prices.is_some());
        }
    }

    #[test]
    fn faults_lose_copy_and_reorder_datagrams() {
        let mut config = FeedConfig::faultless(symbols(1));
        config.snapshot_delay = Duration::ZERO;
        config.loss = Percent(1000);
        config.duplicate = Percent(1000);
        config.reorder = Percent(1000);
        let mut sim = Sim::new(config, Arc::default());
        subscribe(&mut sim, Duration::ZERO);
        sim.on_tick(Duration::ZERO, 0);
        let mut seqs = Vec::new();
        for t in 1..=2000 {
            for d in decoded(&sim.on_tick(Duration::from_millis(t), 0)) {
                let Datagram::Tick { seq, .. } = d else {
                    panic!("{d:?}")
                };
                seqs.push(seq);
            }
        }
        let r = sim.stats.report();
        assert_eq!(r.ticks, 2000);
        assert!((100..300).contains(&r.lost), "{r:?}");
        assert!(r.duplicated > 50 && r.reordered > 50, "{r:?}");
        let behind = seqs.windows(2).filter(|w| w[1] < w[0]).count();
        let copies = seqs.windows(2).filter(|w| w[1] == w[0]).count();
        assert!(
            behind > 50 && copies > 50,
            "{behind} behind, {copies} copies"
        );
    }

    #[test]
    fn a_burst_loses_one_symbol_and_a_lag_ages_another() {
        let mut config = FeedConfig::faultless(symbols(2));
        config.snapshot_delay = Duration::ZERO;
        config.burst_every = Duration::from_secs(5);
        config.lag_every = Duration::from_secs(5);
        config.lag = Duration::from_secs(3);
        let mut sim = Sim::new(config, Arc::default());
        subscribe(&mut sim, Duration::ZERO);
        sim.on_tick(Duration::ZERO, 0);
        let out = decoded(&sim.on_tick(Duration::from_millis(5500), 10_000));
        // S0 is in its burst: lost; S1 lags.
        assert!(
            matches!(&out[..], [Datagram::Tick { symbol, source_ms: 7000, .. }] if symbol == "S1"),
            "{out:?}"
        );
        assert!(sim.on_heartbeat(Duration::from_millis(5600)).len() == 1);
        let out = decoded(&sim.on_tick(Duration::from_millis(6000), 10_000));
        assert_eq!(out.len(), 2, "both back after a second: {out:?}");
        assert!(out.iter().all(|d| matches!(
            d,
            Datagram::Tick {
                source_ms: 10_000,
                ..
            }
        )));
    }

    #[test]
    fn a_ping_is_answered_with_the_feeds_clock_and_unknown_requests_are_ignored() {
        let mut sim = Sim::new(FeedConfig::new(symbols(1)), Arc::default());
        let out = sim.on_request(
            &Datagram::Ping { id: 4 }.encode(),
            RECEIVER,
            Duration::ZERO,
            1234,
        );
        assert_eq!(
            decoded(&out),
            [Datagram::Pong {
                id: 4,
                feed_ms: 1234
            }]
        );
        assert!(sim
            .on_request(b"nonsense", RECEIVER, Duration::ZERO, 0)
            .is_empty());
        let tick = Datagram::Heartbeat {
            symbol: "S0".to_owned(),
            next_seq: 1,
        };
        assert!(sim
            .on_request(&tick.encode(), RECEIVER, Duration::ZERO, 0)
            .is_empty());
        assert_eq!(sim.subscriber, None);
    }

    #[test]
    fn configurations_out_of_range_are_refused_by_name() {
        assert!(FeedConfig::new(symbols(1)).check().is_ok());
        type Change = fn(&mut FeedConfig);
        let cases: [(Change, &str); 4] = [
            (|c| c.symbols.clear(), "symbol"),
            (|c| c.ticks_per_second = 0, "rate"),
            (|c| c.heartbeat = Duration::from_millis(1), "heartbeat"),
            (|c| c.burst_for = c.burst_every, "burst"),
        ];
        for (change, needle) in cases {
            let mut c = FeedConfig::new(symbols(1));
            change(&mut c);
            let e = c.check().expect_err(needle).to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
