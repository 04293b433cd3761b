//! The bench's events and their fold, computed here in integer arithmetic.
//!
//! The fold is independent of the engine and of the views' SQL: every phase's rows are
//! compared with it, so a fast figure cannot come from a skipped or doubled event. It also
//! gives the ceiling the row values each event leaves behind, so that the ceiling measures
//! writes only.
//!
//! Fills and busts are written at version 2 of their shape (a signed `qty`, no `side`), the
//! version the built-in views read: the engine's figures are not the upcaster's
//! (docs/wire-format.md).
//!
//! Quantities are whole lots and prices have five decimals, so every value of the three
//! views is an exact integer at scale 10 (`i128`); no floating point anywhere.

use std::collections::{BTreeMap, HashMap};

use projector_engine::rng::Rng;
use serde::Serialize;

/// Symbols and their base prices in units of 1e-5.
const SYMBOLS: [(&str, i64); 4] = [
    ("EURUSD", 108_420),
    ("GBPUSD", 126_310),
    ("USDJPY", 15_012_300),
    ("XAUUSD", 265_012_000),
];

/// Trading days the events span; `occurred_at` spreads evenly over them.
pub const DAYS: [&str; 2] = ["2026-11-29", "2026-11-30"];
pub const DAY_MS: u64 = 86_400_000;

/// Prices have five decimals; this lifts them to scale 10.
const PRICE_TO_10: i128 = 100_000;

/// What happened, with the values the views read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `fill_executed`.
    Fill {
        symbol: usize,
        buy: bool,
        qty: i64,
        /// Units of 1e-5.
        price: i64,
        /// Units of 1e-2.
        fee: i64,
    },
    /// `fill_busted`: reverses the named fill, with its symbol, side, quantity and price.
    Bust {
        fill_event_id: String,
        symbol: usize,
        buy: bool,
        qty: i64,
        price: i64,
    },
    /// `cash_adjusted`; units of 1e-2, never zero.
    Cash { amount: i64 },
}

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchEvent {
    pub event_id: String,
    pub account_id: i64,
    pub seq: i64,
    /// Milliseconds after midnight UTC of the first trading day.
    pub at_ms: u64,
    pub kind: Kind,
}

impl BenchEvent {
    /// Whether the portfolio and risk views apply it (they ignore cash).
    pub fn is_trade(&self) -> bool {
        !matches!(self.kind, Kind::Cash { .. })
    }

    /// The wire format: one JSON line, without the newline.
    pub fn payload(&self) -> String {
        let data = match &self.kind {
            Kind::Fill {
                symbol,
                buy,
                qty,
                price,
                fee,
            } => Data::Fill {
                symbol: SYMBOLS[*symbol].0,
                qty: signed(*buy, *qty),
                price: fixed(i128::from(*price), 5),
                fee: fixed(i128::from(*fee), 2),
            },
            Kind::Bust {
                fill_event_id,
                symbol,
                buy,
                qty,
                price,
            } => Data::Bust {
                fill_event_id,
                symbol: SYMBOLS[*symbol].0,
                qty: signed(*buy, *qty),
                price: fixed(i128::from(*price), 5),
            },
            Kind::Cash { amount } => Data::Cash {
                amount: fixed(i128::from(*amount), 2),
                reason: if *amount > 0 { "deposit" } else { "withdrawal" },
            },
        };
        let envelope = Envelope {
            event_id: &self.event_id,
            kind: self.kind.name(),
            type_version: self.is_trade().then_some(2),
            account_id: self.account_id,
            seq: self.seq,
            occurred_at: timestamp(self.at_ms),
            data,
        };
        // Strings and integers only: serde_json fails on map keys that are not strings and
        // on failing `Serialize` impls, and there are neither.
        serde_json::to_string(&envelope).expect("an envelope of strings and integers serializes")
    }
}

impl Kind {
    /// The event type on the wire.
    fn name(&self) -> &'static str {
        match self {
            Kind::Fill { .. } => "fill_executed",
            Kind::Bust { .. } => "fill_busted",
            Kind::Cash { .. } => "cash_adjusted",
        }
    }
}

