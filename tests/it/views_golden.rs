//! Golden tests: the built-in views against rows computed by hand, read through the stable
//! read names (`portfolio`, `risk`, `eod`) that readers use.
//!
//! Every expected value is a literal decimal string with the scale PostgreSQL gives it
//! (`numeric` keeps the larger scale in a sum and adds scales in a product), and the
//! arithmetic is in the comments. Compared as text, so `1.5` and `1.50` differ.

use std::collections::BTreeSet;

use deadpool_postgres::Client;
use projector_engine::testkit::{bust, cash, consume, fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, BatchOutcome, Registry, SourceOrdering};

const PORTFOLIO: &str = "SELECT account_id::text, symbol, net_qty::text, avg_price::text, \
     realized_pnl::text, (last_trade_at AT TIME ZONE 'UTC')::text, version::text \
     FROM portfolio ORDER BY account_id, symbol";

const RISK: &str = "SELECT account_id::text, gross_exposure::text, net_exposure::text, \
     open_positions::text, largest_position_symbol, largest_position_notional::text, version::text \
     FROM risk ORDER BY account_id";

const EOD: &str = "SELECT account_id::text, trading_day::text, fills::text, busts::text, \
     bought_qty::text, sold_qty::text, bought_notional::text, sold_notional::text, \
     fees::text, cash_in::text, cash_out::text \
     FROM eod ORDER BY account_id, trading_day";

/// A fill without a `fee` field: the fee is optional and absent means 0.
fn fill_without_fee(
    account_id: i64,
    seq: i64,
    at: &str,
    symbol: &str,
    side: &str,
    qty: &str,
    price: &str,
) -> EventSpec {
    EventSpec::new(
        "fill_executed",
        account_id,
        seq,
        at,
        serde_json::json!({"symbol": symbol, "side": side, "qty": qty, "price": price}),
    )
}

/// Account 1: open, add, partial close, exact close, open short, flip, a bust after its fill,
/// cash in and out, two trading days, two symbols.
#[rustfmt::skip]
fn account_1() -> Vec<EventSpec> {
    let flip = fill(1, 7, "2026-11-27T09:50:00Z", "EURUSD", "buy", "100", "1.2", "1.00");
    vec![
        fill(1, 1, "2026-11-27T09:00:00Z", "EURUSD", "buy", "100", "1.1000", "1.00"),
        fill(1, 2, "2026-11-27T09:05:00Z", "EURUSD", "buy", "300", "1.2000", "3.00"),
        fill(1, 3, "2026-11-27T09:10:00Z", "USDJPY", "sell", "50", "150.25", "0.50"),
        fill(1, 4, "2026-11-27T09:20:00Z", "EURUSD", "sell", "150", "1.2500", "1.50"),
        fill(1, 5, "2026-11-27T09:30:00Z", "EURUSD", "sell", "250", "1.1000", "2.50"),
        fill(1, 6, "2026-11-27T09:40:00Z", "EURUSD", "sell", "40", "1.3", "0.40"),
        flip.clone(),
        fill(1, 8, "2026-11-27T10:00:00Z", "USDJPY", "buy", "20", "151.75", "0.20"),
        cash(1, 9, "2026-11-28T08:00:00Z", "1000.00", "deposit"),
        bust(&flip, 10, "2026-11-28T08:30:00Z"),
        cash(1, 11, "2026-11-28T09:00:00Z", "-250.50", "withdrawal"),
    ]
}

/// Account 2: decimal quantities, a fill whose UTC day differs from its local day, a fill
/// without a fee, a bust of it, an average that rounds up, a cash debit.
#[rustfmt::skip]
fn account_2() -> Vec<EventSpec> {
    let no_fee = fill_without_fee(2, 2, "2026-11-28T10:00:00Z", "GBPUSD", "buy", "2", "1.3");
    vec![
        // 01:30 at +03:00 is 22:30 UTC on the 27th.
        fill(2, 1, "2026-11-28T01:30:00+03:00", "GBPUSD", "buy", "10.5", "1.26", "0.25"),
        no_fee.clone(),
        bust(&no_fee, 3, "2026-11-28T10:05:00Z"),
        fill(2, 4, "2026-11-28T11:00:00Z", "XAUUSD", "buy", "1", "2000", "5.00"),
        fill(2, 5, "2026-11-28T11:05:00Z", "XAUUSD", "buy", "2", "2000.01", "10.00"),
        cash(2, 6, "2026-11-28T12:00:00Z", "-0.01", "fx rounding"),
    ]
}

