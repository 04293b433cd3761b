//! A snapshot of every view version's state, lag and problems: what `projector status`
//! prints and what `projector run`'s gauges and health endpoint publish.
//!
//! The view's position is the `next_offset` stored in PostgreSQL (the only position the
//! engine trusts), the log's end is the brokers' high watermark, and the lag in seconds is
//! the age of the oldest message not consumed yet (the one at `next_offset`), read by a
//! groupless client. None of it depends on the offsets the source also commits to Kafka.
//!
//! Serialized as the stable JSON of `projector status --json`, documented field by field in
//! `docs/operations.md`. Fields are added, never renamed or removed, without raising
//! [`SCHEMA`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use projector_engine::versions::VersionState;
use projector_engine::SqlFile;
use serde::{Serialize, Serializer};

use super::error::{pg, OpsError};
use super::health::{healthy, HealthRule, Problem, ProblemKind, Severity};
use crate::kafka::log::{Extent, LogReader};

/// The statements of the snapshot (`status.sql`).
const SQL: SqlFile = SqlFile::new("ops/src/status.sql", include_str!("status.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// The version of the JSON layout.
pub const SCHEMA: u32 = 1;

/// What a snapshot covers and how it judges.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// View names to show (empty: every registered view).
    pub names: Vec<String>,
    /// The health rule.
    pub rule: HealthRule,
    /// Parked accounts listed per version, oldest first.
    pub parked_limit: i64,
    /// Measure throughput over this long (two reads of the counters); `None`: do not.
    pub sample: Option<Duration>,
    /// The running process's own supervisor, when the snapshot is that process's health:
    /// what it runs is judged as it knows it now, not as its last heartbeat said (a heartbeat
    /// that cannot be written pages too). `None` for `projector status`.
    pub local: Option<crate::processes::Local>,
}

impl Default for StatusOptions {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            rule: HealthRule::default(),
            parked_limit: 10,
            sample: None,
            local: None,
        }
    }
}

/// The whole picture.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// [`SCHEMA`].
    pub schema: u32,
    /// PostgreSQL's time when the snapshot was taken; every age is measured from it.
    pub taken_at: DateTime<Utc>,
    /// False when any problem has severity `page`.
    pub healthy: bool,
    /// The health rule's `stall_after`, in seconds.
    pub stall_after_seconds: u64,
    /// Everything wrong, pages first.
    pub problems: Vec<Problem>,
    /// Whether PostgreSQL answered.
    pub postgres: Reach,
    /// Whether the brokers answered, and the topic's partition count.
    pub kafka: KafkaStatus,
    /// The inbox table; `None` when PostgreSQL did not answer.
    pub inbox: Option<InboxStatus>,
    /// Every view version, by name and version.
    pub views: Vec<VersionStatus>,
    /// Every `projector run` process with a recent heartbeat, or one that stopped beating
    /// less than a day ago (`fresh: false`), and what each does with the versions it serves.
    pub processes: Vec<ProcessStatus>,
}

/// A `projector run` process.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessStatus {
    /// The random id of its run: two processes may share a name.
    pub run_id: String,
    /// `--instance-id`, else `<host>:<pid>`.
    pub instance: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub seen_at: DateTime<Utc>,
    /// Its heartbeat is recent; a process that is not fresh is gone (killed, or cut off from
    /// PostgreSQL), and what it last reported counts for nothing.
    pub fresh: bool,
    /// What it does with each version it serves.
    pub views: Vec<ProcessView>,
}

/// A version as one process serves it.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessView {
    /// The version.
    pub consumer: String,
    /// `starting`, `consuming`, `failing` or `skipped`.
    pub state: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// Failed starts in a row.
    pub attempts: i32,
    /// The last error while failing; why it is skipped.
    pub detail: Option<String>,
}

/// A process serving a version, as the version's status lists it (fresh processes only).
#[derive(Debug, Clone, Serialize)]
pub struct Runner {
    /// The process.
    pub instance: String,
    /// `starting`, `consuming`, `failing` or `skipped`.
    pub state: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// Failed starts in a row.
    pub attempts: i32,
    /// The last error while failing; why it is skipped.
    pub detail: Option<String>,
}

/// Whether a system answered.
#[derive(Debug, Clone, Serialize)]
pub struct Reach {
    /// It answered.
    pub reachable: bool,
    /// Why not (never a connection string).
    pub error: Option<String>,
}

/// The Kafka side.
#[derive(Debug, Clone, Serialize)]
pub struct KafkaStatus {
    /// The brokers answered and know the topic.
    pub reachable: bool,
    /// The topic.
    pub topic: String,
    /// Its partition count, when known.
    pub partitions: Option<usize>,
    /// Why not reachable.
    pub error: Option<String>,
}