/// The wire format's envelope; fields in the order the engine's docs show them.
#[derive(Serialize)]
struct Envelope<'a> {
    event_id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    type_version: Option<i32>,
    account_id: i64,
    seq: i64,
    occurred_at: String,
    data: Data<'a>,
}

/// `data` of each event type; decimals as strings, read by the engine from their text.
#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Fill {
        symbol: &'static str,
        qty: String,
        price: String,
        fee: String,
    },
    Bust {
        fill_event_id: &'a str,
        symbol: &'static str,
        qty: String,
        price: String,
    },
    Cash {
        amount: String,
        reason: &'static str,
    },
}

/// A quantity at version 2: positive for a buy, negative for a sell.
fn signed(buy: bool, qty: i64) -> String {
    if buy {
        qty.to_string()
    } else {
        (-qty).to_string()
    }
}

/// RFC 3339 text of a time `ms` after the first trading day's midnight, UTC.
pub fn timestamp(ms: u64) -> String {
    let day = DAYS[usize::try_from(ms / DAY_MS)
        .unwrap_or(0)
        .min(DAYS.len() - 1)];
    let t = ms % DAY_MS;
    format!(
        "{day}T{:02}:{:02}:{:02}.{:03}Z",
        t / 3_600_000,
        t / 60_000 % 60,
        t / 1000 % 60,
        t % 1000
    )
}

/// Seconds from the Unix epoch to midnight UTC of the first trading day, `DAYS[0]`.
const FIRST_DAY_UNIX: u64 = 1_795_910_400;

/// `timestamp(ms)` as a time, for the inbox's `occurred_at` written by the ceiling and the
/// filler (the days are consecutive).
pub fn occurred_at(ms: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(FIRST_DAY_UNIX * 1000 + ms)
}

/// A scaled integer as decimal text: `fixed(-12345, 2)` is `-123.45`.
pub fn fixed(value: i128, scale: u32) -> String {
    let unit = 10i128.pow(scale);
    let sign = if value < 0 { "-" } else { "" };
    let abs = value.unsigned_abs();
    let unit = unit.unsigned_abs();
    if scale == 0 {
        return format!("{sign}{abs}");
    }
    format!(
        "{sign}{}.{:0width$}",
        abs / unit,
        abs % unit,
        width = scale as usize
    )
}

/// `count` events over `accounts` accounts: about 90% fills, 4% busts of earlier fills of the
/// same account, 6% cash movements; random buys and sells, so positions open, add, reduce,
/// close and flip. Each account's events are in `seq` order; accounts interleave randomly.
/// `prefix` makes the event ids of two streams distinct.
pub fn generate(prefix: &str, count: usize, accounts: i64, seed: u64) -> Vec<BenchEvent> {
    let mut rng = Rng::new(seed);
    let accounts = accounts.max(1);
    let mut seqs: HashMap<i64, i64> = HashMap::new();
    // Fills not yet busted, per account: (event id, symbol, buy, qty, price).
    type OpenFill = (String, usize, bool, i64, i64);
    let mut open_fills: HashMap<i64, Vec<OpenFill>> = HashMap::new();
    let span = (DAYS.len() as u64) * DAY_MS - 1;
    let n = count.max(1) as u64;
    let mut out = Vec::with_capacity(count);
    for i in 0..count as u64 {
        let account_id = 1 + rng.int(accounts);
        let seq = {
            let s = seqs.entry(account_id).or_insert(0);
            *s += 1;
            *s
        };
        let event_id = format!("{prefix}-{account_id}-{seq}");
        let at_ms = i * span / n;
        let roll = rng.below(100);
        let fills = open_fills.entry(account_id).or_default();
        let kind = if roll < 4 && !fills.is_empty() {
            let k = rng.below(fills.len());
            let (fill_event_id, symbol, buy, qty, price) = fills.swap_remove(k);
            Kind::Bust {
                fill_event_id,
                symbol,
                buy,
                qty,
                price,
            }
        } else if roll < 10 {
            let cents = 1 + rng.int(100_000);
            Kind::Cash {
                amount: if rng.below(2) == 0 { cents } else { -cents },
            }
        } else {
            let symbol = rng.below(SYMBOLS.len());
            let base = SYMBOLS[symbol].1;
            // Within 1% of the base price.
            let price = base - base / 100 + rng.int((base / 50).abs().max(1));
            let buy = rng.below(2) == 0;
            let qty = 1 + rng.int(100);
            fills.push((event_id.clone(), symbol, buy, qty, price));
            Kind::Fill {
                symbol,
                buy,
                qty,
                price,
                fee: rng.int(201),
            }
        };
        out.push(BenchEvent {
            event_id,
            account_id,
            seq,
            at_ms,
            kind,
        });
    }
    out
}

