//! Repairs take the version's running lock (`kafka/running.rs`) shared for their
//! transaction, as a running consumer does for its session: a drop (`retire --drop`,
//! `rebuild --cancel`), which takes it exclusively, cannot delete a version's rows while a
//! repair writes them, and a repair of a version being dropped is refused in one line,
//! writing nothing.

use crate::support::{lock_waiters, rows, with_options};
use projector_engine::kafka::running;
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, ApplyError, Disposition, SourceOrdering};

/// A fill of account 9; `side "hold"` is poison.
fn f9(seq: i64, side: &str) -> EventSpec {
    fill(
        9,
        seq,
        "2026-11-29T10:15:00Z",
        "EURUSD",
        side,
        "1",
        "1.1",
        "0",
    )
}

/// The built-in views (the command line knows them) and portfolio's applier.
async fn portfolio_db() -> (TestDb, Applier) {
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    let view = registry
        .select(&["portfolio".to_owned()])
        .expect("portfolio")[0]
        .clone();
    (
        db,
        Applier::new(view, SourceOrdering::PerAccount).expect("applier"),
    )
}

/// Everything a repair could write: the view's rows, dead letters, parks, waiting events,
/// progress and skips.
async fn state(client: &deadpool_postgres::Client) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for table in [
        "portfolio_v1",
        "projector.dead_letters",
        "projector.parked_accounts",
        "projector.waiting_events",
        "projector.account_progress",
        "projector.skips",
    ] {
        all.push(rows(client, table).await);
    }
    all
}

/// A session of its own, as `retire --drop` holds the lock on one.
async fn session(db: &TestDb) -> (deadpool_postgres::Pool, deadpool_postgres::Client) {
    let pool = projector_engine::db::pool(
        &with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")]),
        1,
    )
    .expect("pool");
    let client = pool.get().await.expect("session");
    (pool, client)
}

/// Account 9: seq 1 applied, seq 2 dead-lettered (poison), seq 3 waits.
async fn parked_at_a_dead_letter(
    db: &TestDb,
    applier: &Applier,
) -> (deadpool_postgres::Client, i64) {
    let mut client = db.client().await;
    let log = Partition::from_events("fills", 0, &[f9(1, "buy"), f9(2, "hold"), f9(3, "buy")]);
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    let id: i64 = client
        .query_one("SELECT id FROM projector.dead_letters", &[])
        .await
        .expect("dead letter")
        .get(0);
    (client, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_of_a_version_being_dropped_is_refused_in_one_line() {
    let (db, applier) = portfolio_db().await;
    let (mut client, id) = parked_at_a_dead_letter(&db, &applier).await;
    let before = state(&client).await;
    let (_pool, dropper) = session(&db).await;
    assert!(
        running::try_take(&dropper, "portfolio_v1")
            .await
            .expect("take"),
        "nothing runs the version: the drop takes its lock"
    );

    let refusals = [
        applier
            .retry_dead_letter(&mut client, id, "alice")
            .await
            .map(drop),
        applier
            .skip_dead_letter(&mut client, id, "alice", "lost")
            .await
            .map(drop),
        applier
            .skip_seq(&mut client, 9, 2, "alice", "lost")
            .await
            .map(drop),
        applier.drain_account(&mut client, 9).await.map(drop),
    ];
    for refused in refusals {
        match refused {
            Err(e @ ApplyError::Refused { .. }) => {
                let line = e.to_string();
                assert!(
                    line.contains("being dropped") && !line.contains('\n'),
                    "{line}"
                );
            }
            other => panic!("a repair during a drop must be refused: {other:?}"),
        }
    }
    assert_eq!(state(&client).await, before, "nothing was written");

    // Through the command line: one line on stderr, exit status 1.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
        .args(["dlq", "retry", &id.to_string(), "--by", "alice"])
        .args(["--database-url", db.url()])
        .output()
        .expect("run projector");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("being dropped"), "{stderr}");

    // Once the drop let go, the repair runs (and fails again: the bytes are still poison).
    running::give_back(&dropper, "portfolio_v1")
        .await
        .expect("give back");
    let (again, _) = applier
        .retry_dead_letter(&mut client, id, "alice")
        .await
        .expect("retry");
    assert_eq!(again, Disposition::DeadLettered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_waits_for_a_repair_in_flight() {
    let (db, applier) = portfolio_db().await;
    let (client, _) = parked_at_a_dead_letter(&db, &applier).await;
    // Another session holds account 9's progress row: a repair of the account waits for it
    // inside its transaction.
    let (_locker_pool, locker) = session(&db).await;
    locker
        .batch_execute(
            "BEGIN; SELECT 1 FROM projector.account_progress \
             WHERE consumer = 'portfolio_v1' AND account_id = 9 FOR UPDATE",
        )
        .await
        .expect("lock the account");
    let applier = std::sync::Arc::new(applier);
    let repair = {
        let (applier, pool) = (applier.clone(), db.pool().clone());
        tokio::spawn(async move {
            let mut c = pool.get().await.expect("client");
            applier.drain_account(&mut c, 9).await
        })
    };
    lock_waiters(&client, 1).await;

    let (_pool, dropper) = session(&db).await;
    assert!(
        !running::try_take(&dropper, "portfolio_v1")
            .await
            .expect("take"),
        "the repair in flight holds the version's running lock"
    );
    locker.batch_execute("ROLLBACK").await.expect("release");
    repair
        .await
        .expect("repair task")
        .expect("the repair goes through");
    assert!(
        running::try_take(&dropper, "portfolio_v1")
            .await
            .expect("take"),
        "the repair ended: the drop may go on"
    );
}
