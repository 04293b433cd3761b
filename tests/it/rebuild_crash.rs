//! A rebuild in large batches (`projector rebuild --batch-messages`) killed at random moments,
//! the rebuild process with SIGKILL, PostgreSQL with an immediate stop (a crash: no checkpoint,
//! the WAL still in shared memory lost, and with it the rebuild's last commits, which
//! `synchronous_commit = off` acknowledged before they reached the WAL on disk), or both at
//! once; each time both are started again and the rebuild resumes. The new version must end
//! exactly equal to the fold of the distinct events, each applied once.
//!
//! PostgreSQL here is a private cluster of the test's own (`projector_devkit::pgcluster`): the
//! shared server the other tests use is never stopped. The reference fold runs there.

use std::time::Duration;

use crate::support::broker::{Broker, Kafka};
use crate::support::kafka::publish;
use crate::support::process::{wait_until, Projector};
use crate::support::{fills, offsets};
use projector_devkit::pgcluster::PgCluster;
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{consume, EventSpec, Lcg, Partition, TestDb};
use projector_engine::{Applier, Projection, Registry, SourceOrdering};

const TOPIC: &str = "fills";
const LOG: &str = "projector_engine::kafka=info,projector_rebuild=info,warn";
/// The rebuild's batches, and a rate (`--max-rate`) that spreads them over a few seconds:
/// whole batches still (the limit delays a batch, it does not cut it), several per partition
/// and run, so that kills land between batches and inside them however fast the machine.
const BATCH: &str = "300";
const RATE: &str = "1000";

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

fn portfolio(version: i32) -> std::sync::Arc<dyn Projection> {
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

/// Messages `portfolio_v2` has consumed (its next offsets summed; the topic starts at 0), or
/// `None` while PostgreSQL does not answer.
async fn consumed(url: &str) -> Option<i64> {
    let pool = projector_engine::db::pool(url, 1).ok()?;
    let client = pool.get().await.ok()?;
    let row = client
        .query_one(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM projector.offsets \
             WHERE consumer = 'portfolio_v2'",
            &[],
        )
        .await
        .ok()?;
    Some(row.get(0))
}

/// The portfolio rows after the distinct events were applied once each, in order, on the
/// shared server (never crashed).
async fn reference(events: &[EventSpec]) -> Vec<Vec<String>> {
    let db = TestDb::new(&views()).await;
    let applier = Applier::new(portfolio(1), SourceOrdering::PerAccount).expect("applier");
    let mut client = db.client().await;
    consume(
        &applier,
        &mut client,
        &Partition::from_events("reference", 0, events),
        500,
    )
    .await;
    dump(&client, &*portfolio(1)).await
}

/// How often a rebuild process said it found commits lost and started its tail again.
fn restarts_in(p: &mut Projector) -> usize {
    p.log_all()
        .lines()
        .filter(|l| l.contains("reading them again"))
        .count()
}

/// Where a kill lands.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// SIGKILL of the rebuild process.
    Process,
    /// An immediate stop of PostgreSQL, the process left to find out.
    Postgres,
    /// Both at once.
    Both,
}

fn args(kafka: &Kafka, url: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "rebuild",
        "portfolio",
        "--to-version",
        "2",
        "--from",
        "earliest",
        "--cutover",
        "manual",
        "--batch-messages",
        BATCH,
        "--max-rate",
        RATE,
        "--database-url",
        url,
    ]
    .map(str::to_owned)
    .into();
    args.extend(kafka.cli_flags(&kafka.topic(TOPIC)));
    args
}

