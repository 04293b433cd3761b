//! Portfolio's statement (an update and an insert where an upsert was), the rerun of the
//! rounds after the inbox's unique violation, and declared fields read in one pass, each equal
//! to what it replaced. Written by a review of three changes:
//!
//! - b233fcb: portfolio moves a position that exists with `UPDATE ... FROM` (the version
//!   filter is its condition) and opens a new one with `INSERT ... ON CONFLICT DO NOTHING`;
//!   `write` is a `SELECT` over both `RETURNING`s; notices read `pf_moved` and the stored row.
//! - 924cc9f: a unique violation of `projector.inbox` in the known-new statement reruns the
//!   rounds pipelined with the `ON CONFLICT` statement inside the savepoint rolled back to.
//! - 6bc4650: declared fields are read in one pass (`Members`) instead of a map.
//!
//! The portfolio is compared with the statement it replaced (the old SQL is kept below,
//! verbatim, as a view of its own in a second database): the same log, the same deliveries,
//! the same replays under the version filter, and the rows (as text), the notices (payload
//! text included), the dead letters, the counters and the dispositions must be identical.

use std::sync::Arc;

use crate::support::{offsets, rows, trail_of};
use projector_engine::projection::named_sql;
use projector_engine::testkit::{bust, consume, fill, EventSpec, Lcg, Partition, TestDb};
use projector_engine::{
    Applier, ApplySql, Batch, BatchOutcome, Counts, DedupMode, Disposition, Field, Projection,
    Registry, SourceOrdering,
};
use projector_views::events::FILL_EXECUTED;
use projector_views::Portfolio;

use Disposition::*;

const AT: &str = "2026-11-29T10:15:00Z";
const PF: &str = "portfolio_v1";

/// The portfolio view with the SQL of b233fcb's parent: LEFT JOIN for the position before
/// the event, one upsert with `WHERE version < EXCLUDED.version`.
#[derive(Debug, Clone, Copy)]
struct OldPortfolio(Portfolio);

fn old(section: &str) -> String {
    named_sql(OLD_PORTFOLIO_SQL, section)
        .expect(section)
        .to_owned()
}

/// Everything but the SQL is today's portfolio's: only the statements are compared.
impl Projection for OldPortfolio {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn version(&self) -> i32 {
        self.0.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.0.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        self.0.check_data(event)
    }
    fn dedup(&self) -> DedupMode {
        self.0.dedup()
    }
    fn fields(&self) -> Vec<Field> {
        // That code read fills at version 1, with their side.
        projector_views::previous::BeforeEventVersions::new(self.0).fields()
    }
    fn ddl(&self) -> String {
        old("ddl")
    }
    fn tables(&self) -> Vec<String> {
        self.0.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: old("ctes"),
            write: old("write"),
        }
    }
    fn notices_sql(&self) -> Option<String> {
        Some(old("notices"))
    }
    fn read_sql(&self) -> String {
        old("read")
    }
}

/// One database with one view and its applier on an ordered source.
struct Side {
    _db: TestDb,
    client: deadpool_postgres::Client,
    applier: Applier,
}

async fn side(view: impl Projection + Clone + 'static) -> Side {
    let registry = Registry::new().register(view.clone()).expect("registry");
    let db = TestDb::new(&registry).await;
    let client = db.client().await;
    let applier = Applier::new(Arc::new(view), SourceOrdering::PerAccount).expect("applier");
    Side {
        _db: db,
        client,
        applier,
    }
}

/// Everything a reader or an operator can see of a portfolio database, as text.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    rows: Vec<String>,
    notices: Vec<String>,
    dead_letters: Vec<String>,
    parked: Vec<String>,
    progress: Vec<String>,
}

