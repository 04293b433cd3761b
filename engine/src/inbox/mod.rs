//! The inbox's layout: `projector.inbox`, keyed `(consumer, occurred_at, event_id)` and
//! partitioned by UTC day of `occurred_at`, one table `projector.inbox_pYYYYMMDD` a day.
//!
//! Why by the event's own time (seed 000): a partitioned table's primary key must hold the
//! partition key, so the partition key must be a value every copy of an event repeats, or a
//! redelivery gets a new key and is applied again in silence. `occurred_at` is set once by the
//! write side and travels with every copy; `now()` or `applied_at` never would
//! (`migrations/V0009__inbox_by_event_time.sql`). Why `occurred_at` before `event_id` in the
//! key: a consumer applies events in about the order they occurred, so a new key lands at the
//! right edge of its day's index instead of on a random leaf of a week of ids, and a checkpoint
//! costs a few full-page images instead of one per event.
//!
//! Who makes the partitions: the engine itself, no cron. `projector migrate` and every
//! `projector run` (at start, then every [`MAINTAIN_EVERY`]) make the days from yesterday to
//! [`AHEAD_DAYS`] ahead ([`ensure_ahead`]); a batch whose events fall on a day without a
//! partition (an event older than the oldest day kept, or far ahead) stops before it writes
//! anything, the day is made in a transaction of its own ([`Days::make`]) and the batch runs
//! again, so no event can wait for a partition, or fail for want of one, for longer than a
//! retry.
//!
//! Who drops them: `projector inbox prune` (`projector_ops::prune`), a whole day at a time,
//! once every consumer with rows in it has read the log a window past the day's end and past
//! the day's latest late write ([`mark_late_in`]). A batch that writes into a day that has
//! already ended records it in `projector.inbox_late_writes` in its own transaction: a row
//! written late must live a whole window too.
//!
//! The DDL takes [`DDL_LOCK`], so creators and droppers take turns: ATTACH and DETACH
//! CONCURRENTLY take a SHARE UPDATE EXCLUSIVE lock on `projector.inbox`, which never waits for
//! the apply path's inserts (ROW EXCLUSIVE), nor they for it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use deadpool_postgres::GenericClient;

/// The advisory lock every statement that attaches or detaches an inbox partition holds.
pub const DDL_LOCK: i64 = 0x7072_6f6a_696e_6278; // "projinbx"

/// Days made ahead of today.
pub const AHEAD_DAYS: i64 = 7;

/// How often `projector run` makes the days ahead.
pub const MAINTAIN_EVERY: Duration = Duration::from_secs(15 * 60);

/// How far ahead of the server's clock an event's `occurred_at` may lie and still count as
/// inside the retained window. Further ahead, it is counted as outside (`outside_window`) and
/// gets a partition of its own day, like an event older than every day kept.
pub const FUTURE_BOUND: chrono::Duration = chrono::Duration::days(1);

/// The name prefix of the day partitions, in schema `projector`.
pub const PARTITION_PREFIX: &str = "inbox_p";

/// The UTC day of a moment.
pub fn day_of(t: DateTime<Utc>) -> NaiveDate {
    t.date_naive()
}

/// The first moment of a day, and of the next: the partition's bounds.
pub fn bounds(day: NaiveDate) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = day.and_time(NaiveTime::MIN).and_utc();
    let end = day.succ_opt().map_or(DateTime::<Utc>::MAX_UTC, |d| {
        d.and_time(NaiveTime::MIN).and_utc()
    });
    (start, end)
}

/// A bound as PostgreSQL reads it, in UTC: `2026-12-02 00:00:00+00`. Written by hand,
/// not with chrono's `%Y`, which signs a year past 9999 (`+10000`, which PostgreSQL refuses):
/// the last day of year 9999 ends at `10000-01-01`.
fn bound_literal(t: DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}+00",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// `inbox_p20261202`: the partition's table name, without the schema.
pub fn partition_name(day: NaiveDate) -> String {
    format!("{PARTITION_PREFIX}{}", day.format("%Y%m%d"))
}

