//! The built-in views against the engine's conformance suite and against folds written in
//! Rust, for a generated stream: several accounts and symbols, buys and sells that add,
//! reduce, close exactly and flip, busts of earlier fills, fills without a fee, cash in and
//! out, two UTC trading days and timestamps with an offset.
//!
//! The folds (`portfolio_fold`, `risk_fold`, `eod_fold`) are a second implementation of the
//! rules in docs/views.md with `rust_decimal`, one event at a time, in `seq` order; they
//! catch SQL mistakes that a handful of golden rows miss. Also here: eod under any
//! interleaving and duplicates, portfolio under duplicates with the version filter as the last
//! line of defence, and portfolio and risk rebuilt from a snapshot of the write side (by hand,
//! and as the suite's snapshot schedule, with a SQL view that has a `snapshot` section).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use crate::support::{applier, last_seqs, seed_from_snapshots, totals, view_rows};
use chrono::{DateTime, Duration, FixedOffset, SecondsFormat, Utc};
use projector_engine::testkit::conformance::{self, dump, Factory};
use projector_engine::testkit::{bust, cash, consume, EventSpec, Lcg, Partition, TestDb};
use projector_engine::{Applier, Projection, Registry, SourceOrdering, ViewError};
use projector_views::{Eod, Portfolio, Risk};
use rust_decimal::prelude::Signed;
use rust_decimal::{Decimal, RoundingStrategy};

// ---------------------------------------------------------------------------------------
// The generated stream

/// Symbol, price in units of 10^-scale around which fills trade, and that scale.
const SYMBOLS: [(&str, i64, u32); 4] = [
    ("EURUSD", 108_420, 5),
    ("GBPUSD", 126_310, 5),
    ("USDJPY", 151_234, 3),
    ("XAUUSD", 265_012, 2),
];

/// Each account's events in `seq` order.
fn accounts(seed: u64, accounts: i64, per_account: i64) -> Vec<Vec<EventSpec>> {
    let mut rng = Lcg(seed);
    // 21:00 UTC plus 7 minutes per event: with 40 events an account crosses midnight
    // (two trading days) around its 26th event.
    let start = DateTime::parse_from_rfc3339("2026-11-27T21:00:00Z").expect("start");
    let plus_three = FixedOffset::east_opt(3 * 3600).expect("offset");
    (1..=accounts)
        .map(|account| {
            let mut events = Vec::new();
            let mut net: BTreeMap<&str, Decimal> = BTreeMap::new();
            let mut unbusted: Vec<EventSpec> = Vec::new();
            for seq in 1..=per_account {
                let instant = start + Duration::minutes(seq * 7 + account);
                // The same instant, written in UTC or at +03:00: the trading day is UTC's.
                let at = if rng.chance(30) {
                    instant
                        .with_timezone(&plus_three)
                        .to_rfc3339_opts(SecondsFormat::Secs, false)
                } else {
                    instant
                        .with_timezone(&Utc)
                        .to_rfc3339_opts(SecondsFormat::Secs, true)
                };
                let roll = rng.below(100);
                if roll < 10 && !unbusted.is_empty() {
                    let original = unbusted.remove(rng.below(unbusted.len()));
                    let t = trade(&original).expect("a fill");
                    *net.entry(symbol_of(&original)).or_default() -= Decimal::from(t.s) * t.x;
                    events.push(bust(&original, seq, &at));
                    continue;
                }
                if roll < 22 {
                    let amount = Decimal::new(rng.int(200_000) - 100_000, 2);
                    events.push(cash(account, seq, &at, &amount.to_string(), "transfer"));
                    continue;
                }
                let (symbol, base, scale) = SYMBOLS[rng.below(SYMBOLS.len())];
                let q = net.get(symbol).copied().unwrap_or_default();
                let random_qty = |rng: &mut Lcg| {
                    Decimal::new(
                        rng.int(50_000) + 1,
                        u32::try_from(rng.below(3)).expect("0..3"),
                    )
                };
                let (buy, qty) = if !q.is_zero() && rng.chance(20) {
                    (q.is_sign_negative(), q.abs()) // closes exactly
                } else if !q.is_zero() && rng.chance(20) {
                    (q.is_sign_negative(), q.abs() + random_qty(&mut rng)) // flips
                } else {
                    (rng.chance(50), random_qty(&mut rng))
                };
                let price = Decimal::new(base + rng.int(2001) - 1000, scale);
                let mut data = serde_json::json!({
                    "symbol": symbol,
                    "side": if buy { "buy" } else { "sell" },
                    "qty": qty.to_string(),
                    "price": price.to_string(),
                });
                // One fill in five has no fee: absent means 0.
                if !rng.chance(20) {
                    data["fee"] = Decimal::new(rng.int(500), 2).to_string().into();
                }
                let e = EventSpec::new("fill_executed", account, seq, &at, data);
                *net.entry(symbol).or_default() += if buy { qty } else { -qty };
                unbusted.push(e.clone());
                events.push(e);
            }
            events
        })
        .collect()
}

