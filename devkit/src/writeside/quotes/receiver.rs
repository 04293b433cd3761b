//! The gate's UDP side: one socket towards one feed.
//!
//! - At start, and for any symbol that has no sequence yet (the first snapshot was lost), it
//!   sends `subscribe`, at most once per [`ReceiverConfig::resync_every`] per symbol.
//! - A suspect symbol of a *delta* feed is reconnected the same way: only a snapshot heals it,
//!   and the feed sends one when asked. A full feed heals at its next tick, so it asks only
//!   when the gate wants its numbering reset ([`super::SymbolState::resync`]: a heartbeat
//!   behind the stream, an overtaken snapshot), in either mode.
//! - Every [`ReceiverConfig::ping_every`] it pings the feed; each pong is a sample of the clock
//!   offset ([`super::ClockOffset`]), which the gate subtracts from source ages.
//! - Every datagram from the feed's address goes to the gate at the moment it arrives;
//!   datagrams from any other address, or that do not parse, are counted and dropped (anyone on
//!   the host can send to a UDP port), and so is a full feed's tick without both prices.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::gate::{ClockOffset, FeedMode, Gate, Limits, Millis, Snapshot, Tick, TickVerdict};
use super::metrics::QuoteMetrics;
use super::wire::{Datagram, MAX_DATAGRAM_BYTES, MAX_SUBSCRIBE_SYMBOLS};
use super::QuoteGate;
use crate::writeside::error::WriteSideError;

/// How often the receiver looks for pings and reconnects to send.
const HOUSEKEEPING: Duration = Duration::from_millis(50);
/// Pings waiting for their pong; older ones are forgotten (their pongs were lost).
const PINGS_IN_FLIGHT: usize = 16;
/// Clock offset samples kept (one per ping).
const OFFSET_SAMPLES: usize = 8;

/// How the gate reads its feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// The feed's mode: the gate's rule for a gap depends on it.
    pub mode: FeedMode,
    /// The checks' thresholds.
    pub limits: Limits,
    /// The symbols subscribed to.
    pub symbols: Vec<String>,
    /// Least time between two subscribes of a symbol.
    pub resync_every: Duration,
    /// Between two pings.
    pub ping_every: Duration,
}

impl ReceiverConfig {
    /// Subscribes `symbols` of a `mode` feed; reconnects at most every 500 ms, pings every
    /// second.
    pub fn new(mode: FeedMode, limits: Limits, symbols: Vec<String>) -> Self {
        Self {
            mode,
            limits,
            symbols,
            resync_every: Duration::from_millis(500),
            ping_every: Duration::from_secs(1),
        }
    }

    /// Refuses values out of range, naming the setting.
    pub fn check(&self) -> Result<(), WriteSideError> {
        let bad = |m: String| Err(WriteSideError::InvalidConfig(m));
        if self.symbols.is_empty() {
            return bad("the quote gate needs at least one symbol".to_owned());
        }
        if self.limits.stale_after_ms < 1 || self.limits.source_stale_after_ms < 1 {
            return bad("the quote thresholds must be at least 1ms".to_owned());
        }
        if self.ping_every.is_zero() || self.resync_every.is_zero() {
            return bad("the ping and reconnect intervals must not be zero".to_owned());
        }
        Ok(())
    }
}

/// The receiver's state apart from its socket: what arrives goes to the gate, what is due goes
/// out.
pub(crate) struct Handler {
    gate: QuoteGate,
    config: ReceiverConfig,
    offset: ClockOffset,
    /// (ping id, sent at).
    pings: VecDeque<(u64, Millis)>,
    next_ping: u64,
    last_ping_at: Option<Millis>,
    /// When each symbol was last subscribed.
    subscribed_at: HashMap<String, Millis>,
    metrics: QuoteMetrics,
}

impl Handler {
    pub(crate) fn new(config: ReceiverConfig) -> Self {
        Self {
            gate: QuoteGate::new(Gate::new(config.mode, config.limits)),
            offset: ClockOffset::new(OFFSET_SAMPLES),
            pings: VecDeque::new(),
            next_ping: 0,
            last_ping_at: None,
            subscribed_at: HashMap::new(),
            metrics: QuoteMetrics::new(),
            config,
        }
    }

