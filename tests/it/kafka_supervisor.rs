//! The live service never leaves a view out in silence: a version that cannot start (its
//! table locked past the statement timeout) at start or at a cutover is started again with
//! backoff until it consumes, the health rule pages while it does not, and `status` names it
//! with the error. A version whose registered code is not this process's code is never
//! consumed by it, and `status` says which process skips which version.

use std::sync::Arc;
use std::time::Duration;

use crate::support::broker::Broker;
use crate::support::kafka::{config, publish};
use crate::support::process::{http_get, run_output, wait_until, Projector};
use crate::support::variant::Variant;
use crate::support::{eventually, fills, offsets, with_options};
use projector_devkit::devbroker::DevBroker;
use projector_engine::kafka::log::{LogReader, Reading};
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{consume, EventSpec, Partition, TestDb};
use projector_engine::{Applier, ApplySql, Projection, Registry, SourceOrdering};
use projector_ops::status::{collect, Status, StatusOptions};
use projector_ops::{ProblemKind, Severity};
use projector_views::Portfolio;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "fills";

/// Fast restarts and looks at the registry, so that the test waits on signals, not on
/// production's backoff.
fn options(names: &[&str], owner: &str) -> LiveOptions {
    LiveOptions {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        refresh: Duration::from_millis(100),
        owner: Some(owner.to_owned()),
        restart_first: Duration::from_millis(200),
        restart_max: Duration::from_secs(1),
        local: None,
        notify: true,
    }
}

/// A pool whose statements give up after a second: a table locked for longer makes a
/// version's start fail, as a production lock outlasting the 30 s default does.
fn impatient_pool(db: &TestDb) -> deadpool_postgres::Pool {
    projector_engine::db::pool(&with_options(db.url(), &[("statement_timeout", "1000")]), 8)
        .expect("pool")
}

async fn status(db: &TestDb, bootstrap: &str) -> Status {
    let probe = Arc::new(
        LogReader::connect(
            &config(bootstrap, TOPIC),
            Duration::from_secs(5),
            Reading::Samples,
        )
        .expect("probe"),
    );
    collect(db.pool(), &probe, &StatusOptions::default())
        .await
        .expect("status")
}

/// The problems of a kind about `consumer`, as (severity, message).
fn problems_of(status: &Status, kind: ProblemKind, consumer: &str) -> Vec<(Severity, String)> {
    status
        .problems
        .iter()
        .filter(|p| p.kind == kind && p.consumer.as_deref() == Some(consumer))
        .map(|p| (p.severity, p.message.clone()))
        .collect()
}

/// What each fresh process says it does with `consumer`.
fn runners(status: &Status, consumer: &str) -> Vec<(String, String)> {
    status
        .views
        .iter()
        .filter(|v| v.consumer == consumer)
        .flat_map(|v| {
            v.runners
                .iter()
                .map(|r| (r.instance.clone(), r.state.clone()))
        })
        .collect()
}

async fn consumed(db: &TestDb, consumer: &str) -> i64 {
    offsets(&db.client().await, consumer)
        .await
        .next
        .values()
        .sum()
}

/// The rows of `view` after `events` applied once each, in a database of their own.
async fn reference(view: Arc<dyn Projection>, events: &[EventSpec]) -> Vec<Vec<String>> {
    let registry = Registry::new()
        .register(Portfolio::new(1))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    client
        .batch_execute(&projector_engine::projection::render(&*view, &view.ddl()))
        .await
        .expect("ddl");
    let applier = Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier");
    consume(
        &applier,
        &mut client,
        &Partition::from_events("reference", 0, events),
        500,
    )
    .await;
    dump(&client, &*view).await
}

/// Holds `LOCK TABLE <table> IN ACCESS EXCLUSIVE MODE` in an open transaction until
/// released: a migration, a long report or a blip at a cutover.
async fn lock(db: &TestDb, table: &str) -> deadpool_postgres::Client {
    lock_in(db, table, "ACCESS EXCLUSIVE").await
}