/// The accounts' events merged in a random order that keeps each account's `seq` order.
fn interleave(by_account: &[Vec<EventSpec>], rng: &mut Lcg) -> Vec<EventSpec> {
    let mut next = vec![0usize; by_account.len()];
    let mut out = Vec::new();
    loop {
        let open: Vec<usize> = (0..by_account.len())
            .filter(|&a| next[a] < by_account[a].len())
            .collect();
        if open.is_empty() {
            return out;
        }
        let a = open[rng.below(open.len())];
        out.push(by_account[a][next[a]].clone());
        next[a] += 1;
    }
}

fn stream(seed: u64) -> Vec<EventSpec> {
    interleave(&accounts(seed, 4, 40), &mut Lcg(seed ^ 0xface))
}

fn symbol_of(e: &EventSpec) -> &'static str {
    let s = e.data["symbol"].as_str().expect("symbol");
    SYMBOLS
        .iter()
        .map(|(name, _, _)| *name)
        .find(|name| *name == s)
        .expect("a generated symbol")
}

// ---------------------------------------------------------------------------------------
// The folds: the rules of docs/views.md, again, in Rust

fn decimal(e: &EventSpec, field: &str) -> Decimal {
    let text = e.data[field]
        .as_str()
        .unwrap_or_else(|| panic!("{}: {field}", e.event_id));
    Decimal::from_str(text).unwrap_or_else(|err| panic!("{}: {field}: {err}", e.event_id))
}

/// PostgreSQL never prints a negative zero; rust_decimal can hold one.
fn text(d: Decimal) -> String {
    let mut d = d;
    if d.is_zero() {
        d.set_sign_positive(true);
    }
    d.to_string()
}

/// The text of `trim_scale(d)`: risk writes its exposures without trailing zeros, so that
/// their text depends on the value alone (docs/views.md).
fn trimmed(d: Decimal) -> String {
    text(d.normalize())
}

fn utc(e: &EventSpec) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(&e.occurred_at)
        .expect("rfc 3339")
        .with_timezone(&Utc)
}

/// A fill, or a bust booked as the reversing trade: side s (+1 buy, -1 sell), quantity x,
/// price p.
struct Trade {
    s: i64,
    x: Decimal,
    p: Decimal,
}

fn trade(e: &EventSpec) -> Option<Trade> {
    let busted = match e.event_type.as_str() {
        "fill_executed" => false,
        "fill_busted" => true,
        _ => return None,
    };
    let buy = e.data["side"] == "buy";
    Some(Trade {
        s: if buy != busted { 1 } else { -1 },
        x: decimal(e, "qty"),
        p: decimal(e, "price"),
    })
}

/// Rounded to 10 places, half away from zero, and written with exactly 10.
fn ten_places(d: Decimal) -> Decimal {
    let mut d = d.round_dp_with_strategy(10, RoundingStrategy::MidpointAwayFromZero);
    d.rescale(10);
    d
}

/// `numeric`'s scale rules: a sum keeps the larger scale of its operands, a product the sum
/// of their scales. rust_decimal mostly agrees, but returns the other operand unchanged when
/// one is zero (`0.00 + 5` is `5`, where PostgreSQL says `5.00`).
fn plus(a: Decimal, b: Decimal) -> Decimal {
    let mut sum = a + b;
    sum.rescale(a.scale().max(b.scale()));
    sum
}

fn times(a: Decimal, b: Decimal) -> Decimal {
    let mut product = a * b;
    product.rescale(a.scale() + b.scale());
    product
}

#[derive(Debug, Clone, Default)]
struct Position {
    q: Decimal,
    a: Decimal,
    r: Decimal,
    last_price: Decimal,
    last_at: Option<DateTime<Utc>>,
    version: i64,
}

