//! The write side's quote gate on the real UDP path: the built-in feed, a UDP proxy between it
//! and the gate that loses a burst of one symbol's datagrams (or ages their source times) on
//! the test's word, and orders through the intake against real PostgreSQL. An order is refused
//! while the quote is suspect, silent or old at the source, with the reason stored as the
//! key's reply and nothing else written; a retry gets the same refusal even after the feed has
//! healed; once it heals (a snapshot for a delta feed, the next tick for a full one), orders
//! are accepted again. Every wait is on the gate's own signal (a datagram that changed it, or
//! the instant a threshold is crossed), never a sleep.

use std::net::SocketAddr;
use std::process::Command as Process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use projector_devkit::writeside::quotes::wire::Datagram;
use projector_devkit::writeside::quotes::{
    Awaited, Feed, FeedConfig, FeedMode, FeedStats, FeedSymbol, Limits, QuoteGate, Quotes,
    ReceiverConfig, Refusal,
};
use projector_devkit::writeside::{Order, OrderRefused, Outcome, Side, WriteSide, WriteSideError};
use projector_engine::testkit::TestDb;
use projector_engine::Registry;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// The symbol whose datagrams the proxy loses.
const HIT: &str = "EURUSD";
/// Longest a test waits for the gate to change; it fails then.
const WAIT: Duration = Duration::from_secs(60);
/// The gate's thresholds in these tests: a second of silence, two at the source. Wide, so that
/// a busy machine does not make a quote stale between a wait and the order after it.
const LIMITS: Limits = Limits {
    stale_after_ms: 1000,
    source_stale_after_ms: 2000,
};

/// What the proxy does to the datagrams of [`HIT`] on their way from the feed to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Forwards everything.
    Pass,
    /// Loses ticks and snapshots; heartbeats get through and show the gap.
    LoseTicks,
    /// Loses ticks, snapshots and heartbeats: silence.
    LoseAll,
    /// Forwards ticks with their source time moved this many ms back: a lagging provider.
    AgeSource(i64),
}

/// A UDP proxy between the feed and the gate: the gate sends to [`UdpProxy::addr`], which
/// forwards to the feed from a socket of its own, and forwards what the feed answers back,
/// through [`Path`].
struct UdpProxy {
    addr: SocketAddr,
    path: Arc<Mutex<Path>>,
    /// Ticks of [`HIT`] the proxy lost.
    lost_ticks: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl UdpProxy {
    async fn start(feed: SocketAddr) -> Self {
        let gate_side = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
        let feed_side = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
        let addr = gate_side.local_addr().expect("address");
        let gate_addr: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let path = Arc::new(Mutex::new(Path::Pass));
        let lost_ticks = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        {
            let (gate_side, feed_side, gate_addr, stop) = (
                gate_side.clone(),
                feed_side.clone(),
                gate_addr.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut buf = vec![0u8; 2048];
                loop {
                    let (n, from) = tokio::select! {
                        () = stop.cancelled() => return,
                        r = gate_side.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
                    };
                    *gate_addr.lock().expect("lock") = Some(from);
                    let _ = feed_side.send_to(&buf[..n], feed).await;
                }
            });
        }
        {
            let (path, lost_ticks, stop) = (path.clone(), lost_ticks.clone(), stop.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 2048];
                loop {
                    let n = tokio::select! {
                        () = stop.cancelled() => return,
                        r = feed_side.recv_from(&mut buf) => match r { Ok((n, _)) => n, Err(_) => continue },
                    };
                    let Some(to) = *gate_addr.lock().expect("lock") else {
                        continue;
                    };
                    let datagram = Datagram::decode(&buf[..n]).expect("the feed sends datagrams");
                    let now = *path.lock().expect("lock");
                    let forwarded = match (&datagram, now) {
                        (d, _) if d.symbol() != Some(HIT) => Some(buf[..n].to_vec()),
                        (_, Path::Pass) => Some(buf[..n].to_vec()),
                        (Datagram::Heartbeat { .. }, Path::LoseTicks) => Some(buf[..n].to_vec()),
                        (Datagram::Tick { .. }, Path::LoseTicks | Path::LoseAll) => {
                            lost_ticks.fetch_add(1, Ordering::SeqCst);
                            None
                        }
                        (_, Path::LoseTicks | Path::LoseAll) => None,
                        (
                            Datagram::Tick {
                                symbol,
                                seq,
                                bid,
                                ask,
                                source_ms,
                            },
                            Path::AgeSource(ms),
                        ) => Some(
                            Datagram::Tick {
                                symbol: symbol.clone(),
                                seq: *seq,
                                bid: *bid,
                                ask: *ask,
                                source_ms: source_ms - ms,
                            }
                            .encode(),
                        ),
                        (_, Path::AgeSource(_)) => Some(buf[..n].to_vec()),
                    };
                    if let Some(bytes) = forwarded {
                        let _ = gate_side.send_to(&bytes, to).await;
                    }
                }
            });
        }
        Self {
            addr,
            path,
            lost_ticks,
            stop,
        }
    }

    fn set(&self, path: Path) {
        *self.path.lock().expect("lock") = path;
    }
}

