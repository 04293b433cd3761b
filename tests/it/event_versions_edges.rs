//! Event versions at their edges (issue 28), beside `event_versions.rs`: a message of a
//! version a view reads, or does not read yet, is never lost, applied twice or skipped, and
//! never stops a view (a panicking upcaster, a readable copy of a held event, copies of one
//! event at two versions, a build that reads held events, the dead-letter policy, a type
//! version that is not one). The tests were written by a review of event versions.
//!
//! Every test compares with the fold of the same logical events at version 1 by the built-in
//! views as they were before event versions (`projector_views::previous`), as
//! `event_versions.rs` does: a reading of the stream that knows nothing of upcasting.

use std::sync::Arc;

use projector_engine::testkit::conformance::{dump, Rows};
use projector_engine::testkit::{consume, fill, EventSpec, Partition, TestDb};
use projector_engine::{
    Applier, ApplySql, Counts, Data, DedupMode, Event, Field, Projection, Registry, SourceOrdering,
    UnknownVersion, Upcaster,
};
use projector_views::previous::{BeforeEventVersions, PortfolioInRounds};
use projector_views::Eod;

const TOPIC: &str = "trades";
const AT: &str = "2026-11-29T10:15:00Z";

fn views() -> Registry {
    projector_views::registry().expect("the built-in views")
}

/// The built-in view `name` v1, as this build has it.
fn current(name: &str) -> Arc<dyn Projection> {
    views().code_for(name, 1).expect("the view's code")
}

/// The built-in view `name` v1 as it was before event versions.
fn before(name: &str) -> Arc<dyn Projection> {
    match name {
        // Portfolio before event versions was applied in rounds (views/src/previous.rs).
        "portfolio" => Arc::new(BeforeEventVersions::new(PortfolioInRounds::new(1))),
        _ => Arc::new(BeforeEventVersions::new(Eod::new(1))),
    }
}

