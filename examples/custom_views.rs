//! A `projector` binary with a view of its own: the three built-in views plus
//! `cash_balance`, its SQL in `cash_balance.sql` beside this file. Every command of
//! `projector` works with it:
//!
//! ```sh
//! cargo run --example custom_views -- views      # portfolio, risk, eod and cash_balance
//! cargo run --example custom_views -- migrate    # also creates cash_balance_v1 and its read name
//! cargo run --example custom_views -- run --brokers <host:port> --topic <topic>
//! ```
//!
//! A team's own binary is this file: its views, a registry function, and `projector::main`.
//! `docs/writing-a-view.md` says what a view must do; `tests/it/examples_custom_views.rs`
//! runs this one through the engine's conformance suite.

use std::process::ExitCode;

use projector_engine::{DecodeError, Event, Field, Registry, SqlFile, View, ViewError};
use projector_views::events::CASH_ADJUSTED;

/// Cash per account: the sum of its `cash_adjusted` amounts, with deposits and withdrawals
/// also kept apart. Its tables come from the DDL, its version from the registry.
#[derive(Debug)]
pub struct CashBalance;

impl View for CashBalance {
    fn name(&self) -> &str {
        "cash_balance"
    }
    fn subscribes(&self) -> &[&str] {
        &[CASH_ADJUSTED]
    }
    fn check_data(&self, event: &Event) -> Result<(), DecodeError> {
        projector_views::events::check_rules(event) // a reason, an exact amount
    }
    fn fields(&self) -> Vec<Field> {
        vec![Field::Decimal("amount")]
    }
    fn order_independent(&self) -> bool {
        true // sums per account (`GROUP BY`): a whole batch in one statement
    }
    fn sql(&self) -> SqlFile {
        SqlFile::new(
            "examples/cash_balance.sql",
            include_str!("cash_balance.sql"),
        )
    }
}

/// The built-in views, and this binary's own: the one registry line.
pub fn registry() -> Result<Registry, ViewError> {
    projector_views::registry()?.view(1, CashBalance)
}

fn main() -> ExitCode {
    projector::main(registry)
}