/// Account 3: a long and a short of equal exposure (the tie), both closed exactly: flat.
#[rustfmt::skip]
fn account_3() -> Vec<EventSpec> {
    vec![
        fill(3, 1, "2026-11-28T13:00:00Z", "EURUSD", "buy", "10", "2", "0"),
        fill(3, 2, "2026-11-28T13:01:00Z", "GBPUSD", "sell", "20", "1", "0"),
        fill(3, 3, "2026-11-28T13:02:00Z", "EURUSD", "sell", "10", "2.5", "0"),
        fill(3, 4, "2026-11-28T13:03:00Z", "GBPUSD", "buy", "20", "1.1", "0"),
    ]
}

/// The three accounts interleaved round-robin, each in `seq` order.
fn golden_stream() -> Vec<EventSpec> {
    let mut queues = [account_1(), account_2(), account_3()].map(|q| q.into_iter());
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for q in &mut queues {
            out.extend(q.next());
        }
        if out.len() == before {
            return out;
        }
    }
}

/// A database with version 1 of every built-in view, fed a growing log.
struct Views {
    db: TestDb,
    appliers: Vec<Applier>,
    log: Partition,
}

impl Views {
    async fn new() -> Self {
        let registry: Registry = projector_views::registry().expect("registry");
        let db = TestDb::new(&registry).await;
        let appliers = registry
            .all()
            .iter()
            .map(|v| Applier::new(v.clone(), SourceOrdering::PerAccount).expect("applier"))
            .collect();
        Self {
            db,
            appliers,
            log: Partition::new("trades", 0),
        }
    }

    /// Appends events and lets every view catch up, in batches of 4.
    async fn feed(&mut self, events: &[EventSpec]) {
        for e in events {
            self.log.push_event(e);
        }
        let mut client = self.db.client().await;
        for applier in &self.appliers {
            let outcomes = consume(applier, &mut client, &self.log, 4).await;
            assert_clean(applier.consumer(), &outcomes);
        }
    }

    async fn client(&self) -> Client {
        self.db.client().await
    }
}

/// A statement that fails on an event's data dead-letters the event instead of failing the
/// batch, so a broken view would pass silently without this check.
fn assert_clean(consumer: &str, outcomes: &[BatchOutcome]) {
    for o in outcomes {
        let c = &o.counts;
        assert_eq!(
            (c.poison, c.failed, c.waiting),
            (0, 0, 0),
            "{consumer}: {c:?}"
        );
    }
}

async fn read(client: &Client, sql: &str) -> Vec<Vec<String>> {
    client
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    row.get::<_, Option<String>>(i)
                        .unwrap_or_else(|| "NULL".to_owned())
                })
                .collect()
        })
        .collect()
}

