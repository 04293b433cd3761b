//! `projector publish` and `projector dev-broker` against a real Kafka-protocol broker
//! (librdkafka's mock cluster): bad lines stop the publish cleanly, republishing appends
//! copies at new offsets, and the dev broker serves any client until SIGTERM.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::broker::Broker;
use projector_devkit::devbroker::{
    read_topic, ConsumedMessage, DevBroker, RDKafkaApiKey, RDKafkaRespErr,
};
use projector_devkit::partitioner::partition_for_account;
use projector_devkit::publish::{publish_lines, PublishConfig, PublishError};

const READ: Duration = Duration::from_secs(30);
const PROCESS: Duration = Duration::from_secs(60);

fn event(id: &str, account: i64, seq: i64) -> String {
    format!(
        r#"{{"event_id":"{id}","type":"fill_executed","account_id":{account},"seq":{seq},"occurred_at":"2026-11-29T10:15:00Z","data":{{"symbol":"EURUSD","side":"buy","qty":"300","price":"1.08420"}}}}"#
    )
}

fn event_id(m: &ConsumedMessage) -> String {
    let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("json");
    v["event_id"].as_str().expect("event_id").to_owned()
}

#[tokio::test]
async fn a_bad_line_stops_the_publish_after_delivering_everything_before_it() {
    let broker = Broker::start(&[("events", 3)]);
    let topic = broker.topic("events");
    let lines = [
        event("e1", 1, 1),
        event("e2", 2, 1),
        event("e3", 1, 2),
        String::new(), // blank lines are skipped but counted
        event("e5", 3, 1),
        event("e6", 2, 2),
        // No `seq`: the engine would dead-letter it, so it is refused here.
        r#"{"event_id":"e7","type":"fill_executed","account_id":1,"occurred_at":"2026-11-29T10:15:00Z","data":{}}"#.to_owned(),
        event("e8", 1, 3),
        event("e9", 4, 1),
    ];
    let file = lines.join("\n") + "\n";

    let err = publish_lines(
        file.as_bytes(),
        &PublishConfig::new(broker.bootstrap_servers(), &topic),
    )
    .await
    .expect_err("line 7 is poison");
    let text = err.to_string();
    match err {
        PublishError::BadLine {
            line,
            reason,
            delivered,
        } => {
            assert_eq!(line, 7, "{text}");
            assert!(reason.contains("seq"), "{reason}");
            assert_eq!(delivered, 5);
        }
        other => panic!("expected a bad line, got {other}"),
    }
    assert!(text.starts_with("line 7 "), "{text}");
    assert!(!text.contains('\n'), "one line: {text}");

    let mut ids: Vec<String> = broker
        .read_topic(&topic, READ)
        .expect("read")
        .iter()
        .map(event_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["e1", "e2", "e3", "e5", "e6"]);
}

#[tokio::test]
async fn republishing_appends_copies_with_the_same_keys_and_partitions() {
    let broker = Broker::start(&[("events", 4)]);
    let topic = broker.topic("events");
    let file: String = (0..60)
        .map(|n| event(&format!("r{n}"), n % 13, n / 13 + 1) + "\n")
        .collect();
    let config = PublishConfig::new(broker.bootstrap_servers(), &topic);

    let first = publish_lines(file.as_bytes(), &config)
        .await
        .expect("first publish");
    let second = publish_lines(file.as_bytes(), &config)
        .await
        .expect("second publish");
    assert_eq!(first.sent, 60);
    assert_eq!(first, second, "the same partitions, the same counts");

    let messages = broker.read_topic(&topic, READ).expect("read");
    assert_eq!(messages.len(), 120);
    let mut copies: BTreeMap<String, Vec<&ConsumedMessage>> = BTreeMap::new();
    for m in &messages {
        copies.entry(event_id(m)).or_default().push(m);
    }
    assert_eq!(copies.len(), 60);
    for (id, c) in &copies {
        let [a, b] = c.as_slice() else {
            panic!("{id} appears {} times", c.len());
        };
        assert_eq!(a.key, b.key, "{id}");
        assert_eq!(a.partition, b.partition, "{id}");
        assert_eq!(a.payload, b.payload, "{id}");
        assert!(a.offset < b.offset, "{id}: the copy is at a new offset");
    }
    // Per partition, the second publish starts after the last offset of the first, in the
    // same order: the log is the first run, then the second.
    for (p, n) in &first.partitions {
        let n = usize::try_from(*n).expect("small");
        let ids: Vec<String> = messages
            .iter()
            .filter(|m| m.partition == *p)
            .map(event_id)
            .collect();
        assert_eq!(ids.len(), 2 * n);
        assert_eq!(ids[..n], ids[n..], "partition {p}");
    }
}

