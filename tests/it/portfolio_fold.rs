//! Portfolio folds each account's run of a batch in one statement (`many_per_account`, a
//! recursive CTE in portfolio.sql), where it was applied in rounds of one event per account
//! because its average is rounded at every step. The fold must equal the events one at a
//! time, rounding, text and notices included.
//!
//! The references are the code in rounds (`PortfolioInRounds`, the statements before the
//! fold, fed the same batches) and the current code fed one event per batch. Each runs in a
//! database of its own as `portfolio_v1`, so that everything is compared as text: the rows,
//! the notices (whose unique key is the event, not the consumer), the dead letters, the
//! waiting events, the parked accounts, the progress rows, the inbox, the skips and the
//! counters.

use std::sync::Arc;

use crate::support::risk::{count_writes, trade, AT};
use crate::support::variant::Variant;
use crate::support::{applier, view_rows};
use projector_engine::apply::{InboxGuard, RUN_CAP};
use projector_engine::testkit::{
    bust, consume, consume_with_crashes, EventSpec, Lcg, Partition, TestDb,
};
use projector_engine::{Projection, Registry};
use projector_views::previous::PortfolioInRounds;
use projector_views::Portfolio;

/// The positions, as text.
const ROWS: &str = "SELECT account_id::text, symbol, net_qty::text, avg_price::text, \
       realized_pnl::text, last_trade_at::text, version::text \
     FROM portfolio_v{v} ORDER BY account_id, symbol COLLATE \"C\"";
/// The notices, per account in the order they were inserted (one event at a time inserts an
/// account's notices in seq order).
const NOTICES: &str = "SELECT account_id::text, seq::text, kind, event_id, payload::text \
     FROM projector.notices WHERE consumer = '{c}' ORDER BY account_id, id";
const DEAD: &str = "SELECT \"offset\"::text, kind, coalesce(account_id::text, '-'), \
       coalesce(seq::text, '-'), error, coalesce(resolution, 'open') \
     FROM projector.dead_letters WHERE consumer = '{c}' ORDER BY \"offset\", id";
const WAITING: &str = "SELECT account_id::text, seq::text, \"offset\"::text, event_id \
     FROM projector.waiting_events WHERE consumer = '{c}' ORDER BY 1, 2";
const PARKED: &str = "SELECT account_id::text, reason, blocked_seq::text \
     FROM projector.parked_accounts WHERE consumer = '{c}' ORDER BY 1";
const PROGRESS: &str =
    "SELECT account_id::text, last_seq::text, coalesce(watermark_seq::text, '-') \
     FROM projector.account_progress WHERE consumer = '{c}' ORDER BY 1";
const INBOX: &str =
    "SELECT event_id FROM projector.inbox WHERE consumer = '{c}' ORDER BY event_id COLLATE \"C\"";
const SKIPS: &str = "SELECT account_id::text, seq::text FROM projector.skips \
     WHERE consumer = '{c}' ORDER BY 1, 2";
const COUNTERS: &str = "SELECT sum(next_offset)::text, sum(applied)::text, sum(ignored)::text, \
       sum(duplicates)::text, sum(dead_lettered)::text, sum(waiting)::text, sum(drained)::text \
     FROM projector.offsets WHERE consumer = '{c}'";

