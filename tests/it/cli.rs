//! The binary's promises about connections: TLS follows `sslmode`, secrets never reach the
//! output, a frozen transaction cannot hold a partition for ever, and mistakes are one line.

use std::process::Command;
use std::sync::Arc;

use crate::support::{fills, rows, trail_fold, with_options, Trail};
use projector_engine::testkit::{Partition, TestDb};
use projector_engine::{Applier, Registry, SourceOrdering};
use tokio_postgres::error::SqlState;

/// The test database's URL with `query` as its only options: the suite's default URL says
/// `sslmode=disable` (`testkit::admin_url`), which this file's TLS test must not inherit.
fn with_query(url: &str, query: &str) -> String {
    let bare = url.split('?').next().unwrap_or(url);
    if query.is_empty() {
        bare.to_owned()
    } else {
        format!("{bare}?{query}")
    }
}

async fn uses_tls(url: &str) -> Result<bool, String> {
    let pool = projector_engine::db::pool(url, 1).map_err(|e| e.to_string())?;
    let client = pool.get().await.map_err(|e| e.to_string())?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_follows_sslmode() {
    let db = TestDb::new(&Registry::new()).await;
    let admin = db.client().await;
    let server_ssl: String = admin
        .query_one("SHOW ssl", &[])
        .await
        .expect("show ssl")
        .get(0);
    assert!(!uses_tls(&with_query(db.url(), "sslmode=disable"))
        .await
        .expect("plain connection"));
    if server_ssl != "on" {
        eprintln!("the server has ssl = off; only sslmode=disable was checked");
        return;
    }
    assert!(uses_tls(&with_query(db.url(), "sslmode=require"))
        .await
        .expect("encrypted connection"));
    assert!(uses_tls(&with_query(db.url(), ""))
        .await
        .expect("prefer is the default"));
    // verify-full checks the certificate: a server with a self-signed certificate for
    // another host name is refused, not silently trusted.
    let refused = uses_tls(&with_query(db.url(), "sslmode=verify-full")).await;
    assert!(
        refused.is_err(),
        "a certificate that does not verify must be refused"
    );
}

#[test]
fn secrets_never_reach_the_output() {
    let secret = "s3cr3t-Pa55word";
    let url = format!("postgres://postgres:{secret}@127.0.0.1:1/nowhere");
    for args in [
        vec!["migrate", "--database-url", url.as_str()],
        vec!["views", "--database-url", url.as_str()],
        vec!["demo", "--database-url", url.as_str()],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_projector"))
            .args(&args)
            .env("PROJECTOR_LOG", "trace")
            .output()
            .expect("run projector");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains(secret),
            "{args:?} printed the password:\n{text}"
        );
        assert!(
            text.contains("PostgreSQL") || text.contains("database"),
            "{args:?}: {text}"
        );
    }
}

#[test]
fn unknown_arguments_get_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_projector"))
        .args(["run", "--brokres", "x"])
        .output()
        .expect("run projector");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--brokres"), "{stderr}");
}

/// A process frozen inside a batch (SIGSTOP, a VM pause) holds its partition's offset row
/// lock; engine sessions set `idle_in_transaction_session_timeout`, so the server ends the
/// frozen transaction and the next writer of the partition commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_transaction_cannot_hold_a_partition_for_ever() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let applier =
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier");
    let log = Partition::from_events("fills", 0, &fills(5, 4));
    let mut writer = db.client().await;
    applier
        .apply(&mut writer, &log.batch(0, 10))
        .await
        .expect("the first batch");

    // Unless the URL's options say otherwise, an engine session gives up after a minute.
    let default: String = writer
        .query_one("SHOW idle_in_transaction_session_timeout", &[])
        .await
        .expect("show")
        .get(0);
    assert_eq!(default, "1min");

    // A writer freezes while it holds the partition: it locked the offset row, then stopped.
    let short = with_options(db.url(), &[("idle_in_transaction_session_timeout", "1000")]);
    let frozen_pool = projector_engine::db::pool(&short, 1).expect("pool");
    let frozen = frozen_pool.get().await.expect("session");
    frozen
        .batch_execute(
            "BEGIN; SELECT next_offset FROM projector.offsets \
             WHERE consumer = 'trail_v1' AND topic = 'fills' AND partition = 0 FOR UPDATE",
        )
        .await
        .expect("lock the partition");
    let held = writer
        .batch_execute(
            "BEGIN; SELECT 1 FROM projector.offsets WHERE consumer = 'trail_v1' FOR UPDATE NOWAIT",
        )
        .await
        .expect_err("the frozen session holds the offset row");
    assert_eq!(
        held.as_db_error().map(|e| e.code().clone()),
        Some(SqlState::LOCK_NOT_AVAILABLE)
    );
    writer.batch_execute("ROLLBACK").await.expect("rollback");

    // The next writer waits for the row (its statement timeout is longer), and commits once
    // the server has ended the frozen transaction.
    let outcome = applier
        .apply(&mut writer, &log.batch(10, 10))
        .await
        .expect("the next writer commits");
    assert_eq!(outcome.next_offset, 20);
    assert!(
        frozen.simple_query("SELECT 1").await.is_err(),
        "the server closed the frozen session"
    );
    assert_eq!(
        rows(&writer, "trail_v1").await,
        trail_fold(&fills(5, 4)),
        "both batches applied, once"
    );
}