/// A trade as the views book it: the signed direction (+1 buys, -1 sells; a bust is the
/// opposite of its fill), quantity and price at scale 10.
fn trade(kind: &Kind) -> Option<(usize, i128, i128, i128)> {
    match kind {
        Kind::Fill {
            symbol,
            buy,
            qty,
            price,
            ..
        } => Some((
            *symbol,
            if *buy { 1 } else { -1 },
            i128::from(*qty),
            i128::from(*price) * PRICE_TO_10,
        )),
        Kind::Bust {
            symbol,
            buy,
            qty,
            price,
            ..
        } => Some((
            *symbol,
            if *buy { -1 } else { 1 },
            i128::from(*qty),
            i128::from(*price) * PRICE_TO_10,
        )),
        Kind::Cash { .. } => None,
    }
}

/// One `portfolio_vN` row, values at scale 10 (`net_qty` in lots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    pub net_qty: i128,
    pub avg_price: i128,
    pub realized_pnl: i128,
    pub last_trade_ms: u64,
    pub version: i64,
}

impl Position {
    /// The portfolio rules of `docs/views.md`, as `portfolio.sql` computes them: weighted
    /// average on increase rounded once to 10 places (half up, the values are never negative),
    /// unchanged on reduce, zero on an exact close, the trade price on a flip; realized P&L on
    /// the closed part.
    fn apply(&mut self, s: i128, x: i128, p: i128, at_ms: u64, seq: i64) {
        let (q, a) = (self.net_qty, self.avg_price);
        if q == 0 || q.signum() == s {
            let d = q.abs() + x;
            // n = |q| a + x p at scale 10; round(n / d) at scale 10 is floor((2n + d) / 2d).
            let n = q.abs() * a + x * p;
            self.avg_price = (2 * n + d) / (2 * d);
        } else {
            let closed = q.abs().min(x);
            self.realized_pnl += closed * (p - a) * q.signum();
            if x == q.abs() {
                self.avg_price = 0;
            } else if x > q.abs() {
                self.avg_price = p;
            }
        }
        self.net_qty = q + s * x;
        self.last_trade_ms = at_ms;
        self.version = seq;
    }
}

/// The rows every view should hold after a set of events.
#[derive(Debug, Clone, Default)]
pub struct Fold {
    /// `portfolio_vN`, by (account, symbol index).
    pub portfolio: BTreeMap<(i64, usize), Position>,
    /// `risk_positions_vN`: (net_qty, last_price at scale 10, version).
    pub risk_positions: BTreeMap<(i64, usize), (i128, i128, i64)>,
    /// `eod_vN`, by (account, day index).
    pub eod: BTreeMap<(i64, usize), Day>,
    /// Per portfolio event, in stream order: the row it leaves behind (what the ceiling
    /// writes).
    pub portfolio_writes: Vec<(i64, usize, Position)>,
    /// Per risk event, in stream order: the book row and the account row it leaves behind.
    pub risk_writes: Vec<RiskWrite>,
    /// Events the portfolio and risk views apply.
    pub trades: u64,
    /// All events.
    pub events: u64,
    /// The last `seq` per account.
    pub last_seq: BTreeMap<i64, i64>,
}

