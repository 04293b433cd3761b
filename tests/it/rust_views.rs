//! An adversarial review of the second half of issue 26 (Rust views with less ceremony, the
//! trading domain's rules moved into the views crate). Each test failed before its fix.
//!
//! - A view's rules for its types' data (`Projection::check_data`, `View::check_data`) are
//!   the view's own Rust code now, not the engine's: a panic in them must poison the one
//!   event for the view, as a panic in `validate` or in an upcaster does, instead of failing
//!   the whole batch on every attempt (the partition, and through back-pressure the view,
//!   stops for good).

use std::sync::Arc;

use crate::support::kinds;
use projector_engine::testkit::{cash, Partition, TestDb};
use projector_engine::{
    Applier, DecodeError, Disposition, Event, Field, Registry, SourceOrdering, SqlFile, Versioned,
    View,
};

use Disposition::*;

const AT: &str = "2026-11-29T10:15:00Z";

const SQL: SqlFile = SqlFile::new(
    "cash_book.sql",
    "-- name: ddl
CREATE TABLE IF NOT EXISTS cash_book_v{v} (account_id bigint PRIMARY KEY, balance numeric NOT NULL);
-- name: ctes
moves AS (SELECT account_id, sum(amount) AS amount FROM ev GROUP BY account_id)
-- name: write
INSERT INTO cash_book_v{v} AS b SELECT account_id, amount FROM moves
ON CONFLICT (account_id) DO UPDATE SET balance = b.balance + EXCLUDED.balance RETURNING 1;
-- name: read
SELECT * FROM cash_book_v{v};
",
);

/// A cash view whose data rules panic on one event, as an `unwrap()` in a team's rules would.
struct PanickyRules;

impl View for PanickyRules {
    fn name(&self) -> &str {
        "cash_book"
    }
    fn subscribes(&self) -> &[&str] {
        &["cash_adjusted"]
    }
    fn sql(&self) -> SqlFile {
        SQL
    }
    fn order_independent(&self) -> bool {
        true
    }
    fn fields(&self) -> Vec<Field> {
        vec![Field::Decimal("amount")]
    }
    fn check_data(&self, event: &Event) -> Result<(), DecodeError> {
        assert!(
            !(event.account_id == 1 && event.seq == 2),
            "a team's rule panicked"
        );
        projector_views::events::check_rules(event)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_views_data_rules_dead_letters_its_event_and_the_batch_goes_on() {
    let registry = Registry::new().view(1, PanickyRules).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier = Applier::new(
        Arc::new(Versioned::new(1, PanickyRules)),
        SourceOrdering::PerAccount,
    )
    .expect("applier");
    let mut client = db.client().await;
    let mut log = Partition::new("cash", 0);
    log.push_event(&cash(1, 1, AT, "10.00", "deposit"));
    log.push_event(&cash(1, 2, AT, "5.00", "fee"));
    log.push_event(&cash(1, 3, AT, "1.00", "deposit"));
    let batch = log.batch(0, 10);
    let applier = &applier;
    let client = &mut client;
    // A panic that escapes `apply` ends the partition's worker with the batch in its hands;
    // met again on every restart.
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
        applier.apply(client, &batch),
    ))
    .await
    .expect("a panic in a view's rules does not escape the engine")
    .expect("batch");
    assert_eq!(kinds(&outcome), [Applied, DeadLettered, Applied]);
    let balance: rust_decimal::Decimal = client
        .query_one("SELECT balance FROM cash_book_v1 WHERE account_id = 1", &[])
        .await
        .expect("the view's row")
        .get(0);
    assert_eq!(balance.to_string(), "11.00");
    let error: String = client
        .query_one(
            "SELECT error FROM projector.dead_letters WHERE consumer = 'cash_book_v1' AND seq = 2",
            &[],
        )
        .await
        .expect("the dead letter")
        .get(0);
    assert!(error.contains("a team's rule panicked"), "{error}");
}
