//! Read-your-writes (issue 27): `projector.wait_applied` and its Rust twin answer `applied`
//! once the live version of a view has applied an account's `seq` (or a later one),
//! `timeout`, `parked` at once for an account parked at or below it, and `unknown view`;
//! a waiter is woken by the engine's notifier after the commit, follows a cutover and
//! outlives an engine restart. Real engine runs (`run_live`) against the mock cluster.
//!
//! The last tests check the ways `wait_applied` could answer `applied` for a write the view
//! does not show, or answer late: a dead-lettered event of an order-independent view, a
//! wake-up lost to a ring while other views commit, a notifier that loses its session, a
//! timeout of `Duration::MAX` (docs/consistency.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::broker::{Broker, Kafka};
use crate::support::kafka::{publish, publish_raw, Raw};
use crate::support::{eventually, fills};
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::{fill, EventSpec, TestDb};
use projector_engine::{wait_applied, Applied, Registry};
use projector_rebuild::tail::Silent;
use projector_rebuild::{Cutover, Options, Outcome, Source};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "fills";
/// Longer than any wait a test expects to end early: a waiter that is not woken fails.
const LONG: Duration = Duration::from_secs(60);

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

/// The live service, as `projector run` runs it, for the given views.
struct Engine {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Engine {
    fn start(db: &TestDb, kafka: &Kafka, names: &[&str]) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run_live(
            views(),
            db.pool().clone(),
            kafka.config(&kafka.topic(TOPIC)),
            Arc::new(NoObserver),
            stop.clone(),
            LiveOptions {
                names: names.iter().map(|n| (*n).to_owned()).collect(),
                refresh: Duration::from_millis(100),
                ..LiveOptions::default()
            },
        ));
        Self { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("the live service");
    }
}

/// A connection of its own, as a reader's.
async fn reader(db: &TestDb) -> deadpool_postgres::Client {
    projector_engine::db::pool(db.url(), 1)
        .expect("pool")
        .get()
        .await
        .expect("reader")
}

/// Waits on a connection of its own, in a task; returns the answer and how long it took.
fn waiter(
    db: &TestDb,
    view: &'static str,
    account: i64,
    seq: i64,
    timeout: Duration,
) -> JoinHandle<(Applied, Duration)> {
    let pool = projector_engine::db::pool(db.url(), 1).expect("pool");
    tokio::spawn(async move {
        let client = pool.get().await.expect("waiter");
        let started = Instant::now();
        let answer = wait_applied(&**client, view, account, seq, timeout)
            .await
            .expect("wait_applied");
        (answer, started.elapsed())
    })
}

/// Whether some session waits on `view`'s bell (a waiter queued).
async fn queued(db: &TestDb, view: &str) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int::oid \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND objsubid = 2 AND NOT granted AND objid = (hashtext($2)::bigint & 4294967295)::oid",
            &[&projector_engine::bell::CLASS, &view],
        )
        .await
        .expect("pg_locks")
        .get(0)
}

async fn applied(db: &TestDb, view: &str, account: i64) -> Option<i64> {
    db.client()
        .await
        .query_one("SELECT projector.applied($1, $2)", &[&view, &account])
        .await
        .expect("projector.applied")
        .get(0)
}