async fn seen(client: &deadpool_postgres::Client, consumer: &str) -> Seen {
    let list = |sql: String| async move {
        client
            .query(&sql, &[])
            .await
            .expect("list")
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<String>>()
    };
    let table = consumer;
    Seen {
        rows: rows(client, table).await,
        notices: list(
            "SELECT concat_ws('|', consumer, kind, event_id, account_id, seq, payload::text) \
             FROM projector.notices ORDER BY event_id, kind"
                .to_owned(),
        )
        .await,
        dead_letters: list(format!(
            "SELECT concat_ws('|', kind, event_id, account_id, seq, error) \
             FROM projector.dead_letters WHERE consumer = '{consumer}' ORDER BY id"
        ))
        .await,
        parked: list(format!(
            "SELECT concat_ws('|', account_id, blocked_seq) FROM projector.parked_accounts \
             WHERE consumer = '{consumer}' ORDER BY account_id"
        ))
        .await,
        progress: list(format!(
            "SELECT concat_ws('|', account_id, last_seq, last_event_id) FROM projector.account_progress \
             WHERE consumer = '{consumer}' ORDER BY account_id"
        ))
        .await,
    }
}

fn total(outcomes: &[BatchOutcome]) -> Counts {
    let mut t = Counts::default();
    for o in outcomes {
        t += &o.counts;
    }
    t
}

fn kinds(outcomes: &[BatchOutcome]) -> Vec<(i64, Disposition)> {
    outcomes
        .iter()
        .flat_map(|o| o.dispositions.iter().copied())
        .collect()
}

fn at(seq: i64) -> String {
    format!("2026-11-29T{:02}:{:02}:00Z", 8 + seq / 60, seq % 60)
}

/// Per account, `per_account` trades in `seq` order from `from`: fills of varied scales in
/// three symbols, small enough quantities that positions close exactly and flip often, and
/// busts of earlier fills.
fn trades(rng: &mut Lcg, account: i64, from: i64, per_account: i64) -> Vec<EventSpec> {
    const SYMBOLS: [&str; 3] = ["EURUSD", "GBPUSD", "XAU"];
    const QTYS: [&str; 7] = ["1", "2.5", "10", "0.50", "3.000", "7", "12.25"];
    const PRICES: [&str; 6] = ["1.08420", "1.1", "0", "151.234", "2650.12", "0.333"];
    let mut fills: Vec<EventSpec> = Vec::new();
    let mut out = Vec::new();
    for seq in from..from + per_account {
        let e = if rng.chance(15) && !fills.is_empty() {
            bust(&fills[rng.below(fills.len())], seq, &at(seq))
        } else {
            let side = if rng.chance(50) { "buy" } else { "sell" };
            let e = fill(
                account,
                seq,
                &at(seq),
                SYMBOLS[rng.below(3)],
                side,
                QTYS[rng.below(QTYS.len())],
                PRICES[rng.below(PRICES.len())],
                "0",
            );
            fills.push(e.clone());
            e
        };
        out.push(e);
    }
    out
}

/// Interleaves the accounts' events, sends about one in eight after the account's next one
/// (so events wait and drain, in the same batch or a later one), and republishes about one
/// event in ten.
fn interleave(rng: &mut Lcg, mut per_account: Vec<Vec<EventSpec>>, log: &mut Partition) {
    let mut sent: Vec<EventSpec> = Vec::new();
    for list in &mut per_account {
        list.reverse();
    }
    loop {
        let open: Vec<usize> = (0..per_account.len())
            .filter(|&i| !per_account[i].is_empty())
            .collect();
        if open.is_empty() {
            break;
        }
        let list = &mut per_account[open[rng.below(open.len())]];
        let e = list.pop().expect("an event");
        if !list.is_empty() && rng.chance(12) {
            // Out of order: the next seq first; it waits, and drains when this one comes.
            let next = list.pop().expect("the next event");
            log.push_event(&next);
            sent.push(next);
        }
        log.push_event(&e);
        sent.push(e);
        if rng.chance(10) {
            log.push_event(&sent[rng.below(sent.len())].clone());
        }
    }
}

