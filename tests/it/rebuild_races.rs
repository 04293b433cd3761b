//! Rebuilds, cutovers, retires and repairs racing each other or losing their sessions: a
//! cancel against a cutover, running locks held again after a lost session, a second cutover,
//! a retire against a cutover, a skip or a retry with events behind it, a pause during the
//! snapshot. Each test failed before its fix (found by a review of rebuilding and operations)
//! and guards it now; each says the scenario and the consequence.
//!
//! 1. `hole_r1_*`: a cancel whose drop waits for the rebuild to stop, and a cutover of the
//!    version in the meantime: the cancelled version goes live, and the cancel then drops
//!    the live version's tables (and the stable read name with them, `CASCADE`).
//! 2. `hole_r2_*`: the live service loses the session that holds its running locks (a
//!    killed backend, a dropped connection) and never holds them again: a drop of the
//!    version no longer waits for it. `hole_r6_*`: the same for `projector rebuild` and
//!    the version it builds.
//! 3. `hole_r3_*`: a second cutover while the first new version still trails the boundary
//!    its own cutover set: the third version learns a boundary below what the first
//!    version had announced, and announces those events again.
//! 4. `hole_r4_*`: a retire racing a cutover to the same version retires (and with `--drop`
//!    drops) the version the cutover just made live.
//! 5. `hole_r5_*`: `parked skip` of an account that is not parked: its next event, sound,
//!    arrives and is dead-lettered as a conflict, never applied.
//! 7. `hole_r7_*`: `dlq retry` of a dead letter with over a thousand events behind it
//!    drains one step and leaves the account unparked with events still waiting;
//!    `hole_r7b_*`: the same after a live batch fills a gap (the source's drain loads
//!    nothing for an account that is not parked).
//! 8. `hole_r8_*`: a `--pause` while the snapshot is taken makes the seeding fail with a
//!    serialization failure, and the rebuild cancels itself: the pause is a cancel.

use std::sync::Arc;
use std::time::Duration;

use crate::support::broker::Broker;
use crate::support::kafka::publish;
use crate::support::{fills, within};
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::{consume, fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Projection, Registry, SourceOrdering};
use projector_rebuild::tail::Silent;
use projector_rebuild::{cutover, Cutover, Options, Outcome, RebuildError, Source};
use projector_views::Portfolio;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "fills";
const LIMIT: Duration = Duration::from_secs(60);

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

async fn scalar_i64(db: &TestDb, sql: &str) -> i64 {
    db.client()
        .await
        .query_one(sql, &[])
        .await
        .expect(sql)
        .get(0)
}

async fn text(db: &TestDb, sql: &str) -> Option<String> {
    db.client()
        .await
        .query_opt(sql, &[])
        .await
        .expect(sql)
        .map(|r| r.get(0))
}

// --- 1. A cancel racing a cutover ---------------------------------------------------------

