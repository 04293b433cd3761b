//! `projector reconcile`: a view fed events (duplicates included) against a write-side table
//! of the same events matches; a planted difference is caught and its window named.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use projector_engine::testkit::{consume, fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, ApplySql, DedupMode, Projection, Registry, SourceOrdering};
use projector_ops::reconcile::{reconcile, ReconcileSpec};

use crate::support::process::run_to_end;

/// Fills per minute: a flow view with a time column, the shape reconcile compares.
#[derive(Debug, Clone)]
struct Flow;

impl Projection for Flow {
    fn name(&self) -> &str {
        "flow"
    }
    fn version(&self) -> i32 {
        1
    }
    fn subscribes(&self) -> &[&str] {
        &["fill_executed"]
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        // The built-in types' rules, which the engine applied itself before they left it.
        projector_views::events::check_rules(event)
    }
    fn dedup(&self) -> DedupMode {
        DedupMode::Inbox
    }
    fn order_independent(&self) -> bool {
        true
    }
    fn ddl(&self) -> String {
        "CREATE TABLE IF NOT EXISTS flow_v{v} (
            minute timestamptz PRIMARY KEY, fills bigint NOT NULL, qty numeric NOT NULL)"
            .to_owned()
    }
    fn tables(&self) -> Vec<String> {
        vec!["flow_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: "m AS (SELECT date_bin('1 minute', occurred_at, timestamptz '2000-01-01') AS minute, \
                           count(*) AS fills, sum((data->>'qty')::numeric) AS qty \
                    FROM ev GROUP BY 1)"
                .to_owned(),
            write: "INSERT INTO flow_v{v} AS x (minute, fills, qty) SELECT minute, fills, qty FROM m \
                    ON CONFLICT (minute) DO UPDATE SET fills = x.fills + EXCLUDED.fills, \
                    qty = x.qty + EXCLUDED.qty RETURNING 1"
                .to_owned(),
        }
    }
    fn read_sql(&self) -> String {
        "SELECT minute, fills, qty FROM flow_v{v}".to_owned()
    }
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 28, 22, 0, 0)
        .single()
        .expect("time")
}

/// 300 fills every 47 seconds from 22:00 on 28 November (past midnight into the 29th), buys
/// and sells, odd decimals.
fn events() -> Vec<EventSpec> {
    (0..300i64)
        .map(|i| {
            let at = (t0() + chrono::Duration::seconds(i * 47)).to_rfc3339();
            let side = if i % 3 == 0 { "sell" } else { "buy" };
            let qty = format!("{}.{:03}", 1 + i % 17, (i * 37) % 1000);
            fill(
                i % 7 + 1,
                i / 7 + 1,
                &at,
                "EURUSD",
                side,
                &qty,
                "1.08420",
                "0.25",
            )
        })
        .collect()
}

/// The write side: one row per event, as a trading system would keep its fills.
async fn write_side(client: &deadpool_postgres::Client, events: &[EventSpec]) {
    client
        .batch_execute(
            "CREATE TABLE write_fills (event_id text PRIMARY KEY, account_id bigint NOT NULL, \
             occurred_at timestamptz NOT NULL, side text NOT NULL, qty numeric NOT NULL, \
             price numeric NOT NULL, fee numeric NOT NULL)",
        )
        .await
        .expect("write side");
    for e in events {
        client
            .execute(
                "INSERT INTO write_fills VALUES ($1, $2, $3::text::timestamptz, $4, $5::text::numeric, \
                 $6::text::numeric, $7::text::numeric)",
                &[
                    &e.event_id,
                    &e.account_id,
                    &e.occurred_at,
                    &e.data["side"].as_str().expect("side"),
                    &e.data["qty"].as_str().expect("qty"),
                    &e.data["price"].as_str().expect("price"),
                    &e.data["fee"].as_str().expect("fee"),
                ],
            )
            .await
            .expect("insert");
    }
}

/// Feeds `view` the events, every tenth one delivered twice.
async fn feed(db: &TestDb, view: Arc<dyn Projection>, events: &[EventSpec]) {
    let mut log = Partition::from_events("fills", 0, events);
    for e in events.iter().step_by(10) {
        log.push_event(e);
    }
    let applier = Applier::new(view, SourceOrdering::PerAccount).expect("applier");
    consume(&applier, &mut db.client().await, &log, 64).await;
}