/// Holds `LOCK TABLE <table> IN <mode> MODE` in an open transaction until released, on a
/// session that may stay idle in it as long as the test needs.
async fn lock_in(db: &TestDb, table: &str, mode: &str) -> deadpool_postgres::Client {
    let client = projector_engine::db::pool(
        &with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")]),
        1,
    )
    .expect("pool")
    .get()
    .await
    .expect("holder");
    client
        .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN {mode} MODE"))
        .await
        .expect("lock");
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_whose_table_is_locked_at_start_is_retried_until_it_consumes_and_pages_meanwhile() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    let events = fills(10, 3);
    publish(&bootstrap, TOPIC, &events).await;

    let held = lock(&db, "portfolio_v1").await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        impatient_pool(&db),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&[], "a"),
    ));

    // The other views consume meanwhile; portfolio fails to start, is retried, and pages.
    eventually(
        "risk and eod to consume everything",
        || async {
            (
                consumed(&db, "risk_v1").await,
                consumed(&db, "eod_v1").await,
            )
        },
        |(r, e)| *r == 30 && *e == 30,
    )
    .await;
    let paging = eventually(
        "portfolio_v1 to page as not consuming, with its error",
        || status(&db, &bootstrap),
        |s| {
            !s.healthy
                && problems_of(s, ProblemKind::NotConsuming, "portfolio_v1")
                    .iter()
                    .any(|(severity, m)| {
                        *severity == Severity::Page && m.contains("statement timeout")
                    })
        },
    )
    .await;
    assert_eq!(
        runners(&paging, "portfolio_v1"),
        [("a".to_owned(), "failing".to_owned())]
    );
    let attempts = paging
        .processes
        .iter()
        .find(|p| p.instance == "a")
        .and_then(|p| p.views.iter().find(|v| v.consumer == "portfolio_v1"))
        .map(|v| v.attempts);
    assert!(attempts.is_some_and(|n| n >= 1), "{attempts:?}");
    assert_eq!(consumed(&db, "portfolio_v1").await, 0);

    // The lock goes: portfolio starts at its next attempt, catches up, and health is green.
    held.batch_execute("ROLLBACK").await.expect("unlock");
    eventually(
        "portfolio_v1 to consume everything",
        || consumed(&db, "portfolio_v1"),
        |n| *n == 30,
    )
    .await;
    let healthy = eventually(
        "health to be green again",
        || status(&db, &bootstrap),
        |s| s.healthy && runners(s, "portfolio_v1") == [("a".to_owned(), "consuming".to_owned())],
    )
    .await;
    assert!(problems_of(&healthy, ProblemKind::NotConsuming, "portfolio_v1").is_empty());
    stop.cancel();
    live.await.expect("join");
    let portfolio: Arc<dyn Projection> = Arc::new(Portfolio::new(1));
    assert_eq!(
        dump(&db.client().await, &*portfolio).await,
        reference(portfolio.clone(), &events).await
    );
    let gone = status(&db, &bootstrap).await;
    assert!(
        gone.processes.iter().all(|p| p.instance != "a"),
        "a process that stopped cleanly leaves no row: {:?}",
        gone.processes
    );
}