/// `projector rebuild portfolio --cancel` while the rebuild has not looked at the registry
/// yet: the cancel marks the rebuild cancelled and waits for it to stop before it drops
/// what it built. An engineer (or the rebuild's own automatic cutover, which read the
/// phase a moment before) cuts over to the version in that window. Before the fix the
/// cutover made the cancelled version live, and the cancel then dropped it: the live
/// version's tables and the stable read name were gone, and the running service had
/// nothing to serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r1_a_cancelled_rebuild_cannot_be_cut_over_and_the_cancel_never_drops_a_live_version()
{
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = Arc::new(TestDb::new(&registry).await);
    let events = fills(5, 4);
    publish(&kafka, &kafka.topic(TOPIC), &events).await;

    // The rebuild looks at the registry once, then not for a minute: the cancel lands
    // between two looks.
    let mut options = Options::new("portfolio");
    options.source = Source::Earliest;
    options.cutover = Cutover::Manual;
    options.tick = Duration::from_secs(60);
    let stop_rebuild = CancellationToken::new();
    let running = {
        let (db, kafka, options, stop) = (
            db.clone(),
            kafka.clone(),
            options.clone(),
            stop_rebuild.clone(),
        );
        tokio::spawn(async move {
            projector_rebuild::rebuild(
                &views(),
                db.url(),
                kafka.config(&kafka.topic(TOPIC)),
                &options,
                &Silent,
                stop,
            )
            .await
        })
    };
    within(
        "v2 to consume the log",
        LIMIT,
        || scalar_i64(&db, "SELECT coalesce(sum(next_offset), 0)::bigint FROM projector.offsets WHERE consumer = 'portfolio_v2'"),
        |n| *n >= events.len() as i64,
    )
    .await;

    let cancelling = {
        let (db, registry) = (db.clone(), registry.clone());
        tokio::spawn(async move {
            cutover::cancel(&mut db.client().await, &registry, "portfolio").await
        })
    };
    within(
        "the cancel to be recorded",
        LIMIT,
        || {
            text(
                &db,
                "SELECT phase FROM projector.rebuilds WHERE consumer = 'portfolio_v2'",
            )
        },
        |p| p.as_deref() == Some("cancelled"),
    )
    .await;

    let cut = cutover::cutover(&mut db.client().await, &registry, "portfolio", 2, None).await;
    assert!(
        matches!(cut, Err(RebuildError::Refused(_))),
        "a cancelled rebuild must not be cut over, got {cut:?}"
    );

    // The rebuild stops (a signal); the cancel finishes.
    stop_rebuild.cancel();
    let outcome = tokio::time::timeout(LIMIT, running)
        .await
        .expect("the rebuild to stop")
        .expect("join");
    assert!(
        matches!(outcome, Ok(Outcome::Stopped { version: 2 })),
        "{outcome:?}"
    );
    let cancelled = tokio::time::timeout(LIMIT, cancelling)
        .await
        .expect("the cancel to finish")
        .expect("join");
    assert_eq!(cancelled.expect("the cancel"), 2);

    assert_eq!(
        text(&db, "SELECT string_agg(version || ' ' || state, ', ' ORDER BY version) FROM projector.views WHERE name = 'portfolio'").await,
        Some("1 live".to_owned())
    );
    // The stable name still reads the live version.
    db.client()
        .await
        .query_one("SELECT count(*) FROM portfolio", &[])
        .await
        .expect("the stable read name");
}

// --- 2. The live service's running locks -------------------------------------------------

/// The backend holding `consumer`'s running lock, if one does.
async fn lock_holder(db: &TestDb, consumer: &str) -> Option<i32> {
    db.client()
        .await
        .query_opt(
            // This test's database only: the same view's lock in another test's database
            // is another session, which the caller would terminate.
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND classid::bigint = 1886546546 AND objsubid = 2 \
               AND objid::bigint = (hashtext($1)::bigint & 4294967295) LIMIT 1",
            &[&consumer],
        )
        .await
        .expect("pg_locks")
        .map(|r| r.get(0))
}

/// `projector run` holds the running lock of every version it runs on a session of its
/// own, so that `retire --drop` (or a cancel) waits until it stopped the version. That
/// session can be lost (a killed backend, a restarted pooler, a network cut): its locks go
/// with it. Before the fix the service never noticed: it held them again only when it
/// happened to start another version, so a drop no longer waited for it, and a batch of
/// the version in flight committed offsets and progress after the drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r2_the_live_service_holds_its_running_locks_again_after_losing_their_session() {
    let broker = Broker::start(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = TestDb::new(&registry).await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        db.pool().clone(),
        kafka.config(&kafka.topic(TOPIC)),
        Arc::new(NoObserver),
        stop.clone(),
        LiveOptions {
            names: vec!["portfolio".to_owned()],
            refresh: Duration::from_millis(100),
            ..LiveOptions::default()
        },
    ));
    let first = within(
        "the service to hold portfolio_v1's running lock",
        LIMIT,
        || lock_holder(&db, "portfolio_v1"),
        Option::is_some,
    )
    .await
    .expect("a holder");
    db.client()
        .await
        .execute("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .expect("terminate the lock session");
    // A hundred looks at the registry: it holds the lock again on a new session.
    let again = within(
        "the service to hold portfolio_v1's running lock again",
        Duration::from_secs(10),
        || lock_holder(&db, "portfolio_v1"),
        |h| h.is_some_and(|pid| pid != first),
    )
    .await;
    assert!(again.is_some());
    stop.cancel();
    tokio::time::timeout(LIMIT, live)
        .await
        .expect("the service to stop")
        .expect("join");
}

// --- 3. Notices across two cutovers -------------------------------------------------------

const AT: &str = "2026-11-29T10:15:00Z";

/// Buy 10, sell 10 (closes), sell 5 (opens short), buy 8 (flips long): notices at seq 2 and 4.
fn script(account: i64) -> Vec<EventSpec> {
    let f = |seq, side, qty| fill(account, seq, AT, "EURUSD", side, qty, "1.5", "0");
    vec![
        f(1, "buy", "10"),
        f(2, "sell", "10"),
        f(3, "sell", "5"),
        f(4, "buy", "8"),
    ]
}

