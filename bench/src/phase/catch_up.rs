//! Catch-up: a new portfolio version reading the full topic from its earliest offset.

use projector_engine::Projection;
use projector_views::Portfolio;

use crate::bench::{applier, check_portfolio, settle, Bench};
use crate::engine::{self, Feed, Watch};
use crate::error::BenchError;
use crate::numbers::eps;

impl Bench<'_> {
    /// A new portfolio `version` reading the full `topic` from its earliest offset.
    pub(crate) async fn catch_up(&self, version: i32, topic: &str) -> Result<u64, BenchError> {
        settle(self.pool).await?;
        let watch = Watch::new(
            vec![Portfolio::new(version).consumer()],
            self.ends.clone(),
            false,
        );
        let run = engine::run(
            "catch-up",
            self.pool,
            vec![applier(Portfolio::new(version))?],
            self.config(topic),
            watch,
            Feed::Backlog,
        )
        .await?;
        check_portfolio(self.pool, version, topic, &self.fold, &self.ends).await?;
        Ok(eps(run.events, run.elapsed))
    }
}