const FORGET: &str = "SET projector.inbox_layout = 'days'; \
     DELETE FROM projector.inbox WHERE consumer = 'portfolio_v1';
     DELETE FROM projector.account_progress WHERE consumer = 'portfolio_v1';
     DELETE FROM projector.offsets WHERE consumer = 'portfolio_v1';";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_update_insert_equals_the_old_upsert_under_replays_and_reused_ids() {
    for seed in [7_u64, 4242, 99] {
        let mut new = side(Portfolio::new(1)).await;
        let mut old = side(OldPortfolio(Portfolio::new(1))).await;
        let mut rng = Lcg(seed);
        let accounts: Vec<Vec<EventSpec>> = (1..=6).map(|a| trades(&mut rng, a, 1, 30)).collect();
        // Two reused ids: a producer gives a later event of another account an id the inbox
        // already has, with its time too (the inbox's key: skipped as an inbox duplicate,
        // through the pipelined retry).
        let mut accounts = accounts;
        for ((from, i), (to, j)) in [((0, 1), (4, 3)), ((1, 8), (5, 6))] {
            let original = accounts[from][i].clone();
            let mut reused = accounts[to][j].clone().with_id(&original.event_id);
            reused.occurred_at = original.occurred_at;
            accounts[to][j] = reused;
        }
        let mut log = Partition::new("trades", 0);
        interleave(&mut rng, accounts, &mut log);

        // Phase 1: the stream with its republishes.
        let o1 = consume(&new.applier, &mut new.client, &log, 7).await;
        let p1 = consume(&old.applier, &mut old.client, &log, 7).await;
        assert_eq!(kinds(&o1), kinds(&p1), "seed {seed}");
        assert_eq!(total(&o1), total(&p1), "seed {seed}");
        assert!(total(&o1).dup_inbox >= 2, "{:?}", total(&o1));
        assert!(total(&o1).drained > 0, "{:?}", total(&o1));
        assert_eq!(
            seen(&new.client, PF).await,
            seen(&old.client, PF).await,
            "seed {seed}"
        );

        // Phase 2: inbox, progress and offsets forgotten; the whole log again, then more
        // trades. Every old trade meets the version filter, the new ones move, open, close
        // and flip positions and announce it.
        for s in [&new, &old] {
            s.client.batch_execute(FORGET).await.expect("forget");
        }
        let more: Vec<Vec<EventSpec>> = (1..=6).map(|a| trades(&mut rng, a, 31, 12)).collect();
        interleave(&mut rng, more, &mut log);
        let o2 = consume(&new.applier, &mut new.client, &log, 11).await;
        let p2 = consume(&old.applier, &mut old.client, &log, 11).await;
        assert_eq!(kinds(&o2), kinds(&p2), "seed {seed}");
        assert_eq!(total(&o2), total(&p2), "seed {seed}");
        let t2 = total(&o2);
        assert!(t2.dup_version_filter >= 150, "{t2:?}");
        assert!(t2.applied >= 60, "{t2:?}");
        assert!(t2.notices > 0, "{t2:?}");
        let s = seen(&new.client, PF).await;
        assert!(s.dead_letters.is_empty(), "{:?}", s.dead_letters);
        assert_eq!(s, seen(&old.client, PF).await, "seed {seed}");
        assert_eq!(
            offsets(&new.client, PF).await.accounted(),
            log.log.len() as i64
        );
    }
}

/// The portfolio's rows without the time (its text depends on the session's time zone).
async fn positions(client: &deadpool_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT concat_ws(',', account_id, symbol, net_qty, avg_price, realized_pnl, version) \
             FROM portfolio_v1 ORDER BY account_id, symbol",
            &[],
        )
        .await
        .expect("positions")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn apply(s: &mut Side, b: &Batch) -> BatchOutcome {
    s.applier.apply(&mut s.client, b).await.expect("batch")
}