async fn register_building(client: &deadpool_postgres::Client, view: &Arc<dyn Projection>) {
    client
        .execute(
            "INSERT INTO projector.views (name, version, state, fingerprint) \
             VALUES ($1, $2, 'building', $3)",
            &[
                &view.name(),
                &view.version(),
                &projector_engine::fingerprint::of(&**view),
            ],
        )
        .await
        .expect("register");
    client
        .batch_execute(&projector_engine::projection::render(&**view, &view.ddl()))
        .await
        .expect("tables");
}

/// What the relay publishes, then deletes.
async fn relay(client: &deadpool_postgres::Client) -> Vec<(String, String)> {
    client
        .query(
            "WITH s AS (DELETE FROM projector.notices RETURNING consumer, event_id) \
             SELECT consumer, event_id FROM s ORDER BY event_id",
            &[],
        )
        .await
        .expect("relay")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// v1 is live and announces an account's close and flip. v2 is cut over while it trails
/// (one event applied; the cutover lag allows it): its boundary is v1's `seq` 4. Before v2
/// catches up, v3 is cut over. Before the fix v3's boundary was v2's own `last_seq` (1), not
/// the boundary v2 inherited, so v3 announced the close and the flip a second time: the
/// unique key on `projector.notices` caught it only while the first notices were still in
/// the table (a relay that deletes what it published sends them twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r3_a_second_cutover_keeps_the_boundary_the_first_one_set() {
    let registry = Registry::new()
        .register(Portfolio::new(1))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let code = |v: i32| registry.code_for("portfolio", v).expect("code");
    let applier = |v: i32| Applier::new(code(v), SourceOrdering::PerAccount).expect("applier");
    let (v1, v2, v3) = (applier(1), applier(2), applier(3));

    let log = Partition::from_events("fills", 0, &script(7));
    let mut head = log.clone();
    head.log.truncate(1);
    consume(&v1, &mut client, &log, 10).await;
    let announced = relay(&client).await;
    assert_eq!(announced.len(), 2, "v1 announced the close and the flip");

    register_building(&client, &code(2)).await;
    consume(&v2, &mut client, &head, 10).await;
    cutover::cutover(&mut client, &registry, "portfolio", 2, None)
        .await
        .expect("cutover to v2");
    register_building(&client, &code(3)).await;
    consume(&v3, &mut client, &head, 10).await;
    cutover::cutover(&mut client, &registry, "portfolio", 3, None)
        .await
        .expect("cutover to v3");

    // Everyone catches up.
    consume(&v2, &mut client, &log, 10).await;
    let outcomes = consume(&v3, &mut client, &log, 10).await;
    assert_eq!(
        outcomes.iter().map(|o| o.counts.notices).sum::<u64>(),
        0,
        "v3 announced again what v1 had announced: {:?}",
        relay(&client).await
    );
    assert!(relay(&client).await.is_empty());
}

// --- 4. A retire racing a cutover ---------------------------------------------------------