/// One `eod_vN` row; quantities in lots, notionals at scale 5, money at scale 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Day {
    pub fills: i64,
    pub busts: i64,
    pub bought_qty: i128,
    pub sold_qty: i128,
    pub bought_notional: i128,
    pub sold_notional: i128,
    pub fees: i128,
    pub cash_in: i128,
    pub cash_out: i128,
}

/// One `risk_positions_vN` row: net quantity in lots, last price at scale 10, version.
pub type RiskPosition = (i128, i128, i64);

/// One `risk_vN` row after the key: gross and net exposure at scale 10, open positions, the
/// largest position (notional at scale 10, symbol), version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RiskAccount {
    pub gross: i128,
    pub net: i128,
    pub open: i64,
    pub largest: Option<(i128, &'static str)>,
    pub version: i64,
}

impl RiskAccount {
    /// The account row of a book, as `risk.sql` computes it: open positions only, the
    /// largest by exposure, ties to the smallest symbol in byte order.
    fn of<'a>(book: impl IntoIterator<Item = (usize, &'a RiskPosition)>) -> Self {
        let mut t = Self::default();
        for (s, &(q, lp, version)) in book {
            t.version = t.version.max(version);
            if q == 0 {
                continue;
            }
            let exposure = q.abs() * lp;
            t.gross += exposure;
            t.net += q * lp;
            t.open += 1;
            let better = match t.largest {
                None => true,
                Some((n, name)) => exposure > n || (exposure == n && symbol(s) < name),
            };
            if better {
                t.largest = Some((exposure, symbol(s)));
            }
        }
        t
    }

    /// Text of the columns after the key: gross, net, open, largest symbol, its notional,
    /// version.
    pub fn text(&self) -> (String, String, i64, Option<&'static str>, String, i64) {
        (
            fixed(self.gross, 10),
            fixed(self.net, 10),
            self.open,
            self.largest.map(|(_, s)| s),
            fixed(self.largest.map_or(0, |(n, _)| n), 10),
            self.version,
        )
    }
}

/// What one risk event leaves behind: its symbol's book row and the account row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RiskWrite {
    pub account_id: i64,
    pub symbol: usize,
    pub position: RiskPosition,
    pub account: RiskAccount,
}

/// The trading day (index into the bench's days) of an event.
pub fn day_of(e: &BenchEvent) -> usize {
    usize::try_from(e.at_ms / DAY_MS).unwrap_or(0)
}

/// The date of a trading day index.
pub fn day_name(day: usize) -> &'static str {
    DAYS[day.min(DAYS.len() - 1)]
}

/// Folds events given in any order that keeps each account's `seq` order.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a BenchEvent>, keep_writes: bool) -> Fold {
    let mut f = Fold::default();
    for e in events {
        f.events += 1;
        f.last_seq.insert(e.account_id, e.seq);
        f.eod
            .entry((e.account_id, day_of(e)))
            .or_default()
            .book(&e.kind);
        let Some((symbol, s, x, p)) = trade(&e.kind) else {
            continue;
        };
        f.trades += 1;
        let key = (e.account_id, symbol);
        let pos = f.portfolio.entry(key).or_default();
        pos.apply(s, x, p, e.at_ms, e.seq);
        if keep_writes {
            f.portfolio_writes.push((e.account_id, symbol, *pos));
        }
        let r = f.risk_positions.entry(key).or_insert((0, 0, 0));
        *r = (r.0 + s * x, p, e.seq);
        let position = *r;
        if keep_writes {
            let account = RiskAccount::of(
                f.risk_positions
                    .range((e.account_id, 0)..=(e.account_id, usize::MAX))
                    .map(|(&(_, s), r)| (s, r)),
            );
            f.risk_writes.push(RiskWrite {
                account_id: e.account_id,
                symbol,
                position,
                account,
            });
        }
    }
    f
}

