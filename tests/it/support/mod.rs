//! Shared by the integration tests: a small order-sensitive view and event generators.
#![allow(dead_code)]

pub mod broker;
pub mod kafka;
pub mod process;
pub mod proxy;
pub mod risk;
pub mod variant;

use std::future::Future;
use std::time::{Duration, Instant};

use projector_engine::testkit::{fill, EventSpec};
use projector_engine::{ApplySql, DedupMode, Projection};

/// A small view whose rows expose any mistake: `trail` lists the applied `seq`s in the order
/// they were applied, so a duplicate or a reordering changes the text. A CHECK constraint
/// lets tests make one event's statement fail on purpose (`qty` of 1000000 or more).
#[derive(Debug, Clone)]
pub struct Trail {
    pub version: i32,
    pub dedup: DedupMode,
}

impl Trail {
    pub fn new(version: i32) -> Self {
        Self {
            version,
            dedup: DedupMode::Inbox,
        }
    }
}

impl Projection for Trail {
    fn name(&self) -> &str {
        "trail"
    }
    fn version(&self) -> i32 {
        self.version
    }
    fn subscribes(&self) -> &[&str] {
        &["fill_executed"]
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        // The built-in types' rules, which the engine applied itself before they left it.
        projector_views::events::check_rules(event)
    }
    fn dedup(&self) -> DedupMode {
        self.dedup
    }
    fn ddl(&self) -> String {
        "CREATE TABLE IF NOT EXISTS trail_v{v} (
            account_id bigint PRIMARY KEY,
            events     bigint  NOT NULL,
            trail      text    NOT NULL,
            total_qty  numeric NOT NULL CHECK (total_qty < 1000000),
            last_price numeric NOT NULL,
            version    bigint  NOT NULL)"
            .to_owned()
    }
    fn tables(&self) -> Vec<String> {
        vec!["trail_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> ApplySql {
        let filter = if self.dedup.uses_version_filter() {
            "WHERE trail_v{v}.version < EXCLUDED.version"
        } else {
            ""
        };
        ApplySql {
            ctes: String::new(),
            write: format!(
                "INSERT INTO trail_v{{v}} (account_id, events, trail, total_qty, last_price, version)
                 SELECT account_id, 1, seq::text, (data->>'qty')::numeric, (data->>'price')::numeric, seq FROM ev
                 ON CONFLICT (account_id) DO UPDATE SET
                   events = trail_v{{v}}.events + 1,
                   trail = trail_v{{v}}.trail || ',' || EXCLUDED.trail,
                   total_qty = trail_v{{v}}.total_qty + EXCLUDED.total_qty,
                   last_price = EXCLUDED.last_price,
                   version = EXCLUDED.version
                 {filter}
                 RETURNING 1"
            ),
        }
    }
    fn read_sql(&self) -> String {
        "SELECT account_id, events, trail, total_qty, last_price, version FROM trail_v{v}"
            .to_owned()
    }
}

/// A small order-independent view: per account, its fills, their quantity, and its memos,
/// summed with `GROUP BY`. `memo` is a type no built-in view knows, so the data of a memo is
/// whatever JSON object the producer sent: this view sends every storable shape of `data` to
/// PostgreSQL.
#[derive(Debug, Clone)]
pub struct Tally {
    pub version: i32,
}

impl Tally {
    pub fn new(version: i32) -> Self {
        Self { version }
    }
}