    /// One datagram from the feed.
    pub(crate) fn on_datagram(&mut self, bytes: &[u8]) {
        let datagram = match Datagram::decode(bytes) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "quote gate: a datagram that does not parse");
                self.invalid();
                return;
            }
        };
        match datagram {
            Datagram::Tick {
                symbol,
                seq,
                bid,
                ask,
                source_ms,
            } => {
                let tick = Tick {
                    seq,
                    bid,
                    ask,
                    source_ms,
                };
                let verdict = self.gate.update(|g, now| g.tick(&symbol, &tick, now));
                self.metrics.tick(&symbol, verdict);
                if matches!(verdict, TickVerdict::Incomplete { .. }) {
                    self.invalid();
                }
            }
            Datagram::Heartbeat { symbol, next_seq } => {
                let verdict = self
                    .gate
                    .update(|g, now| g.heartbeat(&symbol, next_seq, now));
                self.metrics.heartbeat(&symbol, verdict);
            }
            Datagram::Snapshot {
                symbol,
                seq,
                bid,
                ask,
                source_ms,
            } => {
                let snapshot = Snapshot {
                    seq,
                    bid,
                    ask,
                    source_ms,
                };
                self.gate.update(|g, _| g.snapshot(&symbol, &snapshot));
            }
            Datagram::Pong { id, feed_ms } => {
                // Only an answer to a ping of ours, once: a forged or repeated pong would
                // otherwise move the offset.
                let Some(i) = self.pings.iter().position(|(p, _)| *p == id) else {
                    self.invalid();
                    return;
                };
                let sent = self.pings.remove(i).map_or(0, |(_, at)| at);
                let received = self.gate.now();
                self.offset.sample(sent, feed_ms, received);
                let estimate = self.offset.estimate();
                self.gate.update(|g, _| g.set_clock(estimate));
                if let Some(estimate) = estimate {
                    self.metrics.clock_offset(estimate.offset_ms);
                }
            }
            Datagram::Subscribe { .. } | Datagram::Ping { .. } => {
                // A request, sent the wrong way.
                self.invalid();
                return;
            }
        }
        let suspect = self.gate.read(|g, _| g.suspect_symbols());
        self.metrics.suspect_symbols(suspect);
    }

    pub(crate) fn invalid(&self) {
        self.gate.count_invalid();
        self.metrics.invalid();
    }

    /// The pings and subscribes due at `now`.
    pub(crate) fn due(&mut self, now: Millis) -> Vec<Datagram> {
        let mut out = Vec::new();
        let ping_every = millis(self.config.ping_every);
        if self
            .last_ping_at
            .is_none_or(|at| now.saturating_sub(at) >= ping_every)
        {
            let id = self.next_ping;
            self.next_ping = self.next_ping.wrapping_add(1);
            if self.pings.len() == PINGS_IN_FLIGHT {
                self.pings.pop_front();
            }
            self.pings.push_back((id, now));
            self.last_ping_at = Some(now);
            out.push(Datagram::Ping { id });
        }
        let resync_every = millis(self.config.resync_every);
        let mode = self.config.mode;
        let wanted: Vec<String> = self.gate.read(|g, _| {
            self.config
                .symbols
                .iter()
                .filter(|s| match g.symbol(s) {
                    None => true,
                    Some(state) => {
                        state.last_seq.is_none()
                            || state.resync
                            || (mode == FeedMode::Delta && state.suspect)
                    }
                })
                .filter(|s| {
                    self.subscribed_at
                        .get(*s)
                        .is_none_or(|at| now.saturating_sub(*at) >= resync_every)
                })
                .cloned()
                .collect()
        });
        let again = wanted
            .iter()
            .filter(|s| self.subscribed_at.contains_key(*s))
            .count() as u64;
        if again > 0 {
            self.gate.count_reconnects(again);
            self.metrics.reconnects(again);
        }
        for s in &wanted {
            self.subscribed_at.insert(s.clone(), now);
        }
        for chunk in wanted.chunks(MAX_SUBSCRIBE_SYMBOLS) {
            out.push(Datagram::Subscribe {
                symbols: chunk.to_vec(),
            });
        }
        out
    }
}