fn pf(account: i64, seq: i64, symbol: &str, side: &str, qty: &str, price: &str) -> EventSpec {
    fill(account, seq, AT, symbol, side, qty, price, "0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_events_the_version_filter_refuses_open_nothing_and_announce_nothing() {
    // Rows exist at versions 3 (A, closed by seq 3) and 2 (B); the account's progress and
    // the inbox are gone, so seq 1 to 3 reach the statement again. Each must write nothing:
    // not moved (version >= seq), not opened (the row exists: DO NOTHING), no notice for the
    // close at seq 3 a second time; seq 4 flips B and seq 5 opens C, as they would have.
    for view in [0, 1] {
        let mut s = if view == 0 {
            side(Portfolio::new(1)).await
        } else {
            side(OldPortfolio(Portfolio::new(1))).await
        };
        let events = [
            pf(1, 1, "A", "buy", "10", "1.5"),
            pf(1, 2, "B", "buy", "5", "2"),
            pf(1, 3, "A", "sell", "10", "1.75"),
            pf(1, 4, "B", "sell", "8", "2.5"),
            pf(1, 5, "C", "buy", "1.25", "3"),
        ];
        let log = Partition::from_events("trades", 0, &events[..3]);
        consume(&s.applier, &mut s.client, &log, 10).await;
        s.client.batch_execute(FORGET).await.expect("forget");
        let log = Partition::from_events("trades", 0, &events);
        let out = apply(&mut s, &log.batch(0, 10)).await;
        assert_eq!(
            out.dispositions.iter().map(|d| d.1).collect::<Vec<_>>(),
            [Applied; 5]
        );
        assert_eq!(
            (
                out.counts.dup_version_filter,
                out.counts.applied,
                out.counts.notices
            ),
            (3, 2, 1),
            "{:?}",
            out.counts
        );
        let seen = seen(&s.client, PF).await;
        assert_eq!(
            positions(&s.client).await,
            [
                "1,A,0,0.0000000000,2.5000000000,3",
                "1,B,-3,2.5000000000,2.5000000000,4",
                "1,C,1.25,3.0000000000,0,5",
            ],
            "view {view}"
        );
        assert_eq!(seen.notices.len(), 2, "{:?}", seen.notices);
        assert!(
            seen.notices[0].starts_with("portfolio_v1|position_closed|fill_executed-1-3|1|3|"),
            "{:?}",
            seen.notices
        );
        assert!(
            seen.notices[1].starts_with("portfolio_v1|position_flipped|fill_executed-1-4|1|4|")
                && seen.notices[1].contains(r#""net_qty": "-3""#)
                && seen.notices[1].contains(r#""net_qty_before": "5""#),
            "{:?}",
            seen.notices
        );
        assert!(seen.dead_letters.is_empty());
        assert_eq!(seen.progress, ["1|5|fill_executed-1-5"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_id_in_a_later_round_reruns_every_round_once_with_one_notice() {
    // Round 1 of the second batch succeeds in the known-new statement (and emits nothing),
    // round 2 meets the reused id: the rollback to projector_batch undoes round 1, the rerun
    // applies both rounds once, and the flip in round 2 is announced once. The savepoint
    // stays open exactly once for the bookkeeping's RELEASE: the batch commits, and the
    // next batch on the same connection runs the fast path again.
    for view in [0, 1] {
        let mut s = if view == 0 {
            side(Portfolio::new(1)).await
        } else {
            side(OldPortfolio(Portfolio::new(1))).await
        };
        let mut log = Partition::new("trades", 0);
        log.push_event(&pf(1, 1, "EURUSD", "buy", "10", "1.5").with_id("shared")); // 0
        let first = apply(&mut s, &log.batch(0, 10)).await;
        assert_eq!(first.counts.applied, 1);

        log.push_event(&pf(2, 1, "EURUSD", "buy", "10", "1.5")); // 1: round 1
        log.push_event(&pf(3, 1, "EURUSD", "sell", "1", "1.5")); // 2: round 1
        log.push_event(&pf(2, 2, "EURUSD", "sell", "15", "2")); // 3: round 2, flips
        log.push_event(&pf(3, 2, "EURUSD", "buy", "1", "1.5").with_id("shared")); // 4: reused
        let second = apply(&mut s, &log.batch(1, 10)).await;
        assert_eq!(
            second.dispositions.iter().map(|d| d.1).collect::<Vec<_>>(),
            [Applied; 4]
        );
        assert_eq!(
            (
                second.counts.applied,
                second.counts.dup_inbox,
                second.counts.dup_version_filter,
                second.counts.notices
            ),
            (3, 1, 0, 1),
            "{:?}",
            second.counts
        );

        log.push_event(&pf(3, 3, "EURUSD", "buy", "1", "1.5")); // 5: closes account 3
        log.push_event(&pf(1, 2, "EURUSD", "sell", "10", "1.5")); // 6: closes account 1
        let third = apply(&mut s, &log.batch(5, 10)).await;
        assert_eq!(
            (third.counts.applied, third.counts.notices),
            (2, 2),
            "{:?}",
            third.counts
        );
        assert_eq!(
            positions(&s.client).await,
            [
                "1,EURUSD,0,0.0000000000,0.0000000000,2",
                "2,EURUSD,-5,2.0000000000,5.0000000000,2",
                "3,EURUSD,0,0.0000000000,0.0000000000,3",
            ],
            "view {view}"
        );
        let seen = seen(&s.client, PF).await;
        let kinds: Vec<&str> = seen
            .notices
            .iter()
            .map(|n| n.split('|').nth(2).expect("event id"))
            .collect();
        assert_eq!(
            kinds,
            [
                "fill_executed-1-2",
                "fill_executed-2-2",
                "fill_executed-3-3"
            ],
            "{:?}",
            seen.notices
        );
        assert!(seen.dead_letters.is_empty() && seen.parked.is_empty());
        assert_eq!(
            seen.progress,
            [
                "1|2|fill_executed-1-2",
                "2|2|fill_executed-2-2",
                "3|3|fill_executed-3-3"
            ]
        );
        assert_eq!(offsets(&s.client, PF).await.accounted(), 7);
    }
}

fn tf(account: i64, seq: i64, qty: &str) -> EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_id_then_a_failure_and_its_correction_split_after_the_retry() {
    // The known-new statement fails on the reused id in round 1; the rerun with ON CONFLICT
    // passes round 1 and fails on the content error in round 2, so it rolls back to the same
    // savepoint again; the careful path dead-letters the bad event, the correction makes a
    // split (UNDO_BATCH_SAVEPOINT: rollback to and release the one savepoint), the passes
    // after it open their own.
    let (db, applier) = crate::support::trail_db().await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&tf(1, 1, "1").with_id("shared")); // 0
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("first");

    log.push_event(&tf(3, 1, "1").with_id("shared")); // 1: round 1, reused id
    log.push_event(&tf(2, 1, "1")); // 2: round 1
    log.push_event(&tf(2, 2, "1000000").with_id("bad")); // 3: round 2, fails its CHECK
    log.push_event(&tf(2, 2, "2").with_id("bad")); // 4: the correction, other bytes
    log.push_event(&tf(2, 3, "1")); // 5
    log.push_event(&tf(3, 2, "1")); // 6
    let out = applier
        .apply(&mut client, &log.batch(1, 10))
        .await
        .expect("second");
    assert_eq!(
        out.dispositions.iter().map(|d| d.1).collect::<Vec<_>>(),
        [Applied, Applied, DeadLettered, Applied, Applied, Applied]
    );
    assert_eq!(
        (out.counts.failed, out.counts.dup_inbox, out.counts.applied),
        (1, 1, 4),
        "{:?}",
        out.counts
    );
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1"));
    assert_eq!(trail_of(&client, 2).await.as_deref(), Some("1,2,3"));
    assert_eq!(trail_of(&client, 3).await.as_deref(), Some("2"));
    let s = seen(&client, "trail_v1").await;
    assert!(s.parked.is_empty(), "{:?}", s.parked);
    assert_eq!(
        s.progress,
        [
            "1|1|shared",
            "2|3|fill_executed-2-3",
            "3|2|fill_executed-3-2"
        ]
    );
    assert_eq!(offsets(&client, "trail_v1").await.accounted(), 7);
    // The connection is clean: the next batch runs and commits.
    log.push_event(&tf(3, 3, "1"));
    let next = applier
        .apply(&mut client, &log.batch(7, 10))
        .await
        .expect("third");
    assert_eq!(next.counts.applied, 1);
    assert_eq!(trail_of(&client, 3).await.as_deref(), Some("2,3"));
}

/// A raw envelope around `data`, for data no well-behaved producer would send.
fn envelope(event_type: &str, account: i64, seq: i64, data: &str) -> Vec<u8> {
    let head = serde_json::json!({
        "event_id": format!("{event_type}-{account}-{seq}"), "type": event_type,
        "account_id": account, "seq": seq, "occurred_at": AT,
    })
    .to_string();
    format!("{},\"data\":{data}}}", &head[..head.len() - 1]).into_bytes()
}

fn key(account: i64) -> Option<Vec<u8>> {
    Some(account.to_string().into_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portfolio_reads_escaped_and_nested_names_and_refuses_repeated_ones() {
    // Through the built-in types, check_data's typed structs run before extract_fields: a
    // repeated member is poison there (serde's duplicate field), whichever of them would win
    // in a map or in the visitor. Escaped names are the names they spell; a member nested in
    // another, or a name with a space, is not the declared one.
    let mut s = side(Portfolio::new(1)).await;
    let mut log = Partition::new("trades", 0);
    let cases = [
        r#"{"sym\u0062ol":"ESC","side":"buy","q\u0074y":"2","price":"1","x":{"qty":"999","symbol":"NO","price":"7"}}"#,
        r#"{"symbol":"A","symbol":"B","side":"buy","qty":"1","price":"1"}"#,
        r#"{"symbol":"C","side":"buy","qty":"1","price":"1","fee":null}"#,
        r#"{"symbol":"D","side":"buy","qty":"3","price":"1","symbol ":"E","qty ":"x"}"#,
        r#"{"symbol":"F","side":"buy","qty":"1","qty":"5","price":"1"}"#,
    ];
    for (i, data) in cases.iter().enumerate() {
        let account = i as i64 + 1;
        log.push_raw(key(account), envelope(FILL_EXECUTED, account, 1, data));
    }
    let out = apply(&mut s, &log.batch(0, 10)).await;
    assert_eq!(
        out.dispositions.iter().map(|d| d.1).collect::<Vec<_>>(),
        [Applied, DeadLettered, Applied, Applied, DeadLettered]
    );
    assert_eq!(
        positions(&s.client).await,
        [
            "1,ESC,2,1.0000000000,0,1",
            "3,C,1,1.0000000000,0,1",
            "4,D,3,1.0000000000,0,1",
        ]
    );
    let seen = seen(&s.client, PF).await;
    assert_eq!(seen.dead_letters.len(), 2, "{:?}", seen.dead_letters);
    assert!(
        seen.dead_letters[0].contains("duplicate field `symbol`"),
        "{:?}",
        seen.dead_letters
    );
    assert!(
        seen.dead_letters[1].contains("duplicate field `qty`"),
        "{:?}",
        seen.dead_letters
    );
}

/// A view of a type no built-in check knows: its declared fields are read by
/// `extract_fields` alone.
#[derive(Debug, Clone, Copy)]
struct Labels;

impl Projection for Labels {
    fn name(&self) -> &str {
        "labels"
    }
    fn version(&self) -> i32 {
        1
    }
    fn subscribes(&self) -> &[&str] {
        &["label_set"]
    }
    fn dedup(&self) -> DedupMode {
        DedupMode::Inbox
    }
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::Text("symbol"),
            Field::Decimal("qty"),
            Field::Text("note"),
        ]
    }
    fn ddl(&self) -> String {
        "CREATE TABLE IF NOT EXISTS labels_v{v} (
            account_id bigint NOT NULL, seq bigint NOT NULL,
            symbol text, qty numeric, note text,
            PRIMARY KEY (account_id, seq))"
            .to_owned()
    }
    fn tables(&self) -> Vec<String> {
        vec!["labels_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: String::new(),
            write: "INSERT INTO labels_v{v} SELECT account_id, seq, symbol, qty, note FROM ev RETURNING 1"
                .to_owned(),
        }
    }
    fn read_sql(&self) -> String {
        "SELECT account_id, seq, symbol, qty, note FROM labels_v{v}".to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_fields_of_a_custom_type_read_as_the_map_read_them() {
    // The map (HashMap<String, &RawValue>) and the visitor agree: the last of a repeated
    // name wins (so an invalid first value is never looked at, and a null last one means
    // absent), escaped names are the names they spell, nested members and names that only
    // look alike are not declared ones; the winning value's type decides poison.
    let mut s = side(Labels).await;
    let mut log = Partition::new("labels", 0);
    let cases: [(&str, Option<&str>); 9] = [
        (
            r#"{"symbol":"A","symbol":"B","qty":"1","qty":"2.50"}"#,
            Some("B|2.50|"),
        ),
        (
            r#"{"sym\u0062ol":"ESC","q\u0074y":3,"note":"n\"q"}"#,
            Some("ESC|3|n\"q"),
        ),
        (
            r#"{"x":{"symbol":"NO","qty":"9"},"note":null,"Symbol":"no","symbol ":"no"}"#,
            Some("||"),
        ),
        (r#"{"symbol":"A","symbol":null}"#, Some("||")),
        (r#"{"symbol":null,"symbol":"Z"}"#, Some("Z||")),
        (r#"{"qty":"x","qty":"1"}"#, Some("|1|")),
        (r#"{"qty":"1","qty":"x"}"#, None),
        (r#"{"symbol":1}"#, None),
        (r#"{"note":"a","note":{"b":1}}"#, None),
    ];
    for (i, (data, _)) in cases.iter().enumerate() {
        let account = i as i64 + 1;
        log.push_raw(key(account), envelope("label_set", account, 1, data));
    }
    let out = apply(&mut s, &log.batch(0, 20)).await;
    let expected: Vec<Disposition> = cases
        .iter()
        .map(|(_, r)| if r.is_some() { Applied } else { DeadLettered })
        .collect();
    assert_eq!(
        out.dispositions.iter().map(|d| d.1).collect::<Vec<_>>(),
        expected
    );
    let got: Vec<String> = s
        .client
        .query(
            "SELECT concat_ws('|', coalesce(symbol, ''), coalesce(qty::text, ''), coalesce(note, '')) \
             FROM labels_v1 ORDER BY account_id",
            &[],
        )
        .await
        .expect("labels")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let want: Vec<String> = cases
        .iter()
        .filter_map(|(_, r)| r.map(str::to_owned))
        .collect();
    assert_eq!(got, want);
}

/// The portfolio SQL before b233fcb (`git show b233fcb^:views/src/portfolio/portfolio.sql`), verbatim:
/// the LEFT JOIN + upsert the new UPDATE/INSERT pair is compared with.
const OLD_PORTFOLIO_SQL: &str = r##"-- portfolio: one row per (account, symbol): net quantity, average entry price, realized P&L.
-- The rules are in docs/views.md; every statement this view runs is in this file.
--
-- The view is order-dependent: the engine runs `ctes` + `write` once per round, and a round's
-- `ev` holds at most one event per account. So one statement moves each row by at most one
-- event, and the row's state before that event is simply the stored row.

-- name: ddl
CREATE TABLE IF NOT EXISTS portfolio_v{v} (
    account_id    bigint      NOT NULL,
    -- Byte order: a key compared on every upsert needs no locale.
    symbol        text        COLLATE "C" NOT NULL,
    -- Signed: long > 0, short < 0. A flat position keeps its row: it carries realized P&L.
    net_qty       numeric     NOT NULL,
    -- Always exactly 10 decimal places, so its text is the same whatever path set it.
    avg_price     numeric     NOT NULL CHECK (avg_price >= 0),
    realized_pnl  numeric     NOT NULL,
    last_trade_at timestamptz NOT NULL,
    -- The seq of the last event applied to this row; the version filter compares it.
    version       bigint      NOT NULL CHECK (version > 0),
    PRIMARY KEY (account_id, symbol)
)
-- A position is updated over and over: room on its page keeps each update HOT (no new
-- index entry, no index bloat).
WITH (fillfactor = 80);

-- name: ctes
-- A bust is booked as the reversing trade: the opposite side, the original's quantity and
-- price, no fee. s is the side as +1/-1, x > 0 the quantity, p the price.
pf_trade AS (
    SELECT ev.account_id,
           ev.seq,
           ev.occurred_at,
           ev.symbol AS symbol,
           CASE WHEN (ev.side = 'buy') = (ev.type = 'fill_executed') THEN 1 ELSE -1 END AS s,
           ev.qty AS x,
           ev.price AS p
    FROM ev
),
-- The position before the event: q, a, r. A symbol never traded is flat with nothing realized.
pf_before AS (
    SELECT t.*,
           coalesce(pv.net_qty, 0) AS q,
           coalesce(pv.avg_price, 0) AS a,
           coalesce(pv.realized_pnl, 0) AS r
    FROM pf_trade t
    LEFT JOIN portfolio_v{v} pv ON pv.account_id = t.account_id AND pv.symbol = t.symbol
),
pf_after AS (
    SELECT account_id, symbol, seq, occurred_at,
           q AS net_qty_before,
           q + s * x AS net_qty,
           CASE
               -- Opening or adding: the weighted average (|q| a + x p) / (|q| + x), rounded
               -- to 10 places half away from zero. round(n / d, 10) would round twice:
               -- numeric division already rounds its quotient to a scale of its choosing,
               -- and a quotient such as 0.12345678904999...9|5 rounds up to ...05 there and
               -- again to ...1 at 10 places. div() is exact (a truncated integer quotient),
               -- so floor((2 n 10^10 + d) / 2d) rounds once; n >= 0 (prices and averages
               -- are never negative), where half up is half away from zero. Multiplying by
               -- 1e-10 is exact and gives scale 10.
               WHEN q = 0 OR sign(q) = s THEN
                   div((abs(q) * a + x * p) * 20000000000 + (abs(q) + x), 2 * (abs(q) + x))
                       * 0.0000000001
               -- Reducing: what is left was bought at the same average.
               WHEN x < abs(q) THEN a
               -- Closed exactly: no position, no average.
               WHEN x = abs(q) THEN round(0::numeric, 10)
               -- Flipped: the new position was opened entirely at this price.
               ELSE round(p, 10)
           END AS avg_price,
           CASE
               WHEN q = 0 OR sign(q) = s THEN r
               -- The closed part c = min(|q|, x) realizes (p - a) per unit, sign-adjusted for
               -- shorts. Fees are not part of realized P&L (eod sums them).
               ELSE r + least(abs(q), x) * (p - a) * sign(q)
           END AS realized_pnl
    FROM pf_before
)

-- name: write
-- One event writes exactly one row, which is what lets the engine count the events the
-- version filter dropped as |ev| - |written|. It returns the row's key and version, so the
-- notices below come only from rows this statement really wrote.
INSERT INTO portfolio_v{v} (account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version)
SELECT account_id, symbol, net_qty, avg_price, realized_pnl, occurred_at, seq
FROM pf_after
ON CONFLICT (account_id, symbol) DO UPDATE SET
    net_qty       = EXCLUDED.net_qty,
    avg_price     = EXCLUDED.avg_price,
    realized_pnl  = EXCLUDED.realized_pnl,
    last_trade_at = EXCLUDED.last_trade_at,
    version       = EXCLUDED.version
-- The version filter: behind the inbox, a second line of defence that costs nothing. It is
-- valid only because an account's events arrive in seq order (the engine refuses this view
-- on an unordered source); an event at or below the row's version was already applied.
WHERE portfolio_v{v}.version < EXCLUDED.version
RETURNING account_id, symbol, version

-- name: notices
-- A position closed (back to flat) or flipped (long to short or back) by an event: a notice
-- for a relay to publish (docs/views.md). Only rows the write really created count (a row
-- the version filter kept out is not in `written`), and only events the engine marks `emit`:
-- the live version's, past what the version it replaced had applied. The unique key drops
-- a notice some version already emitted for the same event.
INSERT INTO projector.notices (view_name, consumer, kind, event_id, account_id, seq, payload)
SELECT 'portfolio', $1,
       CASE WHEN a.net_qty = 0 THEN 'position_closed' ELSE 'position_flipped' END,
       ev.event_id, a.account_id, a.seq,
       jsonb_build_object('symbol', a.symbol,
                          'net_qty_before', a.net_qty_before::text,
                          'net_qty', a.net_qty::text,
                          'realized_pnl', a.realized_pnl::text,
                          'occurred_at', a.occurred_at)
FROM written w
JOIN pf_after a ON a.account_id = w.account_id AND a.symbol = w.symbol AND a.seq = w.version
JOIN ev ON ev.account_id = a.account_id AND ev.seq = a.seq
WHERE ev.emit
  AND a.net_qty_before <> 0
  AND (a.net_qty = 0 OR sign(a.net_qty) <> sign(a.net_qty_before))
ON CONFLICT (view_name, kind, event_id) DO NOTHING
RETURNING 1

-- name: read
SELECT account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version
FROM portfolio_v{v}

"##;
