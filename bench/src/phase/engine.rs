//! The engine fed live: portfolio alone (with or without the read-your-writes notifier, on
//! an empty or a full inbox), or portfolio, risk and eod at once.

use projector_engine::{Bell, Projection};
use projector_views::{Eod, Portfolio, Risk};
use tokio_util::sync::CancellationToken;

use crate::bench::{
    applier, check_all_views, check_portfolio_with, ringing, settle, wal_fpi, Bench,
};
use crate::engine::{self, Feed, Watch};
use crate::error::{BenchError, Doing as _};
use crate::numbers::{eps, grouped};

impl Bench<'_> {
    /// Portfolio `version`, subscribed before the events exist, fed live on `topic`: events
    /// per second, and the full-page images written meanwhile.
    /// With `notify`, the read-your-writes notifier runs beside the view, as in
    /// `projector run`; without, as in `projector run --no-notify`.
    pub(crate) async fn live(
        &self,
        version: i32,
        topic: &str,
        notify: bool,
    ) -> Result<(u64, Option<u64>), BenchError> {
        settle(self.pool).await?;
        if !notify {
            return self.live_settled(version, topic, 0).await;
        }
        let bell = Bell::new();
        let stop = CancellationToken::new();
        let notifier = tokio::spawn(projector_engine::bell::run_notifier(
            bell.clone(),
            self.pool.clone(),
            stop.clone(),
        ));
        let run = self.live_with(version, topic, 0, Some(bell)).await;
        stop.cancel();
        notifier.await.doing("the notifier's task failed")?;
        run
    }

    /// [`Bench::live`] after the caller settled, on a version whose inbox holds `filler`
    /// rows already.
    pub(crate) async fn live_settled(
        &self,
        version: i32,
        topic: &str,
        filler: u64,
    ) -> Result<(u64, Option<u64>), BenchError> {
        self.live_with(version, topic, filler, None).await
    }

    /// [`Bench::live_settled`], its applier ringing `bell` when given.
    pub(crate) async fn live_with(
        &self,
        version: i32,
        topic: &str,
        filler: u64,
        bell: Option<Bell>,
    ) -> Result<(u64, Option<u64>), BenchError> {
        let fpi_before = wal_fpi(self.pool).await?;
        let watch = Watch::new(
            vec![Portfolio::new(version).consumer()],
            self.ends.clone(),
            false,
        );
        let run = engine::run(
            "engine",
            self.pool,
            vec![ringing(Portfolio::new(version), bell)?],
            self.config(topic),
            watch,
            Feed::Live(self.stream.clone()),
        )
        .await?;
        let fpi = match (fpi_before, wal_fpi(self.pool).await?) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        check_portfolio_with(self.pool, version, topic, &self.fold, &self.ends, filler).await?;
        Ok((eps(run.events, run.elapsed), fpi))
    }
}

/// Portfolio, risk and eod at once, live on a topic of their own.
pub(crate) async fn all_views(
    b: &Bench<'_>,
    round: &str,
    version: i32,
    topic: &str,
) -> Result<u64, BenchError> {
    eprintln!(
        "bench: {round}: engine, all views, live: portfolio, risk and eod on a topic of their own"
    );
    settle(b.pool).await?;
    let consumers = vec![
        Portfolio::new(version).consumer(),
        Risk::new(version).consumer(),
        Eod::new(version).consumer(),
    ];
    let watch = Watch::new(consumers.clone(), b.ends.clone(), false);
    let run = engine::run(
        "all views",
        b.pool,
        vec![
            applier(Portfolio::new(version))?,
            applier(Risk::new(version))?,
            applier(Eod::new(version))?,
        ],
        b.config(topic),
        watch,
        Feed::Live(b.stream.clone()),
    )
    .await?;
    let rate = eps(run.events, run.elapsed);
    check_all_views(b, version, topic).await?;
    eprintln!(
        "bench: {round}: engine, all views: {} input events/s; rows of the three views equal the fold",
        grouped(rate)
    );
    Ok(rate)
}