fn one(account: i64, seq: i64) -> EventSpec {
    fill(
        account,
        seq,
        "2026-11-29T10:15:00Z",
        "EURUSD",
        "buy",
        "10",
        "1.08420",
        "0.50",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_when_the_live_version_applies_its_seq_in_both_kinds_of_view() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio", "eod"]);
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &fills(3, 2),
    )
    .await;
    eventually(
        "both views to apply the first events",
        || async {
            (
                applied(&db, "portfolio", 3).await,
                applied(&db, "eod", 3).await,
            )
        },
        |seen| *seen == (Some(2), Some(2)),
    )
    .await;

    // Waiting before the write: woken by the commit, not by the timeout.
    let portfolio = waiter(&db, "portfolio", 2, 3, LONG);
    let eod = waiter(&db, "eod", 2, 3, LONG);
    eventually(
        "both waiters to queue on their bells",
        || async { (queued(&db, "portfolio").await, queued(&db, "eod").await) },
        |(p, e)| *p >= 1 && *e >= 1,
    )
    .await;
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &[one(2, 3)],
    )
    .await;
    let (p, e) = (
        portfolio.await.expect("portfolio waiter"),
        eod.await.expect("eod waiter"),
    );
    assert_eq!((p.0, e.0), (Applied::Applied, Applied::Applied));
    assert!(p.1 < LONG && e.1 < LONG, "{p:?} {e:?}");
    assert_eq!(applied(&db, "portfolio", 2).await, Some(3));
    assert_eq!(applied(&db, "eod", 2).await, Some(3));

    // Already applied: answered at once, in SQL too.
    let answer: String = reader(&db)
        .await
        .query_one(
            "SELECT projector.wait_applied('portfolio', 2, 3, interval '0')",
            &[],
        )
        .await
        .expect("wait_applied")
        .get(0);
    assert_eq!(answer, "applied");
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seq_that_never_comes_times_out_after_the_timeout() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio"]);
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &fills(2, 2),
    )
    .await;
    eventually(
        "portfolio to apply",
        || applied(&db, "portfolio", 2),
        |s| *s == Some(2),
    )
    .await;
    let (answer, took) = waiter(&db, "portfolio", 2, 3, Duration::from_millis(400))
        .await
        .expect("waiter");
    assert_eq!(answer, Applied::Timeout);
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_parked_at_or_below_the_seq_is_answered_parked_at_once() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio"]);
    // seq 3 never comes: the account parks at 3 with 4 waiting.
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &[one(7, 1), one(7, 2), one(7, 4)],
    )
    .await;
    eventually(
        "account 7 to park at seq 3",
        || async {
            db.client()
                .await
                .query_opt(
                    "SELECT blocked_seq FROM projector.parked_accounts \
                     WHERE consumer = 'portfolio_v1' AND account_id = 7",
                    &[],
                )
                .await
                .expect("parked")
                .map(|r| r.get::<_, i64>(0))
        },
        |b| *b == Some(3),
    )
    .await;
    for seq in [3, 4, 9] {
        let (answer, took) = waiter(&db, "portfolio", 7, seq, LONG)
            .await
            .expect("waiter");
        assert_eq!(answer, Applied::Parked, "seq {seq}");
        assert!(took < Duration::from_secs(2), "seq {seq}: {took:?}");
    }
    // Below the park, what was applied is applied.
    let (answer, _) = waiter(&db, "portfolio", 7, 2, LONG).await.expect("waiter");
    assert_eq!(answer, Applied::Applied);
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_that_does_not_exist_is_answered_unknown_view_at_once() {
    let db = TestDb::new(&views()).await;
    let (answer, took) = waiter(&db, "no_such_view", 1, 1, LONG)
        .await
        .expect("waiter");
    assert_eq!(answer, Applied::UnknownView);
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_seq_applied_satisfies_a_wait_for_an_earlier_one() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio", "eod"]);
    let p = waiter(&db, "portfolio", 5, 2, LONG);
    let e = waiter(&db, "eod", 5, 2, LONG);
    // Seqs 1 to 6 arrive together and commit in one batch: nobody ever saw seq 2 as the last.
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &(1..=6).map(|s| one(5, s)).collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(p.await.expect("waiter").0, Applied::Applied);
    assert_eq!(e.await.expect("waiter").0, Applied::Applied);
    eventually(
        "both views at seq 6",
        || async {
            (
                applied(&db, "portfolio", 5).await,
                applied(&db, "eod", 5).await,
            )
        },
        |s| *s == (Some(6), Some(6)),
    )
    .await;
    for view in ["portfolio", "eod"] {
        let (answer, _) = waiter(&db, view, 5, 4, Duration::ZERO)
            .await
            .expect("waiter");
        assert_eq!(answer, Applied::Applied, "{view}");
    }
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_follows_the_stable_name_across_a_cutover() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio"]);
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &fills(4, 5),
    )
    .await;
    eventually(
        "v1 to apply",
        || applied(&db, "portfolio", 4),
        |s| *s == Some(5),
    )
    .await;

    // A waiter for seq 6 of account 4 waits while v2 is rebuilt and cut over.
    let waiting = waiter(&db, "portfolio", 4, 6, LONG);
    eventually(
        "the waiter to queue",
        || queued(&db, "portfolio"),
        |n| *n >= 1,
    )
    .await;
    let mut options = Options::new("portfolio");
    options.source = Source::Earliest;
    options.cutover = Cutover::Auto;
    options.tick = Duration::from_millis(100);
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        projector_rebuild::rebuild(
            &views(),
            db.url(),
            kafka.config(&kafka.topic(TOPIC)),
            &options,
            &Silent,
            CancellationToken::new(),
        ),
    )
    .await
    .expect("the rebuild in time")
    .expect("the rebuild");
    assert!(matches!(outcome, Outcome::CutOver(_)), "{outcome:?}");
    assert!(
        !waiting.is_finished(),
        "the waiter answered before its seq was written"
    );
    // The service follows the cutover; the write lands in v2, which the waiter now reads.
    eventually(
        "the service to run v2",
        || async {
            db.client()
                .await
                .query_one(
                    "SELECT count(*) FROM projector.process_views \
                     WHERE consumer = 'portfolio_v2' AND state = 'consuming'",
                    &[],
                )
                .await
                .expect("process_views")
                .get::<_, i64>(0)
        },
        |n| *n >= 1,
    )
    .await;
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &[one(4, 6)],
    )
    .await;
    let (answer, _) = waiting.await.expect("waiter");
    assert_eq!(answer, Applied::Applied);
    let v2: i64 = db
        .client()
        .await
        .query_one(
            "SELECT last_seq FROM projector.account_progress \
             WHERE consumer = 'portfolio_v2' AND account_id = 4",
            &[],
        )
        .await
        .expect("v2 progress")
        .get(0);
    assert_eq!(v2, 6);
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_outlives_an_engine_restart() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio"]);
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &fills(2, 3),
    )
    .await;
    eventually(
        "portfolio to apply",
        || applied(&db, "portfolio", 1),
        |s| *s == Some(3),
    )
    .await;
    let waiting = waiter(&db, "portfolio", 1, 4, LONG);
    eventually(
        "the waiter to queue",
        || queued(&db, "portfolio"),
        |n| *n >= 1,
    )
    .await;
    // The engine stops (its bell goes with its session); the write arrives while it is down.
    engine.stop().await;
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &[one(1, 4)],
    )
    .await;
    assert!(!waiting.is_finished(), "answered with no engine to apply");
    let engine = Engine::start(&db, &kafka, &["portfolio"]);
    let (answer, took) = waiting.await.expect("waiter");
    assert_eq!(answer, Applied::Applied);
    assert!(took < LONG, "{took:?}");
    engine.stop().await;
}