impl Day {
    /// Books one event, as `eod.sql` does.
    pub fn book(&mut self, kind: &Kind) {
        match kind {
            Kind::Fill {
                buy,
                qty,
                price,
                fee,
                ..
            } => {
                self.fills += 1;
                self.fees += i128::from(*fee);
                book_day(self, *buy, 1, *qty, *price);
            }
            Kind::Bust {
                buy, qty, price, ..
            } => {
                self.busts += 1;
                book_day(self, *buy, -1, *qty, *price);
            }
            Kind::Cash { amount } => {
                if *amount > 0 {
                    self.cash_in += i128::from(*amount);
                } else {
                    self.cash_out -= i128::from(*amount);
                }
            }
        }
    }

    /// Text of the numeric columns: bought and sold quantity, bought and sold notional,
    /// fees, cash in, cash out.
    pub fn text(&self) -> [String; 7] {
        [
            fixed(self.bought_qty, 0),
            fixed(self.sold_qty, 0),
            fixed(self.bought_notional, 5),
            fixed(self.sold_notional, 5),
            fixed(self.fees, 2),
            fixed(self.cash_in, 2),
            fixed(self.cash_out, 2),
        ]
    }
}

fn book_day(d: &mut Day, buy: bool, direction: i128, qty: i64, price: i64) {
    let q = direction * i128::from(qty);
    let notional = q * i128::from(price);
    if buy {
        d.bought_qty += q;
        d.bought_notional += notional;
    } else {
        d.sold_qty += q;
        d.sold_notional += notional;
    }
}

/// Expected rows of one table as text columns, for [`super::check::table`].
#[derive(Debug, Clone)]
pub struct Expected {
    /// The table, e.g. `portfolio_v1`.
    pub table: String,
    /// (column, SQL type to cast the text to); the first `keys` columns identify a row.
    pub columns: Vec<(&'static str, &'static str)>,
    pub keys: usize,
    /// One vector per column; `None` is SQL NULL.
    pub values: Vec<Vec<Option<String>>>,
}

impl Expected {
    fn new(table: String, columns: Vec<(&'static str, &'static str)>, keys: usize) -> Self {
        let values = vec![Vec::new(); columns.len()];
        Self {
            table,
            columns,
            keys,
            values,
        }
    }

    fn push(&mut self, row: Vec<Option<String>>) {
        for (column, value) in self.values.iter_mut().zip(row) {
            column.push(value);
        }
    }
}

fn some(s: impl Into<String>) -> Option<String> {
    Some(s.into())
}

/// Text of a portfolio row's columns after the key, shared with the ceiling's writes.
pub fn position_text(p: &Position) -> [String; 5] {
    [
        fixed(p.net_qty, 0),
        fixed(p.avg_price, 10),
        fixed(p.realized_pnl, 10),
        timestamp(p.last_trade_ms),
        p.version.to_string(),
    ]
}

/// The symbol's name.
pub fn symbol(i: usize) -> &'static str {
    SYMBOLS[i].0
}

impl Fold {
    /// `portfolio_v<version>`.
    pub fn portfolio_rows(&self, version: i32) -> Expected {
        let mut e = Expected::new(
            format!("portfolio_v{version}"),
            vec![
                ("account_id", "bigint"),
                ("symbol", "text"),
                ("net_qty", "numeric"),
                ("avg_price", "numeric"),
                ("realized_pnl", "numeric"),
                ("last_trade_at", "timestamptz"),
                ("version", "bigint"),
            ],
            2,
        );
        for (&(account, s), p) in &self.portfolio {
            let mut row = vec![some(account.to_string()), some(symbol(s))];
            row.extend(position_text(p).into_iter().map(Some));
            e.push(row);
        }
        e
    }

