//! Logs as JSON at trace level, from every operations command and from `run`: each line is a
//! JSON object, and the password of the database URL (or of a Kafka property) is in none.

use std::process::Command;
use std::time::Duration;

use crate::support::broker::Broker;
use crate::support::process::Projector;
use projector_engine::testkit::TestDb;

const SECRET: &str = "Sup3r-Secret-Pw";
const KAFKA_SECRET: &str = "Kafka-Secret-Pw";

fn check(what: &str, output: &str) {
    assert!(
        !output.contains(SECRET),
        "{what} logged the password:\n{output}"
    );
    assert!(
        !output.contains(KAFKA_SECRET),
        "{what} logged the Kafka password:\n{output}"
    );
    let lines: Vec<&str> = output.lines().filter(|l| l.starts_with('{')).collect();
    assert!(
        !lines.is_empty(),
        "{what}: no JSON log line at trace level:\n{output}"
    );
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {l}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{what}: {l}"
        );
    }
}

#[test]
fn json_logs_at_trace_never_hold_a_password() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = Broker::start(&[("fills", 1)]);
    let bootstrap = broker.bootstrap_servers();
    let topic = broker.topic("fills");
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    // The server trusts local connections: the password is sent nowhere, but it is given.
    let url = db
        .url()
        .replacen("postgres@", &format!("postgres:{SECRET}@"), 1);
    assert_ne!(url, db.url());
    let sasl = format!("sasl.password={KAFKA_SECRET}");
    let commands: [Vec<&str>; 3] = [
        vec![
            "status",
            "--json",
            "--sample",
            "0s",
            "--brokers",
            &bootstrap,
            "--topic",
            &topic,
            "-X",
            &sasl,
        ],
        vec!["inbox", "prune", "--older-than", "30d"],
        vec![
            "reconcile",
            "eod",
            "--source",
            "SELECT now() AS at, 1 AS fills",
            "--window",
            "1d",
        ],
    ];
    for args in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_projector"))
            .args(&args)
            .args(["--database-url", &url, "--log-format", "json"])
            .env("PROJECTOR_LOG", "trace")
            .env("NO_COLOR", "1")
            .output()
            .expect("run projector");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}:\n{text}");
        check(&args[0..2].join(" "), &String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains(SECRET), "{args:?}: {text}");
    }

    let mut args: Vec<String> = [
        "run",
        "--database-url",
        &url,
        "--metrics-addr",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ]
    .map(str::to_owned)
    .into();
    args.extend(broker.cli_flags(&topic));
    let mut run = Projector::spawn(&args, "trace");
    run.wait_for("the endpoint", Duration::from_secs(60), |l| {
        l.contains("metrics on http://")
    });
    run.signal("TERM");
    assert!(run.wait_exit(Duration::from_secs(60)).success());
    check("run", &run.log_all());
}
