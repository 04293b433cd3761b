//! The registry rows a rebuild reads and writes: `projector.rebuilds` (each rebuild's phase
//! and flags), whose every statement is in `rebuilds.sql`, and through the engine's owner
//! ([`projector_engine::versions`]) `projector.views` (each version's state).

use deadpool_postgres::{Client, GenericClient};
use projector_engine::versions::{self, Version};
use projector_engine::SqlFile;

use crate::error::{db, RebuildError};

const SQL: SqlFile = SqlFile::new("rebuild/src/rebuilds.sql", include_str!("rebuilds.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

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
        .query_opt(statement("unfinished"), &[&name])
        .await
        .map_err(db("reading the rebuilds"))?;
    Ok(row.map(|r| row_of(&r)))
}

/// The rebuild of `name` a cancel acts on: the one under way, else one whose cancel did
/// not finish (phase `cancelled`, its version still registered: a finished cancel deletes
/// the registry row, and this row with it).
pub async fn cancellable(client: &Client, name: &str) -> Result<Option<RebuildRow>, RebuildError> {
    let row = client
        .query_opt(statement("cancellable"), &[&name])
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
        .query_opt(statement("of_version"), &[&name, &version])
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
        .query_opt(statement("set_paused"), &[&name, &paused])
        .await
        .map_err(db("pausing the rebuild"))?;
    row.map(|r| r.get(0))
        .ok_or_else(|| RebuildError::Refused(format!("no rebuild of {name} is under way")))
}

/// The phase of the rebuild of `name` into `version`, if there is one.
pub async fn phase(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<Option<String>, tokio_postgres::Error> {
    client
        .query_opt(statement("phase"), &[&name, &version])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// Records a rebuild that begins seeding; nothing when it is recorded already.
pub async fn start(
    client: &impl GenericClient,
    code: &dyn projector_engine::Projection,
    source: Source,
    cutover: Cutover,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            statement("start"),
            &[
                &code.consumer(),
                &code.name(),
                &code.version(),
                &source.as_str(),
                &cutover.as_str(),
            ],
        )
        .await?;
    Ok(())
}

/// Seeding -> tailing after the snapshot taken at `taken_at`.
pub async fn seeded(
    client: &impl GenericClient,
    consumer: &str,
    taken_at: chrono::DateTime<chrono::Utc>,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("seeded"), &[&consumer, &taken_at])
        .await?;
    Ok(())
}

/// Seeding -> tailing without a snapshot; a cancelled rebuild stays cancelled.
pub async fn tailing(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("tailing"), &[&name, &version])
        .await?;
    Ok(())
}

/// The cutover closes the rebuild of the version of `consumer`.
pub async fn done(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<(), tokio_postgres::Error> {
    client.execute(statement("done"), &[&consumer]).await?;
    Ok(())
}

/// Marks the rebuild of `name` into `version` cancelled while the version is still
/// building; returns whether it was.
pub async fn cancel(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .execute(statement("cancel"), &[&name, &version])
        .await?
        > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "unfinished",
            "cancellable",
            "of_version",
            "phase",
            "set_paused",
            "start",
            "seeded",
            "tailing",
            "done",
            "cancel",
        ] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }
}