/// Kills the child if the test fails while it runs.
struct Reaper(Option<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn kill_by_pid(pid: u32) {
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg(pid.to_string())
        .status();
}

/// Waits for the child on a helper thread, so the exit itself is what the test awaits,
/// bounded by a deadline.
fn wait_within(reaper: &mut Reaper, deadline: Duration) -> ExitStatus {
    let mut child = reaper.0.take().expect("the child is running");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(deadline) {
        Ok(status) => status.expect("wait"),
        Err(_) => {
            kill_by_pid(pid);
            panic!("process {pid} did not exit within {deadline:?}");
        }
    }
}

/// Runs a command to completion with `input` on its standard input, bounded by a deadline.
fn run_within(mut command: Command, input: &[u8], deadline: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    // Dropping the handle closes standard input: end of input.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write stdin");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => output.expect("output"),
        Err(_) => {
            kill_by_pid(pid);
            panic!("{command:?} did not finish within {deadline:?}");
        }
    }
}

fn projector() -> Command {
    Command::new(env!("CARGO_BIN_EXE_projector"))
}

#[tokio::test]
async fn the_dev_broker_serves_any_client_until_sigterm() {
    let mut child = projector()
        .args(["dev-broker", "--partitions", "3", "--topic", "demo"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn projector dev-broker");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if err_tx.send(line).is_err() {
                break;
            }
        }
    });
    let pid = child.id();
    let mut child = Reaper(Some(child));

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut first = String::new();
        let read = reader.read_line(&mut first).map(|_| first);
        let _ = tx.send(read);
        // Keep the pipe open while the broker runs.
        let mut rest = String::new();
        let _ = reader.read_line(&mut rest);
    });
    let bootstrap = rx
        .recv_timeout(PROCESS)
        .expect("the address within the deadline")
        .expect("read stdout");
    let bootstrap = bootstrap.trim().to_owned();
    assert!(
        bootstrap.starts_with("127.0.0.1:") || bootstrap.starts_with("localhost:"),
        "first line is the bootstrap address: {bootstrap:?}"
    );

    // Its users are told what the mock cluster needs that a real broker does not.
    let hint = loop {
        let line = err_rx
            .recv_timeout(PROCESS)
            .expect("the consumer's flags on standard error");
        if line.contains("projector run") {
            break line;
        }
    };
    assert!(
        hint.contains(&format!(
            "projector run --brokers {bootstrap} --topic demo -X fetch.wait.max.ms=10"
        )),
        "{hint}"
    );

    // A client produces through the library ...
    let report = publish_lines(
        (event("d1", 42, 1) + "\n").as_bytes(),
        &PublishConfig::new(&bootstrap, "demo"),
    )
    .await
    .expect("publish to the dev broker");
    assert_eq!(report.sent, 1);
    // ... and the CLI produces from standard input.
    let mut cli = projector();
    cli.args(["publish", "--brokers", &bootstrap, "--topic", "demo", "-"]);
    let out = run_within(cli, (event("d2", 42, 2) + "\n").as_bytes(), PROCESS);
    assert!(
        out.status.success(),
        "projector publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("published 1 event "));

    let messages = read_topic(&bootstrap, "demo", READ).expect("consume from the dev broker");
    let ids: Vec<String> = messages.iter().map(event_id).collect();
    assert_eq!(ids, ["d1", "d2"]);
    for m in &messages {
        assert_eq!(m.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(
            m.partition,
            partition_for_account(42, 3),
            "--partitions 3 took effect"
        );
    }

    let kill = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = wait_within(&mut child, PROCESS);
    assert!(status.success(), "dev-broker exits 0 on SIGTERM: {status}");
}

/// `projector publish` takes fills at version 1 and 2 in one file, and refuses a version this
/// build does not know with the line's number, before anything after it is sent.
#[tokio::test]
async fn the_cli_publishes_both_fill_versions_and_refuses_an_unknown_one() {
    let broker = Broker::start(&[("versions", 2)]);
    let topic = broker.topic("versions");
    let path: PathBuf = std::env::temp_dir().join(format!(
        "projector-publish-versions-{}.jsonl",
        std::process::id()
    ));
    let v2 = |id: &str, seq: i64, qty: &str, version: i32| {
        format!(
            r#"{{"event_id":"{id}","type":"fill_executed","type_version":{version},"account_id":1,"seq":{seq},"occurred_at":"2026-11-29T10:15:00Z","data":{{"symbol":"EURUSD","qty":"{qty}","price":"1.08420"}}}}"#
        )
    };
    let file = [
        event("v1", 1, 1),
        v2("v2-sell", 2, "-300", 2),
        event("v1-again", 1, 3),
        v2("v3", 4, "1", 3),
        v2("after", 5, "1", 2),
    ]
    .join("\n");
    std::fs::write(&path, file).expect("write the input file");
    let mut cli = projector();
    cli.args(["publish", "--topic", &topic])
        .arg(&path)
        .env("KAFKA_BROKERS", broker.bootstrap_servers());
    let out = run_within(cli, b"", PROCESS);
    let _ = std::fs::remove_file(&path);

    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 4 refused")
            && stderr
                .contains("fill_executed has versions 1 to 2; version 3 is unknown to this build"),
        "{stderr}"
    );
    let ids: Vec<String> = broker
        .read_topic(&topic, READ)
        .expect("read")
        .iter()
        .map(event_id)
        .collect();
    assert_eq!(ids, ["v1", "v2-sell", "v1-again"]);
}

