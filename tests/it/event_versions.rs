//! Event evolution (issue 28): `fill_executed` and `fill_busted` at versions 1 and 2, one
//! upcasting layer for every path, and events of a version a view does not read yet.
//!
//! The reference every test compares with is the fold of the same logical events, all at
//! version 1, by the built-in views as they were before event versions
//! (`projector_views::previous`, whose fingerprints are those that code recorded): an
//! independent reading of the stream, with `data.side`, that knows nothing of upcasting.

use std::sync::Arc;
use std::time::Duration;

use crate::support::broker::{Broker, Kafka};
use crate::support::kafka::{publish, publish_raw, Raw};
use crate::support::process::run_output;
use crate::support::{eventually, offsets};
use projector_engine::fingerprint::{self, Verdict};
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::testkit::conformance::{dump, Rows};
use projector_engine::testkit::{bust, cash, consume, fill, EventSpec, Lcg, Partition, TestDb};
use projector_engine::{Applier, Event};
use projector_engine::{
    ApplySql, DedupMode, Disposition, Field, Projection, Registry, SourceOrdering, Upcaster,
};
use projector_rebuild::tail::Silent;
use projector_rebuild::{Cutover, Options, Outcome, Source};
use projector_views::previous::{BeforeEventVersions, PortfolioInRounds};
use projector_views::{Eod, Portfolio, Risk};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "trades";
const LIMIT: Duration = Duration::from_secs(120);
const VIEWS: [&str; 3] = ["portfolio", "risk", "eod"];

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

/// The built-in view `name` at `version`, as this build has it.
fn current(name: &str, version: i32) -> Arc<dyn Projection> {
    views().code_for(name, version).expect("the view's code")
}

/// The built-in view `name` at `version` as it was before event versions.
fn before(name: &str, version: i32) -> Arc<dyn Projection> {
    match name {
        "portfolio" => Arc::new(BeforeEventVersions::new(PortfolioInRounds::new(version))),
        "risk" => Arc::new(BeforeEventVersions::new(Risk::new(version))),
        _ => Arc::new(BeforeEventVersions::new(Eod::new(version))),
    }
}

/// `event` at version 2, written by hand (not by the upcaster under test): the quantity
/// signed by the side, no side. Other types stay as they are.
fn at_version_2(event: &EventSpec) -> EventSpec {
    if event.event_type == "cash_adjusted" {
        return event.clone();
    }
    let mut out = event.clone().with_version(2);
    let data = out.data.as_object_mut().expect("an object");
    let side = data.remove("side").expect("a version 1 trade has a side");
    let qty = data["qty"].as_str().expect("qty").to_owned();
    data["qty"] = if side == "sell" {
        format!("-{qty}").into()
    } else {
        qty.into()
    };
    out
}

/// A stream of fills, busts of earlier fills and cash movements, `per_account` events for
/// each account in turn: each event at version 1 (the reference) and as published, at
/// version 1 or 2 at random, busts included, and both for one account.
fn stream(accounts: i64, per_account: i64, seed: u64) -> (Vec<EventSpec>, Vec<EventSpec>) {
    let mut rng = Lcg(seed);
    let (mut v1, mut mixed) = (Vec::new(), Vec::new());
    let mut fills: Vec<Vec<EventSpec>> = vec![Vec::new(); accounts as usize + 1];
    let at = |seq: i64| format!("2026-11-{:02}T10:15:00Z", 20 + seq % 3);
    for seq in 1..=per_account {
        for account in 1..=accounts {
            let earlier = &fills[account as usize];
            let e = match rng.below(100) {
                n if n < 15 && !earlier.is_empty() => {
                    let original = &earlier[rng.below(earlier.len())];
                    bust(original, seq, &at(seq))
                }
                n if n < 25 => cash(
                    account,
                    seq,
                    &at(seq),
                    &format!("{}.5", rng.int(90) - 40),
                    "fee rebate",
                ),
                _ => {
                    let symbol = ["EURUSD", "USDJPY", "XAUUSD"][rng.below(3)];
                    let side = if rng.chance(45) { "sell" } else { "buy" };
                    let qty = format!("{}.{:02}", 1 + rng.below(300), rng.below(100));
                    let price = format!("{}.{:04}", 1 + rng.below(150), rng.below(10_000));
                    let f = fill(account, seq, &at(seq), symbol, side, &qty, &price, "0.25");
                    fills[account as usize].push(f.clone());
                    f
                }
            };
            let published = if rng.chance(50) {
                at_version_2(&e)
            } else {
                e.clone()
            };
            v1.push(e);
            mixed.push(published);
        }
    }
    (v1, mixed)
}