/// Sessions of this database waiting for a lock.
async fn lock_waiters(db: &TestDb) -> i64 {
    scalar_i64(
        db,
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .await
}

/// `projector retire portfolio --version 2 --drop` while an engineer cuts over to v2 (a
/// version `migrate` registered as building). Retire read v2's state without a lock, found
/// it not live, and its update then retired whatever v2 had become meanwhile: before the
/// fix the cutover's new live version was retired (no live version at all; `projector run`
/// stopped it) and dropped, tables and stable read name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r4_a_retire_never_retires_the_version_a_cutover_made_live_meanwhile() {
    let registry = Registry::new()
        .register(Portfolio::new(1))
        .expect("registry");
    let db = Arc::new(TestDb::new(&registry).await);
    let v2 = registry.code_for("portfolio", 2).expect("code");
    register_building(&db.client().await, &v2).await;

    // Something holds the registry rows for a moment (a cancel of another rebuild, say).
    let mut holder = db.client().await;
    let held = holder.transaction().await.expect("begin");
    held.execute(
        "SELECT 1 FROM projector.views WHERE name = 'portfolio' FOR UPDATE",
        &[],
    )
    .await
    .expect("hold");
    let cutting = {
        let (db, registry) = (db.clone(), registry.clone());
        tokio::spawn(async move {
            cutover::cutover(&mut db.client().await, &registry, "portfolio", 2, None).await
        })
    };
    within(
        "the cutover to wait",
        LIMIT,
        || lock_waiters(&db),
        |n| *n == 1,
    )
    .await;
    let retiring = {
        let (db, registry) = (db.clone(), registry.clone());
        tokio::spawn(async move {
            cutover::retire(&mut db.client().await, &registry, "portfolio", 2, true).await
        })
    };
    within(
        "the retire to wait",
        LIMIT,
        || lock_waiters(&db),
        |n| *n == 2,
    )
    .await;
    held.commit().await.expect("let go");

    let cut = cutting.await.expect("join");
    let retired = retiring.await.expect("join");
    // Either may win the row (the cutover locks v1 first, the retire only v2), but exactly
    // one does, and the other is refused: never a retired-and-dropped live version.
    let states = text(&db, "SELECT string_agg(version || ' ' || state || ' ' || (dropped_at IS NOT NULL), ', ' ORDER BY version) FROM projector.views WHERE name = 'portfolio'").await;
    match (&cut, &retired) {
        (Ok(_), Err(RebuildError::Refused(_))) => {
            assert_eq!(states, Some("1 retired false, 2 live false".to_owned()));
        }
        (Err(RebuildError::Refused(_)), Ok(())) => {
            assert_eq!(states, Some("1 live false, 2 retired true".to_owned()));
        }
        _ => panic!("exactly one must win: cutover {cut:?}, retire {retired:?}, {states:?}"),
    }
    db.client()
        .await
        .query_one("SELECT count(*) FROM portfolio", &[])
        .await
        .expect("the stable read name");
}

// --- 5. A skip of a seq nobody waits for --------------------------------------------------

/// `projector parked skip ACCOUNT --seq N` for an account that is not parked: a typo of the
/// account, or a park that a redelivery resolved a moment before. The account's next event
/// had simply not arrived yet. Before the fix the skip was accepted (the seq is the one the
/// account would take next), and when the event arrived it was dead-lettered as a conflict
/// with "a write-side bug": a sound event of a healthy account never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r5_a_skip_is_refused_for_an_account_that_is_not_parked_at_that_seq() {
    let registry = Registry::new()
        .register(crate::support::Trail::new(1))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = Applier::new(
        Arc::new(crate::support::Trail::new(1)),
        SourceOrdering::PerAccount,
    )
    .expect("applier");
    let mut client = db.client().await;
    let f = |account, seq| fill(account, seq, AT, "EURUSD", "buy", "1", "1.5", "0");
    // Account 1 is healthy at seq 3; account 2 is parked at seq 2 (lost), 3 waits.
    let events = [f(1, 1), f(1, 2), f(1, 3), f(2, 1), f(2, 3), f(1, 4)];
    let mut log = Partition::from_events("fills", 0, &events[..5]);
    consume(&applier, &mut client, &log, 10).await;

    // The engineer means account 2, types 1.
    let typo = applier.skip_seq(&mut client, 1, 4, "bob", "lost").await;
    assert!(
        matches!(typo, Err(projector_engine::ApplyError::Refused { .. })),
        "a skip of an account not parked at that seq must be refused, got {typo:?}"
    );

    // Account 1's next event arrives and is applied.
    log.push_event(&events[5]);
    let outcome = applier
        .apply(&mut client, &log.batch(5, 10))
        .await
        .expect("batch");
    assert_eq!(
        outcome.dispositions,
        [(5, projector_engine::Disposition::Applied)]
    );
    let expected: Vec<EventSpec> = events
        .iter()
        .filter(|e| e.account_id == 1)
        .cloned()
        .collect();
    let rows: Vec<String> = crate::support::rows(&client, "trail_v1")
        .await
        .into_iter()
        .filter(|r| r.starts_with("1|") || r.starts_with("(1,"))
        .collect();
    assert_eq!(rows, crate::support::trail_fold(&expected));
}

