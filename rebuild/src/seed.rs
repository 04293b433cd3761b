//! Seeding a new version from the write side's snapshot, in one transaction.
//!
//! One `REPEATABLE READ` transaction runs the view's snapshot statement (which fills the new
//! version's tables from the write side's `positions` and returns each account's watermark,
//! the `seq` its state reflects), records the watermarks in `projector.account_progress`,
//! and sets the new version's offsets to those Kafka returns for the snapshot's time minus a
//! margin; the phase moves to `tailing` in the same commit. A crash anywhere before the commit
//! leaves nothing: the next run seeds again. Events at or below an account's watermark are
//! skipped by the engine, so the tail's overlap with the snapshot is harmless; the margin
//! covers clock skew between the write side and the producers that stamp Kafka's times.
//! The tail never starts past the log's end as read just before the snapshot: whatever was
//! published after that moment may be missing from the snapshot, so it is read.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Client;
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::progress;
use projector_engine::projection::render;
use projector_engine::Projection;
use tokio_postgres::types::Type;
use tokio_postgres::IsolationLevel;

use crate::error::{db, RebuildError};
use crate::log;

/// What a snapshot seeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeded {
    /// Accounts whose watermark was recorded.
    pub accounts: usize,
    /// When the snapshot was taken.
    pub taken_at: chrono::DateTime<chrono::Utc>,
    /// Where the tail starts, per partition.
    pub offsets: Vec<(i32, i64)>,
}

/// Seeds `view` from its snapshot statement and positions its tail. `snapshot_sql` is the
/// view's statement (checked by the caller).
pub async fn from_snapshot(
    client: &mut Client,
    view: &Arc<dyn Projection>,
    snapshot_sql: &str,
    kafka: &KafkaConfig,
    margin: Duration,
) -> Result<Seeded, RebuildError> {
    let consumer = view.consumer();
    // The log's ends read before the snapshot is taken: every event below them was published,
    // so committed on the write side, before the snapshot began, and the snapshot holds its
    // effect. The tail may start there whatever the clocks say; the time lookup can only move
    // the start earlier (brokers that do not answer it, like the dev broker, answer the end).
    let before = {
        let config = kafka.clone();
        tokio::task::spawn_blocking(move || {
            log::connect(&config)?.extents().map_err(RebuildError::from)
        })
        .await
        .map_err(|e| RebuildError::Tail(e.to_string()))??
    };
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await
        .map_err(db("starting the snapshot transaction"))?;
    // The seed's commit waits for the WAL, though the rebuild's sessions do not: a crash of
    // PostgreSQL must not undo it under a process that goes on to tail from its offsets (the
    // tail places an offset row at the log's start for every partition that has none).
    tx.batch_execute("SET LOCAL synchronous_commit = on")
        .await
        .map_err(db("starting the snapshot transaction"))?;
    // The first query fixes the transaction's snapshot; now() is when it began (no table's
    // statement: the time of this transaction).
    let taken_at: chrono::DateTime<chrono::Utc> = tx
        .query_one("SELECT now()", &[])
        .await
        .map_err(db("taking the snapshot"))?
        .get(0);
    let statement = tx
        .prepare(&render(&**view, snapshot_sql))
        .await
        .map_err(db(
            "preparing the view's snapshot statement (it reads the write side's tables, see docs/views.md)",
        ))?;
    // By name: the contract names the columns, not their order.
    let shape = || {
        let returned: Vec<String> = statement
            .columns()
            .iter()
            .map(|c| format!("{} {}", c.name(), c.type_()))
            .collect();
        RebuildError::SnapshotColumns(format!("it returns [{}]", returned.join(", ")))
    };
    let column = |name: &str| {
        statement
            .columns()
            .iter()
            .position(|c| c.name() == name && *c.type_() == Type::INT8)
            .ok_or_else(shape)
    };
    let (account_at, watermark_at) = (column("account_id")?, column("watermark_seq")?);
    let watermarks = tx.query(&statement, &[]).await.map_err(db(
        "running the view's snapshot statement (it reads the write side's tables, see docs/views.md)",
    ))?;
    let (accounts, seqs): (Vec<i64>, Vec<i64>) = watermarks
        .iter()
        .map(|r| Ok((r.try_get(account_at)?, r.try_get(watermark_at)?)))
        .collect::<Result<Vec<(i64, i64)>, tokio_postgres::Error>>()
        .map_err(|_| RebuildError::SnapshotColumns("a row has a NULL in one of them".to_owned()))?
        .into_iter()
        .unzip();
    progress::seed_watermarks(&tx, &consumer, &accounts, &seqs)
        .await
        .map_err(db("recording the watermarks"))?;

    let from_ms =
        taken_at.timestamp_millis() - i64::try_from(margin.as_millis()).unwrap_or(i64::MAX);
    let config = kafka.clone();
    let offsets = tokio::task::spawn_blocking(move || {
        log::connect(&config)?
            .offsets_at(from_ms)
            .map_err(RebuildError::from)
    })
    .await
    .map_err(|e| RebuildError::Tail(e.to_string()))??;
    let (partitions, starts): (Vec<i32>, Vec<i64>) = offsets
        .iter()
        .map(|(p, o)| {
            let end_before = before
                .iter()
                .find(|e| e.partition == *p)
                .map_or(*o, |e| e.high);
            (*p, (*o).min(end_before))
        })
        .unzip();
    progress::place_offsets(&tx, &consumer, &kafka.topic, &partitions, &starts)
        .await
        .map_err(db("positioning the tail"))?;
    progress::record_snapshot(&tx, &consumer, taken_at, accounts.len() as i64)
        .await
        .map_err(db("recording the snapshot"))?;
    crate::state::seeded(&tx, &consumer, taken_at)
        .await
        .map_err(db("recording the snapshot"))?;
    tx.commit().await.map_err(db("committing the snapshot"))?;
    Ok(Seeded {
        accounts: accounts.len(),
        taken_at,
        offsets: partitions.into_iter().zip(starts).collect(),
    })
}