/// The day of a partition's table name, when it is one of ours.
pub fn parse_partition_name(name: &str) -> Option<NaiveDate> {
    let digits = name.strip_prefix(PARTITION_PREFIX)?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::parse_from_str(digits, "%Y%m%d").ok()
}

/// Where a day partition stands in the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// A partition of `projector.inbox`: inserts of its day land in it.
    Attached,
    /// `DETACH ... CONCURRENTLY` started and did not finish (its session died): no insert
    /// lands in it; `FINALIZE` ends the detach.
    DetachPending,
    /// A table of ours no longer attached: a drop that stopped after the detach.
    Detached,
}

/// One day partition as the catalog has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Its day.
    pub day: NaiveDate,
    /// Where it stands.
    pub attachment: Attachment,
    /// PostgreSQL's estimate of its rows (`reltuples`; 0 before the first analyze).
    pub rows_estimate: i64,
    /// Its size on disk, indexes included.
    pub bytes: i64,
}

const SQL: crate::projection::SqlFile =
    crate::projection::SqlFile::new("engine/src/inbox/inbox.sql", include_str!("inbox.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// The day partitions of `projector.inbox`, oldest first.
pub async fn partitions(
    client: &impl GenericClient,
) -> Result<Vec<Partition>, tokio_postgres::Error> {
    let rows = client.query(statement("partitions"), &[]).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let Some(day) = parse_partition_name(r.try_get(0)?) else {
            continue;
        };
        // The catalog row is read in the statement's snapshot, the size from the table
        // itself: a day a prune dropped since has no size (NULL), and is gone.
        let Some(bytes) = r.try_get::<_, Option<i64>>(3)? else {
            continue;
        };
        let attachment = match r.try_get::<_, &str>(1)? {
            "attached" => Attachment::Attached,
            "pending" => Attachment::DetachPending,
            _ => Attachment::Detached,
        };
        out.push(Partition {
            day,
            attachment,
            rows_estimate: r.try_get::<_, Option<i64>>(2)?.unwrap_or(0),
            bytes,
        });
    }
    Ok(out)
}

/// The attached days only.
async fn attached_days(
    client: &impl GenericClient,
) -> Result<BTreeSet<NaiveDate>, tokio_postgres::Error> {
    Ok(partitions(client)
        .await?
        .into_iter()
        .filter(|p| p.attachment == Attachment::Attached)
        .map(|p| p.day)
        .collect())
}

/// Makes `day`'s partition, inside the caller's transaction (never a batch's), which must
/// hold [`DDL_LOCK`] and must have found the day not attached. The table is created apart and then attached:
/// `CREATE TABLE ... PARTITION OF` would lock `projector.inbox` against every insert, ATTACH
/// only against other DDL. A table of that name left detached (a drop that stopped after its
/// detach) or detach-pending (one that stopped in the middle) is attached again with its rows,
/// whose next prune decides again: keeping rows is never wrong, dropping them early is.
async fn create_in(
    client: &impl GenericClient,
    day: NaiveDate,
) -> Result<(), tokio_postgres::Error> {
    let name = partition_name(day);
    let (start, end) = bounds(day);
    let state = client
        .query_opt(statement("partition_state"), &[&name])
        .await?;
    if let Some(row) = state {
        if row.try_get::<_, Option<bool>>(0)? == Some(true) {
            // Composed per day: the day's table.
            client
                .batch_execute(&format!(
                    "ALTER TABLE projector.inbox DETACH PARTITION projector.{name} FINALIZE"
                ))
                .await?;
        }
    } else {
        // Composed per day: the day's table.
        client
            .batch_execute(&format!(
                "CREATE TABLE projector.{name} (LIKE projector.inbox INCLUDING DEFAULTS)"
            ))
            .await?;
    }
    // Composed per day: bounds as text literals in UTC, the statement is DDL and takes no
    // parameters.
    client
        .batch_execute(&format!(
            "ALTER TABLE projector.inbox ATTACH PARTITION projector.{name} \
             FOR VALUES FROM ('{}') TO ('{}')",
            bound_literal(start),
            bound_literal(end),
        ))
        .await
}

/// Attaches `day`'s table again, rows and all, inside the caller's transaction, which must hold
/// [`DDL_LOCK`]: a prune that detached it found rows it may not drop after all, or stopped
/// half-way.
pub async fn attach_again(
    client: &impl GenericClient,
    day: NaiveDate,
) -> Result<(), tokio_postgres::Error> {
    create_in(client, day).await
}

/// Finishes a detach that stopped in the middle: the table leaves `projector.inbox` for good.
pub async fn finalize_detach(
    client: &impl GenericClient,
    day: NaiveDate,
) -> Result<(), tokio_postgres::Error> {
    // Composed per day: the day's table.
    client
        .batch_execute(&format!(
            "ALTER TABLE projector.inbox DETACH PARTITION projector.{} FINALIZE",
            partition_name(day)
        ))
        .await
}

/// The days a view version's applier knows to be attached: checked by every batch in memory,
/// read again from the catalog only when a batch needs a day it does not know (or after an
/// insert found no partition: a prune dropped one). One per `Applier`, shared by the workers
/// of its partitions.
#[derive(Debug, Clone, Default)]
pub struct Days {
    known: Arc<Mutex<Known>>,
}

#[derive(Debug, Default)]
struct Known {
    days: BTreeSet<NaiveDate>,
    /// The first day of the retained window (`projector.inbox_retention`).
    retained_from: Option<NaiveDate>,
    loaded: bool,
}

impl Days {
    /// An empty set, read from the catalog when first needed.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        // A poisoned lock only means a panic elsewhere; the set is still a set.
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether every one of `days` is known to be attached.
    pub fn covers(&self, days: &BTreeSet<NaiveDate>) -> bool {
        let known = self.lock();
        known.loaded && days.iter().all(|d| known.days.contains(d))
    }

    /// The oldest attached day known, if the set was read.
    pub fn oldest(&self) -> Option<NaiveDate> {
        let known = self.lock();
        known.days.first().copied().filter(|_| known.loaded)
    }

    /// The first day of the retained window (`projector.inbox_retention`): the day before the
    /// first days were made ahead, moved forward by every prune past the days it drops. An
    /// event before it is outside the window, whether or not a batch made its day since.
    /// `None` until read.
    pub fn window_start(&self) -> Option<NaiveDate> {
        let known = self.lock();
        known.retained_from.filter(|_| known.loaded)
    }

    /// Forgets what it knew: the next batch reads the catalog again.
    pub fn forget(&self) {
        let mut known = self.lock();
        known.loaded = false;
        known.days.clear();
    }

    fn learn(&self, days: BTreeSet<NaiveDate>, retained_from: Option<NaiveDate>) {
        let mut known = self.lock();
        known.days = days;
        known.retained_from = retained_from;
        known.loaded = true;
    }

    /// Which of `days` have no attached partition, read inside the caller's transaction (a
    /// batch's) when this set does not cover them all: nothing is asked of PostgreSQL when it
    /// does. Never makes a day: see [`Days::make`].
    pub async fn missing_in(
        &self,
        client: &impl GenericClient,
        days: &BTreeSet<NaiveDate>,
    ) -> Result<Vec<NaiveDate>, tokio_postgres::Error> {
        if days.is_empty() || self.covers(days) {
            return Ok(Vec::new());
        }
        let attached = attached_days(client).await?;
        let missing = days.difference(&attached).copied().collect();
        self.learn(attached, retained_from(client).await?);
        Ok(missing)
    }

    /// Reads the first day of the retained window again, inside the caller's transaction (a
    /// batch's): a prune moves it past every day it drops, and a day this set knows may have
    /// been dropped and made again (by another process) since the set was read, so the set
    /// still covers it while the window it remembers is the one before the prune.
    pub async fn read_window(
        &self,
        client: &impl GenericClient,
    ) -> Result<(), tokio_postgres::Error> {
        let from = retained_from(client).await?;
        self.lock().retained_from = from;
        Ok(())
    }

    /// Makes each of `days` that has no partition, each in a transaction of its own on
    /// `client` (which must not be inside one), under [`DDL_LOCK`] with a short lock timeout,
    /// and learns what is attached. A day is never made inside a batch's transaction: DDL
    /// there would hold its locks until the batch commits, a batch left open (a stalled
    /// worker, a zombie) would hold every batch that needs a new day, and a batch rolled back
    /// would leave this set believing in a day that does not exist.
    pub async fn make(
        &self,
        client: &mut deadpool_postgres::Client,
        days: &BTreeSet<NaiveDate>,
    ) -> Result<Vec<NaiveDate>, tokio_postgres::Error> {
        let mut made = Vec::new();
        for &day in days {
            let tx = client.transaction().await?;
            tx.batch_execute(statement("short_lock_timeout")).await?;
            tx.execute(statement("ddl_lock"), &[&DDL_LOCK]).await?;
            if !attached_days(&tx).await?.contains(&day) {
                create_in(&tx, day).await?;
                made.push(day);
            }
            tx.commit().await?;
        }
        self.load(&*client).await?;
        if !made.is_empty() {
            tracing::info!(days = ?made, "made inbox partitions for days a batch needed");
        }
        Ok(made)
    }

    /// Reads the attached days from the catalog.
    pub async fn load(&self, client: &impl GenericClient) -> Result<(), tokio_postgres::Error> {
        let attached = attached_days(client).await?;
        self.learn(attached, retained_from(client).await?);
        Ok(())
    }
}

/// The first day of the retained window, `None` before any day was made.
async fn retained_from(
    client: &impl GenericClient,
) -> Result<Option<NaiveDate>, tokio_postgres::Error> {
    client
        .query_opt(statement("retained_from"), &[])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// Moves the first day of the retained window past `dropped` (a day a prune dropped), never
/// back.
pub async fn retain_from_after(
    client: &impl GenericClient,
    dropped: NaiveDate,
) -> Result<(), tokio_postgres::Error> {
    let next = dropped.succ_opt().unwrap_or(dropped);
    client
        .execute(statement("retain_from_after"), &[&next])
        .await
        .map(drop)
}

/// Where the days made ahead stop: the end of the last day of the run of attached days that
/// starts at the day of `now` (the start of that day when it is missing itself); `None` when
/// no day is attached at all. A day past a gap (one made far ahead for a single event) does
/// not count: the batches of the days in the gap still need theirs, and whatever makes the
/// days ahead has stopped at the gap.
pub fn horizon(attached: &BTreeSet<NaiveDate>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if attached.is_empty() {
        return None;
    }
    let mut day = day_of(now);
    while attached.contains(&day) {
        match day.succ_opt() {
            Some(next) => day = next,
            None => return Some(bounds(day).1),
        }
    }
    Some(bounds(day).0)
}

/// How far ahead the inbox's partitions reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizon {
    /// Where the days made ahead stop ([`horizon`]); `None`: no partition at all.
    pub until: Option<DateTime<Utc>>,
    /// Days made by this call.
    pub made: usize,
}

impl Horizon {
    /// Whole seconds from `now` to where the days made ahead stop (negative: behind).
    pub fn ahead_seconds(&self, now: DateTime<Utc>) -> i64 {
        self.until.map_or(0, |u| (u - now).num_seconds())
    }
}

/// Makes every day from yesterday to [`AHEAD_DAYS`] ahead of `now` that has no partition, one
/// day per transaction, each under [`DDL_LOCK`] with a short lock timeout (another process may
/// be making the same days; a prune's detach may hold the table); a day of these a stopped
/// prune left detached or detach-pending is attached again. Returns how far the partitions
/// reach.
pub async fn ensure_ahead(
    client: &mut deadpool_postgres::Client,
    now: DateTime<Utc>,
) -> Result<Horizon, tokio_postgres::Error> {
    let today = day_of(now);
    // The window starts at the first day ever made ahead; never moved here after that.
    if let Some(first) = today.pred_opt() {
        client
            .execute(statement("retain_from_first"), &[&first])
            .await?;
    }
    let mut made = 0;
    for offset in -1..=AHEAD_DAYS {
        let Some(day) = today.checked_add_signed(chrono::Duration::days(offset)) else {
            continue;
        };
        let tx = client.transaction().await?;
        tx.batch_execute(statement("short_lock_timeout")).await?;
        tx.execute(statement("ddl_lock"), &[&DDL_LOCK]).await?;
        if !attached_days(&tx).await?.contains(&day) {
            create_in(&tx, day).await?;
            made += 1;
        }
        tx.commit().await?;
    }
    let until = horizon(&attached_days(&*client).await?, now);
    Ok(Horizon { until, made })
}

/// Records, in the caller's transaction (a batch's), that `consumer` wrote into days that
/// have already ended, reading `topic`/`partition`: retention keeps each such day a whole
/// window past this write (`projector_ops::prune`). One row per day, consumer and partition,
/// so that two workers never wait for each other here.
pub async fn mark_late_in(
    client: &impl GenericClient,
    consumer: &str,
    topic: &str,
    partition: i32,
    days: &[NaiveDate],
) -> Result<(), tokio_postgres::Error> {
    if days.is_empty() {
        return Ok(());
    }
    client
        .execute(
            statement("mark_late"),
            &[&days, &consumer, &topic, &partition],
        )
        .await
        .map(drop)
}

/// Deletes every row of `consumer` from the inbox: from each day's table, attached or not (a
/// day a stopped prune left detached comes back with its rows at the next prune otherwise),
/// and from the inbox before V0009, in slices of a short transaction each (by `ctid`, within
/// one table, where a `ctid` names one row), each slice under [`DDL_LOCK`] so that no prune
/// drops the table under it. Returns the rows deleted.
pub async fn delete_consumer(
    client: &mut deadpool_postgres::Client,
    consumer: &str,
) -> Result<u64, tokio_postgres::Error> {
    let mut tables: Vec<String> = partitions(&*client)
        .await?
        .into_iter()
        .map(|p| partition_name(p.day))
        .collect();
    tables.push("inbox_legacy".to_owned());
    let mut deleted = 0;
    for table in tables {
        // Composed per table: each day's, then the inbox before V0009.
        let delete = format!(
            "DELETE FROM projector.{table} WHERE ctid = ANY(ARRAY( \
                 SELECT ctid FROM projector.{table} WHERE consumer = $1 LIMIT 10000))"
        );
        loop {
            let tx = client.transaction().await?;
            tx.execute(statement("ddl_lock"), &[&DDL_LOCK]).await?;
            // A prune may have dropped the day since the list was read.
            let exists: bool = tx
                .query_one(statement("table_exists"), &[&table])
                .await?
                .try_get(0)?;
            if !exists {
                break;
            }
            let n = tx.execute(&delete, &[&consumer]).await?;
            tx.commit().await?;
            deleted += n;
            if n == 0 {
                break;
            }
        }
    }
    Ok(deleted)
}

/// Whether a database error is an insert into `projector.inbox` that found no partition for
/// its day: a prune dropped a day this process thought attached. The batch is retried (the
/// event is not at fault) and the process reads the catalog again.
pub fn is_missing_partition(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        db.code() == &tokio_postgres::error::SqlState::CHECK_VIOLATION
            && db.schema() == Some("projector")
            && db.table() == Some("inbox")
    })
}

