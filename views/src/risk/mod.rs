//! `risk`: per account, gross and net exposure at the last trade price of each open
//! position, the number of open positions and the largest one.
//!
//! Order-dependent (the last price is the latest fill's), deduplicated by the inbox only: it
//! writes two tables per event, a per-symbol book (`risk_positions_v<n>`) and the account
//! row (`risk_v<n>`), and a version filter guards one row. One statement takes each
//! account's events of a batch at once ([`Projection::many_per_account`]): a symbol moves by
//! their sum and keeps the last price, and the account row moves once, by its moved symbols'
//! exposures before and after; the book is read again only when the largest position
//! shrinks. The rules are in `docs/views.md`; the SQL is in `risk.sql` beside this file.

use std::sync::Arc;

use crate::events::{FILL_BUSTED, FILL_EXECUTED};
use projector_engine::event::{DecodeError, Event};
use projector_engine::{ApplySql, DedupMode, Field, Projection, Upcaster};

use projector_engine::SqlFile;

const SQL: SqlFile = SqlFile::new("views/src/risk/risk.sql", include_str!("risk.sql"));

/// The risk view at one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Risk {
    /// A parameter so that several versions can run side by side (tests, rebuilds).
    version: i32,
}

impl Risk {
    /// The view at `version`; its tables are `risk_positions_v<version>` and `risk_v<version>`.
    pub fn new(version: i32) -> Self {
        Self { version }
    }
}

impl Projection for Risk {
    fn name(&self) -> &str {
        "risk"
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
        DedupMode::Inbox
    }

    fn many_per_account(&self) -> bool {
        // The statement folds an account's run of events in seq order (sums, the last
        // price); a run with an event that would fail alone fails whole (risk.sql).
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

    fn snapshot_sql(&self) -> Option<String> {
        Some(format!(
            "WITH {},\n{},\nseeded_accounts AS (\n{}\n)\n{}",
            SQL.section("snapshot_book"),
            SQL.section("totals"),
            SQL.section("seed"),
            SQL.section("watermarks"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_sql_file() {
        let view = Risk::new(2);
        assert!(view.ddl().contains("risk_positions_v{v}"));
        assert!(view.ddl().contains("risk_v{v}"));
        let sql = view.apply_sql();
        assert!(sql.ctes.contains("rk_account AS"));
        assert!(
            !sql.ctes.contains("rk_totals AS"),
            "the apply path reads no whole book"
        );
        assert!(sql.write.ends_with("RETURNING 1"));
        assert!(view.read_sql().starts_with("SELECT"));
        let snapshot = view.snapshot_sql().unwrap_or_default();
        assert!(snapshot.contains("FROM positions"));
        assert!(snapshot.contains("FROM account_seq"));
        assert!(snapshot.contains("FROM rk_totals"));
        assert_eq!(view.consumer(), "risk_v2");
    }
}