/// The rows of view `name` v1 after the code before event versions applied `v1` once each.
async fn reference(name: &str, v1: &[EventSpec]) -> Rows {
    let view = before(name);
    let mut registry = Registry::new();
    registry.add(view.clone()).expect("register");
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

/// A version 1 fill at version 2, written by hand: the quantity signed by the side, no side.
fn v2(event: &EventSpec) -> EventSpec {
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

/// A version 1 fill at version 3: version 2 and a venue.
fn v3(event: &EventSpec) -> EventSpec {
    let mut out = v2(event).with_version(3);
    out.data["venue"] = "XLON".into();
    out
}

/// Version 1 of a trade into version 2, as the built-in upcaster does (for tests whose view
/// brings its own).
fn side_into_sign(d: &mut Data) -> Result<(), String> {
    let qty = d.decimal("qty")?.ok_or("data.qty is missing")?;
    let signed = match d.text("side")?.as_deref() {
        Some("sell") => -qty,
        _ => qty,
    };
    d.remove("side");
    d.set_decimal("qty", signed);
    Ok(())
}

/// The step 2 -> 3 of fills: a venue, unknown for older events.
fn venue() -> Upcaster {
    Upcaster::new("fill_executed", 2, |d| {
        d.set_text("venue", "unknown");
        Ok(())
    })
}

/// `inner` reading its events through other upcasters, under another unknown-version policy.
struct Reads {
    inner: Arc<dyn Projection>,
    upcasters: Vec<Upcaster>,
    policy: Option<UnknownVersion>,
}

impl Reads {
    /// `inner` with its own upcasters and these after them.
    fn plus(inner: Arc<dyn Projection>, more: Vec<Upcaster>) -> Self {
        let mut upcasters = inner.upcasters();
        upcasters.extend(more);
        Self {
            inner,
            upcasters,
            policy: None,
        }
    }

    /// `inner` reading through `upcasters` only.
    fn only(inner: Arc<dyn Projection>, upcasters: Vec<Upcaster>) -> Self {
        Self {
            inner,
            upcasters,
            policy: None,
        }
    }

    fn policy(mut self, policy: UnknownVersion) -> Self {
        self.policy = Some(policy);
        self
    }
}

impl Projection for Reads {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn version(&self) -> i32 {
        self.inner.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.inner.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        self.inner.check_data(event)
    }
    fn dedup(&self) -> DedupMode {
        self.inner.dedup()
    }
    fn order_independent(&self) -> bool {
        self.inner.order_independent()
    }
    fn many_per_account(&self) -> bool {
        self.inner.many_per_account()
    }
    fn fields(&self) -> Vec<Field> {
        self.inner.fields()
    }
    fn ddl(&self) -> String {
        self.inner.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.inner.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        self.inner.apply_sql()
    }
    fn read_sql(&self) -> String {
        self.inner.read_sql()
    }
    fn notices_sql(&self) -> Option<String> {
        self.inner.notices_sql()
    }
    fn snapshot_sql(&self) -> Option<String> {
        self.inner.snapshot_sql()
    }
    fn validate(&self, event: &Event) -> Result<(), projector_engine::Rejected> {
        self.inner.validate(event)
    }
    fn upcasters(&self) -> Vec<Upcaster> {
        self.upcasters.clone()
    }
    fn unknown_version(&self) -> UnknownVersion {
        self.policy.unwrap_or_else(|| self.inner.unknown_version())
    }
}

async fn one(client: &deadpool_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

fn applier(view: impl Projection + 'static) -> Applier {
    Applier::new(Arc::new(view), SourceOrdering::PerAccount).expect("applier")
}

/// An upcaster is a view's own Rust code, as `validate` is: a panic in it (an `unwrap` on
/// data it did not expect) poisons that event for the view, as a panic in `validate` does.
/// Before, it ended the partition's worker with the batch in its hands, and the restarted
/// worker met the same event again: the partition stopped for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_panicking_upcaster_dead_letters_its_event_and_the_partition_goes_on() {
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let panicky = Upcaster::new("fill_executed", 1, |d| {
        if d.text("symbol")?.as_deref() == Some("BOOM") {
            panic!("an upcaster's bug");
        }
        side_into_sign(d)
    });
    let view = Reads::only(
        current("portfolio"),
        vec![panicky, Upcaster::new("fill_busted", 1, side_into_sign)],
    );
    let events = [
        fill(1, 1, AT, "EURUSD", "buy", "10", "1.1", "0"),
        fill(1, 2, AT, "BOOM", "buy", "1", "1", "0"),
        fill(1, 3, AT, "EURUSD", "sell", "4", "1.2", "0"),
        fill(2, 1, AT, "EURUSD", "buy", "3", "1.1", "0"),
    ];
    let applier = applier(view);
    let log = Partition::from_events(TOPIC, 0, &events);
    consume(&applier, &mut client, &log, 2).await;
    let dead: Vec<(i64, i64, String)> = client
        .query(
            "SELECT account_id, seq, error FROM projector.dead_letters ORDER BY id",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].0, dead[0].1), (1, 2));
    assert!(
        dead[0].2.contains("fill_executed version 1") && dead[0].2.contains("an upcaster's bug"),
        "{}",
        dead[0].2
    );
    assert_eq!(
        one(
            &client,
            "SELECT count(*) FROM projector.parked_accounts WHERE account_id = 1 AND reason = 'dead_letter' AND blocked_seq = 2"
        )
        .await,
        1
    );
    // Account 1 stops at its dead letter, account 2 is whole.
    assert_eq!(
        dump(&client, &*current("portfolio")).await,
        reference("portfolio", &[events[0].clone(), events[3].clone()]).await
    );
}

