//! `projector bench` end to end with small arguments: it must finish, check its own results
//! and print every figure as JSON. The figures of a debug build on a busy machine mean
//! nothing; that they are there, positive, and came from checked work is what this asserts.

use std::process::{Command, Stdio};
use std::str::FromStr;

use rust_decimal::Decimal;

const KEYS: [&str; 19] = [
    "naive_eps",
    "engine_eps",
    "engine_all_views_eps",
    "ceiling_eps",
    "catch_up_eps",
    "p50_ms",
    "p99_ms",
    "engine_over_naive",
    "engine_over_ceiling",
    "ceiling_all_views_eps",
    "engine_full_inbox_eps",
    "rebuild_eps",
    "rebuild_over_ceiling",
    "rebuild_live_p99_ms",
    "prune_ms",
    "prune_live_p99_ms",
    "engine_no_notify_eps",
    "ryw_p50_ms",
    "ryw_p99_ms",
];

#[test]
fn the_bench_reports_every_figure_as_json() {
    let url = projector_engine::testkit::admin_url();
    let child = Command::new(env!("CARGO_BIN_EXE_projector"))
        .args([
            "--database-url",
            &url,
            "bench",
            "--events",
            "2000",
            "--accounts",
            "50",
            "--json",
            "--naive-seconds",
            "2",
            "--latency-seconds",
            "2",
            "--repeat",
            "1",
            "--inbox-rows",
            "5000",
        ])
        .env("PROJECTOR_LOG", "error")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start projector bench");
    let scratch = format!("projector_bench_{}", child.id());
    let out = child.wait_with_output().expect("run projector bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "projector bench failed ({}):\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("rows equal the fold"),
        "the bench did not report its exactness checks:\n{stderr}"
    );

    // Standard output is the JSON alone, so scripts can read it.
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "standard output is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    for key in KEYS {
        let value = json
            .get(key)
            .and_then(serde_json::Value::as_number)
            .unwrap_or_else(|| panic!("{key} is missing or not a number in {json}"));
        // Read the number from its text: no floating point in this workspace.
        let value = Decimal::from_str(&value.to_string())
            .unwrap_or_else(|e| panic!("{key} = {value} is not a decimal: {e}"));
        assert!(value > Decimal::ZERO, "{key} = {value} is not positive");
    }
    assert_eq!(json["events"], 2000);
    assert_eq!(json["accounts"], 50);
    assert_eq!(json["inbox_rows"], 5000);
    assert!(
        json["rebuild_live_events"].as_u64().is_some_and(|n| n > 0),
        "no live event was published while the rebuild ran: {json}"
    );
    // The filler's oldest day (a seventh of its rows) was dropped while the
    // feed ran.
    assert!(
        json["prune_rows"].as_u64().is_some_and(|n| n > 0),
        "the prune dropped no rows: {json}"
    );
    assert!(
        json["prune_live_events"].as_u64().is_some_and(|n| n > 0),
        "no live event was published while the prune ran: {json}"
    );
    // The server this runs on is PostgreSQL 14 or later (pg_stat_wal): the full-page image
    // counts are there, and the settings they depend on are named.
    for key in ["engine_wal_fpi", "full_inbox_wal_fpi"] {
        assert!(json[key].as_u64().is_some(), "{key} is missing: {json}");
    }
    assert!(
        json["server_settings"]
            .as_str()
            .is_some_and(|s| s.contains("max_wal_size ") && s.contains("shared_buffers ")),
        "server_settings does not name the settings: {json}"
    );

    // The scratch database was dropped.
    let left = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let pool = projector_engine::db::pool(&url, 1).expect("pool");
            let client = pool.get().await.expect("connect");
            client
                .query_one(
                    "SELECT count(*) FROM pg_database WHERE datname = $1",
                    &[&scratch],
                )
                .await
                .expect("query")
                .get::<_, i64>(0)
        });
    assert_eq!(left, 0, "the scratch database {scratch} was not dropped");
}