#[tokio::test]
async fn the_cli_refuses_a_bad_line_with_one_line_naming_it() {
    let broker = Broker::start(&[("events", 2)]);
    let topic = broker.topic("events");
    let path: PathBuf = std::env::temp_dir().join(format!(
        "projector-publish-bad-line-{}.jsonl",
        std::process::id()
    ));
    let file = [
        event("c1", 1, 1),
        event("c2", 1, 2),
        "{not json".to_owned(),
        event("c4", 1, 3),
    ]
    .join("\n");
    std::fs::write(&path, file).expect("write the input file");

    let mut cli = projector();
    cli.args(["publish", "--topic", &topic])
        .arg(&path)
        .env("KAFKA_BROKERS", broker.bootstrap_servers());
    let out = run_within(cli, b"", PROCESS);
    let _ = std::fs::remove_file(&path);

    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("line 3 refused"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");

    let ids: Vec<String> = broker
        .read_topic(&topic, READ)
        .expect("read")
        .iter()
        .map(event_id)
        .collect();
    assert_eq!(ids, ["c1", "c2"]);

    // A property without `=` is refused by the argument parser, also in one line.
    let mut cli = projector();
    cli.args(["publish", "--brokers", "x", "--topic", "t", "-X", "acks"]);
    let out = run_within(cli, b"", PROCESS);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("KEY=VALUE"), "{stderr}");
}

#[tokio::test]
async fn producer_retries_after_broker_errors_write_each_message_once() {
    let broker = DevBroker::start(1, &[("events", 2)]).expect("dev broker");
    // Retriable errors on the first produce requests: the producer retries the same
    // batches (same producer id and sequence numbers), the publish still succeeds, and each
    // line is stored once. The mock refuses these requests before appending, so this shows
    // retries are harmless, not the broker-side dedup of a retried append.
    broker
        .request_errors(
            RDKafkaApiKey::Produce,
            &[
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            ],
        )
        .expect("inject");
    let file: String = (0..20)
        .map(|n| event(&format!("x{n}"), n % 5, n / 5 + 1) + "\n")
        .collect();
    let report = publish_lines(
        file.as_bytes(),
        &PublishConfig::new(broker.bootstrap_servers(), "events"),
    )
    .await
    .expect("publish despite the errors");
    assert_eq!(report.sent, 20);
    let mut ids: Vec<String> = broker
        .read_topic("events", READ)
        .expect("read")
        .iter()
        .map(event_id)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20);
    assert_eq!(broker.read_topic("events", READ).expect("read").len(), 20);
}

#[tokio::test]
async fn an_undeliverable_message_is_a_typed_error_naming_its_line() {
    let broker = DevBroker::start(1, &[("events", 2)]).expect("dev broker");
    broker.broker_down(-1).expect("down");
    let mut config = PublishConfig::new(broker.bootstrap_servers(), "events");
    config
        .properties
        .push(("message.timeout.ms".to_owned(), "1000".to_owned()));
    let file = format!("\n{}\n{}\n", event("u1", 1, 1), event("u2", 2, 1));

    let err = publish_lines(file.as_bytes(), &config)
        .await
        .expect_err("no broker");
    let text = err.to_string();
    match err {
        PublishError::Delivery {
            line, delivered, ..
        } => {
            assert_eq!(line, 2, "{text}");
            assert_eq!(delivered, 0, "{text}");
        }
        other => panic!("expected a delivery failure, got {other}"),
    }
    assert!(!text.contains('\n'), "{text}");

    // Nothing was stored, and the broker takes the same file once it is back.
    broker.broker_up(-1).expect("up");
    let report = publish_lines(
        file.as_bytes(),
        &PublishConfig::new(broker.bootstrap_servers(), "events"),
    )
    .await
    .expect("publish");
    assert_eq!(report.sent, 2);
    let mut ids: Vec<String> = broker
        .read_topic("events", READ)
        .expect("read")
        .iter()
        .map(event_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["u1", "u2"]);
}
