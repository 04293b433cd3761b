use std::sync::atomic::{AtomicU32, Ordering};

use deadpool_postgres::{Client, Pool};

use crate::projection::Registry;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The server tests run against: `PROJECTOR_TEST_DATABASE_URL`, else the local server on
/// 127.0.0.1 without TLS.
///
/// `sslmode=disable` because the default, libpq's `prefer`, encrypts on loopback wherever the
/// server has TLS on (Debian's has, with its snakeoil certificate): every pool then parsed the
/// system's CA bundle and every connection paid a handshake on both ends, a third of the
/// suite's CPU time, spent on a wire that never leaves the machine. The databases a test
/// makes inherit it, and so do the `projector` processes it starts with their URLs. TLS itself
/// is tested where it is the subject (`cli::tls_follows_sslmode`).
pub fn admin_url() -> String {
    std::env::var("PROJECTOR_TEST_DATABASE_URL").unwrap_or_else(|_| {
        "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable".to_owned()
    })
}

/// Drops the test databases ([`TestDb`]) this process made on the server of `url`, a
/// failing test's kept ones included: for a command that runs a suite and keeps nothing
/// (`projector views check`). Best effort: a database that cannot be dropped is left.
pub async fn drop_databases_of_this_process(url: &str) {
    let Ok(pool) = crate::db::pool(url, 1) else {
        return;
    };
    let Ok(client) = pool.get().await else {
        return;
    };
    let prefix = format!("projector_test_{}_%", std::process::id());
    // The server's catalog, no engine table: this process's leftover test databases.
    let Ok(rows) = client
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE $1",
            &[&prefix],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let Ok(name) = row.try_get::<_, String>(0) else {
            continue;
        };
        // Composed per database: its name.
        let _ = client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await;
    }
}

/// A fresh database with the engine schema and the given views installed. Dropped when the
/// test passes; kept (and named on stderr) when it fails, for debugging.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    url: String,
    pool: Pool,
}

impl TestDb {
    /// Creates the database and migrates it.
    pub async fn new(registry: &Registry) -> Self {
        let db = Self::empty().await;
        let mut client = db.client().await;
        crate::schema::migrate(&mut client, registry)
            .await
            .expect("migrate");
        db
    }

    /// Creates the database with the engine's migrations up to `version` only and no view:
    /// a database as an older release left it, for tests of what a later migration does to
    /// it.
    pub async fn at_engine_migration(version: u32) -> Self {
        let db = Self::empty().await;
        let mut client = db.client().await;
        crate::schema::migrate_engine_to(&mut client, version)
            .await
            .expect("migrate up to a version");
        db
    }

    async fn empty() -> Self {
        let admin = admin_url();
        let name = format!(
            "projector_test_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            chrono::Utc::now().timestamp_micros() % 1_000_000
        );
        let admin_pool = crate::db::pool(&admin, 1).expect("admin url");
        let client = admin_pool
            .get()
            .await
            .expect("connect to the test server (is PostgreSQL running?)");
        // Composed per database: its name.
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        let url = crate::db::url_for_database(&admin, &name).expect("a test database's URL");
        let pool = crate::db::pool(&url, 8).expect("test url");
        Self { name, url, pool }
    }

    /// A pooled connection.
    pub async fn client(&self) -> Client {
        self.pool
            .get()
            .await
            .expect("connection from the test pool")
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        self.pool.close();
        if std::thread::panicking() {
            eprintln!("test failed: database {} kept for debugging", self.name);
            return;
        }
        let name = self.name.clone();
        // Drop runs inside the test's runtime; a fresh thread with its own runtime may block.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let pool = crate::db::pool(&admin_url(), 1).ok()?;
                let client = pool.get().await.ok()?;
                // Composed per database: its name.
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}