/// What a consumer left behind, by name, as text.
type State = Vec<(&'static str, Vec<Vec<String>>)>;

async fn state(client: &deadpool_postgres::Client, view: &dyn Projection, counters: bool) -> State {
    let consumer = view.consumer();
    let mut out = Vec::new();
    for (name, sql) in [
        ("rows", ROWS),
        ("notices", NOTICES),
        ("dead letters", DEAD),
        ("waiting", WAITING),
        ("parked", PARKED),
        ("progress", PROGRESS),
        ("inbox", INBOX),
        ("skips", SKIPS),
        ("counters", COUNTERS),
    ] {
        if name == "counters" && !counters {
            continue;
        }
        let sql = sql.replace("{c}", &consumer);
        out.push((name, view_rows(client, view, &sql).await));
    }
    out
}

/// The first part in which two states differ, named, with both sides.
fn difference(left: &State, right: &State, what: &str) -> Result<(), String> {
    for ((name, l), (_, r)) in left.iter().zip(right) {
        if l != r {
            return Err(format!("{what}: {name} differ:\n{l:?}\n{r:?}"));
        }
    }
    Ok(())
}

/// Symbols that differ in case, a trailing space, normalization and byte order only.
const SYMBOLS: [&str; 6] = ["a", "A", "a ", "\u{e9}", "e\u{301}", "AB"];
/// Prices whose averages round (thirds, sevenths), a half that rounds at the 10th place,
/// zeros, extreme decimals.
const PRICES: [&str; 12] = [
    "0",
    "1",
    "1.0",
    "2.00",
    "0.3333333333",
    "1.08421",
    "0.12345678905",
    "7",
    "3",
    "0.00000000015",
    "0.0000000000000000000000000001",
    "79228162514264337593543950335",
];
const QTYS: [&str; 10] = [
    "1",
    "2",
    "3",
    "1.0",
    "2.00",
    "0.5",
    "7",
    "10",
    "3.000",
    "0.0000001",
];

/// One account's events, seq 1..=n: fills over few symbols (long runs of one position, with
/// opens, adds, reductions, exact closes and flips), busts of earlier fills.
fn account_events(rng: &mut Lcg, account: i64, n: i64) -> Vec<EventSpec> {
    let symbols: Vec<&str> = (0..1 + rng.below(3))
        .map(|_| SYMBOLS[rng.below(SYMBOLS.len())])
        .collect();
    let mut events = Vec::new();
    let mut unbusted: Vec<EventSpec> = Vec::new();
    for seq in 1..=n {
        if rng.chance(8) && !unbusted.is_empty() {
            let original = unbusted.remove(rng.below(unbusted.len()));
            events.push(bust(&original, seq, AT));
            continue;
        }
        let e = trade(
            account,
            seq,
            symbols[rng.below(symbols.len())],
            if rng.chance(50) { "buy" } else { "sell" },
            QTYS[rng.below(QTYS.len())],
            PRICES[rng.below(PRICES.len())],
        );
        unbusted.push(e.clone());
        events.push(e);
    }
    events
}

/// A log of `accounts` accounts' events, interleaved, with what a real log holds: events of
/// one account a little out of order (they wait for their gap), redeliveries, reused ids (of
/// an earlier event of the same account), and poison for portfolio (a negative price, which
/// fails when it sets an average: an open, an add or a flip) republished corrected later or
/// never.
fn messy_log(seed: u64, accounts: i64, per_account: i64) -> Vec<EventSpec> {
    let mut rng = Lcg(seed);
    let mut queues: Vec<Vec<EventSpec>> = (1..=accounts)
        .map(|a| account_events(&mut rng, a, per_account))
        .collect();
    for q in &mut queues {
        for i in 1..q.len() {
            if rng.chance(12) {
                q.swap(i - 1, i);
            }
        }
    }
    let mut next = vec![0usize; queues.len()];
    let mut out: Vec<EventSpec> = Vec::new();
    let mut corrections: Vec<(usize, EventSpec)> = Vec::new();
    loop {
        if let Some(k) = corrections.iter().position(|(at, _)| *at <= out.len()) {
            let (_, e) = corrections.remove(k);
            out.push(e);
            continue;
        }
        let open: Vec<usize> = (0..queues.len())
            .filter(|&a| next[a] < queues[a].len())
            .collect();
        if open.is_empty() {
            break;
        }
        let a = open[rng.below(open.len())];
        let e = queues[a][next[a]].clone();
        next[a] += 1;
        if rng.chance(7) && !out.is_empty() {
            out.push(out[rng.below(out.len())].clone());
        }
        let earlier: Vec<&EventSpec> = queues[a][..next[a] - 1]
            .iter()
            .filter(|p| p.seq < e.seq)
            .collect();
        if rng.chance(4) && !earlier.is_empty() {
            let id = earlier[rng.below(earlier.len())].event_id.clone();
            out.push(e.with_id(&id));
        } else if rng.chance(6) && e.event_type == "fill_executed" {
            let mut bad = e.clone();
            bad.data["price"] = "-1".into();
            out.push(bad);
            if rng.chance(60) {
                corrections.push((out.len() + rng.below(40), e));
            }
        } else {
            out.push(e);
        }
    }
    out.extend(corrections.into_iter().map(|(_, e)| e));
    out
}

/// Repairs until nothing is open or parked, in an order that depends on the offsets and
/// accounts alone: every dead letter skipped, every parked account's seq skipped and the
/// account drained.
async fn repair_all(
    applier: &projector_engine::Applier,
    client: &mut deadpool_postgres::Client,
    consumer: &str,
) {
    for _ in 0..50 {
        let open: Vec<i64> = client
            .query(
                "SELECT id FROM projector.dead_letters WHERE consumer = $1 AND resolved_at IS NULL \
                 ORDER BY \"offset\", id",
                &[&consumer],
            )
            .await
            .expect("dead letters")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let parked: Vec<(i64, i64)> = client
            .query(
                "SELECT account_id, blocked_seq FROM projector.parked_accounts WHERE consumer = $1 \
                 ORDER BY 1",
                &[&consumer],
            )
            .await
            .expect("parked")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if open.is_empty() && parked.is_empty() {
            return;
        }
        for id in open {
            let _ = applier.skip_dead_letter(client, id, "review", "test").await;
        }
        for (account, seq) in parked {
            let _ = applier
                .skip_seq(client, account, seq, "review", "test")
                .await;
            while applier
                .drain_account(client, account)
                .await
                .expect("drain")
                .1
            {}
        }
    }
    panic!("{consumer}: the repairs did not end");
}

/// One database holding `view` as the only version: its client and applier.
struct Side {
    _db: TestDb,
    client: deadpool_postgres::Client,
    view: Arc<dyn Projection>,
    applier: projector_engine::Applier,
}

async fn side(view: Arc<dyn Projection>, settings: &str) -> Side {
    let mut registry = Registry::new();
    registry.add(view.clone()).expect("register");
    let db = TestDb::new(&registry).await;
    let client = db.client().await;
    if !settings.is_empty() {
        client.batch_execute(settings).await.expect("settings");
    }
    count_writes(&client, &["portfolio_v1"]).await;
    Side {
        applier: applier(view.clone()),
        _db: db,
        client,
        view,
    }
}

async fn writes(client: &deadpool_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM row_writes", &[])
        .await
        .expect("writes")
        .get(0)
}

/// Messy streams (long runs of one position, rounding averages, flips and closes, busts,
/// case and normalization variants, gaps that wait and drain, redeliveries, reused ids,
/// poison and its corrections, crashes between apply and commit, then every repair) applied
/// in big batches by `folded`, in the same batches by the code in rounds, and one event per
/// batch by the current code. `settings` are set on each session first. Returns the first
/// difference: folded against rounds in everything, counters included; folded against one at
/// a time in everything but the counters (batches count differently).
async fn differential(
    folded: Arc<dyn Projection>,
    seed: u64,
    settings: &str,
) -> Result<(), String> {
    let mut f = side(folded, settings).await;
    let mut r = side(Arc::new(PortfolioInRounds::new(1)), settings).await;
    let mut s = side(Arc::new(Portfolio::new(1)), settings).await;
    let events = messy_log(seed, 5, 70);
    let mut rng = Lcg(seed ^ 0xf01d);
    let mut log = Partition::new("trades", 0);
    let mut i = 0;
    while i < events.len() {
        let n = [3, 20, 60, 150][rng.below(4)];
        for e in &events[i..(i + n).min(events.len())] {
            log.push_event(e);
        }
        i += n;
        let batch = [8, 40, 500][rng.below(3)];
        let mut crash_rng = Lcg(seed.wrapping_add(i as u64));
        consume_with_crashes(&f.applier, &mut f.client, &log, batch, |_| {
            crash_rng.chance(20)
        })
        .await;
        consume(&r.applier, &mut r.client, &log, batch).await;
        consume(&s.applier, &mut s.client, &log, 1).await;
        difference(
            &state(&f.client, &*f.view, true).await,
            &state(&r.client, &*r.view, true).await,
            &format!("seed {seed}, {i} events: folded vs in rounds"),
        )?;
        difference(
            &state(&f.client, &*f.view, false).await,
            &state(&s.client, &*s.view, false).await,
            &format!("seed {seed}, {i} events: folded vs one at a time"),
        )?;
    }
    // The log did hold what the test is about.
    let c = state(&f.client, &*f.view, true).await;
    let counters = &c.last().expect("counters").1[0];
    let (duplicates, dead, drained): (i64, i64, i64) = (
        counters[3].parse().expect("duplicates"),
        counters[4].parse().expect("dead letters"),
        counters[6].parse().expect("drained"),
    );
    let notices = c[1].1.len();
    assert!(
        duplicates > 0 && dead > 0 && drained > 0 && notices > 0,
        "seed {seed}: no duplicates, poison, notices, or nothing waited: {counters:?}, {notices}"
    );
    // The fold did take runs: fewer row writes than the rounds.
    let (wf, wr) = (writes(&f.client).await, writes(&r.client).await);
    assert!(
        wf * 4 < wr * 3,
        "seed {seed}: {wf} writes folded, {wr} in rounds"
    );
    for x in [&mut f, &mut r, &mut s] {
        repair_all(&x.applier, &mut x.client, &x.view.consumer()).await;
    }
    difference(
        &state(&f.client, &*f.view, true).await,
        &state(&r.client, &*r.view, true).await,
        &format!("seed {seed}, repaired: folded vs in rounds"),
    )?;
    difference(
        &state(&f.client, &*f.view, false).await,
        &state(&s.client, &*s.view, false).await,
        &format!("seed {seed}, repaired: folded vs one at a time"),
    )
}

/// The strong check (see [`differential`]) on two seeds (the generic plan's test below adds a
/// third; four made the suite's slowest test): the fold equals the events one at a
/// time everywhere, rounding, text and notices included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_big_batches_equal_one_event_at_a_time_everywhere() {
    for seed in [7u64, 10] {
        if let Err(e) = differential(Arc::new(Portfolio::new(1)), seed, "").await {
            panic!("{e}");
        }
    }
}

