//! A live version that a running process should consume and does not is reported unhealthy
//! in every snapshot, whatever the process is doing with it at the moment (starting it once
//! more, checking its code, stopping another version), whatever other process shares its
//! name, and even when the process cannot write its heartbeat; and stopping a version whose
//! start waits on a lock neither holds the shutdown nor keeps a cutover's new version waiting.

use std::sync::Arc;
use std::time::Duration;

use crate::support::kafka::{config, publish};
use crate::support::process::{http_get, Projector};
use crate::support::variant::Variant;
use crate::support::{eventually, fills, offsets, with_options, within};
use projector_devkit::devbroker::DevBroker;
use projector_engine::kafka::log::{LogReader, Reading};
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::TestDb;
use projector_engine::{ApplySql, Projection, Registry};
use projector_ops::status::{collect, Status, StatusOptions};
use projector_ops::{ProblemKind, Severity};
use projector_views::Portfolio;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "fills";

/// How many snapshots in a row must all say the same: at a beat every 100 ms and a state
/// that alternates every second or so, a rule that holds only part of the time misses one.
const SNAPSHOTS: usize = 30;

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

/// A pool whose statements give up after `ms` milliseconds.
fn pool_with_timeout(db: &TestDb, ms: u64) -> deadpool_postgres::Pool {
    projector_engine::db::pool(
        &with_options(db.url(), &[("statement_timeout", &ms.to_string())]),
        8,
    )
    .expect("pool")
}

/// A session that may sit in an open transaction for as long as the test needs (the engine's
/// sessions give up after 60 s idle in a transaction).
async fn holder(db: &TestDb) -> deadpool_postgres::Client {
    projector_engine::db::pool(
        &with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")]),
        1,
    )
    .expect("pool")
    .get()
    .await
    .expect("holder")
}

/// Holds `lock` (`LOCK TABLE ...`) in an open transaction until the client rolls back.
async fn lock(db: &TestDb, lock: &str) -> deadpool_postgres::Client {
    let client = holder(db).await;
    client
        .batch_execute(&format!("BEGIN; {lock}"))
        .await
        .expect("lock");
    client
}

/// Sessions of the test database that wait for a lock.
async fn lock_waiters(db: &TestDb) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

struct Snapshots {
    probe: Arc<LogReader>,
}

impl Snapshots {
    fn new(bootstrap: &str) -> Self {
        Self {
            probe: Arc::new(
                LogReader::connect(
                    &config(bootstrap, TOPIC),
                    Duration::from_secs(5),
                    Reading::Samples,
                )
                .expect("probe"),
            ),
        }
    }

    async fn take(&self, db: &TestDb) -> Status {
        collect(db.pool(), &self.probe, &StatusOptions::default())
            .await
            .expect("status")
    }
}

fn pages_about(status: &Status, kind: ProblemKind, consumer: &str) -> bool {
    status.problems.iter().any(|p| {
        p.kind == kind && p.severity == Severity::Page && p.consumer.as_deref() == Some(consumer)
    })
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

/// Takes [`SNAPSHOTS`] snapshots in a row; returns what each process said of `consumer` in
/// those that did not page about it.
async fn quiet_snapshots(
    snapshots: &Snapshots,
    db: &TestDb,
    kind: ProblemKind,
    consumer: &str,
) -> Vec<(bool, Vec<(String, String)>)> {
    let mut quiet = Vec::new();
    for _ in 0..SNAPSHOTS {
        let s = snapshots.take(db).await;
        if !pages_about(&s, kind, consumer) {
            quiet.push((s.healthy, runners(&s, consumer)));
        }
    }
    quiet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_keeps_failing_to_start_pages_in_every_snapshot() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    publish(&bootstrap, TOPIC, &fills(10, 3)).await;
    let held = lock(&db, "LOCK TABLE portfolio_v1 IN ACCESS EXCLUSIVE MODE").await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        pool_with_timeout(&db, 1000),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&[], "a"),
    ));
    let snapshots = Snapshots::new(&bootstrap);
    eventually(
        "portfolio_v1 to page as not consuming",
        || snapshots.take(&db),
        |s| pages_about(s, ProblemKind::NotConsuming, "portfolio_v1"),
    )
    .await;

    // The lock stays: every attempt fails, and every snapshot meanwhile must say so. Each
    // attempt is reported `starting` afresh (its `since` reset), within the start grace.
    let quiet = quiet_snapshots(&snapshots, &db, ProblemKind::NotConsuming, "portfolio_v1").await;
    assert_eq!(consumed(&db, "portfolio_v1").await, 0);
    held.batch_execute("ROLLBACK").await.expect("unlock");
    stop.cancel();
    live.await.expect("join");
    assert!(
        quiet.is_empty(),
        "{} of {SNAPSHOTS} snapshots taken while portfolio_v1 could not start did not page (healthy, runners): {quiet:?}",
        quiet.len()
    );
}

