//! Each consumer's clock: the moment up to which a view version has read the log, from which
//! inbox retention measures its window.
//!
//! An inbox row is what recognises a copy of its event (a republish, a redelivery) when the
//! copy reaches its consumer; for an order-independent view (eod) it is the only thing that
//! does. A copy reaches a consumer only when the consumer reads it, and what `now()` says
//! has nothing to do with that: a paused rebuild, a stopped service, a view that could not
//! start read nothing while the days pass, and the copies published meanwhile wait in the
//! log for them. Measured against `now()`, their rows age out under them and every copy is
//! applied a second time on resume. So each consumer's rows are measured against its own
//! clock, and the clock stands still while the consumer reads nothing.
//!
//! A consumer's clock is the earliest of:
//!
//! - its **latest commit** (`projector.offsets.updated_at`, newest over its partitions): a
//!   consumer that stopped stops its clock there;
//! - for each of its partitions that the log shows **behind** (its `next_offset` below the
//!   high watermark), the time of the **oldest message it has not consumed**: the log is read
//!   in order, so every copy still to reach it is in the log from there on (a partition that
//!   is caught up holds nothing for it and bounds nothing, however long ago it last
//!   committed);
//! - for each partition the log was not asked about or did not answer for, that
//!   **partition's last commit**: without the log, a partition that stopped committing (a
//!   stuck worker, a process that lost PostgreSQL but not Kafka) may be behind by all that
//!   happened since, so it holds the consumer's clock at its last commit (an idle partition
//!   does too: the log would have said it is caught up);
//! - for a partition of one of its topics it has never committed, the time of the oldest
//!   message there (it has read none of it).
//!
//! A consumer has **no clock**, and none of its rows may go, while a rebuild of it is paused
//! (`projector.rebuilds.paused`: it resumes from the backlog whenever an engineer says so),
//! and when it has never committed an offset: it has read nothing, so it reads the whole
//! retained log when it starts, and the rows it has (from repairs, say, or left behind when
//! its offsets were deleted to make it start over) are all that stop that log from being
//! applied twice. A retired version keeps the clock of its last commit: the window before it
//! stays until `projector retire --drop` deletes the version's rows along with everything
//! else it owns (a dropped version has no rows to prune). Repairs (`dlq retry`, `parked
//! retry`) apply events without reading the log and move no clock.
//!
//! A commit's time is PostgreSQL's clock, a message's time the producer's (or the broker's,
//! with `LogAppendTime`); a producer that stamps old times makes the clock older, which keeps
//! more rows, never fewer.
//!
//! The rule is [`clock`], pure and unit-tested like `sequencer::plan`; [`facts`] reads what it
//! needs from PostgreSQL and [`read_log`] from the brokers. It says which rows may go, never
//! how they go: `prune` drops whole days of the inbox once every consumer with rows in them
//! has its clock a window past them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Client;
use projector_engine::SqlFile;

use super::error::{pg, OpsError};
use crate::kafka::log::{Extent, LogReader, Reading};
use crate::kafka::source::KafkaConfig;

/// One committed partition of a consumer, as `projector.offsets` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Where the consumer goes on from.
    pub next_offset: i64,
    /// When it last committed this partition.
    pub at: DateTime<Utc>,
}

/// What PostgreSQL says of one consumer with inbox rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The consumer name, `<view>_v<version>`.
    pub consumer: String,
    /// A rebuild of it is paused.
    pub paused: bool,
    /// Its committed partitions, by topic and partition.
    pub commits: Vec<Commit>,
}

/// What the brokers say of one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicLog {
    /// Every partition's low and high watermark.
    pub extents: Vec<Extent>,
    /// The time of the first message at or after each position [`positions`] asked for;
    /// `None` where it could not be read.
    pub times: BTreeMap<(i32, i64), Option<DateTime<Utc>>>,
}

/// The topics the brokers answered for.
pub type Log = BTreeMap<String, TopicLog>;

/// What bounds a consumer's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// Its latest commit: the log shows it has read everything there is.
    LatestCommit,
    /// The last commit of a partition the log did not answer for.
    Committed {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// The oldest message of a partition it has not consumed yet.
    Unconsumed {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The message's offset.
        offset: i64,
    },
}