impl Position {
    fn apply(&mut self, t: &Trade) {
        let s = Decimal::from(t.s);
        if self.q.is_zero() || self.q.signum() == s {
            // A 28-digit quotient rounded to 10 places: the SQL rounds the exact quotient
            // once; the two agree unless digits 11 to 28 are 4999...9, which these
            // quantities and prices cannot produce.
            self.a = ten_places((self.q.abs() * self.a + t.x * t.p) / (self.q.abs() + t.x));
        } else {
            // std::cmp::min keeps its first argument on a tie, as SQL's least() does; the
            // scale of the product depends on which one is kept.
            let closed = std::cmp::min(self.q.abs(), t.x);
            let per_unit = times(plus(t.p, -self.a), self.q.signum());
            self.r = plus(self.r, times(closed, per_unit));
            self.a = match t.x.cmp(&self.q.abs()) {
                Ordering::Less => self.a,
                Ordering::Equal => ten_places(Decimal::ZERO),
                Ordering::Greater => ten_places(t.p),
            };
        }
        self.q = plus(self.q, times(s, t.x));
        self.last_price = t.p;
    }
}

/// Each account's events once, in `seq` order, whatever the delivery.
fn distinct_in_order(events: &[EventSpec]) -> Vec<&EventSpec> {
    let ordered: BTreeMap<(i64, i64), &EventSpec> =
        events.iter().map(|e| ((e.account_id, e.seq), e)).collect();
    ordered.into_values().collect()
}

fn positions(events: &[EventSpec]) -> BTreeMap<(i64, String), Position> {
    let mut book: BTreeMap<(i64, String), Position> = BTreeMap::new();
    for e in distinct_in_order(events) {
        if let Some(t) = trade(e) {
            let symbol = e.data["symbol"].as_str().expect("symbol").to_owned();
            let p = book.entry((e.account_id, symbol)).or_default();
            p.apply(&t);
            p.last_at = Some(utc(e));
            p.version = e.seq;
        }
    }
    book
}

const PORTFOLIO_ROWS: &str = "SELECT account_id::text, symbol, net_qty::text, avg_price::text, \
     realized_pnl::text, to_char(last_trade_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), \
     version::text FROM portfolio_v{v} ORDER BY account_id, symbol COLLATE \"C\"";

fn portfolio_fold(events: &[EventSpec]) -> Vec<Vec<String>> {
    positions(events)
        .into_iter()
        .map(|((account, symbol), p)| {
            let at = p.last_at.expect("traded").format("%Y-%m-%d %H:%M:%S");
            vec![
                account.to_string(),
                symbol,
                text(p.q),
                text(p.a),
                text(p.r),
                at.to_string(),
                p.version.to_string(),
            ]
        })
        .collect()
}

const RISK_ROWS: &str = "SELECT account_id::text, gross_exposure::text, net_exposure::text, \
     open_positions::text, coalesce(largest_position_symbol, 'NULL'), \
     largest_position_notional::text, version::text FROM risk_v{v} ORDER BY account_id";

fn risk_fold(events: &[EventSpec]) -> Vec<Vec<String>> {
    let mut accounts: BTreeMap<i64, Vec<(String, Position)>> = BTreeMap::new();
    for ((account, symbol), p) in positions(events) {
        accounts.entry(account).or_default().push((symbol, p));
    }
    accounts
        .into_iter()
        .map(|(account, book)| {
            let (mut gross, mut net, mut open) = (Decimal::ZERO, Decimal::ZERO, 0);
            let mut largest: Option<(&str, Decimal)> = None;
            // `book` is in symbol order, so keeping the first of equal exposures keeps the
            // smallest symbol.
            for (symbol, p) in book.iter().filter(|(_, p)| !p.q.is_zero()) {
                let exposure = times(p.q.abs(), p.last_price);
                gross = plus(gross, exposure);
                net = plus(net, times(p.q, p.last_price));
                open += 1;
                if largest.is_none_or(|(_, best)| exposure > best) {
                    largest = Some((symbol, exposure));
                }
            }
            let version = book.iter().map(|(_, p)| p.version).max().unwrap_or(0);
            vec![
                account.to_string(),
                trimmed(gross),
                trimmed(net),
                open.to_string(),
                largest.map_or("NULL".to_owned(), |(s, _)| s.to_owned()),
                largest.map_or("0".to_owned(), |(_, n)| trimmed(n)),
                version.to_string(),
            ]
        })
        .collect()
}