/// The log as published: every event once, in stream order, then about a quarter of them
/// again at new offsets (a relay that crashed between publish and mark), both versions.
fn with_redeliveries(events: &[EventSpec], seed: u64) -> Vec<EventSpec> {
    let mut rng = Lcg(seed);
    let mut log = events.to_vec();
    for _ in 0..events.len() / 4 {
        log.push(events[rng.below(events.len())].clone());
    }
    log
}

/// The rows of view `name` v1 after the code before event versions applied `v1` once each.
async fn reference(name: &str, v1: &[EventSpec]) -> Rows {
    let view = before(name, 1);
    let registry = Registry::new().register_arc(view.clone());
    let db = TestDb::new(&registry).await;
    let applier = Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier");
    let mut client = db.client().await;
    consume(
        &applier,
        &mut client,
        &Partition::from_events("reference", 0, v1),
        100,
    )
    .await;
    dump(&client, &*view).await
}

async fn consumed(db: &TestDb, consumer: &str) -> i64 {
    offsets(&db.client().await, consumer)
        .await
        .next
        .values()
        .sum()
}

async fn one(client: &deadpool_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

trait RegisterArc {
    fn register_arc(self, view: Arc<dyn Projection>) -> Self;
}

impl RegisterArc for Registry {
    fn register_arc(mut self, view: Arc<dyn Projection>) -> Self {
        self.add(view).expect("register");
        self
    }
}

/// Runs the live versions of `names` as `projector run` does, until `stop`.
fn live(
    registry: Registry,
    db: &TestDb,
    kafka: &Kafka,
    names: &[&str],
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let options = LiveOptions {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        refresh: Duration::from_millis(100),
        ..LiveOptions::default()
    };
    let (pool, config) = (db.pool().clone(), kafka.config(&kafka.topic(TOPIC)));
    tokio::spawn(async move {
        run_live(
            registry,
            pool,
            config,
            Arc::new(projector_engine::kafka::source::NoObserver),
            stop,
            options,
        )
        .await;
    })
}

/// Interleaved version 1 and 2 fills and busts of the same accounts, with redeliveries of
/// both, consumed live through Kafka by portfolio, risk and eod: each ends equal to the fold
/// of the distinct events by the code before event versions, all at version 1. Rebuilt from
/// the earliest offsets into v2, each gives the same rows again, and `verify` agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_versions_with_redeliveries_end_equal_to_the_fold_live_and_rebuilt() {
    let (v1, mixed) = stream(8, 12, 0x2801);
    let log = with_redeliveries(&mixed, 0x2802);
    let twos = log.iter().filter(|e| e.version() == 2).count();
    assert!(
        twos > log.len() / 4 && twos < log.len() * 3 / 4,
        "{twos} of {}",
        log.len()
    );
    assert!(log
        .iter()
        .any(|e| e.event_type == "fill_busted" && e.version() == 2));
    assert!(log
        .iter()
        .any(|e| e.event_type == "fill_busted" && e.version() == 1));

    let broker = Broker::start(&[(TOPIC, 3)]);
    let kafka = broker.kafka();
    let registry = views();
    let db = TestDb::new(&registry).await;
    publish(&kafka, &kafka.topic(TOPIC), &log).await;
    let total = log.len() as i64;

    let stop = CancellationToken::new();
    let running = live(registry.clone(), &db, &kafka, &VIEWS, stop.clone());
    for name in VIEWS {
        let consumer = format!("{name}_v1");
        eventually(
            &format!("{consumer} to consume the log"),
            || consumed(&db, &consumer),
            |n| *n >= total,
        )
        .await;
    }
    stop.cancel();
    running.await.expect("live");

    let client = db.client().await;
    for name in VIEWS {
        let expected = reference(name, &v1).await;
        assert!(
            expected.iter().any(|t| !t.is_empty()),
            "{name}: the stream makes rows"
        );
        assert_eq!(
            dump(&client, &*current(name, 1)).await,
            expected,
            "{name} v1, live"
        );
        let o = offsets(&client, &format!("{name}_v1")).await;
        assert_eq!(o.accounted(), total, "{name}: every message accounted for");
        assert_eq!(
            (o.dead_lettered, o.waiting),
            (0, 0),
            "{name}: nothing dead or waiting"
        );
    }

    for name in VIEWS {
        let mut options = Options::new(name);
        options.source = Source::Earliest;
        options.cutover = Cutover::Auto;
        options.tick = Duration::from_millis(100);
        let outcome = tokio::time::timeout(
            LIMIT,
            projector_rebuild::rebuild(
                &registry,
                db.url(),
                kafka.config(&kafka.topic(TOPIC)),
                &options,
                &Silent,
                CancellationToken::new(),
            ),
        )
        .await
        .expect("the rebuild in time")
        .expect("the rebuild");
        assert!(
            matches!(outcome, Outcome::CutOver(_)),
            "{name}: {outcome:?}"
        );
        assert_eq!(
            dump(&client, &*current(name, 2)).await,
            reference(name, &v1).await,
            "{name} v2, rebuilt from earliest"
        );
        let report = projector_rebuild::verify::verify(&client, &registry, name, (1, 2), &[])
            .await
            .expect("verify");
        assert!(report.matches() && report.rows.0 > 0, "{name}: {report:?}");
    }
}