/// The same under the plan PostgreSQL caches (forced generic) and without sequential scans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_equals_one_event_at_a_time_under_the_generic_plan() {
    if let Err(e) = differential(
        Arc::new(Portfolio::new(1)),
        11,
        "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off",
    )
    .await
    {
        panic!("{e}");
    }
}

/// The comparison has teeth: a fold that starts every run from a flat position, or that
/// takes the stored row's scale away, is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_the_comparison_catches_a_broken_fold() {
    let mutants: [Vec<(&'static str, &'static str)>; 2] = [
        vec![("coalesce(r.stored_qty, 0) AS q", "0::numeric AS q")],
        vec![(
            "coalesce(r.stored_qty, 0) AS q",
            "coalesce(r.stored_qty, 0) + 0.0 AS q",
        )],
    ];
    for mutant in mutants {
        let label = format!("{mutant:?}");
        let mut caught = false;
        for seed in [7u64, 8] {
            if differential(
                Arc::new(Variant::of(Portfolio::new(1)).replacing(&mutant)),
                seed,
                "",
            )
            .await
            .is_err()
            {
                caught = true;
                break;
            }
        }
        assert!(caught, "{label} went unnoticed");
    }
}

/// `batch` after `pre`, folded in one batch and one event at a time, each in its own
/// database: both states (counters left out).
async fn one_batch_vs_one_at_a_time(
    view: Arc<dyn Projection>,
    pre: &[EventSpec],
    batch: &[EventSpec],
) -> (State, State) {
    let mut f = side(view.clone(), "").await;
    let mut s = side(view, "").await;
    let mut log = Partition::from_events("trades", 0, pre);
    consume(&f.applier, &mut f.client, &log, 1).await;
    consume(&s.applier, &mut s.client, &log, 1).await;
    for e in batch {
        log.push_event(e);
    }
    let outcomes = consume(&f.applier, &mut f.client, &log, 10_000).await;
    assert_eq!(outcomes.len(), 1, "one batch");
    consume(&s.applier, &mut s.client, &log, 1).await;
    (
        state(&f.client, &*f.view, false).await,
        state(&s.client, &*s.view, false).await,
    )
}