/// Portfolio v1 as another binary writes it: another fingerprint.
fn other_code(version: i32) -> Variant {
    let inner = Portfolio::new(version);
    let mut sql = inner.apply_sql();
    sql.write = format!("{} ", sql.write);
    Variant::of(inner).apply_sql(sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_one_instance_id_do_not_hide_each_others_versions() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    publish(&bootstrap, TOPIC, &fills(10, 3)).await;
    // One deployment serves risk and eod; another, with the same configuration file (and so
    // the same instance id), serves portfolio with code that did not register it: it skips
    // portfolio_v1, which nobody consumes, and that pages.
    let stop = CancellationToken::new();
    let others = tokio::spawn(run_live(
        registry.clone(),
        db.pool().clone(),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&["risk", "eod"], "projector"),
    ));
    let wrong = Registry::new().register(other_code(1)).expect("registry");
    let portfolio = tokio::spawn(run_live(
        wrong,
        db.pool().clone(),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&["portfolio"], "projector"),
    ));
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
    let snapshots = Snapshots::new(&bootstrap);
    eventually(
        "portfolio_v1 to page as skipped by every process",
        || snapshots.take(&db),
        |s| pages_about(s, ProblemKind::Skipped, "portfolio_v1"),
    )
    .await;

    let quiet = quiet_snapshots(&snapshots, &db, ProblemKind::Skipped, "portfolio_v1").await;
    stop.cancel();
    others.await.expect("join");
    portfolio.await.expect("join");
    assert_eq!(consumed(&db, "portfolio_v1").await, 0);
    assert!(
        quiet.is_empty(),
        "{} of {SNAPSHOTS} snapshots taken while nobody consumed portfolio_v1 did not page (healthy, runners): {quiet:?}",
        quiet.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_locked_against_writes_keeps_no_version_from_starting() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    publish(&bootstrap, TOPIC, &fills(10, 3)).await;
    // SHARE lets the registry be read but not written, as a `CREATE INDEX` on
    // projector.views in a migration, or a role that may only read the registry, would. The
    // check of each version's code is a read: it must not wait (it once was an UPDATE that
    // timed out at every look, and nothing started while nothing was reported).
    let held = lock(&db, "LOCK TABLE projector.views IN SHARE MODE").await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        pool_with_timeout(&db, 1000),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&[], "a"),
    ));
    eventually(
        "every view to consume everything while the registry is locked against writes",
        || async {
            (
                consumed(&db, "portfolio_v1").await,
                consumed(&db, "risk_v1").await,
                consumed(&db, "eod_v1").await,
            )
        },
        |n| *n == (30, 30, 30),
    )
    .await;
    held.batch_execute("ROLLBACK").await.expect("unlock");
    stop.cancel();
    live.await.expect("join");
}

