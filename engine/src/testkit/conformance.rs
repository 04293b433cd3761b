//! The conformance suite: every projection, built in or plugin, must give the same rows
//! however its events are delivered, and the engine must account for every message.
//!
//! Each delivery [`Schedule`] runs against its own version of the view (its own consumer
//! name, inbox rows, offsets and tables) in one database, and every version must end with
//! rows identical to the version fed each event exactly once. That also proves the inbox key
//! includes the consumer: with `event_id` alone, every version after the first would stay
//! empty.
//!
//! Rows alone would let a broken engine pass (an event dead-lettered by every schedule, or
//! one left waiting for ever, leaves the rows equal), so each schedule's outcome is checked
//! too, against what the log it delivered must produce:
//!
//! - at the end, no dead letters but the poison the schedule planted (with its exact bytes),
//!   no parked accounts and no waiting events for the view version;
//! - every offset of the log has exactly one disposition among the committed batches, and
//!   it is the one the delivery implies (for example: an order-dependent view makes an
//!   event wait exactly when an earlier `seq` of its account comes in a later batch; an
//!   order-independent view never makes anything wait);
//! - each committed batch's counts add up to its messages, their sums equal the counters in
//!   `projector.offsets`, which add up to the messages delivered;
//! - `applied` is the number of distinct events of subscribed types. A view using the version
//!   filter counts an event whose statement wrote no row as a version-filter duplicate, so
//!   there `applied + dup_version_filter` is that number, and `dup_version_filter` is the
//!   same in every schedule;
//! - `ignored` is the number of distinct events of other types for an order-dependent view.
//!   An order-independent view does not track `seq` (only the inbox, which holds subscribed
//!   events only, knows an event), so there every delivered copy of such an event is ignored.
//!
//! Event versions: one schedule ([`Log::MixedVersions`]) delivers each event either as given
//! or as the write side would have published it at the versions the view reads (the event
//! brought there by the view's own upcasters, in the test), interleaved, with redeliveries in
//! the other version. Its rows must equal those of every other schedule: the engine's
//! upcasting of the given events equals the fold of the events at the version the view reads.
//! Give the stream at the oldest versions you support, or there is nothing to upcast.
//!
//! Rebuilds: a view that declares a snapshot statement ([`Projection::snapshot_sql`]) runs one
//! schedule more when the suite is given the write side ([`run_with`], [`WriteSide`]):
//! [`SNAPSHOT_SCHEDULE`], "rebuilt from a snapshot, then tailed". The write side books the
//! first three fifths of the stream into the relations the snapshot reads (`positions` and
//! `account_seq`, docs/views.md), the view's snapshot statement seeds a version of its own from
//! them and records the watermarks it returns, as `projector rebuild --from snapshot` does,
//! and the whole log is then tailed into that version from its first offset (the widest safety
//! margin: the snapshot holds every event at or below an account's watermark, which the engine
//! skips). Its rows must equal those of every other schedule: rebuild = live. It leaves no dead
//! letter, no parked account and no waiting event, its batches account for every offset, and
//! an order-dependent view skips exactly the events the snapshot holds (`dup_watermark`).
//!
//! Adding a schedule is one entry in [`SCHEDULES`]: a name, a version, the log it delivers
//! ([`Log`]) and how it consumes it ([`Delivery`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::apply::{Applier, BatchOutcome, Counts, Disposition};
use crate::projection::{render, Projection, Registry, SourceOrdering, SqlFile};
use crate::testkit::{consume, consume_with_crashes, EventSpec, Lcg, Partition, TestDb};

/// Builds version `v` of the view under test.
pub type Factory = Arc<dyn Fn(i32) -> Arc<dyn Projection> + Send + Sync>;

/// The rows of one view version: per table (in `tables()` order), each row as text, sorted.
pub type Rows = Vec<Vec<String>>;

/// The topic every schedule's log is on (partition 0).
const TOPIC: &str = "conformance";

const SQL: SqlFile = SqlFile::new(
    "engine/src/testkit/conformance.sql",
    include_str!("conformance.sql"),
);
const BOOK_ACCOUNT_SEQ: &str = SQL.statement("book_account_seq");
const RECORD_WATERMARKS: &str = SQL.statement("record_watermarks");
const DEAD_LETTERS: &str = SQL.statement("dead_letters");
const PARKED: &str = SQL.statement("parked");
const WAITING: &str = SQL.statement("waiting");
const OFFSET: &str = SQL.statement("offset");

/// One way of delivering the stream: the log a producer wrote, and how consumers read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// What the schedule does, for reports and failure messages.
    pub name: &'static str,
    /// The view version it runs against: its own tables, inbox rows, offsets and dead letters.
    pub version: i32,
    /// The messages on the partition.
    pub log: Log,
    /// How they are consumed.
    pub delivery: Delivery,
}