const SOURCE_5M: &str = "SELECT occurred_at AS at, 1 AS fills, qty FROM write_fills";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_minute_windows_match_until_a_difference_is_planted() {
    let registry = Registry::new().register(Flow).expect("registry");
    let db = TestDb::new(&registry).await;
    let events = events();
    feed(&db, Arc::new(Flow), &events).await;
    let client = db.client().await;
    write_side(&client, &events).await;

    let spec = ReconcileSpec {
        source_sql: SOURCE_5M.to_owned(),
        view_sql: "SELECT minute AS at, fills, qty FROM flow_v1;".to_owned(),
        window: Duration::from_secs(300),
        since: t0(),
        until: t0() + chrono::Duration::hours(5),
        threshold: "0.001".to_owned(),
    };
    let (mut source, mut view) = (db.client().await, db.client().await);
    let report = reconcile(&mut source, &mut view, &spec)
        .await
        .expect("reconcile");
    assert_eq!(report.windows, 60);
    // 300 fills 47 s apart span 3 h 55 min: 47 windows hold rows.
    assert_eq!(report.windows_with_data, 47);
    assert_eq!(report.measures, ["fills", "qty"]);
    assert!(report.differing.is_empty(), "{:?}", report.differing);

    // A fill lost on the write side at 22:17:14 (event 22) and a quantity changed at 23:33:13
    // (event 119): both windows are named, nothing else.
    client
        .batch_execute(
            "DELETE FROM write_fills WHERE event_id = 'fill_executed-2-4'; \
             UPDATE write_fills SET qty = qty + 1 WHERE event_id = 'fill_executed-1-18'",
        )
        .await
        .expect("plant");
    let report = reconcile(&mut source, &mut view, &spec)
        .await
        .expect("reconcile");
    let named: Vec<(String, Vec<String>)> = report
        .differing
        .iter()
        .map(|w| {
            (
                w.start.format("%H:%M").to_string(),
                w.measures.iter().map(|m| m.measure.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            (
                "22:15".to_owned(),
                vec!["fills".to_owned(), "qty".to_owned()]
            ),
            ("23:30".to_owned(), vec!["qty".to_owned()]),
        ]
    );
    let lost = &report.differing[0].measures[0];
    assert_eq!((lost.source.as_str(), lost.view.as_str()), ("5", "6"));

    // A difference within the threshold is tolerated: 0.001 of a window's quantity.
    client
        .batch_execute(
            "UPDATE write_fills SET qty = qty - 1 WHERE event_id = 'fill_executed-1-18'; \
             UPDATE write_fills SET qty = qty + 0.001 WHERE event_id = 'fill_executed-1-18'",
        )
        .await
        .expect("tiny difference");
    let report = reconcile(&mut source, &mut view, &spec)
        .await
        .expect("reconcile");
    assert_eq!(report.differing.len(), 1, "only the lost fill's window");
    let strict = ReconcileSpec {
        threshold: "0".to_owned(),
        ..spec.clone()
    };
    let report = reconcile(&mut source, &mut view, &strict)
        .await
        .expect("reconcile");
    assert_eq!(
        report.differing.len(),
        2,
        "threshold 0 sees the tiny difference too"
    );

    // Floating-point measures are refused.
    let floats = ReconcileSpec {
        source_sql: "SELECT occurred_at AS at, qty::float8 AS qty FROM write_fills".to_owned(),
        ..spec
    };
    let e = reconcile(&mut source, &mut view, &floats)
        .await
        .expect_err("floats");
    assert!(
        e.to_string().contains("never compared as floating point"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eod_view_reconciles_per_day_and_the_command_names_the_day() {
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    let events = events();
    let eod = registry.select(&["eod".to_owned()]).expect("eod")[0].clone();
    feed(&db, eod, &events).await;
    let client = db.client().await;
    write_side(&client, &events).await;
    let source = "SELECT occurred_at AS at, 1 AS fills, \
                  CASE side WHEN 'buy' THEN qty ELSE 0 END AS bought_qty, \
                  CASE side WHEN 'sell' THEN qty * price ELSE 0 END AS sold_notional, \
                  fee AS fees FROM write_fills";
    let args = |window: &str| -> Vec<String> {
        [
            "reconcile",
            "eod",
            "--database-url",
            db.url(),
            "--source",
            source,
            "--window",
            window,
            "--since",
            "2026-11-28T00:00:00Z",
            "--until",
            "2026-11-30T00:00:00Z",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let run = |args: Vec<String>| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
            .args(&args)
            .output()
            .expect("reconcile");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(args("1d"));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("2 window(s) of 1day") && stdout.contains("every window matches"),
        "{stdout}"
    );

    client
        .batch_execute("UPDATE write_fills SET fee = fee + 1 WHERE event_id = 'fill_executed-1-31'")
        .await
        .expect("plant");
    let (code, stdout, stderr) = run(args("1d"));
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    let differs: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("DIFFERS"))
        .collect();
    assert_eq!(differs.len(), 1, "{stdout}");
    assert!(
        differs[0].starts_with("DIFFERS 2026-11-29T00:00:00Z .. 2026-11-30T00:00:00Z  fees:"),
        "{stdout}"
    );
    assert!(
        stderr.contains("the view differs from the source"),
        "{stderr}"
    );

    // eod keeps a row per day: a 5-minute window cannot be compared with it.
    let (code, _, stderr) = run(args("5m"));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--window must be a multiple"), "{stderr}");
    // portfolio holds state, not flows: it needs --view-sql.
    let mut portfolio = args("1d");
    portfolio[1] = "portfolio".to_owned();
    let (status, stderr) = run_to_end(&portfolio.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        !status.success() && stderr.contains("pass --view-sql"),
        "{stderr}"
    );
}
