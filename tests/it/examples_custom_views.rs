//! `examples/custom_views.rs`, a `projector` binary with a view of its own: its view passes
//! the conformance suite every view must pass, its registry holds the built-in views and
//! its own, and `migrate` with that registry creates its tables and read name.

use std::sync::Arc;

use projector_engine::testkit::conformance::{self, Factory};
use projector_engine::testkit::{cash, fill, TestDb};
use projector_engine::{Registry, Versioned};

// The example is a binary; its `main` is not called here.
#[allow(dead_code)]
#[path = "../../examples/custom_views.rs"]
mod custom_views;

use custom_views::CashBalance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cash_balance_view_passes_the_conformance_suite() {
    let events = vec![
        cash(1, 1, "2026-11-29T09:00:00Z", "100.00", "deposit"),
        fill(
            1,
            2,
            "2026-11-29T10:00:00Z",
            "EURUSD",
            "buy",
            "10",
            "1.08",
            "0.50",
        ),
        cash(1, 3, "2026-11-29T11:00:00Z", "-40.50", "withdrawal"),
        cash(2, 1, "2026-11-29T09:30:00Z", "-10", "fee"),
        cash(3, 1, "2026-11-29T12:00:00Z", "5", "deposit"),
        cash(3, 2, "2026-11-30T12:00:00Z", "7.000", "deposit"),
    ];
    let factory: Factory = Arc::new(|version| Arc::new(Versioned::new(version, CashBalance)));
    let report = conformance::run(factory, &events).await;
    // (account_id, movements, deposited, withdrawn, balance), computed by hand: the fill is
    // not a movement, withdrawals are kept positive, sums keep the larger scale.
    assert_eq!(
        report.rows,
        vec![vec![
            "(1,2,100.00,40.50,59.50)".to_owned(),
            "(2,1,0,10,-10)".to_owned(),
            "(3,2,12.000,0,12.000)".to_owned(),
        ]]
    );
}

#[test]
fn the_registry_holds_the_built_in_views_and_the_example_view() {
    let registry = custom_views::registry().expect("the example's views register");
    let consumers: Vec<String> = registry.all().iter().map(|v| v.consumer()).collect();
    assert_eq!(
        consumers,
        ["portfolio_v1", "risk_v1", "eod_v1", "cash_balance_v1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_with_the_example_registry_creates_its_tables() {
    let db = TestDb::new(&Registry::new()).await;
    let registry = custom_views::registry().expect("the example's views register");
    projector::migrate::run(db.url(), &registry)
        .await
        .expect("projector migrate with the example's registry");
    let client = db.client().await;
    for relation in ["cash_balance_v1", "cash_balance", "portfolio_v1", "eod"] {
        let found: Option<String> = client
            .query_one("SELECT to_regclass($1)::text", &[&relation])
            .await
            .expect("to_regclass")
            .get(0);
        assert_eq!(
            found.as_deref(),
            Some(relation),
            "{relation} was not created"
        );
    }
    let state: String = client
        .query_one(
            "SELECT state FROM projector.views WHERE name = 'cash_balance' AND version = 1",
            &[],
        )
        .await
        .expect("the view version is registered")
        .get(0);
    assert_eq!(state, "live");
}

/// The engine knows no event type: the example view applies the built-in rules of
/// `cash_adjusted` itself, so a movement without a reason stays poison for it, as it was when
/// the engine applied them, while a sound one passes.
#[test]
fn the_cash_balance_view_applies_the_built_in_rules_of_its_type() {
    use projector_engine::{decode_envelope, Message, Projection};
    let view = Versioned::new(1, CashBalance);
    let event = |data: &str| {
        let payload = format!(
            r#"{{"event_id":"c-1","type":"cash_adjusted","account_id":1,"seq":1,"occurred_at":"2026-11-29T09:00:00Z","data":{data}}}"#
        );
        decode_envelope(&Message::new(0, None, payload)).expect("a sound envelope")
    };
    let err = view
        .check_data(&event(r#"{"amount":"1.00","reason":""}"#))
        .expect_err("no reason");
    assert!(err.to_string().contains("data.reason"), "{err}");
    assert!(view
        .check_data(&event(r#"{"amount":"-1.00","reason":"fee"}"#))
        .is_ok());
}
