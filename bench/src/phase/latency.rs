//! Latency: publish to visible at a fixed rate, live on a topic of its own.

use projector_engine::Projection;
use projector_views::Portfolio;

use super::{TOPIC_LATENCY, V_LATENCY};
use crate::bench::{applier, check_portfolio, place, settle, Bench};
use crate::engine::{self, Feed, Watch};
use crate::error::BenchError;
use crate::events::{self, BenchEvent};
use crate::numbers::{millis, percentile};
use crate::{Figures, Options};

/// Publish-to-visible latency at a fixed rate, live on a topic of its own.
pub(crate) async fn latency(
    options: &Options,
    b: &Bench<'_>,
    f: &mut Figures,
) -> Result<(), BenchError> {
    // One more event than the rate times the duration: the first only warms the producer up
    // (see `engine::Feed`), and the clock starts after it.
    let count = usize::try_from(options.latency_rate * options.latency_seconds + 1)?;
    eprintln!(
        "bench: latency: {count} events at {} events/s",
        options.latency_rate
    );
    settle(b.pool).await?;
    let events = events::generate("l", count, f.accounts, 0x1a7e);
    let fold = events::fold(&events, false);
    let (placement, ends) = place(&events, options.partitions);
    let watch = Watch::new(
        vec![Portfolio::new(V_LATENCY).consumer()],
        ends.clone(),
        true,
    );
    let run = engine::run(
        "latency",
        b.pool,
        vec![applier(Portfolio::new(V_LATENCY))?],
        b.config(TOPIC_LATENCY),
        watch,
        Feed::Paced(
            events.iter().map(BenchEvent::payload).collect(),
            options.latency_rate,
        ),
    )
    .await?;
    let mut latencies = engine::latencies(
        placement.get(1..).unwrap_or_default(),
        run.sent_at.get(1..).unwrap_or_default(),
        &run.commits,
    )?;
    latencies.sort_unstable();
    f.latency_events = latencies.len() as u64;
    f.p50 = percentile(&latencies, 50);
    f.p99 = percentile(&latencies, 99);
    f.max = latencies.last().copied().unwrap_or_default();
    check_portfolio(b.pool, V_LATENCY, TOPIC_LATENCY, &fold, &ends).await?;
    eprintln!(
        "bench: latency: p50 {} ms, p99 {} ms; rows equal the fold",
        millis(f.p50),
        millis(f.p99)
    );
    Ok(())
}