/// The inbox, all versions together: its days (`projector.inbox`, one partition per UTC day
/// of the events' `occurred_at`) and the inbox before V0009.
#[derive(Debug, Clone, Serialize)]
pub struct InboxStatus {
    /// PostgreSQL's estimate of its rows (`pg_class.reltuples` of each day and of the inbox
    /// before V0009, exact right after an `ANALYZE`); `None` when a day never analyzed is
    /// over 10 MiB (counting it would read all of it); a smaller one is counted.
    pub rows_estimate: Option<i64>,
    /// Tables and indexes on disk.
    pub bytes: i64,
    /// When the oldest row was applied, or where the oldest day begins: `None` when empty.
    pub oldest_applied_at: Option<DateTime<Utc>>,
    /// Its age in seconds.
    pub oldest_age_seconds: Option<i64>,
    /// Days attached.
    pub days: usize,
    /// The oldest attached day.
    pub oldest_day: Option<chrono::NaiveDate>,
    /// Where the days made ahead stop (`projector_engine::inbox::horizon`: the end of the run
    /// of attached days from today on; a day made far ahead past a gap does not count): the
    /// engine makes `projector_engine::inbox::AHEAD_DAYS` ahead; less than a day ahead means it
    /// fell behind.
    pub partitions_until: Option<DateTime<Utc>>,
    /// Seconds from now to `partitions_until` (negative: behind).
    pub partitions_ahead_seconds: Option<i64>,
    /// Rows left in the inbox before V0009 (keyed by event id alone), estimated; 0 once
    /// `projector inbox prune` emptied it.
    pub legacy_rows_estimate: i64,
}

/// One view version.
#[derive(Debug, Clone, Serialize)]
pub struct VersionStatus {
    /// View name.
    pub name: String,
    /// Version.
    pub version: i32,
    /// `<name>_v<version>`.
    pub consumer: String,
    /// `building`, `live` or `retired` in JSON (the name stored).
    #[serde(serialize_with = "state_name")]
    pub state: VersionState,
    /// When it entered that state.
    pub state_changed_at: DateTime<Utc>,
    /// Its tables and rows were dropped (`retire --drop`).
    pub dropped: bool,
    /// The rebuild building it, while one runs.
    pub rebuild: Option<RebuildStatus>,
    /// False when one of its problems pages.
    pub healthy: bool,
    /// Messages not consumed yet over all partitions, and the oldest one's age; `None` for a
    /// retired version or when Kafka did not answer.
    pub lag: Option<Lag>,
    /// Measured throughput, when sampled.
    pub throughput: Option<Throughput>,
    /// The exact counters of `projector.offsets`, summed over partitions.
    pub counters: Counters,
    /// Dead letters.
    pub dead_letters: DeadLetters,
    /// Parked accounts.
    pub parked: Parked,
    /// Events waiting in `projector.waiting_events` for an earlier `seq`.
    pub waiting_events: i64,
    /// Per partition; empty for a retired version.
    pub partitions: Vec<PartitionStatus>,
    /// The running processes that serve it, and what each does with it.
    pub runners: Vec<Runner>,
}

/// A version's state as its stored name, the text `status --json` has always shown.
fn state_name<S: Serializer>(state: &VersionState, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.as_str())
}

/// A rebuild in progress.
#[derive(Debug, Clone, Serialize)]
pub struct RebuildStatus {
    /// `seeding` or `tailing`.
    pub phase: String,
    /// `projector rebuild --pause` is in force.
    pub paused: bool,
    /// `snapshot` or `earliest`.
    pub source: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
}

/// Lag over a version's partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Lag {
    /// Sum of the partitions' lag in messages (offsets).
    pub messages: i64,
    /// The largest partition lag in seconds; `None` when no waiting message's time could be
    /// read.
    pub seconds: Option<i64>,
}

/// Throughput over the sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Throughput {
    /// How long the sample lasted, by PostgreSQL's clock.
    pub sample_ms: i64,
    /// Messages consumed a second (every disposition).
    pub messages_per_second: i64,
    /// Events applied a second.
    pub applied_per_second: i64,
}

/// Exact counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Events whose effect is in the view.
    pub applied: i64,
    /// Events of types the view does not read.
    pub ignored: i64,
    /// Duplicates dropped, by what caught them.
    pub duplicates: Duplicates,
    /// Messages dead-lettered.
    pub dead_lettered: i64,
    /// Events that began waiting.
    pub waiting: i64,
    /// Waiting events that left the waiting table.
    pub drained: i64,
}