const EOD_ROWS: &str = "SELECT account_id::text, trading_day::text, fills::text, busts::text, \
     bought_qty::text, sold_qty::text, bought_notional::text, sold_notional::text, \
     fees::text, cash_in::text, cash_out::text FROM eod_v{v} ORDER BY account_id, trading_day";

#[derive(Default)]
struct Day {
    fills: u64,
    busts: u64,
    bought_qty: Decimal,
    sold_qty: Decimal,
    bought_notional: Decimal,
    sold_notional: Decimal,
    fees: Decimal,
    cash_in: Decimal,
    cash_out: Decimal,
}

fn eod_fold(events: &[EventSpec]) -> Vec<Vec<String>> {
    let mut days: BTreeMap<(i64, String), Day> = BTreeMap::new();
    for e in distinct_in_order(events) {
        let day = utc(e).format("%Y-%m-%d").to_string();
        let d = days.entry((e.account_id, day)).or_default();
        match e.event_type.as_str() {
            "cash_adjusted" => {
                let amount = decimal(e, "amount");
                match amount.cmp(&Decimal::ZERO) {
                    Ordering::Greater => d.cash_in = plus(d.cash_in, amount),
                    Ordering::Less => d.cash_out = plus(d.cash_out, -amount),
                    Ordering::Equal => {}
                }
            }
            kind => {
                let direction = if kind == "fill_busted" {
                    d.busts += 1;
                    Decimal::NEGATIVE_ONE
                } else {
                    d.fills += 1;
                    if e.data.get("fee").is_some() {
                        d.fees = plus(d.fees, decimal(e, "fee"));
                    }
                    Decimal::ONE
                };
                let qty = times(direction, decimal(e, "qty"));
                let notional = times(qty, decimal(e, "price"));
                if e.data["side"] == "buy" {
                    d.bought_qty = plus(d.bought_qty, qty);
                    d.bought_notional = plus(d.bought_notional, notional);
                } else {
                    d.sold_qty = plus(d.sold_qty, qty);
                    d.sold_notional = plus(d.sold_notional, notional);
                }
            }
        }
    }
    days.into_iter()
        .map(|((account, day), d)| {
            vec![
                account.to_string(),
                day,
                d.fills.to_string(),
                d.busts.to_string(),
                text(d.bought_qty),
                text(d.sold_qty),
                text(d.bought_notional),
                text(d.sold_notional),
                text(d.fees),
                text(d.cash_in),
                text(d.cash_out),
            ]
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Helpers

/// Delivers `events` once to version 1 of the view, compares its rows with the fold, then
/// runs the conformance suite and checks that every schedule gave those same rows.
async fn conforms_and_equals_the_fold(
    factory: Factory,
    events: &[EventSpec],
    sql: &str,
    fold: fn(&[EventSpec]) -> Vec<Vec<String>>,
) {
    let view = factory(1);
    let mut registry = Registry::new();
    registry.add(view.clone()).expect("register");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let log = Partition::from_events("trades", 0, events);
    let outcomes = consume(&applier(view.clone()), &mut client, &log, 7).await;
    totals(&view.consumer(), &outcomes);
    let expected = fold(events);
    assert!(expected.len() >= 4, "the stream is too thin: {expected:?}");
    assert_eq!(view_rows(&client, &*view, sql).await, expected);

    // With the development write side's positions, a view with a snapshot statement is also
    // rebuilt from a snapshot and tailed: rebuild = live.
    let report = conformance::run_with(factory, events, Some(&write_side())).await;
    let snapshot = usize::from(view.snapshot_sql().is_some());
    assert_eq!(
        report.schedules.len(),
        conformance::SCHEDULES.len() + snapshot
    );
    assert_eq!(report.rows, dump(&client, &*view).await);
}

/// The development write side's `positions` and `account_seq`, moved by fills and busts: what
/// the suite's snapshot schedule seeds a view from.
fn write_side() -> conformance::WriteSide {
    conformance::WriteSide {
        schema: projector_devkit::writeside::snapshot_schema_sql().to_owned(),
        book: projector_devkit::writeside::book_trade_sql().to_owned(),
        books: vec!["fill_executed".to_owned(), "fill_busted".to_owned()],
    }
}

// ---------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_passes_the_conformance_suite_and_equals_the_fold() {
    let factory: Factory = Arc::new(|v| Arc::new(Portfolio::new(v)));
    conforms_and_equals_the_fold(factory, &stream(11), PORTFOLIO_ROWS, portfolio_fold).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn risk_passes_the_conformance_suite_and_equals_the_fold() {
    let factory: Factory = Arc::new(|v| Arc::new(Risk::new(v)));
    conforms_and_equals_the_fold(factory, &stream(12), RISK_ROWS, risk_fold).await;
}

/// A stream made for risk's incremental account row: few symbols, a handful of prices and
/// quantities written at several scales ("2", "2.0", "2.00"), so that exposures tie, the
/// largest position shrinks, closes and flips over and over, and the running totals pass
/// through values whose scale a sum would keep.
fn tie_heavy(seed: u64) -> Vec<EventSpec> {
    const PRICES: [&str; 5] = ["1", "2", "2.0", "0.5", "1.00"];
    const QTYS: [&str; 4] = ["1", "2", "2.00", "4.0"];
    let mut rng = Lcg(seed);
    let at = "2026-11-28T10:00:00Z";
    let mut by_account = Vec::new();
    for account in 1..=3 {
        let mut events = Vec::new();
        let mut unbusted: Vec<EventSpec> = Vec::new();
        for seq in 1..=60 {
            if rng.chance(10) && !unbusted.is_empty() {
                let original = unbusted.remove(rng.below(unbusted.len()));
                events.push(bust(&original, seq, at));
                continue;
            }
            let symbol = ["AAA", "AB", "B"][rng.below(3)];
            let data = serde_json::json!({
                "symbol": symbol,
                "side": if rng.chance(50) { "buy" } else { "sell" },
                "qty": QTYS[rng.below(QTYS.len())],
                "price": PRICES[rng.below(PRICES.len())],
            });
            let e = EventSpec::new("fill_executed", account, seq, at, data);
            unbusted.push(e.clone());
            events.push(e);
        }
        by_account.push(events);
    }
    interleave(&by_account, &mut Lcg(seed ^ 0xbeef))
}

/// risk's account row is kept incrementally (docs/views.md): a mistake in it shows in some
/// intermediate row and may be undone by a later event, so the rows are compared with the
/// fold after every event, not only at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn risk_after_every_event_equals_the_fold_through_ties_and_shrinking_positions() {
    let events = tie_heavy(7);
    let view: Arc<dyn Projection> = Arc::new(Risk::new(1));
    let mut registry = Registry::new();
    registry.add(view.clone()).expect("register");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let applier = applier(view.clone());
    let mut log = Partition::new("trades", 0);
    let mut changes_of_largest = 0;
    let mut previous: Vec<Vec<String>> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        log.push_event(e);
        let outcomes = consume(&applier, &mut client, &log, 1).await;
        assert_eq!(outcomes.len(), 1, "one batch for event {i}");
        let rows = view_rows(&client, &*view, RISK_ROWS).await;
        assert_eq!(
            rows,
            risk_fold(&events[..=i]),
            "after event {i}: {}",
            e.event_id
        );
        let largest = |rows: &[Vec<String>], account: &str| {
            rows.iter()
                .find(|r| r[0] == account)
                .map(|r| (r[4].clone(), r[5].clone()))
        };
        let account = e.account_id.to_string();
        if largest(&previous, &account) != largest(&rows, &account) {
            changes_of_largest += 1;
        }
        previous = rows;
    }
    // The stream does what it is for: the largest position changes often, and exposures end
    // up tied at least once (two accounts' rows show the same notional for different symbols
    // or an account's largest loses a tie to a smaller symbol: both are in the fold).
    assert!(
        changes_of_largest >= 40,
        "{changes_of_largest} changes of the largest position"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eod_passes_the_conformance_suite_and_equals_the_fold() {
    let factory: Factory = Arc::new(|v| Arc::new(Eod::new(v)));
    conforms_and_equals_the_fold(factory, &stream(13), EOD_ROWS, eod_fold).await;
}

#[test]
fn the_folds_see_every_rule_in_the_stream() {
    // The generated stream must exercise what the golden tests show by hand, or the fold
    // comparison proves less than it seems to.
    let events = stream(11);
    let (mut opens, mut adds, mut reduces, mut closes, mut flips) = (0, 0, 0, 0, 0);
    let mut book: BTreeMap<(i64, String), Position> = BTreeMap::new();
    for e in distinct_in_order(&events) {
        let Some(t) = trade(e) else { continue };
        let key = (
            e.account_id,
            e.data["symbol"].as_str().expect("s").to_owned(),
        );
        let p = book.entry(key).or_default();
        let s = Decimal::from(t.s);
        match (p.q.is_zero(), p.q.signum() == s, t.x.cmp(&p.q.abs())) {
            (true, _, _) => opens += 1,
            (false, true, _) => adds += 1,
            (false, false, Ordering::Less) => reduces += 1,
            (false, false, Ordering::Equal) => closes += 1,
            (false, false, Ordering::Greater) => flips += 1,
        }
        p.apply(&t);
    }
    let count = |kind: &str| events.iter().filter(|e| e.event_type == kind).count();
    let days: std::collections::BTreeSet<_> = events.iter().map(|e| utc(e).date_naive()).collect();
    let offsets = events
        .iter()
        .filter(|e| e.occurred_at.ends_with("+03:00"))
        .count();
    let no_fee = events
        .iter()
        .filter(|e| e.event_type == "fill_executed" && e.data.get("fee").is_none())
        .count();
    for (what, n) in [
        ("opens", opens),
        ("adds", adds),
        ("reduces", reduces),
        ("exact closes", closes),
        ("flips", flips),
        ("busts", count("fill_busted")),
        ("cash", count("cash_adjusted")),
        ("offset timestamps", offsets),
        ("fills without a fee", no_fee),
    ] {
        assert!(n >= 3, "only {n} {what}");
    }
    assert_eq!(days.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eod_is_the_same_under_any_interleaving_and_duplicates() {
    let by_account = accounts(21, 5, 30);
    let all: Vec<EventSpec> = by_account.iter().flatten().cloned().collect();
    // Versions 1-6: accounts interleaved differently (each in seq order) through an ordered
    // source. Versions 7-10: any order at all, even within an account, through an unordered
    // source, where only the inbox stands between a duplicate and a double count.
    let ordered = 1..=6;
    let unordered = 7..=10;
    let mut registry = Registry::new();
    for v in 1..=10 {
        registry.add(Arc::new(Eod::new(v))).expect("register");
    }
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let mut rng = Lcg(0xe0d);
    let batch_lens = [1, 3, 7, 16, 64, all.len() * 2];
    let mut baseline: Option<Vec<Vec<String>>> = None;
    for v in 1..=10 {
        let order = if ordered.contains(&v) {
            interleave(&by_account, &mut rng)
        } else {
            assert!(unordered.contains(&v));
            let mut shuffled = all.clone();
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, rng.below(i + 1));
            }
            shuffled
        };
        // At-least-once: after any delivery, any event already delivered may come again.
        let mut log = Partition::new("trades", 0);
        let mut extra = 0u64;
        for (i, e) in order.iter().enumerate() {
            log.push_event(e);
            while rng.chance(30) {
                log.push_event(&order[rng.below(i + 1)]);
                extra += 1;
            }
        }
        let view = Arc::new(Eod::new(v));
        let source = if ordered.contains(&v) {
            SourceOrdering::PerAccount
        } else {
            SourceOrdering::Unordered
        };
        let applier = Applier::new(view.clone(), source).expect("eod runs on either source");
        let batch_len = batch_lens[rng.below(batch_lens.len())];
        let outcomes = consume(&applier, &mut client, &log, batch_len).await;
        let t = totals(&view.consumer(), &outcomes);
        assert_eq!(t.duplicates(), extra, "{}: {t:?}", view.consumer());
        assert_eq!(t.applied, all.len() as u64, "{}", view.consumer());
        let rows = view_rows(&client, &*view, EOD_ROWS).await;
        match &baseline {
            None => {
                assert_eq!(rows, eod_fold(&all));
                baseline = Some(rows);
            }
            Some(expected) => assert_eq!(&rows, expected, "{}", view.consumer()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_is_exact_under_duplicates_and_the_version_filter_backs_up_the_inbox() {
    let events = stream(31);
    let view: Arc<dyn Projection> = Arc::new(Portfolio::new(1));
    let registry = Registry::new()
        .register(Portfolio::new(1))
        .expect("register");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let applier = applier(view.clone());

    // Duplicates right after delivery, and the whole stream republished at new offsets (a
    // producer retrying after a timeout).
    let mut rng = Lcg(0xd0b);
    let mut log = Partition::new("trades", 0);
    let mut extra = 0u64;
    for (i, e) in events.iter().enumerate() {
        log.push_event(e);
        if rng.chance(40) {
            log.push_event(&events[rng.below(i + 1)]);
            extra += 1;
        }
    }
    for e in &events {
        log.push_event(e);
        extra += 1;
    }
    let t = totals(
        "portfolio_v1",
        &consume(&applier, &mut client, &log, 9).await,
    );
    let trades = events
        .iter()
        .filter(|e| e.event_type != "cash_adjusted")
        .count() as u64;
    assert_eq!(t.duplicates(), extra, "{t:?}");
    assert_eq!(
        (t.applied, t.ignored),
        (trades, events.len() as u64 - trades)
    );
    let expected = portfolio_fold(&events);
    assert_eq!(view_rows(&client, &*view, PORTFOLIO_ROWS).await, expected);

    // Now take away the first two lines of defence: the inbox rows (as if retention had
    // pruned them) and the account progress and offsets (as if restored from an old backup),
    // and replay everything. Only the version filter is left, and every trade must fall to it.
    client
        .batch_execute(
            "SET projector.inbox_layout = 'days'; DELETE FROM projector.inbox WHERE consumer = 'portfolio_v1';
             DELETE FROM projector.account_progress WHERE consumer = 'portfolio_v1';
             DELETE FROM projector.offsets WHERE consumer = 'portfolio_v1';",
        )
        .await
        .expect("forget");
    let replay = Partition::from_events("trades", 0, &events);
    let t = totals(
        "portfolio_v1",
        &consume(&applier, &mut client, &replay, 9).await,
    );
    assert_eq!(t.dup_version_filter, trades, "{t:?}");
    assert_eq!(t.applied, 0, "{t:?}");
    assert_eq!(view_rows(&client, &*view, PORTFOLIO_ROWS).await, expected);
}

#[test]
fn order_dependent_views_refuse_an_unordered_source() {
    let on_unordered =
        |view: Arc<dyn Projection>| Applier::new(view, SourceOrdering::Unordered).err();
    assert!(matches!(
        on_unordered(Arc::new(Portfolio::new(1))),
        Some(ViewError::VersionFilterNeedsOrdering(_))
    ));
    assert!(matches!(
        on_unordered(Arc::new(Risk::new(1))),
        Some(ViewError::OrderNeedsOrdering(_))
    ));
    assert!(on_unordered(Arc::new(Eod::new(1))).is_none());
}

/// The write side's authoritative state, as docs/views.md defines it.
const WRITE_SIDE: &str = "
CREATE TABLE positions (
    account_id    bigint      NOT NULL,
    symbol        text        NOT NULL,
    net_qty       numeric     NOT NULL,
    avg_price     numeric     NOT NULL,
    realized_pnl  numeric     NOT NULL,
    last_price    numeric     NOT NULL,
    last_trade_at timestamptz NOT NULL,
    last_seq      bigint      NOT NULL,
    PRIMARY KEY (account_id, symbol)
);
CREATE TABLE account_seq (
    account_id bigint PRIMARY KEY,
    last_seq   bigint NOT NULL
);";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_and_risk_rebuilt_from_a_snapshot_equal_the_live_versions() {
    let events = stream(41);
    let cut = events.len() * 3 / 5;
    let mut registry = Registry::new();
    for v in 1..=3 {
        registry.add(Arc::new(Portfolio::new(v))).expect("register");
        registry.add(Arc::new(Risk::new(v))).expect("register");
    }
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let log = Partition::from_events("trades", 0, &events);
    let prefix = Partition::from_events("trades", 0, &events[..cut]);

    // v1 is live from the start. v2 stops where the snapshot is taken: its rows stand for
    // the write side's state at that moment.
    let views = |v: i32| -> [Arc<dyn Projection>; 2] {
        [Arc::new(Portfolio::new(v)), Arc::new(Risk::new(v))]
    };
    for (v, log) in [(1, &log), (2, &prefix)] {
        for view in views(v) {
            let outcomes = consume(&applier(view.clone()), &mut client, log, 8).await;
            totals(&view.consumer(), &outcomes);
        }
    }
    let (accounts, seqs) = last_seqs(&events[..cut]);
    client.batch_execute(WRITE_SIDE).await.expect("write side");
    client
        .execute(
            "INSERT INTO positions SELECT p.account_id, p.symbol, p.net_qty, p.avg_price, \
             p.realized_pnl, r.last_price, p.last_trade_at, p.version \
             FROM portfolio_v2 p JOIN risk_positions_v2 r USING (account_id, symbol)",
            &[],
        )
        .await
        .expect("positions");

    // What the rebuild does: in one REPEATABLE READ transaction, run each view's snapshot
    // statement into version 3 and record the watermarks it returns as the accounts'
    // progress, so that the tail skips what the snapshot holds.
    let rebuilt = views(3);
    let marks = seed_from_snapshots(&mut client, &rebuilt, &accounts, &seqs).await;
    let watermark: BTreeMap<i64, i64> =
        accounts.iter().copied().zip(seqs.iter().copied()).collect();
    for (view, marks) in rebuilt.iter().zip(&marks) {
        assert_eq!(*marks, watermark, "{}", view.consumer());
    }

    // The tail, from the very start of the log: the widest safety margin.
    for (live, rebuilt) in views(1).into_iter().zip(views(3)) {
        let outcomes = consume(&applier(rebuilt.clone()), &mut client, &log, 8).await;
        let t = totals(&rebuilt.consumer(), &outcomes);
        assert_eq!(t.dup_watermark, cut as u64, "{}", rebuilt.consumer());
        assert_eq!(
            dump(&client, &*rebuilt).await,
            dump(&client, &*live).await,
            "{} differs from {}",
            rebuilt.consumer(),
            live.consumer()
        );
    }
    assert_eq!(
        view_rows(&client, &Portfolio::new(3), PORTFOLIO_ROWS).await,
        portfolio_fold(&events)
    );
    assert_eq!(
        view_rows(&client, &Risk::new(3), RISK_ROWS).await,
        risk_fold(&events)
    );
}

/// A SQL view with a `snapshot` section, as `projector views check` runs it: the suite's
/// snapshot schedule seeds it from the write side's positions part-way through the stream,
/// tails the rest, and its rows equal the live schedules' (rebuild = live).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_view_with_a_snapshot_is_rebuilt_from_it_as_it_runs_live() {
    const LAST_TRADE: &str = "\
-- view: last_trade
-- version: 1
-- subscribes: fill_executed v2, fill_busted v2
-- fields: symbol text, qty decimal, price decimal
-- dedup: inbox

-- name: ddl
CREATE TABLE IF NOT EXISTS last_trade_v{v} (
    account_id bigint  NOT NULL,
    symbol     text    NOT NULL,
    net_qty    numeric NOT NULL,
    last_price numeric NOT NULL,
    version    bigint  NOT NULL,
    PRIMARY KEY (account_id, symbol)
);

-- name: write
-- A bust reverses its fill: its (signed) quantity counts against the position.
INSERT INTO last_trade_v{v} AS t (account_id, symbol, net_qty, last_price, version)
SELECT ev.account_id, ev.symbol,
       CASE WHEN ev.type = 'fill_executed' THEN ev.qty ELSE -ev.qty END, ev.price, ev.seq
FROM ev
ON CONFLICT (account_id, symbol) DO UPDATE
SET net_qty = t.net_qty + EXCLUDED.net_qty,
    last_price = EXCLUDED.last_price,
    version = EXCLUDED.version
RETURNING 1;

-- name: read
SELECT account_id, symbol, net_qty, last_price, version FROM last_trade_v{v};

-- name: snapshot
WITH seeded AS (
    INSERT INTO last_trade_v{v} (account_id, symbol, net_qty, last_price, version)
    SELECT account_id, symbol, net_qty, last_price, last_seq FROM positions
    RETURNING 1
)
SELECT account_id, last_seq AS watermark_seq FROM account_seq;
";
    let compiled = projector_views::registry().expect("built-in views");
    let upcasters = projector_engine::sql_view::upcasters_of(compiled.all());
    let view = projector_engine::sql_view::parse(
        &[("last_trade.sql".to_owned(), LAST_TRADE.to_owned())],
        &upcasters,
    )
    .expect("the view parses")
    .with_rules_of(compiled.all());
    let factory: Factory = Arc::new(move |v| Arc::new(view.with_version(v)) as Arc<dyn Projection>);
    let report = conformance::run_with(factory, &stream(14), Some(&write_side())).await;
    let rebuilt = report.schedules.last().expect("schedules");
    assert_eq!(rebuilt.schedule, conformance::SNAPSHOT_SCHEDULE);
    assert!(rebuilt.counts.dup_watermark > 0, "{:?}", rebuilt.counts);
}
