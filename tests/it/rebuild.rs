//! Rebuilding a view while live (`projector rebuild`, `verify`, `cutover`, `retire`) against
//! real PostgreSQL and librdkafka's mock cluster: the library in-process where a test has to
//! watch the rebuild closely, the binary where a process must die or a command line must
//! answer. Every test rebuilds `portfolio` (order-dependent: a skipped, repeated or
//! reordered event changes its rows) into v2, `--from earliest` or from the snapshot of the
//! write side (`projector_devkit::writeside`: its clients, ledger and outbox relay, in the
//! test's database), and compares it with the fold of the distinct events, or with the write
//! side's positions where the log lost an event.
//!
//! Not here: anything that needs offsets by time, which the mock cluster does not answer
//! (every timestamp gets the end of the log): a snapshot's tail starts where the log ended
//! just before the snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::broker::{Broker, Kafka};
use crate::support::kafka::{ends_of, publish, publish_raw, Raw};
use crate::support::process::{run_output, wait_until, Output, Projector};
use crate::support::{eventually, fills, offsets, rows};
use projector_devkit::writeside::{LoadConfig, Order, RelayConfig, RelayExit, Side, WriteSide};
use projector_engine::kafka::source::{run_view, NoObserver, Observer};
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{cash, consume, fill, EventSpec, Lcg, Partition, TestDb};
use projector_engine::{Applier, Projection, Registry, SourceOrdering};
use projector_rebuild::tail::Silent;
use projector_rebuild::{
    cutover, verify, Cutover, CutoverReport, Options, Outcome, RebuildError, Source,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(120);
const TOPIC: &str = "fills";
/// What the child processes log: enough to explain a failure.
const LOG: &str = "projector_engine::kafka=info,warn";

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

fn portfolio(version: i32) -> Arc<dyn Projection> {
    views()
        .code_for("portfolio", version)
        .expect("portfolio's code at any version")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A rebuild of portfolio from the earliest offsets that looks at the registry often.
fn earliest(cutover: Cutover) -> Options {
    let mut o = Options::new("portfolio");
    o.source = Source::Earliest;
    o.cutover = cutover;
    o.tick = Duration::from_millis(100);
    o.batch_messages = 500;
    o
}

/// A rebuild of portfolio from the write side's snapshot that looks at the registry often.
fn snapshot(cutover: Cutover) -> Options {
    let mut o = earliest(cutover);
    o.source = Source::Snapshot;
    o
}

async fn rebuild(
    db: &TestDb,
    kafka: &Kafka,
    topic: &str,
    options: &Options,
    shutdown: CancellationToken,
) -> Result<Outcome, RebuildError> {
    projector_rebuild::rebuild(
        &views(),
        db.url(),
        kafka.config(topic),
        options,
        &Silent,
        shutdown,
    )
    .await
}

/// Rebuilds to the end, which must be a cutover of portfolio from v1 to v2.
async fn rebuild_and_cut_over(db: &TestDb, kafka: &Kafka, topic: &str) {
    let outcome = tokio::time::timeout(
        LIMIT,
        rebuild(
            db,
            kafka,
            topic,
            &earliest(Cutover::Auto),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("the rebuild to cut over in time")
    .expect("the rebuild");
    let Outcome::CutOver(report) = outcome else {
        panic!("expected a cutover, got {outcome:?}");
    };
    assert_eq!((report.old, report.new), (Some(1), 2));
}

/// The portfolio tables after the distinct events were applied once each, in the order
/// given, in a database of their own.
async fn reference(events: &[EventSpec]) -> Vec<Vec<String>> {
    fold([&Partition::from_events("reference", 0, events)]).await
}

/// The portfolio tables after the partitions' distinct events were applied once each, in
/// each partition's order, in a database of their own.
async fn fold<'a>(partitions: impl IntoIterator<Item = &'a Partition>) -> Vec<Vec<String>> {
    let db = TestDb::new(&views()).await;
    let applier = Applier::new(portfolio(1), SourceOrdering::PerAccount).expect("applier");
    let mut client = db.client().await;
    for p in partitions {
        consume(&applier, &mut client, p, 500).await;
    }
    dump(&client, &*portfolio(1)).await
}

async fn version_rows(db: &TestDb, version: i32) -> Vec<Vec<String>> {
    dump(&db.client().await, &*portfolio(version)).await
}

/// Messages a view version has consumed: its next offsets summed (the topics start at 0).
async fn consumed(db: &TestDb, consumer: &str) -> i64 {
    offsets(&db.client().await, consumer)
        .await
        .next
        .values()
        .sum()
}

/// `projector.views` for portfolio: (version, state, dropped).
async fn states(db: &TestDb) -> Vec<(i32, String, bool)> {
    db.client()
        .await
        .query(
            "SELECT version, state, dropped_at IS NOT NULL FROM projector.views \
             WHERE name = 'portfolio' ORDER BY version",
            &[],
        )
        .await
        .expect("views")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn state(version: i32, state: &str, dropped: bool) -> (i32, String, bool) {
    (version, state.to_owned(), dropped)
}

/// The phase of the rebuild into portfolio v2, if one is recorded.
async fn phase(db: &TestDb) -> Option<String> {
    db.client()
        .await
        .query_opt(
            "SELECT phase FROM projector.rebuilds WHERE consumer = 'portfolio_v2'",
            &[],
        )
        .await
        .expect("rebuilds")
        .map(|r| r.get(0))
}

async fn table_exists(db: &TestDb, table: &str) -> bool {
    db.client()
        .await
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .expect("to_regclass")
        .get(0)
}

/// Rows the engine keeps under a consumer name, per table: after a cancel or a drop, all 0.
async fn owned(db: &TestDb, consumer: &str) -> BTreeMap<&'static str, i64> {
    let client = db.client().await;
    let mut out = BTreeMap::new();
    for table in [
        "inbox",
        "offsets",
        "account_progress",
        "waiting_events",
        "parked_accounts",
        "dead_letters",
        "rebuilds",
    ] {
        let n: i64 = client
            .query_one(
                &format!("SELECT count(*) FROM projector.{table} WHERE consumer = $1"),
                &[&consumer],
            )
            .await
            .expect("count")
            .get(0);
        out.insert(table, n);
    }
    out
}

fn nothing_owned() -> BTreeMap<&'static str, i64> {
    [
        "inbox",
        "offsets",
        "account_progress",
        "waiting_events",
        "parked_accounts",
        "dead_letters",
        "rebuilds",
    ]
    .into_iter()
    .map(|t| (t, 0))
    .collect()
}

/// `projector <command> [view] ... --database-url URL` with the Kafka flags when `kafka`
/// is given (short session timeouts, so a killed member leaves the group in seconds).
fn cli(args: &[&str], url: &str, kafka: Option<&Kafka>) -> Vec<String> {
    let mut out: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
    out.extend(["--database-url".to_owned(), url.to_owned()]);
    if let Some(kafka) = kafka {
        out.extend(kafka.cli_flags(&kafka.topic(TOPIC)));
    }
    out
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

/// A refusal: exit 1, and one error line, the last on standard error, that says `needle`
/// (a rebuild may say what it was doing before it).
fn refused(what: &str, out: &Output, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what} must be refused; stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    let lines = out.error_lines();
    let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        errors.len(),
        1,
        "{what}: one error line, got:\n{}",
        out.stderr
    );
    assert_eq!(
        lines.last(),
        errors.first().copied(),
        "{what}: the error comes last:\n{}",
        out.stderr
    );
    assert!(
        errors[0].contains(needle),
        "{what}: expected {needle:?} in {:?}",
        errors[0]
    );
}

// --- 1. A live rebuild -----------------------------------------------------------------------

/// The supervisor's commits, in the order they happened, by consumer name. The rebuild's
/// own tail reports to nobody, so a `portfolio_v2` here was committed by the supervisor.
#[derive(Default)]
struct Commits(Mutex<Vec<String>>);

impl Commits {
    fn log(&self) -> Vec<String> {
        self.0.lock().expect("lock").clone()
    }
}

impl Observer for Commits {
    fn committed(&self, consumer: &str, _partition: i32, _next_offset: i64) {
        self.0.lock().expect("lock").push(consumer.to_owned());
    }
}

/// What a reader of the stable name saw.
#[derive(Default)]
struct Reads {
    queries: AtomicU64,
    empty: AtomicU64,
    errors: Mutex<Vec<String>>,
}

/// Queries the stable name `portfolio` over and over until `stop`, as dashboards would: by
/// text, and through a statement prepared before the cutover (PostgreSQL plans it again
/// when the name is replaced).
async fn read_stable_name(url: String, reads: Arc<Reads>, stop: CancellationToken) {
    let pool = projector_engine::db::pool(&url, 1).expect("pool");
    let client = pool.get().await.expect("the reader's connection");
    let sql = "SELECT count(*) FROM portfolio";
    let prepared = client.prepare(sql).await.expect("prepare");
    let mut turn = 0u64;
    while !stop.is_cancelled() {
        turn += 1;
        let result = if turn % 2 == 0 {
            client.query_one(sql, &[]).await
        } else {
            client.query_one(&prepared, &[]).await
        };
        match result {
            Ok(row) => {
                if row.get::<_, i64>(0) == 0 {
                    reads.empty.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e) => {
                let text = match e.as_db_error() {
                    Some(db) => format!("{} ({})", db.message(), db.code().code()),
                    None => e.to_string(),
                };
                reads.errors.lock().expect("lock").push(text);
            }
        }
        reads.queries.fetch_add(1, Ordering::SeqCst);
        // A pace, not a wait: a reader that never pauses would take one of the two cores.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Publishes `events` in chunks at a steady pace until `stop` (or the events run out).
async fn stream(kafka: Kafka, events: Vec<EventSpec>, stop: CancellationToken) {
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    for chunk in events.chunks(60) {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = pace.tick() => {}
        }
        publish(&kafka, &kafka.topic(TOPIC), chunk).await;
    }
}

/// Where a live rebuild's events come from.
enum Feed {
    /// Generated fills published straight to the topic: 6,000 of them before the rebuild,
    /// the rest at 600 a second during it.
    Fills(Vec<EventSpec>),
    /// The write side's clients and outbox relay: its `positions` and `account_seq`, which a
    /// rebuild `--from snapshot` reads, are the state of what it published (and of what it
    /// committed and has not published yet). During the rebuild its relay crashes now and
    /// then between publishing and marking, so some events land twice.
    WriteSide(WriteSide),
}

impl Feed {
    async fn write_side(db: &TestDb) -> Self {
        let pool = projector_engine::db::pool(db.url(), 10).expect("pool");
        Self::WriteSide(WriteSide::new(pool).await.expect("write side"))
    }

    /// Clients of 20 accounts (busts, cash and retries included), at `rate` requests a
    /// second or as fast as they go.
    fn load(rate: Option<u32>, max_requests: Option<u64>, seed: u64) -> LoadConfig {
        LoadConfig {
            rate,
            max_requests,
            seed,
            clients: 4,
            ..LoadConfig::new(20)
        }
    }

    /// The relay, publishing until `drain` once the outbox is empty; `crash_percent` of its
    /// batches are published again at new offsets (a crash between publishing and marking).
    fn relay(
        write_side: &WriteSide,
        kafka: &Kafka,
        crash_percent: u8,
        drain: CancellationToken,
    ) -> JoinHandle<RelayExit> {
        let relay = write_side.relay(RelayConfig {
            batch_size: 50,
            crash_percent,
            seed: 7,
            properties: crate::support::broker::producer_properties(),
            ..RelayConfig::new(kafka.bootstrap_servers(), kafka.topic(TOPIC))
        });
        tokio::spawn(async move {
            relay
                .run(drain, CancellationToken::new())
                .await
                .expect("the relay")
        })
    }

    /// Publishes the events that are there before the rebuild: all in the topic on return.
    async fn backlog(&self, kafka: &Kafka) {
        match self {
            Self::Fills(events) => {
                publish(kafka, &kafka.topic(TOPIC), &events[..6_000]).await;
            }
            Self::WriteSide(write_side) => {
                let drain = CancellationToken::new();
                let relay = Self::relay(write_side, kafka, 0, drain.clone());
                write_side
                    .run_load(&Self::load(None, Some(600), 11), CancellationToken::new())
                    .await
                    .expect("the clients");
                drain.cancel();
                assert_eq!(relay.await.expect("the relay"), RelayExit::Drained);
            }
        }
    }

    /// Publishes at a steady pace until `stop`; everything committed is in the topic once
    /// the task has ended.
    fn stream(&self, kafka: Kafka, stop: CancellationToken) -> JoinHandle<()> {
        match self {
            Self::Fills(events) => tokio::spawn(stream(kafka, events[6_000..].to_vec(), stop)),
            Self::WriteSide(write_side) => {
                let write_side = write_side.clone();
                tokio::spawn(async move {
                    let drain = CancellationToken::new();
                    let relay = Self::relay(&write_side, &kafka, 10, drain.clone());
                    write_side
                        .run_load(&Self::load(Some(300), None, 12), stop)
                        .await
                        .expect("the clients");
                    drain.cancel();
                    assert_eq!(relay.await.expect("the relay"), RelayExit::Drained);
                })
            }
        }
    }
}

/// Messages in the topic: the sum of its partitions' ends (it starts at 0).
async fn topic_size(kafka: &Kafka) -> i64 {
    let config = kafka.config(&kafka.topic(TOPIC));
    tokio::task::spawn_blocking(move || -> Result<_, projector_rebuild::RebuildError> {
        Ok(projector_rebuild::log::connect(&config)?.extents()?)
    })
    .await
    .expect("the log client")
    .expect("the topic's extents")
    .iter()
    .map(|e| e.high)
    .sum()
}

/// The fold of every distinct message in the topic, each partition in its order.
async fn topic_reference(kafka: &Kafka) -> Vec<Vec<String>> {
    let kafka = kafka.to_owned();
    let messages =
        tokio::task::spawn_blocking(move || kafka.read_topic(&kafka.topic(TOPIC), LIMIT))
            .await
            .expect("the reader")
            .expect("the topic read back");
    let mut partitions: BTreeMap<i32, Partition> = BTreeMap::new();
    for m in messages {
        partitions
            .entry(m.partition)
            .or_insert_with(|| Partition::new("reference", m.partition))
            .push_raw(m.key, m.payload);
    }
    fold(partitions.values()).await
}

/// (v1 consumed, v2 consumed, v2's state), sampled until `stop`.
type Sample = (i64, i64, String);

async fn sample(db: &TestDb) -> Sample {
    let r = db
        .client()
        .await
        .query_one(
            "SELECT (SELECT coalesce(sum(next_offset), 0)::bigint FROM projector.offsets WHERE consumer = 'portfolio_v1'), \
                    (SELECT coalesce(sum(next_offset), 0)::bigint FROM projector.offsets WHERE consumer = 'portfolio_v2'), \
                    coalesce((SELECT state FROM projector.views WHERE name = 'portfolio' AND version = 2), 'none')",
            &[],
        )
        .await
        .expect("sample");
    (r.get(0), r.get(1), r.get(2))
}

/// The distinct offsets of v1 and of v2 the monitor saw while v2 was being built (from
/// its first commit, or its seeding, on).
fn while_building(samples: &Mutex<Vec<Sample>>) -> (BTreeSet<i64>, BTreeSet<i64>) {
    samples
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, v2, state)| state == "building" && *v2 > 0)
        .map(|(v1, v2, _)| (*v1, *v2))
        .unzip()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_rebuild_cuts_over_while_events_flow_and_readers_never_see_a_hole() {
    a_live_rebuild(Source::Earliest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_rebuild_from_a_snapshot_cuts_over_while_events_flow_and_readers_never_see_a_hole() {
    a_live_rebuild(Source::Snapshot).await;
}

/// v1 is live and events flow at a steady pace while v2 is built from `source` and cut over;
/// a reader polls the stable name throughout. From earliest, with the automatic cutover;
/// from the write side's snapshot, cut over by hand once v2 tails the stream (its tail
/// starts at the log's end, so its backlog is too small to watch v1 move meanwhile).
async fn a_live_rebuild(source: Source) {
    let broker = Broker::start(&[(TOPIC, 3)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = Arc::new(TestDb::new(&registry).await);
    let feed = match source {
        Source::Earliest => Feed::Fills(fills(60, 600)),
        Source::Snapshot => Feed::write_side(&db).await,
    };
    feed.backlog(&kafka).await;
    let backlog = topic_size(&kafka).await;

    // v1 is live, run by the supervisor as `projector run` runs it.
    let commits = Arc::new(Commits::default());
    let stop_live = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        db.pool().clone(),
        kafka.config(&kafka.topic(TOPIC)),
        commits.clone(),
        stop_live.clone(),
        LiveOptions {
            names: vec!["portfolio".to_owned()],
            refresh: Duration::from_millis(100),
            ..LiveOptions::default()
        },
    ));
    eventually(
        "v1 to apply the backlog",
        || consumed(&db, "portfolio_v1"),
        |n| *n >= backlog,
    )
    .await;

    let reads = Arc::new(Reads::default());
    let stop_reader = CancellationToken::new();
    let reader = tokio::spawn(read_stable_name(
        db.url().to_owned(),
        reads.clone(),
        stop_reader.clone(),
    ));
    let stop_stream = CancellationToken::new();
    let streamer = feed.stream(kafka.clone(), stop_stream.clone());
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let stop_monitor = CancellationToken::new();
    let monitor = {
        let (db, samples, stop) = (db.clone(), samples.clone(), stop_monitor.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let s = sample(&db).await;
                samples.lock().expect("lock").push(s);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let report = match source {
        Source::Earliest => {
            let mut options = earliest(Cutover::Auto);
            // Lag is measured while 600 events a second arrive.
            options.cutover_lag = 300;
            // Within a budget, as on a production system: the backlog alone takes at least
            // two seconds, long enough to see v1 commit meanwhile however fast this machine is.
            options.max_rate = Some(3_000);
            let outcome = tokio::time::timeout(
                LIMIT,
                rebuild(
                    &db,
                    &kafka,
                    &kafka.topic(TOPIC),
                    &options,
                    CancellationToken::new(),
                ),
            )
            .await
            .expect("the rebuild to cut over in time")
            .expect("the rebuild");
            let Outcome::CutOver(report) = outcome else {
                panic!("expected a cutover, got {outcome:?}");
            };
            report
        }
        Source::Snapshot => {
            let rebuilding = {
                let (db, kafka) = (db.clone(), kafka.clone());
                let options = snapshot(Cutover::Manual);
                tokio::spawn(async move {
                    rebuild(
                        &db,
                        &kafka,
                        &kafka.topic(TOPIC),
                        &options,
                        CancellationToken::new(),
                    )
                    .await
                })
            };
            let samples_ref = &samples;
            eventually(
                "v2 to tail the stream while v1 keeps committing",
                || std::future::ready(while_building(samples_ref)),
                |(v1, v2)| v1.len() >= 3 && v2.len() >= 2,
            )
            .await;
            let report = cutover::cutover(&mut db.client().await, &registry, "portfolio", 2, None)
                .await
                .expect("the cutover");
            let outcome = tokio::time::timeout(LIMIT, rebuilding)
                .await
                .expect("the rebuild to stop in time")
                .expect("the rebuild's task")
                .expect("the rebuild");
            assert_eq!(outcome, Outcome::Stopped { version: 2 });
            report
        }
    };
    let reads_before = reads.queries.load(Ordering::SeqCst);
    assert_eq!((report.old, report.new), (Some(1), 2));
    let at_cutover = consumed(&db, "portfolio_v2").await;

    // The supervisor follows: v1 stops, v2 starts and consumes what arrives after the cutover.
    let commits_ref = &commits;
    eventually(
        "the supervisor to commit for v2",
        || std::future::ready(commits_ref.log().iter().any(|c| c == "portfolio_v2")),
        |started| *started,
    )
    .await;
    eventually(
        "v2 to advance past the cutover",
        || consumed(&db, "portfolio_v2"),
        |n| *n > at_cutover,
    )
    .await;
    // More of the stream, so that a v1 still running would have something to commit.
    let then = topic_size(&kafka).await;
    let kafka_ref = &kafka;
    eventually(
        "more events",
        || topic_size(kafka_ref),
        |n| *n >= then + 120,
    )
    .await;
    stop_stream.cancel();
    streamer.await.expect("the publisher");
    let total = topic_size(&kafka).await;
    eventually(
        "v2 to consume everything",
        || consumed(&db, "portfolio_v2"),
        |n| *n >= total,
    )
    .await;
    stop_reader.cancel();
    reader.await.expect("the reader");
    stop_monitor.cancel();
    monitor.await.expect("the monitor");
    stop_live.cancel();
    live.await.expect("the supervisor's task");

    // v2, and the stable name, equal the fold of everything published.
    let expected = topic_reference(&kafka).await;
    assert!(expected[0].len() > 20, "positions: {}", expected[0].len());
    assert_eq!(version_rows(&db, 2).await, expected);
    let client = db.client().await;
    assert_eq!(rows(&client, "portfolio").await, expected[0]);
    let v2 = offsets(&client, "portfolio_v2").await;
    assert_eq!(v2.dead_lettered + v2.waiting, 0, "{v2:?}");
    let parked = client
        .query_one(
            "SELECT count(*) FROM projector.parked_accounts WHERE consumer = 'portfolio_v2'",
            &[],
        )
        .await
        .expect("parked")
        .get::<_, i64>(0);
    if matches!(source, Source::Snapshot) {
        assert_eq!(parked, 0);
    }
    match source {
        Source::Earliest => {
            assert_eq!(v2.applied, total, "every event applied once by v2");
            assert_eq!(v2.duplicates, 0);
        }
        Source::Snapshot if kafka.is_external() => {
            // Seeded, and the tail started where the broker says the margin before the
            // snapshot begins: here, the whole log, whose events up to the snapshot were
            // skipped below the watermark.
            assert!(
                v2.applied > 0 && v2.accounted() == total && v2.duplicates >= backlog,
                "v2 consumed {} of {total} messages, {backlog} of them before the rebuild: {v2:?}",
                v2.accounted()
            );
        }
        Source::Snapshot => {
            // Seeded, not replayed: the mock cluster answers no lookup by time, so the tail
            // started at the log's end as it was before the snapshot, and applied only what
            // followed.
            assert!(
                v2.applied > 0 && v2.accounted() <= total - backlog,
                "v2 consumed {} of {total} messages, {backlog} of them before the rebuild: {v2:?}",
                v2.accounted()
            );
        }
    }

    // v1 kept committing while v2 was being built: never paused for the rebuild.
    let (v1_during, v2_during) = while_building(&samples);
    assert!(
        v1_during.len() >= 3,
        "v1 must commit while v2 is built; v1 offsets seen meanwhile: {v1_during:?}"
    );
    assert!(
        v2_during.len() >= 2,
        "v2 was built meanwhile: {v2_during:?}"
    );

    // The supervisor stopped v1 before it started v2, and v1 missed the last events.
    let log = commits.log();
    let last_v1 = log.iter().rposition(|c| c == "portfolio_v1").expect("v1");
    let first_v2 = log.iter().position(|c| c == "portfolio_v2").expect("v2");
    assert!(
        last_v1 < first_v2,
        "v1 committed after the supervisor started v2"
    );
    assert!(consumed(&db, "portfolio_v1").await < total);

    // Readers of the stable name never saw it missing or empty, before or after the cutover.
    let errors = reads.errors.lock().expect("lock").clone();
    assert!(errors.is_empty(), "readers saw errors: {errors:?}");
    assert_eq!(reads.empty.load(Ordering::SeqCst), 0, "readers saw no rows");
    assert!(reads_before > 0 && reads.queries.load(Ordering::SeqCst) > reads_before);

    assert_eq!(
        states(&db).await,
        [state(1, "retired", false), state(2, "live", false)]
    );
    assert_eq!(phase(&db).await.as_deref(), Some("done"));
}

// --- 2. A rebuild killed and resumed --------------------------------------------------------

#[test]
fn a_rebuild_killed_at_random_moments_and_resumed_equals_the_fold() {
    let rt = runtime();
    let broker = Broker::start(&[(TOPIC, 4)]);
    let kafka = broker.kafka();
    let db = rt.block_on(TestDb::new(&views()));
    let events = fills(100, 100);
    let mut chunks = events.chunks(2_000);
    let mut published: Vec<EventSpec> = Vec::new();
    let mut stream_len = 0i64;
    // Publishes the next chunk; false when there is none left.
    let mut publish_next = |published: &mut Vec<EventSpec>, stream_len: &mut i64| {
        let Some(chunk) = chunks.next() else {
            return false;
        };
        // One event in twenty is delivered twice.
        let mut stream = chunk.to_vec();
        stream.extend(chunk.iter().step_by(20).cloned());
        rt.block_on(publish(&kafka, &kafka.topic(TOPIC), &stream));
        published.extend_from_slice(chunk);
        *stream_len += stream.len() as i64;
        true
    };
    publish_next(&mut published, &mut stream_len);
    publish_next(&mut published, &mut stream_len);

    let args = cli(
        &[
            "rebuild",
            "portfolio",
            "--to-version",
            "2",
            "--from",
            "earliest",
            "--cutover",
            "manual",
            "--batch-messages",
            "200",
        ],
        db.url(),
        Some(&kafka),
    );
    let v2 = || rt.block_on(consumed(&db, "portfolio_v2"));

    // A kill while the log is checked (phase `seeding`): seen in PostgreSQL before and after.
    let mut killed_seeding = false;
    for _ in 0..5 {
        let mut p = Projector::spawn(&args, LOG);
        let deadline = Instant::now() + LIMIT;
        while rt.block_on(phase(&db)).is_none() {
            assert!(Instant::now() < deadline, "no registration:\n{}", p.log());
        }
        p.kill();
        if rt.block_on(phase(&db)).as_deref() == Some("seeding") {
            killed_seeding = true;
            break;
        }
        // Too late: start again from nothing.
        succeeded(
            "--cancel",
            &run_output(&cli(&["rebuild", "portfolio", "--cancel"], db.url(), None)),
        );
    }
    assert!(killed_seeding, "no kill landed in the seeding phase");

    let mut rng = Lcg(0x5eed_cafe);
    for kill in 0..6 {
        if v2() + 1_000 >= stream_len {
            publish_next(&mut published, &mut stream_len);
        }
        let before = v2();
        if before >= stream_len {
            break; // nothing left to be killed in the middle of
        }
        let mut p = Projector::spawn(&args, LOG);
        wait_until(
            &format!("progress after restart {kill}"),
            &mut [&mut p],
            v2,
            |now| *now > before,
        );
        // A random while longer: the kill lands anywhere in the tail.
        std::thread::sleep(Duration::from_millis(rng.below(150) as u64));
        p.kill();
    }
    while publish_next(&mut published, &mut stream_len) {}

    // The last run reaches the end; an engineer cuts over while it tails, and it stops.
    let mut last = Projector::spawn(&args, LOG);
    wait_until("the end of the log", &mut [&mut last], v2, |n| {
        *n >= stream_len
    });
    let out = run_output(&cli(
        &["cutover", "portfolio", "--to-version", "2"],
        db.url(),
        None,
    ));
    succeeded("cutover", &out);
    assert!(out.stdout.contains("portfolio: v2 is live; v1 is retired"));
    let status = last.wait_exit(LIMIT);
    assert!(
        status.success(),
        "the rebuild stops once cut over: {status}\n{}",
        last.log()
    );

    assert_eq!(
        rt.block_on(version_rows(&db, 2)),
        rt.block_on(reference(&published))
    );
    let o = rt.block_on(async { offsets(&db.client().await, "portfolio_v2").await });
    assert_eq!(o.next.values().sum::<i64>(), stream_len);
    assert_eq!(o.applied, published.len() as i64, "each event applied once");
    assert_eq!(o.duplicates, stream_len - published.len() as i64);
    assert_eq!(
        rt.block_on(states(&db)),
        [state(1, "retired", false), state(2, "live", false)]
    );
    let client = rt.block_on(db.client());
    assert_eq!(
        rt.block_on(rows(&client, "portfolio")),
        rt.block_on(rows(&client, "portfolio_v2"))
    );
}

// --- 3. Edges ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_topic_cuts_over_and_the_new_version_then_reads_from_the_start() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = TestDb::new(&registry).await;
    rebuild_and_cut_over(&db, &kafka, &kafka.topic(TOPIC)).await;
    assert_eq!(version_rows(&db, 2).await, [Vec::<String>::new()]);
    assert!(rows(&db.client().await, "portfolio").await.is_empty());

    // Live now, v2 has no offsets: the events that arrive next are its first, none skipped.
    let events = fills(3, 2);
    publish(&kafka, &kafka.topic(TOPIC), &events).await;
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry,
        db.pool().clone(),
        kafka.config(&kafka.topic(TOPIC)),
        Arc::new(Commits::default()),
        stop.clone(),
        LiveOptions {
            refresh: Duration::from_millis(100),
            ..LiveOptions::default()
        },
    ));
    eventually(
        "v2 to consume the new events",
        || consumed(&db, "portfolio_v2"),
        |n| *n >= 6,
    )
    .await;
    stop.cancel();
    live.await.expect("join");
    assert_eq!(version_rows(&db, 2).await, reference(&events).await);
    assert_eq!(consumed(&db, "portfolio_v1").await, 0, "v1 is retired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_of_one_event_cuts_over_with_that_event_applied() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let events = fills(1, 1);
    let partitions = publish(&kafka, &kafka.topic(TOPIC), &events).await;
    rebuild_and_cut_over(&db, &kafka, &kafka.topic(TOPIC)).await;
    let expected = reference(&events).await;
    assert_eq!(expected[0].len(), 1);
    assert_eq!(version_rows(&db, 2).await, expected);
    let o = offsets(&db.client().await, "portfolio_v2").await;
    let (partition, _) = partitions.iter().next().expect("one partition");
    assert_eq!(o.next.get(partition), Some(&1));
    assert_eq!(o.applied, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_whose_every_message_is_poison_cuts_over_with_all_of_them_dead_lettered() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let bad_fill = |account: i64, seq: i64| {
        let mut e = fill(
            account,
            seq,
            "2026-11-29T10:15:00Z",
            "EURUSD",
            "buy",
            "1",
            "1.1",
            "0",
        );
        e.data["qty"] = serde_json::json!("lots");
        (Some(e.key()), e.payload())
    };
    let messages: Vec<Raw> = vec![
        (Some(b"1".to_vec()), b"not json at all".to_vec()),
        (Some(b"2".to_vec()), vec![0xff, 0xfe, 0x00]),
        (
            Some(b"3".to_vec()),
            br#"{"event_id":"e-3","type":"fill_executed","account_id":3}"#.to_vec(),
        ),
        (None, br#"{"truncated":"#.to_vec()),
        bad_fill(4, 1),
        bad_fill(5, 1),
    ];
    let landed = publish_raw(&kafka, &kafka.topic(TOPIC), &messages).await;
    rebuild_and_cut_over(&db, &kafka, &kafka.topic(TOPIC)).await;

    assert_eq!(version_rows(&db, 2).await, [Vec::<String>::new()]);
    let o = offsets(&db.client().await, "portfolio_v2").await;
    let ends: BTreeMap<i32, i64> = ends_of(&landed)
        .into_iter()
        .map(|(p, e)| (p, e as i64))
        .collect();
    assert_eq!(o.next, ends, "every message consumed");
    assert_eq!(o.dead_lettered, messages.len() as i64);
    assert_eq!(o.applied, 0);
    // Each dead letter keeps the bytes of its message, at the offset it had.
    let mut dead: Vec<(i32, i64, Vec<u8>)> = db
        .client()
        .await
        .query(
            "SELECT partition, \"offset\", payload FROM projector.dead_letters \
             WHERE consumer = 'portfolio_v2' ORDER BY 1, 2",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut sent: Vec<(i32, i64, Vec<u8>)> = landed
        .iter()
        .zip(&messages)
        .map(|(&(p, o), (_, payload))| (p, o, payload.clone()))
        .collect();
    dead.sort();
    sent.sort();
    assert_eq!(dead, sent);
}

// --- 4. Inbox separation ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_version_fills_although_the_old_one_has_inboxed_every_event() {
    let broker = Broker::start(&[(TOPIC, 3)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let events = fills(20, 30);
    let ends = publish(&kafka, &kafka.topic(TOPIC), &events).await;

    // v1 applies (and inboxes) every event first.
    let progress = Arc::new(crate::support::kafka::Progress::default());
    let stop = CancellationToken::new();
    let v1 = tokio::spawn(run_view(
        Arc::new(Applier::new(portfolio(1), SourceOrdering::PerAccount).expect("applier")),
        db.pool().clone(),
        kafka.config(&kafka.topic(TOPIC)),
        progress.clone(),
        stop.clone(),
    ));
    progress.wait_for_ends(&ends, LIMIT).await;
    stop.cancel();
    v1.await.expect("join").expect("v1");
    let inboxed = |consumer: &'static str| {
        let db = &db;
        async move {
            db.client()
                .await
                .query_one(
                    "SELECT count(*) FROM projector.inbox WHERE consumer = $1",
                    &[&consumer],
                )
                .await
                .expect("inbox")
                .get::<_, i64>(0)
        }
    };
    assert_eq!(inboxed("portfolio_v1").await, events.len() as i64);

    rebuild_and_cut_over(&db, &kafka, &kafka.topic(TOPIC)).await;
    let v2 = version_rows(&db, 2).await;
    assert!(!v2[0].is_empty());
    assert_eq!(v2, version_rows(&db, 1).await);
    assert_eq!(v2, reference(&events).await);
    assert_eq!(inboxed("portfolio_v2").await, events.len() as i64);
    assert_eq!(inboxed("portfolio_v1").await, events.len() as i64);
    let report = verify::verify(&db.client().await, &views(), "portfolio", (1, 2), &[])
        .await
        .expect("verify");
    assert!(report.matches(), "{report:?}");
    assert_eq!(report.rows.0, v2[0].len() as i64);
}

// --- 5. A log that no longer starts at the first event --------------------------------------

#[test]
fn a_log_that_starts_past_an_accounts_first_event_is_refused_unless_gaps_are_allowed() {
    let rt = runtime();
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = rt.block_on(TestDb::new(&views()));
    // Account 7's first four events are gone: its log starts at seq 5.
    let events: Vec<EventSpec> = fills(7, 8)
        .into_iter()
        .filter(|e| !(e.account_id == 7 && e.seq < 5))
        .collect();
    rt.block_on(publish(&kafka, &kafka.topic(TOPIC), &events));
    let args = ["rebuild", "portfolio", "--from", "earliest"];

    let out = run_output(&cli(&args, db.url(), Some(&kafka)));
    refused(
        "a log with a late start",
        &out,
        "1 account(s) start past seq 1",
    );
    assert!(!out.stderr.contains("retention trimmed"), "{}", out.stderr);
    // Nothing is kept of a rebuild that must not start.
    assert_eq!(rt.block_on(states(&db)), [state(1, "live", false)]);
    assert!(!rt.block_on(table_exists(&db, "portfolio_v2")));
    assert_eq!(rt.block_on(owned(&db, "portfolio_v2")), nothing_owned());

    let mut allowed = cli(&args, db.url(), Some(&kafka));
    allowed.push("--allow-gaps".to_owned());
    let out = run_output(&allowed);
    succeeded("--allow-gaps", &out);
    assert!(
        out.stdout.contains("portfolio: v2 is live; v1 is retired"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("portfolio_v2: 1 parked account(s), 0 open dead letter(s)"),
        "{}",
        out.stdout
    );
    let parked: Vec<(i64, String, i64)> = rt.block_on(async {
        db.client()
            .await
            .query(
                "SELECT account_id, reason, blocked_seq FROM projector.parked_accounts \
                 WHERE consumer = 'portfolio_v2'",
                &[],
            )
            .await
            .expect("parked")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    });
    assert_eq!(parked, [(7, "gap".to_owned(), 1)]);
    // Every other account is complete; account 7's events wait.
    assert_eq!(
        rt.block_on(version_rows(&db, 2)),
        rt.block_on(reference(&events))
    );
    assert_eq!(
        rt.block_on(offsets(&rt.block_on(db.client()), "portfolio_v2"))
            .waiting,
        4
    );
}

#[test]
fn a_partition_trimmed_by_retention_is_named_in_the_refusal() {
    let rt = runtime();
    let broker = Broker::mock_only(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let db = rt.block_on(TestDb::new(&views()));
    // The mock cluster keeps about 5 MiB a partition and drops the oldest beyond that.
    let pad = "x".repeat(2_000);
    let events: Vec<EventSpec> = (0..3_500)
        .map(|i| {
            EventSpec::new(
                "memo",
                1 + i % 10,
                1 + i / 10,
                "2026-11-29T10:15:00Z",
                serde_json::json!({ "pad": pad }),
            )
        })
        .collect();
    rt.block_on(publish(&kafka, &kafka.topic(TOPIC), &events));
    let low = projector_rebuild::log::connect(&kafka.config(&kafka.topic(TOPIC)))
        .expect("log")
        .extents()
        .expect("extents")[0]
        .low;
    assert!(low > 0, "the mock cluster did not trim the partition");

    let out = run_output(&cli(
        &["rebuild", "portfolio", "--from", "earliest"],
        db.url(),
        Some(&kafka),
    ));
    refused(
        "a trimmed log",
        &out,
        &format!(
            "retention trimmed partition(s) 0 (from offset {low}); 10 account(s) start past seq 1"
        ),
    );
    assert_eq!(rt.block_on(states(&db)), [state(1, "live", false)]);
    assert_eq!(rt.block_on(owned(&db, "portfolio_v2")), nothing_owned());
}

// --- 6. Pause, resume, cancel, retire, verify, cutover ---------------------------------------

#[test]
fn pause_stops_the_tail_resume_continues_and_cancel_leaves_nothing() {
    let rt = runtime();
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = rt.block_on(TestDb::new(&views()));
    let events = fills(30, 50);
    let total = events.len() as i64;
    rt.block_on(publish(&kafka, &kafka.topic(TOPIC), &events));
    let v2 = || rt.block_on(consumed(&db, "portfolio_v2"));

    // Slow on purpose, so that a backlog is left while paused.
    let args = cli(
        &[
            "rebuild",
            "portfolio",
            "--from",
            "earliest",
            "--cutover",
            "manual",
            "--max-rate",
            "300",
            "--batch-messages",
            "50",
        ],
        db.url(),
        Some(&kafka),
    );
    let mut p = Projector::spawn(&args, LOG);
    wait_until("progress", &mut [&mut p], v2, |n| *n > 0);

    // One rebuild of a view at a time: another version is refused while this one runs.
    let other = run_output(&cli(
        &[
            "rebuild",
            "portfolio",
            "--to-version",
            "3",
            "--from",
            "earliest",
        ],
        db.url(),
        Some(&kafka),
    ));
    refused(
        "a second rebuild",
        &other,
        "a rebuild of portfolio into v2 is under way",
    );

    let out = run_output(&cli(&["rebuild", "portfolio", "--pause"], db.url(), None));
    succeeded("--pause", &out);
    assert!(out
        .stdout
        .contains("paused the rebuild of portfolio into v2"));
    // The process says so once its tail has stopped (in-flight batches committed).
    p.wait_for("the tail to stop", LIMIT, |l| {
        l.contains("paused; resume with")
    });
    let paused_at = v2();
    assert!(paused_at < total, "the backlog must outlast the pause");
    // A status line measured while paused (the next one comes at least a tick later).
    let line = p.wait_for("a status line while paused", LIMIT, |l| {
        l.contains("PAUSED")
    });
    assert_eq!(v2(), paused_at, "offsets moved while paused: {line}");

    let out = run_output(&cli(&["rebuild", "portfolio", "--resume"], db.url(), None));
    succeeded("--resume", &out);
    assert!(out
        .stdout
        .contains("resumed the rebuild of portfolio into v2"));
    wait_until("progress after resuming", &mut [&mut p], v2, |n| {
        *n > paused_at
    });

    let out = run_output(&cli(&["rebuild", "portfolio", "--cancel"], db.url(), None));
    succeeded("--cancel", &out);
    assert!(out
        .stdout
        .contains("cancelled the rebuild of portfolio into v2"));
    let status = p.wait_exit(LIMIT);
    assert!(status.success(), "the cancelled rebuild exits 0: {status}");
    assert!(!rt.block_on(table_exists(&db, "portfolio_v2")));
    assert_eq!(rt.block_on(owned(&db, "portfolio_v2")), nothing_owned());
    assert_eq!(rt.block_on(states(&db)), [state(1, "live", false)]);

    // The version number is free again, and the rebuild into it starts from nothing.
    let out = run_output(&cli(
        &["rebuild", "portfolio", "--from", "earliest"],
        db.url(),
        Some(&kafka),
    ));
    succeeded("the rebuild after a cancel", &out);
    assert!(
        out.stdout.contains("portfolio: v2 is live; v1 is retired"),
        "{}",
        out.stdout
    );
    assert_eq!(
        rt.block_on(version_rows(&db, 2)),
        rt.block_on(reference(&events))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_leaves_nothing_for_a_rebuild_into_the_same_version_to_resume_from() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = Arc::new(TestDb::new(&registry).await);
    let first = fills(20, 10);
    publish(&kafka, &kafka.topic(TOPIC), &first).await;

    // The rebuild looks at the registry every 3 s: a cancel lands between two looks.
    let mut options = earliest(Cutover::Manual);
    options.tick = Duration::from_secs(3);
    let running = {
        let (db, kafka, options) = (db.clone(), kafka.clone(), options.clone());
        tokio::spawn(async move {
            rebuild(
                &db,
                &kafka,
                &kafka.topic(TOPIC),
                &options,
                CancellationToken::new(),
            )
            .await
        })
    };
    eventually(
        "v2 to consume the log",
        || consumed(&db, "portfolio_v2"),
        |n| *n >= first.len() as i64,
    )
    .await;
    let version = cutover::cancel(&mut db.client().await, &registry, "portfolio")
        .await
        .expect("cancel");
    assert_eq!(version, 2);
    // Events that portfolio ignores: a batch of them writes bookkeeping only.
    let cash_events: Vec<EventSpec> = (1..=20)
        .map(|a| cash(a, 11, "2026-11-29T10:15:00Z", "10", "deposit"))
        .collect();
    publish(&kafka, &kafka.topic(TOPIC), &cash_events).await;
    let outcome = tokio::time::timeout(LIMIT, running)
        .await
        .expect("the cancelled rebuild to stop")
        .expect("join")
        .expect("the cancelled rebuild");
    assert_eq!(outcome, Outcome::Cancelled { version: 2 });
    assert_eq!(owned(&db, "portfolio_v2").await, nothing_owned());

    // A rebuild into the same number starts from nothing, not from what was cancelled.
    let more: Vec<EventSpec> = fills(20, 13).into_iter().filter(|e| e.seq > 11).collect();
    publish(&kafka, &kafka.topic(TOPIC), &more).await;
    rebuild_and_cut_over(&db, &kafka, &kafka.topic(TOPIC)).await;
    let mut all = first.clone();
    all.extend(cash_events);
    all.extend(more);
    assert_eq!(version_rows(&db, 2).await, reference(&all).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_old_version_right_after_a_cutover_waits_for_the_live_service_to_let_go() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = Arc::new(TestDb::new(&registry).await);
    let events = fills(30, 100);
    publish(&kafka, &kafka.topic(TOPIC), &events).await;

    // The live service applies at most 500 events a second: v1 is in the middle of its
    // backlog, a batch in its hands, throughout. On an external broker the rebuild's group
    // takes seconds to form (tansu: half the session timeout), so v1 goes slower there.
    let mut live_config = kafka.config(&kafka.topic(TOPIC));
    live_config.max_rate = Some(if kafka.is_external() { 150 } else { 500 });
    let commits = Arc::new(Commits::default());
    let stop_live = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry.clone(),
        db.pool().clone(),
        live_config,
        commits.clone(),
        stop_live.clone(),
        LiveOptions {
            names: vec!["portfolio".to_owned()],
            ..LiveOptions::default()
        },
    ));
    eventually("v1 to commit", || consumed(&db, "portfolio_v1"), |n| *n > 0).await;

    let running = {
        let (db, kafka) = (db.clone(), kafka.clone());
        tokio::spawn(async move {
            rebuild(
                &db,
                &kafka,
                &kafka.topic(TOPIC),
                &earliest(Cutover::Manual),
                CancellationToken::new(),
            )
            .await
        })
    };
    eventually(
        "v2 to consume the log",
        || consumed(&db, "portfolio_v2"),
        |n| *n >= events.len() as i64,
    )
    .await;
    // An engineer cuts over and drops v1 at once, before `projector run` looked again.
    let mut client = db.client().await;
    let report = cutover::cutover(&mut client, &registry, "portfolio", 2, None)
        .await
        .expect("cutover");
    assert_eq!(report.old, Some(1));
    assert!(
        consumed(&db, "portfolio_v1").await < events.len() as i64,
        "v1 must still be running"
    );
    tokio::time::timeout(
        LIMIT,
        cutover::retire(&mut client, &registry, "portfolio", 1, true),
    )
    .await
    .expect("retire --drop to finish")
    .expect("retire --drop");
    let outcome = running.await.expect("join").expect("the rebuild");
    assert_eq!(outcome, Outcome::Stopped { version: 2 });
    let mut nothing = nothing_owned();
    nothing.remove("rebuilds");
    let mut left = owned(&db, "portfolio_v1").await;
    left.remove("rebuilds");
    assert_eq!(left, nothing);

    // The live service moved on to v2.
    let more: Vec<EventSpec> = fills(30, 102).into_iter().filter(|e| e.seq > 100).collect();
    publish(&kafka, &kafka.topic(TOPIC), &more).await;
    let total = (events.len() + more.len()) as i64;
    eventually(
        "the live service to consume into v2",
        || consumed(&db, "portfolio_v2"),
        |n| *n >= total,
    )
    .await;
    assert!(commits.log().iter().any(|c| c == "portfolio_v2"));
    stop_live.cancel();
    tokio::time::timeout(LIMIT, live)
        .await
        .expect("the live service to stop")
        .expect("join");
    let mut left = owned(&db, "portfolio_v1").await;
    left.remove("rebuilds");
    assert_eq!(left, nothing, "nothing written for v1 after it was dropped");
    assert!(!table_exists(&db, "portfolio_v1").await);
    let mut all = events.clone();
    all.extend(more);
    assert_eq!(version_rows(&db, 2).await, reference(&all).await);
}

/// About 7 MB of events portfolio ignores, for accounts 101 to 110: more than the mock
/// cluster keeps of a partition (about 5 MiB), so it drops the oldest messages.
fn memos() -> Vec<EventSpec> {
    let pad = "x".repeat(2_000);
    (0..3_500)
        .map(|i| {
            EventSpec::new(
                "memo",
                101 + i % 10,
                1 + i / 10,
                "2026-11-29T10:15:00Z",
                serde_json::json!({ "pad": pad }),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_that_retention_overtook_stops_instead_of_skipping() {
    let broker = Broker::mock_only(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let events = fills(10, 20);
    publish(&kafka, &kafka.topic(TOPIC), &events).await;
    let stop = CancellationToken::new();
    let stopping = stop.clone();
    let manual = earliest(Cutover::Manual);
    let topic = kafka.topic(TOPIC);
    let first = rebuild(&db, &kafka, &topic, &manual, stop);
    let watch = async {
        eventually(
            "v2 to consume the log",
            || consumed(&db, "portfolio_v2"),
            |n| *n >= events.len() as i64,
        )
        .await;
        stopping.cancel();
    };
    let (outcome, ()) = tokio::join!(first, watch);
    assert_eq!(outcome.expect("rebuild"), Outcome::Stopped { version: 2 });

    // While the rebuild is stopped, retention drops the log past its position (the mock
    // cluster keeps about 5 MiB a partition).
    publish(&kafka, &kafka.topic(TOPIC), &memos()).await;
    let low = projector_rebuild::log::connect(&kafka.config(&kafka.topic(TOPIC)))
        .expect("log")
        .extents()
        .expect("extents")[0]
        .low;
    assert!(low > events.len() as i64, "the log was not trimmed: {low}");

    let resumed = tokio::time::timeout(
        Duration::from_secs(30),
        rebuild(
            &db,
            &kafka,
            &kafka.topic(TOPIC),
            &earliest(Cutover::Manual),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("the resumed rebuild must stop at once, not tail past the hole");
    let error = resumed.expect_err("a rebuild that lost messages must not go on");
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "partition 0 at offset {}, the log now starts at {low}",
            events.len()
        )),
        "{text}"
    );
    assert_eq!(consumed(&db, "portfolio_v2").await, events.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_rebuild_that_retention_overtakes_stops_instead_of_skipping() {
    let broker = Broker::mock_only(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let db = Arc::new(TestDb::new(&views()).await);
    let events = fills(10, 20);
    publish(&kafka, &kafka.topic(TOPIC), &events).await;
    // Slower than retention: 100 messages a second.
    let mut options = earliest(Cutover::Manual);
    options.max_rate = Some(100);
    options.batch_messages = 20;
    let running = {
        let (db, kafka) = (db.clone(), kafka.clone());
        tokio::spawn(async move {
            rebuild(
                &db,
                &kafka,
                &kafka.topic(TOPIC),
                &options,
                CancellationToken::new(),
            )
            .await
        })
    };
    eventually(
        "the rebuild to be under way",
        || consumed(&db, "portfolio_v2"),
        |n| *n > 0,
    )
    .await;
    publish(&kafka, &kafka.topic(TOPIC), &memos()).await;

    let outcome = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the overtaken rebuild must stop, not tail past the hole")
        .expect("join");
    let error = outcome.expect_err("a rebuild that lost messages must not go on");
    assert!(
        error.to_string().contains("partition 0 at offset "),
        "{error}"
    );
    // Nothing past the hole was applied: the rebuild stood below the log's new start when
    // it stopped. (On a busy machine it may read some of the memos before retention drops
    // the rest; those are contiguous and fine.)
    let text = error.to_string();
    let number_after = |label: &str| -> i64 {
        let rest = &text[text.find(label).expect(label) + label.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().expect("an offset")
    };
    let (position, low) = (
        number_after("partition 0 at offset "),
        number_after("the log now starts at "),
    );
    assert!(position < low, "{text}");
    // Batches read before retention struck may still commit (contiguous, nothing skipped),
    // but nothing at or past the log's new start: the gap is never jumped.
    let at = consumed(&db, "portfolio_v2").await;
    assert!(at < low, "consumed past the hole: {at}, {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_service_holding_its_running_locks_still_serves_from_a_pool_of_one() {
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = TestDb::new(&registry).await;
    let events = fills(5, 4);
    publish(&kafka, &kafka.topic(TOPIC), &events).await;
    // `projector run --pool-size 1`: the session holding the locks is not one of the pool's.
    let pool = projector_engine::db::pool(db.url(), 1).expect("pool");
    let stop = CancellationToken::new();
    let live = tokio::spawn(run_live(
        registry,
        pool,
        kafka.config(&kafka.topic(TOPIC)),
        Arc::new(Commits::default()),
        stop.clone(),
        LiveOptions {
            names: vec!["portfolio".to_owned()],
            refresh: Duration::from_millis(100),
            ..LiveOptions::default()
        },
    ));
    eventually(
        "v1 to consume the log",
        || consumed(&db, "portfolio_v1"),
        |n| *n >= events.len() as i64,
    )
    .await;
    stop.cancel();
    live.await.expect("join");
    assert_eq!(version_rows(&db, 1).await, reference(&events).await);
}

#[test]
fn verify_compares_retire_drops_and_refusals_are_one_line() {
    let rt = runtime();
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = rt.block_on(TestDb::new(&views()));
    let events = fills(10, 20);
    let ends = rt.block_on(publish(&kafka, &kafka.topic(TOPIC), &events));
    // v1 is live and consumes everything.
    rt.block_on(async {
        let progress = Arc::new(crate::support::kafka::Progress::default());
        let stop = CancellationToken::new();
        let v1 = tokio::spawn(run_view(
            Arc::new(Applier::new(portfolio(1), SourceOrdering::PerAccount).expect("applier")),
            db.pool().clone(),
            kafka.config(&kafka.topic(TOPIC)),
            progress.clone(),
            stop.clone(),
        ));
        progress.wait_for_ends(&ends, LIMIT).await;
        stop.cancel();
        v1.await.expect("join").expect("v1");
    });
    let out = run_output(&cli(
        &["rebuild", "portfolio", "--from", "earliest"],
        db.url(),
        Some(&kafka),
    ));
    succeeded("the rebuild", &out);

    let verify_args = cli(
        &["verify", "portfolio", "--versions", "1,2"],
        db.url(),
        None,
    );
    let out = run_output(&verify_args);
    succeeded("verify of equal versions", &out);
    assert!(out.stdout.contains("the versions match"), "{}", out.stdout);

    // A row changed by hand is found, and shown from both sides.
    rt.block_on(async {
        db.client()
            .await
            .execute(
                "UPDATE portfolio_v2 SET net_qty = net_qty + 1 WHERE account_id = 3",
                &[],
            )
            .await
            .expect("update")
    });
    let out = run_output(&verify_args);
    refused("verify of different versions", &out, "the versions differ");
    assert!(
        out.stdout.contains("1 row(s) only in v1, 1 only in v2"),
        "{}",
        out.stdout
    );
    let shown = |side: &str| {
        out.stdout
            .lines()
            .filter(|l| l.trim_start().starts_with(&format!("only in {side}: (3,")))
            .count()
    };
    assert_eq!((shown("v1"), shown("v2")), (1, 1), "{}", out.stdout);
    // Compared on columns the change did not touch, they match.
    let mut on_keys = verify_args.clone();
    on_keys.extend(["--columns", "account_id,symbol,version"].map(str::to_owned));
    succeeded("verify on other columns", &run_output(&on_keys));

    refused(
        "retiring the live version",
        &run_output(&cli(
            &["retire", "portfolio", "--version", "2"],
            db.url(),
            None,
        )),
        "portfolio v2 is live; cut over to another version first",
    );

    let out = run_output(&cli(
        &["retire", "portfolio", "--version", "1", "--drop"],
        db.url(),
        None,
    ));
    succeeded("retire --drop", &out);
    assert!(!rt.block_on(table_exists(&db, "portfolio_v1")));
    let mut dropped = nothing_owned();
    dropped.remove("rebuilds");
    let mut left = rt.block_on(owned(&db, "portfolio_v1"));
    left.remove("rebuilds");
    assert_eq!(left, dropped);
    assert_eq!(
        rt.block_on(states(&db)),
        [state(1, "retired", true), state(2, "live", false)]
    );
    // A later migrate does not bring the dropped version back.
    succeeded("migrate", &run_output(&cli(&["migrate"], db.url(), None)));
    assert!(!rt.block_on(table_exists(&db, "portfolio_v1")));
    assert_eq!(
        rt.block_on(states(&db)),
        [state(1, "retired", true), state(2, "live", false)]
    );

    refused(
        "a cutover to a retired version",
        &run_output(&cli(
            &["cutover", "portfolio", "--to-version", "1"],
            db.url(),
            None,
        )),
        "portfolio v1 is retired",
    );
    // Readers still read v2 through the stable name.
    let client = rt.block_on(db.client());
    assert_eq!(
        rt.block_on(rows(&client, "portfolio")),
        rt.block_on(rows(&client, "portfolio_v2"))
    );
}

#[test]
fn a_cutover_by_hand_refuses_a_version_far_behind_the_live_one_unless_forced() {
    let rt = runtime();
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = Arc::new(rt.block_on(TestDb::new(&views())));
    let events = fills(10, 30);
    let ends = rt.block_on(publish(&kafka, &kafka.topic(TOPIC), &events));
    rt.block_on(async {
        let progress = Arc::new(crate::support::kafka::Progress::default());
        let stop = CancellationToken::new();
        let v1 = tokio::spawn(run_view(
            Arc::new(Applier::new(portfolio(1), SourceOrdering::PerAccount).expect("applier")),
            db.pool().clone(),
            kafka.config(&kafka.topic(TOPIC)),
            progress.clone(),
            stop.clone(),
        ));
        progress.wait_for_ends(&ends, LIMIT).await;
        stop.cancel();
        v1.await.expect("join").expect("v1");
        // v2 is stopped after its first batches: far behind v1.
        let mut options = earliest(Cutover::Manual);
        options.max_rate = Some(20);
        options.batch_messages = 5;
        let stop = CancellationToken::new();
        let running = {
            let (db, kafka, stop) = (db.clone(), kafka.clone(), stop.clone());
            tokio::spawn(
                async move { rebuild(&db, &kafka, &kafka.topic(TOPIC), &options, stop).await },
            )
        };
        eventually(
            "v2 to be under way",
            || consumed(&db, "portfolio_v2"),
            |n| *n > 0,
        )
        .await;
        stop.cancel();
        let outcome = running.await.expect("join").expect("rebuild");
        assert_eq!(outcome, Outcome::Stopped { version: 2 });
    });
    let cut = ["cutover", "portfolio", "--to-version", "2"];
    refused(
        "a cutover to a version far behind",
        &run_output(&cli(&cut, db.url(), None)),
        "messages behind the live v1",
    );
    assert_eq!(
        rt.block_on(states(&db)),
        [state(1, "live", false), state(2, "building", false)]
    );
    let mut forced = cli(&cut, db.url(), None);
    forced.push("--force".to_owned());
    succeeded("a forced cutover", &run_output(&forced));
    assert_eq!(
        rt.block_on(states(&db)),
        [state(1, "retired", false), state(2, "live", false)]
    );
}

// --- 7. Budget ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_rate_bounds_what_the_rebuild_consumes() {
    let broker = Broker::start(&[(TOPIC, 3)]);
    let kafka = broker.kafka();
    let db = Arc::new(TestDb::new(&views()).await);
    publish(&kafka, &kafka.topic(TOPIC), &fills(50, 60)).await;
    const RATE: i64 = 400;
    const BATCH: i64 = 50;
    let mut options = earliest(Cutover::Manual);
    options.max_rate = Some(RATE as u32);
    options.batch_messages = BATCH as usize;

    let stop = CancellationToken::new();
    // Everything the limiter lets through happens after this instant.
    let started = Instant::now();
    let running = {
        let (db, kafka, stop) = (db.clone(), kafka.clone(), stop.clone());
        tokio::spawn(async move { rebuild(&db, &kafka, &kafka.topic(TOPIC), &options, stop).await })
    };
    // Sample the work done as it grows: each sample must be within the budget of the time
    // that had passed when it was read (an upper bound on the limiter's running time).
    let mut seen = 0;
    let mut samples = 0;
    while seen < 1_200 {
        let now = consumed(&db, "portfolio_v2").await;
        // Rounded up: as_millis truncates.
        let elapsed_ms = i64::try_from(started.elapsed().as_millis()).expect("ms") + 1;
        assert!(
            now * 1_000 <= RATE * elapsed_ms + BATCH * 1_000,
            "{now} messages consumed in {elapsed_ms} ms at {RATE}/s (batches of {BATCH})"
        );
        if now > seen {
            samples += 1;
        }
        seen = now;
        assert!(started.elapsed() < LIMIT, "no progress: {seen}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(samples >= 3, "too few samples to say anything");
    stop.cancel();
    let outcome = running.await.expect("join").expect("rebuild");
    assert_eq!(outcome, Outcome::Stopped { version: 2 });
}

// --- 8. From the write side's snapshot --------------------------------------------------------

/// Places one order of `account` per `(side, qty, price)` through the write side's intake.
async fn place(write_side: &WriteSide, account: i64, orders: &[(Side, &str, &str)]) {
    for (side, qty, price) in orders {
        let order = Order {
            symbol: "EURUSD".to_owned(),
            side: *side,
            qty: qty.parse().expect("a decimal"),
            price: price.parse().expect("a decimal"),
        };
        // A fresh idempotency key per order.
        static KEYS: AtomicU64 = AtomicU64::new(0);
        let key = format!("order-{}", KEYS.fetch_add(1, Ordering::SeqCst));
        let outcome = write_side
            .intake()
            .place(account, &key, order)
            .await
            .expect("the order");
        assert!(outcome.is_accepted(), "{outcome:?}");
    }
}

/// Publishes the outbox until it is empty.
async fn relay_all(write_side: &WriteSide, kafka: &Kafka) {
    let drain = CancellationToken::new();
    drain.cancel();
    let relay = Feed::relay(write_side, kafka, 0, drain);
    assert_eq!(relay.await.expect("the relay"), RelayExit::Drained);
}

/// Parked accounts of a consumer: (account, reason, blocked seq).
async fn parked(db: &TestDb, consumer: &str) -> Vec<(i64, String, i64)> {
    db.client()
        .await
        .query(
            "SELECT account_id, reason, blocked_seq FROM projector.parked_accounts \
             WHERE consumer = $1 ORDER BY account_id",
            &[&consumer],
        )
        .await
        .expect("parked accounts")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The write side's positions, and a version's portfolio rows, in the same columns as text.
async fn truth_and_version(db: &TestDb, version: i32) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let client = db.client().await;
    let read = |sql: String| {
        let client = &client;
        async move {
            client
                .query(&sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .iter()
                .map(|r| (0..r.len()).map(|i| r.get::<_, String>(i)).collect())
                .collect::<Vec<Vec<String>>>()
        }
    };
    let truth = read(
        "SELECT account_id::text, symbol, net_qty::text, round(avg_price, 10)::text, \
                realized_pnl::text, last_trade_at::text, last_seq::text FROM positions ORDER BY 1, 2"
            .to_owned(),
    )
    .await;
    let view = read(format!(
        "SELECT account_id::text, symbol, net_qty::text, avg_price::text, realized_pnl::text, \
                last_trade_at::text, version::text FROM portfolio_v{version} ORDER BY 1, 2"
    ))
    .await;
    (truth, view)
}

/// Runs `version` of portfolio as a plain consumer until it has consumed the whole topic.
async fn consume_topic(db: &TestDb, kafka: &Kafka, version: i32) {
    let applier =
        Arc::new(Applier::new(portfolio(version), SourceOrdering::PerAccount).expect("applier"));
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier,
        db.pool().clone(),
        kafka.config(&kafka.topic(TOPIC)),
        Arc::new(NoObserver),
        stop.clone(),
    ));
    let size = topic_size(kafka).await;
    let consumer = format!("portfolio_v{version}");
    eventually(
        "the topic to be consumed",
        || consumed(db, &consumer),
        |n| *n >= size,
    )
    .await;
    stop.cancel();
    task.await
        .expect("the consumer's task")
        .expect("the consumer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_from_a_snapshot_heals_an_account_whose_event_never_reached_the_log() {
    use Side::{Buy, Sell};
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = TestDb::new(&registry).await;
    let Feed::WriteSide(write_side) = Feed::write_side(&db).await else {
        unreachable!("a write side");
    };

    // Account 7's third event is committed on the write side but never reaches the log: its
    // outbox row is lost (marked sent, never published). v1 parks the account at seq 3.
    place(
        &write_side,
        7,
        &[
            (Buy, "10", "100"),
            (Buy, "5", "110"),
            (Sell, "8", "120.5"),
            (Buy, "3", "90"),
            (Sell, "2", "95.25"),
        ],
    )
    .await;
    place(&write_side, 8, &[(Buy, "4", "50"), (Sell, "1", "55")]).await;
    let lost = write_side
        .pool()
        .get()
        .await
        .expect("connection")
        .execute(
            "UPDATE writeside.outbox SET sent_at = now() WHERE account_id = 7 AND seq = 3",
            &[],
        )
        .await
        .expect("losing the outbox row");
    assert_eq!(lost, 1);
    relay_all(&write_side, &kafka).await;
    consume_topic(&db, &kafka, 1).await;
    assert_eq!(
        parked(&db, "portfolio_v1").await,
        [(7, "gap".to_owned(), 3)]
    );

    // Account 8 trades on; the snapshot holds these, the log does not have them yet: the
    // relay publishes them after the rebuild has looked at the log's end.
    place(&write_side, 8, &[(Buy, "2", "60"), (Sell, "5", "58")]).await;

    let outcome = tokio::time::timeout(
        LIMIT,
        rebuild(
            &db,
            &kafka,
            &kafka.topic(TOPIC),
            &snapshot(Cutover::Auto),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("the rebuild to cut over in time")
    .expect("the rebuild");
    let Outcome::CutOver(report) = outcome else {
        panic!("expected a cutover, got {outcome:?}");
    };
    assert_eq!((report.old, report.new), (Some(1), 2));
    // v2 holds more of accounts 7 and 8 than v1 had applied: their notices were never sent.
    assert_eq!(report.accounts_ahead, 2);
    let (truth, v2) = truth_and_version(&db, 2).await;
    assert_eq!(v2, truth, "v2 is the write side's state");
    assert!(
        truth.iter().any(|r| r[0] == "7" && r[6] == "5"),
        "{truth:?}"
    );
    assert_eq!(parked(&db, "portfolio_v2").await, []);

    // The relay publishes account 8's held events (at or below v2's watermark: skipped), then
    // later events of account 7 and of account 9, which the snapshot did not have at all.
    relay_all(&write_side, &kafka).await;
    place(&write_side, 7, &[(Sell, "1", "99"), (Buy, "6", "101")]).await;
    place(&write_side, 9, &[(Buy, "1", "10"), (Buy, "1", "12")]).await;
    relay_all(&write_side, &kafka).await;
    consume_topic(&db, &kafka, 2).await;

    let (truth, v2) = truth_and_version(&db, 2).await;
    assert_eq!(v2, truth, "v2 follows the write side");
    assert!(
        truth.iter().any(|r| r[0] == "7" && r[6] == "7"),
        "{truth:?}"
    );
    assert!(truth.iter().any(|r| r[0] == "9"), "{truth:?}");
    assert_eq!(parked(&db, "portfolio_v2").await, []);
    let counts = db
        .client()
        .await
        .query_one(
            "SELECT sum(applied)::bigint, sum(dup_watermark)::bigint, sum(duplicates)::bigint, \
                    sum(waiting)::bigint FROM projector.offsets WHERE consumer = 'portfolio_v2'",
            &[],
        )
        .await
        .expect("v2's counts");
    let counts: (i64, i64, i64, i64) = (counts.get(0), counts.get(1), counts.get(2), counts.get(3));
    // The tail starts at the offsets the broker gives for the snapshot's time less the
    // margin. The mock cluster answers no lookup by time, so the tail starts at the end of
    // the log; a real broker gives the first message of the margin, and everything the
    // snapshot already holds is skipped below the watermark too.
    let before_the_tail = if kafka.is_external() { counts.1 - 2 } else { 0 };
    assert_eq!(
        counts,
        (4, 2 + before_the_tail, 2 + before_the_tail, 0),
        "v2 applied 7's seqs 6 and 7 and 9's 1 and 2, and skipped 8's 3 and 4 below the watermark"
    );
    assert!(before_the_tail >= 0, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_committed_after_the_snapshot_and_published_before_the_tail_is_placed_is_applied()
{
    use Side::{Buy, Sell};
    let broker = Broker::start(&[(TOPIC, 2)]);
    let kafka = broker.kafka();
    let db = Arc::new(TestDb::new(&views()).await);
    let Feed::WriteSide(write_side) = Feed::write_side(&db).await else {
        unreachable!("a write side");
    };
    place(&write_side, 5, &[(Buy, "10", "100"), (Buy, "10", "120")]).await;
    relay_all(&write_side, &kafka).await;

    // The seeding records its watermarks after its snapshot statement and before it asks the
    // log where the tail starts: held here, it waits in between.
    let mut gate_client = db.client().await;
    let gate = gate_client.transaction().await.expect("begin");
    gate.batch_execute("LOCK TABLE projector.account_progress IN SHARE MODE")
        .await
        .expect("the gate");
    let rebuilding = {
        let db = db.clone();
        let kafka = kafka.clone();
        tokio::spawn(async move {
            rebuild(
                &db,
                &kafka,
                &kafka.topic(TOPIC),
                &snapshot(Cutover::Auto),
                CancellationToken::new(),
            )
            .await
        })
    };
    let client = db.client().await;
    eventually(
        "the seeding to wait at the gate, its snapshot taken",
        || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_locks \
                     WHERE database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                       AND relation = 'projector.account_progress'::regclass AND NOT granted",
                    &[],
                )
                .await
                .expect("locks")
                .get::<_, i64>(0)
        },
        |waiting| *waiting > 0,
    )
    .await;
    // Committed after the snapshot began, so not in it; in the log before the tail's start
    // is looked up, where a lookup after the snapshot would start past it.
    place(&write_side, 5, &[(Sell, "5", "130")]).await;
    relay_all(&write_side, &kafka).await;
    gate.commit().await.expect("opening the gate");

    let outcome = tokio::time::timeout(LIMIT, rebuilding)
        .await
        .expect("the rebuild to cut over in time")
        .expect("the rebuild's task")
        .expect("the rebuild");
    assert!(
        matches!(outcome, Outcome::CutOver(CutoverReport { new: 2, .. })),
        "{outcome:?}"
    );
    let (truth, v2) = truth_and_version(&db, 2).await;
    assert_eq!(truth.len(), 1);
    assert_eq!(truth[0][6], "3", "the write side's position reflects seq 3");
    assert_eq!(v2, truth, "v2 applied seq 3 from the tail");
    let v2 = offsets(&client, "portfolio_v2").await;
    // The mock cluster answers no lookup by time: the tail starts at the end of the log, as
    // it was when the tail was placed. A real broker gives the margin's first message, and
    // seqs 1 and 2, which the snapshot holds, are skipped below the watermark.
    let overlap = if kafka.is_external() { 2 } else { 0 };
    assert_eq!((v2.applied, v2.duplicates), (1, overlap), "{v2:?}");
}

/// Seeds `code` with `statement` as its snapshot statement, as the rebuild does.
async fn seed_with(
    db: &TestDb,
    code: &Arc<dyn Projection>,
    kafka: &Kafka,
    statement: String,
) -> Result<projector_rebuild::seed::Seeded, RebuildError> {
    projector_rebuild::seed::from_snapshot(
        &mut db.client().await,
        code,
        &statement,
        &kafka.config(&kafka.topic(TOPIC)),
        Duration::ZERO,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_statements_columns_are_read_by_name_and_a_wrong_one_is_an_error() {
    let broker = Broker::start(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let db = TestDb::new(&views()).await;
    let Feed::WriteSide(write_side) = Feed::write_side(&db).await else {
        unreachable!("a write side");
    };
    // Account 5 at seq 2: swapped, the columns would record account 2 at seq 5.
    place(
        &write_side,
        5,
        &[(Side::Buy, "1", "10"), (Side::Buy, "1", "11")],
    )
    .await;
    let code = portfolio(2);
    let statement = code
        .snapshot_sql()
        .expect("portfolio has a snapshot statement");
    let returned = "SELECT account_id, last_seq AS watermark_seq FROM account_seq";
    assert!(statement.contains(returned), "{statement}");
    let client = db.client().await;
    client
        .batch_execute(&projector_engine::projection::render(&*code, &code.ddl()))
        .await
        .expect("v2's tables");
    let seed = |sql: String| seed_with(&db, &code, &kafka, sql);

    // The documented columns, in another order: read by name, not position.
    let swapped = statement.replace(
        returned,
        "SELECT last_seq AS watermark_seq, account_id FROM account_seq",
    );
    let seeded = seed(swapped).await.expect("seeded");
    assert_eq!(seeded.accounts, 1);
    let progress: Vec<(i64, i64, Option<i64>)> = client
        .query(
            "SELECT account_id, last_seq, watermark_seq FROM projector.account_progress \
             WHERE consumer = 'portfolio_v2'",
            &[],
        )
        .await
        .expect("progress")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(progress, [(5, 2, Some(2))]);

    // A statement without them is refused in one line, not a panic; nothing is recorded.
    client
        .batch_execute("DELETE FROM projector.account_progress; TRUNCATE portfolio_v2")
        .await
        .expect("clean");
    let wrong = statement.replace(returned, "SELECT account_id, last_seq FROM account_seq");
    let error = seed(wrong).await.expect_err("no watermark_seq column");
    assert!(
        matches!(error, RebuildError::SnapshotColumns(_)),
        "{error:?}"
    );
    assert!(error.to_string().contains("watermark_seq"), "{error}");
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM projector.account_progress WHERE consumer = 'portfolio_v2'",
            &[],
        )
        .await
        .expect("progress")
        .get(0);
    assert_eq!(left, 0);

    // A rebuild whose statement has the wrong shape (here the write side's counter is not a
    // bigint) stops in one line and leaves nothing behind, as any failed snapshot does.
    client
        .batch_execute("ALTER TABLE account_seq ALTER last_seq TYPE integer")
        .await
        .expect("a counter of the wrong type");
    let error = rebuild(
        &db,
        &kafka,
        &kafka.topic(TOPIC),
        &snapshot(Cutover::Auto),
        CancellationToken::new(),
    )
    .await
    .expect_err("a snapshot of the wrong shape");
    assert!(error.to_string().contains("watermark_seq int4"), "{error}");
    assert_eq!(states(&db).await, [state(1, "live", false)]);
    assert_eq!(owned(&db, "portfolio_v2").await, nothing_owned());
    assert!(!table_exists(&db, "portfolio_v2").await);
}