#[test]
fn a_bulk_rebuild_whose_process_and_postgres_are_killed_at_random_moments_resumes_to_the_fold() {
    let Some(bin) = PgCluster::find_binaries() else {
        panic!("PostgreSQL's server binaries (.ci/setup installs them)");
    };
    let rt = runtime();
    let cluster = PgCluster::start(&bin).expect("a private cluster");
    let url = cluster.url("projector");
    rt.block_on(async {
        let admin = projector_engine::db::pool(&cluster.url("postgres"), 1).expect("url");
        admin
            .get()
            .await
            .expect("connect")
            .batch_execute("CREATE DATABASE projector")
            .await
            .expect("create database");
        // The WAL writer writes what asynchronous commits left in shared memory every
        // `wal_writer_delay`: at 10 s (its maximum, 200 ms by default), a crash loses every
        // commit of the seconds before it, not only those of the last moment.
        let client = admin.get().await.expect("connect");
        for statement in [
            "ALTER SYSTEM SET wal_writer_delay = '10s'",
            "SELECT pg_reload_conf()",
        ] {
            client
                .batch_execute(statement)
                .await
                .expect("a lazy WAL writer");
        }
        let pool = projector_engine::db::pool(&url, 1).expect("url");
        let mut client = pool.get().await.expect("connect");
        projector_engine::schema::migrate(&mut client, &views())
            .await
            .expect("migrate");
    });
    let broker = Broker::start(&[(TOPIC, 4)]);
    let kafka = broker.kafka();
    let args = args(&kafka, &url);

    // Published in chunks, the next one whenever the rebuild comes near the end, so that
    // every kill lands mid-stream however fast this machine applies.
    let events = fills(40, 100);
    let mut chunks = events.chunks(1_000);
    let mut published: Vec<EventSpec> = Vec::new();
    let mut stream_len = 0i64;
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

    let v2 = || rt.block_on(consumed(&url));
    let mut rng = Lcg(0xb01c_c4a5);
    let kills = [
        Kill::Both,
        Kill::Postgres,
        Kill::Process,
        Kill::Both,
        Kill::Postgres,
        Kill::Both,
    ];
    let mut process: Option<Projector> = None;
    let mut lost = 0i64;
    let mut restarts = 0usize;
    for (n, kill) in kills.iter().enumerate() {
        if v2().unwrap_or(0) + 1_500 >= stream_len {
            publish_next(&mut published, &mut stream_len);
        }
        let before = v2().expect("PostgreSQL is up");
        if before >= stream_len {
            break; // nothing left to be killed in the middle of
        }
        // A process that PostgreSQL's crash ended (or that was killed) is started again;
        // one that rode the crash out goes on.
        if process.as_mut().is_none_or(|p| p.exited().is_some()) {
            restarts += process.as_mut().map_or(0, restarts_in);
            process = Some(Projector::spawn(&args, LOG));
        }
        let p = process.as_mut().expect("a process");
        wait_until(
            &format!("progress before kill {n} ({kill:?})"),
            &mut [&mut *p],
            || v2().unwrap_or(0),
            |now| *now > before,
        );
        // A random while longer: the kill lands anywhere in the tail, a batch's statement
        // or its commit included.
        std::thread::sleep(Duration::from_millis(rng.below(400) as u64));
        let seen = v2().unwrap_or(0);
        match kill {
            Kill::Process => {
                restarts += restarts_in(p);
                p.kill();
                process = None;
            }
            Kill::Postgres => cluster.crash().expect("crash PostgreSQL"),
            // (The process may outlive it, or end on the error of a tick that met the outage.)
            Kill::Both => {
                restarts += restarts_in(p);
                p.kill();
                process = None;
                cluster.crash().expect("crash PostgreSQL");
            }
        }
        if !matches!(kill, Kill::Process) {
            cluster.restart().expect("restart PostgreSQL");
            // Commits acknowledged but not yet in the WAL on disk are gone: the rebuild
            // resumes from what survived.
            let after = v2().expect("PostgreSQL is up again");
            lost += (seen - after).max(0);
            eprintln!("kill {n} ({kill:?}): {seen} of {stream_len} consumed before, {after} after");
        } else {
            eprintln!("kill {n} ({kill:?}): {seen} of {stream_len} consumed before");
        }
    }
    while publish_next(&mut published, &mut stream_len) {}

    if process.as_mut().is_none_or(|p| p.exited().is_some()) {
        process = Some(Projector::spawn(&args, LOG));
    }
    let p = process.as_mut().expect("a process");
    wait_until(
        "the end of the log",
        &mut [&mut *p],
        || v2().unwrap_or(0),
        |n| *n >= stream_len,
    );
    restarts += restarts_in(p);
    p.kill();
    eprintln!(
        "messages whose commit a crash of PostgreSQL undid, applied again: {lost}; \
         tails started again on finding commits lost: {restarts}"
    );

    let (rows, o, inbox, troubles) = rt.block_on(async {
        let pool = projector_engine::db::pool(&url, 1).expect("url");
        let client = pool.get().await.expect("connect");
        let rows = dump(&client, &*portfolio(2)).await;
        let o = offsets(&client, "portfolio_v2").await;
        let inbox: i64 = client
            .query_one(
                "SELECT count(*) FROM projector.inbox WHERE consumer = 'portfolio_v2'",
                &[],
            )
            .await
            .expect("inbox")
            .get(0);
        let troubles: i64 = client
            .query_one(
                "SELECT (SELECT count(*) FROM projector.dead_letters WHERE consumer = 'portfolio_v2') \
                      + (SELECT count(*) FROM projector.parked_accounts WHERE consumer = 'portfolio_v2')",
                &[],
            )
            .await
            .expect("dead letters and parks")
            .get(0);
        (rows, o, inbox, troubles)
    });
    eprintln!(
        "offsets {:?}, applied {}, duplicates {}, ignored {}, inbox {inbox}, dead letters and parks {troubles}",
        o.next, o.applied, o.duplicates, o.ignored
    );
    let expected = rt.block_on(reference(&published));
    // `PROJECTOR_KEEP_CLUSTER=1`: a failing run leaves its cluster behind, to be looked at.
    if rows != expected && std::env::var_os("PROJECTOR_KEEP_CLUSTER").is_some() {
        eprintln!("cluster kept for a look: {url}");
        std::mem::forget(cluster);
    }
    assert_eq!(rows, expected);
    assert_eq!(o.next.values().sum::<i64>(), stream_len, "every offset");
    assert_eq!(o.applied, published.len() as i64, "each event applied once");
    assert_eq!(o.duplicates, stream_len - published.len() as i64);
    assert_eq!(inbox, published.len() as i64, "one inbox row per event");
    assert_eq!(troubles, 0, "no dead letter, no parked account");
}

