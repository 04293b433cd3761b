//! Inbox retention: a table of a million rows goes in batches through the time index, nothing
//! newer than the window removed, and the apply path running at the same time unharmed; and
//! each consumer's rows are measured on its own clock, so a paused rebuild or a stopped
//! service keeps what it still needs to recognise a copy waiting for it in the log.
//!
//! Time is simulated by moving `applied_at` and `updated_at` back in SQL: a week of waiting
//! is what the rows say, not what the test spends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use projector_devkit::devbroker::DevBroker;
use projector_engine::ops::clock;
use projector_engine::ops::prune::{check_window, prune_inbox, PruneOptions};
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{consume, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Projection, Registry, SourceOrdering};
use projector_rebuild::{Cutover, Options, Outcome, Source, Status};
use tokio_util::sync::CancellationToken;

use crate::support::kafka::{config, publish};
use crate::support::process::{run_output, run_to_end, Output};
use crate::support::{eventually, fills, offsets, rows, trail_fold, Trail};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

const DAY: Duration = Duration::from_secs(86_400);
const OLD: i64 = 800_000;
const RECENT: i64 = 200_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_rows_go_in_batches_and_nothing_newer_than_the_window() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let client = db.client().await;

    // A million inbox rows of a retired version that last committed now: 800,000 applied 8
    // to 17 days ago, 200,000 applied 1 to 6 days ago. Loaded with COPY; the load is not
    // what is measured.
    let now: chrono::DateTime<chrono::Utc> = client
        .query_one("SELECT now()", &[])
        .await
        .expect("now")
        .get(0);
    // On a busy machine the load can outlast the engine's statement timeout.
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .expect("no timeout for the load");
    let sink = client
        .copy_in("COPY projector.inbox (consumer, event_id, applied_at) FROM STDIN")
        .await
        .expect("copy");
    futures::pin_mut!(sink);
    let mut chunk = String::new();
    for i in 0..OLD + RECENT {
        let age = if i < OLD {
            chrono::Duration::days(8) + chrono::Duration::seconds(i)
        } else {
            chrono::Duration::days(1) + chrono::Duration::seconds((i - OLD) * 2)
        };
        let at = (now - age).to_rfc3339();
        chunk.push_str(&format!("old_v1\te{i}\t{at}\n"));
        if chunk.len() > 1 << 20 {
            sink.send(Bytes::from(std::mem::take(&mut chunk)))
                .await
                .expect("copy chunk");
        }
    }
    sink.send(Bytes::from(chunk)).await.expect("copy chunk");
    let loaded = sink.finish().await.expect("copy done");
    assert_eq!(loaded, (OLD + RECENT) as u64);
    client
        .batch_execute("RESET statement_timeout")
        .await
        .expect("the engine's timeout again");
    client
        .execute(
            "INSERT INTO projector.offsets (consumer, topic, partition, next_offset) \
             VALUES ('old_v1', 'fills', 0, 1000000)",
            &[],
        )
        .await
        .expect("old_v1's commit");
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");

    // The apply path runs beside retention: after each pruned batch, one batch of events is
    // applied on another connection while the next delete goes on.
    let events = fills(40, 50);
    let log = Partition::from_events("fills", 0, &events);
    let (tick_tx, mut tick_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let apply_db = db.pool().clone();
    let applier = Arc::new(
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"),
    );
    let apply_log = log.clone();
    let apply = tokio::spawn(async move {
        let mut client = apply_db.get().await.expect("client");
        let mut next = 0i64;
        let mut overlapped = 0u32;
        while next < apply_log.log.len() as i64 {
            // Paced by retention while it runs, then free.
            if tick_rx.recv().await.is_some() {
                overlapped += 1;
            }
            let outcome = applier
                .apply(&mut client, &apply_log.batch(next, 20))
                .await
                .expect("apply beside the prune");
            next = outcome.next_offset;
        }
        overlapped
    });

    let options = PruneOptions {
        older_than: Duration::from_secs(7 * 86_400),
        min_window: 7 * DAY,
        batch: 5_000,
        pause: Duration::from_millis(1),
    };
    let mut seen = Vec::new();
    let report = prune_inbox(&client, &options, &clocks, |p| {
        seen.push(*p);
        let _ = tick_tx.send(());
    })
    .await
    .expect("prune");
    drop(tick_tx);
    let overlapped = apply.await.expect("apply task");

    // Batches observed: each at most the batch size, adding up, as many as needed.
    assert_eq!(report.deleted, OLD as u64);
    assert_eq!(report.batches, (OLD as u64).div_ceil(5_000));
    assert_eq!(seen.len() as u64, report.batches);
    assert!(seen.iter().all(|p| p.deleted <= 5_000 && p.deleted > 0));
    assert_eq!(seen.last().map(|p| p.total), Some(OLD as u64));
    assert!(overlapped > 0, "the apply path ran while retention did");
    // Nothing newer than the window went, and nothing older stayed.
    let [old] = &report.consumers[..] else {
        panic!("one consumer with rows: {:?}", report.consumers);
    };
    assert_eq!((old.consumer.as_str(), old.deleted), ("old_v1", OLD as u64));
    let cutoff = old.cutoff.expect("old_v1 has a clock");
    let left = client
        .query_one(
            "SELECT count(*) FILTER (WHERE applied_at >= $1), count(*) FILTER (WHERE applied_at < $1) \
             FROM projector.inbox WHERE consumer = 'old_v1'",
            &[&cutoff],
        )
        .await
        .expect("count");
    assert_eq!((left.get::<_, i64>(0), left.get::<_, i64>(1)), (RECENT, 0));
    // The clock is its commit, made after the load.
    assert!(cutoff >= now - chrono::Duration::days(7));
    // The view applied beside it is exact, and its inbox rows are all there.
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
    let inbox: i64 = client
        .query_one(
            "SELECT count(*) FROM projector.inbox WHERE consumer = 'trail_v1'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(inbox, events.len() as i64);
}

#[test]
fn a_window_shorter_than_the_minimum_is_refused_in_one_line() {
    let options = PruneOptions {
        older_than: DAY,
        min_window: 7 * DAY,
        ..PruneOptions::default()
    };
    let e = check_window(&options).expect_err("refused");
    assert!(e.to_string().contains("minimum window is 7d"), "{e}");
    let (status, stderr) = run_to_end(&["inbox", "prune", "--older-than", "1d"]);
    assert!(!status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("refusing to prune the inbox younger than 1d"),
        "{stderr}"
    );
    // The configured minimum decides: 30d refuses a 10d window.
    let (status, stderr) = run_to_end(&[
        "inbox",
        "prune",
        "--older-than",
        "10d",
        "--min-window",
        "30d",
    ]);
    assert!(
        !status.success() && stderr.contains("the minimum window is 30d"),
        "{stderr}"
    );
}

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

fn code(name: &str, version: i32) -> Arc<dyn Projection> {
    views().code_for(name, version).expect("the view's code")
}

/// `projector <args> --database-url URL`, run off the async runtime's threads.
async fn projector(args: &[&str], url: &str) -> Output {
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.extend(["--database-url".to_owned(), url.to_owned()]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_output(&args)
    })
    .await
    .expect("the command's thread")
}

