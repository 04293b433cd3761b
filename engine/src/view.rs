//! A view written in Rust with no more than it needs: the [`View`] trait, which knows nothing
//! of versions, and [`Versioned`], the [`Projection`] the registry makes of it at a version
//! ([`Registry::view`]).
//!
//! A view's code is the same at every version: its tables carry `{v}`, and the registry says
//! which versions run. So a view is its SQL file ([`SqlFile`], sections `ddl`, `ctes`,
//! `write`, `read`, and optionally `notices` and `snapshot`), its name, the types it
//! subscribes to and the fields it reads; everything else has a default, and the tables are
//! read off the DDL ([`crate::projection::tables_in`]):
//!
//! ```
//! use projector_engine::{DedupMode, Field, Registry, SqlFile, View};
//!
//! const SQL: SqlFile = SqlFile::new("marks.sql", "
//! -- name: ddl
//! CREATE TABLE IF NOT EXISTS marks_v{v} (account_id bigint PRIMARY KEY, last numeric);
//! -- name: write
//! INSERT INTO marks_v{v} AS m SELECT account_id, price FROM ev
//! ON CONFLICT (account_id) DO UPDATE SET last = EXCLUDED.last RETURNING 1;
//! -- name: read
//! SELECT account_id, last FROM marks_v{v};
//! ");
//!
//! struct Marks;
//!
//! impl View for Marks {
//!     fn name(&self) -> &str { "marks" }
//!     fn subscribes(&self) -> &[&str] { &["mark_set"] }
//!     fn fields(&self) -> Vec<Field> { vec![Field::Decimal("price")] }
//!     fn sql(&self) -> SqlFile { SQL }
//! }
//!
//! let registry = Registry::new().view(1, Marks)?.view(2, Marks)?;
//! let consumers: Vec<String> = registry.all().iter().map(|v| v.consumer()).collect();
//! assert_eq!(consumers, ["marks_v1", "marks_v2"]);
//! assert_eq!(registry.all()[0].tables(), ["marks_v{v}"]);
//! assert_eq!(registry.all()[0].dedup(), DedupMode::Inbox);
//! # Ok::<(), projector_engine::ViewError>(())
//! ```

use std::sync::Arc;

use crate::event::{DecodeError, Event};
use crate::projection::{
    ApplySql, DedupMode, Field, Projection, Registry, Rejected, SqlFile, UnknownVersion, ViewError,
};
use crate::upcast::Upcaster;

