//! Faults: broker request errors and a broker outage injected with the mock cluster, and
//! PostgreSQL connections killed with `pg_terminate_backend` mid-stream. No loss, no
//! duplicate effect, and the consumer recovers without a restart.

use std::sync::Arc;
use std::time::Duration;

use crate::support::kafka::{config, publish, Progress};
use crate::support::{fills, rows, trail_fold, Trail};
use projector_devkit::devbroker::{DevBroker, RDKafkaApiKey, RDKafkaRespErr};
use projector_engine::kafka::source::run_view;
use projector_engine::testkit::TestDb;
use projector_engine::{Applier, Registry, SourceOrdering};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(180);

async fn kill_backends(admin: &deadpool_postgres::Client, database: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND application_name = 'projector' AND pid <> pg_backend_pid()",
            &[&database],
        )
        .await
        .expect("terminate")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_faults_and_killed_connections_lose_nothing_and_apply_nothing_twice() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = Arc::new(
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"),
    );
    let broker = DevBroker::start(1, &[("fills", 4)]).expect("broker");
    let events = fills(100, 120);
    let ends = publish(&broker.bootstrap_servers(), "fills", &events).await;
    let total = events.len() as i64;

    let progress = Arc::new(Progress::default());
    let mut cfg = config(&broker.bootstrap_servers(), "fills");
    cfg.max_batch_messages = 100;
    let token = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier.clone(),
        db.pool().clone(),
        cfg,
        progress.clone(),
        token.clone(),
    ));
    // A separate connection, not the engine's, does the killing.
    let admin_pool =
        projector_engine::db::pool(&projector_engine::testkit::admin_url(), 1).expect("admin pool");
    let admin = admin_pool.get().await.expect("admin");

    progress
        .wait("a tenth", LIMIT, |p| p.committed_total() >= total / 10)
        .await;
    // Fetches fail with retriable errors for a while.
    broker
        .request_errors(
            RDKafkaApiKey::Fetch,
            &[
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            ],
        )
        .expect("inject fetch errors");
    // Kafka-side commits (for lag tools only) fail too: nothing depends on them.
    broker
        .request_errors(
            RDKafkaApiKey::OffsetCommit,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 3],
        )
        .expect("inject commit errors");

    // PostgreSQL connections die under running batches, several times.
    let mut killed = 0;
    for step in 2..=5 {
        progress
            .wait("more progress", LIMIT, |p| {
                p.committed_total() >= step * total / 10
            })
            .await;
        killed += kill_backends(&admin, db.name()).await;
    }
    assert!(killed > 0, "there were engine connections to kill");

    // The only broker goes down and comes back.
    progress
        .wait("six tenths", LIMIT, |p| {
            p.committed_total() >= 6 * total / 10
        })
        .await;
    let troubles = progress.kafka_troubles();
    broker.broker_down(1).expect("broker down");
    progress
        .wait("the consumer to notice the outage", LIMIT, |p| {
            p.kafka_troubles() > troubles
        })
        .await;
    let at_outage = progress.committed_total();
    broker.broker_up(1).expect("broker up");
    progress
        .wait("progress after the outage", LIMIT, |p| {
            p.committed_total() > at_outage
        })
        .await;

    progress.wait_for_ends(&ends, LIMIT).await;
    token.cancel();
    task.await.expect("task").expect("view ran without errors");

    let client = db.client().await;
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
    let r = client
        .query_one(
            "SELECT sum(applied)::bigint, sum(duplicates)::bigint, sum(dead_lettered)::bigint, \
             sum(next_offset)::bigint FROM projector.offsets",
            &[],
        )
        .await
        .expect("counters");
    assert_eq!(r.get::<_, i64>(0), total, "every event applied once");
    assert_eq!(r.get::<_, i64>(1), 0, "no duplicate reached a view");
    assert_eq!(r.get::<_, i64>(2), 0);
    assert_eq!(r.get::<_, i64>(3), total, "every offset committed");
}
