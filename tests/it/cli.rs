//! The binary's promises about connections: TLS follows `sslmode`, secrets never reach the
//! output, and mistakes are one line.

use std::process::Command;

use projector_engine::testkit::TestDb;
use projector_engine::Registry;

fn with_query(url: &str, query: &str) -> String {
    format!("{url}?{query}")
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
    assert!(uses_tls(db.url()).await.expect("prefer is the default"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_transaction_cannot_hold_a_partition_for_ever() {
    let db = TestDb::new(&Registry::new()).await;
    let timeout: String = db
        .client()
        .await
        .query_one("SHOW idle_in_transaction_session_timeout", &[])
        .await
        .expect("show")
        .get(0);
    assert_eq!(timeout, "1min");
}