/// The hard cases, folded in one batch: averages that round at every step (thirds, a half at
/// the 10th place), adds, reductions, an exact close and a reopen, flips both ways (each a
/// notice, several in one run), a position opened and closed within the batch (its close
/// announced), a bust of a fill of the same batch, scales kept in text (10 then 10.50), extreme
/// decimals. The rows and the notices equal one event at a time, in text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_rounding_flips_and_closes_equal_one_event_at_a_time() {
    const BIG: &str = "79228162514264337593543950335";
    const TINY: &str = "0.0000000000000000000000000001";
    let pre = vec![
        trade(1, 1, "X", "buy", "10", "1"),
        trade(2, 1, "Y", "sell", "3", "2.5"),
        trade(4, 1, "X", "buy", BIG, "1"),
    ];
    let fill = trade(3, 3, "Z", "buy", "3", "2.0");
    let batch = vec![
        trade(1, 2, "X", "buy", "1", "0.3333333333"),
        trade(1, 3, "X", "buy", "2", "0.12345678905"),
        trade(1, 4, "X", "sell", "5", "2"),
        trade(1, 5, "X", "sell", "10.50", "3"),
        trade(1, 6, "X", "buy", "0.5", "1"),
        trade(1, 7, "X", "buy", "7", "0.00000000015"),
        trade(1, 8, "X", "sell", "3", "1"),
        trade(1, 9, "X", "sell", "9.0", "7"),
        trade(2, 2, "Y", "buy", "3", "1"),
        trade(2, 3, "Y", "buy", "1", "3"),
        trade(2, 4, "Y", "sell", "2", "2"),
        trade(3, 1, "Z", "buy", "1", "1"),
        trade(3, 2, "Z", "sell", "1", "2"),
        fill.clone(),
        bust(&fill, 4, AT),
        trade(3, 5, "Z", "sell", "1", "1"),
        trade(4, 2, "X", "buy", TINY, BIG),
        trade(4, 3, "X", "sell", BIG, TINY),
    ];
    let (folded, single) =
        one_batch_vs_one_at_a_time(Arc::new(Portfolio::new(1)), &pre, &batch).await;
    difference(&folded, &single, "folded vs one at a time").unwrap_or_else(|e| panic!("{e}"));
    let notices = &folded[1].1;
    assert!(
        notices.len() >= 6,
        "closes and flips announced: {notices:?}"
    );
}

/// An account with more events in one batch than a statement takes of one account
/// ([`RUN_CAP`]): 600 trades over two positions, with averages that round, flips and closes,
/// go in rounds of `RUN_CAP` in the batch's transaction, each folding from the rows the round
/// before wrote: every position row is written once per round (not once in all, which would
/// be one statement with a run whose cost grows as its square; not once per event), and the
/// rows and notices equal one event at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_a_run_past_the_cap_goes_in_rounds_and_equals_one_event_at_a_time() {
    let pre = vec![
        trade(4, 1, "X", "buy", "10", "1"),
        trade(4, 2, "Y", "sell", "3", "2.5"),
    ];
    // Account 4's run flips and closes often (account 1's would less: `long_run` shifts the
    // pattern by the account).
    let mut batch = long_run(4, 3..=602);
    batch.extend([
        trade(2, 1, "Z", "buy", "1", "1"),
        trade(2, 2, "Z", "buy", "2", "0.3333333333"),
        trade(2, 3, "Z", "sell", "4", "2"),
    ]);
    let view: Arc<dyn Projection> = Arc::new(Portfolio::new(1));
    let mut f = side(view.clone(), "").await;
    let mut s = side(view, "").await;
    let mut log = Partition::from_events("trades", 0, &pre);
    consume(&f.applier, &mut f.client, &log, 1).await;
    consume(&s.applier, &mut s.client, &log, 1).await;
    for e in &batch {
        log.push_event(e);
    }
    let before = writes(&f.client).await;
    let outcomes = consume(&f.applier, &mut f.client, &log, 10_000).await;
    assert_eq!(outcomes.len(), 1, "one batch");
    let written = writes(&f.client).await - before;
    consume(&s.applier, &mut s.client, &log, 1).await;
    let folded = state(&f.client, &*f.view, false).await;
    difference(
        &folded,
        &state(&s.client, &*s.view, false).await,
        "folded vs one at a time",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Account 4: 600 events in rounds of RUN_CAP, both of its rows written in each round;
    // account 2: one round, one row.
    let rounds = 600usize.div_ceil(RUN_CAP);
    assert!(rounds > 1, "the batch exceeds the cap");
    assert_eq!(
        written,
        i64::try_from(2 * rounds + 1).expect("writes"),
        "row writes of the batch"
    );
    assert!(
        folded[1].1.len() > 100,
        "flips and closes announced: {}",
        folded[1].1.len()
    );
}