/// A read model written in Rust, at no version in particular: the registry pairs it with the
/// versions that run ([`Registry::view`]), and the engine sees each as a [`Projection`]
/// ([`Versioned`]). The methods mean what [`Projection`]'s of the same name mean.
///
/// Required: [`name`](View::name), [`subscribes`](View::subscribes) and
/// [`sql`](View::sql). The statements come from the SQL file's sections by default: `ddl`,
/// `ctes` (optional: none when absent), `write`, `read`, `notices` and `snapshot` (both
/// optional); a view whose SQL is built otherwise overrides the method instead.
pub trait View: Send + Sync + 'static {
    /// The view's name: lower case letters, digits and `_`, starting with a letter.
    fn name(&self) -> &str;

    /// Event types this view applies ([`Projection::subscribes`]).
    fn subscribes(&self) -> &[&str];

    /// The view's SQL file, whose sections the statement methods below read by default.
    fn sql(&self) -> SqlFile;

    /// How duplicates are dropped; the inbox by default, which every view can use
    /// ([`Projection::dedup`]).
    fn dedup(&self) -> DedupMode {
        DedupMode::Inbox
    }

    /// See [`Projection::order_independent`]; `false` by default.
    fn order_independent(&self) -> bool {
        false
    }

    /// See [`Projection::many_per_account`]; `false` by default.
    fn many_per_account(&self) -> bool {
        false
    }

    /// The fields of `data` the view reads ([`Projection::fields`]); the whole object as
    /// `jsonb` by default.
    fn fields(&self) -> Vec<Field> {
        vec![Field::Data]
    }

    /// The section `ddl`.
    fn ddl(&self) -> String {
        self.sql().section("ddl").to_owned()
    }

    /// The tables the DDL creates ([`Projection::tables`]).
    fn tables(&self) -> Vec<String> {
        crate::projection::tables_in(&self.ddl())
    }

    /// The sections `ctes` (empty when absent) and `write`.
    fn apply_sql(&self) -> ApplySql {
        let sql = self.sql();
        ApplySql {
            ctes: sql.get("ctes").unwrap_or_default().to_owned(),
            write: sql.section("write").to_owned(),
        }
    }

    /// The section `read`.
    fn read_sql(&self) -> String {
        self.sql().section("read").to_owned()
    }

    /// The section `notices`, when there is one ([`Projection::notices_sql`]).
    fn notices_sql(&self) -> Option<String> {
        self.sql().get("notices").map(str::to_owned)
    }

    /// The section `snapshot`, when there is one ([`Projection::snapshot_sql`]).
    fn snapshot_sql(&self) -> Option<String> {
        self.sql().get("snapshot").map(str::to_owned)
    }

    /// See [`Projection::check_data`].
    fn check_data(&self, _event: &Event) -> Result<(), DecodeError> {
        Ok(())
    }

    /// See [`Projection::validate`].
    fn validate(&self, _event: &Event) -> Result<(), Rejected> {
        Ok(())
    }

    /// See [`Projection::upcasters`].
    fn upcasters(&self) -> Vec<Upcaster> {
        Vec::new()
    }

    /// See [`Projection::unknown_version`].
    fn unknown_version(&self) -> UnknownVersion {
        UnknownVersion::Park
    }

    /// Fingerprints of earlier code for `version` whose results this code keeps
    /// ([`Projection::replaces`]).
    fn replaces(&self, _version: i32) -> Vec<String> {
        Vec::new()
    }
}

/// A [`View`] at one version: what [`Registry::view`] registers. It builds the same code at
/// any other version ([`Projection::at_version`]), so `projector rebuild` can build the next.
pub struct Versioned<V: ?Sized> {
    view: Arc<V>,
    version: i32,
}

impl<V: View> Versioned<V> {
    /// `view` at `version`.
    pub fn new(version: i32, view: V) -> Self {
        Self {
            view: Arc::new(view),
            version,
        }
    }
}

impl<V: ?Sized> Versioned<V> {
    /// The same code at another version.
    pub fn at(&self, version: i32) -> Self {
        Self {
            view: Arc::clone(&self.view),
            version,
        }
    }

    /// The view's code.
    pub fn view(&self) -> &V {
        &self.view
    }
}

impl<V: ?Sized> Clone for Versioned<V> {
    fn clone(&self) -> Self {
        self.at(self.version)
    }
}

impl<V: ?Sized> std::fmt::Debug for Versioned<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Versioned")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl<V: View + ?Sized> Projection for Versioned<V> {
    fn name(&self) -> &str {
        self.view.name()
    }
    fn version(&self) -> i32 {
        self.version
    }
    fn subscribes(&self) -> &[&str] {
        self.view.subscribes()
    }
    fn dedup(&self) -> DedupMode {
        self.view.dedup()
    }
    fn order_independent(&self) -> bool {
        self.view.order_independent()
    }
    fn many_per_account(&self) -> bool {
        self.view.many_per_account()
    }
    fn fields(&self) -> Vec<Field> {
        self.view.fields()
    }
    fn ddl(&self) -> String {
        self.view.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.view.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        self.view.apply_sql()
    }
    fn read_sql(&self) -> String {
        self.view.read_sql()
    }
    fn notices_sql(&self) -> Option<String> {
        self.view.notices_sql()
    }
    fn snapshot_sql(&self) -> Option<String> {
        self.view.snapshot_sql()
    }
    fn check_data(&self, event: &Event) -> Result<(), DecodeError> {
        self.view.check_data(event)
    }
    fn validate(&self, event: &Event) -> Result<(), Rejected> {
        self.view.validate(event)
    }
    fn upcasters(&self) -> Vec<Upcaster> {
        self.view.upcasters()
    }
    fn unknown_version(&self) -> UnknownVersion {
        self.view.unknown_version()
    }
    fn at_version(&self, version: i32) -> Option<Arc<dyn Projection>> {
        Some(Arc::new(self.at(version)))
    }
    fn replaces(&self) -> Vec<String> {
        self.view.replaces(self.version)
    }
}