    /// `risk_positions_v<version>` and `risk_v<version>`.
    pub fn risk_rows(&self, version: i32) -> [Expected; 2] {
        let mut positions = Expected::new(
            format!("risk_positions_v{version}"),
            vec![
                ("account_id", "bigint"),
                ("symbol", "text"),
                ("net_qty", "numeric"),
                ("last_price", "numeric"),
                ("version", "bigint"),
            ],
            2,
        );
        let mut books: BTreeMap<i64, Vec<(usize, &RiskPosition)>> = BTreeMap::new();
        for (&(account, s), r) in &self.risk_positions {
            let &(q, lp, version) = r;
            positions.push(vec![
                some(account.to_string()),
                some(symbol(s)),
                some(fixed(q, 0)),
                some(fixed(lp, 10)),
                some(version.to_string()),
            ]);
            books.entry(account).or_default().push((s, r));
        }
        let mut risk = Expected::new(
            format!("risk_v{version}"),
            vec![
                ("account_id", "bigint"),
                ("gross_exposure", "numeric"),
                ("net_exposure", "numeric"),
                ("open_positions", "bigint"),
                ("largest_position_symbol", "text"),
                ("largest_position_notional", "numeric"),
                ("version", "bigint"),
            ],
            1,
        );
        for (account, book) in books {
            let (gross, net, open, largest, notional, version) = RiskAccount::of(book).text();
            risk.push(vec![
                some(account.to_string()),
                some(gross),
                some(net),
                some(open.to_string()),
                largest.map(str::to_owned),
                some(notional),
                some(version.to_string()),
            ]);
        }
        [positions, risk]
    }