fn succeeded(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} must succeed, got {}; stdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

async fn inbox_rows(db: &TestDb, consumer: &str) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT count(*) FROM projector.inbox WHERE consumer = $1",
            &[&consumer],
        )
        .await
        .expect("count")
        .get(0)
}

/// Moves everything `consumer` did `days` into the past: when it applied its events, when it
/// last committed, when its rebuild was last touched.
async fn age(db: &TestDb, consumer: &str, days: i32) {
    db.client()
        .await
        .batch_execute(&format!(
            "UPDATE projector.inbox SET applied_at = applied_at - interval '{days} days' \
                 WHERE consumer = '{consumer}'; \
             UPDATE projector.offsets SET updated_at = updated_at - interval '{days} days' \
                 WHERE consumer = '{consumer}'; \
             UPDATE projector.rebuilds SET updated_at = updated_at - interval '{days} days', \
                 started_at = started_at - interval '{days} days' WHERE consumer = '{consumer}'"
        ))
        .await
        .expect("age");
}

/// What a rebuild says, so that a test can wait for "paused" instead of sleeping.
#[derive(Default)]
struct Said(Mutex<Vec<String>>);

impl projector_rebuild::Progress for Said {
    fn message(&self, line: &str) {
        self.0.lock().expect("lines").push(line.to_owned());
    }
    fn status(&self, _: &Status) {}
}

