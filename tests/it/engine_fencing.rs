//! Fencing: the offset update is conditional on the row locked at the start of the batch,
//! so a writer that lost its partition (a zombie after a rebalance) cannot commit.

use std::sync::Arc;

use crate::support::{fills, rows, trail_fold, Trail};
use projector_engine::testkit::{consume, Partition, TestDb};
use projector_engine::{Applier, ApplyError, Registry, SourceOrdering};

async fn setup() -> (TestDb, Arc<Applier>, Partition) {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = Arc::new(
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"),
    );
    let partition = Partition::from_events("fills", 0, &fills(5, 20));
    (db, applier, partition)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_holding_a_batch_cannot_commit_it() {
    let (db, applier, log) = setup().await;
    let mut zombie = db.client().await;
    let mut owner = db.client().await;

    // The zombie opens its batch and applies it, but stalls before committing while holding
    // the partition's offset row lock.
    applier
        .make_days_for(&mut zombie, &log.batch(0, 10))
        .await
        .expect("the inbox's days");
    let mut zombie_tx = zombie.transaction().await.expect("begin");
    let zombie_outcome = applier
        .apply_in(&mut zombie_tx, &log.batch(0, 10))
        .await
        .expect("apply");
    assert_eq!(zombie_outcome.next_offset, 10);

    // The new owner of the partition starts from the stored offset (0) and blocks on the lock.
    let new_owner = {
        let applier = applier.clone();
        let batch = log.batch(0, 15);
        tokio::spawn(async move {
            applier
                .apply(&mut owner, &batch)
                .await
                .map(|o| o.next_offset)
        })
    };
    // Wait until the new owner really is queued behind the zombie's row lock.
    let observer = db.client().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: i64 = observer
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'", &[])
            .await
            .expect("pg_stat_activity")
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new owner never queued on the lock"
        );
        tokio::task::yield_now().await;
    }
    // The zombie gives up (its session expired); its transaction rolls back.
    drop(zombie_tx);
    assert_eq!(
        new_owner.await.expect("task").expect("new owner commits"),
        15
    );

    // Later the zombie wakes with its stale batch and tries again: fenced.
    let err = applier
        .apply(&mut zombie, &log.batch(0, 10))
        .await
        .expect_err("fenced");
    assert!(!err.is_retryable(), "fencing means seek or stop, not retry");
    match err {
        ApplyError::Fenced { start, stored, .. } => assert_eq!((start, stored), (0, 15)),
        other => panic!("expected fencing, got {other}"),
    }
    // Only the owner's batch took effect.
    let applied: i64 = observer
        .query_one("SELECT coalesce(sum(events), 0)::bigint FROM trail_v1", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(applied, 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_commit_each_offset_range_once() {
    let (db, applier, log) = setup().await;
    // The first batch is committed alone: on a partition nobody has committed yet any start
    // is accepted (a new view reads from the earliest retained offset).
    let first = applier
        .apply(&mut db.client().await, &log.batch(0, 5))
        .await
        .expect("first batch");
    let mut ranges = vec![(0, first.next_offset)];
    let log = Arc::new(log);
    let mut writers = Vec::new();
    for (i, batch_len) in [3usize, 7, 11].into_iter().enumerate() {
        let (applier, log, pool) = (applier.clone(), log.clone(), db.pool().clone());
        writers.push(tokio::spawn(async move {
            let mut client = pool.get().await.expect("connection");
            let mut committed = Vec::new();
            let mut fenced = 0;
            // Each writer starts somewhere else: overlapping, stale and current positions.
            let mut start = [0i64, 2, 5][i];
            while start < log.log.len() as i64 {
                match applier
                    .apply(&mut client, &log.batch(start, batch_len))
                    .await
                {
                    Ok(outcome) => {
                        committed.push((start, outcome.next_offset));
                        start = outcome.next_offset;
                    }
                    Err(ApplyError::Fenced { stored, .. }) => {
                        fenced += 1;
                        start = stored;
                    }
                    Err(e) => panic!("writer {i}: {e}"),
                }
            }
            (committed, fenced)
        }));
    }
    let mut fenced = 0;
    for w in writers {
        let (committed, f) = w.await.expect("writer");
        ranges.extend(committed);
        fenced += f;
    }
    ranges.sort();
    // The committed ranges tile the log exactly: no offset committed twice, none skipped.
    let mut expected_start = 0;
    for (start, end) in &ranges {
        assert_eq!(*start, expected_start, "ranges {ranges:?}");
        expected_start = *end;
    }
    assert_eq!(expected_start, log.log.len() as i64);
    assert!(
        fenced > 0,
        "three writers on one partition must fence each other"
    );

    let client = db.client().await;
    let committed_rows = rows(&client, "trail_v1").await;
    assert_eq!(committed_rows, trail_fold(&fills(5, 20)));

    // The single-writer result, for comparison, in a fresh database.
    let (single_db, single, log) = setup().await;
    let mut client = single_db.client().await;
    consume(&single, &mut client, &log, 7).await;
    let single_rows = rows(&client, "trail_v1").await;
    assert_eq!(committed_rows, single_rows);
}