#[test]
fn run_is_unhealthy_when_it_cannot_write_its_heartbeat_while_a_view_fails() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = projector_views::registry().expect("registry");
    let db = rt.block_on(TestDb::new(&registry));
    rt.block_on(publish(&bootstrap, TOPIC, &fills(10, 2)));
    // The heartbeat is refused (as for a role without rights on the tables V0008 added, or a
    // pool with no connection to spare), everything else works.
    rt.block_on(async {
        db.client()
            .await
            .batch_execute(
                "CREATE FUNCTION refuse_beats() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'heartbeats refused'; END $$; \
                 CREATE TRIGGER refuse_beats BEFORE INSERT OR UPDATE ON projector.processes \
                 FOR EACH ROW EXECUTE FUNCTION refuse_beats();",
            )
            .await
            .expect("trigger")
    });
    let held = rt.block_on(lock(
        &db,
        "LOCK TABLE portfolio_v1 IN ACCESS EXCLUSIVE MODE",
    ));
    let url = with_options(db.url(), &[("statement_timeout", "1000")]);
    let mut p = Projector::spawn(
        &[
            "run",
            "--brokers",
            &bootstrap,
            "--topic",
            TOPIC,
            "--database-url",
            &url,
            "--metrics-addr",
            "127.0.0.1:0",
            "--monitor-interval",
            "200ms",
            // Only the rule under test: the stall rule would page too, minutes later.
            "--stall-after",
            "1h",
        ],
        "warn",
    );
    let line = p.wait_for("the endpoint's address", Duration::from_secs(60), |l| {
        l.contains("metrics on http://")
    });
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("address")
        .to_owned();
    p.wait_for("the heartbeat to fail", Duration::from_secs(60), |l| {
        l.contains("cannot write the heartbeat")
    });
    p.wait_for(
        "portfolio_v1's start to fail again",
        Duration::from_secs(60),
        |l| l.contains("portfolio_v1") && l.contains("attempt=2"),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = (0, String::new());
    while std::time::Instant::now() < deadline {
        last = http_get(&addr, "/health");
        if last.0 == 503 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    rt.block_on(held.batch_execute("ROLLBACK")).expect("unlock");
    p.signal("TERM");
    p.wait_exit(Duration::from_secs(60));
    assert_eq!(
        last.0,
        503,
        "/health while portfolio_v1 could not start and the process was invisible: {}; log:\n{}",
        last.1,
        p.log()
    );
}

/// Portfolio at `version` whose statement also names `portfolio_gate`: a lock on that table
/// keeps the version from starting and touches nothing else.
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
async fn a_shutdown_does_not_wait_for_a_start_blocked_on_a_lock() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    publish(&bootstrap, TOPIC, &fills(10, 3)).await;
    let held = lock(&db, "LOCK TABLE portfolio_v1 IN ACCESS EXCLUSIVE MODE").await;
    let stop = CancellationToken::new();
    // A statement timeout of five minutes (the URL's own settings win over the engine's).
    let live = tokio::spawn(run_live(
        registry.clone(),
        pool_with_timeout(&db, 300_000),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&[], "a"),
    ));
    eventually(
        "risk and eod to consume everything, and portfolio_v1's start to wait on the lock",
        || async {
            (
                consumed(&db, "risk_v1").await,
                consumed(&db, "eod_v1").await,
                lock_waiters(&db).await,
            )
        },
        |(r, e, w)| *r == 30 && *e == 30 && *w >= 1,
    )
    .await;
    // SIGTERM: in-flight batches finish, nothing has to wait for a lock that stays.
    stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), live).await;
    let still_waiting = lock_waiters(&db).await;
    held.batch_execute("ROLLBACK").await.expect("unlock");
    assert!(
        stopped.is_ok(),
        "run_live had not returned 30 s after its shutdown; {still_waiting} session(s) still waited on the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cutover_starts_the_new_version_while_the_old_one_waits_on_a_lock() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = Registry::new()
        .register(gated(1))
        .and_then(|r| r.register(Portfolio::new(2)))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    db.client()
        .await
        .batch_execute("CREATE TABLE portfolio_gate (x int)")
        .await
        .expect("gate");
    publish(&bootstrap, TOPIC, &fills(8, 3)).await;
    let held = lock(&db, "LOCK TABLE portfolio_gate IN ACCESS EXCLUSIVE MODE").await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        pool_with_timeout(&db, 300_000),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&["portfolio"], "a"),
    ));
    eventually(
        "portfolio_v1's start to wait on the lock",
        || lock_waiters(&db),
        |w| *w >= 1,
    )
    .await;

    // v2 has nothing to do with the gate: once live, it must be started and consume.
    projector_rebuild::cutover::cutover(&mut db.client().await, &registry, "portfolio", 2, None)
        .await
        .expect("cutover");
    let snapshots = Snapshots::new(&bootstrap);
    let v2 = within(
        "portfolio_v2 to consume everything while v1's start still waits",
        Duration::from_secs(30),
        || async {
            (
                consumed(&db, "portfolio_v2").await,
                runners(&snapshots.take(&db).await, "portfolio_v2"),
            )
        },
        // The process reports what it runs with its heartbeat, a beat after the fact: the
        // report is waited for too, not sampled once.
        |(n, runners)| *n == 24 && runners[..] == [("a".to_owned(), "consuming".to_owned())],
    )
    .await;
    held.batch_execute("ROLLBACK").await.expect("unlock");
    stop.cancel();
    live.await.expect("join");
    assert_eq!(v2.1, [("a".to_owned(), "consuming".to_owned())]);
}