fn rows(expected: &[&[&str]]) -> Vec<Vec<String>> {
    expected
        .iter()
        .map(|r| r.iter().map(|s| (*s).to_owned()).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_golden_rows() {
    let mut views = Views::new().await;
    views.feed(&golden_stream()).await;
    let client = views.client().await;
    #[rustfmt::skip]
    let expected = rows(&[
        // EURUSD, step by step in `portfolio_steps_through_every_rule`; the last event is the
        // bust of seq 7 (buy 100 @ 1.2), booked as sell 100 @ 1.2 against q = 60, a = 1.2:
        // a flip. r += min(60, 100) * (1.2 - 1.2000000000) * 1 = 0; q = 60 - 100 = -40;
        // a = p = 1.2000000000. The bust does not restore the state before seq 7
        // (q = -40, a = 1.3, r = -7.5): it is a trade at the original's price.
        &["1", "EURUSD", "-40", "1.2000000000", "-3.5000000000", "2026-11-28 08:30:00", "10"],
        // USDJPY: sell 50 @ 150.25 opens short, a = 7512.50 / 50 = 150.2500000000.
        // buy 20 @ 151.75 reduces: r = 20 * (151.75 - 150.2500000000) * sign(-50)
        //   = 20 * 1.5000000000 * -1 = -30.0000000000; q = -30; a stays.
        // The cash events (seq 9, 11) are not portfolio events; the version stays 8.
        &["1", "USDJPY", "-30", "150.2500000000", "-30.0000000000", "2026-11-27 10:00:00", "8"],
        // GBPUSD: buy 10.5 @ 1.26: a = 13.230 / 10.5 = 1.2600000000.
        // buy 2 @ 1.3 (no fee): a = (10.5 * 1.2600000000 + 2 * 1.3) / 12.5 = 15.83 / 12.5
        //   = 1.2664000000; q = 12.5.
        // bust of it = sell 2 @ 1.3, a reduce: r = 2 * (1.3 - 1.2664000000) = 0.0672000000;
        //   q = 10.5; a stays 1.2664000000.
        &["2", "GBPUSD", "10.5", "1.2664000000", "0.0672000000", "2026-11-28 10:05:00", "3"],
        // XAUUSD: buy 1 @ 2000, buy 2 @ 2000.01: a = (2000.0000000000 + 4000.02) / 3
        //   = 2000.00666666666..., rounded up to 2000.0066666667. Nothing realized: r = 0.
        &["2", "XAUUSD", "3", "2000.0066666667", "0", "2026-11-28 11:05:00", "5"],
        // EURUSD: buy 10 @ 2, sell 10 @ 2.5 closes exactly:
        //   r = 10 * (2.5 - 2.0000000000) = 5.0000000000; a = 0.0000000000; the row stays.
        &["3", "EURUSD", "0", "0.0000000000", "5.0000000000", "2026-11-28 13:02:00", "3"],
        // GBPUSD: sell 20 @ 1, buy 20 @ 1.1 closes the short exactly:
        //   r = 20 * (1.1 - 1.0000000000) * -1 = -2.0000000000.
        &["3", "GBPUSD", "0", "0.0000000000", "-2.0000000000", "2026-11-28 13:03:00", "4"],
    ]);
    assert_eq!(read(&client, PORTFOLIO).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_steps_through_every_rule() {
    let mut views = Views::new().await;
    let client = views.client().await;
    let eurusd = "SELECT net_qty::text, avg_price::text, realized_pnl::text, version::text \
                  FROM portfolio WHERE account_id = 1 AND symbol = 'EURUSD'";
    #[rustfmt::skip]
    let steps: [(&str, &[i64], [&str; 4]); 7] = [
        // buy 100 @ 1.1000 from flat: a = (0 + 100 * 1.1000) / 100 = 1.1000000000.
        ("open", &[1], ["100", "1.1000000000", "0", "1"]),
        // buy 300 @ 1.2000: a = (100 * 1.1000000000 + 300 * 1.2000) / 400 = 470 / 400 = 1.175.
        // (seq 3 is USDJPY.)
        ("add", &[2, 3], ["400", "1.1750000000", "0", "2"]),
        // sell 150 @ 1.2500: c = 150; r = 150 * (1.2500 - 1.1750000000) * 1 = 11.2500000000;
        // q = 250; a stays.
        ("partial close", &[4], ["250", "1.1750000000", "11.2500000000", "4"]),
        // sell 250 @ 1.1000: c = 250 = |q|; r += 250 * (1.1000 - 1.1750000000) = -18.75,
        // so r = -7.5000000000; q = 0; a = 0.
        ("exact close", &[5], ["0", "0.0000000000", "-7.5000000000", "5"]),
        // sell 40 @ 1.3 from flat opens a short: a = 40 * 1.3 / 40 = 1.3000000000.
        ("open short", &[6], ["-40", "1.3000000000", "-7.5000000000", "6"]),
        // buy 100 @ 1.2 against q = -40: c = 40; r += 40 * (1.2 - 1.3000000000) * -1 = 4,
        // so r = -3.5000000000; q = 60; a = p = 1.2000000000.
        ("flip", &[7, 8, 9], ["60", "1.2000000000", "-3.5000000000", "7"]),
        // the bust of seq 7: sell 100 @ 1.2 against q = 60, a flip at the same price:
        // r += 60 * 0 = 0; q = -40; a = 1.2000000000.
        ("bust after fill", &[10, 11], ["-40", "1.2000000000", "-3.5000000000", "10"]),
    ];
    let events = account_1();
    for (rule, seqs, expected) in steps {
        let batch: Vec<EventSpec> = events
            .iter()
            .filter(|e| seqs.contains(&e.seq))
            .cloned()
            .collect();
        views.feed(&batch).await;
        let got = read(&client, eurusd).await;
        assert_eq!(got, rows(&[&expected]), "after {rule}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_rounds_the_average_once_half_away_from_zero() {
    let mut views = Views::new().await;
    #[rustfmt::skip]
    let events = [
        // (0.0000000001 + 0) / 2 = 0.00000000005 exactly: half, away from zero.
        fill(4, 1, "2026-11-28T10:00:00Z", "HALF", "buy", "1", "0.0000000001", "0"),
        fill(4, 2, "2026-11-28T10:01:00Z", "HALF", "buy", "1", "0", "0"),
        // (1.0000000000 + 2 * 1.00000000001) / 3 = 1.0000000000066...: rounds down.
        fill(4, 3, "2026-11-28T10:02:00Z", "DOWN", "buy", "1", "1", "0"),
        fill(4, 4, "2026-11-28T10:03:00Z", "DOWN", "buy", "2", "1.00000000001", "0"),
        // A flip resets the average to the price, rounded: 1.23456789015 -> 1.2345678902.
        // r = min(2, 5) * (1.23456789015 - 1.0000000000) = 2 * 0.23456789015.
        fill(4, 5, "2026-11-28T10:04:00Z", "FLIP", "buy", "2", "1", "0"),
        fill(4, 6, "2026-11-28T10:05:00Z", "FLIP", "sell", "5", "1.23456789015", "0"),
        // (0.1234567890 + 1e-22 * 500000000000.1234567890) / (1 + 1e-22)
        //   = 0.12345678905 - 5e-33 + ...: just below half, so 0.1234567890.
        // round(n / d, 10) would say 0.1234567891: the division first rounds its quotient
        // to 32 places, 0.12345678905000..., and round() then rounds that half up.
        fill(5, 1, "2026-11-28T10:00:00Z", "ONCE", "buy", "1", "0.1234567890", "0"),
        fill(5, 2, "2026-11-28T10:01:00Z", "ONCE", "buy", "0.0000000000000000000001", "500000000000.1234567890", "0"),
    ];
    views.feed(&events).await;
    let client = views.client().await;
    let got = read(
        &client,
        "SELECT symbol, net_qty::text, avg_price::text, realized_pnl::text FROM portfolio \
         WHERE account_id IN (4, 5) ORDER BY account_id, symbol",
    )
    .await;
    #[rustfmt::skip]
    let expected = rows(&[
        &["DOWN", "3", "1.0000000000", "0"],
        &["FLIP", "-3", "1.2345678902", "0.46913578030"],
        &["HALF", "2", "0.0000000001", "0"],
        &["ONCE", "1.0000000000000000000001", "0.1234567890", "0"],
    ]);
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn risk_golden_rows() {
    let mut views = Views::new().await;
    views.feed(&golden_stream()).await;
    let client = views.client().await;
    #[rustfmt::skip]
    let expected = rows(&[
        // EURUSD q = -40, last price 1.2 (the bust's, the latest EURUSD event):
        //   exposure |-40| * 1.2 = 48.0, signed -48.0.
        // USDJPY q = -30, last price 151.75: exposure 30 * 151.75 = 4552.50, signed -4552.50.
        // gross = 48.0 + 4552.50 = 4600.50; net = -4600.50; largest USDJPY. Exposures are
        // written without trailing zeros (trim_scale): 4600.5, -4600.5, 4552.5.
        // version: seq 10, the bust; the later cash event is not a risk event.
        &["1", "4600.5", "-4600.5", "2", "USDJPY", "4552.5", "10"],
        // GBPUSD q = 10.5, last price 1.3 (the bust's): 10.5 * 1.3 = 13.65.
        // XAUUSD q = 3, last price 2000.01: 3 * 2000.01 = 6000.03.
        // gross = net = 13.65 + 6000.03 = 6013.68.
        &["2", "6013.68", "6013.68", "2", "XAUUSD", "6000.03", "5"],
        // Every position closed: nothing open, no largest position, sums of nothing are 0.
        &["3", "0", "0", "0", "NULL", "0", "4"],
    ]);
    assert_eq!(read(&client, RISK).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn risk_steps_through_ties_and_going_flat() {
    let mut views = Views::new().await;
    let client = views.client().await;
    let risk_3 = "SELECT account_id::text, gross_exposure::text, net_exposure::text, \
         open_positions::text, largest_position_symbol, largest_position_notional::text, version::text \
         FROM risk WHERE account_id = 3";
    #[rustfmt::skip]
    let steps: [(&str, [&str; 7]); 4] = [
        // buy 10 EURUSD @ 2: 10 * 2 = 20.
        ("one long", ["3", "20", "20", "1", "EURUSD", "20", "1"]),
        // sell 20 GBPUSD @ 1: |-20| * 1 = 20, signed -20. gross 40, net 20 - 20 = 0.
        // Equal exposures: the tie goes to the smaller symbol.
        ("a tie", ["3", "40", "0", "2", "EURUSD", "20", "2"]),
        // sell 10 EURUSD @ 2.5: EURUSD flat and no longer counted; GBPUSD alone.
        ("one closed", ["3", "20", "-20", "1", "GBPUSD", "20", "3"]),
        // buy 20 GBPUSD @ 1.1: flat everywhere.
        ("flat", ["3", "0", "0", "0", "NULL", "0", "4"]),
    ];
    for (event, (step, expected)) in account_3().iter().zip(steps) {
        views.feed(std::slice::from_ref(event)).await;
        assert_eq!(read(&client, risk_3).await, rows(&[&expected]), "{step}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eod_golden_rows() {
    let mut views = Views::new().await;
    views.feed(&golden_stream()).await;
    let client = views.client().await;
    #[rustfmt::skip]
    let expected = rows(&[
        // Account 1, 27 November: 8 fills, no bust.
        // bought 100 + 300 + 100 + 20 = 520; sold 50 + 150 + 250 + 40 = 490.
        // bought notional 100 * 1.1000 + 300 * 1.2000 + 100 * 1.2 + 20 * 151.75
        //   = 110.0000 + 360.0000 + 120.0 + 3035.00 = 3625.0000.
        // sold notional 50 * 150.25 + 150 * 1.2500 + 250 * 1.1000 + 40 * 1.3
        //   = 7512.50 + 187.5000 + 275.0000 + 52.0 = 8027.0000.
        // fees 1.00 + 3.00 + 0.50 + 1.50 + 2.50 + 0.40 + 1.00 + 0.20 = 10.10.
        &["1", "2026-11-27", "8", "0", "520", "490", "3625.0000", "8027.0000", "10.10", "0", "0"],
        // Account 1, 28 November: the bust of the 27th's buy 100 @ 1.2 is booked on its own
        // day: bought -100, notional -120.0, fills unchanged, busts 1, its fill's fee stays
        // on the 27th. Cash: +1000.00 in, -250.50 out.
        &["1", "2026-11-28", "0", "1", "-100", "0", "-120.0", "0", "0", "1000.00", "250.50"],
        // Account 2, 27 November (UTC): 01:30+03:00 on the 28th is 22:30Z on the 27th.
        // 10.5 * 1.26 = 13.230; fee 0.25.
        &["2", "2026-11-27", "1", "0", "10.5", "0", "13.230", "0", "0.25", "0", "0"],
        // Account 2, 28 November: fills buy 2 @ 1.3 (no fee), buy 1 @ 2000 (5.00),
        // buy 2 @ 2000.01 (10.00); the bust of the first takes back 2 and 2.6.
        // bought 2 - 2 + 1 + 2 = 3; notional 2.6 - 2.6 + 2000 + 4000.02 = 6000.02;
        // fees 0 + 5.00 + 10.00 = 15.00; cash -0.01 is 0.01 out.
        &["2", "2026-11-28", "3", "1", "3", "0", "6000.02", "0", "15.00", "0", "0.01"],
        // Account 3: bought 10 + 20 = 30 for 10 * 2 + 20 * 1.1 = 20 + 22.0 = 42.0;
        // sold 20 + 10 = 30 for 20 * 1 + 10 * 2.5 = 20 + 25.0 = 45.0; fees 0.
        &["3", "2026-11-28", "4", "0", "30", "30", "42.0", "45.0", "0", "0", "0"],
    ]);
    assert_eq!(read(&client, EOD).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_installs_the_stable_read_names() {
    let registry = projector_views::registry().expect("registry");
    let summary: Vec<(String, i32, &str, bool, Vec<String>)> = registry
        .all()
        .iter()
        .map(|v| {
            (
                v.name().to_owned(),
                v.version(),
                v.dedup().as_str(),
                v.order_independent(),
                v.subscribes().iter().map(|s| (*s).to_owned()).collect(),
            )
        })
        .collect();
    let trades = ["fill_executed", "fill_busted"].map(str::to_owned).to_vec();
    let all = ["fill_executed", "fill_busted", "cash_adjusted"]
        .map(str::to_owned)
        .to_vec();
    assert_eq!(
        summary,
        vec![
            (
                "portfolio".to_owned(),
                1,
                "inbox+version_filter",
                false,
                trades.clone()
            ),
            ("risk".to_owned(), 1, "inbox", false, trades),
            ("eod".to_owned(), 1, "inbox", true, all),
        ]
    );

    let db = TestDb::new(&registry).await;
    let client = db.client().await;
    let live = read(
        &client,
        "SELECT name, version::text, state FROM projector.views ORDER BY name",
    )
    .await;
    #[rustfmt::skip]
    assert_eq!(live, rows(&[&["eod", "1", "live"], &["portfolio", "1", "live"], &["risk", "1", "live"]]));

    let required: [(&str, &[&str]); 3] = [
        (
            "portfolio",
            &[
                "account_id",
                "symbol",
                "net_qty",
                "avg_price",
                "realized_pnl",
                "last_trade_at",
                "version",
            ],
        ),
        (
            "risk",
            &[
                "account_id",
                "gross_exposure",
                "net_exposure",
                "open_positions",
                "largest_position_symbol",
                "largest_position_notional",
            ],
        ),
        (
            "eod",
            &[
                "account_id",
                "trading_day",
                "fills",
                "busts",
                "bought_qty",
                "sold_qty",
                "bought_notional",
                "sold_notional",
                "fees",
                "cash_in",
                "cash_out",
            ],
        ),
    ];
    for (name, columns) in required {
        let kind = client
            .query_one(
                "SELECT table_type FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = $1",
                &[&name],
            )
            .await
            .unwrap_or_else(|e| panic!("read name {name}: {e}"));
        assert_eq!(kind.get::<_, String>(0), "VIEW", "{name}");
        let have: BTreeSet<String> = client
            .query(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1",
                &[&name],
            )
            .await
            .expect("columns")
            .iter()
            .map(|r| r.get(0))
            .collect();
        for column in columns {
            assert!(have.contains(*column), "{name} lacks {column}: {have:?}");
        }
    }
    // Exact money: no floating-point column anywhere in the views' tables.
    let floats = read(
        &client,
        "SELECT table_name::text || '.' || column_name::text FROM information_schema.columns \
         WHERE table_schema = current_schema() AND data_type IN ('real', 'double precision')",
    )
    .await;
    assert!(floats.is_empty(), "{floats:?}");
}
