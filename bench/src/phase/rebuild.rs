//! The rebuild crate's rebuild from earliest, alone (each round) and while the latency
//! phase's feed runs on a version of its own.

use std::time::Duration;

use projector_engine::Projection;
use projector_views::Portfolio;

use super::{TOPIC, TOPIC_REBUILD_LIVE, V_REBUILD_LIVE, V_REBUILD_LOADED};
use crate::bench::{applier, check_portfolio, place, settle, Bench};
use crate::engine::{self, Feed, Watch};
use crate::error::BenchError;
use crate::events::{self, BenchEvent};
use crate::numbers::{eps, grouped, millis, percentile};
use crate::{rebuild, Figures, Options};

impl Bench<'_> {
    /// A new portfolio `version` built from the earliest offsets of the full `topic` by the
    /// rebuild crate: events per second of its tail (first batch to last commit), and the
    /// whole command's time.
    pub(crate) async fn rebuild(
        &self,
        version: i32,
        topic: &str,
        budget: rebuild::Budget,
    ) -> Result<(u64, Duration), BenchError> {
        settle(self.pool).await?;
        let run = rebuild::run(
            "rebuild",
            self.pool,
            self.url,
            self.config(topic),
            version,
            &self.ends,
            budget,
        )
        .await?;
        check_portfolio(self.pool, version, topic, &self.fold, &self.ends).await?;
        rebuild::drop_version(self.pool, version).await?;
        eprintln!(
            "  rebuild: the whole command {} ms ({} events/s), its tail {} ms",
            run.elapsed().as_millis(),
            grouped(eps(self.fold.events, run.elapsed())),
            run.tail.as_millis()
        );
        Ok((eps(self.fold.events, run.tail), run.elapsed()))
    }
}

/// The latency phase's feed, on a version of its own, while a rebuild of the first round's
/// topic runs; the latencies of the events published while the rebuild ran.
pub(crate) async fn live_during_rebuild(
    options: &Options,
    b: &Bench<'_>,
    budget: rebuild::Budget,
    f: &mut Figures,
) -> Result<(), BenchError> {
    // The feed must outlast the rebuild, which is slower with the feed running: twice its
    // time alone, plus a few seconds for its log check and consumer group.
    let alone = f.rebuild_command;
    let seconds = options.latency_seconds.max(2 * alone.as_secs() + 5);
    let count = usize::try_from(options.latency_rate * seconds + 1)?;
    eprintln!(
        "bench: live during a rebuild: {count} events at {} events/s while portfolio v{V_REBUILD_LOADED} is rebuilt from {} events",
        options.latency_rate,
        b.fold.events
    );
    settle(b.pool).await?;
    let events = events::generate("l", count, f.accounts, 0x1a7e);
    let fold = events::fold(&events, false);
    let (placement, ends) = place(&events, options.partitions);
    let watch = Watch::new(
        vec![Portfolio::new(V_REBUILD_LIVE).consumer()],
        ends.clone(),
        true,
    );
    let live = engine::run(
        "live during a rebuild",
        b.pool,
        vec![applier(Portfolio::new(V_REBUILD_LIVE))?],
        b.config(TOPIC_REBUILD_LIVE),
        watch.clone(),
        Feed::Paced(
            events.iter().map(BenchEvent::payload).collect(),
            options.latency_rate,
        ),
    );
    let topic = format!("{TOPIC}_0");
    let rebuilding = async {
        watch.first_visible().await?;
        rebuild::run(
            "rebuild under a live feed",
            b.pool,
            b.url,
            b.config(&topic),
            V_REBUILD_LOADED,
            &b.ends,
            budget,
        )
        .await
    };
    let (live, rebuilt) = tokio::join!(live, rebuilding);
    let (live, rebuilt) = (live?, rebuilt?);
    let all = engine::latencies(
        placement.get(1..).unwrap_or_default(),
        live.sent_at.get(1..).unwrap_or_default(),
        &live.commits,
    )?;
    let mut during: Vec<Duration> = all
        .iter()
        .zip(live.sent_at.get(1..).unwrap_or_default())
        .filter(|(_, sent)| **sent >= rebuilt.started && **sent <= rebuilt.finished)
        .map(|(l, _)| *l)
        .collect();
    during.sort_unstable();
    f.rebuild_loaded_eps = eps(b.fold.events, rebuilt.tail);
    f.rebuild_live_events = during.len() as u64;
    f.rebuild_live_p50 = percentile(&during, 50);
    f.rebuild_live_p99 = percentile(&during, 99);
    f.rebuild_live_max = during.last().copied().unwrap_or_default();
    check_portfolio(b.pool, V_REBUILD_LIVE, TOPIC_REBUILD_LIVE, &fold, &ends).await?;
    check_portfolio(b.pool, V_REBUILD_LOADED, &topic, &b.fold, &b.ends).await?;
    rebuild::drop_version(b.pool, V_REBUILD_LOADED).await?;
    eprintln!(
        "bench: live during a rebuild: p50 {} ms, p99 {} ms over {} events; the rebuild meanwhile {} events/s; rows of both equal the fold",
        millis(f.rebuild_live_p50),
        millis(f.rebuild_live_p99),
        grouped(f.rebuild_live_events),
        grouped(f.rebuild_loaded_eps)
    );
    Ok(())
}
