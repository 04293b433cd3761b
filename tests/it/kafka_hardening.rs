//! No message can wedge a view or make it skip offsets, through the real Kafka source on the
//! mock cluster and real PostgreSQL:
//!
//! - a fenced worker resumes exactly at the stored offset, whether that lies inside the batch
//!   it holds (it applies the rest from memory) or before it (it fetches again);
//! - a batch stuck behind a lock, or on a frozen connection, cannot hold a rebalance or a
//!   shutdown for ever;
//! - a stream holding every kind of bad message, on three partitions, reaches the end of
//!   every partition in every built-in view, with every bad message accounted for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::support::broker::Broker;
use crate::support::kafka::{add, ends_of, held, publish, publish_raw, Hold, Progress, Raw, Tee};
use crate::support::proxy::{target_of, url_through, Proxy};
use crate::support::{fills, offsets, rows, trail_fold, with_options, Trail};
use deadpool_postgres::{Client, Pool};
use projector_devkit::partitioner::partition_for_account;
use projector_engine::db::{self, Settings};
use projector_engine::kafka::source::{run_view, KafkaConfig, Observer, SourceError};
use projector_engine::testkit::conformance::dump;
use projector_engine::testkit::{bust, cash, consume, fill, EventSpec, Lcg, Partition, TestDb};
use projector_engine::{Applier, Batch, Projection, Registry, SourceOrdering};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Deadline for every awaited signal: generous, since nothing here waits for time to pass.
const LIMIT: Duration = Duration::from_secs(120);

async fn trail_db() -> (TestDb, Arc<Applier>) {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&registry).await;
    (db, trail_applier())
}

fn trail_applier() -> Arc<Applier> {
    Arc::new(Applier::new(Arc::new(Trail::new(1)), SourceOrdering::PerAccount).expect("applier"))
}

fn spawn_view(
    applier: &Arc<Applier>,
    pool: &Pool,
    cfg: &KafkaConfig,
    observer: Arc<dyn Observer>,
) -> (CancellationToken, JoinHandle<Result<(), SourceError>>) {
    let token = CancellationToken::new();
    let task = tokio::spawn(run_view(
        applier.clone(),
        pool.clone(),
        cfg.clone(),
        observer,
        token.clone(),
    ));
    (token, task)
}

async fn stop_view(token: CancellationToken, task: JoinHandle<Result<(), SourceError>>) {
    token.cancel();
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the view stops")
        .expect("view task")
        .expect("the view ran without errors");
}

// ---------------------------------------------------------------------------------------
// Fencing never skips

/// The issue's scenario: the partition is committed up to 100; the worker, assigned at 100,
/// holds [100, 2100); a zombie (another writer of the same view version that still believes
/// it owns the partition) commits [100, 110). The worker is fenced at 110 and must apply
/// 110..2099 from the batch it holds, not skip to 2100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_inside_the_batch_applies_the_rest_of_it() {
    let (db, applier) = trail_db().await;
    let broker = Broker::start(&[("fills", 1)]);
    let topic = broker.topic("fills");
    let bootstrap = broker.bootstrap_servers();
    // 21 accounts, round-robin: the first 2100 events are seq 1 to 100 of every account.
    let events = fills(21, 110);
    let (first, later) = events.split_at(2100);
    let mut ends = publish(&bootstrap, &topic, first).await;
    let log = Partition::from_events(&topic, 0, first);
    let mut client = db.client().await;
    applier
        .apply(&mut client, &log.batch(0, 100))
        .await
        .expect("the partition committed up to 100");

    let progress = Arc::new(Progress::default());
    let (hold, mut held_rx) = Hold::new(progress.clone(), |b: &Batch| b.start_offset == 100);
    let mut cfg = broker.config(&topic);
    cfg.max_batch_messages = 2000;
    // Everything up to 2100 is on the topic already: the batch fills up well within this.
    cfg.linger = Duration::from_secs(1);
    let (stop, task) = spawn_view(&applier, db.pool(), &cfg, hold);

    let held = held(&mut held_rx, LIMIT).await;
    let batch = held.batch.clone();
    assert_eq!(
        batch.messages[0].payload, log.log[100].payload,
        "the worker resumed at the stored offset 100"
    );
    assert!(
        batch.messages.len() > 10,
        "the held batch reaches past the zombie's commit: {} messages",
        batch.messages.len()
    );
    let zombie = trail_applier();
    let zombie_batch = Batch {
        messages: batch.messages[..10].to_vec(),
        ..batch.clone()
    };
    let committed = zombie
        .apply(&mut client, &zombie_batch)
        .await
        .expect("the zombie commits [100, 110)");
    assert_eq!(committed.next_offset, 110);
    // More arrives meanwhile, so that a worker that skipped past its batch would have
    // something to commit beyond the hole.
    add(&mut ends, &publish(&bootstrap, &topic, later).await);
    held.release();

    progress.wait_for_ends(&ends, LIMIT).await;
    stop_view(stop, task).await;

    assert_eq!(progress.fenced_list(), [(0, 100, 110)]);
    let o = offsets(&client, "trail_v1").await;
    let total = events.len() as i64;
    assert_eq!(
        o.next,
        BTreeMap::from([(0, total)]),
        "every offset committed"
    );
    assert_eq!(o.accounted(), total, "every offset accounted for: {o:?}");
    assert_eq!(
        (o.applied, o.duplicates, o.dead_lettered, o.waiting),
        (total, 0, 0, 0),
        "each event applied once, by the zombie or the worker"
    );
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
}

