//! Adversarial review of read-your-writes (issue 27): ways `projector.wait_applied` could
//! answer `applied` for a write the view does not show, or answer late. Each test names the
//! behaviour it checks; see docs/consistency.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::broker::{Broker, Kafka};
use crate::support::eventually;
use crate::support::kafka::{publish_raw, Raw};
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::{fill, EventSpec, TestDb};
use projector_engine::{wait_applied, Applied, Registry};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "fills";
const LONG: Duration = Duration::from_secs(60);

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

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