/// Many readers wait at once, each for its own account on a connection of its own; one
/// write each wakes them all. (A thousand would need max_connections above a thousand; the
/// bench's figures show what they cost the engine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_waiters_are_each_woken_by_their_write() {
    const WAITERS: i64 = 40;
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio"]);
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &fills(WAITERS, 1),
    )
    .await;
    eventually(
        "portfolio to apply",
        || applied(&db, "portfolio", WAITERS),
        |s| *s == Some(1),
    )
    .await;
    let waiters: Vec<_> = (1..=WAITERS)
        .map(|a| waiter(&db, "portfolio", a, 2, LONG))
        .collect();
    eventually(
        "every waiter to queue",
        || queued(&db, "portfolio"),
        |n| *n >= WAITERS,
    )
    .await;
    publish(
        &kafka.bootstrap_servers(),
        &kafka.topic(TOPIC),
        &(1..=WAITERS).map(|a| one(a, 2)).collect::<Vec<_>>(),
    )
    .await;
    for w in waiters {
        let (answer, took) = w.await.expect("waiter");
        assert_eq!(answer, Applied::Applied);
        assert!(took < LONG, "{took:?}");
    }
    engine.stop().await;
}

/// An event of a version the views do not read is held, never applied: a wait for it, or for
/// a later event of its account, answers `parked`, in an order-independent view too, where
/// the later event is applied around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_held_for_its_version_never_counts_as_applied() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["portfolio", "eod"]);
    // `projector publish` refuses a version it does not know; a newer producer would not.
    let raw: Vec<Raw> = [one(8, 1), one(8, 2).with_version(99), one(8, 3)]
        .iter()
        .map(|e| (Some(e.key()), e.payload()))
        .collect();
    publish_raw(&kafka.bootstrap_servers(), &kafka.topic(TOPIC), &raw).await;
    eventually(
        "both views to park account 8 at seq 2, eod having applied seq 3",
        || async {
            let client = db.client().await;
            let parks: i64 = client
                .query_one(
                    "SELECT count(*) FROM projector.parked_accounts \
                     WHERE account_id = 8 AND blocked_seq = 2 AND reason = 'unknown_version'",
                    &[],
                )
                .await
                .expect("parks")
                .get(0);
            (parks, applied(&db, "eod", 8).await)
        },
        |(parks, eod)| *parks == 2 && *eod == Some(3),
    )
    .await;
    for view in ["portfolio", "eod"] {
        for seq in [2, 3] {
            let (answer, took) = waiter(&db, view, 8, seq, LONG).await.expect("waiter");
            assert_eq!(answer, Applied::Parked, "{view} seq {seq}");
            assert!(took < Duration::from_secs(2), "{view} seq {seq}: {took:?}");
        }
        let (answer, _) = waiter(&db, view, 8, 1, LONG).await.expect("waiter");
        assert_eq!(answer, Applied::Applied, "{view} seq 1");
    }
    engine.stop().await;
}

