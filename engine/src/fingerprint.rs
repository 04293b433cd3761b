//! A version runs only with the code that made it.
//!
//! A view version's rows are the fold of its events under one code: its DDL and statements.
//! In a rolling upgrade two binaries run side by side; when the new one registers
//! `portfolio` v2 with new SQL and cuts over, the old one follows the cutover and, without
//! this check, would build v2 from its own v1 code (`Projection::at_version`) and apply the
//! old SQL to `portfolio_v2`: rows of two codes mixed in one table, and nothing says so. The
//! same holds for an old `projector dlq retry`.
//!
//! So the registry row of every version records the fingerprint of the code that registered
//! it ([`of`]: a hash of everything that decides its rows), written once and never changed.
//! A process whose code for the version has another fingerprint, or which has no code for
//! it, never consumes or repairs it, and says so in one line naming the view, the version and
//! both fingerprints ([`check`]).
//!
//! A version registered before fingerprints existed has none. Only `migrate` records one for
//! it, and only from code registered for that very version (never from another version's code
//! built at it): every other path leaves such a version alone until the binary that made it
//! migrates.
//!
//! A change that keeps a version's results (a faster statement, say) declares the
//! fingerprints it replaces ([`Projection::replaces`]), so upgrading the binary keeps the
//! version running; a change of results is a new version, built by `projector rebuild`.
//! Rust code the engine cannot read (`Projection::validate`, the bodies of upcasters; the
//! version a view reads each type at is in) is not in the fingerprint: a
//! change there that changes results is a new version by the same rule.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::projection::{render, Field, Projection};

/// Hex digits kept of the hash: enough that two codes never meet by chance, short enough to
/// read in a log line and to copy into [`Projection::replaces`].
const DIGITS: usize = 16;