/// Portfolio at `version` whose statement also names `portfolio_gate`, a table its DDL
/// creates and nothing else uses: a lock on it keeps the version from starting, and from
/// nothing else (a cutover does not touch it).
fn gated(version: i32) -> Variant {
    let inner = Portfolio::new(version);
    let sql = inner.apply_sql();
    Variant::of(inner).apply_sql(ApplySql {
        ctes: format!(
            "gate AS (SELECT 1 FROM portfolio_gate WHERE false){}{}",
            if sql.ctes.trim().is_empty() { "" } else { ", " },
            sql.ctes
        ),
        write: sql.write,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cutover_to_a_version_that_cannot_start_is_retried_until_it_consumes() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = Registry::new()
        .register(Portfolio::new(1))
        .and_then(|r| r.register(gated(2)))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    db.client()
        .await
        .batch_execute("CREATE TABLE portfolio_gate (x int)")
        .await
        .expect("gate");
    let events = fills(8, 3);
    publish(&bootstrap, TOPIC, &events).await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        impatient_pool(&db),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&["portfolio"], "a"),
    ));
    eventually(
        "v1 to consume everything",
        || consumed(&db, "portfolio_v1"),
        |n| *n == 24,
    )
    .await;

    // The cutover makes v2 live while its statement cannot be prepared.
    let held = lock(&db, "portfolio_gate").await;
    projector_rebuild::cutover::cutover(&mut db.client().await, &registry, "portfolio", 2, None)
        .await
        .expect("cutover");
    let paging = eventually(
        "portfolio_v2 to page as not consuming",
        || status(&db, &bootstrap),
        |s| {
            problems_of(s, ProblemKind::NotConsuming, "portfolio_v2")
                .iter()
                .any(|(severity, _)| *severity == Severity::Page)
        },
    )
    .await;
    assert!(!paging.healthy);
    assert_eq!(consumed(&db, "portfolio_v2").await, 0);

    held.batch_execute("ROLLBACK").await.expect("unlock");
    eventually(
        "v2 to consume everything",
        || consumed(&db, "portfolio_v2"),
        |n| *n == 24,
    )
    .await;
    eventually(
        "health to be green again",
        || status(&db, &bootstrap),
        |s| s.healthy,
    )
    .await;
    stop.cancel();
    live.await.expect("join");
    let v2: Arc<dyn Projection> = Arc::new(gated(2));
    assert_eq!(
        dump(&db.client().await, &*v2).await,
        reference(Arc::new(Portfolio::new(2)), &events).await
    );
}

