//! `portfolio`: per account and symbol, the net quantity, the average entry price (weighted
//! on increase, unchanged on reduce, reset on flip), realized P&L, the last trade time and
//! `version`, the `seq` of the last event applied to the row.
//!
//! Order-dependent (an average depends on the order of fills), deduplicated by the inbox and
//! by the version filter. One statement takes each account's events of a batch at once
//! ([`Projection::many_per_account`]): a recursive CTE folds each position's run in `seq`
//! order, rounding the average at every step as one event alone does, and writes the row
//! once. The rules and the tables are in `docs/views.md`; the SQL is in `portfolio.sql`
//! beside this file.

use std::sync::Arc;

use crate::events::{FILL_BUSTED, FILL_EXECUTED};
use projector_engine::event::{DecodeError, Event};
use projector_engine::{ApplySql, DedupMode, Field, Projection, Upcaster};

use projector_engine::SqlFile;

const SQL: SqlFile = SqlFile::new(
    "views/src/portfolio/portfolio.sql",
    include_str!("portfolio.sql"),
);

/// The portfolio view at one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Portfolio {
    /// A parameter, not a constant, so tests can run several independent versions side by
    /// side and a rebuild can install the next one.
    version: i32,
}

impl Portfolio {
    /// The view at `version`; its tables are `portfolio_v<version>`.
    pub fn new(version: i32) -> Self {
        Self { version }
    }
}

impl Projection for Portfolio {
    fn name(&self) -> &str {
        "portfolio"
    }

    fn version(&self) -> i32 {
        self.version
    }

    fn at_version(&self, version: i32) -> Option<Arc<dyn Projection>> {
        Some(Arc::new(Self::new(version)))
    }

    fn subscribes(&self) -> &[&str] {
        &[FILL_EXECUTED, FILL_BUSTED]
    }

    fn dedup(&self) -> DedupMode {
        DedupMode::Both
    }

    fn many_per_account(&self) -> bool {
        // The statement folds each position's run in seq order with the same arithmetic as
        // one event alone, and returns one row per event applied (the version filter's
        // count); a run with an event that would fail alone fails whole (portfolio.sql).
        true
    }

    fn fields(&self) -> Vec<Field> {
        // Decoded once by the engine, as typed columns of `ev`: no JSON parsed in SQL.
        vec![
            Field::Text("symbol"),
            Field::Decimal("qty"),
            Field::Decimal("price"),
        ]
    }

    fn check_data(&self, event: &Event) -> Result<(), DecodeError> {
        // The built-in types' rules (`crate::events`): what the engine applied itself before
        // the trading domain left it.
        crate::events::check_rules(event)
    }

    fn upcasters(&self) -> Vec<Upcaster> {
        // Fills and busts at version 2: a signed quantity, no side.
        crate::upcast::upcasters()
    }

    fn replaces(&self) -> Vec<String> {
        // The code before event versions read version 1 with its side, and the code after it
        // applied a batch in rounds of one event per account; this code reads version 2,
        // with version 1 upcast to it, folds each account's run, and writes the same rows
        // and notices.
        let rounds = crate::previous::PortfolioInRounds::new(self.version);
        vec![
            crate::previous::fingerprint(&rounds),
            projector_engine::fingerprint::of(&rounds),
        ]
    }

    fn ddl(&self) -> String {
        SQL.section("ddl").to_owned()
    }

    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: SQL.section("ctes").to_owned(),
            write: SQL.section("write").to_owned(),
        }
    }

    fn notices_sql(&self) -> Option<String> {
        Some(SQL.section("notices").to_owned())
    }

    fn read_sql(&self) -> String {
        SQL.section("read").to_owned()
    }

    fn snapshot_sql(&self) -> Option<String> {
        Some(SQL.section("snapshot").to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_sql_file() {
        let view = Portfolio::new(3);
        assert!(view
            .ddl()
            .contains("CREATE TABLE IF NOT EXISTS portfolio_v{v}"));
        let sql = view.apply_sql();
        assert!(sql.write.ends_with("FROM pf_applied"));
        assert!(view
            .notices_sql()
            .is_some_and(|n| n.contains("WHERE f.emit")));
        assert!(sql.ctes.contains("pv.version < t.seq"));
        assert!(sql.ctes.contains("pv.version < l.first_seq"));
        assert!(view.many_per_account());
        assert!(sql.ctes.trim_end().ends_with(')'));
        assert!(view.read_sql().starts_with("SELECT"));
        assert!(view
            .snapshot_sql()
            .is_some_and(|s| s.contains("FROM positions")));
        assert_eq!(view.consumer(), "portfolio_v3");
    }
}