/// A view whose own check refuses one symbol: a build with a bug in `validate`, fixed in
/// the next. The same fingerprint (`validate` is Rust the engine cannot read).
struct NoGold(Portfolio);

impl Projection for NoGold {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn version(&self) -> i32 {
        self.0.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.0.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        self.0.check_data(event)
    }
    fn dedup(&self) -> DedupMode {
        self.0.dedup()
    }
    fn many_per_account(&self) -> bool {
        self.0.many_per_account()
    }
    fn fields(&self) -> Vec<Field> {
        self.0.fields()
    }
    fn ddl(&self) -> String {
        self.0.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.0.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        self.0.apply_sql()
    }
    fn read_sql(&self) -> String {
        self.0.read_sql()
    }
    fn notices_sql(&self) -> Option<String> {
        self.0.notices_sql()
    }
    fn snapshot_sql(&self) -> Option<String> {
        self.0.snapshot_sql()
    }
    fn upcasters(&self) -> Vec<Upcaster> {
        self.0.upcasters()
    }
    fn replaces(&self) -> Vec<String> {
        self.0.replaces()
    }
    fn validate(&self, event: &Event) -> Result<(), projector_engine::Rejected> {
        if event.data.contains("XAUUSD") {
            return Err(projector_engine::Rejected::rule("gold is not traded here"));
        }
        Ok(())
    }
}

/// A version 1 fill dead-lettered by a build whose check was wrong keeps its bytes as they
/// came, and its error names the version seen; `projector dlq retry` with the fixed build
/// upcasts it and applies it, and what waited behind it follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_dead_letter_retried_after_the_fix_is_upcast() {
    let db = TestDb::new(&views()).await;
    let buggy = Applier::new(
        Arc::new(NoGold(Portfolio::new(1))),
        SourceOrdering::PerAccount,
    )
    .expect("applier");
    let v1 = [
        fill(
            5,
            1,
            "2026-11-29T10:15:00Z",
            "EURUSD",
            "buy",
            "10.50",
            "1.1",
            "0",
        ),
        fill(
            5,
            2,
            "2026-11-29T10:15:01Z",
            "XAUUSD",
            "sell",
            "2.25",
            "2650.10",
            "0",
        ),
        fill(
            5,
            3,
            "2026-11-29T10:15:02Z",
            "EURUSD",
            "sell",
            "4.00",
            "1.2",
            "0",
        ),
    ];
    let published = [v1[0].clone(), v1[1].clone(), at_version_2(&v1[2])];
    let log = Partition::from_events(TOPIC, 0, &published);
    let mut client = db.client().await;
    let outcome = buggy
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    assert_eq!(
        outcome
            .dispositions
            .iter()
            .map(|(_, d)| *d)
            .collect::<Vec<_>>(),
        [
            Disposition::Applied,
            Disposition::DeadLettered,
            Disposition::Waiting
        ]
    );
    let row = client
        .query_one("SELECT id, payload, error FROM projector.dead_letters", &[])
        .await
        .expect("the dead letter");
    let (id, payload, error): (i64, Vec<u8>, String) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        payload,
        published[1].payload(),
        "the bytes as received: version 1"
    );
    assert!(
        error.starts_with(
            "fill_executed version 1, upcast to version 2: rejected by view portfolio_v1: gold"
        ),
        "{error}"
    );

    // The fixed build is the `projector` binary: the built-in portfolio, same fingerprint.
    let out = run_output(&[
        "dlq",
        "retry",
        &id.to_string(),
        "--by",
        "carol",
        "--database-url",
        db.url(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        dump(&client, &*current("portfolio", 1)).await,
        reference("portfolio", &v1).await
    );
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
        0
    );
    assert_eq!(
        one(
            &client,
            "SELECT count(*) FROM projector.dead_letters WHERE resolution = 'retried'"
        )
        .await,
        1
    );
}