/// A producer upgraded to version 3 before the consumers, then rolled back and published
/// the same event again at version 2 (same id, same `occurred_at`: the same event). The
/// view reads version 2: the copy it can read takes the held one's place, and the account
/// goes on; nothing waits for a build that may never come. A redelivery of the version 3
/// copy later, read by a build that reads it, is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_readable_copy_of_a_held_event_takes_its_place_and_releases_the_account() {
    let f1 = fill(1, 1, AT, "EURUSD", "buy", "10", "1.1", "0.1");
    let f2 = fill(1, 2, AT, "EURUSD", "sell", "4", "1.2", "0.1");
    let f3 = fill(1, 3, AT, "EURUSD", "buy", "2", "1.3", "0");
    let f4 = fill(1, 4, AT, "EURUSD", "sell", "1", "1.25", "0");
    let g1 = fill(2, 1, AT, "USDJPY", "buy", "3", "151.2", "0");
    let v1 = [f1.clone(), f2.clone(), f3.clone(), f4.clone(), g1.clone()];
    // Account 1's seq 2 comes at version 3 first; seq 4 waits behind it in portfolio.
    let published = [
        f1.clone(),
        v3(&f2),
        v2(&f4),
        g1.clone(),
        v2(&f2),
        f3.clone(),
    ];
    for name in ["portfolio", "eod"] {
        let expected = reference(name, &v1).await;
        // The copy in a later batch than the held event, and in the same one.
        for batch_len in [1, 10] {
            let db = TestDb::new(&views()).await;
            let mut client = db.client().await;
            let applier = applier(Reads::plus(current(name), Vec::new()));
            let log = Partition::from_events(TOPIC, 0, &published);
            let outcomes = consume(&applier, &mut client, &log, batch_len).await;
            let what = format!("{name}, batches of {batch_len}");
            // Every message counted once; what waited, counted again as it left.
            let c = outcomes.iter().fold(Counts::default(), |mut t, o| {
                t += &o.counts;
                t
            });
            assert_eq!(
                c.applied + c.ignored + c.duplicates() + c.dead_lettered() + c.waiting - c.drained,
                published.len() as u64,
                "{what}: {c:?}"
            );
            assert_eq!(dump(&client, &*current(name)).await, expected, "{what}");
            assert_eq!(
                one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
                0,
                "{what}"
            );
            assert_eq!(
                one(&client, "SELECT count(*) FROM projector.waiting_events").await,
                0,
                "{what}"
            );
            assert_eq!(
                one(&client, "SELECT count(*) FROM projector.dead_letters").await,
                0,
                "{what}"
            );
            // A build that reads version 3 finds nothing to drain, and the version 3 copy
            // redelivered is a duplicate to it.
            let reads_3 = applier_for_3(name);
            assert_eq!(
                reads_3
                    .drainable_accounts(&client, TOPIC, 0, 100)
                    .await
                    .expect("drainable"),
                Vec::<i64>::new(),
                "{what}"
            );
            let mut again = Partition::from_events(TOPIC, 0, &published);
            again.push_event(&v3(&f2));
            let outcomes = consume(&reads_3, &mut client, &again, batch_len).await;
            let last = outcomes.last().expect("the redelivery's batch");
            assert_eq!(
                (last.counts.applied, last.counts.duplicates()),
                (0, 1),
                "{what}"
            );
            assert_eq!(dump(&client, &*current(name)).await, expected, "{what}");
        }
    }
}

fn applier_for_3(name: &str) -> Applier {
    applier(Reads::plus(current(name), vec![venue()]))
}

/// The same event re-encoded by a producer upgrade, at version 1 and at version 2 (same id,
/// same `occurred_at`), is one event to every view whatever the order and batching; and the
/// same id with another `occurred_at` is another event (a conflict in portfolio, a second
/// event to eod's sums), whatever the versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_one_event_at_versions_1_and_2_are_duplicates_and_a_restamped_one_is_not() {
    let f1 = fill(1, 1, AT, "EURUSD", "buy", "10", "1.1", "0.1");
    let f2 = fill(1, 2, AT, "EURUSD", "sell", "4", "1.2", "0.1");
    let f3 = fill(1, 3, AT, "EURUSD", "buy", "2", "1.3", "0");
    let v1 = [f1.clone(), f2.clone(), f3.clone()];
    let published = [
        f1.clone(),
        v2(&f1),
        v2(&f2),
        f2.clone(),
        f3.clone(),
        v2(&f3),
        v2(&f2),
    ];
    for name in ["portfolio", "eod"] {
        let expected = reference(name, &v1).await;
        for batch_len in [1, 3, 10] {
            let db = TestDb::new(&views()).await;
            let mut client = db.client().await;
            let applier = applier(Reads::plus(current(name), Vec::new()));
            let outcomes = consume(
                &applier,
                &mut client,
                &Partition::from_events(TOPIC, 0, &published),
                batch_len,
            )
            .await;
            let what = format!("{name}, batches of {batch_len}");
            assert_eq!(dump(&client, &*current(name)).await, expected, "{what}");
            let applied: u64 = outcomes.iter().map(|o| o.counts.applied).sum();
            let duplicates: u64 = outcomes.iter().map(|o| o.counts.duplicates()).sum();
            assert_eq!((applied, duplicates), (3, 4), "{what}");
            assert_eq!(
                one(&client, "SELECT count(*) FROM projector.dead_letters").await,
                0,
                "{what}"
            );
        }
    }
    // Restamped: the same id at version 2 with another occurred_at.
    let mut restamped = v2(&f2);
    restamped.occurred_at = "2026-11-29T10:15:01Z".to_owned();
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let applier = applier(Reads::plus(current("portfolio"), Vec::new()));
    consume(
        &applier,
        &mut client,
        &Partition::from_events(TOPIC, 0, &[f1.clone(), f2.clone(), restamped]),
        1,
    )
    .await;
    let error: String = client
        .query_one(
            "SELECT error FROM projector.dead_letters WHERE kind = 'conflict'",
            &[],
        )
        .await
        .expect("one conflict")
        .get(0);
    assert!(error.contains("occurred_at"), "{error}");
}