/// The messages a schedule puts on its partition, built from the stream under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Log {
    /// Every event once, in stream order.
    Once,
    /// The whole stream `n` times over, each copy at new offsets (a producer republishing).
    Repeated(usize),
    /// Each event `n` times in a row (a producer retrying without idempotence).
    EachRepeated(usize),
    /// Every event once, and after about one in three a copy of a random earlier one.
    InterleavedDuplicates,
    /// Every event once, each account's events out of `seq` order within the partition: in
    /// turn, two adjacent events swapped, then a block of four reversed (`2,1,6,5,4,3,8,7,..`).
    /// The other accounts' events keep their places.
    Reordered,
    /// Every event once, with poison planted first, in the middle and last: bytes that are
    /// not UTF-8, a truncated envelope, and a JSON array. Each must be dead-lettered with its
    /// bytes, and nothing else.
    Poisoned,
    /// Every event once, those of even `seq` at the versions the view reads
    /// (upcast by its upcasters; `EventSpec::upcast`) and the rest as given, and after about
    /// one in three a copy of a random earlier one in its other version: a producer upgraded
    /// halfway, and redeliveries of both versions, of the same accounts.
    MixedVersions,
}

/// How a schedule's partition is consumed. Every consumer resumes from the offset stored in
/// PostgreSQL, as the Kafka source does after every assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery {
    /// One consumer, batches of up to `n` messages.
    Batches(usize),
    /// One consumer, batches of up to `len`; attempts 1, 1 + `every`, 1 + 2 × `every`, ...
    /// crash between apply and commit, so their batch is delivered again.
    Crashing {
        /// Messages per batch.
        len: usize,
        /// One attempt in `every` crashes.
        every: usize,
    },
    /// One consumer, the whole log in one batch.
    WholeLog,
    /// `n` consumers of the partition at once (batches of 3, 5, 7, ...): all but one are
    /// fenced at every step, and every offset is committed once.
    ConcurrentWriters(usize),
    /// A rebuild: the version is seeded from the view's snapshot of the write side after the
    /// first `cut_percent` percent of the stream (and its watermarks recorded), then one
    /// consumer tails the whole log into it from the first offset, batches of up to `len`.
    FromSnapshot {
        /// Where in the stream the snapshot is taken, in percent of its events.
        cut_percent: usize,
        /// Messages per batch of the tail.
        len: usize,
    },
}

/// Every schedule the suite runs, in order. The first is the reference: each event once.
pub const SCHEDULES: [Schedule; 12] = [
    Schedule {
        name: "once",
        version: 1,
        log: Log::Once,
        delivery: Delivery::Batches(7),
    },
    Schedule {
        name: "twice (republished at new offsets)",
        version: 2,
        log: Log::Repeated(2),
        delivery: Delivery::Batches(7),
    },
    Schedule {
        name: "five times each",
        version: 3,
        log: Log::EachRepeated(5),
        delivery: Delivery::Batches(7),
    },
    Schedule {
        name: "interleaved duplicates",
        version: 4,
        log: Log::InterleavedDuplicates,
        delivery: Delivery::Batches(7),
    },
    Schedule {
        name: "crash between apply and commit",
        version: 5,
        log: Log::Once,
        delivery: Delivery::Crashing { len: 5, every: 3 },
    },
    Schedule {
        name: "one event per batch",
        version: 6,
        log: Log::Once,
        delivery: Delivery::Batches(1),
    },
    Schedule {
        name: "the whole stream in one batch",
        version: 7,
        log: Log::Once,
        delivery: Delivery::WholeLog,
    },
    Schedule {
        name: "three concurrent writers",
        version: 8,
        log: Log::Repeated(2),
        delivery: Delivery::ConcurrentWriters(3),
    },
    Schedule {
        name: "reordered, one event per batch",
        version: 9,
        log: Log::Reordered,
        delivery: Delivery::Batches(1),
    },
    Schedule {
        name: "reordered, in batches of five",
        version: 10,
        log: Log::Reordered,
        delivery: Delivery::Batches(5),
    },
    Schedule {
        name: "poison between the events",
        version: 11,
        log: Log::Poisoned,
        delivery: Delivery::Batches(7),
    },
    Schedule {
        name: "mixed versions, redelivered in the other",
        version: 12,
        log: Log::MixedVersions,
        delivery: Delivery::Batches(7),
    },
];

/// The schedule run, besides [`SCHEDULES`], for a view that declares a snapshot statement
/// when the suite is given the write side ([`run_with`]): rebuild = live.
pub const SNAPSHOT_SCHEDULE: Schedule = Schedule {
    name: "rebuilt from a snapshot, then tailed",
    version: 13,
    log: Log::Once,
    delivery: Delivery::FromSnapshot {
        cut_percent: 60,
        len: 7,
    },
};

/// The write side, for [`SNAPSHOT_SCHEDULE`]: how it keeps the relations a view's snapshot
/// statement reads (docs/views.md, "The write side's tables"). The suite creates them with
/// `schema`, runs `book` for each event of the stream's first part whose type is in `books`,
/// in stream order, and keeps `account_seq` itself (each account's last `seq`, whatever the
/// type), as the contract says. `projector_devkit::writeside` has the development write
/// side's (`snapshot_schema_sql`, `book_trade_sql`).
#[derive(Debug, Clone)]
pub struct WriteSide {
    /// Creates `positions`, `account_seq` and whatever else `book` needs, empty; run once.
    pub schema: String,
    /// Moves the write side's state for one event, given its wire JSON as `$1` (text), as
    /// the write side did in the transaction that assigned its `seq`.
    pub book: String,
    /// The event types `book` runs for.
    pub books: Vec<String>,
}