impl Drop for UdpProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The built-in feed with no faults of its own (the proxy makes them), fast, its clock 2.5 s
/// behind ours; the proxy in front of it; the gate's receiver reading the proxy.
struct Rig {
    feed: Arc<FeedStats>,
    feed_stop: CancellationToken,
    proxy: UdpProxy,
    quotes: Quotes,
}

impl Rig {
    async fn start(mode: FeedMode) -> Self {
        let config = FeedConfig {
            mode,
            ticks_per_second: 20,
            heartbeat: Duration::from_millis(50),
            snapshot_delay: Duration::from_millis(50),
            ..FeedConfig::faultless(FeedSymbol::traded())
        };
        let feed = Feed::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config.clone())
            .await
            .expect("feed");
        let proxy = UdpProxy::start(feed.local_addr()).await;
        let stats = feed.stats();
        let feed_stop = CancellationToken::new();
        {
            let stop = feed_stop.clone();
            tokio::spawn(async move { feed.run(stop).await });
        }
        let receiver = ReceiverConfig {
            resync_every: Duration::from_millis(200),
            ..ReceiverConfig::new(
                mode,
                LIMITS,
                FeedSymbol::traded().into_iter().map(|s| s.name).collect(),
            )
        };
        let quotes = Quotes::start(Some(proxy.addr), config, receiver)
            .await
            .expect("the gate's receiver");
        quotes.ready(WAIT).await.expect("every symbol quoted");
        Self {
            feed: stats,
            feed_stop,
            proxy,
            quotes,
        }
    }

    fn gate(&self) -> &QuoteGate {
        self.quotes.gate()
    }

    /// Waits until an order on [`HIT`] gets `wanted` (`Ok` for accepted), on the gate's
    /// signals.
    async fn until(&self, what: &str, wanted: impl Fn(&Result<(), Refusal>) -> bool) {
        let waited = tokio::time::timeout(
            WAIT,
            self.gate()
                .wait_until(|g, now| wanted(&g.check(HIT, now).map(|_| ()))),
        )
        .await;
        assert!(
            waited.is_ok(),
            "timed out waiting for {what}: {:?}",
            self.gate().check(HIT)
        );
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.feed_stop.cancel();
    }
}

fn buy(symbol: &str) -> Order {
    Order {
        symbol: symbol.to_owned(),
        side: Side::Buy,
        qty: "10".parse().expect("qty"),
        price: "1.08420".parse().expect("price"),
    }
}

fn refused(result: Result<Outcome, WriteSideError>) -> OrderRefused {
    match result {
        Err(WriteSideError::QuoteRefused(r)) => r,
        other => panic!("refused by the quote gate, got {other:?}"),
    }
}