impl Projection for Tally {
    fn name(&self) -> &str {
        "tally"
    }
    fn version(&self) -> i32 {
        self.version
    }
    fn subscribes(&self) -> &[&str] {
        &["fill_executed", "memo"]
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        // The built-in types' rules, which the engine applied itself before they left it.
        projector_views::events::check_rules(event)
    }
    fn dedup(&self) -> DedupMode {
        DedupMode::Inbox
    }
    fn order_independent(&self) -> bool {
        true
    }
    fn ddl(&self) -> String {
        "CREATE TABLE IF NOT EXISTS tally_v{v} (
            account_id bigint  PRIMARY KEY,
            fills      bigint  NOT NULL,
            qty        numeric NOT NULL,
            memos      bigint  NOT NULL)"
            .to_owned()
    }
    fn tables(&self) -> Vec<String> {
        vec!["tally_v{v}".to_owned()]
    }
    fn apply_sql(&self) -> ApplySql {
        // CASE, not FILTER, around the cast: a memo's data need not hold a `qty`.
        ApplySql {
            ctes: "t AS (
                SELECT account_id,
                       count(*) FILTER (WHERE type = 'fill_executed') AS fills,
                       coalesce(sum(CASE WHEN type = 'fill_executed'
                                         THEN (data->>'qty')::numeric END), 0) AS qty,
                       count(*) FILTER (WHERE type = 'memo') AS memos
                FROM ev GROUP BY account_id)"
                .to_owned(),
            write: "INSERT INTO tally_v{v} AS x (account_id, fills, qty, memos)
                    SELECT account_id, fills, qty, memos FROM t
                    ON CONFLICT (account_id) DO UPDATE SET
                      fills = x.fills + EXCLUDED.fills,
                      qty = x.qty + EXCLUDED.qty,
                      memos = x.memos + EXCLUDED.memos
                    RETURNING 1"
                .to_owned(),
        }
    }
    fn read_sql(&self) -> String {
        "SELECT account_id, fills, qty, memos FROM tally_v{v}".to_owned()
    }
}

/// The expected `tally_v*` row text for the fold of `events` (distinct by event id). An
/// account gets a row once it has a fill or a memo.
pub fn tally_fold(events: &[EventSpec]) -> Vec<String> {
    use rust_decimal::Decimal;
    use std::collections::{BTreeMap, BTreeSet};
    use std::str::FromStr;
    let mut seen = BTreeSet::new();
    let mut by_account: BTreeMap<i64, (u64, Decimal, u64)> = BTreeMap::new();
    for e in events {
        if !seen.insert(e.event_id.as_str()) {
            continue;
        }
        match e.event_type.as_str() {
            "fill_executed" => {
                let qty = Decimal::from_str(e.data["qty"].as_str().expect("qty")).expect("decimal");
                let t = by_account.entry(e.account_id).or_default();
                t.0 += 1;
                t.1 += qty;
            }
            "memo" => by_account.entry(e.account_id).or_default().2 += 1,
            _ => {}
        }
    }
    by_account
        .into_iter()
        .map(|(account, (fills, qty, memos))| format!("({account},{fills},{qty},{memos})"))
        .collect()
}

/// Fills for `accounts` accounts with `per_account` events each, interleaved round-robin
/// (each account in `seq` order). Quantities vary so sums are distinctive.
pub fn fills(accounts: i64, per_account: i64) -> Vec<EventSpec> {
    let mut out = Vec::new();
    for seq in 1..=per_account {
        for account in 1..=accounts {
            let qty = format!("{}.{:02}", account * 10 + seq, seq % 100);
            let price = format!("1.{:05}", 8000 + account * 7 + seq);
            out.push(fill(
                account,
                seq,
                "2026-11-29T10:15:00Z",
                "EURUSD",
                "buy",
                &qty,
                &price,
                "0.50",
            ));
        }
    }
    out
}