/// What the suite saw.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// The rows every schedule produced.
    pub rows: Rows,
    /// What each schedule delivered and what the engine counted, in [`SCHEDULES`] order,
    /// then [`SNAPSHOT_SCHEDULE`] when it ran.
    pub schedules: Vec<ScheduleReport>,
}

/// One schedule's run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScheduleReport {
    /// The schedule.
    pub schedule: Schedule,
    /// The view version's consumer name.
    pub consumer: String,
    /// Messages on the partition, every one of them consumed.
    pub messages: u64,
    /// The committed batches' counts, summed (equal to the counters in `projector.offsets`).
    pub counts: Counts,
}

/// Reads all rows of version `view`'s tables.
pub async fn dump(client: &deadpool_postgres::Client, view: &dyn Projection) -> Rows {
    let mut out = Vec::new();
    for table in view.tables() {
        let table = render(view, &table);
        // Composed per table: the view's tables, rendered for its version.
        let rows = client
            .query(&format!("SELECT t::text FROM {table} t ORDER BY 1"), &[])
            .await
            .unwrap_or_else(|e| panic!("dump {table}: {e}"));
        out.push(rows.iter().map(|r| r.get::<_, String>(0)).collect());
    }
    out
}

/// Runs every schedule of [`SCHEDULES`] for the view built by `factory` over `events`, and
/// asserts identical rows and each schedule's outcome (see the module documentation).
/// Returns the rows for further checks (golden rows, a fold computed by the test).
///
/// `events` is the write side's stream on one partition: distinct event ids, and each
/// account's events with `seq` 1, 2, 3, ... in stream order; at least one account needs two
/// events, or reordering proves nothing. The suite panics with the reason otherwise.
pub async fn run(factory: Factory, events: &[EventSpec]) -> Report {
    run_with(factory, events, None).await
}

