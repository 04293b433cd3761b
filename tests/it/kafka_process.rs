//! `projector run` as a real process: killed with SIGKILL at random moments, scaled out to
//! two processes, stopped with SIGTERM, and refusing bad configuration in one line.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::fills;
use crate::support::kafka::publish;
use crate::support::process::{run_to_end, Projector};
use projector_devkit::devbroker::DevBroker;
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

fn run_args<'a>(bootstrap: &'a str, url: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--brokers",
        bootstrap,
        "--topic",
        "fills",
        "--views",
        "portfolio",
        "--database-url",
        url,
        "--max-batch-messages",
        "200",
        "-X",
        "session.timeout.ms=3000",
        "-X",
        "heartbeat.interval.ms=300",
    ]
}

const COMMITS: &str = "projector_engine::apply=debug,projector_engine::kafka=info,warn";

fn is_commit(line: &str) -> bool {
    line.contains("batch committed")
}

#[test]
fn sigkill_at_random_moments_loses_nothing_and_applies_nothing_twice() {
    let rt = runtime();
    let broker = DevBroker::start(1, &[("fills", 4)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(100, 300);
    // One event in twenty is delivered twice.
    let mut stream = events.clone();
    stream.extend(events.iter().step_by(20).cloned());
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    rt.block_on(publish(&bootstrap, "fills", &stream));
    let total = stream.len() as i64;

    let mut rng = Lcg(0xdead_beef);
    let mut kills = 0;
    while kills < 25 {
        let mut p = Projector::spawn(&run_args(&bootstrap, db.url()), COMMITS);
        p.wait_for("a committed batch", LIMIT, is_commit);
        // Let it run a random while longer: the kill lands anywhere in the apply path.
        std::thread::sleep(Duration::from_millis(rng.below(150) as u64));
        p.kill();
        kills += 1;
        if rt.block_on(committed(&db)).0 >= total {
            break;
        }
    }
    assert!(
        kills >= 20,
        "only {kills} kills before the stream ended; make it longer"
    );

    let mut last = Projector::spawn(&run_args(&bootstrap, db.url()), COMMITS);
    last.wait_for("start-up", LIMIT, |l| l.contains("projector: consuming"));
    while rt.block_on(committed(&db)).0 < total {
        last.wait_for("more commits", LIMIT, is_commit);
    }
    last.signal("TERM");
    let status = last.wait_exit(LIMIT);
    assert!(
        status.success(),
        "SIGTERM exits 0, got {status}; log:\n{}",
        last.seen.join("\n")
    );

    assert_eq!(
        rt.block_on(view_rows(&db)),
        rt.block_on(reference_rows(&events))
    );
    let (next, applied, duplicates) = rt.block_on(committed(&db));
    assert_eq!(next, total, "every offset committed");
    // Fills create or update one position row each: every distinct event applied once.
    assert_eq!(applied, events.len() as i64);
    assert_eq!(
        duplicates,
        (stream.len() - events.len()) as i64,
        "the duplicates dropped are counted"
    );
    eprintln!("survived {kills} SIGKILLs");
}

fn assignment(p: &mut Projector, owned: &mut BTreeSet<i32>) {
    for line in p.drain() {
        apply_assignment_line(&line, owned);
    }
}

fn apply_assignment_line(line: &str, owned: &mut BTreeSet<i32>) {
    let parse = |l: &str| -> Vec<i32> {
        l.split("partitions=[")
            .nth(1)
            .and_then(|r| r.split(']').next())
            .map(|list| {
                list.split(',')
                    .filter_map(|x| x.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    if line.contains("partitions assigned") {
        owned.extend(parse(line));
    } else if line.contains("partitions revoked") {
        for p in parse(line) {
            owned.remove(&p);
        }
    }
}

#[test]
fn two_processes_split_the_partitions_and_one_takes_over_when_the_other_dies() {
    let rt = runtime();
    let broker = DevBroker::start(1, &[("fills", 6)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(80, 120);
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    let total = events.len() as i64;
    let log = COMMITS;

    let mut a = Projector::spawn(&run_args(&bootstrap, db.url()), log);
    let mut a_owns = BTreeSet::new();
    let line = a.wait_for("a's first assignment", LIMIT, |l| {
        l.contains("partitions assigned")
    });
    apply_assignment_line(&line, &mut a_owns);
    let mut b = Projector::spawn(&run_args(&bootstrap, db.url()), log);
    let mut b_owns = BTreeSet::new();
    let line = b.wait_for("b's first assignment", LIMIT, |l| {
        l.contains("partitions assigned")
    });
    apply_assignment_line(&line, &mut b_owns);
    // a gives partitions up to b (cooperative: only the moved ones are revoked, and b's
    // first assignment may be empty).
    loop {
        assignment(&mut a, &mut a_owns);
        if !b_owns.is_empty() && a_owns.len() + b_owns.len() == 6 && a_owns.is_disjoint(&b_owns) {
            break;
        }
        let line = b.wait_for("b to get partitions", LIMIT, |l| {
            l.contains("partitions assigned") && !l.contains("partitions=[]")
        });
        apply_assignment_line(&line, &mut b_owns);
    }
    assert!(
        !a_owns.is_empty() && !b_owns.is_empty(),
        "both processes own partitions: {a_owns:?} {b_owns:?}"
    );

    eprintln!("a owns {a_owns:?}, b owns {b_owns:?}");
    rt.block_on(publish(&bootstrap, "fills", &events));
    // a dies without a word; b takes every partition.
    a.kill();
    while b_owns.len() != 6 {
        let line = b.wait_for("b to take every partition", LIMIT, |l| {
            l.contains("partitions")
        });
        apply_assignment_line(&line, &mut b_owns);
    }
    while rt.block_on(committed(&db)).0 < total {
        b.wait_for("b to commit", LIMIT, |l| {
            l.contains("batch committed") || l.contains("partitions")
        });
    }
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
