//! Moving an existing deployment to the inbox keyed by the event's own time (V0009) with one
//! command, `projector migrate`, while events flow: killed with SIGKILL mid-way and run
//! again, it leaves the database either as it was or moved, never in between; an event
//! applied before the move and redelivered after it is still a duplicate; a binary from before
//! the move stops writing the inbox, loudly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use projector_engine::projection::render;
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{Partition, TestDb};
use projector_engine::{Applier, Projection, SourceOrdering};

use crate::support::process::{run_output, Projector};
use crate::support::{fills, offsets};

fn code(name: &str, version: i32) -> Arc<dyn Projection> {
    projector_views::registry()
        .expect("the built-in views")
        .code_for(name, version)
        .expect("the view's code")
}

/// Copies `select`'s rows out of `from` into `into` (`COPY ... TO STDOUT`, then `FROM STDIN`).
async fn copy_rows(
    from: &deadpool_postgres::Client,
    select: &str,
    into: &deadpool_postgres::Client,
    target: &str,
) -> u64 {
    let out = from
        .copy_out(&format!("COPY ({select}) TO STDOUT"))
        .await
        .expect("copy out");
    futures::pin_mut!(out);
    let mut data = Vec::new();
    while let Some(chunk) = out.next().await {
        data.extend_from_slice(&chunk.expect("a chunk"));
    }
    let sink = into
        .copy_in(&format!("COPY {target} FROM STDIN"))
        .await
        .expect("copy in");
    futures::pin_mut!(sink);
    sink.send(Bytes::from(data)).await.expect("copy data");
    sink.finish().await.expect("copy done")
}