/// The expected `trail_v*` row text for the fold of `events` (distinct, in `seq` order).
pub fn trail_fold(events: &[EventSpec]) -> Vec<String> {
    use rust_decimal::Decimal;
    use std::collections::BTreeMap;
    use std::str::FromStr;
    let mut by_account: BTreeMap<i64, BTreeMap<i64, &EventSpec>> = BTreeMap::new();
    for e in events {
        by_account.entry(e.account_id).or_default().insert(e.seq, e);
    }
    let mut rows: Vec<String> = by_account
        .into_iter()
        .map(|(account, evs)| {
            let trail: Vec<String> = evs.keys().map(|s| s.to_string()).collect();
            let total: Decimal = evs
                .values()
                .map(|e| Decimal::from_str(e.data["qty"].as_str().expect("qty")).expect("decimal"))
                .sum();
            let (last_seq, last) = evs.iter().next_back().expect("non-empty");
            let price = last.data["price"].as_str().expect("price");
            // Row text quotes a field only when it holds a comma (or another special character).
            let trail = trail.join(",");
            let trail = if trail.contains(',') {
                format!("\"{trail}\"")
            } else {
                trail
            };
            format!(
                "({account},{},{trail},{total},{price},{last_seq})",
                evs.len()
            )
        })
        .collect();
    rows.sort();
    rows
}

/// Rows of a table as text, sorted.
pub async fn rows(client: &deadpool_postgres::Client, table: &str) -> Vec<String> {
    client
        .query(&format!("SELECT t::text FROM {table} t ORDER BY 1"), &[])
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `url` with the session options `-c name=value ...` in its `options` parameter, percent-
/// encoded as libpq and tokio-postgres read it. The engine adds its own defaults only for
/// settings the options leave out (`projector_engine::db::pool`).
pub fn with_options(url: &str, settings: &[(&str, &str)]) -> String {
    let options: Vec<String> = settings
        .iter()
        .map(|(name, value)| format!("-c%20{name}%3D{value}"))
        .collect();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options={}", options.join("%20"))
}

/// A view version's offset rows, summed over partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offsets {
    /// `next_offset` per partition.
    pub next: std::collections::BTreeMap<i32, i64>,
    pub applied: i64,
    pub ignored: i64,
    pub duplicates: i64,
    pub dead_lettered: i64,
    pub waiting: i64,
    pub drained: i64,
}

impl Offsets {
    /// The messages the counters account for: each consumed message is counted once as
    /// applied, ignored, duplicate, dead-lettered or waiting, and a waiting one again (in
    /// what became of it) when it drains.
    pub fn accounted(&self) -> i64 {
        self.applied + self.ignored + self.duplicates + self.dead_lettered + self.waiting
            - self.drained
    }
}

/// Reads a view version's offset rows.
pub async fn offsets(client: &deadpool_postgres::Client, consumer: &str) -> Offsets {
    let rows = client
        .query(
            "SELECT partition, next_offset, applied, ignored, duplicates, dead_lettered, waiting, drained \
             FROM projector.offsets WHERE consumer = $1",
            &[&consumer],
        )
        .await
        .expect("offsets");
    let mut o = Offsets::default();
    for r in rows {
        o.next.insert(r.get(0), r.get(1));
        o.applied += r.get::<_, i64>(2);
        o.ignored += r.get::<_, i64>(3);
        o.duplicates += r.get::<_, i64>(4);
        o.dead_lettered += r.get::<_, i64>(5);
        o.waiting += r.get::<_, i64>(6);
        o.drained += r.get::<_, i64>(7);
    }
    o
}

/// How long a test waits for a signal before it fails.
pub const WAIT: Duration = Duration::from_secs(120);

/// Polls until `done` holds for what `probe` reads; panics at `limit`. The interval is a
/// sampling rate, not a guess at how long anything takes.
pub async fn within<T: std::fmt::Debug, F: Future<Output = T>>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let seen = probe().await;
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: last seen {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`within`] the default [`WAIT`].
pub async fn eventually<T: std::fmt::Debug, F: Future<Output = T>>(
    what: &str,
    probe: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    within(what, WAIT, probe, done).await
}

/// A database with [`Trail`] v1 migrated, and its applier on an ordered source.
pub async fn trail_db() -> (projector_engine::testkit::TestDb, projector_engine::Applier) {
    applier_db(Trail::new(1)).await
}