fn millis(d: Duration) -> Millis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The gate's socket and its handler.
pub struct Receiver {
    socket: UdpSocket,
    feed: SocketAddr,
    handler: Handler,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("feed", &self.feed)
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Receiver {
    /// Binds a socket on the side of `feed` (loopback for a loopback feed, any address
    /// otherwise) for a receiver of `config`.
    pub async fn bind(feed: SocketAddr, config: ReceiverConfig) -> Result<Self, WriteSideError> {
        config.check()?;
        let local: IpAddr = match feed.ip() {
            IpAddr::V4(ip) if ip.is_loopback() => Ipv4Addr::LOCALHOST.into(),
            IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            IpAddr::V6(ip) if ip.is_loopback() => Ipv6Addr::LOCALHOST.into(),
            IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let socket = UdpSocket::bind(SocketAddr::new(local, 0))
            .await
            .map_err(|source| WriteSideError::Io {
                doing: "binding the quote gate's socket",
                source,
            })?;
        Ok(Self {
            socket,
            feed,
            handler: Handler::new(config),
        })
    }

    /// The gate this receiver feeds.
    pub fn gate(&self) -> QuoteGate {
        self.handler.gate.clone()
    }

    /// The receiver's own address (where the feed sends).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.socket.local_addr().ok()
    }

    /// Reads the feed until `stop`.
    pub async fn run(self, stop: CancellationToken) -> Result<(), WriteSideError> {
        let Self {
            socket,
            feed,
            mut handler,
        } = self;
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        housekeeping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut buf = vec![0u8; MAX_DATAGRAM_BYTES + 1];
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = housekeeping.tick() => {
                    let now = handler.gate.now();
                    for datagram in handler.due(now) {
                        if let Err(e) = socket.send_to(&datagram.encode(), feed).await {
                            // Sent again when still due: a subscribe at the next reconnect
                            // time, a ping at the next ping.
                            tracing::debug!(error = %e, %feed, "quote gate: send failed");
                        }
                    }
                }
                received = socket.recv_from(&mut buf) => match received {
                    Ok((n, from)) if from == feed => handler.on_datagram(&buf[..n]),
                    Ok((_, from)) => {
                        tracing::debug!(%from, "quote gate: a datagram from another address than the feed's");
                        handler.invalid();
                    }
                    Err(e) => {
                        // The feed not listening yet comes back as an error on the next read
                        // (ICMP port unreachable); the next subscribe tries again.
                        tracing::debug!(error = %e, %feed, "quote gate: receive failed");
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::MetricKind;
    use rust_decimal::Decimal;

    use super::*;
    use crate::writeside::quotes::Refusal;

    fn config(mode: FeedMode) -> ReceiverConfig {
        ReceiverConfig {
            resync_every: Duration::from_millis(500),
            ping_every: Duration::from_millis(1000),
            ..ReceiverConfig::new(
                mode,
                Limits {
                    stale_after_ms: 60_000,
                    source_stale_after_ms: i64::MAX,
                },
                vec!["EURUSD".to_owned(), "GBPUSD".to_owned()],
            )
        }
    }

    fn tick(seq: i64) -> Vec<u8> {
        Datagram::Tick {
            symbol: "EURUSD".to_owned(),
            seq,
            bid: Some(Decimal::new(108_420, 5)),
            ask: Some(Decimal::new(108_424, 5)),
            source_ms: 0,
        }
        .encode()
    }

    /// The counters and gauges recorded, as (name, labels, value).
    fn recorded(recorder: &DebuggingRecorder) -> Vec<(String, Vec<String>, i64)> {
        recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                let value = match (key.kind(), value) {
                    (MetricKind::Counter, DebugValue::Counter(v)) => i64::try_from(v).unwrap_or(-1),
                    (MetricKind::Gauge, DebugValue::Gauge(v)) => v.into_inner() as i64,
                    _ => -1,
                };
                (key.key().name().to_owned(), labels, value)
            })
            .collect()
    }

    fn value(recorded: &[(String, Vec<String>, i64)], name: &str, labels: &[&str]) -> i64 {
        recorded
            .iter()
            .filter(|(n, l, _)| n == name && labels.iter().all(|x| l.iter().any(|y| y == x)))
            .map(|(_, _, v)| *v)
            .sum()
    }

    #[test]
    fn datagrams_reach_the_gate_and_the_metrics() {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            let mut h = Handler::new(config(FeedMode::Full));
            for seq in [1, 2, 5, 5, 3] {
                h.on_datagram(&tick(seq));
            }
            h.on_datagram(
                &Datagram::Heartbeat {
                    symbol: "EURUSD".to_owned(),
                    next_seq: 9,
                }
                .encode(),
            );
            h.on_datagram(b"{\"type\":\"tick\"");
            h.on_datagram(&Datagram::Ping { id: 1 }.encode());
            h.on_datagram(&Datagram::Pong { id: 99, feed_ms: 0 }.encode());

            let stats = h.gate.report().stats;
            assert_eq!(
                (stats.ticks, stats.lost, stats.duplicates, stats.late),
                (3, 5, 1, 1),
                "3 and 4 lost, then 6 to 8"
            );
            assert_eq!(h.gate.report().invalid, 3);
            let r = recorded(&recorder);
            let symbol = ["symbol=EURUSD"];
            assert_eq!(value(&r, "projector_quote_ticks_lost_total", &symbol), 5);
            assert_eq!(
                value(
                    &r,
                    "projector_quote_ticks_dropped_total",
                    &["symbol=EURUSD", "kind=duplicate"]
                ),
                1
            );
            assert_eq!(
                value(
                    &r,
                    "projector_quote_ticks_dropped_total",
                    &["symbol=EURUSD", "kind=late"]
                ),
                1
            );
            assert_eq!(value(&r, "projector_quote_suspect_symbols", &[]), 1);
            assert_eq!(value(&r, "projector_quote_datagrams_invalid_total", &[]), 3);

            super::super::order_refused("stale_at_source");
            let r = recorded(&recorder);
            assert_eq!(
                value(
                    &r,
                    "projector_orders_refused_total",
                    &["reason=stale_at_source"]
                ),
                1
            );
        });
    }

