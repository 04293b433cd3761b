//! The version registry, `projector.views`: every version of every view, its lifecycle state
//! ([`VersionState`]), the fingerprint of the code that registered it
//! ([`crate::fingerprint`]) and whether `retire --drop` dropped its tables.
//!
//! This module is the one place that reads or writes the table: its statements are in
//! `versions.sql`, and the rest of the code (`migrate`, the supervisor, the rebuild's
//! cutover, retire and cancel, the CLI) calls the functions here. The state changes are the
//! statements from `register` on in that file; [`VersionState::may_become`] names the moves
//! they make.

use std::fmt;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::{FromSql, Type};

use crate::projection::SqlFile;

const SQL: SqlFile = SqlFile::new(
    "engine/src/versions/versions.sql",
    include_str!("versions.sql"),
);

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// Where a view version is in its life (the `state` column; the migration's CHECK allows
/// these three).
///
/// ```text
/// (none) --register--> Live         the view's first version (`migrate`)
/// (none) --register--> Building     a later version (`migrate`, `rebuild`)
/// Building --make_live--> Live      cutover
/// Live --retire_replaced--> Retired cutover of another version
/// Building --retire--> Retired      `projector retire` (never the live version)
/// Building --unregister--> (none)   `rebuild --cancel`
/// ```
///
/// A retired version stays retired: a new version number is the way back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VersionState {
    /// Registered and being filled by a rebuild; not read through the stable name.
    Building,
    /// The version the stable read name shows; at most one per view.
    Live,
    /// Replaced or retired: nothing of it runs any more.
    Retired,
}

impl VersionState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            VersionState::Building => "building",
            VersionState::Live => "live",
            VersionState::Retired => "retired",
        }
    }

    /// The state of a stored name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            VersionState::Building,
            VersionState::Live,
            VersionState::Retired,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    /// Whether a version in this state may move to `to` (the diagram above). Retiring a
    /// retired version again is allowed: it changes nothing.
    pub fn may_become(self, to: VersionState) -> bool {
        matches!(
            (self, to),
            (VersionState::Building, VersionState::Live)
                | (VersionState::Live, VersionState::Retired)
                | (VersionState::Building, VersionState::Retired)
                | (VersionState::Retired, VersionState::Retired)
        )
    }
}