/// Duplicates by what caught them. The duplicate counter is a sensor: a jump means a
/// producer retrying without idempotence, a rebalance storm or a republish upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Duplicates {
    /// All of them.
    pub total: i64,
    /// Their event already holds their `seq` (ordered views).
    pub seq: i64,
    /// At or below a rebuild's snapshot watermark.
    pub watermark: i64,
    /// Caught by the inbox.
    pub inbox: i64,
    /// Caught by the view's version filter.
    pub version_filter: i64,
    /// Counted before the engine recorded kinds: `total` minus the kinds.
    pub unattributed: i64,
}

/// Dead letters of a version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeadLetters {
    /// Not resolved yet.
    pub open: i64,
    /// Ever written.
    pub total: i64,
    /// Open ones by kind (`poison`, `apply_failed`, `conflict`; every kind present).
    pub open_by_kind: BTreeMap<String, i64>,
}

/// Parked accounts of a version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Parked {
    /// How many.
    pub total: i64,
    /// By reason (`gap`, `dead_letter`, `unknown_version`; every reason present).
    pub by_reason: BTreeMap<String, i64>,
    /// The oldest, up to the listing limit.
    pub oldest: Vec<ParkedAccount>,
}

/// One parked account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParkedAccount {
    /// The account.
    pub account_id: i64,
    /// `gap` or `dead_letter`.
    pub reason: String,
    /// The `seq` it waits for.
    pub blocked_seq: i64,
    /// The dead letter holding that `seq`, for reason `dead_letter`.
    pub dead_letter_id: Option<i64>,
    /// Since when.
    pub parked_at: DateTime<Utc>,
    /// The engine's one-line explanation.
    pub detail: String,
}

/// One partition of a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionStatus {
    /// The partition.
    pub partition: i32,
    /// The stored `next_offset`; `None` when the version never committed this partition.
    pub next_offset: Option<i64>,
    /// The log's first offset, when Kafka answered.
    pub low_watermark: Option<i64>,
    /// The log's end, when Kafka answered.
    pub high_watermark: Option<i64>,
    /// Messages not consumed yet.
    pub lag_messages: Option<i64>,
    /// Age of the oldest message not consumed yet, in seconds; 0 when caught up.
    pub lag_seconds: Option<i64>,
    /// The last commit (`projector.offsets.updated_at`).
    pub last_commit_at: Option<DateTime<Utc>>,
    /// Who committed last (`--instance-id`, else `host:pid`).
    pub committed_by: Option<String>,
    /// The health rule says it makes no progress while input waits.
    pub stalled: bool,
}

const DEAD_LETTER_KINDS: [&str; 3] = ["poison", "apply_failed", "conflict"];
const PARK_REASONS: [&str; 3] = ["gap", "dead_letter", "unknown_version"];

/// One offsets row.
#[derive(Debug, Clone)]
struct OffsetRow {
    partition: i32,
    next_offset: i64,
    counters: Counters,
    committed_by: Option<String>,
    updated_at: DateTime<Utc>,
}

/// Everything read from PostgreSQL in one snapshot.
#[derive(Debug, Default)]
struct DbState {
    now: Option<DateTime<Utc>>,
    versions: Vec<(String, i32, String, VersionState, DateTime<Utc>, bool)>,
    rebuilds: HashMap<String, RebuildStatus>,
    offsets: HashMap<String, Vec<OffsetRow>>,
    dead_letters: HashMap<String, DeadLetters>,
    parked: HashMap<String, Parked>,
    waiting: HashMap<String, i64>,
    inbox: Option<InboxStatus>,
    processes: Vec<crate::processes::Process>,
}