/// The stored offset goes back behind the batch the worker holds (an operator rewinds the
/// view, or a writer that lost a race committed less). Fenced with the stored offset before
/// its batch, the worker must seek back and read again from there: what it reads twice is
/// counted as duplicates, and nothing is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_behind_the_batch_fetches_again_from_the_stored_offset() {
    let (db, applier) = trail_db().await;
    let broker = Broker::start(&[("fills", 1)]);
    let topic = broker.topic("fills");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(20, 100);
    let ends = publish(&bootstrap, &topic, &events).await;

    let progress = Arc::new(Progress::default());
    let (hold, mut held_rx) = Hold::new(progress.clone(), |b: &Batch| b.start_offset >= 1000);
    let (stop, task) = spawn_view(&applier, db.pool(), &broker.config(&topic), hold);

    let held = held(&mut held_rx, LIMIT).await;
    let start = held.batch.start_offset;
    let rewound = start - 600;
    let client = db.client().await;
    let moved = client
        .execute(
            "UPDATE projector.offsets SET next_offset = $1 \
             WHERE consumer = 'trail_v1' AND topic = $3 AND partition = 0 AND next_offset = $2",
            &[&rewound, &start, &topic],
        )
        .await
        .expect("rewind");
    assert_eq!(moved, 1, "the partition stood at the held batch's start");
    held.release();

    progress.wait_for_ends(&ends, LIMIT).await;
    stop_view(stop, task).await;

    assert_eq!(progress.fenced_list(), [(0, start, rewound)]);
    let o = offsets(&client, "trail_v1").await;
    let total = events.len() as i64;
    let read_twice = start - rewound;
    assert_eq!(
        o.next,
        BTreeMap::from([(0, total)]),
        "every offset committed"
    );
    assert_eq!(
        (o.applied, o.duplicates, o.dead_lettered, o.waiting),
        (total, read_twice, 0, 0),
        "what was read again is counted as duplicates, nothing else"
    );
    assert_eq!(o.accounted(), total + read_twice, "{o:?}");
    assert_eq!(rows(&client, "trail_v1").await, trail_fold(&events));
}

// ---------------------------------------------------------------------------------------
// Bounded waits

