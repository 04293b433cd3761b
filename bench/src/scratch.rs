//! The scratch database a run creates on the server, and drops at the end unless `--keep-db`.

use deadpool_postgres::Pool;
use projector_engine::db::url_for_database;

use crate::error::{BenchError, Doing as _};

/// A database of its own on the server, dropped at the end unless `--keep-db`.
pub(crate) struct Scratch {
    admin: Pool,
    pub(crate) name: String,
    pub(crate) pool: Pool,
}

impl Scratch {
    pub(crate) async fn create(url: &str) -> Result<Self, BenchError> {
        // The URL's own database may not exist yet (the default names `projector`); the
        // maintenance database `postgres` always does.
        let mut admin = projector_engine::db::pool(url, 1)?;
        if admin.get().await.is_err() {
            admin = projector_engine::db::pool(&url_for_database(url, "postgres")?, 1)?;
        }
        let client = admin
            .get()
            .await
            .doing("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
        let name = format!("projector_bench_{}", std::process::id());
        // Two statements: PostgreSQL runs a multi-statement string as one transaction, which
        // CREATE DATABASE refuses.
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            client
                .batch_execute(&sql)
                .await
                .doing_with(|| format!("cannot create the scratch database {name}"))?;
        }
        drop(client);
        let pool = projector_engine::db::pool(&url_for_database(url, &name)?, 16)?;
        Ok(Self { admin, name, pool })
    }

    pub(crate) async fn drop_database(&self) -> Result<(), BenchError> {
        self.pool.close();
        let client = self.admin.get().await?;
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await?;
        Ok(())
    }
}