/// portfolio with a price of 13 read as -13: an event that fails alone where it sets an
/// average (the decoder refuses negative prices, so no event of the built-in types fails
/// portfolio's statement by its content; this makes one).
/// `more` replaced too.
fn failing_at_13(more: &[(&str, &str)]) -> Variant {
    let mut replacements = vec![(
        "ev.price AS p",
        "CASE WHEN ev.price = 13 THEN -ev.price ELSE ev.price END AS p",
    )];
    replacements.extend_from_slice(more);
    Variant::of(Portfolio::new(1)).replacing(&replacements)
}

/// The contract of `many_per_account`: the statement fails wherever one of the run's events
/// would fail alone. A fill whose average would be negative opens a position (the CHECK
/// refuses it alone) and a later event of the same batch closes it exactly, which would make
/// the row valid again: folded, the run fails whole, the engine finds the event at fault, and
/// the dead letter (its error included), the waiting events and the rows equal one event at
/// a time. Without the check of the states before a run's last, the fold folds the event at
/// fault in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_an_event_at_fault_fails_folded_as_one_event_at_a_time() {
    let pre = vec![trade(1, 1, "X", "buy", "1", "1")];
    let batch = vec![
        trade(1, 2, "Y", "buy", "2", "13"),
        trade(1, 3, "Y", "sell", "2", "1"),
        trade(2, 1, "X", "buy", "1", "1"),
        trade(2, 2, "X", "buy", "1", "3"),
    ];
    let (folded, single) =
        one_batch_vs_one_at_a_time(Arc::new(failing_at_13(&[])), &pre, &batch).await;
    difference(&folded, &single, "folded vs one at a time").unwrap_or_else(|e| panic!("{e}"));
    let dead = &folded[2].1;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0][4].contains("check constraint"), "{dead:?}");
    assert_eq!(folded[3].1.len(), 1, "the close waits behind its gap");
    // The check has teeth.
    let unchecked = failing_at_13(&[
        ("net_qty = CASE WHEN l.ok THEN l.q END", "net_qty = l.q"),
        (
            "SELECT l.account_id, l.symbol, CASE WHEN l.ok THEN l.q END",
            "SELECT l.account_id, l.symbol, l.q",
        ),
    ]);
    let (folded, single) = one_batch_vs_one_at_a_time(Arc::new(unchecked), &pre, &batch).await;
    assert!(
        difference(&folded, &single, "").is_err(),
        "the unchecked fold folded the event at fault in: {folded:?}"
    );
}

/// The version filter in a fold: with the inbox and the progress of a consumer gone (rows
/// restored by hand, say), the whole log delivered again reaches the statement, and the
/// filter drops each event at or below its row's version, counted as the version filter's,
/// as one event at a time counts them; the events past it apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_the_version_filter_drops_and_counts_a_replayed_run() {
    let mut events: Vec<EventSpec> = (1..=6)
        .map(|seq| trade(1, seq, "X", "buy", "1", &seq.to_string()))
        .collect();
    events.extend((1..=3).map(|seq| trade(2, seq, "Y", "sell", "2", "1.5")));
    let next = trade(1, 7, "X", "sell", "2", "9");
    let (counts, rows) = replay_forgotten(&events, &next, 10_000).await;
    assert_eq!(counts, (9, 1), "one batch");
    let (counts, one_at_a_time) = replay_forgotten(&events, &next, 1).await;
    assert_eq!(counts, (9, 1), "batches of 1");
    assert_eq!(rows, one_at_a_time);
}