/// A view that reads fills at version 3: version 2 plus a `venue`, which its statement
/// ignores; version 2 is upcast with the venue unknown. A build that knows version 3.
struct KnowsVersion3(Arc<dyn Projection>);

impl Projection for KnowsVersion3 {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn version(&self) -> i32 {
        self.0.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.0.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        self.0.check_data(event)
    }
    fn dedup(&self) -> DedupMode {
        self.0.dedup()
    }
    fn order_independent(&self) -> bool {
        self.0.order_independent()
    }
    fn many_per_account(&self) -> bool {
        self.0.many_per_account()
    }
    fn fields(&self) -> Vec<Field> {
        self.0.fields()
    }
    fn ddl(&self) -> String {
        self.0.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.0.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        self.0.apply_sql()
    }
    fn read_sql(&self) -> String {
        self.0.read_sql()
    }
    fn notices_sql(&self) -> Option<String> {
        self.0.notices_sql()
    }
    fn snapshot_sql(&self) -> Option<String> {
        self.0.snapshot_sql()
    }
    fn upcasters(&self) -> Vec<Upcaster> {
        let mut u = self.0.upcasters();
        u.push(Upcaster::new("fill_executed", 2, |data| {
            data.set_text("venue", "unknown");
            Ok(())
        }));
        u
    }
    /// Reading version 3 is another code, whose results on versions 1 and 2 are the same.
    fn replaces(&self) -> Vec<String> {
        vec![fingerprint::of(&*self.0)]
    }
    fn validate(&self, event: &Event) -> Result<(), projector_engine::Rejected> {
        if event.event_type == "fill_executed" && !event.data.contains("\"venue\"") {
            return Err(projector_engine::Rejected::rule("version 3 has a venue"));
        }
        Ok(())
    }
}

fn knows_version_3() -> Registry {
    let mut r = Registry::new();
    for name in ["portfolio", "eod"] {
        r.add(Arc::new(KnowsVersion3(current(name, 1))))
            .expect("register");
    }
    r
}