/// Waits until `at_least` engine sessions of `database` wait for a lock. PostgreSQL signals
/// no lock wait to anyone, so this polls `pg_stat_activity`.
async fn wait_for_lock_waiters(admin: &Client, database: &str, at_least: i64) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                 AND application_name = 'projector' AND wait_event_type = 'Lock'",
                &[&database],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if waiting >= at_least {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {at_least} engine sessions to wait for a lock ({waiting} do)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session of its own (not the engine's) that can lock every offset row of a view version
/// and idle while holding them, for as long as the test wants.
struct Locker {
    client: Client,
    pid: i32,
    _pool: Pool,
}

impl Locker {
    async fn new(db: &TestDb) -> Self {
        let url = format!(
            "{}&application_name=test_locker",
            with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")])
        );
        let pool = db::pool(&url, 1).expect("locker pool");
        let client = pool.get().await.expect("locker session");
        let pid = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        Self {
            client,
            pid,
            _pool: pool,
        }
    }

    /// Locks the offset rows of `consumer` and returns how many there are.
    async fn lock(&self, consumer: &str) -> usize {
        self.client.batch_execute("BEGIN").await.expect("begin");
        self.client
            .query(
                "SELECT partition FROM projector.offsets WHERE consumer = $1 FOR UPDATE",
                &[&consumer],
            )
            .await
            .expect("lock the offset rows")
            .len()
    }

    async fn release(&self) {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .expect("release");
    }

    /// The session's state as the server sees it.
    async fn state(&self, admin: &Client) -> String {
        admin
            .query_one(
                "SELECT state FROM pg_stat_activity WHERE pid = $1",
                &[&self.pid],
            )
            .await
            .expect("locker state")
            .get(0)
    }
}

/// Another session holds every offset row of the view version and idles, so the worker's
/// batches wait for the lock. A second consumer joins the group: the first one's revocation,
/// which waits for its in-flight batches, must finish while the lock is still held, because
/// the batch's statements time out (`statement_timeout` from the URL) and are retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_finishes_while_a_lock_holds_the_batch() {
    let (db, applier) = trail_db().await;
    let broker = Broker::start(&[("fills", 3)]);
    let topic = broker.topic("fills");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(30, 40);
    let (first, later) = events.split_at(events.len() / 2);
    let mut ends = publish(&bootstrap, &topic, first).await;

    let url = with_options(db.url(), &[("statement_timeout", "1000")]);
    let pool = db::pool(&url, 8).expect("engine pool");
    let mut cfg = broker.config(&topic);
    cfg.attempt_timeout = Duration::from_secs(3);
    let shared = Arc::new(Progress::default());
    let (own_a, own_b) = (Arc::new(Progress::default()), Arc::new(Progress::default()));
    let (stop_a, a) = spawn_view(
        &applier,
        &pool,
        &cfg,
        Arc::new(Tee(shared.clone(), own_a.clone())),
    );
    shared.wait_for_ends(&ends, LIMIT).await;
    assert_eq!(own_a.assigned_now(), [0, 1, 2]);

    let admin = db.client().await;
    let locker = Locker::new(&db).await;
    assert_eq!(locker.lock("trail_v1").await, 3);
    add(&mut ends, &publish(&bootstrap, &topic, later).await);
    wait_for_lock_waiters(&admin, db.name(), 1).await;
    let committed_before = shared.committed_total();

    let (stop_b, b) = spawn_view(
        &applier,
        &pool,
        &cfg,
        Arc::new(Tee(shared.clone(), own_b.clone())),
    );
    own_a
        .wait("the first consumer to give partitions up", LIMIT, |p| {
            p.assigned_now().len() < 3
        })
        .await;
    own_b
        .wait("the second consumer to get partitions", LIMIT, |p| {
            !p.assigned_now().is_empty()
        })
        .await;
    assert_eq!(
        locker.state(&admin).await,
        "idle in transaction",
        "the lock was held throughout"
    );
    assert_eq!(
        shared.committed_total(),
        committed_before,
        "nothing committed while the lock was held"
    );

    locker.release().await;
    shared.wait_for_ends(&ends, LIMIT).await;
    stop_view(stop_a, a).await;
    stop_view(stop_b, b).await;

    assert_eq!(rows(&admin, "trail_v1").await, trail_fold(&events));
    let o = offsets(&admin, "trail_v1").await;
    let total = events.len() as i64;
    assert_eq!(
        o.next.values().sum::<i64>(),
        total,
        "every offset committed"
    );
    assert_eq!((o.applied, o.duplicates, o.accounted()), (total, 0, total));
}

/// The network to PostgreSQL freezes under batches in flight: their connections stay open
/// but nothing moves, so no TCP timeout fires. A shutdown, which waits for in-flight
/// batches, must still finish: the attempt timeout gives the frozen connections up. The
/// server ends the frozen transactions, which hold the offset rows, after
/// `idle_in_transaction_session_timeout`; a consumer started afterwards finishes the stream
/// exactly, over new connections of the same pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_connection_cannot_hold_a_shutdown() {
    let (db, applier) = trail_db().await;
    let broker = Broker::start(&[("fills", 3)]);
    let topic = broker.topic("fills");
    let bootstrap = broker.bootstrap_servers();
    let events = fills(30, 40);
    let (first, later) = events.split_at(events.len() / 2);
    let mut ends = publish(&bootstrap, &topic, first).await;

    let proxy = Proxy::start(target_of(db.url())).await;
    let url = with_options(
        &url_through(db.url(), proxy.addr()),
        &[("idle_in_transaction_session_timeout", "2000")],
    );
    let settings = Settings {
        max_size: 4,
        // Also how long the pool's check of an idle connection may take: frozen ones fail it.
        connect_timeout: Duration::from_secs(2),
        ..Settings::default()
    };
    let pool = db::pool_with(&url, &settings).expect("engine pool through the proxy");
    let mut cfg = broker.config(&topic);
    cfg.attempt_timeout = Duration::from_secs(4);
    let progress = Arc::new(Progress::default());
    let (stop, task) = spawn_view(&applier, &pool, &cfg, progress.clone());
    progress.wait_for_ends(&ends, LIMIT).await;

    // Every partition's next batch begins its transaction and waits for its offset row...
    let admin = db.client().await;
    let locker = Locker::new(&db).await;
    assert_eq!(locker.lock("trail_v1").await, 3);
    add(&mut ends, &publish(&bootstrap, &topic, later).await);
    wait_for_lock_waiters(&admin, db.name(), 3).await;
    // ... when the network freezes. Released, the frozen sessions take the offset rows and
    // then wait for a client that will never speak again.
    proxy.freeze();
    locker.release().await;

    stop_frozen_view(stop, task).await;

    // A new view finishes the stream. Part of it may already be committed: the halves of a
    // batch whose attempt timed out go out on fresh connections before the shutdown lands.
    let progress = Arc::new(Progress::default());
    let (stop, task) = spawn_view(&applier, &pool, &cfg, progress.clone());
    let total_messages: i64 = ends.values().map(|n| *n as i64).sum();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while offsets(&admin, "trail_v1").await.next.values().sum::<i64>() < total_messages {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream was not consumed to its end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_view(stop, task).await;

    assert_eq!(rows(&admin, "trail_v1").await, trail_fold(&events));
    let o = offsets(&admin, "trail_v1").await;
    let total = events.len() as i64;
    assert_eq!(
        o.next.values().sum::<i64>(),
        total,
        "every offset committed"
    );
    assert_eq!((o.applied, o.duplicates, o.accounted()), (total, 0, total));
    let frozen_left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
             AND application_name = 'projector' AND state = 'idle in transaction'",
            &[&db.name()],
        )
        .await
        .expect("sessions")
        .get(0);
    assert_eq!(frozen_left, 0, "the server ended the frozen transactions");
}