async fn migrations(client: &deadpool_postgres::Client) -> Vec<i32> {
    client
        .query(
            "SELECT version FROM projector.schema_history ORDER BY version",
            &[],
        )
        .await
        .expect("history")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_moved_while_events_flow_and_a_kill_mid_way_applies_nothing_twice() {
    let eod = code("eod", 1);
    let events = fills(8, 10);
    let (before, after) = events.split_at(50);

    // What an engine before V0009 left: eod v1 applied the first 50 events. Its rows come
    // from an engine of today, applied in a scratch database, and are copied into a database
    // whose engine schema stops at V0008, the inbox as it was: (consumer, event_id).
    let scratch = TestDb::new(&projector_views::registry().expect("views")).await;
    let mut scratch_client = scratch.client().await;
    let applier = Applier::new(Arc::clone(&eod), SourceOrdering::PerAccount).expect("applier");
    let log = Partition::from_events("fills", 0, before);
    applier
        .apply(&mut scratch_client, &log.batch(0, 100))
        .await
        .expect("the engine before the move");

    let db = TestDb::at_engine_migration(8).await;
    let client = db.client().await;
    assert_eq!(migrations(&client).await, (1..=8).collect::<Vec<_>>());
    client
        .batch_execute(&render(&*eod, &eod.ddl()))
        .await
        .expect("eod's tables");
    client
        .execute(
            "INSERT INTO projector.views (name, version, state, fingerprint) VALUES ('eod', 1, 'live', $1)",
            &[&projector_engine::fingerprint::of(&*eod)],
        )
        .await
        .expect("eod's registry row");
    for table in eod.tables() {
        let table = render(&*eod, &table);
        copy_rows(
            &scratch_client,
            &format!("SELECT * FROM {table}"),
            &client,
            &table,
        )
        .await;
    }
    let moved = copy_rows(
        &scratch_client,
        "SELECT consumer, event_id, applied_at FROM projector.inbox",
        &client,
        "projector.inbox (consumer, event_id, applied_at)",
    )
    .await;
    assert_eq!(moved, 50);
    client
        .execute(
            "INSERT INTO projector.offsets (consumer, topic, partition, next_offset, applied) \
             VALUES ('eod_v1', 'fills', 0, 50, 50)",
            &[],
        )
        .await
        .expect("eod's offset");
    let built = dump(&client, &*eod).await;

    // An engine before the move keeps writing the inbox, one row at a time, until refused.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (pool, writing) = (db.pool().clone(), writing.clone());
        tokio::spawn(async move {
            let client = pool.get().await.expect("writer");
            let mut n = 0u64;
            while writing.load(Ordering::Relaxed) {
                let r = client
                    .execute(
                        "INSERT INTO projector.inbox (consumer, event_id) VALUES ('old_v1', $1)",
                        &[&format!("w{n}")],
                    )
                    .await;
                match r {
                    Ok(_) => n += 1,
                    Err(e) => {
                        let text = e
                            .as_db_error()
                            .map_or_else(|| e.to_string(), |d| d.message().to_owned());
                        return (n, e.code().map(|c| c.code().to_owned()), text);
                    }
                }
                tokio::task::yield_now().await;
            }
            (n, None, String::new())
        })
    };

    // One of its batches is in flight: its transaction holds the inbox.
    let mut holder = db.client().await;
    let hold = holder.transaction().await.expect("a batch in flight");
    hold.execute(
        "INSERT INTO projector.inbox (consumer, event_id) VALUES ('old_v1', 'in-flight')",
        &[],
    )
    .await
    .expect("the batch's row");

    // The move waits for it; it is killed there, mid-way.
    let url = db.url().to_owned();
    let mut migrate = Projector::spawn(&["migrate", "--database-url", &url], "warn");
    let observer = db.client().await;
    // The migration's text as pg_stat_activity shows it: its first line (the view cuts a
    // long query at track_activity_query_size).
    // In this test's database only: every test database runs this migration once, and one
    // waiting on a lock elsewhere is another test's session.
    let moving = "datname = current_database() \
        AND query LIKE '-- The inbox keyed by the event''s own time%' AND wait_event_type = 'Lock'";
    crate::support::eventually(
        "the move to wait for the batch in flight",
        || async {
            observer
                .query_one(
                    &format!("SELECT count(*) FROM pg_stat_activity WHERE {moving}"),
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get::<_, i64>(0)
        },
        |n| *n == 1,
    )
    .await;
    migrate.kill();
    // The server notices a dead client only when it next writes to it; the test does not
    // wait for that.
    observer
        .execute(
            &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {moving}"),
            &[],
        )
        .await
        .expect("terminate the killed move's session");
    hold.commit().await.expect("the batch in flight commits");
    // Nothing of the move stayed: the inbox is as it was, and still takes rows.
    assert_eq!(migrations(&observer).await, (1..=8).collect::<Vec<_>>());
    let layout: i64 = observer
        .query_one(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_schema = 'projector' AND table_name = 'inbox'",
            &[],
        )
        .await
        .expect("columns")
        .get(0);
    assert_eq!(layout, 3, "(consumer, event_id, applied_at)");

    // Run again: the move completes.
    let out = tokio::task::spawn_blocking(move || run_output(&["migrate", "--database-url", &url]))
        .await
        .expect("the command's thread");
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(migrations(&observer).await.contains(&9));
    let (written, code, error) = tokio::time::timeout(crate::support::WAIT, writer)
        .await
        .expect("the old writer is refused")
        .expect("the writer's task");
    writing.store(false, Ordering::Relaxed);
    assert_eq!(code.as_deref(), Some("55000"), "{error}");
    assert!(error.contains("upgrade it"), "{error}");
    // Every row the old layout took, the in-flight batch's too, is in the inbox before V0009.
    let legacy: i64 = observer
        .query_one("SELECT count(*) FROM projector.inbox_legacy", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(legacy as u64, 50 + written + 1);

    // The engine of today resumes eod v1: the events after the move, then copies of those
    // applied before it, republished by a relay.
    let mut client = db.client().await;
    let mut log = Partition::from_events("fills", 0, before);
    for e in after.iter().chain(before) {
        log.push_event(e);
    }
    let applier = Applier::new(Arc::clone(&eod), SourceOrdering::PerAccount).expect("applier");
    let mut at = 50;
    while at < log.log.len() as i64 {
        at = applier
            .apply(&mut client, &log.batch(at, 16))
            .await
            .expect("apply after the move")
            .next_offset;
    }
    let o = offsets(&client, "eod_v1").await;
    assert_eq!((o.applied, o.duplicates), (80, 50), "{o:?}");
    assert_ne!(dump(&client, &*eod).await, built);
    // Equal to the fold of the 80 distinct events, applied once in a database of today.
    let oracle = TestDb::new(&projector_views::registry().expect("views")).await;
    let mut oracle_client = oracle.client().await;
    Applier::new(Arc::clone(&eod), SourceOrdering::PerAccount)
        .expect("applier")
        .apply(
            &mut oracle_client,
            &Partition::from_events("fills", 0, &events).batch(0, 100),
        )
        .await
        .expect("oracle");
    assert_eq!(
        dump(&client, &*eod).await,
        dump(&oracle_client, &*eod).await
    );
}
