//! A `projector` binary with a view of its own: the three built-in views plus
//! `cash_balance`, defined in this file. Every command of `projector` works with it:
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

use projector_engine::event::CASH_ADJUSTED;
use projector_engine::{ApplySql, DedupMode, Projection, Registry, ViewError};

/// Cash per account: the sum of its `cash_adjusted` amounts, with deposits and withdrawals
/// also kept apart.
#[derive(Debug, Clone, Copy)]
pub struct CashBalance {
    /// A parameter, so that the conformance suite (and a rebuild) can run several versions.
    version: i32,
}

impl CashBalance {
    pub fn new(version: i32) -> Self {
        Self { version }
    }
}

const DDL: &str = "
CREATE TABLE IF NOT EXISTS cash_balance_v{v} (
    account_id bigint  PRIMARY KEY,
    movements  bigint  NOT NULL,
    deposited  numeric NOT NULL,
    withdrawn  numeric NOT NULL,
    balance    numeric NOT NULL
)";

// Order-independent: `ev` may hold many movements of one account, so they are summed per
// account first. `withdrawn` is kept positive. A batch without deposits (or withdrawals)
// adds 0, which leaves the stored value and its scale as they were.
const CTES: &str = "
moves AS (
    SELECT account_id,
           count(*) AS movements,
           coalesce(sum((data->>'amount')::numeric)
                    FILTER (WHERE (data->>'amount')::numeric > 0), 0) AS deposited,
           coalesce(-sum((data->>'amount')::numeric)
                    FILTER (WHERE (data->>'amount')::numeric < 0), 0) AS withdrawn,
           sum((data->>'amount')::numeric) AS balance
    FROM ev
    GROUP BY account_id
)";

// One row per account written; RETURNING tells the engine how many.
const WRITE: &str = "
INSERT INTO cash_balance_v{v} AS c (account_id, movements, deposited, withdrawn, balance)
SELECT account_id, movements, deposited, withdrawn, balance FROM moves
ON CONFLICT (account_id) DO UPDATE
SET movements = c.movements + EXCLUDED.movements,
    deposited = c.deposited + EXCLUDED.deposited,
    withdrawn = c.withdrawn + EXCLUDED.withdrawn,
    balance   = c.balance + EXCLUDED.balance
RETURNING 1";

const READ: &str =
    "SELECT account_id, movements, deposited, withdrawn, balance FROM cash_balance_v{v}";

impl Projection for CashBalance {
    fn name(&self) -> &str {
        "cash_balance"
    }
    fn version(&self) -> i32 {
        self.version
    }
    fn at_version(&self, version: i32) -> Option<std::sync::Arc<dyn Projection>> {
        Some(std::sync::Arc::new(Self { version }))
    }
    fn subscribes(&self) -> &[&str] {
        &[CASH_ADJUSTED]
    }
    fn dedup(&self) -> DedupMode {
        // Sums of many events per row: the version filter cannot apply, the inbox can.
        DedupMode::Inbox
    }
    fn order_independent(&self) -> bool {
        true
    }
    fn ddl(&self) -> String {
        DDL.to_owned()
    }
    fn tables(&self) -> Vec<String> {
        vec!["cash_balance_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: CTES.to_owned(),
            write: WRITE.to_owned(),
        }
    }
    fn read_sql(&self) -> String {
        READ.to_owned()
    }
}

/// The built-in views, and this binary's own: the one registry line.
pub fn registry() -> Result<Registry, ViewError> {
    projector_views::registry()?.register(CashBalance::new(1))
}

fn main() -> ExitCode {
    projector::main(registry)
}
