//! The registry rows a rebuild reads and writes: `projector.views` (each version's state)
//! and `projector.rebuilds` (each rebuild's phase and flags).

use deadpool_postgres::Client;
use projector_engine::versions::{self, Version};

use crate::error::{db, RebuildError};

/// Where a rebuild seeds from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The write side's snapshot, then the Kafka tail from the snapshot's time.
    Snapshot,
    /// The whole retained log.
    Earliest,
}

impl Source {
    /// The word stored in `projector.rebuilds.source` and shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Snapshot => "snapshot",
            Source::Earliest => "earliest",
        }
    }

    fn parse(s: &str) -> Self {
        if s == "snapshot" {
            Source::Snapshot
        } else {
            Source::Earliest
        }
    }
}

/// Who switches the stable read name to the new version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cutover {
    /// The rebuild, once the new version's lag is under the threshold.
    Auto,
    /// An engineer, with `projector cutover`.
    Manual,
}

impl Cutover {
    /// The word stored in `projector.rebuilds.cutover`.
    pub fn as_str(self) -> &'static str {
        match self {
            Cutover::Auto => "auto",
            Cutover::Manual => "manual",
        }
    }
}

/// A rebuild, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildRow {
    /// The version being built.
    pub version: i32,
    /// Where it seeds from.
    pub source: Source,
    /// `seeding`, `tailing`, `done` or `cancelled`.
    pub phase: String,
    /// Paused by an engineer.
    pub paused: bool,
    /// Who cuts over.
    pub cutover: Cutover,
}

/// Every registered version of `name`, in order.
pub async fn versions(client: &Client, name: &str) -> Result<Vec<Version>, RebuildError> {
    versions::of_name(client, name)
        .await
        .map_err(db("reading the view registry"))
}

/// The rebuild of `name` that is under way (seeding or tailing), if any.
pub async fn unfinished(client: &Client, name: &str) -> Result<Option<RebuildRow>, RebuildError> {
    let row = client
        .query_opt(
            "SELECT version, source, phase, paused, cutover FROM projector.rebuilds \
             WHERE name = $1 AND phase IN ('seeding', 'tailing')",
            &[&name],
        )
        .await
        .map_err(db("reading the rebuilds"))?;
    Ok(row.map(|r| row_of(&r)))
}

/// The rebuild of `name` a cancel acts on: the one under way, else one whose cancel did
/// not finish (phase `cancelled`, its version still registered: a finished cancel deletes
/// the registry row, and this row with it).
pub async fn cancellable(client: &Client, name: &str) -> Result<Option<RebuildRow>, RebuildError> {
    let row = client
        .query_opt(
            "SELECT version, source, phase, paused, cutover FROM projector.rebuilds \
             WHERE name = $1 AND phase IN ('seeding', 'tailing', 'cancelled') \
             ORDER BY phase = 'cancelled', version DESC LIMIT 1",
            &[&name],
        )
        .await
        .map_err(db("reading the rebuilds"))?;
    Ok(row.map(|r| row_of(&r)))
}

/// The rebuild of `name` into `version`, whatever its phase.
pub async fn of_version(
    client: &Client,
    name: &str,
    version: i32,
) -> Result<Option<RebuildRow>, RebuildError> {
    let row = client
        .query_opt(
            "SELECT version, source, phase, paused, cutover FROM projector.rebuilds \
             WHERE name = $1 AND version = $2",
            &[&name, &version],
        )
        .await
        .map_err(db("reading the rebuilds"))?;
    Ok(row.map(|r| row_of(&r)))
}

fn row_of(r: &tokio_postgres::Row) -> RebuildRow {
    RebuildRow {
        version: r.get(0),
        source: Source::parse(r.get(1)),
        phase: r.get(2),
        paused: r.get(3),
        cutover: if r.get::<_, &str>(4) == "manual" {
            Cutover::Manual
        } else {
            Cutover::Auto
        },
    }
}

/// Pauses or resumes the rebuild of `name` under way. Returns its version.
pub async fn set_paused(client: &Client, name: &str, paused: bool) -> Result<i32, RebuildError> {
    let row = client
        .query_opt(
            "UPDATE projector.rebuilds SET paused = $2, updated_at = now() \
             WHERE name = $1 AND phase IN ('seeding', 'tailing') RETURNING version",
            &[&name, &paused],
        )
        .await
        .map_err(db("pausing the rebuild"))?;
    row.map(|r| r.get(0))
        .ok_or_else(|| RebuildError::Refused(format!("no rebuild of {name} is under way")))
}
