//! No message can wedge a view or make it skip offsets: arbitrary bytes and arbitrary JSON
//! envelopes (empty, long, NUL characters, wrong types, deep nesting, huge and tiny numbers,
//! missing, repeated and unknown keys, valid envelopes with invalid data, unknown types),
//! mixed with valid events and copies of earlier messages, go through the real apply path on
//! PostgreSQL in batches of random sizes, with crashes between apply and commit and stale
//! consumers now and then, for an order-dependent view (`Trail`) and an order-independent one
//! (`Tally`).
//!
//! For every case and both views: no batch fails for its content (the owner's batches all
//! commit, a stale consumer's is fenced), every offset is committed once with a disposition,
//! each batch's counts and the counters in `projector.offsets` add up to the messages, every
//! dead letter and waiting event holds its message's exact bytes, the view's statement fails
//! only where the view itself refuses a value (Trail's CHECK), never on content decoding let
//! through, and the accounts that no bad message names hold the fold of their events, with
//! nothing parked or waiting.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::support::{tally_fold, trail_fold, Tally, Trail};
use projector_engine::event::salvage;
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{
    migrate, Applier, ApplyError, BatchOutcome, Counts, Disposition, Projection, Registry,
    SourceOrdering,
};

const TOPIC: &str = "arbitrary";
const AT: &str = "2026-11-29T10:15:00Z";

// ---------------------------------------------------------------------------------------
// Valid events

/// One valid event of account `account` at `seq`: mostly fills, some memos (only `Tally`
/// reads them), some of a type neither view reads.
fn valid_event(account: i64, seq: i64, kind: u8, n: u32) -> EventSpec {
    match kind % 10 {
        0 => EventSpec::new(
            "memo",
            account,
            seq,
            AT,
            serde_json::json!({"text": format!("note {n}"), "tags": [n, null, {"deep": [true]}]}),
        ),
        1 => EventSpec::new(
            "margin_call",
            account,
            seq,
            AT,
            serde_json::json!({"level": "0.8"}),
        ),
        _ => fill(
            account,
            seq,
            AT,
            "EURUSD",
            if n % 2 == 0 { "buy" } else { "sell" },
            &format!("{}.{:02}", 1 + n % 50, n % 100),
            &format!("1.{:05}", n % 100_000),
            "0.10",
        ),
    }
}

/// Events of 1 to 4 accounts (1 to 8 events each), interleaved in a random order that keeps
/// each account's `seq` order.
fn valid_events() -> impl Strategy<Value = Vec<EventSpec>> {
    proptest::collection::vec(1usize..=8, 1..=4)
        .prop_flat_map(|lens| {
            let total: usize = lens.iter().sum();
            (
                Just(lens.clone()),
                proptest::collection::vec(0..lens.len(), total),
                proptest::collection::vec((any::<u8>(), any::<u32>()), total),
            )
        })
        .prop_map(|(lens, picks, details)| {
            let mut next = vec![1usize; lens.len()];
            let mut out = Vec::new();
            for (pick, (kind, n)) in picks.into_iter().zip(details) {
                let Some(a) = (0..lens.len())
                    .map(|k| (pick + k) % lens.len())
                    .find(|&a| next[a] <= lens[a])
                else {
                    break;
                };
                out.push(valid_event(a as i64 + 1, next[a] as i64, kind, n));
                next[a] += 1;
            }
            out
        })
}

// ---------------------------------------------------------------------------------------
// Arbitrary JSON, as text: serde_json::Value cannot hold the numbers and strings that matter

/// JSON number text, valid and not: plain, long, exponents, and the edges of what
/// `rust_decimal`, `f64` and PostgreSQL's `numeric` hold.
fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<i64>().prop_map(|n| n.to_string()),
        4 => "-?[0-9]{1,40}(\\.[0-9]{1,40})?([eE][+-]?[0-9]{1,5})?",
        1 => Just("1e400".to_owned()),
        1 => Just("-1e309".to_owned()),
        1 => Just("1e-16384".to_owned()),
        1 => Just("0.1e-16383".to_owned()),
        1 => Just("1e-99999999999999999999".to_owned()),
        1 => Just("1e308".to_owned()),
        1 => Just("79228162514264337593543950336".to_owned()),
        1 => Just("0.00000000000000000000000000001".to_owned()),
        1 => Just("-0".to_owned()),
        1 => Just("01".to_owned()),
    ]
}