impl Said {
    fn count(&self, needle: &str) -> usize {
        self.0
            .lock()
            .expect("lines")
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
}

/// The sequence: an eod rebuild paused, events republished, an `inbox prune`, a
/// resume. eod is order-independent: only its inbox stands between a copy and a second
/// application, so a prune that took the paused version's rows would count every copy twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_rebuild_keeps_its_inbox_through_a_prune_and_applies_no_copy_twice() {
    const TOPIC: &str = "fills";
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let db = TestDb::new(&views()).await;
    let events = fills(20, 10);
    let total = events.len() as i64;
    publish(&bootstrap, TOPIC, &events).await;

    let said = Arc::new(Said::default());
    let shutdown = CancellationToken::new();
    let rebuild = {
        let (url, kafka, said, shutdown) = (
            db.url().to_owned(),
            config(&bootstrap, TOPIC),
            said.clone(),
            shutdown.clone(),
        );
        let mut options = Options::new("eod");
        options.source = Source::Earliest;
        options.cutover = Cutover::Manual;
        options.tick = Duration::from_millis(100);
        tokio::spawn(async move {
            projector_rebuild::rebuild(&views(), &url, kafka, &options, &*said, shutdown).await
        })
    };
    let client = db.client().await;
    eventually(
        "eod v2 to consume the log",
        || async { offsets(&client, "eod_v2").await.next.values().sum::<i64>() },
        |n| *n == total,
    )
    .await;
    let v2 = code("eod", 2);
    let built = dump(&client, &*v2).await;

    succeeded(
        "--pause",
        &projector(&["rebuild", "eod", "--pause"], db.url()).await,
    );
    eventually(
        "the tail to stop",
        || async { said.count("paused; resume with") },
        |n| *n > 0,
    )
    .await;
    // The copies: the first 60 events published again, at new offsets, while v2 is paused.
    publish(&bootstrap, TOPIC, &events[..60]).await;
    // Eight days go by for v2, which consumes nothing meanwhile.
    age(&db, "eod_v2", 8).await;

    let out = projector(
        &[
            "inbox",
            "prune",
            "--older-than",
            "7d",
            "--brokers",
            &bootstrap,
            "--topic",
            TOPIC,
        ],
        db.url(),
    )
    .await;
    succeeded("inbox prune", &out);
    // The mock cluster has no admin API: the configured minimum stands, and it says so.
    assert!(
        out.stderr
            .contains("the brokers did not report retention.ms of topic fills")
            && out.stderr.contains("the minimum window 7d stands"),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout
            .contains("eod_v2: kept: a rebuild of it is paused"),
        "{}",
        out.stdout
    );
    assert_eq!(
        inbox_rows(&db, "eod_v2").await,
        total,
        "the paused version's rows went: {}",
        out.stdout
    );

    succeeded(
        "--resume",
        &projector(&["rebuild", "eod", "--resume"], db.url()).await,
    );
    let o = eventually(
        "eod v2 to consume the copies",
        || async { offsets(&client, "eod_v2").await },
        |o| o.next.values().sum::<i64>() == total + 60,
    )
    .await;
    assert_eq!((o.applied, o.duplicates), (total, 60), "{o:?}");
    assert_eq!(dump(&client, &*v2).await, built, "a copy was applied twice");

