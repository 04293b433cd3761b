//! Prune while live: the full inbox's oldest day dropped while a paced feed runs.

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use projector_engine::Projection;
use projector_views::Portfolio;

use super::{TOPIC_PRUNE_LIVE, V_PRUNE_LIVE};
use crate::bench::{applier, check_portfolio, place, settle, Bench};
use crate::engine::{self, Feed, Watch};
use crate::error::{stop, BenchError, Doing as _};
use crate::events::{self, BenchEvent};
use crate::numbers::{grouped, millis, percentile};
use crate::{inbox, Figures, Options};

/// The latency phase's feed, on a version of its own, while `projector inbox prune` drops the
/// oldest day of the full inbox (the filler's, a week before the bench's events): how long
/// the prune took, and the latencies of the events published while it ran (and in the
/// second after it began, so that a prune of a few milliseconds still has events to judge).
pub(crate) async fn prune_while_live(
    options: &Options,
    b: &Bench<'_>,
    f: &mut Figures,
) -> Result<(), BenchError> {
    if options.inbox_rows == 0 {
        eprintln!("bench: prune while live: skipped (--inbox-rows 0: no days to prune)");
        return Ok(());
    }
    let count = usize::try_from(options.latency_rate * options.latency_seconds + 1)?;
    eprintln!(
        "bench: prune while live: {count} events at {} events/s while the inbox's oldest day is dropped",
        options.latency_rate
    );
    settle(b.pool).await?;
    let events = events::generate("p", count, f.accounts, 0x9a7e);
    let fold = events::fold(&events, false);
    let (placement, ends) = place(&events, options.partitions);
    let watch = Watch::new(
        vec![Portfolio::new(V_PRUNE_LIVE).consumer()],
        ends.clone(),
        true,
    );
    let live = engine::run(
        "live during a prune",
        b.pool,
        vec![applier(Portfolio::new(V_PRUNE_LIVE))?],
        b.config(TOPIC_PRUNE_LIVE),
        watch.clone(),
        Feed::Paced(
            events.iter().map(BenchEvent::payload).collect(),
            options.latency_rate,
        ),
    );
    let pruning = async {
        // Into the feed's steady state: a third of it visible.
        watch.committed_at_least(i64::try_from(count / 3)?).await?;
        prune_oldest_day(b.pool).await
    };
    let (live, pruned) = tokio::join!(live, pruning);
    let (live, pruned) = (live?, pruned?);
    let all = engine::latencies(
        placement.get(1..).unwrap_or_default(),
        live.sent_at.get(1..).unwrap_or_default(),
        &live.commits,
    )?;
    let until = pruned.finished.max(pruned.started + Duration::from_secs(1));
    let mut during: Vec<Duration> = all
        .iter()
        .zip(live.sent_at.get(1..).unwrap_or_default())
        .filter(|(_, sent)| **sent >= pruned.started && **sent <= until)
        .map(|(l, _)| *l)
        .collect();
    during.sort_unstable();
    f.prune = pruned.finished - pruned.started;
    f.prune_rows = pruned.rows;
    f.prune_live_events = during.len() as u64;
    f.prune_live_p50 = percentile(&during, 50);
    f.prune_live_p99 = percentile(&during, 99);
    f.prune_live_max = during.last().copied().unwrap_or_default();
    check_portfolio(b.pool, V_PRUNE_LIVE, TOPIC_PRUNE_LIVE, &fold, &ends).await?;
    eprintln!(
        "bench: prune while live: a day of about {} rows dropped in {} ms; live meanwhile p50 {} ms, p99 {} ms over {} events; rows equal the fold",
        grouped(f.prune_rows),
        millis(f.prune),
        millis(f.prune_live_p50),
        millis(f.prune_live_p99),
        grouped(f.prune_live_events)
    );
    Ok(())
}

/// What [`prune_oldest_day`] did.
struct Pruned {
    started: Instant,
    finished: Instant,
    /// The day's rows, as PostgreSQL estimated them before the drop.
    rows: u64,
}

/// Drops the full inbox's oldest day as `projector inbox prune` does, with the window set so
/// that only that day lies behind every clock (the bench's days are fixed, the clocks are
/// today's), and checks that it alone went. Each consumer's clock is its last commit (no
/// log is read: every consumer here is caught up).
async fn prune_oldest_day(pool: &Pool) -> Result<Pruned, BenchError> {
    use projector_ops::clock::{self, ConsumerClock};
    use projector_ops::prune::{prune_inbox, DayOutcome, PruneOptions};

    let mut client = pool.get().await?;
    let facts = clock::facts(&client).await?;
    let log = clock::Log::new();
    let clocks: Vec<ConsumerClock> = facts
        .iter()
        .map(|f| ConsumerClock {
            consumer: f.consumer.clone(),
            clock: clock::clock(f, &log),
        })
        .collect();
    let week_before = events::occurred_at(0)
        .checked_sub(inbox::WINDOW)
        .unwrap_or(std::time::UNIX_EPOCH);
    let oldest = projector_engine::inbox::day_of(week_before.into());
    let oldest_end = oldest
        .succ_opt()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
        .ok_or_else(|| BenchError::Stopped(format!("no day after {oldest}")))?;
    let now: chrono::DateTime<chrono::Utc> = client
        .query_one("SELECT now()", &[])
        .await
        .doing("reading the server's clock")?
        .get(0);
    // Half a day past the oldest day's end: it goes, the next one stays.
    let older_than = (now - oldest_end - chrono::Duration::hours(12))
        .to_std()
        .map_err(|_| BenchError::Stopped(format!("the bench's days lie ahead of {now}")))?;
    let options = PruneOptions {
        older_than,
        min_window: older_than,
    };
    let started = Instant::now();
    let mut rows = 0;
    let report = prune_inbox(&mut client, &options, &clocks, |d| {
        if let DayOutcome::Dropped { rows_estimate, .. } = &d.outcome {
            rows += rows_estimate.unsigned_abs();
        }
    })
    .await?;
    let finished = Instant::now();
    let dropped: Vec<_> = report.dropped().map(|d| d.day).collect();
    if dropped != [oldest] {
        stop!("the prune dropped {dropped:?}; only the day {oldest} lies behind every clock");
    }
    Ok(Pruned {
        started,
        finished,
        rows,
    })
}