/// A database with `view` migrated, and its applier on an ordered source.
pub async fn applier_db(
    view: impl Projection + Clone,
) -> (projector_engine::testkit::TestDb, projector_engine::Applier) {
    let registry = projector_engine::Registry::new()
        .register(view.clone())
        .expect("registry");
    let db = projector_engine::testkit::TestDb::new(&registry).await;
    let applier = projector_engine::Applier::new(
        std::sync::Arc::new(view),
        projector_engine::SourceOrdering::PerAccount,
    )
    .expect("applier");
    (db, applier)
}

/// The disposition of every message of a batch, in offset order.
pub fn kinds(outcome: &projector_engine::BatchOutcome) -> Vec<projector_engine::Disposition> {
    outcome.dispositions.iter().map(|(_, d)| *d).collect()
}

/// The `seq`s [`Trail`] v1 applied for `account`, in order; `None` before its first.
pub async fn trail_of(client: &deadpool_postgres::Client, account: i64) -> Option<String> {
    client
        .query_opt(
            "SELECT trail FROM trail_v1 WHERE account_id = $1",
            &[&account],
        )
        .await
        .expect("trail")
        .map(|r| r.get(0))
}

/// The parked accounts of `trail_v1`: (account, blocked seq), by account.
pub async fn trail_parks(client: &deadpool_postgres::Client) -> Vec<(i64, i64)> {
    client
        .query(
            "SELECT account_id, blocked_seq FROM projector.parked_accounts \
             WHERE consumer = 'trail_v1' ORDER BY 1",
            &[],
        )
        .await
        .expect("parks")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Dead letters (offset, kind, resolution or "open"), parks (account, blocked seq),
/// progress (account, last seq) of `trail_v1`, and the trails of accounts 1 to 3.
pub type TrailState = (
    Vec<(i64, String, String)>,
    Vec<(i64, i64)>,
    Vec<(i64, i64)>,
    Vec<Option<String>>,
);

pub async fn trail_state(client: &deadpool_postgres::Client) -> TrailState {
    let dead = client
        .query(
            "SELECT \"offset\", kind, coalesce(resolution, 'open') FROM projector.dead_letters \
             WHERE consumer = 'trail_v1' ORDER BY 1",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let parks = trail_parks(client).await;
    let progress = client
        .query(
            "SELECT account_id, last_seq FROM projector.account_progress \
             WHERE consumer = 'trail_v1' ORDER BY 1",
            &[],
        )
        .await
        .expect("progress")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut trails = Vec::new();
    for account in 1..=3 {
        trails.push(trail_of(client, account).await);
    }
    (dead, parks, progress, trails)
}

/// Applies `feed[..pre]` as one batch, then the rest as one batch and, in a fresh database,
/// as batches split before each of `splits`. Returns both end states. Each batch must end
/// within ten seconds.
pub async fn one_batch_vs_split(
    feed: &[EventSpec],
    pre: usize,
    splits: &[usize],
) -> [TrailState; 2] {
    let mut seen = Vec::new();
    let end = feed.len();
    let mut bounds = vec![pre];
    bounds.extend_from_slice(splits);
    bounds.push(end);
    let split: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
    for batches in [vec![(pre, end - pre)], split] {
        let (db, applier) = applier_db(Trail::new(1)).await;
        let mut client = db.client().await;
        let log = projector_engine::testkit::Partition::from_events("fills", 0, feed);
        if pre > 0 {
            applier
                .apply(&mut client, &log.batch(0, pre))
                .await
                .expect("first batch");
        }
        for (start, len) in batches {
            tokio::time::timeout(
                Duration::from_secs(10),
                applier.apply(&mut client, &log.batch(start as i64, len)),
            )
            .await
            .unwrap_or_else(|_| panic!("the batch at {start} ({len} events) did not end"))
            .expect("batch");
        }
        seen.push(trail_state(&client).await);
    }
    [seen[0].clone(), seen[1].clone()]
}

/// Waits until `n` backends of the test database wait on a lock.
pub async fn lock_waiters(observer: &deadpool_postgres::Client, n: i64) {
    eventually(
        "backends waiting on a lock",
        || async {
            observer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get::<_, i64>(0)
        },
        |blocked| *blocked >= n,
    )
    .await;
}

/// Applies `batch` on a connection of its own, in a task.
pub fn spawn_apply(
    applier: &std::sync::Arc<projector_engine::Applier>,
    db: &projector_engine::testkit::TestDb,
    batch: projector_engine::Batch,
) -> tokio::task::JoinHandle<projector_engine::BatchOutcome> {
    let (applier, pool) = (applier.clone(), db.pool().clone());
    tokio::spawn(async move {
        let mut c = pool.get().await.expect("client");
        applier.apply(&mut c, &batch).await.expect("apply")
    })
}

/// An applier of `view` on a per-account ordered source.
pub fn applier(view: std::sync::Arc<dyn Projection>) -> projector_engine::Applier {
    projector_engine::Applier::new(view, projector_engine::SourceOrdering::PerAccount)
        .expect("applier")
}

/// The batch counters summed, once it is checked that no event was poison, failed or left
/// waiting: a statement that fails on an event's data dead-letters the event instead of
/// failing the batch, so a broken view would go unnoticed without the check. `label` names
/// the view in the failure.
pub fn totals(
    label: &str,
    outcomes: &[projector_engine::BatchOutcome],
) -> projector_engine::Counts {
    let mut t = projector_engine::Counts::default();
    for o in outcomes {
        let c = &o.counts;
        assert_eq!((c.poison, c.failed, c.waiting), (0, 0, 0), "{label}: {c:?}");
        t += c;
    }
    t
}

/// The rows of `sql` (rendered for `view`), every column read as text.
pub async fn view_rows(
    client: &deadpool_postgres::Client,
    view: &dyn Projection,
    sql: &str,
) -> Vec<Vec<String>> {
    let sql = projector_engine::projection::render(view, sql);
    client
        .query(&sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| (0..row.len()).map(|i| row.get::<_, String>(i)).collect())
        .collect()
}

/// Each account's last `seq` among `events`, by account: the watermarks of a snapshot taken
/// after them, as (accounts, seqs).
pub fn last_seqs(events: &[EventSpec]) -> (Vec<i64>, Vec<i64>) {
    let mut last = std::collections::BTreeMap::new();
    for e in events {
        last.insert(e.account_id, e.seq);
    }
    last.into_iter().unzip()
}

/// What a rebuild's seeding does, by hand, once the caller has filled the write side's
/// `positions`: fills its `account_seq` with `accounts` and `seqs`, then in one REPEATABLE
/// READ transaction runs each view's snapshot statement and records the watermarks as the
/// accounts' progress, so that the tail skips what the snapshot holds. Returns each view's
/// watermarks as its snapshot statement gave them, by account.
pub async fn seed_from_snapshots(
    client: &mut deadpool_postgres::Client,
    views: &[std::sync::Arc<dyn Projection>],
    accounts: &[i64],
    seqs: &[i64],
) -> Vec<std::collections::BTreeMap<i64, i64>> {
    client
        .execute(
            "INSERT INTO account_seq SELECT * FROM unnest($1::bigint[], $2::bigint[])",
            &[&accounts, &seqs],
        )
        .await
        .expect("account_seq");
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .expect("begin");
    let mut marks = Vec::new();
    for view in views {
        let sql = projector_engine::projection::render(
            &**view,
            &view.snapshot_sql().expect("a snapshot query"),
        );
        marks.push(
            tx.query(&sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .iter()
                .map(|r| (r.get("account_id"), r.get("watermark_seq")))
                .collect(),
        );
        tx.execute(
            "INSERT INTO projector.account_progress (consumer, account_id, last_seq, watermark_seq) \
             SELECT $1, a, w, w FROM unnest($2::bigint[], $3::bigint[]) AS t(a, w)",
            &[&view.consumer(), &accounts, &seqs],
        )
        .await
        .expect("watermarks");
    }
    tx.commit().await.expect("commit");
    marks
}
