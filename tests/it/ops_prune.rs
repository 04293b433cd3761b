//! Inbox retention on a table of a million rows: batches through the time index, nothing
//! newer than the window removed, and the apply path running at the same time unharmed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use projector_engine::ops::prune::{check_window, prune_inbox, PruneOptions};
use projector_engine::testkit::{Partition, TestDb};
use projector_engine::{Applier, Registry, SourceOrdering};

use crate::support::process::run_to_end;
use crate::support::{fills, rows, trail_fold, Trail};

const DAY: Duration = Duration::from_secs(86_400);
const OLD: i64 = 800_000;
const RECENT: i64 = 200_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_rows_go_in_batches_and_nothing_newer_than_the_window() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let client = db.client().await;

    // A million inbox rows of a retired version: 800,000 applied 8 to 17 days ago, 200,000
    // applied 1 to 6 days ago. Loaded with COPY; the load is not what is measured.
    let now: chrono::DateTime<chrono::Utc> = client
        .query_one("SELECT now()", &[])
        .await
        .expect("now")
        .get(0);
    let sink = client
        .copy_in("COPY projector.inbox (consumer, event_id, applied_at) FROM STDIN")
        .await
        .expect("copy");
    futures::pin_mut!(sink);
    let mut chunk = String::new();
    for i in 0..OLD + RECENT {
        let age = if i < OLD {
            chrono::Duration::days(8) + chrono::Duration::seconds(i)
        } else {
            chrono::Duration::days(1) + chrono::Duration::seconds((i - OLD) * 2)
        };
        let at = (now - age).to_rfc3339();
        chunk.push_str(&format!("old_v1\te{i}\t{at}\n"));
        if chunk.len() > 1 << 20 {
            sink.send(Bytes::from(std::mem::take(&mut chunk)))
                .await
                .expect("copy chunk");
        }
    }
    sink.send(Bytes::from(chunk)).await.expect("copy chunk");
    let loaded = sink.finish().await.expect("copy done");
    assert_eq!(loaded, (OLD + RECENT) as u64);

    // The apply path runs beside retention: after each pruned batch, one batch of events is
    // applied on another connection while the next delete goes on.
    let events = fills(40, 50);
    let log = Partition::from_events("fills", 0, &events);
    let (tick_tx, mut tick_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let apply_db = db.pool().clone();
    let applier = Arc::new(
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"),
    );
    let apply_log = log.clone();
    let apply = tokio::spawn(async move {
        let mut client = apply_db.get().await.expect("client");
        let mut next = 0i64;
        let mut overlapped = 0u32;
        while next < apply_log.log.len() as i64 {
            // Paced by retention while it runs, then free.
            if tick_rx.recv().await.is_some() {
                overlapped += 1;
            }
            let outcome = applier
                .apply(&mut client, &apply_log.batch(next, 20))
                .await
                .expect("apply beside the prune");
            next = outcome.next_offset;
        }
        overlapped
    });

    let options = PruneOptions {
        older_than: Duration::from_secs(7 * 86_400),
        min_window: 7 * DAY,
        batch: 5_000,
        pause: Duration::from_millis(1),
    };
    let mut seen = Vec::new();
    let report = prune_inbox(&client, &options, |p| {
        seen.push(*p);
        let _ = tick_tx.send(());
    })
    .await
    .expect("prune");
    drop(tick_tx);
    let overlapped = apply.await.expect("apply task");

    // Batches observed: each at most the batch size, adding up, as many as needed.
    assert_eq!(report.deleted, OLD as u64);
    assert_eq!(report.batches, (OLD as u64).div_ceil(5_000));
    assert_eq!(seen.len() as u64, report.batches);
    assert!(seen.iter().all(|p| p.deleted <= 5_000 && p.deleted > 0));
    assert_eq!(seen.last().map(|p| p.total), Some(OLD as u64));
    assert!(overlapped > 0, "the apply path ran while retention did");
    // Nothing newer than the window went, and nothing older stayed.
    let left = client
        .query_one(
            "SELECT count(*) FILTER (WHERE applied_at >= $1), count(*) FILTER (WHERE applied_at < $1) \
             FROM projector.inbox WHERE consumer = 'old_v1'",
            &[&report.cutoff],
        )
        .await
        .expect("count");
    assert_eq!((left.get::<_, i64>(0), left.get::<_, i64>(1)), (RECENT, 0));
    // The cutoff is taken when the run starts, after the load.
    assert!(report.cutoff >= now - chrono::Duration::days(7));
    // The view applied beside it is exact, and its inbox rows are all there.
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
    let inbox: i64 = client
        .query_one(
            "SELECT count(*) FROM projector.inbox WHERE consumer = 'trail_v1'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(inbox, events.len() as i64);
}

#[test]
fn a_window_shorter_than_the_minimum_is_refused_in_one_line() {
    let options = PruneOptions {
        older_than: DAY,
        min_window: 7 * DAY,
        ..PruneOptions::default()
    };
    let e = check_window(&options).expect_err("refused");
    assert!(e.to_string().contains("minimum window is 7d"), "{e}");
    let (status, stderr) = run_to_end(&["inbox", "prune", "--older-than", "1d"]);
    assert!(!status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("refusing to prune the inbox younger than 1d"),
        "{stderr}"
    );
    // The configured minimum decides: 30d refuses a 10d window.
    let (status, stderr) = run_to_end(&[
        "inbox",
        "prune",
        "--older-than",
        "10d",
        "--min-window",
        "30d",
    ]);
    assert!(
        !status.success() && stderr.contains("the minimum window is 30d"),
        "{stderr}"
    );
}