async fn scalar(pool: &Pool, sql: &str) -> i64 {
    pool.get()
        .await
        .expect("connection")
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// The stored reply of `key`, as text.
async fn stored_reply(pool: &Pool, key: &str) -> serde_json::Value {
    pool.get()
        .await
        .expect("connection")
        .query_one(
            "SELECT reply FROM writeside.idempotency_keys WHERE key = $1",
            &[&key],
        )
        .await
        .expect("the key's row")
        .get(0)
}

/// Nothing but the accepted orders was written: one event, one outbox row and one seq each.
async fn written(pool: &Pool, accepted: i64) {
    assert_eq!(
        scalar(pool, "SELECT count(*) FROM writeside.events").await,
        accepted
    );
    assert_eq!(
        scalar(pool, "SELECT count(*) FROM writeside.outbox").await,
        accepted
    );
    assert_eq!(
        scalar(
            pool,
            "SELECT coalesce(sum(last_seq), 0)::bigint FROM account_seq"
        )
        .await,
        accepted,
        "a refusal takes no seq"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_lost_ticks_refuses_orders_until_a_snapshot_heals_the_delta_feed() {
    let db = TestDb::new(&Registry::new()).await;
    let rig = Rig::start(FeedMode::Delta).await;
    let write_side = WriteSide::new(projector_engine::db::pool(db.url(), 4).expect("pool"))
        .await
        .expect("write side")
        .with_quotes(rig.gate().clone());
    let intake = write_side.intake();
    let pool = write_side.pool().clone();
    let subscribes_at_start = rig.feed.report().subscribes;

    let first = intake.place(1, "before", buy(HIT)).await.expect("accepted");
    assert!(first.is_accepted(), "{first:?}");

    // A burst: the ticks of EURUSD are lost on the path, its heartbeats arrive and show the gap.
    rig.proxy.set(Path::LoseTicks);
    rig.until("a suspect EURUSD", |r| {
        matches!(r, Err(Refusal::Suspect { .. }))
    })
    .await;
    let during = refused(intake.place(1, "during", buy(HIT)).await);
    assert_eq!(
        during.refusal,
        Refusal::Suspect {
            waiting_for: Awaited::Snapshot
        }
    );
    assert_eq!(during.message, "suspect: waiting for a snapshot");
    assert_eq!(during.symbol, HIT);
    // Only the hit symbol: another one trades on.
    let other = intake
        .place(1, "other", buy("GBPUSD"))
        .await
        .expect("GBPUSD");
    assert!(other.is_accepted(), "{other:?}");
    // A retry during the burst: the stored refusal.
    assert_eq!(refused(intake.place(1, "during", buy(HIT)).await), during);
    written(&pool, 2).await;

    // The path heals: the gate's reconnect gets its snapshot through, with the sequence reset.
    rig.proxy.set(Path::Pass);
    rig.until("EURUSD healed", Result::is_ok).await;
    let after = intake.place(1, "after", buy(HIT)).await.expect("accepted");
    assert!(after.is_accepted(), "{after:?}");
    assert_eq!(after.reply().seq, 3);
    // The retry of the refused order, now that the quote is good: still the first answer.
    let again = intake.place(1, "during", buy(HIT)).await;
    assert_eq!(refused(again), during);
    written(&pool, 3).await;

    let reply = stored_reply(&pool, "during").await;
    assert_eq!(reply["refused"]["reason"], "suspect", "{reply}");
    assert_eq!(
        reply["refused"]["message"], "suspect: waiting for a snapshot",
        "{reply}"
    );
    let report = write_side.report();
    assert_eq!(
        (
            report.refused_suspect,
            report.refused_on_quotes(),
            report.deduplicated,
            report.fills
        ),
        (1, 1, 2, 3),
        "{report:?}"
    );
    let gate = rig.gate().report();
    assert!(gate.stats.lost > 0, "{gate:?}");
    assert!(gate.reconnects > 0, "{gate:?}");
    assert!(
        rig.feed.report().subscribes > subscribes_at_start,
        "the gate reconnected: {:?}",
        rig.feed.report()
    );
    assert!(
        rig.proxy.lost_ticks.load(Ordering::SeqCst) > 0,
        "the proxy lost ticks"
    );
    let offset = gate.clock_offset_ms.expect("measured");
    assert!(
        (2400..=2600).contains(&offset),
        "the feed is 2.5 s behind: {offset}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_feed_heals_at_the_next_tick_and_silence_or_an_old_source_refuses_orders() {
    let db = TestDb::new(&Registry::new()).await;
    let rig = Rig::start(FeedMode::Full).await;
    let write_side = WriteSide::new(projector_engine::db::pool(db.url(), 4).expect("pool"))
        .await
        .expect("write side")
        .with_quotes(rig.gate().clone());
    let intake = write_side.intake();
    let pool = write_side.pool().clone();
    let subscribes_at_start = rig.feed.report().subscribes;
    assert!(intake
        .place(2, "k1", buy(HIT))
        .await
        .expect("accepted")
        .is_accepted());

    // Lost ticks, heartbeats through: suspect until the next tick.
    rig.proxy.set(Path::LoseTicks);
    rig.until("a suspect EURUSD", |r| {
        matches!(r, Err(Refusal::Suspect { .. }))
    })
    .await;
    let suspect = refused(intake.place(2, "k2", buy(HIT)).await);
    assert_eq!(suspect.message, "suspect: waiting for a new tick");
    rig.proxy.set(Path::Pass);
    rig.until("the next tick", Result::is_ok).await;
    assert!(intake
        .place(2, "k3", buy(HIT))
        .await
        .expect("accepted")
        .is_accepted());
    assert_eq!(
        rig.feed.report().subscribes,
        subscribes_at_start,
        "a full feed needs no reconnect"
    );

    // Everything lost: after a second of silence, stale.
    rig.proxy.set(Path::LoseAll);
    rig.until("a silent EURUSD", |r| {
        matches!(r, Err(Refusal::StaleQuote { .. }))
    })
    .await;
    let stale = refused(intake.place(2, "k4", buy(HIT)).await);
    let Refusal::StaleQuote {
        silence_ms: Some(silence),
    } = stale.refusal
    else {
        panic!("{stale:?}");
    };
    assert!(silence > LIMITS.stale_after_ms, "{stale:?}");
    assert_eq!(stale.message, format!("stale quote: {silence} ms"));
    // The retry gets the same figure, however long the silence is by now.
    assert_eq!(refused(intake.place(2, "k4", buy(HIT)).await), stale);

    // The datagrams come back, stamped 10 s in the past by a lagging provider.
    rig.proxy.set(Path::AgeSource(10_000));
    rig.until("an old EURUSD", |r| {
        matches!(r, Err(Refusal::StaleAtSource { .. }))
    })
    .await;
    let old = refused(intake.place(2, "k5", buy(HIT)).await);
    assert_eq!(old.message, "stale at source");
    let Refusal::StaleAtSource { age_ms: Some(age) } = old.refusal else {
        panic!("{old:?}");
    };
    assert!((9000..20_000).contains(&age), "{old:?}");

    rig.proxy.set(Path::Pass);
    rig.until("a fresh EURUSD", Result::is_ok).await;
    let last = intake.place(2, "k6", buy(HIT)).await.expect("accepted");
    assert_eq!(last.reply().seq, 3);
    written(&pool, 3).await;
    for (key, reason) in [
        ("k2", "suspect"),
        ("k4", "stale_quote"),
        ("k5", "stale_at_source"),
    ] {
        assert_eq!(stored_reply(&pool, key).await["refused"]["reason"], reason);
    }

    let report = write_side.report();
    assert_eq!(
        (
            report.refused_suspect,
            report.refused_stale_quote,
            report.refused_stale_at_source
        ),
        (1, 1, 1),
        "{report:?}"
    );
    // Every tick the proxy lost was counted once: by a heartbeat that showed the gap, or by the
    // next tick, never by both. No feed fault of its own, so nothing else is lost.
    let gate = rig.gate().report();
    assert_eq!(
        gate.stats.lost,
        rig.proxy.lost_ticks.load(Ordering::SeqCst),
        "{gate:?}"
    );
    assert!(gate.stats.heartbeat_gaps > 0, "{gate:?}");
    assert_eq!((gate.stats.duplicates, gate.stats.late), (0, 0), "{gate:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_checks_orders_against_the_feed_given_with_quotes() {
    let db = TestDb::new(&Registry::new()).await;
    let broker =
        projector_devkit::devbroker::DevBroker::start(1, &[("trades", 2)]).expect("broker");
    // A feed of the test's own, with its faults, that `simulate` must subscribe to and ping.
    let feed = Feed::bind(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        FeedConfig {
            mode: FeedMode::Full,
            burst_every: Duration::from_millis(900),
            burst_for: Duration::from_millis(700),
            ..FeedConfig::new(FeedSymbol::traded())
        },
    )
    .await
    .expect("feed");
    let addr = feed.local_addr().to_string();
    let stats = feed.stats();
    let stop = CancellationToken::new();
    let running = {
        let stop = stop.clone();
        tokio::spawn(async move { feed.run(stop).await })
    };
    let args: Vec<String> = [
        "simulate",
        "--brokers",
        &broker.bootstrap_servers(),
        "--topic",
        "trades",
        "--accounts",
        "10",
        "--rate",
        "100",
        "--duration",
        "3s",
        "--quotes",
        &addr,
        "--quote-feed",
        "full",
        "--database-url",
        db.url(),
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let out = tokio::task::spawn_blocking(move || {
        Process::new(env!("CARGO_BIN_EXE_projector"))
            .args(&args)
            .env("PROJECTOR_LOG", "warn")
            .output()
            .expect("run projector simulate")
    })
    .await
    .expect("cli");
    stop.cancel();
    running.await.expect("feed task").expect("feed");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let quotes = stdout
        .lines()
        .find(|l| l.starts_with("quotes "))
        .unwrap_or_else(|| panic!("no quote line:\n{stdout}"));
    assert!(
        quotes.contains(&format!("full feed at {addr}: taken ")),
        "another feed's ticks are not counted as sent: {quotes}"
    );
    let feed = stats.report();
    assert!(feed.subscribes >= 1 && feed.pings >= 1, "{feed:?}");
    assert!(feed.ticks > 0, "{feed:?}");
    // A 700 ms burst every 900 ms on one symbol in turn: over three seconds some orders met a
    // silent quote.
    let refused = stdout
        .lines()
        .find(|l| l.starts_with("refused "))
        .unwrap_or_else(|| panic!("no refused line:\n{stdout}"));
    let stale: u64 = refused
        .split("(stale ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{refused}"));
    assert!(stale > 0, "{stdout}");
    let pool = projector_engine::db::pool(db.url(), 1).expect("pool");
    let stored = scalar(
        &pool,
        "SELECT count(*) FROM writeside.idempotency_keys WHERE reply ? 'refused'",
    )
    .await;
    assert!(stored as u64 >= stale, "every refusal is a stored reply");
    // Every request is answered one way: written, replayed, refused (key reuse, rule, quote).
    let figure = |line: &str, name: &str| -> u64 {
        let l = stdout
            .lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line:?} line:\n{stdout}"));
        l.split(name)
            .nth(1)
            .and_then(|r| r.trim_start().split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in {l:?}"))
    };
    let events = figure("events", "events");
    assert_eq!(
        figure("requests", "requests"),
        events
            + figure("requests", "deduplicated")
            + figure("requests", "refused")
            + figure("requests", "rejected")
            + figure("refused", "on the quote"),
        "{stdout}"
    );
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM writeside.events").await as u64,
        events
    );
}