/// Shuts a view down and waits for it. With its batches on frozen connections, only the
/// attempt timeout can end them: without it, this never returns.
async fn stop_frozen_view(stop: CancellationToken, task: JoinHandle<Result<(), SourceError>>) {
    stop.cancel();
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the shutdown finished although its batches' connections froze")
        .expect("view task")
        .expect("the view stopped without errors");
}

// ---------------------------------------------------------------------------------------
// Every kind of bad message, on three partitions, in every built-in view

const PARTITIONS: i32 = 3;
/// The built-in views in registry order: portfolio, risk, eod.
const VIEWS: usize = 3;

/// What becomes of a bad message in one view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Dead-lettered as poison.
    Poison,
    /// Dead-lettered as a conflict: another event holds its `(account, seq)`.
    Conflict,
    /// A type the view does not read: ignored, and its `seq` advances.
    Ignored,
    /// Counted as a duplicate.
    Duplicate,
    /// Applied.
    Applied,
}

use Fate::*;

/// A bad message: why it is bad, its bytes, what each view does with it, and the account
/// and `seq` its dead letter must name (when the envelope yields them).
struct Bad {
    what: &'static str,
    raw: Raw,
    fates: [Fate; VIEWS],
    names: (Option<i64>, Option<i64>),
}

const POISON: [Fate; VIEWS] = [Poison; VIEWS];
/// Portfolio and risk do not read cash movements; eod does.
const CASH_ONLY_EOD_READS: [Fate; VIEWS] = [Ignored, Ignored, Poison];

const SYMBOLS: [(&str, i64); 3] = [
    ("EURUSD", 108_420),
    ("GBPUSD", 126_310),
    ("USDJPY", 15_012_300),
];