impl Registry {
    /// Registers `view` at `version`: `Registry::new().view(1, CashBalance)?`. The same
    /// view at two versions is two lines; refuses what [`Registry::register`] refuses.
    pub fn view(self, version: i32, view: impl View) -> Result<Self, ViewError> {
        self.register(Versioned::new(version, view))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SQL: SqlFile = SqlFile::new(
        "cash.sql",
        "-- name: ddl
CREATE TABLE IF NOT EXISTS cash_v{v} (account_id bigint PRIMARY KEY, balance numeric);
-- name: ctes
moves AS (SELECT account_id, sum(amount) AS amount FROM ev GROUP BY account_id)
-- name: write
INSERT INTO cash_v{v} SELECT * FROM moves RETURNING 1;
-- name: read
SELECT * FROM cash_v{v};
",
    );

    struct Cash;

    impl View for Cash {
        fn name(&self) -> &str {
            "cash"
        }
        fn subscribes(&self) -> &[&str] {
            &["cash_adjusted"]
        }
        fn sql(&self) -> SqlFile {
            SQL
        }
        fn order_independent(&self) -> bool {
            true
        }
        fn fields(&self) -> Vec<Field> {
            vec![Field::Decimal("amount")]
        }
        fn replaces(&self, version: i32) -> Vec<String> {
            vec![format!("earlier-{version}")]
        }
    }

    #[test]
    fn the_registry_pairs_a_view_with_its_versions() {
        let registry = Registry::new()
            .view(1, Cash)
            .and_then(|r| r.view(3, Cash))
            .expect("registers");
        let v3 = registry.code_for("cash", 3).expect("registered");
        assert_eq!(v3.consumer(), "cash_v3");
        assert_eq!(v3.replaces(), ["earlier-3"]);
        assert_eq!(v3.tables(), ["cash_v{v}"]);
        assert!(v3.apply_sql().ctes.starts_with("moves AS"));
        assert_eq!(v3.notices_sql(), None);
        assert_eq!(v3.snapshot_sql(), None);
        let v7 = registry.code_for("cash", 7).expect("built at any version");
        assert_eq!(v7.consumer(), "cash_v7");
        assert_eq!(
            crate::fingerprint::of(&*v7),
            crate::fingerprint::of(&Versioned::new(7, Cash)),
            "the same code at the version"
        );
        assert!(matches!(
            Registry::new().view(1, Cash).and_then(|r| r.view(1, Cash)),
            Err(ViewError::Duplicate(_))
        ));
        assert!(matches!(
            Registry::new().view(0, Cash),
            Err(ViewError::BadVersion { .. })
        ));
    }

    /// A view whose DDL names a table without `{v}`: every version [`Versioned`] builds
    /// owns that one table, so a rebuild into v2 writes into the rows v1 serves, and
    /// `retire --drop` of v1 drops the table v2 serves (`DROP TABLE ... CASCADE`). Refused
    /// when registered, as a SQL view's loader refuses it.
    #[test]
    fn a_view_whose_table_every_version_would_share_is_refused() {
        const SHARED: SqlFile = SqlFile::new(
            "shared.sql",
            "-- name: ddl
CREATE TABLE IF NOT EXISTS cash_v{v} (account_id bigint PRIMARY KEY, balance numeric);
CREATE TABLE IF NOT EXISTS cash_rates (currency text PRIMARY KEY);
-- name: ctes
moves AS (SELECT account_id, sum(amount) AS amount FROM ev GROUP BY account_id)
-- name: write
INSERT INTO cash_v{v} SELECT * FROM moves RETURNING 1;
-- name: read
SELECT * FROM cash_v{v};
",
        );
        struct Shared;
        impl View for Shared {
            fn name(&self) -> &str {
                "cash"
            }
            fn subscribes(&self) -> &[&str] {
                &["cash_adjusted"]
            }
            fn sql(&self) -> SqlFile {
                SHARED
            }
        }
        let v1 = Versioned::new(1, Shared);
        let v2 = v1.at(2);
        let rendered = |p: &dyn Projection| -> Vec<String> {
            p.tables()
                .iter()
                .map(|t| crate::projection::render(p, t))
                .collect()
        };
        assert!(
            rendered(&v1).iter().any(|t| rendered(&v2).contains(t)),
            "the two versions share a table"
        );
        let e = Registry::new()
            .view(1, Shared)
            .expect_err("a table every version shares");
        assert!(
            matches!(&e, ViewError::SharedTable { consumer, table } if consumer == "cash_v1" && table == "cash_rates"),
            "{e}"
        );
        assert!(e.to_string().contains("cash_rates_v{v}"), "{e}");
    }

    /// A view whose DDL names an index without `{v}`: the first version creates it, and
    /// `CREATE UNIQUE INDEX IF NOT EXISTS` does nothing for the next one (the name is taken,
    /// by the other version's table), so a rebuild into v2 has no unique index and its
    /// `ON CONFLICT` fails every batch. Refused when registered.
    #[test]
    fn a_view_whose_index_every_version_would_share_is_refused() {
        const INDEXED: SqlFile = SqlFile::new(
            "indexed.sql",
            "-- name: ddl
CREATE TABLE IF NOT EXISTS cash_v{v} (account_id bigint, day date, balance numeric);
CREATE UNIQUE INDEX IF NOT EXISTS cash_key ON cash_v{v} (account_id, day);
CREATE INDEX ON cash_v{v} (day);
-- name: ctes
moves AS (SELECT account_id, sum(amount) AS amount FROM ev GROUP BY account_id)
-- name: write
INSERT INTO cash_v{v} SELECT account_id, now()::date, amount FROM moves
ON CONFLICT (account_id, day) DO UPDATE SET balance = EXCLUDED.balance RETURNING 1;
-- name: read
SELECT * FROM cash_v{v};
",
        );
        struct Indexed;
        impl View for Indexed {
            fn name(&self) -> &str {
                "cash"
            }
            fn subscribes(&self) -> &[&str] {
                &["cash_adjusted"]
            }
            fn sql(&self) -> SqlFile {
                INDEXED
            }
        }
        let e = Registry::new()
            .view(1, Indexed)
            .expect_err("an index every version shares");
        assert!(
            matches!(&e, ViewError::SharedIndex { consumer, index } if consumer == "cash_v1" && index == "cash_key"),
            "{e}"
        );
        assert_eq!(
            crate::projection::indexes_in(
                "CREATE UNIQUE INDEX IF NOT EXISTS a_v{v} ON t (a); create index concurrently b ON t (b);
                 CREATE INDEX ON t (c); CREATE INDEX IF NOT EXISTS ON t (d); -- CREATE INDEX x ON t (e)"
            ),
            ["a_v{v}", "b"]
        );
    }

    /// Two views whose DDL creates the same table: both write into it, and `retire --drop`
    /// of one drops the table the other serves. Refused when the second registers.
    #[test]
    fn a_table_another_view_owns_is_refused() {
        struct Other;
        impl View for Other {
            fn name(&self) -> &str {
                "cash_copy"
            }
            fn subscribes(&self) -> &[&str] {
                &["cash_adjusted"]
            }
            fn sql(&self) -> SqlFile {
                SQL
            }
        }
        let e = Registry::new()
            .view(1, Cash)
            .and_then(|r| r.view(1, Other))
            .expect_err("cash_v{v} is cash's");
        assert!(
            matches!(&e, ViewError::TableOfAnotherView { consumer, table, owner }
                if consumer == "cash_copy_v1" && table == "cash_v{v}" && owner == "cash"),
            "{e}"
        );
        // The same view at another version owns the same names: its own tables.
        assert!(Registry::new()
            .view(1, Cash)
            .and_then(|r| r.view(2, Cash))
            .is_ok());
    }
}
