//! Inbox retention by whole days: a day of the inbox (the events that occurred that UTC day)
//! goes once every consumer with rows in it has read the log a window past the day's end, on
//! its own clock, by detach and drop, while the apply path runs beside it; a paused rebuild,
//! a stopped service and a consumer still reading its backlog keep the days they need to
//! recognise a copy waiting for them in the log; a day written late lives a whole window past
//! the write; the inbox before V0009 goes in one piece when nobody needs it.
//!
//! Time is simulated: events carry an `occurred_at` days ago, and a consumer's clock is moved
//! back in SQL (`projector.offsets.updated_at`): a week of waiting is what the rows say, not
//! what the test spends.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, NaiveDate, Utc};
use futures::SinkExt;
use projector_devkit::devbroker::DevBroker;
use projector_engine::inbox::{self, Days};
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{consume, EventSpec, Partition, TestDb};
use projector_engine::{Applier, Projection, Registry, SourceOrdering};
use projector_ops::clock;
use projector_ops::prune::{check_window, prune_inbox, DayOutcome, LegacyOutcome, PruneOptions};
use projector_rebuild::{Cutover, Options, Outcome, Source, Status};
use tokio_util::sync::CancellationToken;

use crate::support::kafka::{config, publish};
use crate::support::process::{run_output, run_to_end, Output};
use crate::support::{eventually, fills, offsets, rows, trail_fold, Trail};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

const DAY: Duration = Duration::from_secs(86_400);

/// The events, each stamped as having occurred at `at` (the write side's time, which the
/// inbox is keyed and partitioned by).
fn occurred(mut events: Vec<EventSpec>, at: DateTime<Utc>) -> Vec<EventSpec> {
    for e in &mut events {
        e.occurred_at = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    }
    events
}

/// The server's clock.
async fn now(client: &deadpool_postgres::Client) -> DateTime<Utc> {
    client
        .query_one("SELECT now()", &[])
        .await
        .expect("now")
        .get(0)
}

/// The days the inbox has attached.
async fn attached(client: &deadpool_postgres::Client) -> BTreeSet<NaiveDate> {
    inbox::partitions(client)
        .await
        .expect("partitions")
        .into_iter()
        .filter(|p| p.attachment == inbox::Attachment::Attached)
        .map(|p| p.day)
        .collect()
}

/// Sixteen days of a retired version's rows, 4,000 a day, loaded with COPY (the load is not
/// what is measured), while a live view applies events of today on another connection the
/// whole time the prune runs. A seven-day window drops exactly the days that end a week or
/// more before the consumer's clock, whole, and nothing else; the live view is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_days_a_window_behind_every_clock_go_while_the_apply_path_runs() {
    const PER_DAY: i64 = 4_000;
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = now(&client).await;
    let today = inbox::day_of(now);
    let days: BTreeSet<NaiveDate> = (1..=16)
        .map(|d| today - chrono::Duration::days(d))
        .collect();
    Days::new()
        .make(&mut client, &days)
        .await
        .expect("the days");
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .expect("no timeout for the load");
    let sink = client
        .copy_in("COPY projector.inbox (consumer, occurred_at, event_id) FROM STDIN")
        .await
        .expect("copy");
    futures::pin_mut!(sink);
    let mut chunk = String::new();
    for (d, day) in days.iter().enumerate() {
        let start = inbox::bounds(*day).0;
        for i in 0..PER_DAY {
            let at = (start + chrono::Duration::seconds(i * 20)).to_rfc3339();
            chunk.push_str(&format!("old_v1\t{at}\te{d}-{i}\n"));
        }
        sink.send(Bytes::from(std::mem::take(&mut chunk)))
            .await
            .expect("copy chunk");
    }
    let loaded = sink.finish().await.expect("copy done");
    assert_eq!(loaded, PER_DAY as u64 * 16);
    client
        .batch_execute("RESET statement_timeout; ANALYZE projector.inbox")
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

    // The apply path beside retention: one batch of today's events after each day judged,
    // while the next day is detached and dropped.
    let events = occurred(fills(40, 50), now);
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
            if tick_rx.recv().await.is_some() {
                overlapped += 1;
            }
            let outcome = applier
                .apply(&mut client, &apply_log.batch(next, 100))
                .await
                .expect("apply beside the prune");
            next = outcome.next_offset;
        }
        overlapped
    });

    let options = PruneOptions {
        older_than: 7 * DAY,
        min_window: 7 * DAY,
    };
    let mut judged = Vec::new();
    let report = prune_inbox(&mut client, &options, &clocks, |d| {
        judged.push(d.clone());
        let _ = tick_tx.send(());
    })
    .await
    .expect("prune");
    drop(tick_tx);
    let overlapped = apply.await.expect("apply task");
    assert!(overlapped > 0, "the apply path ran while retention did");

    let [old] = &report.consumers[..] else {
        panic!("one consumer with rows: {:?}", report.consumers);
    };
    let cutoff = old.cutoff.expect("old_v1 has a clock");
    assert!(cutoff >= now - chrono::Duration::days(7), "{cutoff}");
    // Every day that has ended was judged, oldest first, and went exactly when its end lies
    // at or before the cutoff.
    assert_eq!(judged, report.days);
    assert_eq!(
        report.days.iter().map(|d| d.day).collect::<BTreeSet<_>>(),
        days
    );
    for d in &report.days {
        let due = inbox::bounds(d.day).1 <= cutoff;
        match &d.outcome {
            DayOutcome::Dropped { rows_estimate, .. } => {
                assert!(due, "{} dropped before its time", d.day);
                assert_eq!(*rows_estimate, PER_DAY, "{}", d.day);
            }
            DayOutcome::Kept(why) => {
                assert!(!due, "{} kept past its time: {why}", d.day);
                assert!(
                    why.contains("kept for old_v1") || why.contains("younger than the window"),
                    "{why}"
                );
            }
        }
    }
    let dropped = report.dropped().count() as i64;
    assert!((8..=9).contains(&dropped), "{report:?}");
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM projector.inbox WHERE consumer = 'old_v1'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, (16 - dropped) * PER_DAY);
    // Nothing left behind half-dropped, and today's day untouched.
    assert!(inbox::partitions(&client)
        .await
        .expect("partitions")
        .iter()
        .all(|p| p.attachment == inbox::Attachment::Attached));
    assert!(attached(&client).await.contains(&today));
    assert_eq!(report.legacy, LegacyOutcome::Empty);
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

