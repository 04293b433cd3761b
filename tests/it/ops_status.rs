//! `projector status` and the health rule against real PostgreSQL and a Kafka-protocol broker (the mock cluster, or
//! `PROJECTOR_TEST_BROKERS`): lag
//! in offsets and seconds from the broker's watermarks and message times (the offsets the
//! engine stores in PostgreSQL, no Kafka-side commits at all), counters, dead letters, parked
//! accounts, and what pages and what does not.

use std::sync::Arc;
use std::time::Duration;

use crate::support::broker::Broker;
use crate::support::process::run_to_end;
use crate::support::Trail;
use projector_engine::kafka::log::{LogReader, Reading};
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::testkit::{fill, Partition, TestDb};
use projector_engine::{Applier, Registry, SourceOrdering};
use projector_ops::{collect, HealthRule, ProblemKind, Severity, StatusOptions};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Publishes `log`'s messages to `partition`, in order, stamped `timestamp_ms`: their
/// offsets on the broker are their indexes, as in the test log.
pub async fn publish_log(bootstrap: &str, log: &Partition, timestamp_ms: i64) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("producer");
    for m in &log.log {
        let mut record = FutureRecord::<[u8], [u8]>::to(&log.topic)
            .partition(log.partition)
            .timestamp(timestamp_ms)
            .payload(&m.payload[..]);
        if let Some(key) = &m.key {
            record = record.key(&key[..]);
        }
        let delivery = producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("delivered");
        assert_eq!(
            (delivery.partition, delivery.offset),
            (log.partition, m.offset)
        );
    }
}

fn options(stall_after: Duration) -> StatusOptions {
    StatusOptions {
        names: Vec::new(),
        rule: HealthRule {
            stall_after,
            ..HealthRule::default()
        },
        parked_limit: 5,
        sample: None,
        local: None,
    }
}