/// A JSON string literal: plain and multi-byte text, NUL and control escapes, lone and paired
/// surrogates, quotes and backslashes, sometimes long.
fn string_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        6 => "[a-zA-Z0-9 _.-]{1,8}",
        2 => "[\u{80}-\u{7ff}\u{800}-\u{ffff}\u{10000}-\u{10ffff}]{1,3}".prop_filter(
            "no surrogates in Rust strings anyway",
            |s: &String| !s.is_empty()
        ),
        1 => Just("\\u0000".to_owned()),
        1 => Just("\\u0001\\n\\t".to_owned()),
        1 => Just("\\ud800".to_owned()),
        1 => Just("\\udc00x".to_owned()),
        1 => Just("\\ud83d\\ude00".to_owned()),
        1 => Just("\\\"\\\\".to_owned()),
        1 => Just("x".repeat(300)),
    ];
    proptest::collection::vec(piece, 0..6).prop_map(|pieces| format!("\"{}\"", pieces.concat()))
}

/// Any JSON text, nested a few levels, or nested far deeper than parsers allow.
fn json_text() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        number_text(),
        string_text(),
    ];
    let nested = leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6)
                .prop_map(|items| format!("[{}]", items.join(","))),
            proptest::collection::vec((string_text(), inner), 0..6).prop_map(|fields| {
                let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    });
    prop_oneof![
        12 => nested,
        1 => (100usize..400).prop_map(|n| format!("{{\"a\":{}{}}}", "[".repeat(n), "]".repeat(n))),
        1 => (100usize..400).prop_map(|n| format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n))),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------
// Bad messages

/// The fields of an envelope, as `(key, JSON text)`, in the order written.
type Fields = Vec<(String, String)>;

fn envelope(fields: &Fields) -> Vec<u8> {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", serde_json::Value::from(k.as_str())))
        .collect();
    format!("{{{}}}", body.join(",")).into_bytes()
}