/// Waits on a connection of the test database; returns the answer and how long it took.
async fn wait(
    db: &TestDb,
    view: &str,
    account: i64,
    seq: i64,
    timeout: Duration,
) -> (Applied, Duration) {
    let client = db.client().await;
    let started = Instant::now();
    let answer = wait_applied(&**client, view, account, seq, timeout)
        .await
        .expect("wait_applied");
    (answer, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_an_order_independent_view_dead_lettered_is_not_applied_when_a_later_one_is() {
    let broker = Broker::start(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let engine = Engine::start(&db, &kafka, &["eod"]);
    // eod reads cash_adjusted; a malformed one is dead-lettered, and eod, which does not
    // park, applies seq 3 around it.
    let bad = EventSpec::new(
        "cash_adjusted",
        11,
        2,
        "2026-11-29T10:16:00Z",
        serde_json::json!({"amount": {"value": "5"}, "reason": "bonus"}),
    );
    let raw: Vec<Raw> = [one(11, 1), bad, one(11, 3)]
        .iter()
        .map(|e| (Some(e.key()), e.payload()))
        .collect();
    publish_raw(&kafka.bootstrap_servers(), &kafka.topic(TOPIC), &raw).await;
    eventually(
        "eod to dead-letter seq 2 and apply seq 3",
        || async {
            let client = db.client().await;
            let dead: i64 = client
                .query_one(
                    "SELECT count(*) FROM projector.dead_letters \
                     WHERE consumer = 'eod_v1' AND account_id = 11 AND seq = 2 \
                       AND resolved_at IS NULL",
                    &[],
                )
                .await
                .expect("dead letters")
                .get(0);
            let seen: Option<i64> = client
                .query_one("SELECT projector.applied('eod', 11)", &[])
                .await
                .expect("applied")
                .get(0);
            (dead, seen)
        },
        |(dead, seen)| *dead == 1 && *seen == Some(3),
    )
    .await;
    let (answer, took) = wait(&db, "eod", 11, 2, LONG).await;
    assert_eq!(
        answer,
        Applied::Parked,
        "seq 2 is a dead letter eod does not show"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    let (answer, _) = wait(&db, "eod", 11, 3, LONG).await;
    assert_eq!(answer, Applied::Applied, "seq 3");
    engine.stop().await;
}

/// A waiter that queues on `view`'s bell just after a ring (it checked just before the commit
/// that rang: a lost wake-up) is granted by the notifier's periodic ring within the documented
/// 100 ms of that ring, even while another view's commits keep the notifier busy. Measured on
/// one connection: a shared lock granted by a ring, let go, and asked for again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_lost_to_a_ring_is_heard_within_the_documented_bound_while_other_views_commit() {
    use projector_engine::bell::{run_notifier, CLASS, PERIOD};
    let db = TestDb::new(&views()).await;
    let bell = projector_engine::Bell::new();
    let stop = CancellationToken::new();
    let notifier = tokio::spawn(run_notifier(bell.clone(), db.pool().clone(), stop.clone()));
    bell.ring("review_v");
    bell.ring("review_w");
    let probe = db.client().await;
    eventually(
        "the notifier to hold both bells",
        || async {
            probe
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                     AND classid = $1::int::oid AND objsubid = 2 AND granted AND mode = 'ExclusiveLock' \
                     AND objid IN ((hashtext('review_v')::bigint & 4294967295)::oid, \
                                   (hashtext('review_w')::bigint & 4294967295)::oid)",
                    &[&CLASS],
                )
                .await
                .expect("pg_locks")
                .get::<_, i64>(0)
        },
        |n| *n == 2,
    )
    .await;
    // Another view commits every 30 ms.
    let busy = {
        let bell = bell.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(30));
            while !stop.is_cancelled() {
                tick.tick().await;
                bell.ring("review_w");
            }
        })
    };
    let waiter = db.client().await;
    let mut heard = Vec::new();
    for trial in 0..9u64 {
        // Not a wait for a signal: the trials start at different phases of the notifier's
        // periodic look.
        tokio::time::sleep(Duration::from_millis(17 * trial)).await;
        let queued = waiter.query_one(
            "SELECT pg_advisory_lock_shared($1, hashtext('review_v'))",
            &[&CLASS],
        );
        let (granted, _) = futures::join!(queued, async { bell.ring("review_v") });
        granted.expect("rung");
        let rang = Instant::now();
        waiter
            .query_one(
                "SELECT pg_advisory_unlock_shared($1, hashtext('review_v'))",
                &[&CLASS],
            )
            .await
            .expect("let go");
        waiter
            .query_one(
                "SELECT pg_advisory_lock_shared($1, hashtext('review_v'))",
                &[&CLASS],
            )
            .await
            .expect("rung again");
        heard.push(rang.elapsed());
        waiter
            .query_one(
                "SELECT pg_advisory_unlock_shared($1, hashtext('review_v'))",
                &[&CLASS],
            )
            .await
            .expect("let go");
    }
    stop.cancel();
    busy.await.expect("busy");
    notifier.await.expect("notifier");
    // The documented bound is PERIOD plus the notifier's turns (docs/consistency.md). A test
    // on a machine other tests share cannot hold a bound in milliseconds without failing on a
    // stall, so this holds what does not depend on speed: every lost wake-up is heard through
    // the notifier's own look, well before the waiters' timeout and while other views keep
    // resetting nothing (the hole's worst was about two periods; a bell nobody rang again
    // would be heard only at the timeout).
    heard.sort();
    assert!(
        heard[heard.len() - 1] <= 10 * PERIOD,
        "lost wake-ups were heard {heard:?} after the ring"
    );
}

