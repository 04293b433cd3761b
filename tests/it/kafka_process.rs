//! `projector run` as a real process: killed with SIGKILL at random moments, scaled out to
//! two processes, stopped with SIGTERM, and refusing bad configuration in one line.

use std::time::Duration;

use crate::support::broker::Broker;
use crate::support::fills;
use crate::support::kafka::publish;
use crate::support::process::{run_to_end, wait_until, Projector};
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{consume, EventSpec, Lcg, Partition, TestDb};
use projector_engine::{Applier, SourceOrdering};

const LIMIT: Duration = Duration::from_secs(120);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The portfolio rows of the distinct events applied once each, in a database of their own.
async fn reference_rows(events: &[EventSpec]) -> Vec<Vec<String>> {
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    let view = registry
        .select(&["portfolio".to_owned()])
        .expect("portfolio")[0]
        .clone();
    let applier = Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier");
    let mut client = db.client().await;
    consume(
        &applier,
        &mut client,
        &Partition::from_events("reference", 0, events),
        500,
    )
    .await;
    dump(&client, &*view).await
}

async fn view_rows(db: &TestDb) -> Vec<Vec<String>> {
    let registry = projector_views::registry().expect("registry");
    let view = registry
        .select(&["portfolio".to_owned()])
        .expect("portfolio")[0]
        .clone();
    dump(&db.client().await, &*view).await
}

async fn committed(db: &TestDb) -> (i64, i64, i64) {
    let r = db
        .client()
        .await
        .query_one(
            "SELECT coalesce(sum(next_offset), 0)::bigint, coalesce(sum(applied), 0)::bigint, \
             coalesce(sum(duplicates), 0)::bigint FROM projector.offsets WHERE consumer = 'portfolio_v1'",
            &[],
        )
        .await
        .expect("offsets");
    (r.get(0), r.get(1), r.get(2))
}

/// Which process committed each partition last: (partition, `committed_by`).
async fn owners(db: &TestDb) -> Vec<(i32, Option<String>)> {
    db.client()
        .await
        .query(
            "SELECT partition, committed_by FROM projector.offsets \
             WHERE consumer = 'portfolio_v1' ORDER BY partition",
            &[],
        )
        .await
        .expect("owners")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The name a process without `--instance-id` commits under.
fn owner_of(p: &Projector) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", p.pid())
}

fn run_args(broker: &Broker, url: &str) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--views", "portfolio", "--database-url", url]
        .map(str::to_owned)
        .into();
    args.extend(broker.cli_flags(&broker.topic("fills")));
    args.extend(
        [
            "--max-batch-messages",
            "200",
            // Two processes on one host: each serves /metrics on a port of its own.
            "--metrics-addr",
            "127.0.0.1:0",
        ]
        .map(str::to_owned),
    );
    args
}

const LOG: &str = "projector_engine::kafka=info,warn";

#[test]
fn sigkill_at_random_moments_loses_nothing_and_applies_nothing_twice() {
    let rt = runtime();
    let broker = Broker::start(&[("fills", 4)]);
    let bootstrap = broker.bootstrap_servers();
    let topic = broker.topic("fills");
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    let args = run_args(&broker, db.url());
    // The stream is published in chunks, the next one whenever the processes come near the
    // end, so that every kill lands mid-stream however fast this machine applies. Each restart
    // waits out the killed member's session (3 s), so twelve kills cost about a minute.
    let events = fills(100, 900);
    let chunks: Vec<&[EventSpec]> = events.chunks(3_000).collect();
    let mut published: Vec<EventSpec> = Vec::new();
    let mut stream_len = 0i64;
    let mut next_chunk = 0;
    let mut publish_next = |published: &mut Vec<EventSpec>, stream_len: &mut i64| {
        let chunk = chunks[next_chunk];
        next_chunk += 1;
        // One event in twenty is delivered twice.
        let mut stream = chunk.to_vec();
        stream.extend(chunk.iter().step_by(20).cloned());
        rt.block_on(publish(&bootstrap, &topic, &stream));
        published.extend_from_slice(chunk);
        *stream_len += stream.len() as i64;
    };
    publish_next(&mut published, &mut stream_len);

    let mut rng = Lcg(0xdead_beef);
    for kill in 0..12 {
        if rt.block_on(committed(&db)).0 + 1_000 >= stream_len {
            publish_next(&mut published, &mut stream_len);
        }
        let before = rt.block_on(committed(&db)).0;
        let mut p = Projector::spawn(&args, LOG);
        wait_until(
            &format!("a commit after restart {kill}"),
            &mut [&mut p],
            || rt.block_on(committed(&db)).0,
            |now| *now > before,
        );
        // A random while longer: the kill lands anywhere in the apply path.
        std::thread::sleep(Duration::from_millis(rng.below(150) as u64));
        p.kill();
    }

    let mut last = Projector::spawn(&args, LOG);
    wait_until(
        "the last process to reach the end",
        &mut [&mut last],
        || rt.block_on(committed(&db)).0,
        |now| *now >= stream_len,
    );
    last.signal("TERM");
    let status = last.wait_exit(LIMIT);
    assert!(
        status.success(),
        "SIGTERM exits 0, got {status}; log:\n{}",
        last.log()
    );

    assert_eq!(
        rt.block_on(view_rows(&db)),
        rt.block_on(reference_rows(&published))
    );
    let (next, applied, duplicates) = rt.block_on(committed(&db));
    assert_eq!(next, stream_len, "every offset committed");
    // Fills create or update one position row each: every distinct event applied once.
    assert_eq!(applied, published.len() as i64);
    assert_eq!(
        duplicates,
        stream_len - published.len() as i64,
        "the duplicates dropped are counted"
    );
}