/// Takes a snapshot: PostgreSQL first (one read-only repeatable-read transaction, so every
/// number comes from the same moment), then the brokers. PostgreSQL that cannot be
/// connected to, or Kafka that does not answer, is a problem in the result, not an error;
/// an error is a statement that failed (an unmigrated database, say).
pub async fn collect(
    pool: &Pool,
    probe: &Arc<LogReader>,
    options: &StatusOptions,
) -> Result<Status, OpsError> {
    let topic = probe.topic().to_owned();
    let mut problems = Vec::new();
    let first = match options.sample {
        Some(d) => match sample_counters(pool, &topic).await {
            Ok(first) => {
                tokio::time::sleep(d).await;
                Some(first)
            }
            Err(OpsError::Connect(e)) => {
                return Ok(unreachable(&topic, options, e.to_string()));
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    let mut db = match read_db(pool, &topic, options).await {
        Ok(db) => db,
        Err(OpsError::Connect(e)) => return Ok(unreachable(&topic, options, e.to_string())),
        Err(e) => return Err(e),
    };
    let now = db.now.unwrap_or_else(Utc::now);
    if let Some(local) = &options.local {
        crate::processes::overlay(&mut db.processes, local, now);
        if let Some(error) = local.beat_error() {
            problems.push(Problem::global(
                Severity::Page,
                ProblemKind::Heartbeat,
                format!(
                    "this process ({}) cannot write its heartbeat, so other processes and \
                     `projector status` count it gone: {error}",
                    local.instance()
                ),
            ));
        }
    }
    // The inbox's days ahead: every `run` makes them; less than a day left means none did.
    if let Some(inbox) = &db.inbox {
        let behind = inbox.partitions_ahead_seconds.is_none_or(|s| s < 86_400);
        if behind {
            problems.push(Problem::global(
                Severity::Warn,
                ProblemKind::InboxPartitionsBehind,
                match inbox.partitions_until {
                    Some(until) => format!(
                        "the inbox's days end at {}, less than a day ahead (the engine makes {} \
                         days ahead): is a `projector run` running, and can it create tables in \
                         schema projector? `projector migrate` makes them too; a batch makes the \
                         day it needs meanwhile",
                        until.format("%Y-%m-%d %H:%M:%SZ"),
                        crate::inbox::AHEAD_DAYS
                    ),
                    None => "the inbox has no day at all: run `projector migrate`".to_owned(),
                },
            ));
        }
    }
    // Two running processes under one name: status tells them apart by run, an operator may
    // not (one --instance-id shared by two deployments, pid 1 in containers on one host).
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for p in db.processes.iter().filter(|p| p.fresh) {
        *names.entry(p.instance.as_str()).or_default() += 1;
    }
    for (name, n) in names.into_iter().filter(|(_, n)| *n > 1) {
        problems.push(Problem::global(
            Severity::Warn,
            ProblemKind::SharedName,
            format!("{n} running processes share the name {name}: give each its own --instance-id"),
        ));
    }
    let throughput: HashMap<String, Throughput> = match (&first, options.sample) {
        (Some(first), Some(_)) => {
            let second = sample_counters(pool, &topic).await?;
            rates(first, &second)
        }
        _ => HashMap::new(),
    };

    // The brokers: watermarks, then the time of each version's oldest waiting message.
    let extents = {
        let probe = probe.clone();
        tokio::task::spawn_blocking(move || probe.extents())
            .await
            .map_err(|e| OpsError::Blocking(e.to_string()))?
    };
    let (extents, kafka) = match extents {
        Ok(extents) => {
            let kafka = KafkaStatus {
                reachable: true,
                topic: topic.clone(),
                partitions: Some(extents.len()),
                error: None,
            };
            (Some(extents), kafka)
        }
        Err(e) => {
            problems.push(Problem::global(
                Severity::Page,
                ProblemKind::KafkaUnreachable,
                format!("kafka: {e}"),
            ));
            let kafka = KafkaStatus {
                reachable: false,
                topic: topic.clone(),
                partitions: None,
                error: Some(e.to_string()),
            };
            (None, kafka)
        }
    };
    let times = match &extents {
        Some(extents) => {
            let wanted = waiting_positions(&db, extents);
            let probe = probe.clone();
            tokio::task::spawn_blocking(move || probe.times_at(&wanted))
                .await
                .map_err(|e| OpsError::Blocking(e.to_string()))?
        }
        None => BTreeMap::new(),
    };

    let mut views = Vec::new();
    for (name, version, consumer, state, changed, dropped) in &db.versions {
        let mut v = VersionStatus {
            name: name.clone(),
            version: *version,
            consumer: consumer.clone(),
            state: *state,
            state_changed_at: *changed,
            dropped: *dropped,
            rebuild: db.rebuilds.get(consumer).cloned(),
            healthy: true,
            lag: None,
            throughput: throughput.get(consumer).copied(),
            counters: Counters::default(),
            dead_letters: db.dead_letters.get(consumer).cloned().unwrap_or_default(),
            parked: db.parked.get(consumer).cloned().unwrap_or_default(),
            waiting_events: db.waiting.get(consumer).copied().unwrap_or(0),
            partitions: Vec::new(),
            runners: runners_of(&db.processes, consumer),
        };
        for kind in DEAD_LETTER_KINDS {
            v.dead_letters
                .open_by_kind
                .entry(kind.to_owned())
                .or_insert(0);
        }
        for reason in PARK_REASONS {
            v.parked.by_reason.entry(reason.to_owned()).or_insert(0);
        }
        let rows = db.offsets.get(consumer).cloned().unwrap_or_default();
        for r in &rows {
            add_counters(&mut v.counters, &r.counters);
        }
        v.counters.duplicates.unattributed = v.counters.duplicates.total
            - v.counters.duplicates.seq
            - v.counters.duplicates.watermark
            - v.counters.duplicates.inbox
            - v.counters.duplicates.version_filter;
        if *state != VersionState::Retired && !dropped {
            v.partitions = partitions_of(&rows, extents.as_deref(), &times, now);
            if extents.is_some() {
                v.lag = Some(Lag {
                    messages: v.partitions.iter().filter_map(|p| p.lag_messages).sum(),
                    seconds: v.partitions.iter().filter_map(|p| p.lag_seconds).max(),
                });
            }
        }
        judge(&mut v, &options.rule, now, &mut problems);
        views.push(v);
    }
    problems.sort_by_key(|p| p.severity != Severity::Page);
    Ok(Status {
        schema: SCHEMA,
        taken_at: now,
        healthy: healthy(&problems),
        stall_after_seconds: options.rule.stall_after.as_secs(),
        problems,
        postgres: Reach {
            reachable: true,
            error: None,
        },
        kafka,
        inbox: db.inbox,
        views,
        processes: db
            .processes
            .iter()
            .map(|p| ProcessStatus {
                run_id: p.run_id.clone(),
                instance: p.instance.clone(),
                started_at: p.started_at,
                seen_at: p.seen_at,
                fresh: p.fresh,
                views: p
                    .views
                    .iter()
                    .map(|v| ProcessView {
                        consumer: v.consumer.clone(),
                        state: v.state.as_str().to_owned(),
                        since: v.since,
                        attempts: v.attempts,
                        detail: v.detail.clone(),
                    })
                    .collect(),
            })
            .collect(),
    })
}

/// The fresh processes serving `consumer`.
fn runners_of(processes: &[crate::processes::Process], consumer: &str) -> Vec<Runner> {
    processes
        .iter()
        .filter(|p| p.fresh)
        .flat_map(|p| {
            p.views
                .iter()
                .filter(|v| v.consumer == consumer)
                .map(|v| Runner {
                    instance: p.instance.clone(),
                    state: v.state.as_str().to_owned(),
                    since: v.since,
                    attempts: v.attempts,
                    detail: v.detail.clone(),
                })
        })
        .collect()
}

/// The status when PostgreSQL cannot be reached: unhealthy, and nothing else known.
fn unreachable(topic: &str, options: &StatusOptions, error: String) -> Status {
    Status {
        schema: SCHEMA,
        taken_at: Utc::now(),
        healthy: false,
        stall_after_seconds: options.rule.stall_after.as_secs(),
        problems: vec![Problem::global(
            Severity::Page,
            ProblemKind::PostgresUnreachable,
            format!("postgres: {error}"),
        )],
        postgres: Reach {
            reachable: false,
            error: Some(error),
        },
        kafka: KafkaStatus {
            reachable: false,
            topic: topic.to_owned(),
            partitions: None,
            error: Some("not asked: PostgreSQL holds the positions".to_owned()),
        },
        inbox: None,
        views: Vec::new(),
        processes: Vec::new(),
    }
}

fn add_counters(into: &mut Counters, c: &Counters) {
    into.applied += c.applied;
    into.ignored += c.ignored;
    into.dead_lettered += c.dead_lettered;
    into.waiting += c.waiting;
    into.drained += c.drained;
    let (d, e) = (&mut into.duplicates, &c.duplicates);
    d.total += e.total;
    d.seq += e.seq;
    d.watermark += e.watermark;
    d.inbox += e.inbox;
    d.version_filter += e.version_filter;
}

/// The positions whose message time is wanted: each non-retired version's `next_offset`
/// on every partition that has messages past it.
fn waiting_positions(db: &DbState, extents: &[Extent]) -> Vec<(i32, i64)> {
    let mut wanted = BTreeSet::new();
    for (_, _, consumer, state, _, dropped) in &db.versions {
        if *state == VersionState::Retired || *dropped {
            continue;
        }
        let rows = db.offsets.get(consumer);
        for e in extents {
            let next = rows
                .and_then(|rows| rows.iter().find(|r| r.partition == e.partition))
                .map_or(e.low, |r| r.next_offset);
            if next < e.high {
                wanted.insert((e.partition, next.max(e.low)));
            }
        }
    }
    wanted.into_iter().collect()
}

fn partitions_of(
    rows: &[OffsetRow],
    extents: Option<&[Extent]>,
    times: &BTreeMap<(i32, i64), Option<i64>>,
    now: DateTime<Utc>,
) -> Vec<PartitionStatus> {
    let mut numbers: BTreeSet<i32> = rows.iter().map(|r| r.partition).collect();
    if let Some(extents) = extents {
        numbers.extend(extents.iter().map(|e| e.partition));
    }
    numbers
        .into_iter()
        .map(|partition| {
            let row = rows.iter().find(|r| r.partition == partition);
            let extent = extents.and_then(|x| x.iter().find(|e| e.partition == partition));
            let (lag_messages, lag_seconds) = match extent {
                Some(e) => {
                    // A version that never committed the partition starts at the log's start.
                    let next = row.map_or(e.low, |r| r.next_offset);
                    let lag = (e.high - next).max(0);
                    let seconds = if lag == 0 {
                        Some(0)
                    } else {
                        times
                            .get(&(partition, next.max(e.low)))
                            .copied()
                            .flatten()
                            .map(|ms| (now.timestamp_millis() - ms).max(0) / 1000)
                    };
                    (Some(lag), seconds)
                }
                None => (None, None),
            };
            PartitionStatus {
                partition,
                next_offset: row.map(|r| r.next_offset),
                low_watermark: extent.map(|e| e.low),
                high_watermark: extent.map(|e| e.high),
                lag_messages,
                lag_seconds,
                last_commit_at: row.map(|r| r.updated_at),
                committed_by: row.and_then(|r| r.committed_by.clone()),
                stalled: false,
            }
        })
        .collect()
}

/// Applies the health rule to one version and adds its problems.
fn judge(v: &mut VersionStatus, rule: &HealthRule, now: DateTime<Utc>, out: &mut Vec<Problem>) {
    let building = v.state == VersionState::Building;
    let paused = v.rebuild.as_ref().is_some_and(|r| r.paused);
    let mut problems = Vec::new();
    for p in &mut v.partitions {
        if let (Some(next), Some(low)) = (p.next_offset, p.low_watermark) {
            if next < low {
                problems.push(Problem {
                    severity: Severity::Warn,
                    kind: ProblemKind::BehindRetention,
                    consumer: Some(v.consumer.clone()),
                    partition: Some(p.partition),
                    message: format!(
                        "{} partition {}: stored offset {next} is below the log's start {low}: \
                         retention deleted {} message(s) this version never applied; rebuild it \
                         from a snapshot",
                        v.consumer,
                        p.partition,
                        low - next
                    ),
                });
            }
        }
        let Some(lag) = p.lag_messages else { continue };
        let last_progress = p.last_commit_at.unwrap_or(v.state_changed_at);
        if (v.state == VersionState::Live || (building && !paused))
            && rule.stalled(now, lag, p.lag_seconds, last_progress)
        {
            p.stalled = true;
            let idle = super::health::human_seconds((now - last_progress).num_seconds());
            let oldest = p.lag_seconds.map_or("of unknown age".to_owned(), |s| {
                format!("the oldest {} old", super::health::human_seconds(s))
            });
            problems.push(Problem {
                severity: if building {
                    Severity::Warn
                } else {
                    Severity::Page
                },
                kind: if building {
                    ProblemKind::RebuildStalled
                } else {
                    ProblemKind::Stalled
                },
                consumer: Some(v.consumer.clone()),
                partition: Some(p.partition),
                message: format!(
                    "{} partition {}: no commit for {idle} while {lag} message(s) wait, {oldest}",
                    v.consumer, p.partition
                ),
            });
        }
    }
    if v.state == VersionState::Live && !v.dropped {
        runner_problems(v, rule, now, &mut problems);
    }
    if v.state != VersionState::Retired && v.dead_letters.open > 0 {
        problems.push(Problem {
            severity: Severity::Warn,
            kind: ProblemKind::DeadLetters,
            consumer: Some(v.consumer.clone()),
            partition: None,
            message: format!(
                "{}: {} open dead letter(s) ({})",
                v.consumer,
                v.dead_letters.open,
                nonzero(&v.dead_letters.open_by_kind)
            ),
        });
    }
    if v.state != VersionState::Retired && v.parked.total > 0 {
        problems.push(Problem {
            severity: Severity::Warn,
            kind: ProblemKind::ParkedAccounts,
            consumer: Some(v.consumer.clone()),
            partition: None,
            message: format!(
                "{}: {} parked account(s) ({}){}",
                v.consumer,
                v.parked.total,
                nonzero(&v.parked.by_reason),
                if v.parked.by_reason.get("unknown_version").copied().unwrap_or(0) > 0 {
                    "; unknown_version: events of a version this view does not read wait for a build that reads it, which drains them when it starts"
                } else {
                    ""
                }
            ),
        });
    }
    v.healthy = healthy(&problems);
    out.extend(problems);
}

/// What the running processes say of a live version: one that should consume it and does
/// not (failing, or starting past the grace) pages; one that skips it pages only when no
/// process consumes it (a rolling upgrade leaves old processes skipping a version the new ones
/// consume: a warning).
fn runner_problems(
    v: &VersionStatus,
    rule: &HealthRule,
    now: DateTime<Utc>,
    out: &mut Vec<Problem>,
) {
    let consumed = v.runners.iter().any(|r| r.state == "consuming");
    let grace = chrono::Duration::from_std(rule.start_grace).unwrap_or(chrono::Duration::MAX);
    for r in &v.runners {
        let age = super::health::human_seconds((now - r.since).num_seconds());
        let problem = |severity, kind, message| Problem {
            severity,
            kind,
            consumer: Some(v.consumer.clone()),
            partition: None,
            message,
        };
        match r.state.as_str() {
            "failing" => out.push(problem(
                Severity::Page,
                ProblemKind::NotConsuming,
                format!(
                    "{} is not consumed by {}: failing for {age} ({} attempt(s)), retried with backoff: {}",
                    v.consumer,
                    r.instance,
                    r.attempts,
                    r.detail.as_deref().unwrap_or("no error recorded")
                ),
            )),
            "starting" if now - r.since >= grace => out.push(problem(
                Severity::Page,
                ProblemKind::NotConsuming,
                format!(
                    "{} is not consumed by {}: still starting after {age}",
                    v.consumer, r.instance
                ),
            )),
            "skipped" => out.push(problem(
                if consumed {
                    Severity::Warn
                } else {
                    Severity::Page
                },
                ProblemKind::Skipped,
                format!(
                    "{} skips {}{}: {}",
                    r.instance,
                    v.consumer,
                    if consumed {
                        ""
                    } else {
                        ", and no process consumes it"
                    },
                    r.detail.as_deref().unwrap_or("no reason recorded")
                ),
            )),
            _ => {}
        }
    }
}

/// `gap 2, dead_letter 1`: the non-zero entries of a count map.
pub fn nonzero(counts: &BTreeMap<String, i64>) -> String {
    counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn read_db(pool: &Pool, topic: &str, options: &StatusOptions) -> Result<DbState, OpsError> {
    let mut client = pool.get().await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg("starting a read-only transaction"))?;
    let mut db = DbState::default();
    let names: Vec<String> = options.names.clone();
    let row = tx
        .query_one(statement("now"), &[])
        .await
        .map_err(pg("reading the time"))?;
    db.now = Some(row.get(0));
    for r in tx
        .query(statement("versions"), &[&names])
        .await
        .map_err(pg("reading the view registry"))?
    {
        // The state is parsed here, once: a name the registry's CHECK does not allow is an
        // error of the read, not a string compared further on.
        let state: VersionState = r.try_get(3).map_err(pg("reading the view registry"))?;
        db.versions
            .push((r.get(0), r.get(1), r.get(2), state, r.get(4), r.get(5)));
    }
    for r in tx
        .query(statement("rebuilds"), &[])
        .await
        .map_err(pg("reading rebuilds"))?
    {
        db.rebuilds.insert(
            r.get(0),
            RebuildStatus {
                phase: r.get(1),
                paused: r.get(2),
                source: r.get(3),
                started_at: r.get(4),
            },
        );
    }
    for r in tx
        .query(statement("offsets"), &[&topic])
        .await
        .map_err(pg("reading offsets (has `projector migrate` run?)"))?
    {
        db.offsets.entry(r.get(0)).or_default().push(OffsetRow {
            partition: r.get(1),
            next_offset: r.get(2),
            counters: Counters {
                applied: r.get(3),
                ignored: r.get(4),
                duplicates: Duplicates {
                    total: r.get(5),
                    seq: r.get(6),
                    watermark: r.get(7),
                    inbox: r.get(8),
                    version_filter: r.get(9),
                    unattributed: 0,
                },
                dead_lettered: r.get(10),
                waiting: r.get(11),
                drained: r.get(12),
            },
            committed_by: r.get(13),
            updated_at: r.get(14),
        });
    }
    for r in tx
        .query(statement("dead_letters"), &[])
        .await
        .map_err(pg("reading dead letters"))?
    {
        let d = db.dead_letters.entry(r.get(0)).or_default();
        let open: i64 = r.get(2);
        d.open += open;
        d.total += r.get::<_, i64>(3);
        d.open_by_kind.insert(r.get(1), open);
    }
    for r in tx
        .query(statement("parked"), &[])
        .await
        .map_err(pg("reading parked accounts"))?
    {
        let p = db.parked.entry(r.get(0)).or_default();
        let n: i64 = r.get(2);
        p.total += n;
        p.by_reason.insert(r.get(1), n);
    }
    for r in tx
        .query(statement("oldest_parked"), &[&options.parked_limit.max(0)])
        .await
        .map_err(pg("listing parked accounts"))?
    {
        db.parked
            .entry(r.get(0))
            .or_default()
            .oldest
            .push(ParkedAccount {
                account_id: r.get(1),
                reason: r.get(2),
                blocked_seq: r.get(3),
                dead_letter_id: r.get(4),
                parked_at: r.get(5),
                detail: r.get(6),
            });
    }
    for r in tx
        .query(statement("waiting"), &[])
        .await
        .map_err(pg("counting waiting events"))?
    {
        db.waiting.insert(r.get(0), r.get(1));
    }
    let now = db.now.unwrap_or_else(Utc::now);
    db.inbox = Some(inbox_status(&tx, now).await?);
    db.processes = crate::processes::read(&tx)
        .await
        .map_err(pg("reading the running processes"))?;
    tx.commit().await.map_err(pg("ending the snapshot"))?;
    Ok(db)
}

/// The inbox's days and the inbox before V0009, from the catalog: never a scan of a large
/// table.
async fn inbox_status(
    tx: &deadpool_postgres::Transaction<'_>,
    now: DateTime<Utc>,
) -> Result<InboxStatus, OpsError> {
    let days: Vec<crate::inbox::Partition> = crate::inbox::partitions(tx)
        .await
        .map_err(pg("listing the inbox's days"))?
        .into_iter()
        .filter(|p| p.attachment == crate::inbox::Attachment::Attached)
        .collect();
    let mut rows: Option<i64> = Some(0);
    for d in &days {
        // reltuples is 0 or -1 before the first analyze: count a small day, give up on a
        // large one.
        let n = if d.rows_estimate > 0 {
            Some(d.rows_estimate)
        } else if d.bytes < 10 * 1024 * 1024 {
            let table = crate::inbox::partition_name(d.day);
            Some(
                // Inline: the statement names the day's table.
                tx.query_one(&format!("SELECT count(*) FROM projector.{table}"), &[])
                    .await
                    .map_err(pg("counting a day of the inbox"))?
                    .get(0),
            )
        } else {
            None
        };
        rows = rows.zip(n).map(|(a, b)| a + b);
    }
    let legacy = tx
        .query_one(statement("legacy_inbox"), &[])
        .await
        .map_err(pg("reading the inbox before V0009"))?;
    let legacy_rows: i64 = legacy.get(0);
    let oldest_day = days.first().map(|d| d.day);
    let oldest = legacy
        .get::<_, Option<DateTime<Utc>>>(2)
        .into_iter()
        .chain(oldest_day.map(|d| crate::inbox::bounds(d).0))
        .min();
    let until = crate::inbox::horizon(&days.iter().map(|d| d.day).collect(), now);
    Ok(InboxStatus {
        rows_estimate: rows.map(|r| r + legacy_rows.max(0)),
        bytes: days.iter().map(|d| d.bytes).sum::<i64>() + legacy.get::<_, i64>(1),
        oldest_applied_at: oldest,
        oldest_age_seconds: oldest.map(|o| (now - o).num_seconds().max(0)),
        days: days.len(),
        oldest_day,
        partitions_until: until,
        partitions_ahead_seconds: until.map(|u| (u - now).num_seconds()),
        legacy_rows_estimate: legacy_rows.max(0),
    })
}

/// Per version: (messages consumed, events applied) and PostgreSQL's clock.
type CounterSample = (DateTime<Utc>, HashMap<String, (i64, i64)>);

async fn sample_counters(pool: &Pool, topic: &str) -> Result<CounterSample, OpsError> {
    let client = pool.get().await?;
    let rows = client
        .query(statement("sample_counters"), &[&topic])
        .await
        .map_err(pg("sampling counters"))?;
    let at = match rows.first() {
        Some(r) => r.get(0),
        None => client
            .query_one(statement("clock"), &[])
            .await
            .map_err(pg("reading the time"))?
            .get(0),
    };
    Ok((
        at,
        rows.iter()
            .map(|r| (r.get(1), (r.get(2), r.get(3))))
            .collect(),
    ))
}

fn rates(first: &CounterSample, second: &CounterSample) -> HashMap<String, Throughput> {
    let ms = (second.0 - first.0).num_milliseconds().max(1);
    second
        .1
        .iter()
        .map(|(consumer, (messages, applied))| {
            let (m0, a0) = first.1.get(consumer).copied().unwrap_or((0, 0));
            (
                consumer.clone(),
                Throughput {
                    sample_ms: ms,
                    messages_per_second: (messages - m0).max(0) * 1000 / ms,
                    applied_per_second: (applied - a0).max(0) * 1000 / ms,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "now",
            "versions",
            "rebuilds",
            "offsets",
            "dead_letters",
            "parked",
            "oldest_parked",
            "waiting",
            "legacy_inbox",
            "sample_counters",
            "clock",
        ] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }

    #[test]
    fn json_shows_a_versions_state_by_its_stored_name() {
        for (state, json) in [
            (VersionState::Building, "\"building\""),
            (VersionState::Live, "\"live\""),
            (VersionState::Retired, "\"retired\""),
        ] {
            let mut out = serde_json::Serializer::new(Vec::new());
            state_name(&state, &mut out).expect("serialized");
            assert_eq!(out.into_inner(), json.as_bytes());
        }
    }
}
