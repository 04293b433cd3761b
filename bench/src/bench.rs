//! What the phases share: the event stream with its fold and where each event lands, the
//! consumers' settings, the untimed settle between phases, and the checks of a version's
//! rows and counters against the fold.

use std::collections::BTreeMap;
use std::sync::Arc;

use deadpool_postgres::Pool;
use projector_devkit::partitioner::partition_for_account;
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::{Applier, Bell, Projection, SourceOrdering};
use projector_views::{Eod, Portfolio, Risk};

use crate::check::{self, Counters};
use crate::error::{BenchError, Doing as _};
use crate::events::{self, BenchEvent, Fold};
use crate::Options;

/// Where each event lands: (partition, offset), as the producer's murmur2 partitioner puts it
/// on an empty topic.
pub(crate) fn place(
    events: &[BenchEvent],
    partitions: i32,
) -> (Vec<(i32, i64)>, BTreeMap<i32, i64>) {
    let mut ends: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    let placement = events
        .iter()
        .map(|e| {
            let p = partition_for_account(e.account_id, partitions);
            let end = ends.entry(p).or_insert(0);
            let offset = *end;
            *end += 1;
            (p, offset)
        })
        .collect();
    (placement, ends)
}

/// [`applier`], ringing `bell` after every commit when given.
pub(crate) fn ringing(
    view: impl Projection,
    bell: Option<Bell>,
) -> Result<Arc<Applier>, BenchError> {
    let applier = Applier::new(Arc::new(view), SourceOrdering::PerAccount)?;
    Ok(Arc::new(match bell {
        Some(bell) => applier.with_bell(bell),
        None => applier,
    }))
}

pub(crate) fn applier(view: impl Projection) -> Result<Arc<Applier>, BenchError> {
    // Kafka with key = account id: the source declares per-account ordering, as `run` does.
    Ok(Arc::new(Applier::new(
        Arc::new(view),
        SourceOrdering::PerAccount,
    )?))
}

/// Full-page images the server has written since its statistics were reset
/// (`pg_stat_wal.wal_fpi`, PostgreSQL 14 and later; `None` before).
pub(crate) async fn wal_fpi(pool: &Pool) -> Result<Option<u64>, BenchError> {
    let client = pool.get().await?;
    let number: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .doing("reading the server's version")?
        .get(0);
    if number < 140_000 {
        return Ok(None);
    }
    let fpi: i64 = client
        .query_one("SELECT wal_fpi FROM pg_stat_wal", &[])
        .await
        .doing("reading pg_stat_wal")?
        .get(0);
    Ok(Some(fpi.unsigned_abs()))
}

/// Between phases, untimed: vacuum and analyze what the last phase wrote and force a
/// checkpoint, so that no phase pays for the previous one's autovacuum or checkpoint and
/// every phase starts with the same full-page-write state. `CHECKPOINT` needs superuser or
/// `pg_checkpoint`; without it the bench goes on and says so once.
pub(crate) async fn settle(pool: &Pool) -> Result<(), BenchError> {
    let client = pool.get().await?;
    client
        .batch_execute("VACUUM (ANALYZE)")
        .await
        .doing("vacuuming between phases")?;
    if let Err(e) = client.batch_execute("CHECKPOINT").await {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!("bench: no CHECKPOINT between phases ({e}); figures may be noisier")
        });
    }
    Ok(())
}

/// Compares a portfolio version with the fold and checks its counters.
pub(crate) async fn check_portfolio(
    pool: &Pool,
    version: i32,
    topic: &str,
    fold: &Fold,
    ends: &BTreeMap<i32, i64>,
) -> Result<(), BenchError> {
    check_portfolio_with(pool, version, topic, fold, ends, 0).await
}

/// [`check_portfolio`] of a version whose inbox held `filler` rows before it ran.
pub(crate) async fn check_portfolio_with(
    pool: &Pool,
    version: i32,
    topic: &str,
    fold: &Fold,
    ends: &BTreeMap<i32, i64>,
    filler: u64,
) -> Result<(), BenchError> {
    let client = pool.get().await?;
    check::table(&client, &fold.portfolio_rows(version)).await?;
    let counters = Counters {
        applied: fold.trades,
        ignored: fold.events - fold.trades,
        ends: ends.clone(),
    };
    check::counters(
        &client,
        &Portfolio::new(version).consumer(),
        topic,
        &counters,
        Some(filler),
    )
    .await
}

/// Everything the phases share.
pub(crate) struct Bench<'a> {
    pub(crate) pool: &'a Pool,
    /// The scratch database's URL, for the rebuild, which opens a pool of its own.
    pub(crate) url: &'a str,
    pub(crate) brokers: String,
    pub(crate) events: Vec<BenchEvent>,
    pub(crate) fold: Fold,
    pub(crate) placement: Vec<(i32, i64)>,
    pub(crate) ends: BTreeMap<i32, i64>,
    pub(crate) stream: Vec<String>,
}

impl<'a> Bench<'a> {
    /// The run's event stream, generated, folded and placed on `brokers`' topics.
    pub(crate) fn new(
        options: &Options,
        pool: &'a Pool,
        url: &'a str,
        brokers: String,
    ) -> Result<Self, BenchError> {
        let count = usize::try_from(options.events)?;
        eprintln!(
            "bench: generating {} events over {} accounts",
            options.events, options.accounts
        );
        let events = events::generate("e", count, options.accounts, 0x5eed);
        let fold = events::fold(&events, true);
        let (placement, ends) = place(&events, options.partitions);
        let stream: Vec<String> = events.iter().map(BenchEvent::payload).collect();
        Ok(Self {
            pool,
            url,
            brokers,
            events,
            fold,
            placement,
            ends,
            stream,
        })
    }

    /// The consumers' settings on `topic`.
    pub(crate) fn config(&self, topic: &str) -> KafkaConfig {
        // The engine's defaults, so that the figures are for what `projector run` does, plus
        // what the dev broker needs beyond them (it holds an empty fetch for the whole wait;
        // a real broker answers when data arrives).
        let mut c = KafkaConfig::new(self.brokers.clone(), topic);
        c.group_prefix = "bench".to_owned();
        c.properties = projector_devkit::devbroker::CONSUMER_PROPERTIES
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        c
    }
}

/// Portfolio, risk and eod `version` against the fold, and their counters on `topic`.
pub(crate) async fn check_all_views(
    b: &Bench<'_>,
    version: i32,
    topic: &str,
) -> Result<(), BenchError> {
    check_portfolio(b.pool, version, topic, &b.fold, &b.ends).await?;
    let client = b.pool.get().await?;
    for expected in b.fold.risk_rows(version) {
        check::table(&client, &expected).await?;
    }
    check::table(&client, &b.fold.eod_rows(version)).await?;
    let trades = Counters {
        applied: b.fold.trades,
        ignored: b.fold.events - b.fold.trades,
        ends: b.ends.clone(),
    };
    check::counters(
        &client,
        &Risk::new(version).consumer(),
        topic,
        &trades,
        Some(0),
    )
    .await?;
    let all = Counters {
        applied: b.fold.events,
        ignored: 0,
        ends: b.ends.clone(),
    };
    check::counters(&client, &Eod::new(version).consumer(), topic, &all, Some(0)).await
}