/// [`run`], and with the write side given, [`SNAPSHOT_SCHEDULE`] too for a view that declares
/// a snapshot statement: its rows, seeded from a snapshot taken part-way and tailed, must equal
/// the others (see the module documentation). Without a snapshot statement, the same as
/// [`run`].
pub async fn run_with(
    factory: Factory,
    events: &[EventSpec],
    write_side: Option<&WriteSide>,
) -> Report {
    check_stream(events);
    let write_side = write_side.filter(|_| factory(SCHEDULES[0].version).snapshot_sql().is_some());
    let mut registry = Registry::new();
    for s in SCHEDULES
        .iter()
        .chain(write_side.map(|_| &SNAPSHOT_SCHEDULE))
    {
        registry
            .add(factory(s.version))
            .expect("register the view under test");
    }
    let db = TestDb::new(&registry).await;
    // The stream at the versions the view reads, for the mixed schedule.
    let upcasters = crate::upcast::Upcasters::new(factory(SCHEDULES[0].version).upcasters())
        .expect("the view's upcasters chain");
    let upcast: Vec<EventSpec> = events
        .iter()
        .map(|e| {
            e.upcast(&upcasters).unwrap_or_else(|err| {
                panic!("conformance: event {:?} does not upcast: {err}", e.event_id)
            })
        })
        .collect();

    let mut baseline: Option<(Rows, u64)> = None;
    let mut reports = Vec::new();
    for schedule in SCHEDULES {
        let view = factory(schedule.version);
        let applier =
            Arc::new(Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier"));
        let log = build_log(schedule.log, events, &upcast);
        let outcomes = deliver(schedule.delivery, &db, &applier, &log.partition).await;
        let client = db.client().await;
        let counts = check_outcome(&client, &*view, schedule, events, &log, &outcomes).await;
        let rows = dump(&client, &*view).await;
        match &baseline {
            None => {
                assert!(
                    rows.iter().any(|t| !t.is_empty()),
                    "{}: the events produced no rows at all",
                    view.consumer()
                );
                baseline = Some((rows.clone(), counts.dup_version_filter));
            }
            Some((expected, filtered)) => {
                assert_eq!(
                    &rows,
                    expected,
                    "{}: schedule {:?} gave rows different from delivering each event once",
                    view.consumer(),
                    schedule.name
                );
                assert_eq!(
                    counts.dup_version_filter,
                    *filtered,
                    "{}: schedule {:?}: the version filter dropped a different number of events than when each event was delivered once",
                    view.consumer(),
                    schedule.name
                );
            }
        }
        reports.push(ScheduleReport {
            schedule,
            consumer: view.consumer(),
            messages: log.partition.log.len() as u64,
            counts,
        });
    }
    let rows = baseline.map(|(rows, _)| rows).unwrap_or_default();
    if let Some(write_side) = write_side {
        reports.push(rebuilt_from_snapshot(&factory, &db, events, write_side, &rows).await);
    }
    Report {
        rows,
        schedules: reports,
    }
}

/// [`SNAPSHOT_SCHEDULE`]: seeds its version from the snapshot of the write side after the
/// stream's first part, tails the whole log into it, and checks its rows against `live`
/// (every other schedule's) and what it left behind.
async fn rebuilt_from_snapshot(
    factory: &Factory,
    db: &TestDb,
    events: &[EventSpec],
    write_side: &WriteSide,
    live: &Rows,
) -> ScheduleReport {
    let schedule = SNAPSHOT_SCHEDULE;
    let Delivery::FromSnapshot { cut_percent, .. } = schedule.delivery else {
        unreachable!("the snapshot schedule seeds from a snapshot");
    };
    let view = factory(schedule.version);
    let consumer = view.consumer();
    let cut = events.len() * cut_percent / 100;
    let mut client = db.client().await;
    let watermarks = seed_from_snapshot(&mut client, &*view, write_side, &events[..cut]).await;

    let applier =
        Arc::new(Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier"));
    let log = build_log(schedule.log, events, events);
    let outcomes = deliver(schedule.delivery, db, &applier, &log.partition).await;
    let messages = log.entries.len();
    let mut problems: Vec<String> = Vec::new();
    check_left_behind(&client, &consumer, &BTreeMap::new(), &mut problems).await;
    let totals = check_batches(&outcomes, messages, &mut problems).totals;
    check_stored_counters(&client, &consumer, messages, &totals, &mut problems).await;
    if totals.dead_lettered() != 0 {
        problems.push(format!(
            "dead-lettered {} messages; none was poison",
            totals.dead_lettered()
        ));
    }
    // An order-dependent view skips every event the snapshot holds: without that, equal rows
    // could only mean an empty snapshot and a full replay.
    if !view.order_independent() && totals.dup_watermark != cut as u64 {
        problems.push(format!(
            "skipped {} events at or below the watermarks; the snapshot holds the first {cut}",
            totals.dup_watermark
        ));
    }
    assert!(
        problems.is_empty(),
        "{consumer}: schedule {:?} (snapshot after {cut} of {} events, watermarks {watermarks:?}; {messages} messages, counts {totals:?}):\n  {}",
        schedule.name,
        events.len(),
        problems.join("\n  ")
    );
    let rows = dump(&client, &*view).await;
    assert_eq!(
        &rows,
        live,
        "{consumer}: schedule {:?} (snapshot after {cut} of {} events, watermarks {watermarks:?}) gave rows different from delivering each event once: rebuild is not live",
        schedule.name,
        events.len(),
    );
    ScheduleReport {
        schedule,
        consumer,
        messages: messages as u64,
        counts: totals,
    }
}

/// What `projector rebuild --from snapshot` does before its tail (rebuild's `seed.rs`),
/// without Kafka: the write side books `prefix` into its relations; in one `REPEATABLE READ`
/// transaction the view's snapshot statement fills the version's empty tables and returns
/// each account's watermark, recorded as the version's progress so that the tail skips what
/// the snapshot holds. Returns the watermarks.
async fn seed_from_snapshot(
    client: &mut deadpool_postgres::Client,
    view: &dyn Projection,
    write_side: &WriteSide,
    prefix: &[EventSpec],
) -> BTreeMap<i64, i64> {
    client
        .batch_execute(&write_side.schema)
        .await
        .unwrap_or_else(|e| panic!("conformance: the write side's schema: {e}"));
    let book = client
        .prepare(&write_side.book)
        .await
        .unwrap_or_else(|e| panic!("conformance: the write side's book statement: {e}"));
    let mut last_seq: BTreeMap<i64, i64> = BTreeMap::new();
    for e in prefix {
        if write_side.books.contains(&e.event_type) {
            let payload = String::from_utf8(e.payload()).expect("an event's payload is text");
            client
                .execute(&book, &[&payload])
                .await
                .unwrap_or_else(|err| {
                    panic!(
                        "conformance: the write side booking {:?}: {err}",
                        e.event_id
                    )
                });
        }
        last_seq.insert(e.account_id, e.seq);
    }
    let (accounts, seqs): (Vec<i64>, Vec<i64>) = last_seq.into_iter().unzip();
    client
        .execute(BOOK_ACCOUNT_SEQ, &[&accounts, &seqs])
        .await
        .unwrap_or_else(|e| panic!("conformance: the write side's account_seq: {e}"));

    let snapshot = view
        .snapshot_sql()
        .expect("a view with a snapshot statement");
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .expect("begin the snapshot");
    let sql = render(view, &snapshot);
    let watermarks: BTreeMap<i64, i64> = tx
        .query(&sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{}: the snapshot statement: {e}\n{sql}", view.consumer()))
        .iter()
        .map(|r| (r.get("account_id"), r.get("watermark_seq")))
        .collect();
    let (accounts, marks): (Vec<i64>, Vec<i64>) = watermarks.iter().map(|(a, w)| (*a, *w)).unzip();
    tx.execute(RECORD_WATERMARKS, &[&view.consumer(), &accounts, &marks])
        .await
        .expect("record the watermarks");
    tx.commit().await.expect("commit the snapshot");
    watermarks
}

/// Refuses a stream the suite cannot judge, with the reason.
fn check_stream(events: &[EventSpec]) {
    assert!(!events.is_empty(), "conformance: the stream is empty");
    let mut ids = BTreeSet::new();
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for e in events {
        assert!(
            ids.insert(e.event_id.as_str()),
            "conformance: event id {:?} appears twice in the stream; give each event its own id",
            e.event_id
        );
        let expected = last.get(&e.account_id).copied().unwrap_or(0) + 1;
        assert_eq!(
            e.seq, expected,
            "conformance: event {:?} of account {} has seq {}; the stream must hold each account's events with seq 1, 2, 3, ... in order",
            e.event_id, e.account_id, e.seq
        );
        last.insert(e.account_id, e.seq);
    }
    assert!(
        last.values().any(|&n| n >= 2),
        "conformance: every account has a single event; give one account at least two, or reordering proves nothing"
    );
}

/// What a log message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// The event at this index of the stream.
    Event(usize),
    /// Planted poison.
    Poison,
}

/// A schedule's partition, and what each of its messages is.
#[derive(Debug, Clone)]
struct BuiltLog {
    partition: Partition,
    /// By offset.
    entries: Vec<Entry>,
}

/// Poison planted by [`Log::Poisoned`]: none of it yields an account, so none of it may park
/// one.
const POISON: [&[u8]; 3] = [
    b"\xff\xfe not UTF-8",
    b"{\"event_id\": \"conformance-poison\", \"type\": ",
    b"[\"an array, not an envelope\"]",
];

/// The partition of `log`; `upcast` is `events` at the versions the view reads.
fn build_log(log: Log, events: &[EventSpec], upcast: &[EventSpec]) -> BuiltLog {
    let n = events.len();
    // For the mixed schedule, whether each entry is the upcast form of its event.
    let mut upcast_form: Vec<bool> = Vec::new();
    let entries: Vec<Entry> = match log {
        Log::Once => (0..n).map(Entry::Event).collect(),
        Log::Repeated(k) => (0..k).flat_map(|_| (0..n).map(Entry::Event)).collect(),
        Log::EachRepeated(k) => (0..n)
            .flat_map(|i| std::iter::repeat_n(Entry::Event(i), k))
            .collect(),
        Log::InterleavedDuplicates => {
            let mut rng = Lcg(0x5eed);
            let mut out = Vec::new();
            for i in 0..n {
                out.push(Entry::Event(i));
                if rng.below(3) == 0 {
                    out.push(Entry::Event(rng.below(i + 1)));
                }
            }
            out
        }
        Log::Reordered => reordered(events).into_iter().map(Entry::Event).collect(),
        Log::Poisoned => {
            let mut out: Vec<Entry> = (0..n).map(Entry::Event).collect();
            out.push(Entry::Poison);
            out.insert(n / 2, Entry::Poison);
            out.insert(0, Entry::Poison);
            out
        }
        Log::MixedVersions => {
            let mut rng = Lcg(0x0e0e);
            let mut out = Vec::new();
            for i in 0..n {
                // By seq, so that every account with two events has both versions.
                let later = |k: usize| events[k].seq % 2 == 0;
                out.push(Entry::Event(i));
                upcast_form.push(later(i));
                if rng.below(3) == 0 {
                    let j = rng.below(i + 1);
                    out.push(Entry::Event(j));
                    upcast_form.push(!later(j));
                }
            }
            out
        }
    };
    let mut partition = Partition::new(TOPIC, 0);
    let mut poison = POISON.iter();
    for (k, entry) in entries.iter().enumerate() {
        match entry {
            Entry::Event(i) if upcast_form.get(k).copied().unwrap_or(false) => {
                partition.push_event(&upcast[*i])
            }
            Entry::Event(i) => partition.push_event(&events[*i]),
            Entry::Poison => {
                let bytes = poison.next().expect("as many entries as poison payloads");
                partition.push_raw(None, bytes.to_vec());
            }
        }
    }
    BuiltLog { partition, entries }
}

/// The stream's indexes with each account's events permuted in place: the account keeps the
/// positions it had in the stream, and its events take them in the order two swapped, four
/// reversed, two swapped, ...
fn reordered(events: &[EventSpec]) -> Vec<usize> {
    let mut positions: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        positions.entry(e.account_id).or_default().push(i);
    }
    let mut order: Vec<usize> = (0..events.len()).collect();
    for slots in positions.values() {
        let mut permuted = Vec::with_capacity(slots.len());
        let mut rest = &slots[..];
        for block in [2, 4].into_iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (head, tail) = rest.split_at(block.min(rest.len()));
            permuted.extend(head.iter().rev());
            rest = tail;
        }
        for (slot, event) in slots.iter().zip(permuted) {
            order[*slot] = event;
        }
    }
    order
}