impl fmt::Display for VersionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A state column read as text; a name the CHECK does not allow is an error of the read.
impl<'a> FromSql<'a> for VersionState {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        VersionState::parse(text).ok_or_else(|| format!("unknown view state {text:?}").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

/// One version of a view, as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The version.
    pub version: i32,
    /// Where it is in its life.
    pub state: VersionState,
    /// Whether `retire --drop` dropped its tables.
    pub dropped: bool,
}

fn versions_of(rows: &[tokio_postgres::Row]) -> Result<Vec<Version>, tokio_postgres::Error> {
    rows.iter()
        .map(|r| {
            Ok(Version {
                version: r.try_get(0)?,
                state: r.try_get(1)?,
                dropped: r.try_get(2)?,
            })
        })
        .collect()
}

/// Every registered version of `name`, in order.
pub async fn of_name(
    client: &impl GenericClient,
    name: &str,
) -> Result<Vec<Version>, tokio_postgres::Error> {
    versions_of(&client.query(statement("of_name"), &[&name]).await?)
}

/// Every registered version of `name`, in order, locked until the transaction ends (a
/// cutover's decision).
pub async fn lock_of_name(
    client: &impl GenericClient,
    name: &str,
) -> Result<Vec<Version>, tokio_postgres::Error> {
    versions_of(&client.query(statement("lock_of_name"), &[&name]).await?)
}

/// Locks `name`'s registry rows until the transaction ends, the lock a cutover takes.
pub async fn lock_name(
    client: &impl GenericClient,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    client.execute(statement("lock_name"), &[&name]).await?;
    Ok(())
}

/// Every registered version's state, by name and version.
pub async fn all_states(
    client: &impl GenericClient,
) -> Result<Vec<(String, i32, VersionState)>, tokio_postgres::Error> {
    client
        .query(statement("all_states"), &[])
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
}

/// The live version of `name`, if any.
pub async fn live_version(
    client: &impl GenericClient,
    name: &str,
) -> Result<Option<i32>, tokio_postgres::Error> {
    client
        .query_opt(statement("live_version"), &[&name])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// Every live version whose tables were not dropped, by name: what a service consumes.
pub async fn live_everywhere(
    client: &impl GenericClient,
) -> Result<Vec<(String, i32)>, tokio_postgres::Error> {
    client
        .query(statement("live_everywhere"), &[])
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// The live version of `name` (not dropped) and the fingerprint it records.
pub async fn live_fingerprint(
    client: &impl GenericClient,
    name: &str,
) -> Result<Option<(i32, Option<String>)>, tokio_postgres::Error> {
    client
        .query_opt(statement("live_fingerprint"), &[&name])
        .await?
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .transpose()
}

/// The fingerprint a version's row records (`Some(None)`: none yet); `None`: the version is
/// not registered. A read, never an update: recording one is `migrate`'s.
pub async fn recorded(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<Option<Option<String>>, tokio_postgres::Error> {
    client
        .query_opt(statement("recorded"), &[&name, &version])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// A registered version's recorded fingerprint and whether its tables were dropped.
pub async fn recorded_and_dropped(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<Option<(Option<String>, bool)>, tokio_postgres::Error> {
    client
        .query_opt(statement("recorded_and_dropped"), &[&name, &version])
        .await?
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .transpose()
}

/// [`recorded_and_dropped`], the row locked until the transaction ends: (dropped,
/// fingerprint).
pub async fn lock_recorded(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<Option<(bool, Option<String>)>, tokio_postgres::Error> {
    client
        .query_opt(statement("lock_recorded"), &[&name, &version])
        .await?
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .transpose()
}

/// The fingerprint of a registered version, the row locked until the transaction ends; an
/// error when the version has no row.
pub async fn lock_fingerprint(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<Option<String>, tokio_postgres::Error> {
    client
        .query_one(statement("lock_fingerprint"), &[&name, &version])
        .await?
        .try_get(0)
}

/// The highest version ever registered for `name`, dropped ones included.
pub async fn highest(
    client: &impl GenericClient,
    name: &str,
) -> Result<Option<i32>, tokio_postgres::Error> {
    client
        .query_one(statement("highest"), &[&name])
        .await?
        .try_get(0)
}

/// Whether the version of this consumer name is retired: nothing of it runs any more.
pub async fn is_retired(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_opt(statement("is_retired"), &[&consumer])
        .await?
        .is_some())
}

/// Whether `retire --drop` dropped the tables of the version of this consumer name.
pub async fn is_dropped(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_opt(statement("is_dropped"), &[&consumer])
        .await?
        .is_some())
}

/// Registers a version `migrate` installs: [`VersionState::Live`] when the view has no
/// version yet, [`VersionState::Building`] otherwise. `None`: it was registered already.
pub async fn register(
    client: &impl GenericClient,
    name: &str,
    version: i32,
    fingerprint: &str,
) -> Result<Option<VersionState>, tokio_postgres::Error> {
    client
        .query_opt(statement("register"), &[&name, &version, &fingerprint])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// Registers a version a rebuild builds as [`VersionState::Building`]; nothing when it is
/// registered already.
pub async fn register_building(
    client: &impl GenericClient,
    name: &str,
    version: i32,
    fingerprint: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            statement("register_building"),
            &[&name, &version, &fingerprint],
        )
        .await?;
    Ok(())
}

/// Records `fingerprint` for a version registered before fingerprints existed.
pub async fn adopt_fingerprint(
    client: &impl GenericClient,
    name: &str,
    version: i32,
    fingerprint: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            statement("adopt_fingerprint"),
            &[&name, &version, &fingerprint],
        )
        .await?;
    Ok(())
}

/// Cutover: the version becomes [`VersionState::Live`]. The caller holds
/// [`lock_of_name`] and has retired the version that was live ([`retire_replaced`]).
pub async fn make_live(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("make_live"), &[&name, &version])
        .await?;
    Ok(())
}

/// Cutover: the version that was live becomes [`VersionState::Retired`].
pub async fn retire_replaced(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("retire_replaced"), &[&name, &version])
        .await?;
    Ok(())
}

/// `projector retire`: the version becomes [`VersionState::Retired`] unless it is live,
/// judged on the row once locked. Returns whether it was retired (or was already).
pub async fn retire(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .execute(statement("retire"), &[&name, &version])
        .await?
        > 0)
}

/// Records that `retire --drop` dropped the version's tables.
pub async fn mark_dropped(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("mark_dropped"), &[&name, &version])
        .await?;
    Ok(())
}

/// A cancelled rebuild's version leaves the registry, while it is still building.
pub async fn unregister_building(
    client: &impl GenericClient,
    name: &str,
    version: i32,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("unregister_building"), &[&name, &version])
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "of_name",
            "lock_of_name",
            "lock_name",
            "all_states",
            "live_version",
            "live_everywhere",
            "live_fingerprint",
            "recorded",
            "recorded_and_dropped",
            "lock_recorded",
            "lock_fingerprint",
            "highest",
            "is_retired",
            "is_dropped",
            "register",
            "register_building",
            "adopt_fingerprint",
            "make_live",
            "retire_replaced",
            "retire",
            "mark_dropped",
            "unregister_building",
        ] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }

    #[test]
    fn states_read_back_and_move_only_forward() {
        for s in [
            VersionState::Building,
            VersionState::Live,
            VersionState::Retired,
        ] {
            assert_eq!(VersionState::parse(s.as_str()), Some(s));
            assert!(!VersionState::Retired.may_become(VersionState::Live));
        }
        assert_eq!(VersionState::parse("dropped"), None);
        assert!(VersionState::Building.may_become(VersionState::Live));
        assert!(!VersionState::Live.may_become(VersionState::Building));
    }
}