/// An order-independent view holds each event of a version it does not read at its own
/// `seq`, and its account is parked on the lowest. A build that reads one of them drains it
/// when it starts, even when a lower one is of a version that build does not read either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_drains_every_held_event_it_reads_not_only_the_lowest() {
    let f1 = fill(1, 1, AT, "EURUSD", "buy", "10", "1.1", "0.1");
    let f2 = fill(1, 2, AT, "EURUSD", "sell", "4", "1.2", "0.1");
    let f3 = fill(1, 3, AT, "EURUSD", "buy", "2", "1.3", "0");
    let mut four = v3(&f2).with_version(4);
    four.data["desk"] = "fx".into();
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let reads_2 = applier(Reads::plus(current("eod"), Vec::new()));
    // seq 2 at version 4, seq 3 at version 3: eod applies seq 1 and holds both.
    let log = Partition::from_events(TOPIC, 0, &[f1.clone(), four, v3(&f3)]);
    consume(&reads_2, &mut client, &log, 10).await;
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.waiting_events").await,
        2
    );
    // A build that still reads version 2 passes the account by: it would drain it in vain.
    assert_eq!(
        reads_2
            .drainable_accounts(&client, TOPIC, 0, 100)
            .await
            .expect("drainable"),
        Vec::<i64>::new()
    );
    // A build that reads version 3 starts: it finds the account and drains seq 3.
    let reads_3 = applier_for_3("eod");
    let drainable = reads_3
        .drainable_accounts(&client, TOPIC, 0, 100)
        .await
        .expect("drainable");
    assert_eq!(drainable, [1]);
    reads_3
        .drain_account(&mut client, 1)
        .await
        .expect("a drain");
    assert_eq!(
        dump(&client, &*current("eod")).await,
        reference("eod", &[f1, f3]).await
    );
    let park: (i64, i32) = {
        let r = client
            .query_one(
                "SELECT blocked_seq, type_version FROM projector.parked_accounts",
                &[],
            )
            .await
            .expect("still parked on seq 2");
        (r.get(0), r.get(1))
    };
    assert_eq!(park, (2, 4));
}

/// Under the dead-letter policy an event of a version the view does not read is poison to
/// it: its account parks at it, `last_seq` never passes it, later events wait; `dlq retry`
/// by the same build leaves it open, and by a build that reads the version applies it and
/// what waited behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_dead_letter_policy_an_unknown_version_holds_its_seq_until_a_retry_reads_it() {
    let f1 = fill(1, 1, AT, "EURUSD", "buy", "10", "1.1", "0.1");
    let f2 = fill(1, 2, AT, "EURUSD", "sell", "4", "1.2", "0.1");
    let f3 = fill(1, 3, AT, "EURUSD", "buy", "2", "1.3", "0");
    let db = TestDb::new(&views()).await;
    let mut client = db.client().await;
    let reads_2 =
        applier(Reads::plus(current("portfolio"), Vec::new()).policy(UnknownVersion::DeadLetter));
    let log = Partition::from_events(TOPIC, 0, &[f1.clone(), v3(&f2), v2(&f3)]);
    consume(&reads_2, &mut client, &log, 1).await;
    let (id, error): (i64, String) = {
        let r = client
            .query_one(
                "SELECT id, error FROM projector.dead_letters WHERE account_id = 1 AND seq = 2",
                &[],
            )
            .await
            .expect("the version 3 event is a dead letter");
        (r.get(0), r.get(1))
    };
    assert!(error.contains("version 3"), "{error}");
    assert_eq!(
        one(
            &client,
            "SELECT last_seq FROM projector.account_progress WHERE account_id = 1"
        )
        .await,
        1
    );
    assert!(
        reads_2
            .retry_dead_letter(&mut client, id, "test")
            .await
            .is_err()
            || one(
                &client,
                "SELECT count(*) FROM projector.dead_letters WHERE resolved_at IS NULL"
            )
            .await
                == 1
    );
    assert_eq!(
        one(
            &client,
            "SELECT last_seq FROM projector.account_progress WHERE account_id = 1"
        )
        .await,
        1
    );
    let reads_3 = applier(
        Reads::plus(current("portfolio"), vec![venue()]).policy(UnknownVersion::DeadLetter),
    );
    reads_3
        .retry_dead_letter(&mut client, id, "test")
        .await
        .expect("retried");
    loop {
        let (_, more) = reads_3.drain_account(&mut client, 1).await.expect("drain");
        if !more {
            break;
        }
    }
    assert_eq!(
        dump(&client, &*current("portfolio")).await,
        reference("portfolio", &[f1, f2, f3]).await
    );
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
        0
    );
}

