//! Views written only as `.sql` files (`--views-dir`, docs/sql-views.md), never compiled:
//! the two views of `examples/sql_views/` consumed by `projector run` from the dev broker and
//! checked against folds written here in Rust (rust_decimal); one of them rebuilt into v2 from
//! earliest by `projector rebuild` and cut over; bad files refused in one line each; edited
//! files of a registered version refused at start; `projector views check`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use rust_decimal::Decimal;

use crate::support::broker::Broker;
use crate::support::kafka::publish;
use crate::support::process::{run_output, wait_until, Output, Projector};
use projector_engine::testkit::{cash, fill, fill_v2, EventSpec, TestDb};

const TOPIC: &str = "events";
const LOG: &str = "projector_engine::kafka=info,warn";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A fresh directory for a test's view files.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "projector-sql-views-{name}-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_micros()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn example(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/sql_views")
        .join(file);
    std::fs::read_to_string(&path).expect("an example view")
}

/// Cash movements and fills (at both versions of their shape) of six accounts over three
/// UTC days; `from_seq` lets a later chunk continue the same accounts.
fn stream(from_seq: i64, to_seq: i64) -> Vec<EventSpec> {
    let reasons = ["deposit", "withdrawal", "fee"];
    let symbols = ["EURUSD", "XAUUSD"];
    let mut out = Vec::new();
    for seq in from_seq..=to_seq {
        for account in 1..=6i64 {
            let at = format!("2026-11-{:02}T{:02}:30:00Z", 1 + seq / 4, 8 + seq);
            let n = account * 37 + seq * 11;
            if seq % 2 == 1 {
                let amount = Decimal::new(n % 40_000 - 15_000, 2);
                out.push(cash(
                    account,
                    seq,
                    &at,
                    &amount.to_string(),
                    reasons[(n % 3) as usize],
                ));
            } else {
                let symbol = symbols[(n % 2) as usize];
                let qty = format!("{}", 1 + n % 50);
                let price = format!("{}.{:02}", 1 + n % 7, n % 100);
                let fee = format!("0.{:02}", n % 90);
                if account % 2 == 0 {
                    out.push(fill_v2(
                        account,
                        seq,
                        &at,
                        symbol,
                        &format!("-{qty}"),
                        &price,
                        &fee,
                    ));
                } else {
                    out.push(fill(account, seq, &at, symbol, "buy", &qty, &price, &fee));
                }
            }
        }
    }
    out
}

fn dec(v: &serde_json::Value) -> Decimal {
    Decimal::from_str(v.as_str().expect("a decimal string")).expect("a decimal")
}

type Key = (i64, String, String);

/// cash_by_day (v1 and v2): per account, UTC day and reason, the movements and their sum;
/// v2 also keeps what came in and what went out apart.
fn cash_fold(events: &[EventSpec], v2: bool) -> BTreeMap<Key, Vec<Decimal>> {
    let mut out: BTreeMap<Key, Vec<Decimal>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.event_type == "cash_adjusted") {
        let amount = dec(&e.data["amount"]);
        let key = (
            e.account_id,
            e.occurred_at[..10].to_owned(),
            e.data["reason"].as_str().expect("reason").to_owned(),
        );
        let row = out
            .entry(key)
            .or_insert_with(|| vec![Decimal::ZERO; if v2 { 4 } else { 2 }]);
        row[0] += Decimal::ONE;
        row[1] += amount;
        if v2 {
            if amount > Decimal::ZERO {
                row[2] += amount;
            } else {
                row[3] -= amount;
            }
        }
    }
    out
}

/// fees_by_symbol: per account and symbol, the fills, their fees and |qty| × price.
fn fees_fold(events: &[EventSpec]) -> BTreeMap<(i64, String), Vec<Decimal>> {
    let mut out: BTreeMap<(i64, String), Vec<Decimal>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.event_type == "fill_executed") {
        let key = (
            e.account_id,
            e.data["symbol"].as_str().expect("symbol").to_owned(),
        );
        let row = out.entry(key).or_insert_with(|| vec![Decimal::ZERO; 3]);
        row[0] += Decimal::ONE;
        row[1] += dec(&e.data["fee"]);
        row[2] += dec(&e.data["qty"]).abs() * dec(&e.data["price"]);
    }
    out
}