/// `data` of a fill that decoding must refuse (or, for a huge quantity, that Trail's CHECK
/// refuses), and of other types, storable or not.
fn bad_data() -> impl Strategy<Value = String> {
    let fill = |qty: &str, extra: &str| {
        format!(r#"{{"symbol":"EURUSD","side":"buy","qty":{qty},"price":"1.1"{extra}}}"#)
    };
    prop_oneof![
        2 => json_text(),
        1 => Just(fill("\"abc\"", "")),
        1 => Just(fill("1e400", "")),
        1 => Just(fill("\"0.00000000000000000000000000001\"", "")),
        1 => Just(fill("\"79228162514264337593543950336\"", "")),
        1 => Just(fill("\"-1\"", "")),
        1 => Just(fill("{}", "")),
        1 => Just(fill("\"1e5\"", "")),
        1 => Just(fill("\"5000000\"", "")),
        1 => Just(fill("\"1\"", r#","note":"a\u0000b""#)),
        1 => Just(fill("\"1\"", r#","note":1e-16384"#)),
        1 => Just(fill("\"1\"", r#","note":"\ud800""#)),
        1 => json_text().prop_map(move |v| fill("\"1\"", &format!(",\"note\":{v}"))),
        1 => Just(format!(
            r#"{{"symbol":"{}","side":"buy","qty":"1","price":"1"}}"#,
            "S".repeat(65)
        )),
        1 => Just(r#"{"symbol":"X\u0000","side":"buy","qty":"1","price":"1"}"#.to_owned()),
        1 => Just(r#"{"symbol":"X","side":"hold","qty":"1","price":"1"}"#.to_owned()),
        1 => Just(r#"{"amount":"1","reason":"a\u0000"}"#.to_owned()),
        1 => Just("[]".to_owned()),
        1 => Just("\"data\"".to_owned()),
    ]
}

/// Values a field must not have, whatever the field.
fn bad_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => json_text(),
        1 => Just("\"\"".to_owned()),
        1 => Just(format!("\"{}\"", "e".repeat(257))),
        1 => Just("\"a\\u0000b\"".to_owned()),
        1 => Just("\"fill\\u0001\"".to_owned()),
        1 => Just(format!("\"{}\"", "t".repeat(65))),
        1 => Just("1e30".to_owned()),
        1 => Just("99999999999999999999".to_owned()),
        1 => Just("-1".to_owned()),
        1 => Just("0".to_owned()),
        1 => Just("1.5".to_owned()),
        1 => Just("\"2\"".to_owned()),
        1 => Just("\"0000-12-31T23:59:59Z\"".to_owned()),
        1 => Just("\"2026-13-01T00:00:00Z\"".to_owned()),
        1 => Just("\"2026-11-29T10:15:00\"".to_owned()),
        1 => Just("\"yesterday\"".to_owned()),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Removes the field at this index (modulo the field count).
    Remove(usize),
    /// Gives the field at this index a bad value.
    Replace(usize, String),
    /// Writes the field at this index twice.
    Repeat(usize),
    /// Adds a key no envelope has.
    Extra(String, String),
    /// Replaces `data`.
    Data(String),
    /// Replaces `type`.
    Type(String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => any::<usize>().prop_map(Mutation::Remove),
        3 => (any::<usize>(), bad_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => any::<usize>().prop_map(Mutation::Repeat),
        1 => ("[a-z_]{1,12}", json_text()).prop_map(|(k, v)| Mutation::Extra(k, v)),
        4 => bad_data().prop_map(Mutation::Data),
        2 => prop_oneof![
            Just("\"fill_executed\"".to_owned()),
            Just("\"memo\"".to_owned()),
            Just("\"cash_adjusted\"".to_owned()),
            Just("\"fill_busted\"".to_owned()),
            string_text(),
        ]
        .prop_map(Mutation::Type),
    ]
}

/// The message key of a bad message.
#[derive(Debug, Clone)]
enum Key {
    /// The account of the envelope it started from.
    Account,
    None,
    Other(i64),
    Bytes(Vec<u8>),
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        6 => Just(Key::Account),
        2 => Just(Key::None),
        1 => any::<i64>().prop_map(Key::Other),
        1 => proptest::collection::vec(any::<u8>(), 0..12).prop_map(Key::Bytes),
    ]
}

#[derive(Debug, Clone)]
enum Bad {
    /// Any bytes at all.
    Bytes(Option<Vec<u8>>, Vec<u8>),
    /// Any JSON text as the whole message.
    Json(Key, String),
    /// An envelope of account 1 to 8 (1 to 4 may hold valid events) at `seq` 1 to 10, then
    /// mutated: some stay valid events, most become poison.
    Envelope {
        account: i64,
        seq: i64,
        mutations: Vec<Mutation>,
        key: Key,
    },
    /// A valid envelope padded past the payload limit.
    Oversized(i64),
}

fn bad() -> impl Strategy<Value = Bad> {
    prop_oneof![
        3 => (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(k, p)| Bad::Bytes(k, p)),
        3 => (key(), json_text()).prop_map(|(k, j)| Bad::Json(k, j)),
        12 => (
            1i64..=8,
            1i64..=10,
            proptest::collection::vec(mutation(), 1..=3),
            key()
        )
            .prop_map(|(account, seq, mutations, key)| Bad::Envelope {
                account,
                seq,
                mutations,
                key
            }),
        1 => (1i64..=8).prop_map(Bad::Oversized),
    ]
}

impl Bad {
    /// The message: key and payload.
    fn message(&self, n: usize) -> (Option<Vec<u8>>, Vec<u8>) {
        let account_key = |key: &Key, account: i64| match key {
            Key::Account => Some(account.to_string().into_bytes()),
            Key::None => None,
            Key::Other(k) => Some(k.to_string().into_bytes()),
            Key::Bytes(b) => Some(b.clone()),
        };
        match self {
            Bad::Bytes(key, payload) => (key.clone(), payload.clone()),
            Bad::Json(key, text) => (account_key(key, 1), text.clone().into_bytes()),
            Bad::Envelope {
                account,
                seq,
                mutations,
                key,
            } => {
                let mut fields: Fields = vec![
                    ("event_id".into(), format!("\"bad-{n}\"")),
                    ("type".into(), "\"fill_executed\"".into()),
                    ("account_id".into(), account.to_string()),
                    ("seq".into(), seq.to_string()),
                    ("occurred_at".into(), format!("\"{AT}\"")),
                    (
                        "data".into(),
                        r#"{"symbol":"EURUSD","side":"buy","qty":"1","price":"1"}"#.into(),
                    ),
                ];
                for m in mutations {
                    let len = fields.len().max(1);
                    match m {
                        Mutation::Remove(i) if !fields.is_empty() => {
                            fields.remove(i % len);
                        }
                        Mutation::Replace(i, v) if !fields.is_empty() => {
                            fields[i % len].1 = v.clone();
                        }
                        Mutation::Repeat(i) if !fields.is_empty() => {
                            let f = fields[i % len].clone();
                            fields.push(f);
                        }
                        Mutation::Extra(k, v) => fields.push((k.clone(), v.clone())),
                        Mutation::Data(v) => set(&mut fields, "data", v),
                        Mutation::Type(v) => set(&mut fields, "type", v),
                        _ => {}
                    }
                }
                (account_key(key, *account), envelope(&fields))
            }
            Bad::Oversized(account) => {
                let pad = "p".repeat(projector_engine::event::MAX_PAYLOAD_BYTES);
                let payload = format!(
                    r#"{{"event_id":"bad-{n}","type":"memo","account_id":{account},"seq":1,"occurred_at":"{AT}","data":{{"pad":"{pad}"}}}}"#
                );
                (Some(account.to_string().into_bytes()), payload.into_bytes())
            }
        }
    }
}

fn set(fields: &mut Fields, key: &str, value: &str) {
    match fields.iter_mut().find(|(k, _)| k == key) {
        Some(f) => f.1 = value.to_owned(),
        None => fields.push((key.to_owned(), value.to_owned())),
    }
}

// ---------------------------------------------------------------------------------------
// The log and its delivery

/// Something inserted between the valid events.
#[derive(Debug, Clone)]
enum Extra {
    Bad(Bad),
    /// A copy of an earlier message (index modulo the log so far): a republish.
    Copy(usize),
}

fn extra() -> impl Strategy<Value = Extra> {
    prop_oneof![
        3 => bad().prop_map(Extra::Bad),
        1 => any::<usize>().prop_map(Extra::Copy),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    /// The owner commits a batch of `len` from the stored offset.
    Deliver { len: usize },
    /// The owner applies a batch of `len` and crashes before committing.
    Crash { len: usize },
    /// A stale consumer applies a batch from `back` before the stored offset.
    Stale { back: usize, len: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (1usize..12).prop_map(|len| Step::Deliver { len }),
        1 => (1usize..12).prop_map(|len| Step::Crash { len }),
        1 => (1usize..8, 1usize..8).prop_map(|(back, len)| Step::Stale { back, len }),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    valid: Vec<EventSpec>,
    /// Each inserted before the valid event at `position % (valid + 1)`.
    extras: Vec<(usize, Extra)>,
    steps: Vec<Step>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        valid_events(),
        proptest::collection::vec((any::<usize>(), extra()), 0..14),
        proptest::collection::vec(step(), 0..16),
    )
        .prop_map(|(valid, extras, steps)| Case {
            valid,
            extras,
            steps,
        })
}

/// The partition, and which of its offsets carry bad messages (copies included).
struct Log {
    partition: Partition,
    bad: BTreeSet<i64>,
}

fn build(case: &Case) -> Log {
    let mut partition = Partition::new(TOPIC, 0);
    let mut bad = BTreeSet::new();
    let slots = case.valid.len() + 1;
    for i in 0..slots {
        for (n, (_, extra)) in case
            .extras
            .iter()
            .enumerate()
            .filter(|(_, (p, _))| p % slots == i)
        {
            match extra {
                Extra::Bad(b) => {
                    let (key, payload) = b.message(n);
                    bad.insert(partition.log.len() as i64);
                    partition.push_raw(key, payload);
                }
                Extra::Copy(k) if !partition.log.is_empty() => {
                    let from = k % partition.log.len();
                    let m = partition.log[from].clone();
                    if bad.contains(&(from as i64)) {
                        bad.insert(partition.log.len() as i64);
                    }
                    partition.push_raw(m.key, m.payload);
                }
                Extra::Copy(_) => {}
            }
        }
        if let Some(e) = case.valid.get(i) {
            partition.push_event(e);
        }
    }
    Log { partition, bad }
}

async fn stored(applier: &Applier, client: &deadpool_postgres::Client) -> i64 {
    applier
        .stored_offset(client, TOPIC, 0)
        .await
        .expect("offset")
        .unwrap_or(0)
}

/// Delivers the log by the case's steps, then to its end. Every owner batch must commit,
/// every crashed one must apply, a stale one must commit only if it is in fact at the stored
/// offset and be fenced otherwise. Returns the committed outcomes with their batches'
/// offsets.
async fn deliver(
    db: &TestDb,
    applier: &Applier,
    log: &Partition,
    steps: &[Step],
) -> Result<Vec<(Vec<i64>, BatchOutcome)>, TestCaseError> {
    let mut client = db.client().await;
    let mut stale = db.client().await;
    let mut committed = Vec::new();
    let end = log.log.len() as i64;
    let fail = |what: &str, e: ApplyError| TestCaseError::fail(format!("{what}: {e}"));
    for step in steps
        .iter()
        .cloned()
        .chain(std::iter::once(Step::Deliver { len: usize::MAX }))
    {
        let at = stored(applier, &client).await;
        match step {
            Step::Deliver { len } => loop {
                let batch = log.batch(stored(applier, &client).await, len.min(64));
                if batch.messages.is_empty() {
                    break;
                }
                let offsets = batch.messages.iter().map(|m| m.offset).collect();
                let outcome = applier
                    .apply(&mut client, &batch)
                    .await
                    .map_err(|e| fail("the owner's batch failed", e))?;
                committed.push((offsets, outcome));
                if len != usize::MAX {
                    break;
                }
            },
            Step::Crash { len } => {
                applier
                    .make_days_for(&mut client, &log.batch(at, len))
                    .await
                    .expect("the inbox's days");
                let mut tx = client.transaction().await.expect("begin");
                applier
                    .apply_in(&mut tx, &log.batch(at, len))
                    .await
                    .map_err(|e| fail("a batch failed before the crash", e))?;
                drop(tx);
            }
            Step::Stale { back, len } => {
                let from = (at - back as i64).max(0);
                let batch = log.batch(from, len);
                let offsets = batch.messages.iter().map(|m| m.offset).collect();
                match applier.apply(&mut stale, &batch).await {
                    Ok(outcome) => {
                        prop_assert_eq!(from, at, "a stale batch committed");
                        committed.push((offsets, outcome));
                    }
                    Err(ApplyError::Fenced { stored, .. }) => prop_assert_eq!(stored, at),
                    Err(e) => return Err(fail("a stale batch failed otherwise than fenced", e)),
                }
            }
        }
    }
    prop_assert_eq!(stored(applier, &client).await, end);
    Ok(committed)
}

// ---------------------------------------------------------------------------------------
// The checks

/// Each case installs its own versions of the two views. Far from 77: `engine_metrics`
/// reads `trail_v77`'s counters from the recorder this test binary shares.
static VERSION: AtomicI32 = AtomicI32::new(1001);

/// A view's expected rows (as text, sorted) for valid events.
type Fold = fn(&[EventSpec]) -> Vec<String>;

async fn run_case(db: &TestDb, case: Case) -> Result<(), TestCaseError> {
    let log = build(&case);
    let version = VERSION.fetch_add(1, Ordering::Relaxed);
    let views: [(Arc<dyn Projection>, Fold); 2] = [
        (Arc::new(Trail::new(version)), |events| {
            let fills: Vec<EventSpec> = events
                .iter()
                .filter(|e| e.event_type == "fill_executed")
                .cloned()
                .collect();
            trail_fold(&fills)
        }),
        (Arc::new(Tally::new(version)), tally_fold),
    ];
    let mut registry = Registry::new();
    for (view, _) in &views {
        registry.add(view.clone()).expect("register");
    }
    let mut client = db.client().await;
    migrate(&mut client, &registry)
        .await
        .expect("install the case's versions");

    // Accounts a bad message names (its envelope yields them, valid or not): their rows may
    // rightly differ from the fold of the valid events.
    let hit: BTreeSet<i64> = log
        .bad
        .iter()
        .filter_map(|&o| salvage(&log.partition.log[o as usize].payload).account_id)
        .collect();
    let clean: Vec<EventSpec> = case
        .valid
        .iter()
        .filter(|e| !hit.contains(&e.account_id))
        .cloned()
        .collect();
    let clean_accounts: Vec<i64> = clean.iter().map(|e| e.account_id).collect();

    for (view, fold) in &views {
        let applier = Applier::new(view.clone(), SourceOrdering::PerAccount).expect("applier");
        let consumer = view.consumer();
        let committed = deliver(db, &applier, &log.partition, &case.steps).await?;
        check_batches(&consumer, &log.partition, &committed)?;
        let totals = committed.iter().fold(Counts::default(), |mut t, (_, o)| {
            t += &o.counts;
            t
        });
        check_counters(&client, &consumer, log.partition.log.len(), &totals).await?;
        check_kept_bytes(&client, &consumer, &log.partition, &committed, &totals).await?;

        // The accounts no bad message names hold the fold of their events, and nothing of
        // theirs is parked or waits.
        let table = projector_engine::projection::render(&**view, &view.tables()[0]);
        let rows: Vec<String> = client
            .query(
                &format!("SELECT t::text FROM {table} t WHERE account_id = ANY($1) ORDER BY 1"),
                &[&clean_accounts],
            )
            .await
            .expect("rows")
            .iter()
            .map(|r| r.get(0))
            .collect();
        prop_assert_eq!(
            rows,
            fold(&clean),
            "{}: accounts no bad message names",
            consumer
        );
        let stuck: i64 = client
            .query_one(
                "SELECT (SELECT count(*) FROM projector.parked_accounts \
                         WHERE consumer = $1 AND account_id = ANY($2)) \
                      + (SELECT count(*) FROM projector.waiting_events \
                         WHERE consumer = $1 AND account_id = ANY($2))",
                &[&consumer, &clean_accounts],
            )
            .await
            .expect("parked and waiting")
            .get(0);
        prop_assert_eq!(stuck, 0, "{}: a clean account is parked or waits", consumer);
    }
    Ok(())
}

/// Each committed batch has one disposition per message, by offset in order, of a kind this
/// source can produce, and its counts add up to its messages; together the batches commit
/// every offset of the log once.
fn check_batches(
    consumer: &str,
    log: &Partition,
    committed: &[(Vec<i64>, BatchOutcome)],
) -> Result<(), TestCaseError> {
    let mut seen = BTreeSet::new();
    for (offsets, outcome) in committed {
        let got: Vec<i64> = outcome.dispositions.iter().map(|(o, _)| *o).collect();
        prop_assert_eq!(&got, offsets, "{}: dispositions by offset", consumer);
        let c = &outcome.counts;
        prop_assert_eq!(
            c.applied + c.ignored + c.duplicates() + c.dead_lettered() + c.waiting,
            offsets.len() as u64 + c.drained,
            "{}: a batch's counts {:?} do not add up to its {} messages",
            consumer,
            c,
            offsets.len()
        );
        for (offset, d) in &outcome.dispositions {
            prop_assert!(
                matches!(
                    d,
                    Disposition::Applied
                        | Disposition::Ignored
                        | Disposition::Duplicate
                        | Disposition::Waiting
                        | Disposition::DeadLettered
                ),
                "{}: offset {}: {:?} without a rebuild",
                consumer,
                offset,
                d
            );
            prop_assert!(
                seen.insert(*offset),
                "{}: offset {} committed twice",
                consumer,
                offset
            );
        }
    }
    let all: BTreeSet<i64> = (0..log.log.len() as i64).collect();
    prop_assert_eq!(seen, all, "{}: every offset committed once", consumer);
    Ok(())
}

/// The counters in `projector.offsets` are the committed batches' counts and add up to the
/// messages of the log.
async fn check_counters(
    client: &deadpool_postgres::Client,
    consumer: &str,
    messages: usize,
    totals: &Counts,
) -> Result<(), TestCaseError> {
    let r = client
        .query_one(
            "SELECT next_offset, applied, ignored, duplicates, dead_lettered, waiting, drained \
             FROM projector.offsets WHERE consumer = $1 AND topic = $2 AND partition = 0",
            &[&consumer, &TOPIC],
        )
        .await
        .expect("the offset row");
    let got: [i64; 7] = std::array::from_fn(|i| r.get(i));
    let n = |v: u64| v as i64;
    prop_assert_eq!(
        got,
        [
            messages as i64,
            n(totals.applied),
            n(totals.ignored),
            n(totals.duplicates()),
            n(totals.dead_lettered()),
            n(totals.waiting),
            n(totals.drained)
        ],
        "{}: projector.offsets against the committed batches",
        consumer
    );
    prop_assert_eq!(
        got[1] + got[2] + got[3] + got[4] + got[5] - got[6],
        messages as i64,
        "{}: projector.offsets' counters add up to the messages",
        consumer
    );
    Ok(())
}

/// Every dead letter and every event still waiting holds its message's exact key and bytes;
/// every message dead-lettered has its dead letter, once; the view's statement failed only on
/// a value the view itself refuses (Trail's CHECK), never on content decoding let through.
async fn check_kept_bytes(
    client: &deadpool_postgres::Client,
    consumer: &str,
    log: &Partition,
    committed: &[(Vec<i64>, BatchOutcome)],
    totals: &Counts,
) -> Result<(), TestCaseError> {
    let dead = client
        .query(
            "SELECT \"offset\", kind, message_key, payload, error FROM projector.dead_letters \
             WHERE consumer = $1 AND topic = $2 AND partition = 0",
            &[&consumer, &TOPIC],
        )
        .await
        .expect("dead letters");
    let mut dead_offsets = BTreeSet::new();
    for r in &dead {
        let (offset, kind, key, payload, error): (i64, String, Option<Vec<u8>>, Vec<u8>, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let m = &log.log[offset as usize];
        prop_assert!(
            payload == m.payload && key == m.key,
            "{}: the dead letter at offset {} does not hold the message's bytes",
            consumer,
            offset
        );
        prop_assert!(
            kind != "apply_failed" || error.contains("violates check constraint"),
            "{}: the view's statement failed on offset {}, content decoding let through: {}\npayload: {}",
            consumer,
            offset,
            error,
            String::from_utf8_lossy(&m.payload)
        );
        dead_offsets.insert(offset);
    }
    prop_assert_eq!(
        dead.len() as u64,
        totals.dead_lettered(),
        "{}: dead letters written against counted",
        consumer
    );
    let mut waited = BTreeSet::new();
    for (_, outcome) in committed {
        for (offset, d) in &outcome.dispositions {
            match d {
                Disposition::DeadLettered => prop_assert!(
                    dead_offsets.contains(offset),
                    "{}: offset {} was dead-lettered without a dead letter",
                    consumer,
                    offset
                ),
                Disposition::Waiting => {
                    waited.insert(*offset);
                }
                _ => {}
            }
        }
    }
    for offset in &dead_offsets {
        let dead_lettered = committed.iter().any(|(_, o)| {
            o.dispositions
                .iter()
                .any(|(p, d)| p == offset && *d == Disposition::DeadLettered)
        });
        prop_assert!(
            dead_lettered || waited.contains(offset),
            "{}: a dead letter at offset {} that neither was dead-lettered nor waited",
            consumer,
            offset
        );
    }
    let waiting = client
        .query(
            "SELECT \"offset\", message_key, payload FROM projector.waiting_events \
             WHERE consumer = $1",
            &[&consumer],
        )
        .await
        .expect("waiting events");
    for r in &waiting {
        let (offset, key, payload): (i64, Option<Vec<u8>>, Vec<u8>) =
            (r.get(0), r.get(1), r.get(2));
        let m = &log.log[offset as usize];
        prop_assert!(
            payload == m.payload && key == m.key && waited.contains(&offset),
            "{}: the waiting event at offset {} does not hold the bytes of a message that waited",
            consumer,
            offset
        );
    }
    Ok(())
}

#[test]
fn no_message_wedges_a_view_or_makes_it_skip_an_offset() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let db = rt.block_on(TestDb::new(&Registry::new()));
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |case| rt.block_on(run_case(&db, case)));
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The generators reach what the property is about: over a fixed set of cases, every kind of
/// bad message occurs, some poison names a valid account, and some cases leave accounts
/// clean. Without this, a generator that stopped producing, say, valid envelopes with bad
/// data would leave the property test passing and proving less.
#[test]
fn the_generators_reach_every_kind_of_bad_message() {
    use proptest::strategy::ValueTree;
    let mut runner = TestRunner::deterministic();
    let mut kinds = BTreeMap::new();
    let (mut named_valid, mut clean_cases) = (0, 0);
    for _ in 0..64 {
        let case = case().new_tree(&mut runner).expect("a case").current();
        let log = build(&case);
        let valid: BTreeSet<i64> = case.valid.iter().map(|e| e.account_id).collect();
        let mut hit = BTreeSet::new();
        for (n, (_, extra)) in case.extras.iter().enumerate() {
            if let Extra::Bad(b) = extra {
                let kind = match b {
                    Bad::Bytes(..) => "bytes",
                    Bad::Json(..) => "json",
                    Bad::Envelope { .. } => {
                        let (key, payload) = b.message(n);
                        let message = projector_engine::Message::new(0, key, payload);
                        match projector_engine::decode_envelope(&message) {
                            Ok(_) => "envelope that decodes",
                            Err(_) => "envelope that does not",
                        }
                    }
                    Bad::Oversized(_) => "oversized",
                };
                *kinds.entry(kind).or_insert(0) += 1;
            }
        }
        for &o in &log.bad {
            if let Some(a) = salvage(&log.partition.log[o as usize].payload).account_id {
                hit.insert(a);
            }
        }
        named_valid += usize::from(hit.iter().any(|a| valid.contains(a)));
        clean_cases += usize::from(valid.iter().any(|a| !hit.contains(a)));
    }
    for kind in [
        "bytes",
        "json",
        "envelope that decodes",
        "envelope that does not",
        "oversized",
    ] {
        assert!(kinds.contains_key(kind), "no {kind} in 64 cases: {kinds:?}");
    }
    assert!(named_valid > 0, "no bad message named a valid account");
    assert!(
        clean_cases > 32,
        "only {clean_cases} of 64 cases left an account clean"
    );
}