    /// `eod_v<version>`.
    pub fn eod_rows(&self, version: i32) -> Expected {
        let mut e = Expected::new(
            format!("eod_v{version}"),
            vec![
                ("account_id", "bigint"),
                ("trading_day", "date"),
                ("fills", "bigint"),
                ("busts", "bigint"),
                ("bought_qty", "numeric"),
                ("sold_qty", "numeric"),
                ("bought_notional", "numeric"),
                ("sold_notional", "numeric"),
                ("fees", "numeric"),
                ("cash_in", "numeric"),
                ("cash_out", "numeric"),
            ],
            2,
        );
        for (&(account, day), d) in &self.eod {
            let mut row = vec![
                some(account.to_string()),
                some(day_name(day)),
                some(d.fills.to_string()),
                some(d.busts.to_string()),
            ];
            row.extend(d.text().into_iter().map(Some));
            e.push(row);
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurred_at_is_the_wire_timestamp() {
        for ms in [0, 1, 86_399_999, 86_400_000, 123_456_789] {
            let text = timestamp(ms);
            let unix = occurred_at(ms)
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after the epoch")
                .as_millis();
            let (day, rest) = text.split_once('T').expect("a date and a time");
            let days_after = u128::from(day != DAYS[0]);
            let clock: Vec<u128> = rest
                .trim_end_matches('Z')
                .split([':', '.'])
                .map(|p| p.parse().expect("a number"))
                .collect();
            let ms_of_day = ((clock[0] * 60 + clock[1]) * 60 + clock[2]) * 1000 + clock[3];
            assert_eq!(
                unix,
                u128::from(FIRST_DAY_UNIX) * 1000 + days_after * 86_400_000 + ms_of_day,
                "{text}"
            );
        }
    }

    #[test]
    fn payloads_are_the_wire_format() {
        let fill = BenchEvent {
            event_id: "e-7-1".to_owned(),
            account_id: 7,
            seq: 1,
            at_ms: 3_723_004,
            kind: Kind::Fill {
                symbol: 0,
                buy: true,
                qty: 300,
                price: 108_420,
                fee: 50,
            },
        };
        assert_eq!(
            fill.payload(),
            r#"{"event_id":"e-7-1","type":"fill_executed","type_version":2,"account_id":7,"seq":1,"occurred_at":"2026-11-29T01:02:03.004Z","data":{"symbol":"EURUSD","qty":"300","price":"1.08420","fee":"0.50"}}"#
        );
        let bust = BenchEvent {
            event_id: "e-7-2".to_owned(),
            seq: 2,
            kind: Kind::Bust {
                fill_event_id: "e-7-1".to_owned(),
                symbol: 0,
                buy: false,
                qty: 300,
                price: 108_420,
            },
            ..fill.clone()
        };
        assert_eq!(
            bust.payload(),
            r#"{"event_id":"e-7-2","type":"fill_busted","type_version":2,"account_id":7,"seq":2,"occurred_at":"2026-11-29T01:02:03.004Z","data":{"fill_event_id":"e-7-1","symbol":"EURUSD","qty":"-300","price":"1.08420"}}"#
        );
        let cash = BenchEvent {
            event_id: "e-7-3".to_owned(),
            seq: 3,
            kind: Kind::Cash { amount: -1250 },
            ..fill
        };
        assert_eq!(
            cash.payload(),
            r#"{"event_id":"e-7-3","type":"cash_adjusted","account_id":7,"seq":3,"occurred_at":"2026-11-29T01:02:03.004Z","data":{"amount":"-12.50","reason":"withdrawal"}}"#
        );
        for event in [&fill, &bust, &cash] {
            let message = projector_engine::Message::new(
                0,
                Some(b"7".to_vec()),
                event.payload().into_bytes(),
            );
            assert!(projector_views::events::decode(&message).is_ok());
        }
    }

    #[test]
    fn fixed_point_text() {
        assert_eq!(fixed(-12345, 2), "-123.45");
        assert_eq!(fixed(5, 3), "0.005");
        assert_eq!(fixed(-5, 3), "-0.005");
        assert_eq!(fixed(42, 0), "42");
        assert_eq!(timestamp(DAY_MS + 3_723_004), "2026-11-30T01:02:03.004Z");
    }

    /// 10^10: the scale every fold value is kept at.
    const SCALE10: i128 = 10_000_000_000;

    #[test]
    fn the_portfolio_rules() {
        let mut p = Position::default();
        let price = |x: i128| x * SCALE10 / 100;
        p.apply(1, 100, price(110), 0, 1); // buy 100 @ 1.10
        p.apply(1, 50, price(120), 0, 2); // buy 50 @ 1.20: avg (110 + 60) / 150
        assert_eq!(p.net_qty, 150);
        assert_eq!(fixed(p.avg_price, 10), "1.1333333333");
        p.apply(-1, 30, price(130), 0, 3); // reduce: avg unchanged
        assert_eq!(p.avg_price, 11_333_333_333);
        assert_eq!(p.realized_pnl, 30 * (price(130) - 11_333_333_333));
        p.apply(-1, 200, price(100), 0, 4); // flip to -80 @ 1.00
        assert_eq!((p.net_qty, p.avg_price), (-80, price(100)));
        p.apply(1, 80, price(90), 0, 5); // close the short exactly
        assert_eq!((p.net_qty, p.avg_price), (0, 0));
    }

    #[test]
    fn streams_are_deterministic_and_in_seq_order() {
        let a = generate("x", 5000, 40, 7);
        assert_eq!(a, generate("x", 5000, 40, 7));
        let mut last: HashMap<i64, i64> = HashMap::new();
        for e in &a {
            let prev = last.insert(e.account_id, e.seq).unwrap_or(0);
            assert_eq!(e.seq, prev + 1);
        }
        assert!(a.iter().any(|e| matches!(e.kind, Kind::Bust { .. })));
        assert!(a.iter().any(|e| matches!(e.kind, Kind::Cash { .. })));
        let f = fold(&a, true);
        assert_eq!(f.portfolio_writes.len() as u64, f.trades);
        assert_eq!(f.risk_writes.len() as u64, f.trades);
        // The last account row each account's risk events leave behind is the folded one.
        let mut last: BTreeMap<i64, RiskAccount> = BTreeMap::new();
        for w in &f.risk_writes {
            last.insert(w.account_id, w.account);
        }
        let [_, risk] = f.risk_rows(1);
        assert_eq!(risk.values[0].len(), last.len());
        for (i, account) in risk.values[0].iter().enumerate() {
            let id: i64 = account.as_deref().unwrap_or_default().parse().unwrap_or(0);
            let (gross, _, open, _, _, version) = last[&id].text();
            assert_eq!(risk.values[1][i].as_deref(), Some(gross.as_str()));
            assert_eq!(risk.values[3][i], Some(open.to_string()));
            assert_eq!(risk.values[6][i], Some(version.to_string()));
        }
    }
}