/// The same for `projector rebuild`: it holds the running lock of the version it builds on
/// a session of its own, and before the fix never held it again once that session was
/// lost: a cancel then dropped the version at once, under the tail's batch in flight, whose
/// offsets and progress outlived the drop for a rebuild into the same number to resume from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r6_a_rebuild_holds_its_running_lock_again_after_losing_its_session() {
    let broker = Broker::start(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = Arc::new(TestDb::new(&registry).await);
    let mut options = Options::new("portfolio");
    options.source = Source::Earliest;
    options.cutover = Cutover::Manual;
    options.tick = Duration::from_millis(100);
    let stop = CancellationToken::new();
    let running = {
        let (db, kafka, options, stop) = (db.clone(), kafka.clone(), options.clone(), stop.clone());
        tokio::spawn(async move {
            projector_rebuild::rebuild(
                &views(),
                db.url(),
                kafka.config(&kafka.topic(TOPIC)),
                &options,
                &Silent,
                stop,
            )
            .await
        })
    };
    let first = within(
        "the rebuild to hold portfolio_v2's running lock",
        LIMIT,
        || lock_holder(&db, "portfolio_v2"),
        Option::is_some,
    )
    .await
    .expect("a holder");
    // It is tailing by now.
    within(
        "the rebuild to tail",
        LIMIT,
        || {
            text(
                &db,
                "SELECT phase FROM projector.rebuilds WHERE consumer = 'portfolio_v2'",
            )
        },
        |p| p.as_deref() == Some("tailing"),
    )
    .await;
    db.client()
        .await
        .execute("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .expect("terminate the lock session");
    within(
        "the rebuild to hold portfolio_v2's running lock again",
        Duration::from_secs(10),
        || lock_holder(&db, "portfolio_v2"),
        |h| h.is_some_and(|pid| pid != first),
    )
    .await;
    stop.cancel();
    let outcome = tokio::time::timeout(LIMIT, running)
        .await
        .expect("the rebuild to stop")
        .expect("join");
    assert!(
        matches!(outcome, Ok(Outcome::Stopped { version: 2 })),
        "{outcome:?}"
    );
}

// --- 7. A retried dead letter with a long queue behind it ---------------------------------

/// `projector dlq retry ID` for a dead letter with more than a thousand events waiting
/// behind it (a busy account, parked for an hour). One repair step loads at most a thousand
/// of them; the rest drain in further steps, which `parked retry` and `dlq skip` take and
/// `dlq retry` did not. Before the fix the account was left unparked with events still
/// waiting: nothing loads the waiting events of an account that is not parked, so they
/// stayed unapplied until the account's next events arrived, and for good on an idle one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r7_dlq_retry_drains_everything_that_waited_behind_the_dead_letter() {
    let registry = views();
    let db = TestDb::new(&registry).await;
    let applier = Applier::new(
        registry.code_for("portfolio", 1).expect("portfolio"),
        SourceOrdering::PerAccount,
    )
    .expect("applier");
    let mut client = db.client().await;
    // A constraint the first event breaks: it is dead-lettered, 1001 events wait behind it.
    client
        .batch_execute("ALTER TABLE portfolio_v1 ADD CONSTRAINT small CHECK (net_qty < 1000000)")
        .await
        .expect("constraint");
    let fp = |seq, qty: &str| fill(5, seq, AT, "EURUSD", "buy", qty, "1.1", "0");
    let mut events = vec![fp(1, "2000000")];
    events.extend((2..=1002).map(|s| fp(s, "1")));
    let log = Partition::from_events("fills", 0, &events);
    let first = applier
        .apply(&mut client, &log.batch(0, 2000))
        .await
        .expect("batch");
    assert_eq!((first.counts.failed, first.counts.waiting), (1, 1001));
    let id = scalar_i64(&db, "SELECT id FROM projector.dead_letters").await;

    client
        .batch_execute("ALTER TABLE portfolio_v1 DROP CONSTRAINT small")
        .await
        .expect("the fix");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
        .args(["dlq", "retry", &id.to_string(), "--by", "dana"])
        .args(["--database-url", db.url()])
        .output()
        .expect("run projector");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        (
            scalar_i64(&db, "SELECT count(*) FROM projector.waiting_events").await,
            scalar_i64(&db, "SELECT count(*) FROM projector.parked_accounts").await,
            scalar_i64(&db, "SELECT last_seq FROM projector.account_progress WHERE consumer = 'portfolio_v1' AND account_id = 5").await,
        ),
        (0, 0, 1002),
        "everything that waited is applied: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The live path has the same step: the batch that fills a gap drains at most a thousand
/// waiting events and names the account in `more_to_drain`; the Kafka source then calls
/// `drain_account` until it says there is no more. Before the fix that batch unparked the
/// account, and `drain_account` loads the waiting events of parked accounts only: it drained
/// nothing, and the rest of the queue waited, unparked (absent from `parked list`), until
/// two more events of the account arrived; on an idle account, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r7b_the_drain_after_a_gap_is_filled_reaches_the_end_of_the_queue() {
    let registry = views();
    let db = TestDb::new(&registry).await;
    let applier = Applier::new(
        registry.code_for("portfolio", 1).expect("portfolio"),
        SourceOrdering::PerAccount,
    )
    .expect("applier");
    let mut client = db.client().await;
    let fp = |seq| fill(5, seq, AT, "EURUSD", "buy", "1", "1.1", "0");
    // Seq 1 is late: 1001 events wait for it.
    let mut log = Partition::from_events("fills", 0, &(2..=1002).map(fp).collect::<Vec<_>>());
    let first = applier
        .apply(&mut client, &log.batch(0, 2000))
        .await
        .expect("batch");
    assert_eq!(first.counts.waiting, 1001);
    log.push_event(&fp(1));
    let filled = applier
        .apply(&mut client, &log.batch(1001, 10))
        .await
        .expect("the late event");
    assert_eq!(filled.more_to_drain, [5]);
    // What the source does next.
    let mut steps = 0;
    loop {
        let (_, more) = applier.drain_account(&mut client, 5).await.expect("drain");
        steps += 1;
        if !more || steps > 10 {
            break;
        }
    }
    assert_eq!(
        (
            scalar_i64(&db, "SELECT count(*) FROM projector.waiting_events").await,
            scalar_i64(&db, "SELECT count(*) FROM projector.parked_accounts").await,
            scalar_i64(&db, "SELECT last_seq FROM projector.account_progress WHERE consumer = 'portfolio_v1' AND account_id = 5").await,
        ),
        (0, 0, 1002),
        "everything that waited is applied"
    );
}