    shutdown.cancel();
    let outcome = rebuild
        .await
        .expect("the rebuild task")
        .expect("the rebuild");
    assert_eq!(outcome, Outcome::Stopped { version: 2 });
}

/// Two consumers, both with rows applied ten days ago: portfolio has committed since (it is
/// running), eod stopped nine days ago. A prune with a seven-day window takes portfolio's
/// rows and keeps eod's, measured from its last commit; eod then resumes and meets copies
/// of its events, which its inbox still recognises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_consumer_keeps_its_rows_while_a_running_ones_are_pruned() {
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let events = fills(10, 5);
    let n = events.len() as i64;
    let mut log = Partition::from_events("fills", 0, &events);
    let eod = Applier::new(code("eod", 1), SourceOrdering::PerAccount).expect("eod");
    let portfolio =
        Applier::new(code("portfolio", 1), SourceOrdering::PerAccount).expect("portfolio");
    consume(&eod, &mut client, &log, 16).await;
    consume(&portfolio, &mut client, &log, 16).await;
    client
        .batch_execute(
            "UPDATE projector.inbox SET applied_at = now() - interval '10 days'; \
             UPDATE projector.offsets SET updated_at = now() - interval '9 days' \
                 WHERE consumer = 'eod_v1'",
        )
        .await
        .expect("age");
    let before = dump(&client, &*code("eod", 1)).await;

    let out = projector(&["inbox", "prune", "--older-than", "7d"], db.url()).await;
    succeeded("inbox prune", &out);
    assert!(
        out.stderr.contains("no brokers") && out.stderr.lines().count() == 1,
        "{}",
        out.stderr
    );
    assert!(
        out.stdout
            .contains("portfolio_v1: 50 row(s) applied before")
            && out.stdout.contains("eod_v1: 0 row(s) applied before"),
        "{}",
        out.stdout
    );
    assert_eq!(inbox_rows(&db, "portfolio_v1").await, 0, "{}", out.stdout);
    assert_eq!(inbox_rows(&db, "eod_v1").await, n, "{}", out.stdout);

    // eod resumes: the log holds copies of its first 20 events, republished while it was
    // stopped.
    for e in &events[..20] {
        log.push_event(e);
    }
    consume(&eod, &mut client, &log, 16).await;
    let o = offsets(&client, "eod_v1").await;
    assert_eq!((o.applied, o.duplicates), (n, 20), "{o:?}");
    assert_eq!(dump(&client, &*code("eod", 1)).await, before);
}

/// Publishes each event with the time given (Unix milliseconds) as its Kafka timestamp, to
/// partition 0 in order, so that offsets are the events' indexes.
async fn publish_at(bootstrap: &str, topic: &str, messages: &[(EventSpec, i64)]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("producer");
    for (e, ms) in messages {
        let (key, payload) = (e.key(), e.payload());
        producer
            .send(
                FutureRecord::to(topic)
                    .partition(0)
                    .key(&key[..])
                    .payload(&payload[..])
                    .timestamp(*ms),
                Timeout::Never,
            )
            .await
            .map_err(|(e, _)| e)
            .expect("delivered");
    }
}