async fn deliver(
    delivery: Delivery,
    db: &TestDb,
    applier: &Arc<Applier>,
    log: &Partition,
) -> Vec<BatchOutcome> {
    let mut client = db.client().await;
    match delivery {
        Delivery::Batches(n) => consume(applier, &mut client, log, n).await,
        Delivery::Crashing { len, every } => {
            consume_with_crashes(applier, &mut client, log, len, |n| n % every.max(1) == 1).await
        }
        Delivery::WholeLog => consume(applier, &mut client, log, log.log.len()).await,
        // Seeded by `rebuilt_from_snapshot` before the tail.
        Delivery::FromSnapshot { len, .. } => consume(applier, &mut client, log, len).await,
        Delivery::ConcurrentWriters(writers) => {
            let log = Arc::new(log.clone());
            let mut tasks = Vec::new();
            for writer in 0..writers {
                let (applier, log, pool) = (applier.clone(), log.clone(), db.pool().clone());
                tasks.push(tokio::spawn(async move {
                    let mut client = pool.get().await.expect("connection");
                    consume(&applier, &mut client, &log, 3 + writer * 2).await
                }));
            }
            let mut outcomes = Vec::new();
            for t in tasks {
                outcomes.extend(t.await.expect("writer task"));
            }
            outcomes.sort_by_key(|o| o.next_offset);
            outcomes
        }
    }
}

