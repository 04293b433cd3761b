//! A version registered before fingerprints existed is adopted by one code only, and only by
//! `migrate` with code registered for that very version: a migrate that waits on another
//! binary's adoption leaves the version alone after it, and a running process never adopts.

use std::sync::Arc;
use std::time::Duration;

use crate::support::kafka::{config, publish};
use crate::support::variant::Variant;
use crate::support::{eventually, fills, offsets, with_options};
use projector_devkit::devbroker::DevBroker;
use projector_engine::kafka::log::{LogReader, Reading};
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::TestDb;
use projector_engine::{Projection, Registry};
use projector_ops::status::{collect, StatusOptions};
use projector_views::Portfolio;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "fills";

/// Portfolio as another binary writes it: another statement, another fingerprint.
fn newer(version: i32) -> Variant {
    let inner = Portfolio::new(version);
    let mut sql = inner.apply_sql();
    sql.write = format!("{} ", sql.write);
    Variant::of(inner).apply_sql(sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_adopted_by_another_binary_meanwhile_is_left_alone() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let newer_binary = Registry::new()
        .register(Portfolio::new(1))
        .and_then(|r| r.register(newer(2)))
        .expect("registry");
    let this_binary = Registry::new()
        .register(Portfolio::new(1))
        .and_then(|r| r.register(Portfolio::new(2)))
        .expect("registry");
    let db = TestDb::new(&newer_binary).await;
    projector_rebuild::cutover::cutover(
        &mut db.client().await,
        &newer_binary,
        "portfolio",
        2,
        None,
    )
    .await
    .expect("cutover");
    // v2 as an engine before V0008 registered it: no fingerprint.
    db.client()
        .await
        .execute(
            "UPDATE projector.views SET fingerprint = NULL WHERE name = 'portfolio' AND version = 2",
            &[],
        )
        .await
        .expect("no fingerprint");
    publish(&bootstrap, TOPIC, &fills(6, 3)).await;

    // The newer binary adopts v2 in a transaction still open (`migrate` adopts in the
    // transaction that runs the version's DDL).
    let theirs = projector_engine::fingerprint::of(&newer(2));
    let adopting = projector_engine::db::pool(
        &with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")]),
        1,
    )
    .expect("pool")
    .get()
    .await
    .expect("client");
    adopting
        .batch_execute(&format!(
            "BEGIN; UPDATE projector.views SET fingerprint = '{theirs}' \
             WHERE name = 'portfolio' AND version = 2 AND fingerprint IS NULL"
        ))
        .await
        .expect("adopt");

    // A running process never adopts: it leaves a version without a fingerprint alone.
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        this_binary.clone(),
        db.pool().clone(),
        config(&bootstrap, TOPIC),
        Arc::new(NoObserver),
        stop.clone(),
        LiveOptions {
            names: vec!["portfolio".to_owned()],
            refresh: Duration::from_millis(100),
            owner: Some("this".to_owned()),
            restart_first: Duration::from_millis(200),
            restart_max: Duration::from_secs(1),
            local: None,
            notify: true,
        },
    ));
    let probe = Arc::new(
        LogReader::connect(
            &config(&bootstrap, TOPIC),
            Duration::from_secs(5),
            Reading::Samples,
        )
        .expect("probe"),
    );
    let said = eventually(
        "this process to say what it does with portfolio_v2",
        || async {
            let s = collect(db.pool(), &probe, &StatusOptions::default())
                .await
                .expect("status");
            s.views
                .iter()
                .filter(|v| v.consumer == "portfolio_v2")
                .flat_map(|v| {
                    v.runners
                        .iter()
                        .map(|r| (r.state.clone(), r.detail.clone().unwrap_or_default()))
                })
                .collect::<Vec<_>>()
        },
        |states| !states.is_empty(),
    )
    .await;
    assert!(
        said.len() == 1
            && said[0].0 == "skipped"
            && said[0]
                .1
                .contains("registered before code fingerprints were recorded"),
        "{said:?}"
    );

    // This binary's migrate waits on the other's adoption, then leaves v2 alone.
    let migrating = {
        let url = db.url().to_owned();
        let registry = this_binary.clone();
        tokio::spawn(async move {
            let pool = projector_engine::db::pool(&url, 1).expect("pool");
            let mut client = pool.get().await.expect("client");
            projector_engine::migrate(&mut client, &registry).await
        })
    };
    eventually(
        "this binary's migrate to wait on the other's adoption",
        || async {
            db.client()
                .await
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get::<_, i64>(0)
        },
        |n| *n >= 1,
    )
    .await;
    adopting.batch_execute("COMMIT").await.expect("commit");
    let report = migrating.await.expect("join").expect("migrate");
    assert!(
        report
            .skipped
            .iter()
            .any(|(consumer, reason)| consumer == "portfolio_v2" && reason.contains(&theirs)),
        "{report:?}"
    );
    stop.cancel();
    live.await.expect("join");
    let recorded: Option<String> = db
        .client()
        .await
        .query_one(
            "SELECT fingerprint FROM projector.views WHERE name = 'portfolio' AND version = 2",
            &[],
        )
        .await
        .expect("fingerprint")
        .get(0);
    assert_eq!(recorded.as_deref(), Some(theirs.as_str()));
    let written: i64 = offsets(&db.client().await, "portfolio_v2")
        .await
        .next
        .values()
        .sum();
    assert_eq!(
        written,
        0,
        "this binary's code for v2 ({}) is not the code that adopted it ({theirs})",
        projector_engine::fingerprint::of(&Portfolio::new(2))
    );
}
