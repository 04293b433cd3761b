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
