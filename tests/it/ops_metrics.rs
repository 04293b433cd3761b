//! `projector run`'s endpoint, scraped over HTTP while the engine runs: the lag, duplicate
//! and dead-letter series hold what the engine counted in PostgreSQL and what the broker
//! holds; `/health` turns unhealthy when the view stops committing while input waits, and
//! healthy again when it catches up. Also: the Grafana dashboard uses only series that exist.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::broker::Broker;
use crate::support::kafka::{publish, publish_raw};
use crate::support::process::{http_get as get, Projector};
use crate::support::{fills, offsets};
use projector_engine::testkit::{fill, EventSpec, TestDb};

const LIMIT: Duration = Duration::from_secs(120);

/// One sample: name, labels, value (integers only: counters and these gauges are whole).
type Sample = (String, BTreeMap<String, String>, i64);

/// Parses the Prometheus text format (label values here hold no commas or quotes).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value: i64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let labels = rest
                        .trim_end_matches('}')
                        .split(',')
                        .filter_map(|kv| {
                            let (k, v) = kv.split_once('=')?;
                            Some((k.to_owned(), v.trim_matches('"').to_owned()))
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
                None => (series.to_owned(), BTreeMap::new()),
            };
            Some((name, labels, value))
        })
        .collect()
}

/// The sum of a series over the samples whose labels include `with`.
fn sum(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> Option<i64> {
    let matching: Vec<i64> = samples
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

fn wait<T: std::fmt::Debug>(
    what: &str,
    p: &mut Projector,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + LIMIT;
    loop {
        let seen = probe();
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: last seen {seen:?}; log:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

const C: &str = "portfolio_v1";

/// `projector run` on portfolio, its endpoint on a free port, refreshed five times a second.
fn run_args(broker: &Broker, url: &str) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--views", "portfolio", "--database-url", url]
        .map(str::to_owned)
        .into();
    args.extend(broker.cli_flags(&broker.topic("fills")));
    args.extend(
        [
            "--metrics-addr",
            "127.0.0.1:0",
            "--monitor-interval",
            "200ms",
            "--stall-after",
            "2s",
        ]
        .map(str::to_owned),
    );
    args
}

/// The address the process says its endpoint is bound to.
fn endpoint(p: &mut Projector) -> String {
    let line = p.wait_for("the endpoint's address", LIMIT, |l| {
        l.contains("metrics on http://")
    });
    line.split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("address")
        .to_owned()
}

/// `--metrics-addr 127.0.0.1:0` lets several processes share a host: each binds a free port
/// and says which, and each serves its own /health there.
#[test]
fn two_processes_on_port_zero_each_serve_health_on_a_port_of_their_own() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = Broker::start(&[("fills", 2)]);
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));
    rt.block_on(publish(
        &broker.bootstrap_servers(),
        &broker.topic("fills"),
        &fills(4, 5),
    ));
    let args = run_args(&broker, db.url());
    let mut a = Projector::spawn(&args, "warn");
    let mut b = Projector::spawn(&args, "warn");
    let (at_a, at_b) = (endpoint(&mut a), endpoint(&mut b));
    let port = |addr: &str| -> u16 {
        let port = addr.rsplit_once(':').map(|(_, p)| p);
        port.and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("a port in {addr:?}"))
    };
    assert!(
        port(&at_a) != 0 && port(&at_b) != 0,
        "the bound ports: {at_a}, {at_b}"
    );
    assert_ne!(at_a, at_b, "each process has a port of its own");
    for (addr, p) in [(&at_a, &mut a), (&at_b, &mut b)] {
        let (code, body) = wait(
            "the process's /health to answer healthy",
            p,
            || get(addr, "/health"),
            |(code, _)| *code == 200,
        );
        assert!(body.contains("\"healthy\":true"), "{addr}: {code} {body}");
    }
    for p in [&mut a, &mut b] {
        p.signal("TERM");
        assert!(p.wait_exit(LIMIT).success(), "SIGTERM exits 0");
    }
}