/// A version 3 fill (a producer upgraded before the consumers) parks its account in
/// portfolio, whose later events wait behind it, and only the event itself in eod; other
/// accounts go on; `status` says why. A build that still reads version 2 passes the park by.
/// A build that upcasts 2 -> 3 drains it as soon as it starts, though no event of the
/// account comes after, and both views end equal to the fold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_event_parks_its_account_and_drains_when_a_build_that_reads_it_starts() {
    let broker = Broker::start(&[(TOPIC, 1)]);
    let kafka = broker.kafka();
    let topic = kafka.topic(TOPIC);
    let db = TestDb::new(&views()).await;
    let at = "2026-11-29T10:15:00Z";
    let a = |seq, side, qty: &str| fill(1, seq, at, "EURUSD", side, qty, "1.1", "0.1");
    let b = |seq, side, qty: &str| fill(2, seq, at, "USDJPY", side, qty, "151.2", "0");
    let v1 = [
        a(1, "buy", "10"),
        b(1, "buy", "3"),
        a(2, "sell", "4"),
        a(3, "buy", "7.5"),
        b(2, "sell", "1"),
        a(4, "sell", "1.25"),
        a(5, "buy", "2"),
    ];
    let mut messages: Vec<Raw> = Vec::new();
    for (i, e) in v1.iter().enumerate() {
        let e = if i % 2 == 1 {
            at_version_2(e)
        } else {
            e.clone()
        };
        messages.push((Some(e.key()), e.payload()));
    }
    // Account 1's seq 3 at version 3: version 2 and a venue.
    let mut three = at_version_2(&v1[3]).with_version(3);
    three.data["venue"] = "XLON".into();
    messages[3] = (Some(three.key()), three.payload());
    publish_raw(&kafka, &topic, &messages).await;

    // The build that reads fills at version 2.
    let stop = CancellationToken::new();
    let running = live(views(), &db, &kafka, &["portfolio", "eod"], stop.clone());
    for consumer in ["portfolio_v1", "eod_v1"] {
        eventually(consumer, || consumed(&db, consumer), |n| *n >= 7).await;
    }
    stop.cancel();
    running.await.expect("live");

    let client = db.client().await;
    let parks = client
        .query(
            "SELECT consumer, account_id, reason, blocked_seq, event_type, type_version, detail \
             FROM projector.parked_accounts ORDER BY consumer",
            &[],
        )
        .await
        .expect("parks");
    let parks: Vec<(String, i64, String, i64, String, i32, String)> = parks
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        })
        .collect();
    assert_eq!(parks.len(), 2, "{parks:?}");
    for (consumer, account, reason, blocked, event_type, version, detail) in &parks {
        assert_eq!(
            (
                *account,
                reason.as_str(),
                *blocked,
                event_type.as_str(),
                *version
            ),
            (1, "unknown_version", 3, "fill_executed", 3),
            "{consumer}"
        );
        assert!(
            detail
                .contains("fill_executed version 3 is newer than the version this view reads (2)"),
            "{detail}"
        );
    }
    // Portfolio never moved account 1 past what it could not apply; eod applied the rest.
    let last_seq = one(
        &client,
        "SELECT last_seq FROM projector.account_progress WHERE consumer = 'portfolio_v1' AND account_id = 1",
    )
    .await;
    assert_eq!(last_seq, 2);
    let waiting: Vec<(String, i64)> = client
        .query(
            "SELECT consumer, count(*) FROM projector.waiting_events GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .expect("waiting")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        waiting,
        [("eod_v1".to_owned(), 1), ("portfolio_v1".to_owned(), 3)]
    );
    // Account 2 is whole in both.
    let account_2 = |rows: Rows| -> Rows {
        rows.into_iter()
            .map(|t| t.into_iter().filter(|r| r.starts_with("(2,")).collect())
            .collect()
    };
    for name in ["portfolio", "eod"] {
        assert_eq!(
            account_2(dump(&client, &*current(name, 1)).await),
            account_2(reference(name, &v1).await),
            "{name}"
        );
    }
    let bootstrap = kafka.bootstrap_servers();
    let status = run_output(&[
        "status",
        "--database-url",
        db.url(),
        "--brokers",
        &bootstrap,
        "--topic",
        &topic,
    ]);
    assert!(
        status
            .stdout
            .contains("portfolio_v1 account 1 parked (unknown_version) at seq 3")
            && status
                .stdout
                .contains("it waits for a build of portfolio_v1 that reads it"),
        "{}",
        status.stdout
    );

    // A build that still reads version 2 leaves the accounts alone; one that reads 3 does not.
    let old = Applier::new(current("portfolio", 1), SourceOrdering::PerAccount).expect("old");
    let new = Applier::new(
        Arc::new(KnowsVersion3(current("portfolio", 1))),
        SourceOrdering::PerAccount,
    )
    .expect("new");
    let old = old.drainable_accounts(&client, &topic, 0, 100).await;
    assert_eq!(old.expect("old"), Vec::<i64>::new());
    let new = new.drainable_accounts(&client, &topic, 0, 100).await;
    assert_eq!(new.expect("new"), [1]);
    let registry = knows_version_3();
    for view in registry.all() {
        assert!(matches!(
            fingerprint::check(&client, &**view).await.expect("check"),
            Verdict::Replaces { .. }
        ));
    }

    // The build that reads version 3 starts: nothing new is published, it drains at start.
    let stop = CancellationToken::new();
    let running = live(registry, &db, &kafka, &["portfolio", "eod"], stop.clone());
    eventually(
        "the parks to drain",
        || one(&client, "SELECT count(*) FROM projector.parked_accounts"),
        |n| *n == 0,
    )
    .await;
    stop.cancel();
    running.await.expect("live");
    for name in ["portfolio", "eod"] {
        assert_eq!(
            dump(&client, &*current(name, 1)).await,
            reference(name, &v1).await,
            "{name}"
        );
    }
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.waiting_events").await,
        0
    );
}