/// The rows of a relation as (text key columns, decimal value columns).
async fn read(db: &TestDb, sql: &str, keys: usize) -> Vec<(Vec<String>, Vec<Decimal>)> {
    let client = db.client().await;
    let rows = match client.query(sql, &[]).await {
        Ok(rows) => rows,
        Err(_) => return Vec::new(), // not created yet
    };
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = (0..r.len()).map(|i| r.get::<_, String>(i)).collect();
            let (k, v) = cells.split_at(keys);
            (
                k.to_vec(),
                v.iter()
                    .map(|c| Decimal::from_str(c).expect("a number"))
                    .collect(),
            )
        })
        .collect()
}

fn cash_expected(events: &[EventSpec], v2: bool) -> Vec<(Vec<String>, Vec<Decimal>)> {
    cash_fold(events, v2)
        .into_iter()
        .map(|((a, d, r), v)| (vec![a.to_string(), d, r], v))
        .collect()
}

async fn cash_rows(db: &TestDb, relation: &str, v2: bool) -> Vec<(Vec<String>, Vec<Decimal>)> {
    let extra = if v2 {
        ", deposited::text, withdrawn::text"
    } else {
        ""
    };
    read(
        db,
        &format!(
            "SELECT account_id::text, day::text, reason, movements::text, amount::text{extra} \
             FROM {relation} ORDER BY 1, 2, 3"
        ),
        3,
    )
    .await
}

/// Version 2 of cash_by_day: what came in and what went out, kept apart. A file of its own
/// beside version 1's, which keeps running until the cutover.
fn cash_by_day_v2() -> String {
    example("cash_by_day.sql")
        .replace("-- version: 1", "-- version: 2")
        .replace(
            "    amount     numeric NOT NULL,\n",
            "    amount     numeric NOT NULL,\n    deposited  numeric NOT NULL,\n    withdrawn  numeric NOT NULL,\n",
        )
        .replace(
            "           sum(ev.amount) AS amount\n",
            "           sum(ev.amount) AS amount,\n           coalesce(sum(ev.amount) FILTER (WHERE ev.amount > 0), 0) AS deposited,\n           coalesce(-sum(ev.amount) FILTER (WHERE ev.amount < 0), 0) AS withdrawn\n",
        )
        .replace(
            "(account_id, day, reason, movements, amount)\nSELECT account_id, day, reason, movements, amount FROM moves",
            "(account_id, day, reason, movements, amount, deposited, withdrawn)\nSELECT account_id, day, reason, movements, amount, deposited, withdrawn FROM moves",
        )
        .replace(
            "    amount    = c.amount + EXCLUDED.amount\n",
            "    amount    = c.amount + EXCLUDED.amount,\n    deposited = c.deposited + EXCLUDED.deposited,\n    withdrawn = c.withdrawn + EXCLUDED.withdrawn\n",
        )
        .replace(
            "SELECT account_id, day, reason, movements, amount FROM cash_by_day_v{v}",
            "SELECT account_id, day, reason, movements, amount, deposited, withdrawn FROM cash_by_day_v{v}",
        )
}

fn succeeded(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} must succeed, got {}; stdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