/// Portfolio v1 whose own check (`Projection::validate`, plugin code the engine cannot read)
/// panics on one event, as an `unwrap()` in a plugin would.
struct PanicsOn {
    inner: Portfolio,
    account: i64,
    seq: i64,
}

impl Projection for PanicsOn {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn version(&self) -> i32 {
        self.inner.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.inner.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        self.inner.check_data(event)
    }
    fn dedup(&self) -> projector_engine::DedupMode {
        self.inner.dedup()
    }
    fn order_independent(&self) -> bool {
        self.inner.order_independent()
    }
    fn many_per_account(&self) -> bool {
        self.inner.many_per_account()
    }
    fn fields(&self) -> Vec<projector_engine::Field> {
        self.inner.fields()
    }
    fn ddl(&self) -> String {
        self.inner.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.inner.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        self.inner.apply_sql()
    }
    fn read_sql(&self) -> String {
        self.inner.read_sql()
    }
    fn upcasters(&self) -> Vec<projector_engine::Upcaster> {
        self.inner.upcasters()
    }
    fn validate(&self, event: &projector_engine::Event) -> Result<(), projector_engine::Rejected> {
        assert!(
            !(event.account_id == self.account && event.seq == self.seq),
            "a plugin's check panicked"
        );
        self.inner.validate(event)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_views_code_neither_stops_its_partition_nor_goes_unreported() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = Registry::new()
        .register(PanicsOn {
            inner: Portfolio::new(1),
            account: 3,
            seq: 2,
        })
        .expect("registry");
    let db = TestDb::new(&registry).await;
    publish(&bootstrap, TOPIC, &fills(10, 3)).await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        db.pool().clone(),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        options(&[], "a"),
    ));
    let snapshots = Snapshots::new(&bootstrap);
    // No message may stop a view: the event that made the view's code panic is a dead letter,
    // as any event the view rejects, and every other offset is applied.
    let seen = within(
        "every offset of portfolio_v1 to be accounted for",
        Duration::from_secs(30),
        || async {
            let s = snapshots.take(&db).await;
            (
                consumed(&db, "portfolio_v1").await,
                s.healthy,
                runners(&s, "portfolio_v1"),
            )
        },
        |(n, _, _)| *n == 30,
    )
    .await;
    stop.cancel();
    live.await.expect("join");
    let dead: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM projector.dead_letters \
             WHERE consumer = 'portfolio_v1' AND account_id = 3 AND seq = 2",
            &[],
        )
        .await
        .expect("dead letters")
        .get(0);
    assert_eq!(dead, 1, "{seen:?}");
}