const HOUR_MS: i64 = 3_600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_lag_counters_parks_and_judges_health() {
    let broker = Broker::start(&[("fills", 2)]);
    let bootstrap = broker.bootstrap_servers();
    let topic = broker.topic("fills");
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let at = "2026-11-29T10:15:00Z";
    let f = |account, seq| fill(account, seq, at, "EURUSD", "buy", "10", "1.1", "0");

    // Partition 0: applied up to offset 5 (a duplicate, a poison message, a gap that parks
    // account 1), then 5 messages nobody consumed, all produced an hour ago.
    let mut p0 = Partition::new(&topic, 0);
    p0.push_event(&f(1, 1));
    p0.push_event(&f(1, 1));
    p0.push_raw(Some(b"7".to_vec()), b"not json".to_vec());
    p0.push_event(&f(1, 3));
    p0.push_event(&f(2, 1));
    for seq in 2..=6 {
        p0.push_event(&f(2, seq));
    }
    // Partition 1: two fresh messages, never consumed, never committed.
    let p1 = Partition::from_events(&topic, 1, &[f(3, 1), f(3, 2)]);
    let now_ms = chrono::Utc::now().timestamp_millis();
    publish_log(&bootstrap, &p0, now_ms - HOUR_MS).await;
    publish_log(&bootstrap, &p1, now_ms).await;

    let applier =
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier");
    let mut client = db.client().await;
    applier
        .apply(&mut client, &p0.batch(0, 5))
        .await
        .expect("apply");

    let kafka = broker.config(&topic);
    let probe = Arc::new(
        LogReader::connect(&kafka, Duration::from_secs(5), Reading::Samples).expect("probe"),
    );
    let rule = Duration::from_secs(120);
    let status = collect(db.pool(), &probe, &options(rule))
        .await
        .expect("status");

    assert!(status.postgres.reachable && status.kafka.reachable);
    assert_eq!(status.kafka.partitions, Some(2));
    assert_eq!(status.views.len(), 1);
    let v = &status.views[0];
    assert_eq!(
        (v.consumer.as_str(), v.state.as_str()),
        ("trail_v1", "live")
    );
    let p = &v.partitions;
    assert_eq!(p.len(), 2);
    assert_eq!(
        (p[0].next_offset, p[0].high_watermark, p[0].lag_messages),
        (Some(5), Some(10), Some(5))
    );
    let age = p[0].lag_seconds.expect("the waiting message's time");
    assert!((3600..3600 + 600).contains(&age), "an hour old, got {age}s");
    assert_eq!(
        (p[1].next_offset, p[1].high_watermark, p[1].lag_messages),
        (None, Some(2), Some(2))
    );
    assert!(p[1].lag_seconds.expect("time") < 600);
    let lag = v.lag.expect("lag");
    assert_eq!(lag.messages, 7);
    assert_eq!(lag.seconds, Some(age));
    assert_eq!(v.counters.applied, 2);
    assert_eq!(v.counters.duplicates.total, 1);
    // Until the engine records kinds per partition, the duplicate is unattributed.
    assert_eq!(
        v.counters.duplicates.seq + v.counters.duplicates.unattributed,
        1
    );
    assert_eq!((v.counters.dead_lettered, v.counters.waiting), (1, 1));
    assert_eq!(v.dead_letters.open, 1);
    assert_eq!(v.dead_letters.open_by_kind.get("poison"), Some(&1));
    assert_eq!(v.dead_letters.open_by_kind.get("conflict"), Some(&0));
    assert_eq!(v.parked.total, 1);
    assert_eq!(v.parked.by_reason.get("gap"), Some(&1));
    assert_eq!(v.parked.oldest.len(), 1);
    assert_eq!(
        (
            v.parked.oldest[0].account_id,
            v.parked.oldest[0].blocked_seq
        ),
        (1, 2)
    );
    assert_eq!(v.waiting_events, 1);
    let inbox = status.inbox.as_ref().expect("inbox");
    assert!(inbox.rows_estimate.is_some_and(|n| n >= 2) && inbox.oldest_applied_at.is_some());
    // Slow but progressing: it committed just now, so nothing pages, however old the lag.
    assert!(status.healthy, "{:?}", status.problems);
    let kinds: Vec<ProblemKind> = status.problems.iter().map(|p| p.kind).collect();
    assert!(
        kinds.contains(&ProblemKind::DeadLetters) && kinds.contains(&ProblemKind::ParkedAccounts)
    );
    assert!(status.problems.iter().all(|p| p.severity == Severity::Warn));

    // The same JSON `status --json` prints: stable keys, the right values.
    let json: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&status).expect("json")).expect("parses");
    assert_eq!(json["schema"], 1);
    assert_eq!(json["views"][0]["partitions"][0]["lag_messages"], 5);
    assert_eq!(json["views"][0]["parked"]["oldest"][0]["reason"], "gap");
    assert_eq!(json["views"][0]["counters"]["duplicates"]["total"], 1);

    // Stuck: no commit for ten minutes while hour-old messages wait. Partition 1 is not: its
    // messages are fresh and the version became live moments ago.
    client
        .batch_execute("UPDATE projector.offsets SET updated_at = now() - interval '10 minutes'")
        .await
        .expect("age the commit");
    let status = collect(db.pool(), &probe, &options(rule))
        .await
        .expect("status");
    assert!(!status.healthy);
    let page = &status.problems[0];
    assert_eq!(
        (page.severity, page.kind, page.partition),
        (Severity::Page, ProblemKind::Stalled, Some(0))
    );
    assert!(status.views[0].partitions[0].stalled && !status.views[0].partitions[1].stalled);

    // The command says the same, as JSON and as a table, and exits 1.
    let args = |json: bool| {
        let mut a = vec![
            "status".to_owned(),
            "--database-url".to_owned(),
            db.url().to_owned(),
            "--brokers".to_owned(),
            bootstrap.clone(),
            "--topic".to_owned(),
            topic.clone(),
            "--sample".to_owned(),
            "0s".to_owned(),
        ];
        if json {
            a.push("--json".to_owned());
        }
        a
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
        .args(args(true))
        .output()
        .expect("status --json");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(json["healthy"], false);
    assert_eq!(json["problems"][0]["kind"], "stalled");
    assert_eq!(json["views"][0]["partitions"][0]["stalled"], true);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
        .args(args(false))
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("UNHEALTHY"), "{text}");
    assert!(
        text.contains("PAGE trail_v1 partition 0: no commit for"),
        "{text}"
    );
    let table: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("inbox"))
        .collect();
    assert!(
        table.len() >= 3 && table.iter().all(|l| l.chars().count() <= 80),
        "{text}"
    );

    // A rebuild does not page, stalled or not; a paused one is not even a warning.
    client
        .batch_execute("UPDATE projector.views SET state = 'building' WHERE consumer = 'trail_v1'")
        .await
        .expect("building");
    let status = collect(db.pool(), &probe, &options(rule))
        .await
        .expect("status");
    assert!(status.healthy, "{:?}", status.problems);
    assert!(status
        .problems
        .iter()
        .any(|p| p.kind == ProblemKind::RebuildStalled));
    client
        .batch_execute(
            "INSERT INTO projector.rebuilds (consumer, name, version, source, phase, paused, cutover) \
             VALUES ('trail_v1', 'trail', 1, 'earliest', 'tailing', true, 'manual')",
        )
        .await
        .expect("paused rebuild");
    let status = collect(db.pool(), &probe, &options(rule))
        .await
        .expect("status");
    assert!(status
        .problems
        .iter()
        .all(|p| p.kind != ProblemKind::RebuildStalled));
    assert!(status.views[0].rebuild.as_ref().is_some_and(|r| r.paused));

    // Back to live and committing: the command exits 0.
    client
        .batch_execute(
            "DELETE FROM projector.rebuilds; \
             UPDATE projector.views SET state = 'live' WHERE consumer = 'trail_v1'; \
             UPDATE projector.offsets SET updated_at = now()",
        )
        .await
        .expect("live again");
    let (code, stderr) = run_to_end(&args(false).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(code.success(), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_kafka_or_postgres_is_unhealthy() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    // Nothing listens on port 1.
    let probe = Arc::new(
        LogReader::connect(
            &KafkaConfig::new("127.0.0.1:1", "fills"),
            Duration::from_secs(1),
            Reading::Samples,
        )
        .expect("a client, even without a broker"),
    );
    let status = collect(db.pool(), &probe, &options(Duration::from_secs(120)))
        .await
        .expect("status");
    assert!(!status.healthy && !status.kafka.reachable);
    assert_eq!(status.problems[0].kind, ProblemKind::KafkaUnreachable);
    assert_eq!(status.views.len(), 1, "PostgreSQL's side is still shown");
    assert!(status.views[0].lag.is_none());

    let nowhere =
        projector_engine::db::pool("postgres://postgres@127.0.0.1:1/nowhere", 1).expect("pool");
    let status = collect(&nowhere, &probe, &options(Duration::from_secs(120)))
        .await
        .expect("status");
    assert!(!status.healthy && !status.postgres.reachable);
    assert_eq!(status.problems[0].kind, ProblemKind::PostgresUnreachable);
}