/// Whether a unique violation was raised by the inbox's key (on the parent or on one of its
/// day partitions).
pub fn is_inbox_table(table: Option<&str>) -> bool {
    table.is_some_and(|t| t == "inbox" || parse_partition_name(t).is_some())
}

/// Whether `consumer` still has rows in `projector.inbox_legacy` (the inbox before V0009,
/// keyed by event id alone): its statements must look there too. The table takes no new rows,
/// so a consumer without rows there never has any again.
pub async fn has_legacy_rows(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<bool, tokio_postgres::Error> {
    client
        .query_one(statement("has_legacy_rows"), &[&consumer])
        .await?
        .try_get(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "partitions",
            "partition_state",
            "short_lock_timeout",
            "ddl_lock",
            "table_exists",
            "retained_from",
            "retain_from_first",
            "retain_from_after",
            "mark_late",
            "has_legacy_rows",
        ] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }

    #[test]
    fn a_partition_name_is_its_day_and_reads_back() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 2).expect("a date");
        assert_eq!(partition_name(day), "inbox_p20261202");
        assert_eq!(parse_partition_name("inbox_p20261202"), Some(day));
        assert_eq!(parse_partition_name("inbox_p2026120"), None);
        assert_eq!(parse_partition_name("inbox_p20261302"), None);
        assert_eq!(parse_partition_name("inbox_legacy"), None);
        let first = NaiveDate::from_ymd_opt(1, 1, 1).expect("a date");
        assert_eq!(partition_name(first), "inbox_p00010101");
        assert_eq!(parse_partition_name("inbox_p00010101"), Some(first));
    }

    #[test]
    fn a_day_is_bounded_by_utc_midnights() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 31).expect("a date");
        let (start, end) = bounds(day);
        assert_eq!(start.to_rfc3339(), "2026-12-31T00:00:00+00:00");
        assert_eq!(end.to_rfc3339(), "2027-01-01T00:00:00+00:00");
        let last = DateTime::parse_from_rfc3339("2026-12-31T23:59:59.999999Z")
            .expect("a time")
            .with_timezone(&Utc);
        assert_eq!(day_of(last), day);
        assert_eq!(day_of(end), day.succ_opt().expect("a date"));
    }

    #[test]
    fn bounds_are_named_as_postgresql_reads_them_to_the_end_of_year_9999() {
        let last = NaiveDate::from_ymd_opt(9999, 12, 31).expect("a date");
        let (start, end) = bounds(last);
        assert_eq!(bound_literal(start), "9999-12-31 00:00:00+00");
        assert_eq!(bound_literal(end), "10000-01-01 00:00:00+00");
        let first = NaiveDate::from_ymd_opt(1, 1, 1).expect("a date");
        assert_eq!(bound_literal(bounds(first).0), "0001-01-01 00:00:00+00");
    }

    #[test]
    fn the_horizon_stops_at_the_first_day_missing_from_today_on() {
        let now = DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z")
            .expect("a time")
            .with_timezone(&Utc);
        let today = day_of(now);
        let days = |offsets: &[i64]| -> BTreeSet<NaiveDate> {
            offsets
                .iter()
                .map(|d| today + chrono::Duration::days(*d))
                .collect()
        };
        let day_end = |d: i64| bounds(today + chrono::Duration::days(d)).1;
        assert_eq!(horizon(&BTreeSet::new(), now), None);
        assert_eq!(horizon(&days(&[-1, 0, 1, 2]), now), Some(day_end(2)));
        // A day far ahead past a gap: the days stop at the gap.
        assert_eq!(horizon(&days(&[-1, 0, 60]), now), Some(day_end(0)));
        // Today itself missing: behind already.
        assert_eq!(horizon(&days(&[-1, 60]), now), Some(bounds(today).0));
        let last = NaiveDate::from_ymd_opt(9999, 12, 31).expect("a date");
        let at_the_end = last.and_hms_opt(1, 0, 0).expect("a time").and_utc();
        assert_eq!(
            horizon(&BTreeSet::from([last]), at_the_end),
            Some(bounds(last).1)
        );
    }

    #[test]
    fn inbox_errors_are_told_by_their_table() {
        assert!(is_inbox_table(Some("inbox")));
        assert!(is_inbox_table(Some("inbox_p20261202")));
        assert!(!is_inbox_table(Some("inbox_legacy")));
        assert!(!is_inbox_table(Some("portfolio_v1")));
        assert!(!is_inbox_table(None));
    }

    #[test]
    fn a_set_of_days_covers_nothing_until_it_was_read() {
        let days = Days::new();
        let d = NaiveDate::from_ymd_opt(2026, 12, 2).expect("a date");
        assert!(!days.covers(&BTreeSet::from([d])));
        days.learn(BTreeSet::from([d]), Some(d));
        assert!(days.covers(&BTreeSet::from([d])));
        assert!(!days.covers(&BTreeSet::from([d.succ_opt().expect("a date")])));
        assert_eq!(days.oldest(), Some(d));
        assert_eq!(days.window_start(), Some(d));
        days.forget();
        assert!(!days.covers(&BTreeSet::from([d])));
        assert_eq!(days.oldest(), None);
        assert_eq!(days.window_start(), None);
    }
}