/// Checks everything a schedule's run must leave behind besides the rows, and returns the
/// summed counts. Panics with every problem found.
async fn check_outcome(
    client: &deadpool_postgres::Client,
    view: &dyn Projection,
    schedule: Schedule,
    events: &[EventSpec],
    log: &BuiltLog,
    outcomes: &[BatchOutcome],
) -> Counts {
    let consumer = view.consumer();
    let subscribed = |e: &EventSpec| view.subscribes().contains(&e.event_type.as_str());
    let ordered = !view.order_independent();
    let messages = log.entries.len();
    let mut problems: Vec<String> = Vec::new();

    let planted: BTreeMap<i64, &[u8]> = log
        .entries
        .iter()
        .zip(&log.partition.log)
        .filter(|(e, _)| **e == Entry::Poison)
        .map(|(_, m)| (m.offset, m.payload.as_slice()))
        .collect();
    check_left_behind(client, &consumer, &planted, &mut problems).await;
    let committed = check_batches(outcomes, messages, &mut problems);
    let totals = committed.totals.clone();
    check_stored_counters(client, &consumer, messages, &totals, &mut problems).await;

    // The totals the log implies.
    let mut first: HashMap<usize, usize> = HashMap::new();
    for (o, entry) in log.entries.iter().enumerate() {
        if let Entry::Event(i) = entry {
            first.entry(*i).or_insert(o);
        }
    }
    let distinct_subscribed = first.keys().filter(|&&i| subscribed(&events[i])).count() as u64;
    let ignored = if ordered {
        first.keys().filter(|&&i| !subscribed(&events[i])).count()
    } else {
        log.entries
            .iter()
            .filter(|e| matches!(e, Entry::Event(i) if !subscribed(&events[*i])))
            .count()
    } as u64;
    if totals.applied + totals.dup_version_filter != distinct_subscribed {
        problems.push(format!(
            "applied {} (+ {} dropped by the version filter) events; the log holds {distinct_subscribed} distinct events of subscribed types",
            totals.applied, totals.dup_version_filter
        ));
    }
    if totals.ignored != ignored {
        problems.push(format!(
            "ignored {} events; expected {ignored} (events of types the view does not subscribe to)",
            totals.ignored
        ));
    }
    if totals.dead_lettered() != planted.len() as u64 {
        problems.push(format!(
            "dead-lettered {} messages; {} poison messages were planted",
            totals.dead_lettered(),
            planted.len()
        ));
    }
    if totals.waiting != totals.drained {
        problems.push(format!(
            "{} events started waiting but {} left the waiting table",
            totals.waiting, totals.drained
        ));
    }

    // Each disposition, as the log and the batches it was committed in imply.
    if let Some(batch_of) = committed.batch_of {
        let expected = expected_dispositions(log, events, &batch_of, ordered, &subscribed);
        for (o, (want, got)) in expected.iter().zip(&committed.dispositions).enumerate() {
            if want != got {
                let what = match log.entries[o] {
                    Entry::Event(i) => format!(
                        "event {:?} (account {}, seq {})",
                        events[i].event_id, events[i].account_id, events[i].seq
                    ),
                    Entry::Poison => "planted poison".to_owned(),
                };
                problems.push(format!(
                    "offset {o}, {what}, in batch {}: {got:?}, expected {want:?}",
                    batch_of[o]
                ));
            }
        }
    }

    assert!(
        problems.is_empty(),
        "{consumer}: schedule {:?} ({} messages, counts {totals:?}):\n  {}",
        schedule.name,
        messages,
        problems.join("\n  ")
    );
    totals
}