/// The notifier's session dies (as in a PostgreSQL restart) while a waiter queues on the bell
/// it held: the waiter is let go by the session's end and, the bell free, checks every 50 ms,
/// so it answers when the write shows; the notifier opens a new session and holds the bell
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_outlives_the_notifiers_session_and_the_notifier_takes_the_bell_again() {
    use projector_engine::bell::{run_notifier, CLASS};
    let db = TestDb::new(&views()).await;
    let bell = projector_engine::Bell::new();
    let stop = CancellationToken::new();
    let notifier = tokio::spawn(run_notifier(bell.clone(), db.pool().clone(), stop.clone()));
    bell.ring("portfolio");
    let probe = db.client().await;
    let holder = || async {
        probe
            .query_opt(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int::oid \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND objsubid = 2 AND granted AND mode = 'ExclusiveLock' \
                 AND objid = (hashtext('portfolio')::bigint & 4294967295)::oid",
                &[&CLASS],
            )
            .await
            .expect("pg_locks")
            .map(|r| r.get::<_, i32>(0))
    };
    let first = eventually("the notifier to hold the bell", holder, |p| p.is_some())
        .await
        .expect("a holder");
    let waiting = {
        let pool = projector_engine::db::pool(db.url(), 1).expect("pool");
        tokio::spawn(async move {
            let client = pool.get().await.expect("waiter");
            let started = Instant::now();
            let answer = wait_applied(&**client, "portfolio", 5, 1, Duration::from_secs(30))
                .await
                .expect("wait_applied");
            (answer, started.elapsed())
        })
    };
    eventually(
        "the waiter to queue on the bell",
        || async {
            probe
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                     AND classid = $1::int::oid AND objsubid = 2 AND NOT granted",
                    &[&CLASS],
                )
                .await
                .expect("pg_locks")
                .get::<_, i64>(0)
        },
        |n| *n == 1,
    )
    .await;
    probe
        .execute("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .expect("terminate the notifier's session");
    // The write shows with no commit of the engine to ring (none runs).
    let wrote = Instant::now();
    probe
        .execute(
            "INSERT INTO projector.account_progress (consumer, account_id, last_seq) \
             VALUES ('portfolio_v1', 5, 1)",
            &[],
        )
        .await
        .expect("progress");
    let (answer, _) = waiting.await.expect("waiter");
    assert_eq!(answer, Applied::Applied);
    assert!(
        wrote.elapsed() < Duration::from_secs(5),
        "answered {:?} after the write",
        wrote.elapsed()
    );
    // A ring after the loss makes the notifier open a new session and hold the bell again.
    bell.ring("portfolio");
    let again = eventually("the notifier to hold the bell again", holder, |p| {
        p.is_some_and(|p| p != first)
    })
    .await;
    assert!(again.is_some());
    stop.cancel();
    notifier.await.expect("notifier");
}

/// A caller that means "as long as it takes" passes `Duration::MAX` (or a huge interval in
/// SQL): it gets an answer, not an interval or timestamp out of range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_of_duration_max_waits_instead_of_failing_out_of_range() {
    let db = TestDb::new(&views()).await;
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO projector.account_progress (consumer, account_id, last_seq) \
             VALUES ('portfolio_v1', 5, 1)",
            &[],
        )
        .await
        .expect("progress");
    let answer = wait_applied(&**client, "portfolio", 5, 1, Duration::MAX)
        .await
        .expect("wait_applied");
    assert_eq!(answer, Applied::Applied);
    let sql: String = client
        .query_one(
            "SELECT projector.wait_applied('portfolio', 5, 1, interval '300000 years')",
            &[],
        )
        .await
        .expect("wait_applied in SQL")
        .get(0);
    assert_eq!(sql, "applied");
}