/// `events` consumed in batches of `batch_len` by a fresh portfolio version; then its inbox
/// and progress forgotten and its offsets set back to the start (rows restored by hand, say),
/// `next` published, and the whole log consumed again in batches of `batch_len`: the events
/// the version filter dropped, those applied, and the rows.
async fn replay_forgotten(
    events: &[EventSpec],
    next: &EventSpec,
    batch_len: usize,
) -> ((u64, u64), Vec<Vec<String>>) {
    let mut x = side(Arc::new(Portfolio::new(1)), "").await;
    let mut log = Partition::from_events("trades", 0, events);
    consume(&x.applier, &mut x.client, &log, batch_len).await;
    x.client
        .batch_execute(
            "SET projector.inbox_layout = 'days'; DELETE FROM projector.inbox; \
             DELETE FROM projector.account_progress; \
             UPDATE projector.offsets SET next_offset = 0",
        )
        .await
        .expect("forget");
    log.push_event(next);
    let outcomes = consume(&x.applier, &mut x.client, &log, batch_len).await;
    let counts = outcomes.iter().fold((0, 0), |(f, a), o| {
        (f + o.counts.dup_version_filter, a + o.counts.applied)
    });
    (counts, view_rows(&x.client, &*x.view, ROWS).await)
}

// From a review of f51e75a (RUN_CAP: an account's run past the cap goes in rounds of
// `RUN_CAP` in the batch's transaction). What a round boundary could break: the event at
// fault found and the rounds before it undone, the fast path's plain insert meeting a
// reused id in a later round, a gap in the run (it waits, then drains in rounds), the
// version filter's count per statement, a redelivered batch.

/// Account `account`'s fills with `seq` in `seqs`, over X and Y, flipping and closing often,
/// with averages that round; no price is 13 (see [`failing_at_13`]).
fn long_run(account: i64, seqs: std::ops::RangeInclusive<i64>) -> Vec<EventSpec> {
    let qtys = ["1", "2", "0.5", "3", "7", "10.50", "13"];
    seqs.map(|seq| {
        let i = usize::try_from(seq).expect("seq") + usize::try_from(account).expect("account");
        let symbol = if seq % 3 == 0 { "Y" } else { "X" };
        let side = if (i / 3) % 2 == 0 { "buy" } else { "sell" };
        let price = format!("{}.{:05}", 1 + i % 5, (i * 7919) % 100_000);
        trade(account, seq, symbol, side, qtys[i % 9 % qtys.len()], &price)
    })
    .collect()
}

/// Events at fault around the round boundary, one account each, all in one batch: the
/// account's `at`-th event of the batch opens a position at a negative average (the CHECK
/// refuses it alone) and the next one closes it exactly (the row valid again). At 256 (the
/// last of round 1, its close the first of round 2) and 257 (the first of round 2, after a
/// round 1 that ran); and an account of clean events past the cap beside them. The dead
/// letters, the waiting events, the parks, the progress, the inbox, the rows and the notices
/// equal one event at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_events_at_fault_around_the_cap_fail_as_one_event_at_a_time() {
    assert_eq!(RUN_CAP, 256, "the positions below are chosen for this cap");
    let at_fault = [(2, 256usize), (3, 257)];
    let mut pre = Vec::new();
    let mut batch = Vec::new();
    for &(account, at) in &at_fault {
        pre.push(trade(account, 1, "X", "buy", "10", "1"));
        let mut run = long_run(account, 2..=265);
        let bad = i64::try_from(at).expect("at") + 1;
        run[at - 1] = trade(account, bad, "Z", "buy", "2", "13");
        run[at] = trade(account, bad + 1, "Z", "sell", "2", "1");
        batch.extend(run);
    }
    pre.push(trade(5, 1, "X", "buy", "10", "1"));
    batch.extend(long_run(5, 2..=265));
    let view: Arc<dyn Projection> = Arc::new(failing_at_13(&[]));
    let (folded, single) = one_batch_vs_one_at_a_time(view.clone(), &pre, &batch).await;
    // What the batch counts: the rounds of the fast path that ran before the failing one were
    // undone, not kept (the careful path would then find their events in the inbox and count
    // them as duplicates).
    let mut c = side(view, "").await;
    let mut log = Partition::from_events("trades", 0, &pre);
    consume(&c.applier, &mut c.client, &log, 1).await;
    for e in &batch {
        log.push_event(e);
    }
    let out = consume(&c.applier, &mut c.client, &log, 10_000).await;
    assert_eq!(out.len(), 1, "one batch");
    let n = &out[0].counts;
    assert_eq!(
        (
            n.applied,
            n.failed,
            n.waiting,
            n.dup_inbox,
            n.dup_version_filter
        ),
        (255 + 256 + 264, 2, 8 + 7, 0, 0),
        "{n:?}"
    );
    difference(&folded, &single, "folded vs one at a time").unwrap_or_else(|e| panic!("{e}"));
    let dead = &folded[2].1;
    assert_eq!(
        dead.len(),
        2,
        "one dead letter per account at fault: {dead:?}"
    );
    let mut seqs: Vec<(&str, &str)> = dead
        .iter()
        .map(|d| (d[2].as_str(), d[3].as_str()))
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [("2", "257"), ("3", "258")], "{dead:?}");
    let parked = &folded[4].1;
    assert_eq!(parked.len(), 2, "{parked:?}");
    let progress = &folded[5].1;
    assert_eq!(
        progress.iter().map(|p| p[1].as_str()).collect::<Vec<_>>(),
        ["256", "257", "265"],
        "{progress:?}"
    );
}

