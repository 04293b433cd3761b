//! `eod`: per account and UTC trading day, fills and busts counted, bought and sold quantity
//! and notional (net of busts), fees, cash in and cash out.
//!
//! Order-independent: every column is a commutative sum, so the engine sends a whole batch
//! per statement and the SQL aggregates with `GROUP BY`. Deduplicated by the inbox. Rules and
//! table in `docs/views.md`; the SQL is in `eod.sql` beside this file.
//!
//! No snapshot query: a day's sums are history, not state the write side keeps, so a rebuild
//! of `eod` replays from the earliest retained offsets.

use std::sync::Arc;

use crate::events::{CASH_ADJUSTED, FILL_BUSTED, FILL_EXECUTED};
use projector_engine::event::{DecodeError, Event};
use projector_engine::{ApplySql, DedupMode, Field, Projection, Upcaster};

use projector_engine::SqlFile;

const SQL: SqlFile = SqlFile::new("views/src/eod/eod.sql", include_str!("eod.sql"));

/// The end-of-day view at one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eod {
    /// A parameter so that several versions can run side by side (tests, rebuilds).
    version: i32,
}

impl Eod {
    /// The view at `version`; its table is `eod_v<version>`.
    pub fn new(version: i32) -> Self {
        Self { version }
    }

    /// `projector reconcile`'s statement for this view: its rows per account and UTC
    /// trading day, `at` the day's midnight UTC, read from `table` (the stable read name or
    /// a version's table).
    pub fn reconcile_sql(table: &str) -> String {
        SQL.section("reconcile").replace("{table}", table)
    }
}

impl Projection for Eod {
    fn name(&self) -> &str {
        "eod"
    }

    fn version(&self) -> i32 {
        self.version
    }

    fn at_version(&self, version: i32) -> Option<Arc<dyn Projection>> {
        Some(Arc::new(Self::new(version)))
    }

    fn subscribes(&self) -> &[&str] {
        &[FILL_EXECUTED, FILL_BUSTED, CASH_ADJUSTED]
    }

    fn dedup(&self) -> DedupMode {
        DedupMode::Inbox
    }

    fn order_independent(&self) -> bool {
        true
    }

    fn fields(&self) -> Vec<Field> {
        // Decoded once by the engine, as typed columns of `ev`: no JSON parsed in SQL.
        vec![
            Field::Decimal("qty"),
            Field::Decimal("price"),
            Field::Decimal("fee"),
            Field::Decimal("amount"),
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
        // The code before event versions read version 1 with its side; this code reads
        // version 2, with version 1 upcast to it, and writes the same rows.
        vec![crate::previous::fingerprint(self)]
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

    fn read_sql(&self) -> String {
        SQL.section("read").to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_sql_file() {
        let view = Eod::new(1);
        assert!(view.ddl().contains("CREATE TABLE IF NOT EXISTS eod_v{v}"));
        let sql = view.apply_sql();
        assert!(sql.ctes.contains("GROUP BY account_id, trading_day"));
        assert!(sql.write.ends_with("RETURNING 1"));
        assert!(view.read_sql().starts_with("SELECT"));
        assert!(view.snapshot_sql().is_none());
        assert!(view.order_independent());
    }
}
