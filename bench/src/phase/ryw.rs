//! Read your writes: the latency phase's feed with readers waiting for their writes in
//! `projector.wait_applied`.

use std::time::Instant;

use projector_engine::{Applied, Bell, Projection};
use projector_views::Portfolio;
use tokio_util::sync::CancellationToken;

use super::{PHASE_WAIT, TOPIC_RYW, V_PLACEHOLDER, V_RYW};
use crate::bench::{check_portfolio, place, ringing, settle, Bench};
use crate::engine::{self, Feed, Watch};
use crate::error::{mismatch, BenchError, Doing as _};
use crate::events::{self, BenchEvent};
use crate::numbers::{millis, percentile};
use crate::{Figures, Options};

/// Readers that wait for their writes at once (`projector.wait_applied`) while the latency
/// phase's feed runs, with the notifier, on a version of its own made live for the phase (a
/// wait reads the live version; the placeholder is live again after it): write (the event
/// handed to the producer) to readable (`applied`). About 25 waits a second, each on a
/// connection of a pool of readers, whatever the rate.
pub(crate) async fn read_your_writes(
    options: &Options,
    b: &Bench<'_>,
    f: &mut Figures,
) -> Result<(), BenchError> {
    const READERS: usize = 16;
    let count = usize::try_from(options.latency_rate * options.latency_seconds + 1)?;
    let every = usize::try_from((options.latency_rate / 25).max(1))?;
    eprintln!(
        "bench: read your writes: {count} events at {} events/s; every {every}th waited for in projector.wait_applied",
        options.latency_rate
    );
    settle(b.pool).await?;
    let events = events::generate("w", count, f.accounts, 0x7e11);
    let fold = events::fold(&events, false);
    let (_, ends) = place(&events, options.partitions);
    let swap = |live: i32, other: i32| async move {
        let client = b.pool.get().await?;
        client
            .batch_execute(&format!(
                "UPDATE projector.views SET state = 'building' WHERE name = 'portfolio' AND version = {other}; \
                 UPDATE projector.views SET state = 'live' WHERE name = 'portfolio' AND version = {live}"
            ))
            .await
            .doing("making a version live for the read-your-writes phase")?;
        Ok::<(), BenchError>(())
    };
    swap(V_RYW, V_PLACEHOLDER).await?;
    let readers = projector_engine::db::pool(b.url, READERS)?;
    let watch = Watch::new(vec![Portfolio::new(V_RYW).consumer()], ends.clone(), false);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    watch.tell_sent(tx);
    let targets: Vec<(i64, i64)> = events.iter().map(|e| (e.account_id, e.seq)).collect();
    let waits = tokio::spawn(async move {
        let mut tasks = Vec::new();
        while let Some((index, sent)) = rx.recv().await {
            if index % every != 0 {
                continue;
            }
            let Some(&(account, seq)) = targets.get(index) else {
                continue;
            };
            let readers = readers.clone();
            tasks.push(tokio::spawn(async move {
                let client = readers.get().await?;
                let answer = projector_engine::wait_applied(
                    &**client,
                    "portfolio",
                    account,
                    seq,
                    PHASE_WAIT,
                )
                .await?;
                Ok::<_, BenchError>((answer, sent.elapsed()))
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.doing("a reader's task failed")??);
        }
        Ok::<_, BenchError>(out)
    });
    let bell = Bell::new();
    let stop_notifier = CancellationToken::new();
    let notifier = tokio::spawn(projector_engine::bell::run_notifier(
        bell.clone(),
        b.pool.clone(),
        stop_notifier.clone(),
    ));
    let run = engine::run(
        "read your writes",
        b.pool,
        vec![ringing(Portfolio::new(V_RYW), Some(bell))?],
        b.config(TOPIC_RYW),
        watch.clone(),
        Feed::Paced(
            events.iter().map(BenchEvent::payload).collect(),
            options.latency_rate,
        ),
    )
    .await;
    // The feed is done: no more lines to wait for.
    watch.stop_telling();
    let waited = waits.await.doing("the readers' task failed")?;
    stop_notifier.cancel();
    notifier.await.doing("the notifier's task failed")?;
    swap(V_PLACEHOLDER, V_RYW).await?;
    run?;
    let waited = waited?;
    let mut latencies = Vec::with_capacity(waited.len());
    for (answer, took) in waited {
        if answer != Applied::Applied {
            mismatch!("projector.wait_applied answered {answer:?} for an event the view applied");
        }
        latencies.push(took);
    }
    latencies.sort_unstable();
    f.ryw_waits = latencies.len() as u64;
    f.ryw_p50 = percentile(&latencies, 50);
    f.ryw_p99 = percentile(&latencies, 99);
    check_portfolio(b.pool, V_RYW, TOPIC_RYW, &fold, &ends).await?;
    eprintln!(
        "bench: read your writes: {} waits, p50 {} ms, p99 {} ms; rows equal the fold",
        f.ryw_waits,
        millis(f.ryw_p50),
        millis(f.ryw_p99)
    );
    Ok(())
}