/// Reused ids in a run past the cap: the 400th event of account 1's run reuses the id of an
/// event an earlier batch applied (the fast path's plain insert fails in round 2, after round
/// 1 ran; the rounds run again with `ON CONFLICT`, from the savepoint), and the 450th reuses
/// the id of the batch's 10th (a repeat, never sent). Once committed at the first delivery,
/// once after a crash between apply and commit (delivered again). Each reused id is skipped
/// once, everything else is applied once: rows, notices, inbox, progress and the counts equal
/// one event at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_reused_ids_past_the_cap_are_skipped_once_as_one_event_at_a_time() {
    let view: Arc<dyn Projection> = Arc::new(Portfolio::new(1));
    let pre = long_run(1, 1..=3);
    let mut batch = long_run(1, 4..=603);
    let earlier = pre[1].event_id.clone();
    let in_batch = batch[9].event_id.clone();
    batch[399] = batch[399].clone().with_id(&earlier);
    batch[449] = batch[449].clone().with_id(&in_batch);
    batch.extend(long_run(2, 1..=5));
    let mut log = Partition::from_events("trades", 0, &pre);
    let mut sides = Vec::new();
    for _ in 0..3 {
        let mut x = side(view.clone(), "").await;
        consume(&x.applier, &mut x.client, &log, 1).await;
        sides.push(x);
    }
    for e in &batch {
        log.push_event(e);
    }
    let sum = |o: &[projector_engine::BatchOutcome]| {
        o.iter().fold((0, 0, 0, 0), |(a, i, v, n), o| {
            (
                a + o.counts.applied,
                i + o.counts.dup_inbox,
                v + o.counts.dup_version_filter,
                n + o.counts.notices,
            )
        })
    };
    let s = sides.pop().expect("one at a time");
    let mut s = s;
    let single_out = consume(&s.applier, &mut s.client, &log, 1).await;
    assert_eq!(
        sum(&single_out).0,
        603,
        "every event but the two reused ids"
    );
    assert_eq!(sum(&single_out).1, 2, "each reused id skipped once");
    let single = state(&s.client, &*s.view, false).await;
    for (crash, mut f) in [false, true].into_iter().zip(sides) {
        assert_eq!(f.applier.first_try(), Some(InboxGuard::Fail));
        let out =
            consume_with_crashes(&f.applier, &mut f.client, &log, 10_000, |n| crash && n == 0)
                .await;
        assert_eq!(out.len(), 1, "one batch, committed once (crash {crash})");
        assert_eq!(
            f.applier.first_try(),
            Some(InboxGuard::Skip),
            "the plain insert met the reused id and the rounds ran again with ON CONFLICT"
        );
        assert_eq!(
            sum(&out),
            sum(&single_out),
            "applied, dup_inbox, dup_version_filter, notices (crash {crash})"
        );
        difference(
            &state(&f.client, &*f.view, false).await,
            &single,
            &format!("folded (crash {crash}) vs one at a time"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A gap in a run past the cap: 699 events of one account but its 300th; 299 apply (two
/// rounds) and 400 wait, parked. The missing event comes in a later batch with a few more:
/// the account drains 400 waiting events and the batch's in rounds of the cap. The reference
/// is the code in rounds (one event per account per round) fed the same batches: rows,
/// notices, waiting events, parks, progress, inbox and counters equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_a_gap_in_a_run_past_the_cap_waits_then_drains_in_rounds() {
    let all = long_run(1, 1..=710);
    let mut f = side(Arc::new(Portfolio::new(1)), "").await;
    let mut r = side(Arc::new(PortfolioInRounds::new(1)), "").await;
    let mut log = Partition::new("trades", 0);
    for e in all[..700].iter().filter(|e| e.seq != 300) {
        log.push_event(e);
    }
    let mut outs = consume(&f.applier, &mut f.client, &log, 10_000).await;
    consume(&r.applier, &mut r.client, &log, 10_000).await;
    assert_eq!(outs.len(), 1);
    assert_eq!((outs[0].counts.applied, outs[0].counts.waiting), (299, 400));
    difference(
        &state(&f.client, &*f.view, true).await,
        &state(&r.client, &*r.view, true).await,
        "parked: folded vs in rounds",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    log.push_event(&all[299]);
    for e in &all[700..] {
        log.push_event(e);
    }
    let before = writes(&f.client).await;
    outs.extend(consume(&f.applier, &mut f.client, &log, 10_000).await);
    consume(&r.applier, &mut r.client, &log, 10_000).await;
    assert_eq!(outs.len(), 2);
    assert_eq!((outs[1].counts.applied, outs[1].counts.drained), (411, 400));
    // 411 events of one account: two rounds, each writing both of its rows.
    assert_eq!(
        writes(&f.client).await - before,
        4,
        "row writes of the drain"
    );
    let state_f = state(&f.client, &*f.view, true).await;
    difference(
        &state_f,
        &state(&r.client, &*r.view, true).await,
        "drained: folded vs in rounds",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        state_f[3].1.is_empty() && state_f[4].1.is_empty(),
        "nothing waits"
    );
    assert!(!state_f[1].1.is_empty(), "flips and closes announced");
}

/// The version filter across rounds: the inbox and progress forgotten, a run of 600 events
/// of one position replayed in one batch reaches the statement in three rounds, each
/// dropping its events at or below the row's version and counting them (|ev| - |written|
/// per statement); the one new event applies. As batches under the cap count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_the_version_filter_counts_a_replayed_run_past_the_cap() {
    let events: Vec<EventSpec> = long_run(1, 1..=600);
    let next = trade(1, 601, "X", "sell", "2", "9");
    let (counts, rows) = replay_forgotten(&events, &next, 10_000).await;
    assert_eq!(counts, (600, 1), "one batch");
    let (counts, under_the_cap) = replay_forgotten(&events, &next, 100).await;
    assert_eq!(counts, (600, 1), "batches of 100");
    assert_eq!(rows, under_the_cap);
}

/// Notices across round boundaries: the last event of round 1 flips the position (its
/// position before is the step before it, in the round), the first of round 2 flips it back
/// (its position before is the row round 1 wrote, as stored), and the first of round 3
/// closes it exactly. Each is announced once, with the position before as one event at a
/// time gives it, and the rows and notices equal one event at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_flips_and_a_close_at_round_boundaries_are_announced_once() {
    assert_eq!(RUN_CAP, 256, "the positions below are chosen for this cap");
    let pre = vec![trade(1, 1, "X", "buy", "10", "1")];
    // The batch's n-th event is seq n + 1.
    let batch: Vec<EventSpec> = (2..=530)
        .map(|seq: i64| match seq {
            257 => trade(1, seq, "X", "sell", "300", "2"),
            258 => trade(1, seq, "X", "buy", "100.0", "1.5"),
            514 => trade(1, seq, "X", "sell", "320.0", "3"),
            s if s < 257 => trade(1, seq, "X", "buy", "1", "1.25"),
            _ => trade(1, seq, "X", "buy", "1", "0.3333333333"),
        })
        .collect();
    let (folded, single) =
        one_batch_vs_one_at_a_time(Arc::new(Portfolio::new(1)), &pre, &batch).await;
    difference(&folded, &single, "folded vs one at a time").unwrap_or_else(|e| panic!("{e}"));
    let notices: Vec<(String, String, String)> = folded[1]
        .1
        .iter()
        .map(|n| {
            let payload: serde_json::Value = serde_json::from_str(&n[4]).expect("payload");
            (
                n[1].clone(),
                n[2].clone(),
                payload["net_qty_before"]
                    .as_str()
                    .expect("net_qty_before")
                    .to_owned(),
            )
        })
        .collect();
    let expected = [
        ("257", "position_flipped", "265"),
        ("258", "position_flipped", "-35"),
        ("514", "position_closed", "320.0"),
    ];
    assert_eq!(
        notices,
        expected.map(|(s, k, b)| (s.to_owned(), k.to_owned(), b.to_owned())),
        "{:?}",
        folded[1].1
    );
}

/// A repair that drains a run past the cap: the 100th event of a 399-event run fails (its
/// account parks, 299 wait); skipping the dead letter and draining the account sends the 299
/// waiting events through the same rounds (`repair`), in rounds of the cap. Before and after
/// the repair, everything but the counters equals one event at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_fold_a_repair_drains_a_run_past_the_cap_as_one_event_at_a_time() {
    let view: Arc<dyn Projection> = Arc::new(failing_at_13(&[]));
    let pre = vec![trade(1, 1, "X", "buy", "10", "1")];
    let mut batch = long_run(1, 2..=400);
    batch[99] = trade(1, 101, "Z", "buy", "2", "13");
    batch[100] = trade(1, 102, "Z", "sell", "2", "1");
    let mut f = side(view.clone(), "").await;
    let mut s = side(view, "").await;
    let mut log = Partition::from_events("trades", 0, &pre);
    consume(&f.applier, &mut f.client, &log, 1).await;
    consume(&s.applier, &mut s.client, &log, 1).await;
    for e in &batch {
        log.push_event(e);
    }
    consume(&f.applier, &mut f.client, &log, 10_000).await;
    consume(&s.applier, &mut s.client, &log, 1).await;
    let parked = state(&f.client, &*f.view, false).await;
    assert_eq!(parked[3].1.len(), 299, "waiting");
    difference(
        &parked,
        &state(&s.client, &*s.view, false).await,
        "parked: folded vs one at a time",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let before = writes(&f.client).await;
    for x in [&mut f, &mut s] {
        repair_all(&x.applier, &mut x.client, &x.view.consumer()).await;
    }
    // The drain: 299 events in two rounds; the first writes Z (opened short by the close
    // that waited behind the event at fault), X and Y, the second X and Y.
    assert_eq!(
        writes(&f.client).await - before,
        5,
        "row writes of the drain"
    );
    let repaired = state(&f.client, &*f.view, false).await;
    assert!(repaired[3].1.is_empty(), "nothing waits");
    assert_eq!(repaired[5].1[0][1], "400", "progress");
    difference(
        &repaired,
        &state(&s.client, &*s.view, false).await,
        "repaired: folded vs one at a time",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}