/// A consumer's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clock {
    /// A rebuild of it is paused: none of its rows may go.
    Paused,
    /// It has never committed an offset: none of its rows may go.
    NeverCommitted,
    /// It has never read a partition of its topic, and the time of the oldest message there
    /// could not be read: none of its rows may go.
    Unknown {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// It has read the log up to `at`.
    At {
        /// The clock.
        at: DateTime<Utc>,
        /// What holds it there.
        by: Bound,
    },
}

impl Clock {
    /// The moment before which its rows may go, with a window of `window`; `None` when none
    /// may.
    pub fn cutoff(&self, window: chrono::Duration) -> Option<DateTime<Utc>> {
        match self {
            Clock::At { at, .. } => at.checked_sub_signed(window),
            _ => None,
        }
    }

    /// One line for an operator: where the clock is and why, or why the consumer has none.
    pub fn describe(&self) -> String {
        match self {
            Clock::Paused => "kept: a rebuild of it is paused".to_owned(),
            Clock::NeverCommitted => {
                "kept: it has never committed an offset, so it would read the whole log".to_owned()
            }
            Clock::Unknown { topic, partition } => format!(
                "kept: it has never read {topic}/{partition}, whose oldest message's time could not be read"
            ),
            Clock::At { at, by } => {
                let by = match by {
                    Bound::LatestCommit => "its latest commit".to_owned(),
                    Bound::Committed { topic, partition } => {
                        format!("the last commit of {topic}/{partition}")
                    }
                    Bound::Unconsumed {
                        topic,
                        partition,
                        offset,
                    } => format!(
                        "the oldest message it has not consumed, {topic}/{partition} offset {offset}"
                    ),
                };
                format!("clock {} ({by})", at.format("%Y-%m-%d %H:%M:%SZ"))
            }
        }
    }
}

/// One consumer and its clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerClock {
    /// The consumer name.
    pub consumer: String,
    /// Its clock.
    pub clock: Clock,
}

/// The rule (see the module documentation): `facts` of one consumer, `log` of the topics the
/// brokers answered for.
pub fn clock(facts: &Facts, log: &Log) -> Clock {
    if facts.paused {
        return Clock::Paused;
    }
    let Some(latest) = facts.commits.iter().map(|c| c.at).max() else {
        return Clock::NeverCommitted;
    };
    let mut earliest = (latest, Bound::LatestCommit);
    let mut hold = |at: DateTime<Utc>, by: Bound| {
        if at < earliest.0 {
            earliest = (at, by);
        }
    };
    for c in &facts.commits {
        let committed = || Bound::Committed {
            topic: c.topic.clone(),
            partition: c.partition,
        };
        let Some((t, extent)) = log.get(&c.topic).and_then(|t| {
            t.extents
                .iter()
                .find(|e| e.partition == c.partition)
                .map(|e| (t, e))
        }) else {
            hold(c.at, committed());
            continue;
        };
        if c.next_offset >= extent.high {
            continue;
        }
        // Below the log's start retention took what it had not read; what is left starts
        // at the low watermark.
        let offset = c.next_offset.max(extent.low);
        match t.times.get(&(c.partition, offset)).copied().flatten() {
            Some(at) => hold(
                at,
                Bound::Unconsumed {
                    topic: c.topic.clone(),
                    partition: c.partition,
                    offset,
                },
            ),
            None => hold(c.at, committed()),
        }
    }
    let topics: BTreeSet<&str> = facts.commits.iter().map(|c| c.topic.as_str()).collect();
    for topic in topics {
        let Some(t) = log.get(topic) else { continue };
        for e in unread(facts, topic, &t.extents) {
            match t.times.get(&(e.partition, e.low)).copied().flatten() {
                Some(at) => hold(
                    at,
                    Bound::Unconsumed {
                        topic: topic.to_owned(),
                        partition: e.partition,
                        offset: e.low,
                    },
                ),
                None => {
                    return Clock::Unknown {
                        topic: topic.to_owned(),
                        partition: e.partition,
                    }
                }
            }
        }
    }
    Clock::At {
        at: earliest.0,
        by: earliest.1,
    }
}