    #[test]
    fn pongs_of_our_pings_measure_the_clock_offset_once_each() {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            let mut h = Handler::new(config(FeedMode::Full));
            let now = h.gate.now();
            let out = h.due(now);
            let Some(Datagram::Ping { id }) = out.first().cloned() else {
                panic!("a ping first: {out:?}");
            };
            // The feed's clock is 2500 ms behind ours.
            let pong = Datagram::Pong {
                id,
                feed_ms: now - 2500,
            }
            .encode();
            h.on_datagram(&pong);
            let offset = h.gate.report().clock_offset_ms.expect("measured");
            assert!((2500..2600).contains(&offset), "{offset}");
            h.on_datagram(&pong);
            assert_eq!(
                h.gate.report().invalid,
                1,
                "a repeated pong is not a sample"
            );
            assert!(value(&recorded(&recorder), "projector_quote_clock_offset_ms", &[]) >= 2500);
            // The next ping is due a second later, not before.
            assert!(h
                .due(now + 999)
                .iter()
                .all(|d| !matches!(d, Datagram::Ping { .. })));
            assert!(h
                .due(now + 1000)
                .iter()
                .any(|d| matches!(d, Datagram::Ping { .. })));
        });
    }

    #[test]
    fn a_suspect_delta_symbol_is_reconnected_and_a_full_one_is_not() {
        for mode in [FeedMode::Delta, FeedMode::Full] {
            let mut h = Handler::new(config(mode));
            let subscribes = |out: Vec<Datagram>| -> Vec<Vec<String>> {
                out.into_iter()
                    .filter_map(|d| match d {
                        Datagram::Subscribe { symbols } => Some(symbols),
                        _ => None,
                    })
                    .collect()
            };
            h.gate.update(|g, _| g.set_clock_offset(Some(0)));
            let t = 1_000_000;
            assert_eq!(
                subscribes(h.due(t)),
                [vec!["EURUSD".to_owned(), "GBPUSD".to_owned()]],
                "{mode:?}: everything at start"
            );
            assert!(
                subscribes(h.due(t + 100)).is_empty(),
                "not before the reconnect interval"
            );
            // Both streams start; EURUSD then loses a tick.
            for symbol in ["EURUSD", "GBPUSD"] {
                h.on_datagram(
                    &Datagram::Snapshot {
                        symbol: symbol.to_owned(),
                        seq: 0,
                        bid: Decimal::ONE,
                        ask: Decimal::TWO,
                        source_ms: 0,
                    }
                    .encode(),
                );
            }
            h.on_datagram(&tick(1));
            h.on_datagram(&tick(3));
            h.on_datagram(
                &Datagram::Heartbeat {
                    symbol: "EURUSD".to_owned(),
                    next_seq: 6,
                }
                .encode(),
            );
            let again = subscribes(h.due(t + 600));
            match mode {
                FeedMode::Delta => {
                    assert_eq!(again, [vec!["EURUSD".to_owned()]]);
                    assert_eq!(h.gate.report().reconnects, 1);
                    assert_eq!(
                        h.gate.check("EURUSD"),
                        Err(Refusal::Suspect {
                            waiting_for: crate::writeside::quotes::Awaited::Snapshot
                        })
                    );
                }
                FeedMode::Full => {
                    assert!(
                        again.is_empty(),
                        "the next tick heals a full feed: {again:?}"
                    );
                    assert_eq!(h.gate.report().reconnects, 0);
                }
            }
        }
    }

    #[test]
    fn a_symbol_whose_numbering_may_have_restarted_is_reconnected_in_either_mode() {
        for mode in [FeedMode::Full, FeedMode::Delta] {
            let mut h = Handler::new(config(mode));
            let subscribes = |out: Vec<Datagram>| -> Vec<Vec<String>> {
                out.into_iter()
                    .filter_map(|d| match d {
                        Datagram::Subscribe { symbols } => Some(symbols),
                        _ => None,
                    })
                    .collect()
            };
            let t = 1_000_000;
            h.due(t);
            for symbol in ["EURUSD", "GBPUSD"] {
                h.on_datagram(
                    &Datagram::Snapshot {
                        symbol: symbol.to_owned(),
                        seq: 0,
                        bid: Decimal::ONE,
                        ask: Decimal::TWO,
                        source_ms: 0,
                    }
                    .encode(),
                );
            }
            for seq in 1..=5 {
                h.on_datagram(&tick(seq));
            }
            assert!(subscribes(h.due(t + 600)).is_empty(), "{mode:?}: all well");
            // The provider numbers from 1 again and its snapshot was lost: the ticks are late
            // and the heartbeat is behind.
            h.on_datagram(&tick(1));
            h.on_datagram(
                &Datagram::Heartbeat {
                    symbol: "EURUSD".to_owned(),
                    next_seq: 2,
                }
                .encode(),
            );
            assert_eq!(
                subscribes(h.due(t + 1200)),
                [vec!["EURUSD".to_owned()]],
                "{mode:?}"
            );
            assert_eq!(h.gate.report().reconnects, 1, "{mode:?}");
        }
    }

    #[test]
    fn a_full_tick_without_both_prices_is_counted_invalid() {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            let mut h = Handler::new(config(FeedMode::Full));
            h.gate.update(|g, _| g.set_clock_offset(Some(0)));
            h.on_datagram(&tick(1));
            assert!(h.gate.check("EURUSD").is_ok());
            h.on_datagram(
                &Datagram::Tick {
                    symbol: "EURUSD".to_owned(),
                    seq: 3,
                    bid: Some(Decimal::ONE),
                    ask: None,
                    source_ms: 0,
                }
                .encode(),
            );
            let report = h.gate.report();
            assert_eq!((report.invalid, report.stats.incomplete), (1, 1));
            let r = recorded(&recorder);
            assert_eq!(value(&r, "projector_quote_datagrams_invalid_total", &[]), 1);
            assert_eq!(
                value(&r, "projector_quote_ticks_lost_total", &["symbol=EURUSD"]),
                1,
                "2 never came"
            );
            assert!(matches!(
                h.gate.check("EURUSD"),
                Err(Refusal::Suspect { .. })
            ));
        });
    }
}
