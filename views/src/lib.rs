//! projector's built-in views, and the registry that makes adding one a single line.
//!
//! A view is a [`Projection`](projector_engine::Projection): data, not code that runs per
//! event. It hands the engine its DDL and one set-based statement; the engine wraps that
//! statement in the inbox guard and runs it per batch (or per round, for order-dependent
//! views). Each view keeps every statement it runs in one `.sql` file beside its module, under
//! `-- name: <name>` headers, with the reasons in SQL comments.
//!
//! # Layout
//!
//! - [`portfolio`]: per account and symbol, net quantity, average price, realized P&L.
//!   Order-dependent; inbox and version filter.
//! - [`risk`]: per account, gross and net exposure, open positions, the largest position.
//!   Order-dependent; two tables, so inbox only.
//! - [`eod`]: per account and UTC trading day, trade and cash sums. Order-independent;
//!   inbox.
//! - [`registry`]: version 1 of each, one line per view.
//! - [`guide`]: `docs/writing-a-view.md`, compiled here so that its example is a test.
//! - `sql` (private): reading a view's `.sql` file.
//!
//! The semantics of each view, its tables, stable read names and snapshot contract are in
//! `docs/views.md`.

pub mod eod;
pub mod portfolio;
pub mod risk;
mod sql;

use projector_engine::{Registry, ViewError};

pub use eod::Eod;
pub use portfolio::Portfolio;
pub use risk::Risk;

/// The views compiled into this binary, at the versions they run live. A new view is one
/// more `register` line.
pub fn registry() -> Result<Registry, ViewError> {
    Registry::new()
        .register(Portfolio::new(1))?
        .register(Risk::new(1))?
        .register(Eod::new(1))
}

/// The guide to writing a view, `docs/writing-a-view.md`, included as documentation so that
/// `cargo test -p projector-views --doc` compiles and runs its example against PostgreSQL:
/// the guide cannot show code that does not work.
#[doc = include_str!("../../docs/writing-a-view.md")]
pub mod guide {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_holds_version_1_of_each_view() {
        let registry = registry().expect("the built-in views register");
        let consumers: Vec<String> = registry.all().iter().map(|v| v.consumer()).collect();
        assert_eq!(consumers, ["portfolio_v1", "risk_v1", "eod_v1"]);
    }
}
