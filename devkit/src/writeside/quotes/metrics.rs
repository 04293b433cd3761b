//! The quote gate's metrics (the table is in the module doc of [`super`]). Handles are
//! registered once per symbol, so that a datagram does not build labels.

use std::collections::HashMap;

use metrics::{counter, gauge, Counter, Gauge};

use super::gate::{HeartbeatVerdict, Millis, TickVerdict};

struct SymbolMetrics {
    lost: Counter,
    duplicates: Counter,
    late: Counter,
}

/// The receiver's handles.
pub(crate) struct QuoteMetrics {
    symbols: HashMap<String, SymbolMetrics>,
    suspect: Gauge,
    reconnects: Counter,
    invalid: Counter,
    clock_offset: Gauge,
}

impl QuoteMetrics {
    pub(crate) fn new() -> Self {
        Self {
            symbols: HashMap::new(),
            suspect: gauge!("projector_quote_suspect_symbols"),
            reconnects: counter!("projector_quote_reconnects_total"),
            invalid: counter!("projector_quote_datagrams_invalid_total"),
            clock_offset: gauge!("projector_quote_clock_offset_ms"),
        }
    }

    fn symbol(&mut self, symbol: &str) -> &SymbolMetrics {
        self.symbols
            .entry(symbol.to_owned())
            .or_insert_with(|| {
                let s = symbol.to_owned();
                let dropped = |kind: &'static str| {
                    counter!("projector_quote_ticks_dropped_total", "symbol" => s.clone(), "kind" => kind)
                };
                SymbolMetrics {
                    lost: counter!("projector_quote_ticks_lost_total", "symbol" => s.clone()),
                    duplicates: dropped("duplicate"),
                    late: dropped("late"),
                }
            })
    }

    pub(crate) fn tick(&mut self, symbol: &str, verdict: TickVerdict) {
        let m = self.symbol(symbol);
        match verdict {
            TickVerdict::Applied { lost } | TickVerdict::Incomplete { lost } => {
                m.lost.increment(lost);
            }
            TickVerdict::Duplicate => m.duplicates.increment(1),
            TickVerdict::Late => m.late.increment(1),
        }
    }

    pub(crate) fn heartbeat(&mut self, symbol: &str, verdict: HeartbeatVerdict) {
        if let HeartbeatVerdict::Gap { lost } = verdict {
            self.symbol(symbol).lost.increment(lost);
        }
    }

    pub(crate) fn suspect_symbols(&self, n: usize) {
        self.suspect.set(n as f64);
    }

    pub(crate) fn reconnects(&self, n: u64) {
        self.reconnects.increment(n);
    }

    pub(crate) fn invalid(&self) {
        self.invalid.increment(1);
    }

    pub(crate) fn clock_offset(&self, offset: Millis) {
        self.clock_offset.set(offset as f64);
    }
}

/// An order the gate refused, by reason (first answers only: a retry gets the stored reply and
/// is counted as deduplicated).
pub(crate) fn order_refused(reason: &'static str) {
    counter!("projector_orders_refused_total", "reason" => reason).increment(1);
}