/// The partitions of `topic` that hold messages and that the consumer has never committed.
fn unread<'a>(
    facts: &'a Facts,
    topic: &'a str,
    extents: &'a [Extent],
) -> impl Iterator<Item = &'a Extent> {
    extents.iter().filter(move |e| {
        e.high > e.low
            && !facts
                .commits
                .iter()
                .any(|c| c.topic == topic && c.partition == e.partition)
    })
}

/// The positions whose message times [`clock`] needs, per topic, once the extents are known:
/// where each consumer's behind partitions go on from, and the start of the partitions it has
/// never read.
pub fn positions(
    facts: &[Facts],
    extents: &BTreeMap<String, Vec<Extent>>,
) -> BTreeMap<String, BTreeSet<(i32, i64)>> {
    let mut out: BTreeMap<String, BTreeSet<(i32, i64)>> = BTreeMap::new();
    for f in facts.iter().filter(|f| !f.paused) {
        for c in &f.commits {
            let Some(e) = extents
                .get(&c.topic)
                .and_then(|es| es.iter().find(|e| e.partition == c.partition))
            else {
                continue;
            };
            if c.next_offset < e.high {
                out.entry(c.topic.clone())
                    .or_default()
                    .insert((c.partition, c.next_offset.max(e.low)));
            }
        }
        let topics: BTreeSet<&str> = f.commits.iter().map(|c| c.topic.as_str()).collect();
        for topic in topics {
            let Some(es) = extents.get(topic) else {
                continue;
            };
            for e in unread(f, topic, es) {
                out.entry(topic.to_owned())
                    .or_default()
                    .insert((e.partition, e.low));
            }
        }
    }
    out
}