#[test]
fn the_endpoint_shows_the_engines_counts_and_health_follows_progress() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = Broker::start(&[("fills", 2)]);
    let bootstrap = broker.bootstrap_servers();
    let topic = broker.topic("fills");
    let db = rt.block_on(TestDb::new(&projector_views::registry().expect("registry")));

    // 200 fills, 14 of them delivered twice, and 2 poison messages.
    let events = fills(20, 10);
    let again: Vec<EventSpec> = events.iter().step_by(15).cloned().collect();
    let mut published = 0i64;
    for part in [&events, &again] {
        rt.block_on(publish(&bootstrap, &topic, part));
        published += part.len() as i64;
    }
    let poison = vec![(Some(b"5".to_vec()), b"{not json".to_vec()); 2];
    rt.block_on(publish_raw(&bootstrap, &topic, &poison));
    published += 2;

    let mut p = Projector::spawn(&run_args(&broker, db.url()), "warn");
    let addr = endpoint(&mut p);

    // Caught up: every message committed in PostgreSQL.
    let counted = wait(
        "every message committed",
        &mut p,
        || rt.block_on(async { offsets(&db.client().await, C).await }),
        |o| o.next.values().sum::<i64>() == published,
    );
    assert_eq!(
        (counted.applied, counted.duplicates, counted.dead_lettered),
        (200, 14, 2)
    );

    // The scrape holds the same numbers, and zero lag on both partitions.
    let samples = wait(
        "the scrape to show the caught-up state",
        &mut p,
        || parse(&get(&addr, "/metrics").1),
        |s| {
            sum(
                s,
                "projector_lag_messages",
                &[("consumer", C), ("partition", "0")],
            ) == Some(0)
                && sum(
                    s,
                    "projector_lag_messages",
                    &[("consumer", C), ("partition", "1")],
                ) == Some(0)
                && sum(s, "projector_events_applied_total", &[("consumer", C)]) == Some(200)
        },
    );
    assert_eq!(
        sum(&samples, "projector_duplicates_total", &[("consumer", C)]),
        Some(counted.duplicates)
    );
    assert_eq!(
        sum(
            &samples,
            "projector_duplicates_total",
            &[("consumer", C), ("kind", "seq")]
        ),
        Some(14),
        "republished events of an ordered view are caught by their seq"
    );
    assert_eq!(
        sum(
            &samples,
            "projector_dead_letters_total",
            &[("consumer", C), ("kind", "poison")]
        ),
        Some(counted.dead_lettered)
    );
    assert_eq!(
        sum(
            &samples,
            "projector_dead_letters_open",
            &[("consumer", C), ("kind", "poison")]
        ),
        Some(2)
    );
    assert_eq!(
        sum(&samples, "projector_lag_seconds", &[("consumer", C)]),
        Some(0)
    );
    assert_eq!(sum(&samples, "projector_healthy", &[]), Some(1));
    let text = get(&addr, "/metrics").1;
    assert!(
        text.contains("projector_batch_seconds_bucket{"),
        "batch latency is a histogram"
    );
    let (code, body) = get(&addr, "/health");
    assert_eq!(code, 200, "{body}");

    // The view stops committing (its offsets are locked) while 30 new events arrive: the lag
    // gauges show exactly them, and once they have waited --stall-after, /health pages.
    let locker = rt.block_on(db.client());
    rt.block_on(locker.batch_execute("BEGIN; LOCK TABLE projector.offsets IN EXCLUSIVE MODE"))
        .expect("lock");
    let more: Vec<EventSpec> = (21..=50)
        .map(|a| {
            fill(
                a,
                1,
                "2026-11-29T11:00:00Z",
                "GBPUSD",
                "sell",
                "3",
                "1.25",
                "0",
            )
        })
        .collect();
    let landed = rt.block_on(publish(&bootstrap, &topic, &more));
    let (code, body) = wait(
        "/health to page",
        &mut p,
        || get(&addr, "/health"),
        |(c, _)| *c == 503,
    );
    assert!(body.contains("\"kind\":\"stalled\""), "{body}");
    // The page may come from a snapshot taken while the last of them were still being sent
    // (they wait 2 s from the first): the gauges show every one of them at the latest in the
    // snapshot after.
    let lag_of = |samples: &[Sample], partition: &i32| {
        let label = partition.to_string();
        sum(
            samples,
            "projector_lag_messages",
            &[("consumer", C), ("partition", &label)],
        )
    };
    let samples = wait(
        "the lag gauges to show the new events",
        &mut p,
        || parse(&get(&addr, "/metrics").1),
        |s| {
            landed
                .iter()
                .all(|(partition, n)| lag_of(&s[..], partition) >= Some(*n as i64))
        },
    );
    for (partition, n) in &landed {
        assert_eq!(
            lag_of(&samples[..], partition),
            Some(*n as i64),
            "partition {partition}"
        );
    }
    assert_eq!(sum(&samples, "projector_healthy", &[]), Some(0));
    assert_eq!(code, 503);

    // Released: it catches up and is healthy again.
    rt.block_on(locker.batch_execute("ROLLBACK"))
        .expect("unlock");
    wait(
        "/health to recover",
        &mut p,
        || get(&addr, "/health").0,
        |c| *c == 200,
    );
    let samples = parse(&get(&addr, "/metrics").1);
    assert_eq!(
        sum(
            &samples,
            "projector_events_applied_total",
            &[("consumer", C)]
        ),
        Some(230)
    );

    // Every series the Grafana dashboard queries exists.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/grafana-dashboard.json"
        ))
        .expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 8, "{exprs:?}");
    let text = get(&addr, "/metrics").1;
    for expr in &exprs {
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|t| t.starts_with("projector_"))
        {
            assert!(
                text.contains(name),
                "the dashboard queries {name}, which is not exported"
            );
        }
    }

    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).success(), "SIGTERM exits 0");
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| collect_exprs(i, out)),
        _ => {}
    }
}