#[test]
fn a_view_written_only_as_sql_files_runs_from_the_dev_broker_and_is_rebuilt_into_v2() {
    let rt = runtime();
    let broker = Broker::start(&[(TOPIC, 2)]);
    let topic = broker.topic(TOPIC);
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    let dir = scratch_dir("run");
    for f in ["cash_by_day.sql", "fees_by_symbol.sql"] {
        std::fs::write(dir.join(f), example(f)).expect("write a view");
    }
    let dir_arg = dir.display().to_string();
    let mut run_args: Vec<String> = [
        "run",
        "--views-dir",
        &dir_arg,
        "--views",
        "cash_by_day,fees_by_symbol",
        "--metrics-addr",
        "off",
        "--database-url",
        db.url(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    run_args.extend(broker.cli_flags(&topic));

    // Each event once, and a few of them again: the inbox drops the copies.
    let first = stream(1, 6);
    let mut published = first.clone();
    published.extend(first.iter().step_by(7).cloned());
    rt.block_on(publish(&broker, &topic, &published));

    let mut run = Projector::spawn(&run_args, LOG);
    let expected = cash_expected(&first, false);
    wait_until(
        "cash_by_day v1 to hold the fold of the stream",
        &mut [&mut run],
        || rt.block_on(cash_rows(&db, "cash_by_day", false)),
        |rows| *rows == expected,
    );
    let expected_fees: Vec<(Vec<String>, Vec<Decimal>)> = fees_fold(&first)
        .into_iter()
        .map(|((a, s), v)| (vec![a.to_string(), s], v))
        .collect();
    wait_until(
        "fees_by_symbol to hold the fold of the fills",
        &mut [&mut run],
        || {
            rt.block_on(read(
                &db,
                "SELECT account_id::text, symbol, fills::text, fees::text, notional::text \
                 FROM fees_by_symbol ORDER BY 1, 2",
                2,
            ))
        },
        |rows| *rows == expected_fees,
    );

    // Version 2 of cash_by_day, a file beside version 1's, rebuilt from the whole log and cut
    // over while version 1 stays live.
    std::fs::write(dir.join("cash_by_day.v2.sql"), cash_by_day_v2()).expect("write v2");
    let listed = run_output(&["views", "--views-dir", &dir_arg, "--database-url", db.url()]);
    succeeded("views", &listed);
    for line in ["cash_by_day", "fees_by_symbol"] {
        assert!(listed.stdout.contains(line), "{}", listed.stdout);
    }
    let mut rebuild: Vec<String> = [
        "rebuild",
        "cash_by_day",
        "--from",
        "earliest",
        "--views-dir",
        &dir_arg,
        "--database-url",
        db.url(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    rebuild.extend(broker.cli_flags(&topic));
    let out = run_output(&rebuild);
    succeeded("rebuild", &out);
    assert!(
        out.stdout
            .contains("cash_by_day: v2 is live; v1 is retired"),
        "{}",
        out.stdout
    );
    assert_eq!(
        rt.block_on(cash_rows(&db, "cash_by_day", true)),
        cash_expected(&first, true),
        "the stable name reads v2, the fold of the whole log"
    );

    // The process that started with v1's files stops; one started with both carries v2 on.
    run.signal("TERM");
    assert!(
        run.wait_exit(Duration::from_secs(60)).success(),
        "{}",
        run.log()
    );
    let second = stream(7, 8);
    rt.block_on(publish(&broker, &topic, &second));
    let mut all = first.clone();
    all.extend(second);
    // This time the directory comes from the config file `run` reads.
    let config = dir.join("projector.toml");
    std::fs::write(&config, format!("views_dir = {:?}\n", dir_arg)).expect("config");
    let mut from_config: Vec<String> = run_args
        .iter()
        .filter(|a| **a != "--views-dir" && **a != dir_arg)
        .cloned()
        .collect();
    from_config.extend(["--config".to_owned(), config.display().to_string()]);
    let mut run = Projector::spawn(&from_config, LOG);
    let expected = cash_expected(&all, true);
    wait_until(
        "cash_by_day v2 to follow the topic",
        &mut [&mut run],
        || rt.block_on(cash_rows(&db, "cash_by_day", true)),
        |rows| *rows == expected,
    );
    run.signal("TERM");
    assert!(
        run.wait_exit(Duration::from_secs(60)).success(),
        "{}",
        run.log()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `projector migrate --views-dir DIR` with `file` holding `text`: refused with exactly one
/// error line, which is returned without its `error: ` prefix.
fn refusal(db: &TestDb, text: &str) -> String {
    let dir = scratch_dir("bad");
    std::fs::write(dir.join("cash_by_day.sql"), text).expect("write");
    let dir_arg = dir.display().to_string();
    let out = run_output(&[
        "migrate",
        "--views-dir",
        &dir_arg,
        "--database-url",
        db.url(),
    ]);
    assert_eq!(out.status.code(), Some(1), "refused: {}", out.stderr);
    let lines = out.error_lines();
    assert_eq!(lines.len(), 1, "one line: {}", out.stderr);
    let line = lines[0]
        .strip_prefix("error: ")
        .unwrap_or_else(|| panic!("an error line: {}", lines[0]))
        .replace(&format!("{dir_arg}/"), "");
    let _ = std::fs::remove_dir_all(&dir);
    line
}

#[test]
fn bad_sql_view_files_are_each_refused_in_one_line_naming_the_file_and_line() {
    let rt = runtime();
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    let good = example("cash_by_day.sql");
    let line_of = |needle: &str| {
        good.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} in the example"))
            + 1
    };

    // An unknown section.
    assert_eq!(
        refusal(&db, &good.replace("-- name: write", "-- name: wirte")),
        format!(
            "cash_by_day.sql:{}: unknown section \"wirte\"; sections are ddl, ctes, write, notices, read, snapshot",
            line_of("-- name: write")
        )
    );
    // A statement that does not prepare: the server's complaint, at the line it points at.
    assert_eq!(
        refusal(
            &db,
            &good.replace(
                "    amount    = c.amount + EXCLUDED.amount",
                "    amount    = c.amont + EXCLUDED.amount"
            )
        ),
        format!(
            "cash_by_day.sql:{}: write: column c.amont does not exist (hint: Perhaps you meant to reference the column \"c.amount\".)",
            line_of("    amount    = c.amount + EXCLUDED.amount")
        )
    );
    // A field read from ev but not declared in the header.
    assert_eq!(
        refusal(
            &db,
            &good.replace("-- fields: amount decimal, reason text", "-- fields: amount decimal")
        ),
        format!(
            "cash_by_day.sql:{}: ev.reason is read but \"reason\" is not a declared field; add it to the header's `-- fields:` (`reason decimal` or `reason text`)",
            line_of("coalesce(ev.reason, '')")
        )
    );
    // The same field read bare: the server finds it missing when the statement is prepared.
    assert_eq!(
        refusal(
            &db,
            &good
                .replace("-- fields: amount decimal, reason text", "-- fields: amount decimal")
                .replace("coalesce(ev.reason, '')", "coalesce(reason, '')")
        ),
        format!(
            "cash_by_day.sql:{}: ctes: column \"reason\" does not exist; if it is a field of the event's data, declare it in the header's `-- fields:` (`<name> decimal` or `<name> text`) and read it as ev.<name>",
            line_of("coalesce(ev.reason, '')")
        )
    );
    // A header key the loader does not know.
    assert!(
        refusal(&db, &good.replace("-- dedup: inbox", "-- dedupe: inbox")).starts_with(&format!(
            "cash_by_day.sql:{}: unknown header key \"dedupe\"; keys are view, version",
            line_of("-- dedup: inbox")
        ))
    );
    // A name the compiled views use.
    assert_eq!(
        refusal(&db, &good.replace("-- view: cash_by_day", "-- view: portfolio").replace("cash_by_day_v{v}", "portfolio_sql_v{v}")),
        format!(
            "cash_by_day.sql:{}: view portfolio is also compiled into this binary; give the SQL view another name",
            line_of("-- view: cash_by_day")
        )
    );
    // Nothing of any of them was installed.
    let tables = rt.block_on(async {
        db.client()
            .await
            .query_one(
                "SELECT count(*) FROM projector.views WHERE name = 'cash_by_day'",
                &[],
            )
            .await
            .expect("count")
            .get::<_, i64>(0)
    });
    assert_eq!(tables, 0);

    // The files of a registered version edited (a comment is enough): refused at start with
    // the way forward.
    let dir = scratch_dir("edited");
    let dir_arg = dir.display().to_string();
    std::fs::write(dir.join("cash_by_day.sql"), &good).expect("write");
    let migrate = [
        "migrate",
        "--views-dir",
        &dir_arg,
        "--database-url",
        db.url(),
    ];
    succeeded("migrate", &run_output(&migrate));
    std::fs::write(
        dir.join("cash_by_day.sql"),
        good.replace("and reason: how many", "and reason: how many movements"),
    )
    .expect("edit");
    let out = run_output(&migrate);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let lines = out.error_lines();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    let prefix = format!(
        "error: {dir_arg}/cash_by_day.sql:{}: cash_by_day v1 was registered by other files (fingerprint ",
        line_of("-- version: 1")
    );
    assert!(lines[0].starts_with(&prefix), "{}", lines[0]);
    assert!(
        lines[0].ends_with("its files changed since. Restore them, or give the changed files a new version (`-- version: 2`, the v1 files kept beside them until the cutover) and `projector rebuild cash_by_day --to-version 2`"),
        "{}",
        lines[0]
    );
    // An edit that keeps the rows declares the fingerprint it replaces, and runs.
    let recorded = lines[0][prefix.len()..]
        .split(';')
        .next()
        .expect("the recorded fingerprint")
        .to_owned();
    std::fs::write(
        dir.join("cash_by_day.sql"),
        good.replace("and reason: how many", "and reason: how many movements")
            .replace(
                "-- version: 1\n",
                &format!("-- version: 1\n-- replaces: {recorded}\n"),
            ),
    )
    .expect("edit");
    succeeded("migrate with replaces", &run_output(&migrate));
    // Restored, it runs again.
    std::fs::write(dir.join("cash_by_day.sql"), &good).expect("restore");
    succeeded("migrate after the restore", &run_output(&migrate));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn views_check_runs_the_conformance_suite_and_names_a_view_that_fails_it() {
    let url = projector_engine::testkit::admin_url();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sql_views");
    let out = run_output(&[
        "views",
        "check",
        &examples.display().to_string(),
        "--database-url",
        &url,
    ]);
    succeeded("views check of the examples", &out);
    assert_eq!(
        out.stdout.lines().filter(|l| l.starts_with("ok: ")).count(),
        2,
        "{}",
        out.stdout
    );

    // Declared order-independent, but it keeps the last reason it saw: the schedules that
    // reorder or batch differently give other rows.
    let dir = scratch_dir("check");
    let wrong = example("cash_by_day.sql").replace(
        "    amount    = c.amount + EXCLUDED.amount",
        "    amount    = EXCLUDED.amount",
    );
    std::fs::write(dir.join("cash_by_day.sql"), wrong).expect("write");
    let out = run_output(&[
        "views",
        "check",
        &dir.display().to_string(),
        "--database-url",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("FAILED: cash_by_day v1") && out.stdout.contains("schedule"),
        "{}",
        out.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The engine knows no event type's rules; a SQL view reading a built-in type takes them from
/// the compiled views that read it. A cash movement whose reason is longer than the built-in
/// rules allow is poison for `cash_by_day` as it is for `eod`; without the compiled views'
/// rules, the same view applies it.
#[test]
fn a_sql_view_refuses_what_the_compiled_views_rules_refuse() {
    use projector_engine::sql_view;
    use projector_engine::testkit::{consume, Partition};
    use projector_engine::{Applier, Projection, SourceOrdering};
    use std::sync::Arc;
    runtime().block_on(async {
        let compiled = projector_views::registry().expect("built-in views");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sql_views/cash_by_day.sql");
        let upcasters = sql_view::upcasters_of(compiled.all());
        let bare = sql_view::load_path(&path, &upcasters).expect("the example loads");
        let ruled = bare.clone().with_rules_of(compiled.all());
        let long = "x".repeat(2_000);
        let events = [
            cash(1, 1, "2026-01-05T10:00:00Z", "10.50", "deposit"),
            cash(1, 2, "2026-01-05T11:00:00Z", "99", &long),
        ];
        for (view, poison) in [(ruled, 1i64), (bare, 0)] {
            let view: Arc<dyn Projection> = Arc::new(view);
            let mut registry = projector_engine::Registry::new();
            registry.add(Arc::clone(&view)).expect("registry");
            let db = TestDb::new(&registry).await;
            let mut client = db.client().await;
            let applier =
                Applier::new(Arc::clone(&view), SourceOrdering::PerAccount).expect("applier");
            let log = Partition::from_events("cash", 0, &events);
            consume(&applier, &mut client, &log, 10).await;
            let dead: i64 = client
                .query_one(
                    "SELECT count(*) FROM projector.dead_letters WHERE consumer = 'cash_by_day_v1'",
                    &[],
                )
                .await
                .expect("dead letters")
                .get(0);
            assert_eq!(dead, poison, "rules applied: {}", poison == 1);
        }
    });
}
