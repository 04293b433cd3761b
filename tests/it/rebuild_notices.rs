//! Side effects only from the live version (the seed's incident: 1,847 duplicate orders).
//! Portfolio emits a notice when an event closes or flips a position. Replaying history into
//! a new version emits nothing; after cutover the new version emits and the old one does
//! not; and around the cutover every notice-worthy event is announced exactly once, whichever
//! version applied it first.

use std::sync::Arc;

use projector_engine::testkit::{consume, fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Projection, Registry, SourceOrdering};
use projector_views::Portfolio;

const AT: &str = "2026-11-29T10:15:00Z";

/// Per account: buy 10, sell 10 (closes), sell 5 (opens short), buy 8 (flips long).
fn account(account: i64, from_seq: i64) -> Vec<EventSpec> {
    let f = |seq, side, qty| fill(account, seq, AT, "EURUSD", side, qty, "1.5", "0");
    vec![
        f(from_seq, "buy", "10"),
        f(from_seq + 1, "sell", "10"),
        f(from_seq + 2, "sell", "5"),
        f(from_seq + 3, "buy", "8"),
    ]
}

/// The events that close or flip a position in `account`'s script: its 2nd and 4th.
fn notice_worthy(events: &[EventSpec]) -> Vec<String> {
    let mut ids: Vec<String> = events
        .iter()
        .filter(|e| (e.seq - 1) % 4 == 1 || (e.seq - 1) % 4 == 3)
        .map(|e| e.event_id.clone())
        .collect();
    ids.sort();
    ids
}

async fn notices(client: &deadpool_postgres::Client) -> Vec<(String, String, String)> {
    client
        .query(
            "SELECT consumer, kind, event_id FROM projector.notices ORDER BY event_id",
            &[],
        )
        .await
        .expect("notices")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_live_version_emits_and_each_event_is_announced_once() {
    let registry = Registry::new()
        .register(Portfolio::new(1))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let v1 = Applier::new(Arc::new(Portfolio::new(1)), SourceOrdering::PerAccount).expect("v1");
    let v2_view: Arc<dyn Projection> = Arc::new(Portfolio::new(2));
    let v2 = Applier::new(v2_view.clone(), SourceOrdering::PerAccount).expect("v2");

    // History: two accounts, each closing and flipping once. v1 is live and announces it.
    let mut history = account(1, 1);
    history.extend(account(2, 1));
    let mut log = Partition::from_events("fills", 0, &history);
    consume(&v1, &mut client, &log, 3).await;
    let announced = notices(&client).await;
    assert_eq!(
        announced.iter().map(|n| n.2.clone()).collect::<Vec<_>>(),
        notice_worthy(&history)
    );
    assert!(announced.iter().all(|n| n.0 == "portfolio_v1"));
    assert_eq!(
        announced
            .iter()
            .filter(|n| n.1 == "position_closed")
            .count(),
        2
    );

    // v2 is built from the same history: it replays every close and flip and emits nothing.
    client
        .execute(
            "INSERT INTO projector.views (name, version, state, fingerprint) \
             VALUES ('portfolio', 2, 'building', $1)",
            &[&projector_engine::fingerprint::of(&*v2_view)],
        )
        .await
        .expect("register v2");
    client
        .batch_execute(&projector_engine::projection::render(
            &*v2_view,
            &v2_view.ddl(),
        ))
        .await
        .expect("v2 tables");
    let outcomes = consume(&v2, &mut client, &log, 3).await;
    assert_eq!(outcomes.iter().map(|o| o.counts.notices).sum::<u64>(), 0);
    assert_eq!(
        notices(&client).await,
        announced,
        "a replay sends nothing again"
    );

    // More events arrive; v1 applies account 3's close before the cutover, v2 does not yet.
    let more = account(3, 1);
    for e in &more {
        log.push_event(e);
    }
    let before_cutover = log.log.len() - 2;
    let mut partial = log.clone();
    partial.log.truncate(before_cutover);
    consume(&v1, &mut client, &partial, 10).await;

    projector_rebuild::cutover::cutover(
        &mut client,
        &projector_views_registry(),
        "portfolio",
        2,
        None,
    )
    .await
    .expect("cutover");

    // After the cutover v1 (retired, still running somewhere for a moment) applies the rest
    // and emits nothing; v2 catches up: it does not announce account 3's close again (v1
    // did), and it announces the flip, which v1 never applied while live.
    consume(&v1, &mut client, &log, 10).await;
    consume(&v2, &mut client, &log, 10).await;
    let all = notices(&client).await;
    let mut every: Vec<EventSpec> = history.clone();
    every.extend(more.clone());
    assert_eq!(
        all.iter().map(|n| n.2.clone()).collect::<Vec<_>>(),
        notice_worthy(&every),
        "every close and flip announced exactly once"
    );
    let by = |id: &str| all.iter().find(|n| n.2 == id).map(|n| n.0.clone());
    assert_eq!(by(&more[1].event_id).as_deref(), Some("portfolio_v1"));
    assert_eq!(by(&more[3].event_id).as_deref(), Some("portfolio_v2"));

    // And from now on only v2 emits.
    let later = account(4, 1);
    for e in &later {
        log.push_event(e);
    }
    consume(&v1, &mut client, &log, 10).await;
    consume(&v2, &mut client, &log, 10).await;
    let latest = notices(&client).await;
    for e in notice_worthy(&later) {
        let who: Vec<&String> = latest.iter().filter(|n| n.2 == e).map(|n| &n.0).collect();
        assert_eq!(who, ["portfolio_v2"], "{e}");
    }
}

fn projector_views_registry() -> Registry {
    Registry::new()
        .register(Portfolio::new(1))
        .expect("registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_carries_the_position_before_and_after_as_stored() {
    // The position before the event is read as it was stored (its text keeps the stored
    // scale), not recomputed from the position after it: 10 - 10.50 + 10.50 would read
    // "10.00". A flip and a close, each in a round of its own, and a position opened by a
    // first fill, which was flat before and announces nothing.
    let (db, v1) = crate::support::applier_db(Portfolio::new(1)).await;
    let mut client = db.client().await;
    let f = |seq, side, qty| fill(7, seq, AT, "EURUSD", side, qty, "1.5", "0");
    let events = vec![f(1, "buy", "10"), f(2, "sell", "10.50"), f(3, "buy", "0.5")];
    let log = Partition::from_events("fills", 0, &events);
    consume(&v1, &mut client, &log, 3).await;
    let rows: Vec<(String, i64, serde_json::Value)> = client
        .query(
            "SELECT kind, seq, payload FROM projector.notices ORDER BY seq",
            &[],
        )
        .await
        .expect("notices")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let expect = |kind: &str, seq: i64, before: &str, after: &str, pnl: &str| {
        (
            kind.to_owned(),
            seq,
            serde_json::json!({
                "symbol": "EURUSD",
                "net_qty_before": before,
                "net_qty": after,
                "realized_pnl": pnl,
                "occurred_at": "2026-11-29T10:15:00+00:00",
            }),
        )
    };
    assert_eq!(
        rows[0],
        expect("position_flipped", 2, "10", "-0.50", "0.0000000000")
    );
    assert_eq!(
        rows[1],
        expect("position_closed", 3, "-0.50", "0.00", "0.000000000000")
    );
}