fn at(seq: i64) -> String {
    // Five minutes apart from 22:00 UTC: an account's events span two trading days.
    let start = chrono::DateTime::parse_from_rfc3339("2026-11-29T22:00:00Z").expect("start");
    (start + chrono::Duration::minutes(5 * seq))
        .with_timezone(&chrono::Utc)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A valid fill of `account` at `seq`.
fn a_fill(account: i64, seq: i64, rng: &mut Lcg) -> EventSpec {
    let (symbol, base) = SYMBOLS[rng.below(SYMBOLS.len())];
    let qty = rust_decimal::Decimal::new(rng.int(50_000) + 1, 2).to_string();
    let price = rust_decimal::Decimal::new(base + rng.int(2001) - 1000, 5).to_string();
    let side = if rng.chance(50) { "buy" } else { "sell" };
    let fee = rust_decimal::Decimal::new(rng.int(300), 2).to_string();
    fill(account, seq, &at(seq), symbol, side, &qty, &price, &fee)
}

/// An account's valid events in `seq` order: fills, busts of earlier fills, cash.
fn account_events(account: i64, count: i64, rng: &mut Lcg) -> Vec<EventSpec> {
    let mut events = Vec::new();
    let mut unbusted: Vec<EventSpec> = Vec::new();
    for seq in 1..=count {
        let roll = rng.below(100);
        if roll < 8 && !unbusted.is_empty() {
            let original = unbusted.remove(rng.below(unbusted.len()));
            events.push(bust(&original, seq, &at(seq)));
        } else if roll < 20 {
            let amount = rust_decimal::Decimal::new(rng.int(200_000) - 100_000, 2);
            events.push(cash(
                account,
                seq,
                &at(seq),
                &amount.to_string(),
                "transfer",
            ));
        } else {
            let f = a_fill(account, seq, rng);
            unbusted.push(f.clone());
            events.push(f);
        }
    }
    events
}

fn raw(e: &EventSpec) -> Raw {
    (Some(e.key()), e.payload())
}

fn keyed(account: i64, payload: &[u8]) -> Raw {
    (Some(account.to_string().into_bytes()), payload.to_vec())
}

/// An envelope written by hand, so that any field can be wrong.
fn envelope(event_id: &str, kind: &str, account: i64, seq: i64, at: &str, data: &str) -> Vec<u8> {
    format!(
        r#"{{"event_id":{},"type":"{kind}","account_id":{account},"seq":{seq},"occurred_at":"{at}","data":{data}}}"#,
        serde_json::Value::from(event_id)
    )
    .into_bytes()
}

const GOOD_FILL_DATA: &str =
    r#"{"symbol":"EURUSD","side":"buy","qty":"10","price":"1.08420","fee":"0.10"}"#;

/// One message of the stream as it is laid out.
enum Item {
    Good(Raw),
    Bad(Bad),
}

/// The stream: what is published, in order, which of it is bad, and per view which
/// accounts must equal a clean delivery of their events.
#[derive(Default)]
struct Stream {
    messages: Vec<Raw>,
    /// Index into `messages`, and the bad message there.
    bad: Vec<(usize, Bad)>,
    /// Per account, the messages a clean delivery holds, in `seq` order: the valid events,
    /// and the messages a view must step over (a type it does not read) as they are.
    clean: BTreeMap<i64, Vec<Raw>>,
    /// Per view, the accounts whose rows must equal the clean delivery's.
    compared: [BTreeSet<i64>; VIEWS],
    /// Per view, the accounts parked at the end: (account, blocked seq).
    parked: [BTreeSet<(i64, i64)>; VIEWS],
}

impl Stream {
    fn push(&mut self, item: Item) {
        match item {
            Item::Good(raw) => self.messages.push(raw),
            Item::Bad(bad) => {
                self.messages.push(bad.raw.clone());
                self.bad.push((self.messages.len() - 1, bad));
            }
        }
    }

    fn push_good(&mut self, events: &[EventSpec]) {
        for e in events {
            self.push(Item::Good(raw(e)));
        }
    }

    /// Compares `account` in every view, against `clean`.
    fn compare(&mut self, account: i64, clean: Vec<Raw>) {
        self.clean.insert(account, clean);
        for set in &mut self.compared {
            set.insert(account);
        }
    }
}

/// Poison at seq 1 of `account`: every view reads fills, so every view dead-letters it.
fn poison_fill(what: &'static str, account: i64, payload: Vec<u8>) -> Bad {
    Bad {
        what,
        raw: keyed(account, &payload),
        fates: POISON,
        names: (Some(account), Some(1)),
    }
}

fn fill_data(symbol: &str, qty: &str, price: &str) -> String {
    format!(r#"{{"symbol":{symbol},"side":"buy","qty":{qty},"price":{price}}}"#)
}

fn stream() -> Stream {
    let mut rng = Lcg(0x0bad_5eed);
    let mut s = Stream::default();

    // Forty accounts of valid events, interleaved: a third before the bad messages, a third
    // among them, a third after.
    let good: Vec<Vec<EventSpec>> = (1..=40).map(|a| account_events(a, 30, &mut rng)).collect();
    for (a, events) in (1..=40).zip(&good) {
        s.compare(a, events.iter().map(raw).collect());
    }
    let mut interleaved = Vec::new();
    let mut next = vec![0usize; good.len()];
    loop {
        let open: Vec<usize> = (0..good.len())
            .filter(|&a| next[a] < good[a].len())
            .collect();
        if open.is_empty() {
            break;
        }
        let a = open[rng.below(open.len())];
        interleaved.push(raw(&good[a][next[a]]));
        next[a] += 1;
    }
    let mut thirds = interleaved.chunks(interleaved.len().div_ceil(3));
    for m in thirds.next().expect("first third") {
        s.push(Item::Good(m.clone()));
    }

    // Poison, at random places among the second third.
    let mut middle: Vec<Item> = thirds
        .next()
        .expect("second third")
        .iter()
        .cloned()
        .map(Item::Good)
        .collect();
    let fill_at = |seq: i64| {
        format!(
            r#""type":"fill_executed","occurred_at":"{}","data":{GOOD_FILL_DATA}"#,
            at(seq)
        )
    };
    let long_id = "x".repeat(300);
    let long_symbol = format!(r#""{}""#, "S".repeat(100));
    let poison = vec![
        Bad {
            what: "not UTF-8",
            raw: keyed(101, b"{\"event_id\": \"\xff\xfe\"}"),
            fates: POISON,
            names: (None, None),
        },
        Bad {
            what: "not JSON",
            raw: keyed(102, b"fill_executed account=102 seq=1 {"),
            fates: POISON,
            names: (None, None),
        },
        Bad {
            what: "no seq",
            raw: keyed(
                103,
                format!(r#"{{"event_id":"no-seq","account_id":103,{}}}"#, fill_at(1)).as_bytes(),
            ),
            fates: POISON,
            names: (Some(103), None),
        },
        Bad {
            what: "a seq of the wrong type",
            raw: keyed(
                104,
                format!(
                    r#"{{"event_id":"text-seq","account_id":104,"seq":"1",{}}}"#,
                    fill_at(1)
                )
                .as_bytes(),
            ),
            fates: POISON,
            names: (Some(104), None),
        },
        Bad {
            what: "an empty payload",
            raw: keyed(105, b""),
            fates: POISON,
            names: (None, None),
        },
        Bad {
            what: "a key that does not match account_id",
            raw: keyed(
                106,
                &envelope("wrong-key", "fill_executed", 107, 1, &at(1), GOOD_FILL_DATA),
            ),
            fates: POISON,
            names: (Some(107), Some(1)),
        },
        poison_fill(
            "an event_id of 300 bytes",
            108,
            envelope(&long_id, "fill_executed", 108, 1, &at(1), GOOD_FILL_DATA),
        ),
        poison_fill(
            "a symbol of 100 bytes",
            109,
            envelope(
                "long-symbol",
                "fill_executed",
                109,
                1,
                &at(1),
                &fill_data(&long_symbol, "1", "1"),
            ),
        ),
        poison_fill(
            "NUL in event_id",
            110,
            envelope(
                "nul\u{0}id",
                "fill_executed",
                110,
                1,
                &at(1),
                GOOD_FILL_DATA,
            ),
        ),
        poison_fill(
            "NUL in symbol",
            111,
            envelope(
                "nul-symbol",
                "fill_executed",
                111,
                1,
                &at(1),
                &fill_data(r#""EUR\u0000USD""#, "1", "1"),
            ),
        ),
        poison_fill(
            "NUL in a data key",
            113,
            envelope(
                "nul-key",
                "fill_executed",
                113,
                1,
                &at(1),
                r#"{"symbol":"EURUSD","side":"buy","qty":"1","price":"1","no\u0000te":"x"}"#,
            ),
        ),
        poison_fill(
            "30 decimal places",
            114,
            envelope(
                "thirty-places",
                "fill_executed",
                114,
                1,
                &at(1),
                &fill_data("\"EURUSD\"", r#""0.000000000000000000000000000001""#, "1"),
            ),
        ),
        poison_fill(
            "1e40",
            115,
            envelope(
                "huge-price",
                "fill_executed",
                115,
                1,
                &at(1),
                &fill_data("\"EURUSD\"", "1", "1e40"),
            ),
        ),
        poison_fill(
            "year 0",
            116,
            envelope(
                "year-0",
                "fill_executed",
                116,
                1,
                "0000-06-01T00:00:00Z",
                GOOD_FILL_DATA,
            ),
        ),
        poison_fill(
            "year 10000",
            117,
            envelope(
                "year-10000",
                "fill_executed",
                117,
                1,
                "10000-01-01T00:00:00Z",
                GOOD_FILL_DATA,
            ),
        ),
    ];
    for bad in poison {
        let place = rng.below(middle.len() + 1);
        middle.insert(place, Item::Bad(bad));
    }
    for item in middle {
        s.push(item);
    }
    // Two poisoned accounts go on: portfolio and risk cannot apply seq 2 before the missing
    // seq 1 and park the account on its dead letter; eod, which does not depend on order,
    // applies it.
    for account in [108, 114] {
        s.push_good(&[a_fill(account, 2, &mut rng)]);
        s.parked[0].insert((account, 1));
        s.parked[1].insert((account, 1));
    }

    // Bad for eod only, or for nobody: a type portfolio and risk (or every view) do not
    // read, between valid events of its account. The clean delivery holds it as it is.
    let between = [
        (
            112,
            Bad {
                what: "NUL in a cash reason",
                raw: keyed(
                    112,
                    &envelope(
                        "nul-reason",
                        "cash_adjusted",
                        112,
                        2,
                        &at(2),
                        r#"{"amount":"5.00","reason":"bonus\u0000"}"#,
                    ),
                ),
                fates: CASH_ONLY_EOD_READS,
                names: (Some(112), Some(2)),
            },
        ),
        (
            118,
            Bad {
                what: "a malformed cash_adjusted",
                raw: keyed(
                    118,
                    &envelope(
                        "bad-cash",
                        "cash_adjusted",
                        118,
                        2,
                        &at(2),
                        r#"{"amount":{"value":"5"},"reason":"bonus"}"#,
                    ),
                ),
                fates: CASH_ONLY_EOD_READS,
                names: (Some(118), Some(2)),
            },
        ),
        (
            119,
            Bad {
                what: "an unknown event type",
                raw: raw(&EventSpec::new(
                    "margin_call",
                    119,
                    2,
                    &at(2),
                    serde_json::json!({"level": "0.8"}),
                )),
                fates: [Ignored; VIEWS],
                names: (None, None),
            },
        ),
    ];
    for (account, bad) in between {
        let (before, after) = (a_fill(account, 1, &mut rng), a_fill(account, 3, &mut rng));
        s.compare(account, vec![raw(&before), bad.raw.clone(), raw(&after)]);
        s.push_good(&[before]);
        s.push(Item::Bad(bad));
        s.push_good(&[after]);
    }

    // The last third, then valid accounts whose trouble comes late.
    for m in thirds.next().expect("last third") {
        s.push(Item::Good(m.clone()));
    }
    // A republish at a new offset: a duplicate everywhere.
    let republished = account_events(120, 5, &mut rng);
    s.compare(120, republished.iter().map(raw).collect());
    s.push_good(&republished);
    s.push(Item::Bad(Bad {
        what: "a republish at a new offset",
        raw: raw(&republished[2]),
        fates: [Duplicate; VIEWS],
        names: (None, None),
    }));
    // A second event for a taken seq: portfolio and risk dead-letter it as a conflict. Eod
    // keeps no per-seq record (it does not depend on order), so it cannot tell it from a new
    // event and applies it: account 121 is compared in portfolio and risk only.
    let conflicted = account_events(121, 5, &mut rng);
    s.clean.insert(121, conflicted.iter().map(raw).collect());
    s.compared[0].insert(121);
    s.compared[1].insert(121);
    s.push_good(&conflicted);
    s.push(Item::Bad(Bad {
        what: "a second event for a taken seq",
        raw: raw(&a_fill(121, 2, &mut rng).with_id("conflict-121-2")),
        fates: [Conflict, Conflict, Applied],
        names: (Some(121), Some(2)),
    }));
    // One event id used by two accounts of one partition: the second is an inbox duplicate.
    let (owner, borrower) = (
        122,
        (200..)
            .find(|&a| same_partition(a, 122))
            .expect("an account"),
    );
    // Fills only: every view reads them, so the owner's event is in every inbox.
    let owned: Vec<EventSpec> = (1..=4).map(|seq| a_fill(owner, seq, &mut rng)).collect();
    let borrowed: Vec<EventSpec> = (1..=4).map(|seq| a_fill(borrower, seq, &mut rng)).collect();
    s.compare(owner, owned.iter().map(raw).collect());
    s.push_good(&owned);
    s.push_good(&borrowed[..1]);
    s.push(Item::Bad(Bad {
        what: "an event id another account's event holds",
        raw: raw(&borrowed[1].clone().with_id(&owned[1].event_id)),
        fates: [Duplicate; VIEWS],
        names: (None, None),
    }));
    s.push_good(&borrowed[2..]);
    // A gap, filled by the stream's last message.
    let gap = account_events(123, 8, &mut rng);
    s.compare(123, gap.iter().map(raw).collect());
    s.push_good(&gap[..3]);
    s.push_good(&gap[4..]);
    s.push_good(&gap[3..4]);
    s
}

fn same_partition(a: i64, b: i64) -> bool {
    partition_for_account(a, PARTITIONS) == partition_for_account(b, PARTITIONS)
}

fn account_of_row(row: &str) -> i64 {
    row.trim_start_matches('(')
        .split(',')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("a row starting with its account id: {row}"))
}

fn rows_of(tables: &[Vec<String>], accounts: &BTreeSet<i64>) -> Vec<Vec<String>> {
    tables
        .iter()
        .map(|t| {
            t.iter()
                .filter(|r| accounts.contains(&account_of_row(r)))
                .cloned()
                .collect()
        })
        .collect()
}

/// Valid events for forty accounts mixed with every kind of bad message, on three
/// partitions, read by the three built-in views through the Kafka source. Every view reaches
/// the end of every partition; every account no bad message touched (and those whose
/// trouble was only a duplicate, a gap, or a type the view does not read) equals a clean
/// delivery of its events; every bad message is dead-lettered with its bytes, or counted as
/// ignored or duplicate; the counters add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_every_bad_message_on_three_partitions() {
    let registry = projector_views::registry().expect("views");
    let views: Vec<Arc<dyn Projection>> = registry.all().to_vec();
    assert_eq!(views.len(), VIEWS);
    let db = TestDb::new(&registry).await;
    let broker = Broker::start(&[("trades", PARTITIONS)]);
    let topic = broker.topic("trades");
    let bootstrap = broker.bootstrap_servers();
    let stream = stream();
    let landed = publish_raw(&bootstrap, &topic, &stream.messages).await;
    let ends = ends_of(&landed);
    assert_eq!(
        ends.len(),
        PARTITIONS as usize,
        "every partition holds messages"
    );
    let total = stream.messages.len() as i64;

    let pool = db::pool(db.url(), 12).expect("pool");
    let cfg = broker.config(&topic);
    let mut running = Vec::new();
    for view in &views {
        let applier =
            Arc::new(Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier"));
        let progress = Arc::new(Progress::default());
        let (stop, task) = spawn_view(&applier, &pool, &cfg, progress.clone());
        running.push((progress, stop, task));
    }
    for (progress, _, _) in &running {
        progress.wait_for_ends(&ends, LIMIT).await;
    }
    for (_, stop, task) in running {
        stop_view(stop, task).await;
    }

    // The reference: each compared account's events delivered once, in order, to each view.
    let reference = TestDb::new(&registry).await;
    let mut clean = Partition::new(&topic, 0);
    for messages in stream.clean.values() {
        for (key, payload) in messages {
            clean.push_raw(key.clone(), payload.clone());
        }
    }
    let client = db.client().await;
    let mut reference_client = reference.client().await;
    for (v, view) in views.iter().enumerate() {
        let consumer = view.consumer();
        let applier = Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier");
        consume(&applier, &mut reference_client, &clean, 100).await;
        let compared = &stream.compared[v];
        assert_eq!(
            rows_of(&dump(&client, &**view).await, compared),
            rows_of(&dump(&reference_client, &**view).await, compared),
            "{consumer}: the accounts no bad message touched differ from a clean delivery"
        );
        // Not vacuous: most of what the view holds is compared.
        let compared_rows: usize = rows_of(&dump(&client, &**view).await, compared)
            .iter()
            .map(Vec::len)
            .sum();
        assert!(
            compared_rows >= 40,
            "{consumer}: {compared_rows} rows compared"
        );

        // Every view reached the end of every partition.
        let o = offsets(&client, &consumer).await;
        let expected_next: BTreeMap<i32, i64> =
            ends.iter().map(|(p, end)| (*p, *end as i64)).collect();
        assert_eq!(o.next, expected_next, "{consumer}: offsets");

        // Every bad message: dead-lettered with its bytes and the account and seq its
        // envelope names, or not dead-lettered at all.
        let letters = client
            .query(
                "SELECT partition, \"offset\", kind, message_key, payload, account_id, seq, id \
                 FROM projector.dead_letters WHERE consumer = $1",
                &[&consumer],
            )
            .await
            .expect("dead letters");
        let mut by_place: BTreeMap<(i32, i64), &tokio_postgres::Row> = BTreeMap::new();
        for r in &letters {
            by_place.insert((r.get(0), r.get(1)), r);
        }
        let mut dead_expected = 0;
        let mut duplicates_expected = 0;
        for (index, bad) in &stream.bad {
            let place = landed[*index];
            let fate = bad.fates[v];
            let letter = by_place.get(&place);
            match fate {
                Poison | Conflict => {
                    dead_expected += 1;
                    let r = letter.unwrap_or_else(|| {
                        panic!("{consumer}: {} ({place:?}) is not dead-lettered", bad.what)
                    });
                    let kind = if fate == Poison { "poison" } else { "conflict" };
                    assert_eq!(r.get::<_, &str>(2), kind, "{consumer}: {}", bad.what);
                    assert_eq!(
                        r.get::<_, Option<Vec<u8>>>(3),
                        bad.raw.0,
                        "{consumer}: {} key",
                        bad.what
                    );
                    assert_eq!(
                        r.get::<_, Vec<u8>>(4),
                        bad.raw.1,
                        "{consumer}: {} bytes",
                        bad.what
                    );
                    assert_eq!(
                        (r.get::<_, Option<i64>>(5), r.get::<_, Option<i64>>(6)),
                        bad.names,
                        "{consumer}: {}: account and seq",
                        bad.what
                    );
                }
                Ignored | Duplicate | Applied => {
                    if fate == Duplicate {
                        duplicates_expected += 1;
                    }
                    assert!(
                        letter.is_none(),
                        "{consumer}: {} must not be dead-lettered ({fate:?})",
                        bad.what
                    );
                }
            }
        }
        assert_eq!(
            letters.len(),
            dead_expected,
            "{consumer}: only the bad messages are dead-lettered"
        );

        // The counters add up: each message once, waiting ones again when they drained.
        let still_waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM projector.waiting_events WHERE consumer = $1",
                &[&consumer],
            )
            .await
            .expect("waiting")
            .get(0);
        assert_eq!(o.accounted(), total, "{consumer}: {o:?}");
        assert_eq!(o.dead_lettered, dead_expected as i64, "{consumer}: {o:?}");
        assert_eq!(o.duplicates, duplicates_expected, "{consumer}: {o:?}");
        assert_eq!(o.waiting - o.drained, still_waiting, "{consumer}: {o:?}");

        // Parked accounts: those whose missing seq was dead-lettered, naming the dead letter;
        // the gap was filled, and eod never parks.
        let parked = client
            .query(
                "SELECT k.account_id, k.blocked_seq, k.reason, k.dead_letter_id, d.seq \
                 FROM projector.parked_accounts k \
                 LEFT JOIN projector.dead_letters d ON d.id = k.dead_letter_id \
                 WHERE k.consumer = $1",
                &[&consumer],
            )
            .await
            .expect("parked");
        let parked_set: BTreeSet<(i64, i64)> =
            parked.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(parked_set, stream.parked[v], "{consumer}: parked accounts");
        for r in &parked {
            assert_eq!(
                r.get::<_, &str>(2),
                "dead_letter",
                "{consumer}: park reason"
            );
            assert_eq!(
                r.get::<_, Option<i64>>(4),
                Some(r.get::<_, i64>(1)),
                "{consumer}: the park names the dead letter of its blocked seq"
            );
        }
    }
}