/// The statements of the clocks (`clock.sql`).
const SQL: SqlFile = SqlFile::new("ops/src/clock.sql", include_str!("clock.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// Reads the [`Facts`] of every consumer that has inbox rows (each walked one consumer at a
/// time through the key that leads with it: one index probe each), with its rebuild's pause
/// and its committed partitions.
pub async fn facts(client: &Client) -> Result<Vec<Facts>, OpsError> {
    let rows = client
        .query(statement("facts"), &[])
        .await
        .map_err(pg("reading the consumers' commits"))?;
    let mut out: Vec<Facts> = Vec::new();
    for r in rows {
        let consumer: String = r.get(0);
        if out.last().is_none_or(|f| f.consumer != consumer) {
            out.push(Facts {
                consumer,
                paused: r.get(1),
                commits: Vec::new(),
            });
        }
        let topic: Option<String> = r.get(2);
        if let (Some(topic), Some(f)) = (topic, out.last_mut()) {
            f.commits.push(Commit {
                topic,
                partition: r.get(3),
                next_offset: r.get(4),
                at: r.get(5),
            });
        }
    }
    Ok(out)
}

/// The consumers whose rebuild is paused now: asked again before every day a prune judges, so
/// a pause that comes while a prune runs keeps the rest of that consumer's days.
pub async fn paused(client: &Client) -> Result<BTreeSet<String>, OpsError> {
    Ok(client
        .query(statement("paused"), &[])
        .await
        .map_err(pg("reading the paused rebuilds"))?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Asks the brokers of `kafka` (its topic aside: every topic the consumers committed is
/// asked) where each topic's partitions stand and the times [`clock`] needs. Blocking
/// (librdkafka): run it on a blocking thread. A topic that cannot be read is left out of the
/// [`Log`], with one line saying why in the second list; its partitions' clocks are then
/// their last commits.
pub fn read_log(kafka: &KafkaConfig, facts: &[Facts], timeout: Duration) -> (Log, Vec<String>) {
    let topics: BTreeSet<&str> = facts
        .iter()
        .filter(|f| !f.paused)
        .flat_map(|f| f.commits.iter().map(|c| c.topic.as_str()))
        .collect();
    let mut probes = BTreeMap::new();
    let mut extents = BTreeMap::new();
    let mut problems = Vec::new();
    for topic in topics {
        let mut config = kafka.clone();
        config.topic = topic.to_owned();
        let read = LogReader::connect(&config, timeout, Reading::Samples)
            .and_then(|p| Ok((p.extents()?, p)));
        match read {
            Ok((e, probe)) => {
                extents.insert(topic.to_owned(), e);
                probes.insert(topic.to_owned(), probe);
            }
            Err(e) => problems.push(format!(
                "the log of topic {topic} could not be read ({e}); its partitions' clocks are their last commits"
            )),
        }
    }
    let wanted = positions(facts, &extents);
    let mut log = Log::new();
    for (topic, extents) in extents {
        let asked: Vec<(i32, i64)> = wanted
            .get(&topic)
            .map(|w| w.iter().copied().collect())
            .unwrap_or_default();
        let times = probes
            .get(&topic)
            .map(|p| p.times_at(&asked))
            .unwrap_or_default()
            .into_iter()
            .map(|(k, ms)| (k, ms.and_then(DateTime::from_timestamp_millis)))
            .collect();
        log.insert(topic, TopicLog { extents, times });
    }
    (log, problems)
}

/// Every consumer with inbox rows and its clock, the log asked where `kafka` is given.
/// Returns the lines saying what could not be asked, for the operator.
pub async fn clocks(
    client: &Client,
    kafka: Option<&KafkaConfig>,
) -> Result<(Vec<ConsumerClock>, Vec<String>), OpsError> {
    let facts = facts(client).await?;
    let (log, problems) = match kafka {
        Some(kafka) => {
            let (kafka, facts) = (kafka.clone(), facts.clone());
            tokio::task::spawn_blocking(move || read_log(&kafka, &facts, LOG_TIMEOUT))
                .await
                .map_err(|e| OpsError::Blocking(e.to_string()))?
        }
        None => (Log::new(), Vec::new()),
    };
    Ok((
        facts
            .iter()
            .map(|f| ConsumerClock {
                consumer: f.consumer.clone(),
                clock: clock(f, &log),
            })
            .collect(),
        problems,
    ))
}

/// How long one request to the brokers may take.
const LOG_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in ["facts", "paused"] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }

    fn t(minutes: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + minutes * 60, 0).expect("a time")
    }

    fn commit(partition: i32, next_offset: i64, at: i64) -> Commit {
        Commit {
            topic: "fills".to_owned(),
            partition,
            next_offset,
            at: t(at),
        }
    }

    fn facts(commits: Vec<Commit>) -> Facts {
        Facts {
            consumer: "eod_v1".to_owned(),
            paused: false,
            commits,
        }
    }

    fn extent(partition: i32, low: i64, high: i64) -> Extent {
        Extent {
            partition,
            low,
            high,
        }
    }

    fn log(extents: Vec<Extent>, times: &[((i32, i64), Option<i64>)]) -> Log {
        let mut log = Log::new();
        log.insert(
            "fills".to_owned(),
            TopicLog {
                extents,
                times: times.iter().map(|&(k, m)| (k, m.map(t))).collect(),
            },
        );
        log
    }

    fn at(minutes: i64, by: Bound) -> Clock {
        Clock::At { at: t(minutes), by }
    }

    fn committed(partition: i32) -> Bound {
        Bound::Committed {
            topic: "fills".to_owned(),
            partition,
        }
    }

    fn unconsumed(partition: i32, offset: i64) -> Bound {
        Bound::Unconsumed {
            topic: "fills".to_owned(),
            partition,
            offset,
        }
    }

    #[test]
    fn a_paused_rebuild_and_a_consumer_that_never_committed_have_no_clock() {
        let mut f = facts(vec![commit(0, 10, 100)]);
        f.paused = true;
        assert_eq!(clock(&f, &Log::new()), Clock::Paused);
        assert_eq!(Clock::Paused.cutoff(chrono::Duration::days(7)), None);
        assert_eq!(
            clock(&facts(Vec::new()), &Log::new()),
            Clock::NeverCommitted
        );
    }

    #[test]
    fn without_the_log_the_partition_that_committed_last_longest_ago_holds_the_clock() {
        let f = facts(vec![
            commit(0, 10, 100),
            commit(1, 10, 40),
            commit(2, 10, 90),
        ]);
        assert_eq!(clock(&f, &Log::new()), at(40, committed(1)));
        let one = facts(vec![commit(0, 10, 100)]);
        assert_eq!(clock(&one, &Log::new()), at(100, Bound::LatestCommit));
        assert_eq!(
            clock(&one, &Log::new()).cutoff(chrono::Duration::minutes(30)),
            Some(t(70))
        );
    }

    #[test]
    fn caught_up_partitions_bound_nothing_and_a_stopped_consumer_keeps_its_latest_commit() {
        // Partition 1 is idle: it last committed long ago, but it has read all there is.
        let f = facts(vec![commit(0, 10, 100), commit(1, 5, 40)]);
        let l = log(vec![extent(0, 0, 10), extent(1, 0, 5)], &[]);
        assert_eq!(clock(&f, &l), at(100, Bound::LatestCommit));
    }

    #[test]
    fn a_partition_behind_holds_the_clock_at_its_oldest_unconsumed_message() {
        // It committed at 100 (resumed after a stall, catching up) but has yet to read the
        // message of 30 at offset 12; copies of what it applied before the stall may follow.
        let f = facts(vec![commit(0, 12, 100), commit(1, 5, 100)]);
        let l = log(
            vec![extent(0, 0, 50), extent(1, 0, 5)],
            &[((0, 12), Some(30))],
        );
        assert_eq!(clock(&f, &l), at(30, unconsumed(0, 12)));
        // A message newer than its latest commit: the latest commit holds.
        let l = log(
            vec![extent(0, 0, 50), extent(1, 0, 5)],
            &[((0, 12), Some(130))],
        );
        assert_eq!(clock(&f, &l), at(100, Bound::LatestCommit));
        // A time that could not be read: the partition's last commit holds.
        let f = facts(vec![commit(0, 12, 80), commit(1, 5, 100)]);
        let l = log(vec![extent(0, 0, 50), extent(1, 0, 5)], &[((0, 12), None)]);
        assert_eq!(clock(&f, &l), at(80, committed(0)));
    }

    #[test]
    fn a_position_below_the_logs_start_is_read_from_the_start() {
        let f = facts(vec![commit(0, 3, 100)]);
        let l = log(vec![extent(0, 20, 50)], &[((0, 20), Some(60))]);
        assert_eq!(clock(&f, &l), at(60, unconsumed(0, 20)));
        assert_eq!(
            positions(
                &[f],
                &BTreeMap::from([("fills".to_owned(), vec![extent(0, 20, 50)])])
            ),
            BTreeMap::from([("fills".to_owned(), BTreeSet::from([(0, 20)]))])
        );
    }

    #[test]
    fn a_partition_never_read_holds_the_clock_at_its_oldest_message() {
        let f = facts(vec![commit(0, 10, 100)]);
        let extents = vec![extent(0, 0, 10), extent(1, 4, 9), extent(2, 7, 7)];
        // Partition 2 is empty: nothing to read there.
        assert_eq!(
            positions(
                std::slice::from_ref(&f),
                &BTreeMap::from([("fills".to_owned(), extents.clone())])
            ),
            BTreeMap::from([("fills".to_owned(), BTreeSet::from([(1, 4)]))])
        );
        let l = log(extents.clone(), &[((1, 4), Some(20))]);
        assert_eq!(clock(&f, &l), at(20, unconsumed(1, 4)));
        let l = log(extents, &[((1, 4), None)]);
        assert_eq!(
            clock(&f, &l),
            Clock::Unknown {
                topic: "fills".to_owned(),
                partition: 1
            }
        );
    }

    #[test]
    fn a_topic_the_log_did_not_answer_for_falls_back_to_its_partitions_commits() {
        let mut f = facts(vec![commit(0, 10, 100)]);
        f.commits.push(Commit {
            topic: "old".to_owned(),
            partition: 0,
            next_offset: 3,
            at: t(10),
        });
        let l = log(vec![extent(0, 0, 10)], &[]);
        assert_eq!(
            clock(&f, &l),
            at(
                10,
                Bound::Committed {
                    topic: "old".to_owned(),
                    partition: 0
                }
            )
        );
    }
}