/// The fingerprint of a view version's code: a hash of its name, version, subscribed types,
/// fields, the versions it reads its types at (when above 1), dedup mode, ordering, tables, DDL and every statement (apply, read, notices,
/// snapshot), rendered for its version, with line ends normalised (a checkout with CRLF line
/// ends is the same code).
pub fn of(projection: &dyn Projection) -> String {
    let mut text = String::from("projector view fingerprint 1\n");
    let mut field = |key: &str, value: &str| {
        // Length-prefixed: no two different codes write the same text.
        let _ = write!(text, "{key} {}\n{value}\n", value.len());
    };
    field("name", projection.name());
    field("version", &projection.version().to_string());
    let mut types: Vec<&str> = projection.subscribes().to_vec();
    types.sort_unstable();
    types.dedup();
    field("subscribes", &types.join(","));
    let fields: Vec<String> = projection
        .fields()
        .iter()
        .map(|f| match f {
            Field::Text(n) => format!("text:{n}"),
            Field::Decimal(n) => format!("decimal:{n}"),
            Field::Data => "data".to_owned(),
        })
        .collect();
    field("fields", &fields.join(","));
    // The versions the view reads its types at, when any is above 1: a view written before
    // event versions existed keeps the fingerprint it had.
    let reads: Vec<String> = crate::upcast::Upcasters::new(projection.upcasters())
        .map(|u| u.versions())
        .unwrap_or_default()
        .into_iter()
        .map(|(t, v)| format!("{t}:{v}"))
        .collect();
    if !reads.is_empty() {
        field("reads", &reads.join(","));
    }
    field("dedup", projection.dedup().as_str());
    field(
        "order_independent",
        &projection.order_independent().to_string(),
    );
    field(
        "many_per_account",
        &projection.many_per_account().to_string(),
    );
    let sql = |s: &str| render(projection, s).replace("\r\n", "\n");
    field("tables", &sql(&projection.tables().join(",")));
    field("ddl", &sql(&projection.ddl()));
    let apply = projection.apply_sql();
    field("ctes", &sql(&apply.ctes));
    field("write", &sql(&apply.write));
    field("read", &sql(&projection.read_sql()));
    field(
        "notices",
        &projection
            .notices_sql()
            .map(|s| sql(&s))
            .unwrap_or_default(),
    );
    field(
        "snapshot",
        &projection
            .snapshot_sql()
            .map(|s| sql(&s))
            .unwrap_or_default(),
    );
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(DIGITS);
    for byte in digest.iter().take(DIGITS / 2) {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// How a process's code relates to the code that registered a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The same code.
    Same,
    /// Other code that declares it keeps the recorded code's results.
    Replaces {
        /// The fingerprint the registry row holds.
        recorded: String,
    },
    /// The version was registered before fingerprints were recorded, and `migrate` records
    /// this code's fingerprint for it now ([`judge`] only; [`check`] refuses such a version).
    Adopted,
    /// No registry row for the version.
    Unregistered,
}

/// Why this process must leave a version alone, or could not find out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodeError {
    /// This process's code for the version is not the code that registered it.
    #[error("{name} v{version}: this binary's code for it (fingerprint {ours}) is not the code that registered it (fingerprint {recorded}); left alone: run the binary that registered it, or rebuild {name} into a new version with this code")]
    Differs {
        /// The view.
        name: String,
        /// The version.
        version: i32,
        /// This process's fingerprint.
        ours: String,
        /// The registry row's.
        recorded: String,
    },
    /// The version was registered before fingerprints existed and no `migrate` has recorded
    /// its code yet.
    #[error("{name} v{version} was registered before code fingerprints were recorded, and no migrate has recorded its code yet; left alone: run `projector migrate` with the binary that registered it")]
    Unrecorded {
        /// The view.
        name: String,
        /// The version.
        version: i32,
    },
    /// The registry could not be read.
    #[error("{consumer}: while checking its code against the registry: {source}")]
    Database {
        /// The view version.
        consumer: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// The rule, without the database: `recorded` is the registry row's fingerprint (`None`
/// when the row has none yet).
pub fn judge(projection: &dyn Projection, recorded: Option<&str>) -> Result<Verdict, CodeError> {
    let ours = of(projection);
    let Some(recorded) = recorded else {
        return Ok(Verdict::Adopted);
    };
    if recorded == ours {
        return Ok(Verdict::Same);
    }
    if projection.replaces().iter().any(|r| r == recorded) {
        return Ok(Verdict::Replaces {
            recorded: recorded.to_owned(),
        });
    }
    Err(CodeError::Differs {
        name: projection.name().to_owned(),
        version: projection.version(),
        ours,
        recorded: recorded.to_owned(),
    })
}

/// Checks this process's code for a version against the fingerprint its registry row
/// records. A version with none recorded yet is refused ([`CodeError::Unrecorded`]).
pub async fn check(
    client: &impl deadpool_postgres::GenericClient,
    projection: &dyn Projection,
) -> Result<Verdict, CodeError> {
    let row = crate::versions::recorded(client, projection.name(), projection.version())
        .await
        .map_err(|source| CodeError::Database {
            consumer: projection.consumer(),
            source,
        })?;
    let Some(recorded) = row else {
        return Ok(Verdict::Unregistered);
    };
    match recorded {
        Some(recorded) => judge(projection, Some(&recorded)),
        None => Err(CodeError::Unrecorded {
            name: projection.name().to_owned(),
            version: projection.version(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{ApplySql, DedupMode};

    #[derive(Clone)]
    struct View {
        version: i32,
        write: &'static str,
        replaces: Vec<String>,
    }

    impl Projection for View {
        fn name(&self) -> &str {
            "marks"
        }
        fn version(&self) -> i32 {
            self.version
        }
        fn subscribes(&self) -> &[&str] {
            &["mark"]
        }
        fn dedup(&self) -> DedupMode {
            DedupMode::Inbox
        }
        fn ddl(&self) -> String {
            "CREATE TABLE IF NOT EXISTS marks_v{v} (account_id bigint PRIMARY KEY)".to_owned()
        }
        fn tables(&self) -> Vec<String> {
            vec!["marks_v{v}".to_owned()]
        }
        fn apply_sql(&self) -> ApplySql {
            ApplySql {
                ctes: String::new(),
                write: self.write.to_owned(),
            }
        }
        fn read_sql(&self) -> String {
            "SELECT * FROM marks_v{v}".to_owned()
        }
        fn replaces(&self) -> Vec<String> {
            self.replaces.clone()
        }
    }

    fn view(version: i32, write: &'static str) -> View {
        View {
            version,
            write,
            replaces: Vec::new(),
        }
    }

    #[test]
    fn the_fingerprint_follows_the_code_and_the_version() {
        let a = of(&view(
            1,
            "INSERT INTO marks_v{v} SELECT account_id FROM ev RETURNING 1",
        ));
        assert_eq!(a.len(), DIGITS);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            a,
            of(&view(
                1,
                "INSERT INTO marks_v{v} SELECT account_id FROM ev RETURNING 1"
            )),
            "the same code, the same fingerprint"
        );
        assert_ne!(
            a,
            of(&view(
                1,
                "INSERT INTO marks_v{v} SELECT account_id FROM ev RETURNING 2"
            )),
            "another statement"
        );
        assert_ne!(
            a,
            of(&view(
                2,
                "INSERT INTO marks_v{v} SELECT account_id FROM ev RETURNING 1"
            )),
            "the same code at another version"
        );
    }

    #[test]
    fn other_code_runs_a_version_only_when_it_declares_the_recorded_fingerprint() {
        let old = view(
            2,
            "INSERT INTO marks_v{v} SELECT account_id FROM ev RETURNING 1",
        );
        let recorded = of(&old);
        assert_eq!(judge(&old, Some(&recorded)).ok(), Some(Verdict::Same));
        assert_eq!(judge(&old, None).ok(), Some(Verdict::Adopted));

        let faster = View {
            replaces: vec![recorded.clone()],
            ..view(
                2,
                "INSERT INTO marks_v{v} SELECT DISTINCT account_id FROM ev RETURNING 1",
            )
        };
        assert_eq!(
            judge(&faster, Some(&recorded)).ok(),
            Some(Verdict::Replaces {
                recorded: recorded.clone()
            })
        );

        let other = view(2, "INSERT INTO marks_v{v} SELECT 7 FROM ev RETURNING 1");
        let message = judge(&other, Some(&recorded))
            .expect_err("other code is refused")
            .to_string();
        assert!(
            message.starts_with("marks v2: ")
                && message.contains(&of(&other))
                && message.contains(&recorded),
            "one line naming the view, the version and both fingerprints: {message}"
        );
    }
}
