//! A view version's position and progress outside a batch (`projector.offsets`,
//! `projector.account_progress`, `projector.snapshots`): what a rebuild places when it seeds
//! and tails, reads for its progress, compares and hands over at a cutover, and what a drop
//! deletes. The statements are in `progress.sql`; a batch moves offsets and progress with
//! the hot path's own (`crate::queries`).

use deadpool_postgres::GenericClient;

use crate::projection::SqlFile;

const SQL: SqlFile = SqlFile::new(
    "engine/src/progress/progress.sql",
    include_str!("progress.sql"),
);

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// A skipped `seq`: the account's progress moves to it.
pub(crate) const SKIP_TO: &str = SQL.statement("skip_to");

/// The record of a skipped `seq` (`projector.skips`).
pub(crate) const RECORD_SKIP: &str = SQL.statement("record_skip");

/// One partition's offset and counters, as [`offsets`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffset {
    /// The partition.
    pub partition: i32,
    /// The next offset to consume.
    pub next_offset: i64,
    /// Events applied.
    pub applied: i64,
    /// Messages with a disposition, less the waiting ones drained since.
    pub consumed: i64,
    /// Messages dead-lettered.
    pub dead_lettered: i64,
}

/// Where a version trails another on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// By how many messages.
    pub messages: i64,
}

/// Records a snapshot's watermarks: each account of `consumer` starts at its `seq`.
pub async fn seed_watermarks(
    client: &impl GenericClient,
    consumer: &str,
    accounts: &[i64],
    seqs: &[i64],
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("seed_watermarks"), &[&consumer, &accounts, &seqs])
        .await?;
    Ok(())
}

/// Places `consumer`'s offsets on `topic`: each partition at its offset, whatever was there.
pub async fn place_offsets(
    client: &impl GenericClient,
    consumer: &str,
    topic: &str,
    partitions: &[i32],
    offsets: &[i64],
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            statement("place_offsets"),
            &[&consumer, &topic, &partitions, &offsets],
        )
        .await?;
    Ok(())
}

/// Places `consumer`'s offsets on `topic` for the partitions that have none.
pub async fn place_missing_offsets(
    client: &impl GenericClient,
    consumer: &str,
    topic: &str,
    partitions: &[i32],
    offsets: &[i64],
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            statement("place_missing_offsets"),
            &[&consumer, &topic, &partitions, &offsets],
        )
        .await?;
    Ok(())
}

/// Records when the snapshot `consumer` was seeded from was taken, and its accounts.
pub async fn record_snapshot(
    client: &impl GenericClient,
    consumer: &str,
    taken_at: chrono::DateTime<chrono::Utc>,
    accounts: i64,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            statement("record_snapshot"),
            &[&consumer, &taken_at, &accounts],
        )
        .await?;
    Ok(())
}

/// `consumer`'s offsets and counters, per partition.
pub async fn offsets(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<Vec<PartitionOffset>, tokio_postgres::Error> {
    client
        .query(statement("offsets"), &[&consumer])
        .await?
        .iter()
        .map(|r| {
            Ok(PartitionOffset {
                partition: r.try_get(0)?,
                next_offset: r.try_get(1)?,
                applied: r.try_get(2)?,
                consumed: r.try_get(3)?,
                dead_lettered: r.try_get(4)?,
            })
        })
        .collect()
}

/// Where version `new` trails version `old` (consumer names), by topic and partition.
pub async fn behind(
    client: &impl GenericClient,
    new: &str,
    old: &str,
) -> Result<Vec<Behind>, tokio_postgres::Error> {
    client
        .query(statement("behind"), &[&new, &old])
        .await?
        .iter()
        .map(|r| {
            Ok(Behind {
                topic: r.try_get(0)?,
                partition: r.try_get(1)?,
                messages: r.try_get(2)?,
            })
        })
        .collect()
}

/// Accounts version `new` has applied further than version `old` (consumer names).
pub async fn accounts_ahead(
    client: &impl GenericClient,
    new: &str,
    old: &str,
) -> Result<i64, tokio_postgres::Error> {
    client
        .query_one(statement("accounts_ahead"), &[&new, &old])
        .await?
        .try_get(0)
}

/// A cutover's hand-over: version `new` emits notices only past what `old` had applied.
pub async fn hand_over_notices(
    client: &impl GenericClient,
    new: &str,
    old: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("hand_over_notices"), &[&new, &old])
        .await?;
    Ok(())
}

/// Deletes everything the engine keeps under `consumer` but its inbox rows
/// ([`crate::inbox::delete_consumer`]): offsets, progress, waiting events, parks, snapshot,
/// late writes, seen seqs, dead letters.
pub async fn forget(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<(), tokio_postgres::Error> {
    client.execute(statement("forget"), &[&consumer]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "seed_watermarks",
            "place_offsets",
            "place_missing_offsets",
            "record_snapshot",
            "offsets",
            "behind",
            "accounts_ahead",
            "hand_over_notices",
            "forget",
        ] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }
}