/// At the end, the view version's dead letters are exactly the planted poison, with its
/// bytes; no account is parked and no event waits.
async fn check_left_behind(
    client: &deadpool_postgres::Client,
    consumer: &str,
    planted: &BTreeMap<i64, &[u8]>,
    problems: &mut Vec<String>,
) {
    let dead = client
        .query(DEAD_LETTERS, &[&consumer])
        .await
        .expect("read dead letters");
    let mut found = BTreeSet::new();
    for r in &dead {
        let (offset, kind, payload, error): (i64, String, Vec<u8>, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        match planted.get(&offset) {
            Some(bytes) if kind == "poison" && payload == *bytes => {
                found.insert(offset);
            }
            _ => problems.push(format!("dead letter at offset {offset} ({kind}): {error}")),
        }
    }
    for offset in planted.keys().filter(|o| !found.contains(o)) {
        problems.push(format!(
            "the poison planted at offset {offset} is not dead-lettered with its bytes"
        ));
    }
    let parked = client
        .query(PARKED, &[&consumer])
        .await
        .expect("read parked accounts");
    for r in &parked {
        let (account, reason, blocked, detail): (i64, String, i64, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        problems.push(format!(
            "account {account} is parked ({reason}) at seq {blocked}: {detail}"
        ));
    }
    let waiting: i64 = client
        .query_one(WAITING, &[&consumer])
        .await
        .expect("count waiting events")
        .get(0);
    if waiting != 0 {
        problems.push(format!("{waiting} event(s) still wait"));
    }
}

/// The committed batches, seen per offset.
struct Committed {
    /// Each offset's disposition; offsets without one are reported as problems.
    dispositions: Vec<Disposition>,
    /// The index of the batch that committed each offset, when every offset was committed
    /// exactly once.
    batch_of: Option<Vec<usize>>,
    /// The batches' counts, summed.
    totals: Counts,
}

/// Every offset of the log has exactly one disposition among the committed batches, and
/// each batch's counts add up to its messages.
fn check_batches(
    outcomes: &[BatchOutcome],
    messages: usize,
    problems: &mut Vec<String>,
) -> Committed {
    let mut batch_of: Vec<Option<usize>> = vec![None; messages];
    let mut dispositions: Vec<Option<Disposition>> = vec![None; messages];
    let mut totals = Counts::default();
    let mut sound = true;
    for (b, outcome) in outcomes.iter().enumerate() {
        let c = &outcome.counts;
        let accounted = (c.applied + c.ignored + c.duplicates() + c.dead_lettered() + c.waiting)
            .checked_sub(c.drained);
        if accounted != Some(outcome.dispositions.len() as u64) {
            problems.push(format!(
                "a batch of {} message(s) ending at offset {} counts {c:?}, which does not add up to its messages",
                outcome.dispositions.len(),
                outcome.next_offset - 1
            ));
        }
        for &(offset, d) in &outcome.dispositions {
            match usize::try_from(offset).ok().filter(|&o| o < messages) {
                Some(o) if dispositions[o].is_none() => {
                    dispositions[o] = Some(d);
                    batch_of[o] = Some(b);
                }
                _ => {
                    sound = false;
                    problems.push(format!(
                        "offset {offset} was committed twice or is not in the log"
                    ));
                }
            }
        }
        totals += c;
    }
    let missing: Vec<usize> = (0..messages)
        .filter(|&o| dispositions[o].is_none())
        .collect();
    if !missing.is_empty() {
        sound = false;
        problems.push(format!(
            "offsets {missing:?} have no disposition in any committed batch"
        ));
    }
    Committed {
        dispositions: dispositions.into_iter().flatten().collect(),
        batch_of: sound.then(|| batch_of.into_iter().flatten().collect()),
        totals,
    }
}

/// The counters kept in `projector.offsets` are the committed batches' counts, and add up to
/// the messages delivered; the offset stands at the end of the log.
async fn check_stored_counters(
    client: &deadpool_postgres::Client,
    consumer: &str,
    messages: usize,
    totals: &Counts,
    problems: &mut Vec<String>,
) {
    let stored = client
        .query_opt(OFFSET, &[&consumer, &TOPIC])
        .await
        .expect("read the offset row");
    let Some(r) = stored else {
        problems.push("no offset row was committed".to_owned());
        return;
    };
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let got: [i64; 7] = std::array::from_fn(|i| r.get(i));
    let want = [
        messages as i64,
        as_i64(totals.applied),
        as_i64(totals.ignored),
        as_i64(totals.duplicates()),
        as_i64(totals.dead_lettered()),
        as_i64(totals.waiting),
        as_i64(totals.drained),
    ];
    if got != want {
        problems.push(format!(
            "projector.offsets holds (next_offset, applied, ignored, duplicates, dead_lettered, waiting, drained) = {got:?}; the committed batches say {want:?}"
        ));
    }
    if got[1] + got[2] + got[3] + got[4] + got[5] - got[6] != messages as i64 {
        problems.push(format!(
            "projector.offsets' counters {got:?} do not add up to the {messages} messages delivered"
        ));
    }
}

/// What must become of each message, given the (committed) batch each offset was in.
///
/// - Planted poison is dead-lettered.
/// - The first copy of an event is applied (ignored, for a type the view does not subscribe
///   to), unless the view is order-dependent and an earlier `seq` of its account first comes
///   in a later batch: then it waits. An earlier `seq` later in the same batch lets it through
///   in that batch.
/// - A later copy, for an order-dependent view, is a duplicate: its `seq` is taken. An
///   order-independent view tracks no `seq`: a copy of an event it does not subscribe to is
///   ignored again; of one it does, it is a duplicate when an earlier copy is in the same
///   batch, and otherwise `Applied`, found in the inbox by the statement ("applied before").
fn expected_dispositions(
    log: &BuiltLog,
    events: &[EventSpec],
    batch_of: &[usize],
    ordered: bool,
    subscribed: &dyn Fn(&EventSpec) -> bool,
) -> Vec<Disposition> {
    let mut first_offset: HashMap<usize, usize> = HashMap::new();
    for (o, entry) in log.entries.iter().enumerate() {
        if let Entry::Event(i) = entry {
            first_offset.entry(*i).or_insert(o);
        }
    }
    // Per event, whether an earlier seq of its account first arrives in a later batch.
    let mut waits: HashMap<usize, bool> = HashMap::new();
    let mut by_account: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for &i in first_offset.keys() {
        by_account.entry(events[i].account_id).or_default().push(i);
    }
    for mut account in by_account.into_values() {
        account.sort_by_key(|&i| events[i].seq);
        let mut latest_earlier: Option<usize> = None;
        for i in account {
            let batch = batch_of[first_offset[&i]];
            waits.insert(i, latest_earlier.is_some_and(|b| b > batch));
            latest_earlier = latest_earlier.max(Some(batch));
        }
    }
    log.entries
        .iter()
        .enumerate()
        .map(|(o, entry)| {
            let Entry::Event(i) = *entry else {
                return Disposition::DeadLettered;
            };
            let first = first_offset[&i];
            if o == first {
                if ordered && waits[&i] {
                    Disposition::Waiting
                } else if subscribed(&events[i]) {
                    Disposition::Applied
                } else {
                    Disposition::Ignored
                }
            } else if ordered {
                Disposition::Duplicate
            } else if !subscribed(&events[i]) {
                Disposition::Ignored
            } else {
                let copy_in_batch = log.entries[..o]
                    .iter()
                    .enumerate()
                    .any(|(p, e)| *e == Entry::Event(i) && batch_of[p] == batch_of[o]);
                if copy_in_batch {
                    Disposition::Duplicate
                } else {
                    Disposition::Applied
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::fill;

    fn stream(accounts: i64, per_account: i64) -> Vec<EventSpec> {
        let mut out = Vec::new();
        for seq in 1..=per_account {
            for account in 1..=accounts {
                out.push(fill(
                    account,
                    seq,
                    "2026-11-29T10:15:00Z",
                    "X",
                    "buy",
                    "1",
                    "1",
                    "0",
                ));
            }
        }
        out
    }

    #[test]
    fn every_schedule_has_its_own_version_and_name() {
        let versions: BTreeSet<i32> = SCHEDULES.iter().map(|s| s.version).collect();
        let names: BTreeSet<&str> = SCHEDULES.iter().map(|s| s.name).collect();
        assert_eq!(versions.len(), SCHEDULES.len());
        assert_eq!(names.len(), SCHEDULES.len());
        assert!(versions.iter().all(|v| *v >= 1));
        assert_eq!(SCHEDULES[0].log, Log::Once, "the reference comes first");
    }

    #[test]
    fn reordering_swaps_two_then_reverses_four_in_the_account_own_places() {
        let events = stream(2, 9);
        let order = reordered(&events);
        let seqs = |account: i64| -> Vec<i64> {
            order
                .iter()
                .map(|&i| &events[i])
                .filter(|e| e.account_id == account)
                .map(|e| e.seq)
                .collect()
        };
        assert_eq!(seqs(1), [2, 1, 6, 5, 4, 3, 8, 7, 9]);
        assert_eq!(seqs(2), [2, 1, 6, 5, 4, 3, 8, 7, 9]);
        // Each account keeps its places: the stream alternates accounts, so does the log.
        for (k, &i) in order.iter().enumerate() {
            assert_eq!(events[i].account_id, 1 + (k as i64 % 2));
        }
    }

    #[test]
    fn poison_is_planted_first_in_the_middle_and_last() {
        let events = stream(1, 4);
        let log = build_log(Log::Poisoned, &events, &events);
        use Entry::*;
        assert_eq!(
            log.entries,
            [
                Poison,
                Event(0),
                Event(1),
                Poison,
                Event(2),
                Event(3),
                Poison
            ]
        );
        assert_eq!(log.partition.log[0].payload, POISON[0]);
        assert_eq!(log.partition.log[6].payload, POISON[2]);
    }

    #[test]
    fn an_event_waits_only_for_an_earlier_seq_in_a_later_batch() {
        let events = stream(1, 4);
        let log = build_log(Log::Reordered, &events, &events);
        // Seqs 2, 1, 4, 3: in batches of one, 2 and 4 wait; in batches of two, nothing does.
        let all = |_: &EventSpec| true;
        let one = expected_dispositions(&log, &events, &[0, 1, 2, 3], true, &all);
        use Disposition::*;
        assert_eq!(one, [Waiting, Applied, Waiting, Applied]);
        let two = expected_dispositions(&log, &events, &[0, 0, 1, 1], true, &all);
        assert_eq!(two, [Applied; 4]);
        let unordered = expected_dispositions(&log, &events, &[0, 1, 2, 3], false, &all);
        assert_eq!(unordered, [Applied; 4]);
    }

    #[test]
    #[should_panic(expected = "seq 1, 2, 3")]
    fn a_stream_with_a_gap_is_refused() {
        let mut events = stream(1, 3);
        events.remove(1);
        check_stream(&events);
    }

    #[test]
    fn the_mixed_schedule_interleaves_both_versions_of_the_same_accounts() {
        let events: Vec<EventSpec> = stream(2, 6);
        let upcast: Vec<EventSpec> = events.iter().map(|e| e.clone().with_version(2)).collect();
        let log = build_log(Log::MixedVersions, &events, &upcast);
        let mut versions: BTreeMap<(i64, bool), usize> = BTreeMap::new();
        let mut copies = 0;
        let mut seen = BTreeSet::new();
        for (entry, m) in log.entries.iter().zip(&log.partition.log) {
            let Entry::Event(i) = *entry else { continue };
            let v2 = String::from_utf8_lossy(&m.payload).contains("\"type_version\":2");
            *versions.entry((events[i].account_id, v2)).or_default() += 1;
            if !seen.insert(i) {
                copies += 1;
            }
        }
        for account in [1, 2] {
            for v2 in [false, true] {
                assert!(
                    versions.get(&(account, v2)).copied().unwrap_or(0) > 0,
                    "{versions:?}"
                );
            }
        }
        assert!(copies > 0, "redeliveries");
        assert_eq!(seen.len(), events.len(), "every event");
    }
}