/// Moves `consumer`'s clock `days` into the past: when it last committed, when its rebuild
/// was last touched.
async fn age(db: &TestDb, consumer: &str, days: i32) {
    db.client()
        .await
        .batch_execute(&format!(
            "UPDATE projector.offsets SET updated_at = updated_at - interval '{days} days' \
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

/// Two days of events, eleven and ten days old. portfolio has read both and committed since
/// (it is running); eod read only the later day and stopped nine days ago. With a seven-day
/// window the earlier day, portfolio's alone, goes; the later one stays for eod, measured
/// from its last commit, although portfolio has rows in it too. eod then resumes and meets
/// copies of its events, which its inbox still recognises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_consumer_keeps_the_days_it_has_rows_in() {
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let now = now(&client).await;
    let earlier = occurred(fills(10, 2), now - chrono::Duration::days(11));
    let later: Vec<EventSpec> = occurred(fills(10, 5), now - chrono::Duration::days(10))
        .into_iter()
        .filter(|e| e.seq > 2)
        .collect();
    let n = later.len() as i64;
    let eod = Applier::new(code("eod", 1), SourceOrdering::PerAccount).expect("eod");
    let portfolio =
        Applier::new(code("portfolio", 1), SourceOrdering::PerAccount).expect("portfolio");
    let both: Vec<EventSpec> = earlier.iter().chain(&later).cloned().collect();
    consume(
        &portfolio,
        &mut client,
        &Partition::from_events("fills", 0, &both),
        16,
    )
    .await;
    let mut log = Partition::from_events("fills", 0, &later);
    consume(&eod, &mut client, &log, 16).await;
    // Both applied their events the day they occurred (their writes into those days were
    // not late), and eod stopped nine days ago.
    client
        .batch_execute(
            "UPDATE projector.offsets SET updated_at = now() - interval '9 days' \
                 WHERE consumer = 'eod_v1'; \
             UPDATE projector.inbox_late_writes SET written_at = written_at - interval '11 days'",
        )
        .await
        .expect("age");
    let before = dump(&client, &*code("eod", 1)).await;

    let out = projector(&["inbox", "prune", "--older-than", "7d"], db.url()).await;
    succeeded("inbox prune", &out);
    assert!(
        out.stderr.contains("no brokers") && out.stderr.contains("kept for eod_v1"),
        "{}",
        out.stderr
    );
    let (day_earlier, day_later) = (
        inbox::day_of(now - chrono::Duration::days(11)),
        inbox::day_of(now - chrono::Duration::days(10)),
    );
    assert!(
        out.stdout
            .contains("dropped 1 day(s) of the inbox older than 7d")
            && out.stdout.contains(&day_earlier.to_string())
            && out.stdout.contains("portfolio_v1: its rows before")
            && out.stdout.contains("eod_v1: its rows before"),
        "{}",
        out.stdout
    );
    let days = attached(&client).await;
    assert!(
        !days.contains(&day_earlier) && days.contains(&day_later),
        "{days:?}"
    );
    assert_eq!(inbox_rows(&db, "portfolio_v1").await, n, "{}", out.stdout);
    assert_eq!(inbox_rows(&db, "eod_v1").await, n, "{}", out.stdout);

    // eod resumes: the log holds copies of its first 20 events, republished while it was
    // stopped.
    for e in &later[..20] {
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
    // Before the stop: 20 events. During it: 5 more, then copies of the first 10. Each
    // occurred when it was published (the copies: when their originals were).
    let events = fills(5, 5);
    let (before, during) = events.split_at(20);
    let at = |ms: i64| DateTime::from_timestamp_millis(ms).expect("a time");
    let mut log: Vec<(EventSpec, i64)> = Vec::new();
    for (i, e) in before.iter().enumerate() {
        let ms = stop - 60 * minute + i as i64;
        log.push((occurred(vec![e.clone()], at(ms)).remove(0), ms));
    }
    for e in during {
        log.push((
            occurred(vec![e.clone()], at(stop + minute)).remove(0),
            stop + minute,
        ));
    }
    for i in 0..10 {
        log.push((log[i].0.clone(), stop + 2 * minute));
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
    db.client()
        .await
        .batch_execute(
            "UPDATE projector.inbox_late_writes SET written_at = written_at - interval '9 days'",
        )
        .await
        .expect("age the writes");
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
        out.stdout
            .contains("the oldest message it has not consumed, fills/0 offset 25")
            && out.stdout.contains("dropped 0 day(s)")
            && out.stderr.contains("kept for eod_v1"),
        "{}\n{}",
        out.stdout,
        out.stderr
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

/// A rebuild paused while a prune runs: the pause is read again before every day, so the
/// day under way is the last to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_paused_while_a_prune_runs_keeps_the_rest_of_its_days() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = now(&client).await;
    let days: BTreeSet<NaiveDate> = (10..=12)
        .map(|d| inbox::day_of(now - chrono::Duration::days(d)))
        .collect();
    Days::new()
        .make(&mut client, &days)
        .await
        .expect("the days");
    // trail v2 is being rebuilt; it applied 3,000 events a day of three old days, and
    // commits still.
    client
        .batch_execute(
            "INSERT INTO projector.views (name, version, state) VALUES ('trail', 2, 'building'); \
             INSERT INTO projector.rebuilds (consumer, name, version, source, phase, cutover) \
                 VALUES ('trail_v2', 'trail', 2, 'earliest', 'tailing', 'manual'); \
             INSERT INTO projector.offsets (consumer, topic, partition, next_offset) \
                 VALUES ('trail_v2', 'fills', 0, 30000); \
             INSERT INTO projector.inbox (consumer, occurred_at, event_id) \
                 SELECT 'trail_v2', date_trunc('day', now() - d * interval '1 day') + g * interval '20 seconds', \
                        'e' || d || '-' || g \
                 FROM generate_series(10, 12) d, generate_series(1, 3000) g",
        )
        .await
        .expect("a rebuild's rows");
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
    let pauser = db.client().await;
    let options = PruneOptions {
        older_than: 7 * DAY,
        min_window: 7 * DAY,
    };
    let mut paused = false;
    let report = prune_inbox(&mut client, &options, &clocks, |_| {
        if !paused {
            paused = true;
            // `projector rebuild trail --pause`, between the first day and the second.
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
    let outcomes: Vec<(NaiveDate, bool)> = report
        .days
        .iter()
        .filter(|d| days.contains(&d.day))
        .map(|d| (d.day, matches!(d.outcome, DayOutcome::Dropped { .. })))
        .collect();
    let ordered: Vec<NaiveDate> = days.iter().copied().collect();
    assert_eq!(
        outcomes,
        vec![(ordered[0], true), (ordered[1], false), (ordered[2], false)],
        "{report:?}"
    );
    assert!(report.days[1..3].iter().all(|d| matches!(
        &d.outcome,
        DayOutcome::Kept(why) if why.contains("a rebuild of it is paused")
    )));
    assert_eq!(inbox_rows(&db, "trail_v2").await, 6_000);
}

/// A day written after it ended (an event that arrives late, a rebuild replaying old days)
/// lives a whole window past that write, whatever the day's own age: a copy of the late event
/// that follows it is still recognised. The batch that wrote it made the day itself, and
/// counted its events as outside the retained window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_written_late_lives_a_window_past_the_write() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let now = now(&client).await;
    // Twenty days old: no day kept reaches back that far.
    let old = now - chrono::Duration::days(20);
    let day = inbox::day_of(old);
    assert!(!attached(&client).await.contains(&day));
    let events = occurred(fills(5, 4), old);
    let applier =
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier");
    let outcome = applier
        .apply(
            &mut client,
            &Partition::from_events("fills", 0, &events).batch(0, 100),
        )
        .await
        .expect("late events apply");
    assert_eq!(outcome.counts.applied, 20);
    assert_eq!(outcome.counts.outside_window, 20);
    assert!(attached(&client).await.contains(&day));
    let outside: i64 = client
        .query_one(
            "SELECT outside_window FROM projector.offsets WHERE consumer = 'trail_v1'",
            &[],
        )
        .await
        .expect("the counter")
        .get(0);
    assert_eq!(outside, 20);

    let options = PruneOptions {
        older_than: 7 * DAY,
        min_window: 7 * DAY,
    };
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
    let report = prune_inbox(&mut client, &options, &clocks, |_| {})
        .await
        .expect("prune");
    let judged = report.days.iter().find(|d| d.day == day).expect("judged");
    assert!(
        matches!(&judged.outcome, DayOutcome::Kept(why) if why.contains("kept for trail_v1")),
        "{judged:?}"
    );
    assert_eq!(inbox_rows(&db, "trail_v1").await, 20);

    // Eight days after the write (its consumer's clock with it), the day goes.
    client
        .batch_execute(
            "UPDATE projector.inbox_late_writes SET written_at = written_at - interval '8 days'",
        )
        .await
        .expect("age the write");
    let report = prune_inbox(&mut client, &options, &clocks, |_| {})
        .await
        .expect("prune");
    let judged = report.days.iter().find(|d| d.day == day).expect("judged");
    assert!(
        matches!(judged.outcome, DayOutcome::Dropped { .. }),
        "{judged:?}"
    );
    assert!(!attached(&client).await.contains(&day));
    let late: i64 = client
        .query_one("SELECT count(*) FROM projector.inbox_late_writes", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(late, 0, "a dropped day's late writes are forgotten");
}

/// The inbox before V0009 (keyed by event id alone) stays whole while one consumer with rows
/// there still needs them, and is emptied in one statement once none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_before_the_move_is_emptied_once_no_clock_needs_it() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    // Rows of two consumers as a database migrated from before V0009 holds them: applied
    // eight days ago. (The table takes no new rows: its constraint is set aside to load
    // them.)
    client
        .batch_execute(
            "ALTER TABLE projector.inbox_legacy DROP CONSTRAINT inbox_legacy_frozen; \
             INSERT INTO projector.inbox_legacy (consumer, event_id, applied_at) \
                 SELECT c, 'e' || g, now() - interval '8 days' \
                 FROM unnest(ARRAY['a_v1', 'b_v1']) c, generate_series(1, 500) g; \
             ALTER TABLE projector.inbox_legacy ADD CONSTRAINT inbox_legacy_frozen CHECK (false) NOT VALID; \
             INSERT INTO projector.offsets (consumer, topic, partition, next_offset, updated_at) \
                 VALUES ('a_v1', 'fills', 0, 10, now()), ('b_v1', 'fills', 0, 10, now() - interval '2 days')",
        )
        .await
        .expect("rows from before the move");
    let options = PruneOptions {
        older_than: 7 * DAY,
        min_window: 7 * DAY,
    };
    // b_v1 stopped two days ago: its clock is six days past its rows, one short of a window.
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
    let report = prune_inbox(&mut client, &options, &clocks, |_| {})
        .await
        .expect("prune");
    assert!(
        matches!(&report.legacy, LegacyOutcome::Kept(why) if why.contains("kept for b_v1")),
        "{:?}",
        report.legacy
    );
    // b_v1 commits again.
    client
        .batch_execute("UPDATE projector.offsets SET updated_at = now()")
        .await
        .expect("commit");
    let (clocks, _) = clock::clocks(&client, None).await.expect("clocks");
    let report = prune_inbox(&mut client, &options, &clocks, |_| {})
        .await
        .expect("prune");
    assert!(
        matches!(report.legacy, LegacyOutcome::Emptied(_)),
        "{:?}",
        report.legacy
    );
    let left: i64 = client
        .query_one("SELECT count(*) FROM projector.inbox_legacy", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0);
    let report = prune_inbox(&mut client, &options, &clocks, |_| {})
        .await
        .expect("prune");
    assert_eq!(report.legacy, LegacyOutcome::Empty);
}
