//! A batch drains at most a thousand waiting events per account; the worker drains the rest
//! after it, step by step. A drain cut short (the process stopped, a step failed) must go on
//! by itself, not wait for the account's next event, which may be hours away: the account
//! stays parked at its next `seq`, and the partition's worker drains such accounts when it
//! starts and again after a step failed. Through the real Kafka source on the mock cluster
//! and real PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::kafka::{config, publish};
use crate::support::{trail_of, trail_parks, Trail};
use projector_devkit::devbroker::DevBroker;
use projector_engine::kafka::running;
use projector_engine::kafka::source::{run_view, Observer};
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Registry, SourceOrdering};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Deadline for every awaited signal: generous, since nothing here waits for time to pass.
const LIMIT: Duration = Duration::from_secs(120);

/// Account 1's events: seq 2 to 2500, then seq 1 (so that everything waits until the last).
fn backlog() -> Vec<EventSpec> {
    let f = |seq: i64| {
        fill(
            1,
            seq,
            "2026-11-29T10:15:00Z",
            "EURUSD",
            "buy",
            "1",
            "1.5",
            "0",
        )
    };
    let mut events: Vec<EventSpec> = (2..=2500).map(f).collect();
    events.push(f(1));
    events
}

fn trail_applier() -> Arc<Applier> {
    Arc::new(Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"))
}

/// The drain steps the source reports, per account.
#[derive(Default)]
struct Drains {
    steps: Mutex<HashMap<i64, Vec<Result<bool, String>>>>,
    changed: Notify,
}

impl Drains {
    /// Waits until a step of `account` reports what `done` accepts.
    async fn wait(&self, account: i64, what: &str, done: impl Fn(&Result<bool, String>) -> bool) {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let notified = self.changed.notified();
            if self
                .steps
                .lock()
                .expect("lock")
                .get(&account)
                .is_some_and(|s| s.iter().any(&done))
            {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("timed out waiting for {what}");
            }
        }
    }
}

impl Observer for Drains {
    fn drain_step(
        &self,
        _consumer: &str,
        _partition: i32,
        account: i64,
        result: Result<bool, &str>,
    ) {
        self.steps
            .lock()
            .expect("lock")
            .entry(account)
            .or_default()
            .push(result.map_err(str::to_owned));
        self.changed.notify_waiters();
    }
}

async fn drained_in_full(client: &deadpool_postgres::Client) {
    let expected: Vec<String> = (1..=2500).map(|s| s.to_string()).collect();
    assert_eq!(
        trail_of(client, 1).await.as_deref(),
        Some(expected.join(",").as_str()),
        "every waiting event applied, in seq order"
    );
    assert!(trail_parks(client).await.is_empty());
    let waiting: i64 = client
        .query_one("SELECT count(*) FROM projector.waiting_events", &[])
        .await
        .expect("waiting")
        .get(0);
    assert_eq!(waiting, 0);
}

/// Seq 1 committed with the first thousand events that waited for it, and nothing after:
/// what a process stopped (SIGTERM, a crash) right after that batch leaves. Assigned the
/// partition again, with no event of the account to come, the worker drains the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_cut_short_resumes_when_the_partition_is_assigned_again() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = trail_applier();
    let broker = DevBroker::start(1, &[("fills", 1)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let events = backlog();
    publish(&bootstrap, "fills", &events).await;
    let log = Partition::from_events("fills", 0, &events);
    let mut client = db.client().await;
    applier
        .apply(&mut client, &log.batch(0, 2499))
        .await
        .expect("everything waits for seq 1");
    let out = applier
        .apply(&mut client, &log.batch(2499, 1))
        .await
        .expect("seq 1");
    assert_eq!(out.more_to_drain, [1], "one batch drains a thousand");
    assert_eq!(trail_parks(&client).await, [(1, 1002)]);

    let drains = Arc::new(Drains::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier,
        db.pool().clone(),
        config(&bootstrap, "fills"),
        drains.clone(),
        stop.clone(),
    ));
    drains
        .wait(1, "account 1 to be drained in full", |r| r == &Ok(false))
        .await;
    stop.cancel();
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the view stops")
        .expect("view task")
        .expect("the view ran without errors");
    drained_in_full(&client).await;
}

/// The worker drains after the batch that brought seq 1, and its first step fails (here:
/// refused, since a drop holds the version's running lock). The worker tries again by
/// itself once the cause is gone, with no event of the account to come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_fails_is_tried_again_without_the_accounts_next_event() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = trail_applier();
    let broker = DevBroker::start(1, &[("fills", 1)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let events = backlog();
    let (waiting, first) = events.split_at(2499);
    publish(&bootstrap, "fills", waiting).await;
    let log = Partition::from_events("fills", 0, waiting);
    let mut client = db.client().await;
    applier
        .apply(&mut client, &log.batch(0, 2499))
        .await
        .expect("everything waits for seq 1");

    let dropper_pool = projector_engine::db::pool(db.url(), 1).expect("pool");
    let dropper = dropper_pool.get().await.expect("session");
    assert!(running::try_take(&dropper, "trail_v1").await.expect("take"));

    let drains = Arc::new(Drains::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier,
        db.pool().clone(),
        config(&bootstrap, "fills"),
        drains.clone(),
        stop.clone(),
    ));
    publish(&bootstrap, "fills", first).await;
    drains
        .wait(1, "a drain step of account 1 to fail", |r| r.is_err())
        .await;
    running::give_back(&dropper, "trail_v1")
        .await
        .expect("give back");
    drains
        .wait(1, "account 1 to be drained in full", |r| r == &Ok(false))
        .await;
    stop.cancel();
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the view stops")
        .expect("view task")
        .expect("the view ran without errors");
    drained_in_full(&client).await;
}