/// Not a test of behaviour: the apply path's rate at a rebuild's batch sizes, on the same
/// events in one process (no Kafka: one partition consumed by `testkit::consume`, as the
/// tail's source hands batches over), each size twice and interleaved, each run in a fresh
/// database with `synchronous_commit = off` as a rebuild's sessions have it. Run by hand:
/// `cargo test --test it rebuild_crash::batch_sizes -- --ignored --nocapture`;
/// docs/benchmarks.md ("Rebuild") has its figures. It checks only that every size folds the
/// same rows.
#[test]
#[ignore = "a measurement, run by hand"]
fn batch_sizes_fold_the_same_rows_and_their_rates_are_printed() {
    let rt = runtime();
    // The bench's shape: 1,000 accounts, each account's events spread over the log.
    let events = fills(1_000, 30);
    let partition = Partition::from_events("sizes", 0, &events);
    let mut first: Option<Vec<Vec<String>>> = None;
    for round in 0..2 {
        for size in [2_000usize, 10_000, 30_000] {
            let (rows, elapsed) = rt.block_on(async {
                let db = TestDb::new(&views()).await;
                let applier =
                    Applier::new(portfolio(1), SourceOrdering::PerAccount).expect("applier");
                let mut client = db.client().await;
                client
                    .batch_execute("SET synchronous_commit = off")
                    .await
                    .expect("set");
                let started = std::time::Instant::now();
                let cpu = own_cpu_ticks();
                consume(&applier, &mut client, &partition, size).await;
                let (elapsed, cpu) = (started.elapsed(), own_cpu_ticks() - cpu);
                (dump(&client, &*portfolio(1)).await, (elapsed, cpu))
            });
            let (elapsed, cpu) = elapsed;
            let per_s = events.len() as u128 * 1_000 / elapsed.as_millis().max(1);
            eprintln!(
                "round {round}: batches of {size}: {} events in {} ms, {per_s} events/s; this process's CPU {} ticks (of 100 a second)",
                events.len(),
                elapsed.as_millis(),
                cpu
            );
            match &first {
                None => first = Some(rows),
                Some(f) => assert_eq!(&rows, f, "batches of {size} fold other rows"),
            }
        }
    }
}

/// This process's user and system CPU time in clock ticks (`/proc/self/stat`; 0 elsewhere):
/// what the engine's own code (a debug build here) spent, beside PostgreSQL's.
fn own_cpu_ticks() -> i64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<i64>().ok());
    field(14).unwrap_or(0) + field(15).unwrap_or(0)
}