// --- 8. A pause while the snapshot is taken -----------------------------------------------

/// `projector rebuild portfolio --pause` while the rebuild takes its snapshot. The pause
/// updates the rebuild's row; the seeding transaction (`REPEATABLE READ`) then fails to
/// update it with a serialization failure, which the rebuild took for a snapshot that
/// cannot be taken: before the fix it cancelled itself, dropping its registration, so the
/// pause was a cancel. A serialization failure is transient: the rebuild stops, and the
/// same command resumes it, paused, from seeding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hole_r8_a_pause_during_the_snapshot_does_not_cancel_the_rebuild() {
    let broker = Broker::start(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = Arc::new(TestDb::new(&registry).await);
    // The write side's tables the snapshot reads (docs/views.md), one account.
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE positions (account_id bigint, symbol text, net_qty numeric, \
                 avg_price numeric, realized_pnl numeric, last_trade_at timestamptz, last_seq bigint); \
             CREATE TABLE account_seq (account_id bigint, last_seq bigint); \
             INSERT INTO positions VALUES (1, 'EURUSD', 10, 1.5, 0, now(), 1); \
             INSERT INTO account_seq VALUES (1, 1);",
        )
        .await
        .expect("write side");
    // The snapshot takes a while: the write side's table is locked for now.
    let mut locker = db.client().await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute("LOCK TABLE positions IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let mut options = Options::new("portfolio");
    options.tick = Duration::from_millis(100);
    let running = {
        let (db, kafka, options) = (db.clone(), kafka.clone(), options.clone());
        tokio::spawn(async move {
            projector_rebuild::rebuild(
                &views(),
                db.url(),
                kafka.config(&kafka.topic(TOPIC)),
                &options,
                &Silent,
                CancellationToken::new(),
            )
            .await
        })
    };
    within(
        "the snapshot to wait",
        LIMIT,
        || lock_waiters(&db),
        |n| *n == 1,
    )
    .await;
    projector_rebuild::state::set_paused(&db.client().await, "portfolio", true)
        .await
        .expect("pause");
    lock.commit().await.expect("unlock");
    let outcome = tokio::time::timeout(LIMIT, running)
        .await
        .expect("the rebuild to stop")
        .expect("join");
    assert!(
        !matches!(outcome, Ok(Outcome::CutOver(_))),
        "a paused rebuild does not cut over: {outcome:?}"
    );
    assert_eq!(
        text(
            &db,
            "SELECT phase || ' ' || paused FROM projector.rebuilds WHERE consumer = 'portfolio_v2'"
        )
        .await,
        Some("seeding true".to_owned()),
        "the rebuild is still registered, paused, and resumes from seeding ({outcome:?})"
    );
}