/// The code before event versions registered portfolio, risk and eod v1 and applied part of
/// a stream; this build migrates the database and goes on with both versions: every version
/// keeps running (each view declares that code's fingerprint), and the rows equal the fold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_registered_by_the_code_before_event_versions_keep_running_after_the_upgrade() {
    let mut old = Registry::new();
    for name in VIEWS {
        old.add(before(name, 1)).expect("register");
    }
    let db = TestDb::new(&old).await;
    let mut client = db.client().await;
    let (v1, mixed) = stream(5, 10, 0x2803);
    let half = v1.len() / 2;
    for name in VIEWS {
        let applier = Applier::new(before(name, 1), SourceOrdering::PerAccount).expect("applier");
        consume(
            &applier,
            &mut client,
            &Partition::from_events(TOPIC, 0, &v1[..half]),
            9,
        )
        .await;
    }

    let report = projector_engine::migrate(&mut client, &views())
        .await
        .expect("migrate");
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    for name in VIEWS {
        let verdict = fingerprint::check(&client, &*current(name, 1))
            .await
            .expect("check");
        assert_eq!(
            verdict,
            Verdict::Replaces {
                recorded: fingerprint::of(&*before(name, 1))
            },
            "{name}"
        );
        // The rest of the stream, as the upgraded producers publish it: mixed versions.
        let mut log = Partition::from_events(TOPIC, 0, &v1[..half]);
        for e in &mixed[half..] {
            log.push_event(e);
        }
        let applier = Applier::new(current(name, 1), SourceOrdering::PerAccount).expect("applier");
        consume(&applier, &mut client, &log, 9).await;
        assert_eq!(
            dump(&client, &*current(name, 1)).await,
            reference(name, &v1).await,
            "{name}"
        );
    }
    // `projector migrate` with this build says nothing is left alone.
    let out = run_output(&["migrate", "--database-url", db.url()]);
    assert!(
        out.status.success()
            && !out.stderr.contains("left alone")
            && !out.stdout.contains("left alone"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}

/// The code that applied portfolio in rounds of one event per account (before it folded each
/// account's run, issue 24) registered portfolio v1 and applied part of a stream; this build
/// migrates the database and goes on: the version keeps running (portfolio declares that
/// code's fingerprint), and the rows equal the fold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portfolio_registered_by_the_code_in_rounds_keeps_running() {
    let rounds: Arc<dyn Projection> = Arc::new(PortfolioInRounds::new(1));
    let mut old = Registry::new();
    old.add(rounds.clone()).expect("register");
    let db = TestDb::new(&old).await;
    let mut client = db.client().await;
    let (v1, mixed) = stream(5, 10, 0x2804);
    let half = v1.len() / 2;
    let applier = Applier::new(rounds.clone(), SourceOrdering::PerAccount).expect("applier");
    consume(
        &applier,
        &mut client,
        &Partition::from_events(TOPIC, 0, &mixed[..half]),
        9,
    )
    .await;

    let report = projector_engine::migrate(&mut client, &views())
        .await
        .expect("migrate");
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let verdict = fingerprint::check(&client, &*current("portfolio", 1))
        .await
        .expect("check");
    assert_eq!(
        verdict,
        Verdict::Replaces {
            recorded: fingerprint::of(&*rounds)
        }
    );
    let log = Partition::from_events(TOPIC, 0, &mixed);
    let applier =
        Applier::new(current("portfolio", 1), SourceOrdering::PerAccount).expect("applier");
    consume(&applier, &mut client, &log, 9).await;
    assert_eq!(
        dump(&client, &*current("portfolio", 1)).await,
        reference("portfolio", &v1).await
    );
    let out = run_output(&["migrate", "--database-url", db.url()]);
    assert!(
        out.status.success()
            && !out.stderr.contains("left alone")
            && !out.stdout.contains("left alone"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}
