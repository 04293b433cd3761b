//! The ceiling: the rows of portfolio, or of all three views, by the plain SQL of
//! `crate::ceiling`.

use std::collections::BTreeMap;

use super::TOPIC_CEILING_ALL;
use crate::bench::{check_all_views, check_portfolio, settle, Bench};
use crate::ceiling;
use crate::error::{stop, BenchError};
use crate::numbers::eps;

impl Bench<'_> {
    /// The rows of portfolio, risk and eod at `version`, by plain SQL.
    pub(crate) async fn ceiling_all(&self, version: i32) -> Result<u64, BenchError> {
        settle(self.pool).await?;
        let mut by_partition: BTreeMap<i32, Vec<ceiling::Item<'_>>> = BTreeMap::new();
        let mut writes = self.fold.portfolio_writes.iter();
        let mut risk = self.fold.risk_writes.iter();
        for (e, &(p, offset)) in self.events.iter().zip(&self.placement) {
            let (write, risk) = if e.is_trade() {
                let (Some(&(_, symbol, pos)), Some(r)) = (writes.next(), risk.next()) else {
                    stop!("the fold has fewer writes than trades");
                };
                (Some((symbol, pos)), Some(r))
            } else {
                (None, None)
            };
            by_partition.entry(p).or_default().push(ceiling::Item {
                event: e,
                offset,
                write,
                risk,
            });
        }
        let targets = ceiling::Targets {
            portfolio: version,
            risk: Some(version),
            eod: Some(version),
        };
        let elapsed = ceiling::run(self.pool, targets, TOPIC_CEILING_ALL, by_partition).await?;
        check_all_views(self, version, TOPIC_CEILING_ALL).await?;
        Ok(eps(self.fold.events, elapsed))
    }

    /// The same rows as portfolio `version` on `topic`, by plain SQL.
    pub(crate) async fn ceiling(&self, version: i32, topic: &str) -> Result<u64, BenchError> {
        settle(self.pool).await?;
        let mut by_partition: BTreeMap<i32, Vec<ceiling::Item<'_>>> = BTreeMap::new();
        let mut writes = self.fold.portfolio_writes.iter();
        for (e, &(p, offset)) in self.events.iter().zip(&self.placement) {
            let write = if e.is_trade() {
                let Some(&(_, symbol, pos)) = writes.next() else {
                    stop!("the fold has fewer portfolio writes than trades");
                };
                Some((symbol, pos))
            } else {
                None
            };
            by_partition.entry(p).or_default().push(ceiling::Item {
                event: e,
                offset,
                write,
                risk: None,
            });
        }
        let targets = ceiling::Targets {
            portfolio: version,
            risk: None,
            eod: None,
        };
        let elapsed = ceiling::run(self.pool, targets, topic, by_partition).await?;
        check_portfolio(self.pool, version, topic, &self.fold, &self.ends).await?;
        Ok(eps(self.fold.events, elapsed))
    }
}