#[test]
fn two_processes_split_the_partitions_and_one_takes_over_when_the_other_dies() {
    let rt = runtime();
    let broker = Broker::start(&[("fills", 6)]);
    let bootstrap = broker.bootstrap_servers();
    let topic = broker.topic("fills");
    let events = fills(80, 120);
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    let args = run_args(&broker, db.url());
    let mut chunks = events.chunks(240);

    let mut a = Projector::spawn(&args, LOG);
    let mut b = Projector::spawn(&args, LOG);
    let (a_name, b_name) = (owner_of(&a), owner_of(&b));
    // Events keep coming until both processes have committed partitions of their own.
    let mut published = 0i64;
    let split = wait_until(
        "both processes to own partitions",
        &mut [&mut a, &mut b],
        || {
            if rt.block_on(committed(&db)).0 >= published {
                if let Some(chunk) = chunks.next() {
                    rt.block_on(publish(&bootstrap, &topic, chunk));
                    published += chunk.len() as i64;
                }
            }
            rt.block_on(owners(&db))
        },
        |owners| {
            let by = |name: &str| owners.iter().any(|(_, o)| o.as_deref() == Some(name));
            owners.len() == 6 && by(&a_name) && by(&b_name)
        },
    );
    eprintln!("split: {split:?}");

    // a dies without a word; b takes every partition.
    a.kill();
    for chunk in chunks {
        rt.block_on(publish(&bootstrap, &topic, chunk));
    }
    let total = events.len() as i64;
    wait_until(
        "b to commit every partition to the end",
        &mut [&mut b],
        || (rt.block_on(committed(&db)).0, rt.block_on(owners(&db))),
        |(next, owners)| {
            *next >= total
                && owners
                    .iter()
                    .all(|(_, o)| o.as_deref() == Some(b_name.as_str()))
        },
    );
    b.signal("INT");
    assert!(b.wait_exit(LIMIT).success(), "SIGINT exits 0");
    assert_eq!(
        rt.block_on(view_rows(&db)),
        rt.block_on(reference_rows(&events))
    );
    assert_eq!(rt.block_on(committed(&db)).1, total);
}

#[test]
fn bad_configuration_is_refused_in_one_line() {
    let dir = std::env::temp_dir().join(format!("projector-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "brokers = \"b:9092\"\ntopic = \"t\"\nbrokres = \"typo\"\n",
    )
    .expect("write");
    let file = file.to_string_lossy().into_owned();
    let cases: [(&[&str], &str); 4] = [
        (&["run", "--topic", "t"], "no Kafka brokers"),
        (
            &[
                "run",
                "--brokers",
                "b:9092",
                "--topic",
                "t",
                "-X",
                "novalue",
            ],
            "key=value",
        ),
        (&["run", "--config", &file], "unknown field `brokres`"),
        (
            &[
                "run",
                "--brokers",
                "b:9092",
                "--topic",
                "t",
                "--views",
                "nosuch",
            ],
            "no view named \"nosuch\"",
        ),
    ];
    for (args, needle) in cases {
        let (status, stderr) = run_to_end(args);
        assert!(!status.success(), "{args:?} must fail");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line, got:\n{stderr}");
        assert!(lines[0].contains(needle), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
