//! `projector migrate`: the engine's own schema, then every registered view's tables, its
//! registry row and its stable read name. Running it twice changes nothing.

use deadpool_postgres::Client;

use crate::fingerprint::{self, Verdict};
use crate::projection::{render, Projection, Registry, SqlFile};
use crate::versions;

const SQL: SqlFile = SqlFile::new("engine/src/schema.sql", include_str!("schema.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// Whether the engine's migrations have run in this database (`projector views check`
/// prepares SQL views only where the engine's tables exist).
pub async fn has_schema(client: &Client) -> Result<bool, SchemaError> {
    client
        .query_one(statement("has_schema"), &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|source| SchemaError::Database {
            doing: "looking for the engine's schema",
            source,
        })
}

mod embedded {
    refinery::embed_migrations!("../migrations");
}

/// refinery's history table lives in the engine's namespace, next to what it describes.
const HISTORY_TABLE: &str = "projector.schema_history";

/// One advisory lock key for every migrating process: two `projector migrate` (or two
/// services starting at once) take turns instead of racing on `CREATE TABLE`.
const MIGRATE_LOCK: i64 = 0x7072_6f6a_6563_746f; // "projecto"

/// Why migration failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The engine's numbered migrations failed, or an applied one was edited.
    #[error("while applying the engine's migrations: {0}")]
    Migrations(#[from] refinery::Error),
    /// A view's DDL, registry row or read name failed.
    #[error("while installing view {consumer}: {source}")]
    View {
        /// The view version.
        consumer: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The database's encoding cannot hold every character an event may carry.
    #[error(
        "database {database} is encoded in {encoding}, which cannot hold every character an event \
         may carry (PostgreSQL would refuse one with 22P05 in every batch that carries it): \
         create a database with ENCODING 'UTF8' (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE \
         template0) and point --database-url at it"
    )]
    Encoding {
        /// The database.
        database: String,
        /// Its encoding, as PostgreSQL names it.
        encoding: String,
    },
    /// Any other database failure.
    #[error("while {doing}: {source}")]
    Database {
        /// What was being done.
        doing: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// What a migration run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrateReport {
    /// Engine migrations applied by this run, as `V<n>__<name>`.
    pub applied: Vec<String>,
    /// View versions registered by this run, with the state they were given.
    pub registered: Vec<(String, versions::VersionState)>,
    /// Stable read names created by this run.
    pub read_names: Vec<String>,
    /// View versions left alone because another code registered them, each with the
    /// one-line reason (both fingerprints).
    pub skipped: Vec<(String, String)>,
}

/// Refuses a database whose encoding is not UTF8.
///
/// Events are UTF-8, and their ids, text fields and `data`, the dead letters' errors and the
/// progress rows' event ids go into the database as text. Any other server encoding lacks
/// characters a producer may send (SQL_ASCII does not even check them): PostgreSQL refuses
/// such a character (22P05) in whatever statement carries it, the batch's whole
/// transaction fails, and it fails again on every retry, because decoding cannot know what
/// a given database could hold. Refused once, up front, instead: `migrate` refuses before it
/// creates anything, and `run --no-migrate` before it consumes.
pub async fn check_encoding(client: &Client) -> Result<(), SchemaError> {
    let row = client
        .query_one(statement("encoding"), &[])
        .await
        .map_err(|source| SchemaError::Database {
            doing: "reading the database's encoding",
            source,
        })?;
    let (database, encoding): (String, String) = (row.get(0), row.get(1));
    if encoding == "UTF8" {
        Ok(())
    } else {
        Err(SchemaError::Encoding { database, encoding })
    }
}

/// Applies the engine schema and installs every registered view, in a database encoded in
/// UTF8 ([`check_encoding`]).
pub async fn migrate(
    client: &mut Client,
    registry: &Registry,
) -> Result<MigrateReport, SchemaError> {
    check_encoding(client).await?;
    let db = |doing| move |source| SchemaError::Database { doing, source };
    client
        .execute(statement("lock"), &[&MIGRATE_LOCK])
        .await
        .map_err(db("taking the migration lock"))?;
    let result = migrate_locked(client, registry).await;
    let unlock = client
        .execute(statement("unlock"), &[&MIGRATE_LOCK])
        .await
        .map_err(db("releasing the migration lock"));
    let report = result?;
    unlock?;
    Ok(report)
}

/// Applies the engine's migrations up to `version` and nothing else (no view, no day of the
/// inbox): a database as an older release left it, for tests.
#[cfg(feature = "testkit")]
pub async fn migrate_engine_to(client: &mut Client, version: u32) -> Result<(), SchemaError> {
    client
        .batch_execute(statement("create_schema"))
        .await
        .map_err(|source| SchemaError::Database {
            doing: "creating schema projector",
            source,
        })?;
    let pg: &mut tokio_postgres::Client = client;
    let mut runner = embedded::migrations::runner().set_target(refinery::Target::Version(version));
    runner.set_migration_table_name(HISTORY_TABLE);
    runner.run_async(pg).await?;
    Ok(())
}

async fn migrate_locked(
    client: &mut Client,
    registry: &Registry,
) -> Result<MigrateReport, SchemaError> {
    client
        .batch_execute(statement("create_schema"))
        .await
        .map_err(|source| SchemaError::Database {
            doing: "creating schema projector",
            source,
        })?;
    let pg: &mut tokio_postgres::Client = client;
    let report = embedded::migrations::runner()
        .set_migration_table_name(HISTORY_TABLE)
        .run_async(pg)
        .await?;
    let mut out = MigrateReport {
        applied: report
            .applied_migrations()
            .iter()
            .map(|m| format!("V{}__{}", m.version(), m.name()))
            .collect(),
        ..MigrateReport::default()
    };
    // The inbox's days ahead, so that no `run` waits to make today's. Not fatal: every `run`
    // makes them too, and a batch makes the day it needs; a lock held by a prune's detach must
    // not keep a service from starting.
    if let Err(e) = crate::inbox::ensure_ahead(client, chrono::Utc::now()).await {
        tracing::warn!(error = %crate::apply::describe_db_error(&e), "could not make the inbox's days ahead; every projector run makes them, and `projector status` says when they fall behind");
    }
    for view in registry.all() {
        install_view(client, &**view, &mut out)
            .await
            .map_err(|source| SchemaError::View {
                consumer: view.consumer(),
                source,
            })?;
    }
    Ok(out)
}

/// Creates a view version's tables and registers it: `live` when the view has no version
/// yet, `building` otherwise (a rebuild fills it and cuts over), with the fingerprint of the
/// code that registered it. The stable read name is created for the live version when it
/// does not exist; cutover replaces it. A version registered by other code is left alone
/// (not even its DDL runs: it could add to tables another code owns) and reported. A version
/// registered before fingerprints existed gets this code's, which is registered for exactly
/// that version; the row is locked for it, so two binaries migrating at once cannot both.
async fn install_view(
    client: &mut Client,
    view: &dyn Projection,
    out: &mut MigrateReport,
) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let existing = versions::lock_recorded(&tx, view.name(), view.version()).await?;
    let ours = fingerprint::of(view);
    if let Some((dropped, recorded)) = &existing {
        if *dropped {
            // Retired and dropped by `projector retire --drop`: never recreated empty.
            return tx.commit().await;
        }
        match fingerprint::judge(view, recorded.as_deref()) {
            Ok(Verdict::Adopted) => {
                versions::adopt_fingerprint(&tx, view.name(), view.version(), &ours).await?;
            }
            Ok(_) => {}
            Err(e) => {
                out.skipped.push((view.consumer(), e.to_string()));
                return tx.commit().await;
            }
        }
    }
    tx.batch_execute(&render(view, &view.ddl())).await?;
    if let Some(state) = versions::register(&tx, view.name(), view.version(), &ours).await? {
        out.registered.push((view.consumer(), state));
    }
    let live = versions::live_version(&tx, view.name()).await?;
    let exists = tx
        .query_opt(statement("name_taken"), &[&view.name()])
        .await?
        .is_some();
    if live == Some(view.version()) && !exists {
        let body = render(view, &view.read_sql());
        // Composed per view: its name and read statement.
        tx.batch_execute(&format!("CREATE VIEW {} AS {}", view.name(), body))
            .await?;
        out.read_names.push(view.name().to_owned());
    }
    tx.commit().await
}
