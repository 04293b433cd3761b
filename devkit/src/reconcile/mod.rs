//! Every built-in view against the write side, row by row: the proof at the end of
//! `projector demo` that each event's effect is in each view exactly once.
//!
//! `portfolio` and `risk` are compared with the write side's authoritative `positions` (the
//! write side books every fill and bust there in the event's own transaction); `eod` with a
//! fold of the stored events. The views are read through their stable names, so whatever
//! version is live (after a rebuild and cutover, say) is the one checked. The statements are
//! in `reconcile.sql`.

use deadpool_postgres::Client;
use projector_engine::projection::named_sql;

const SQL: &str = include_str!("reconcile.sql");

/// Why a reconciliation could not be run (not: why it found differences).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// A statement failed: the views or the write side's tables are missing, say.
    #[error("while reconciling {view}: {source}")]
    Database {
        /// The view being reconciled.
        view: String,
        /// PostgreSQL's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A statement name this module asked for is not in `reconcile.sql`.
    #[error("reconcile.sql has no statement named {0:?}")]
    MissingStatement(String),
}

/// One row that differs between the write side and a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The row's key, e.g. `42 EURUSD` or `42 2026-11-30`.
    pub key: String,
    /// The write side's values; `None` when the write side has no such row.
    pub source: Option<String>,
    /// The view's values; `None` when the view has no such row.
    pub view: Option<String>,
}

/// One view reconciled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewReconciliation {
    /// The stable read name.
    pub view: &'static str,
    /// What the view is compared with.
    pub against: &'static str,
    /// The columns each side's row shows, in order.
    pub columns: &'static str,
    /// Rows on the write side's side.
    pub source_rows: i64,
    /// Rows in the view.
    pub view_rows: i64,
    /// Every differing row, by key.
    pub differences: Vec<Difference>,
}

impl ViewReconciliation {
    /// No row differs.
    pub fn clean(&self) -> bool {
        self.differences.is_empty()
    }
}

/// (read name, statement, what it is compared with, the columns shown).
const VIEWS: [(&str, &str, &str); 3] = [
    (
        "portfolio",
        "positions",
        "net_qty, avg_price, realized_pnl, last_trade_at, version",
    ),
    (
        "risk",
        "positions",
        "gross, net, open, largest symbol, largest notional, version",
    ),
    (
        "eod",
        "the stored events",
        "fills, busts, bought_qty, sold_qty, bought_notional, sold_notional, fees, cash_in, cash_out",
    ),
];

/// Reconciles `portfolio`, `risk` and `eod` with the write side in the database of
/// `client`, in one repeatable-read transaction, so both sides are read at one moment.
pub async fn reconcile(client: &mut Client) -> Result<Vec<ViewReconciliation>, ReconcileError> {
    let failed = |view: &str| {
        let view = view.to_owned();
        move |source| ReconcileError::Database { view, source }
    };
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(failed("all views"))?;
    let mut out = Vec::new();
    for (view, against, columns) in VIEWS {
        let statement = |name: &str| {
            named_sql(SQL, name).ok_or_else(|| ReconcileError::MissingStatement(name.to_owned()))
        };
        let differences = tx
            .query(statement(view)?, &[])
            .await
            .map_err(failed(view))?
            .iter()
            .map(|r| Difference {
                key: r.get(0),
                source: r.get(1),
                view: r.get(2),
            })
            .collect();
        let counts = tx
            .query_one(statement(&format!("{view}_rows"))?, &[])
            .await
            .map_err(failed(view))?;
        out.push(ViewReconciliation {
            view,
            against,
            columns,
            source_rows: counts.get(0),
            view_rows: counts.get(1),
            differences,
        });
    }
    tx.commit().await.map_err(failed("all views"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for (view, _, _) in VIEWS {
            assert!(named_sql(SQL, view).is_some(), "{view}");
            assert!(named_sql(SQL, &format!("{view}_rows")).is_some(), "{view}");
        }
    }
}