/// A service stopped for nine days and resumed: it has committed a minute ago, but it is
/// still reading the backlog of its stop, and copies the relay republished right after the
/// stop began lie ahead of it. Its clock is the time of the oldest message it has not
/// consumed, not its latest commit: the rows it applied before the stop stay until it has
/// read past those copies, and each copy is recognised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_catching_up_after_a_stop_keeps_the_rows_its_backlog_needs() {
    const TOPIC: &str = "fills";
    let broker = DevBroker::start(1, &[(TOPIC, 1)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let now = chrono::Utc::now();
    let stop = (now - chrono::Duration::days(9)).timestamp_millis();
    let minute = 60_000;
    // Before the stop: 20 events. During it: 5 more, then copies of the first 10.
    let events = fills(5, 5);
    let (before, during) = events.split_at(20);
    let mut log: Vec<(EventSpec, i64)> = Vec::new();
    for (i, e) in before.iter().enumerate() {
        log.push((e.clone(), stop - 60 * minute + i as i64));
    }
    for e in during {
        log.push((e.clone(), stop + minute));
    }
    for e in &before[..10] {
        log.push((e.clone(), stop + 2 * minute));
    }
    publish_at(&bootstrap, TOPIC, &log).await;
    let partition = Partition::from_events(TOPIC, 0, log.iter().map(|(e, _)| e));

    // The stop's side of the story: the first 20 applied nine days ago; then the 5 of its
    // stop, applied just now on resuming. The copies are next.
    let eod = Applier::new(code("eod", 1), SourceOrdering::PerAccount).expect("eod");
    eod.apply(&mut client, &partition.batch(0, 20))
        .await
        .expect("before the stop");
    age(&db, "eod_v1", 9).await;
    eod.apply(&mut client, &partition.batch(20, 5))
        .await
        .expect("on resuming");
    let built = dump(&client, &*code("eod", 1)).await;

    let out = projector(
        &[
            "inbox",
            "prune",
            "--older-than",
            "7d",
            "--brokers",
            &bootstrap,
            "--topic",
            TOPIC,
        ],
        db.url(),
    )
    .await;
    succeeded("inbox prune", &out);
    assert!(
        out.stdout.contains("eod_v1: 0 row(s) applied before")
            && out
                .stdout
                .contains("the oldest message it has not consumed, fills/0 offset 25"),
        "{}",
        out.stdout
    );
    assert_eq!(inbox_rows(&db, "eod_v1").await, 25, "{}", out.stdout);

    consume(&eod, &mut client, &partition, 16).await;
    let o = offsets(&client, "eod_v1").await;
    assert_eq!((o.applied, o.duplicates), (25, 10), "{o:?}");
    assert_eq!(
        dump(&client, &*code("eod", 1)).await,
        built,
        "a copy was applied twice"
    );
}

/// A rebuild paused while a prune runs: the guard is asked again before every batch, so the
/// batch under way is the last to take that version's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_paused_while_a_prune_runs_keeps_the_rest_of_its_rows() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let client = db.client().await;
    // trail v2 is being rebuilt; it applied 30,000 events ten days ago and commits still.
    client
        .batch_execute(
            "INSERT INTO projector.views (name, version, state) VALUES ('trail', 2, 'building'); \
             INSERT INTO projector.rebuilds (consumer, name, version, source, phase, cutover) \
                 VALUES ('trail_v2', 'trail', 2, 'earliest', 'tailing', 'manual'); \
             INSERT INTO projector.offsets (consumer, topic, partition, next_offset) \
                 VALUES ('trail_v2', 'fills', 0, 30000); \
             INSERT INTO projector.inbox (consumer, event_id, applied_at) \
                 SELECT 'trail_v2', 'e' || g, now() - interval '10 days' - g * interval '1 second' \
                 FROM generate_series(1, 30000) g",
        )
        .await
        .expect("a rebuild's rows");
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
    let pauser = db.client().await;
    let options = PruneOptions {
        older_than: 7 * DAY,
        min_window: 7 * DAY,
        batch: 5_000,
        pause: Duration::ZERO,
    };
    let mut paused = false;
    let report = prune_inbox(&client, &options, &clocks, |_| {
        if !paused {
            paused = true;
            // `projector rebuild trail --pause`, between the first batch and the second.
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    projector_rebuild::state::set_paused(&pauser, "trail", true)
                        .await
                        .expect("pause")
                })
            });
        }
    })
    .await
    .expect("prune");
    assert_eq!((report.batches, report.deleted), (1, 5_000), "{report:?}");
    assert_eq!(report.consumers[0].cutoff, None, "{report:?}");
    assert_eq!(inbox_rows(&db, "trail_v2").await, 25_000);
}
