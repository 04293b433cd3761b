//! A pooled connection is never handed out inside a transaction, even when the future that
//! used it was dropped half-way through a batch (a task aborted by shutdown, a timeout).

use std::sync::Arc;

use crate::support::{fills, rows, trail_fold, Trail};
use projector_engine::testkit::{consume, Partition, TestDb};
use projector_engine::{Applier, Registry, SourceOrdering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_cancelled_at_any_point_leave_no_transaction_behind() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    // One connection: every attempt reuses the one the cancelled attempt held.
    let pool = projector_engine::db::pool(db.url(), 1).expect("pool");
    let applier = Arc::new(
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"),
    );
    let events = fills(20, 30);
    let log = Arc::new(Partition::from_events("fills", 0, &events));

    for cancel_after in 0..40usize {
        let (applier, log, task_pool) = (applier.clone(), log.clone(), pool.clone());
        let task = tokio::spawn(async move {
            let mut client = task_pool.get().await.expect("connection");
            let start = applier
                .stored_offset(&client, "fills", 0)
                .await
                .expect("offset")
                .unwrap_or(0);
            applier
                .apply(&mut client, &log.batch(start, 37))
                .await
                .map(|o| o.next_offset)
        });
        // Let the attempt run for a varying number of scheduler turns, then drop it
        // wherever it is: before BEGIN, between pipelined statements, inside COMMIT.
        for _ in 0..cancel_after {
            tokio::task::yield_now().await;
        }
        task.abort();
        let _ = task.await;

        // The same connection, handed out again, is outside any transaction: a write on it
        // commits alone and is visible to another connection.
        let client = pool
            .get()
            .await
            .expect("connection after a cancelled batch");
        // In a simple query outside a transaction, the transaction starts with the statement;
        // inside one, it started earlier.
        let answer = client
            .simple_query("SELECT now() <> statement_timestamp()")
            .await
            .expect("the connection is usable");
        let in_tx = answer.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v == "t"),
            _ => None,
        });
        assert_eq!(
            in_tx,
            Some(false),
            "attempt {cancel_after}: connection handed out inside a transaction"
        );
    }

    // Whatever the cancellations left committed, finishing the stream gives the fold.
    let mut client = pool.get().await.expect("connection");
    consume(&applier, &mut client, &log, 37).await;
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
}