/// Portfolio v2 as a newer binary writes it: another statement (a column computed the
/// same way, written differently), so another fingerprint.
fn newer(version: i32) -> Variant {
    let inner = Portfolio::new(version);
    let mut sql = inner.apply_sql();
    sql.write = format!("{} ", sql.write);
    Variant::of(inner).apply_sql(sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_code_differs_never_writes_the_version_and_status_names_it() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    // The newer binary registers v2 with its code and cuts over to it.
    let new_binary = Registry::new()
        .register(Portfolio::new(1))
        .and_then(|r| r.register(newer(2)))
        .expect("registry");
    // The older binary has only v1's code, which it would build at any version.
    let old_binary = Registry::new()
        .register(Portfolio::new(1))
        .expect("registry");
    assert!(old_binary.code_for("portfolio", 2).is_ok());
    let db = TestDb::new(&new_binary).await;
    projector_rebuild::cutover::cutover(&mut db.client().await, &new_binary, "portfolio", 2, None)
        .await
        .expect("cutover");
    let events = fills(6, 3);
    publish(&bootstrap, TOPIC, &events).await;

    // A binary that registers its own, other code for v2 migrates v1 and leaves v2 alone
    // (not even its DDL runs), and says why, with both fingerprints.
    let other_v2 = Registry::new()
        .register(Portfolio::new(1))
        .and_then(|r| r.register(Portfolio::new(2)))
        .expect("registry");
    let report = projector_engine::migrate(&mut db.client().await, &other_v2)
        .await
        .expect("migrate");
    let ours = projector_engine::fingerprint::of(&Portfolio::new(2));
    let theirs = projector_engine::fingerprint::of(&newer(2));
    assert_ne!(ours, theirs);
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert!(
        report.skipped[0].0 == "portfolio_v2"
            && report.skipped[0].1.contains(&ours)
            && report.skipped[0].1.contains(&theirs),
        "{report:?}"
    );

    // Run alone, the old binary consumes nothing into v2, and status pages: nobody does.
    let stop_old = CancellationToken::new();
    let old = tokio::spawn(run_live(
        old_binary.clone(),
        db.pool().clone(),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop_old.clone(),
        options(&["portfolio"], "old"),
    ));
    let skipped = eventually(
        "the old process to report that it skips v2",
        || status(&db, &bootstrap),
        |s| runners(s, "portfolio_v2") == [("old".to_owned(), "skipped".to_owned())],
    )
    .await;
    let pages = problems_of(&skipped, ProblemKind::Skipped, "portfolio_v2");
    assert!(
        pages.iter().any(|(severity, m)| *severity == Severity::Page
            && m.starts_with("old skips portfolio_v2, and no process consumes it")
            && m.contains(&ours)
            && m.contains(&theirs)),
        "{pages:?}"
    );

    // The newer binary consumes v2; the old one's skip is then a warning.
    let stop_new = CancellationToken::new();
    let new = tokio::spawn(run_live(
        new_binary.clone(),
        db.pool().clone(),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop_new.clone(),
        options(&["portfolio"], "new"),
    ));
    eventually(
        "the new process to consume everything into v2",
        || consumed(&db, "portfolio_v2"),
        |n| *n == 18,
    )
    .await;
    let both = eventually(
        "the old process's skip to be a warning",
        || status(&db, &bootstrap),
        |s| {
            problems_of(s, ProblemKind::Skipped, "portfolio_v2")
                .iter()
                .all(|(severity, _)| *severity == Severity::Warn)
                && runners(s, "portfolio_v2").len() == 2
        },
    )
    .await;
    assert!(both.healthy, "{:?}", both.problems);
    stop_new.cancel();
    new.await.expect("join");
    stop_old.cancel();
    old.await.expect("join");
    let committers: Vec<Option<String>> = db
        .client()
        .await
        .query(
            "SELECT DISTINCT committed_by FROM projector.offsets WHERE consumer = 'portfolio_v2'",
            &[],
        )
        .await
        .expect("committers")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(committers, [Some("new".to_owned())]);
    let v2: Arc<dyn Projection> = Arc::new(newer(2));
    assert_eq!(
        dump(&db.client().await, &*v2).await,
        reference(Arc::new(Portfolio::new(2)), &events).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_that_declares_the_recorded_fingerprint_keeps_the_version_running() {
    let broker = DevBroker::start(1, &[(TOPIC, 1)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registered = Registry::new()
        .register(Portfolio::new(1))
        .expect("registry");
    let db = TestDb::new(&registered).await;
    let recorded = projector_engine::fingerprint::of(&Portfolio::new(1));

    let upgraded = Registry::new()
        .register(newer(1).replacing_code(std::slice::from_ref(&recorded)))
        .expect("registry");
    let report = projector_engine::migrate(&mut db.client().await, &upgraded)
        .await
        .expect("migrate");
    assert!(report.skipped.is_empty(), "{report:?}");
    let events = fills(4, 2);
    publish(&bootstrap, TOPIC, &events).await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        upgraded,
        db.pool().clone(),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&[], "upgraded"),
    ));
    eventually(
        "the upgraded code to consume v1",
        || consumed(&db, "portfolio_v1"),
        |n| *n == 8,
    )
    .await;
    stop.cancel();
    live.await.expect("join");
    let stored: Option<String> = db
        .client()
        .await
        .query_one(
            "SELECT fingerprint FROM projector.views WHERE name = 'portfolio' AND version = 1",
            &[],
        )
        .await
        .expect("fingerprint")
        .get(0);
    assert_eq!(
        stored,
        Some(recorded),
        "the registered fingerprint is never rewritten"
    );
}

/// `/health` of a `projector run` child until `done` holds for (code, body), or a panic with
/// its log at the deadline.
fn health_until(
    p: &mut Projector,
    addr: &str,
    what: &str,
    mut done: impl FnMut(u16, &str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let (code, body) = http_get(addr, "/health");
        if done(code, &body) {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; last /health {code} {body}; log:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn run_pages_while_a_lock_keeps_a_view_from_starting_at_start_and_at_a_cutover_and_is_exact_after()
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let topic = kafka.topic(TOPIC);
    let registry = projector_views::registry().expect("registry");
    let db = rt.block_on(TestDb::new(&registry));
    let events = fills(10, 2);
    rt.block_on(publish(&kafka, &topic, &events));
    let url = with_options(db.url(), &[("statement_timeout", "1000")]);
    let with_kafka = |args: &[&str]| -> Vec<String> {
        let mut out: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        out.extend(["--database-url".to_owned(), url.clone()]);
        out.extend(kafka.cli_flags(&topic));
        out
    };

    // At start: portfolio_v1's table is locked while `run` starts.
    let held = rt.block_on(lock(&db, "portfolio_v1"));
    let run_args = with_kafka(&[
        "run",
        "--views",
        "portfolio",
        "--metrics-addr",
        "127.0.0.1:0",
        "--monitor-interval",
        "200ms",
    ]);
    let run_args: Vec<&str> = run_args.iter().map(String::as_str).collect();
    let mut p = Projector::spawn(&run_args, "warn");
    let line = p.wait_for("the endpoint's address", Duration::from_secs(60), |l| {
        l.contains("metrics on http://")
    });
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("address")
        .to_owned();
    let body = health_until(
        &mut p,
        &addr,
        "/health to page for portfolio_v1",
        |code, b| code == 503 && b.contains("portfolio_v1 is not consumed by"),
    );
    assert!(body.contains("\"healthy\":false"), "{body}");
    rt.block_on(held.batch_execute("ROLLBACK")).expect("unlock");
    health_until(
        &mut p,
        &addr,
        "v1 to catch up and /health to be green",
        |code, _| code == 200 && rt.block_on(consumed(&db, "portfolio_v1")) == 20,
    );

    // At a cutover: v2 is rebuilt beside it, then its table is locked so that its statement
    // cannot be prepared (SHARE keeps writers out and lets the cutover's CREATE VIEW read),
    // and the cutover makes it live.
    let rebuild_args = with_kafka(&[
        "rebuild",
        "portfolio",
        "--to-version",
        "2",
        "--from",
        "earliest",
        "--cutover",
        "manual",
    ]);
    let rebuild_args: Vec<&str> = rebuild_args.iter().map(String::as_str).collect();
    let mut rebuilding = Projector::spawn(&rebuild_args, "warn");
    wait_until(
        "v2 to catch up",
        &mut [&mut rebuilding, &mut p],
        || rt.block_on(consumed(&db, "portfolio_v2")),
        |n| *n == 20,
    );
    let held = rt.block_on(lock_in(&db, "portfolio_v2", "SHARE"));
    let cut = run_output(&[
        "cutover",
        "portfolio",
        "--to-version",
        "2",
        "--database-url",
        &url,
    ]);
    assert!(cut.status.success(), "cutover: {}", cut.stderr);
    rebuilding.wait_exit(Duration::from_secs(60));
    let more = fills(10, 3)[20..].to_vec();
    rt.block_on(publish(&kafka, &topic, &more));
    let body = health_until(
        &mut p,
        &addr,
        "/health to page for portfolio_v2",
        |code, b| code == 503 && b.contains("portfolio_v2 is not consumed by"),
    );
    assert!(body.contains("\"healthy\":false"), "{body}");
    rt.block_on(held.batch_execute("ROLLBACK")).expect("unlock");
    health_until(
        &mut p,
        &addr,
        "v2 to catch up and /health to be green",
        |code, _| code == 200 && rt.block_on(consumed(&db, "portfolio_v2")) == 30,
    );
    p.signal("TERM");
    p.wait_exit(Duration::from_secs(60));
    let all: Vec<EventSpec> = events.iter().chain(&more).cloned().collect();
    rt.block_on(async {
        let v2: Arc<dyn Projection> = Arc::new(Portfolio::new(2));
        assert_eq!(
            dump(&db.client().await, &*v2).await,
            reference(v2.clone(), &all).await
        );
    });
}