/// A `type_version` that is not an integer of 1 or more, or that is named twice, is poison
/// for every view, never a version: dead-lettered with its bytes, its account parked at it in
/// portfolio (`dead_letter`, not `unknown_version`), nothing applied, nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_version_that_is_not_a_positive_integer_or_is_named_twice_is_poison() {
    let bad = [
        "0",
        "-1",
        "2.0",
        "\"2\"",
        "1e0",
        "null",
        "99999999999",
        "2147483648",
        "2, \"type_version\": 2",
        "1, \"type_version\": 3",
    ];
    for name in ["portfolio", "eod"] {
        let db = TestDb::new(&views()).await;
        let mut client = db.client().await;
        let applier = applier(Reads::plus(current(name), Vec::new()));
        let mut log = Partition::new(TOPIC, 0);
        for (i, text) in bad.iter().enumerate() {
            let account = i as i64 + 1;
            let payload = format!(
                r#"{{"event_id":"e-{account}","type":"fill_executed","type_version":{text},"account_id":{account},"seq":1,"occurred_at":"{AT}","data":{{"symbol":"X","qty":"1","price":"1"}}}}"#
            );
            log.push_raw(Some(account.to_string().into_bytes()), payload.into_bytes());
            // Its next event waits behind it in portfolio.
            log.push_event(&v2(&fill(account, 2, AT, "X", "buy", "1", "1", "0")));
        }
        consume(&applier, &mut client, &log, 4).await;
        let dead: Vec<(Vec<u8>, String)> = client
            .query(
                "SELECT payload, error FROM projector.dead_letters ORDER BY id",
                &[],
            )
            .await
            .expect("dead letters")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(dead.len(), bad.len(), "{name}: {dead:?}");
        for ((payload, error), message) in dead.iter().zip(log.log.iter().step_by(2)) {
            assert_eq!(payload, &message.payload, "{name}");
            assert!(error.contains("type_version"), "{name}: {error}");
        }
        let reasons: Vec<String> = client
            .query("SELECT DISTINCT reason FROM projector.parked_accounts", &[])
            .await
            .expect("parks")
            .iter()
            .map(|r| r.get(0))
            .collect();
        if name == "portfolio" {
            assert_eq!(reasons, ["dead_letter"], "{name}");
        } else {
            assert!(reasons.is_empty(), "{name}: {reasons:?}");
        }
    }
}

/// A copy of an event already applied, at a version the view does not read (the producer
/// published the event again after an upgrade: same id, same `occurred_at`), is a duplicate:
/// it parks nothing and waits for nothing. An order-independent view, which does not track
/// `seq`, asks the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_copy_of_an_applied_event_is_a_duplicate_not_a_park() {
    let f1 = fill(1, 1, AT, "EURUSD", "buy", "10", "1.1", "0.1");
    let f2 = fill(1, 2, AT, "EURUSD", "sell", "4", "1.2", "0.1");
    let f3 = fill(1, 3, AT, "EURUSD", "buy", "2", "1.3", "0");
    let v1 = [f1.clone(), f2.clone(), f3.clone()];
    let published = [f1.clone(), v2(&f2), f3.clone(), v3(&f2), v3(&f1)];
    for name in ["portfolio", "eod"] {
        let expected = reference(name, &v1).await;
        for batch_len in [1, 2, 10] {
            let db = TestDb::new(&views()).await;
            let mut client = db.client().await;
            let applier = applier(Reads::plus(current(name), Vec::new()));
            let outcomes = consume(
                &applier,
                &mut client,
                &Partition::from_events(TOPIC, 0, &published),
                batch_len,
            )
            .await;
            let what = format!("{name}, batches of {batch_len}");
            assert_eq!(dump(&client, &*current(name)).await, expected, "{what}");
            let c = outcomes.iter().fold(Counts::default(), |mut t, o| {
                t += &o.counts;
                t
            });
            assert_eq!(
                (c.applied, c.duplicates(), c.waiting, c.drained),
                (3, 2, 0, 0),
                "{what}: {c:?}"
            );
            for table in ["parked_accounts", "waiting_events", "dead_letters"] {
                assert_eq!(
                    one(&client, &format!("SELECT count(*) FROM projector.{table}")).await,
                    0,
                    "{what}: {table}"
                );
            }
        }
    }
}
