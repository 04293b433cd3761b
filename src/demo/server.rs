//! Where the demo's PostgreSQL comes from: `DATABASE_URL` (or `--database-url`), else a
//! server on 127.0.0.1:5432 that lets user `postgres` in without a password, else a
//! throwaway cluster made with the PostgreSQL binaries on the machine. Never a change to a
//! server's authentication.

use anyhow::Context as _;
use projector_devkit::demo;
use projector_devkit::pgcluster::PgCluster;

/// The server on the default port, as the tests and `.ci/setup` expect it.
const LOCAL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Marks a database as the demo's: only such a database is dropped by the next run.
const MARKER: &str = "made by projector demo; dropped and made again by the next run";

/// The server the demo uses.
pub struct Server {
    /// A URL of the server with which databases can be created.
    pub admin_url: String,
    /// One line for the reader: which server this is.
    pub described: String,
    /// The throwaway cluster, when there is one: removed when dropped.
    pub cluster: Option<PgCluster>,
}

impl Server {
    /// Picks the server, making a throwaway cluster when there is none to use.
    pub async fn choose(database_url: Option<String>) -> anyhow::Result<Self> {
        if let Some(url) = database_url {
            connect(&url)
                .await
                .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
            return Ok(Self {
                admin_url: url,
                described: "the server of DATABASE_URL".to_owned(),
                cluster: None,
            });
        }
        let local = match connect(LOCAL).await {
            Ok(()) => {
                return Ok(Self {
                    admin_url: LOCAL.to_owned(),
                    described: "the server on 127.0.0.1:5432 (user postgres)".to_owned(),
                    cluster: None,
                })
            }
            Err(e) => e,
        };
        let Some(bin) = PgCluster::find_binaries() else {
            anyhow::bail!(
                "no PostgreSQL to use: install it (Debian/Ubuntu: `sudo apt-get install postgresql`, \
                 macOS: `brew install postgresql`) and run the demo again, or set DATABASE_URL"
            );
        };
        tracing::info!(reason = %local, "no server to use on 127.0.0.1:5432");
        let cluster = tokio::task::spawn_blocking(move || PgCluster::start(&bin))
            .await
            .context("the task starting PostgreSQL panicked")?
            .context("cannot make a throwaway PostgreSQL cluster")?;
        Ok(Self {
            admin_url: cluster.url("postgres"),
            described: format!(
                "a throwaway PostgreSQL {} cluster (Unix socket only, removed on exit)",
                cluster.version()
            ),
            cluster: Some(cluster),
        })
    }

    /// Makes the demo's database `name` afresh and returns its URL. A database of that name
    /// that an earlier demo made is dropped first; any other is refused.
    pub async fn fresh_database(&self, name: &str) -> anyhow::Result<String> {
        let pool = projector_engine::db::pool(&self.admin_url, 1)?;
        let client = pool.get().await.context("cannot connect to PostgreSQL")?;
        if let Some(comment) = demo::database_comment(&client, name).await? {
            if comment != MARKER {
                anyhow::bail!(
                    "database {name} exists and was not made by `projector demo`; pass --database with another name"
                );
            }
            let version = demo::server_version_num(&client).await?;
            // FORCE (PostgreSQL 13+) ends sessions an interrupted demo may have left behind.
            demo::drop_database(&client, name, version >= 130_000)
                .await
                .with_context(|| format!("cannot drop the last demo's database {name}"))?;
        }
        demo::create_database(&client, name, MARKER)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        Ok(projector_engine::db::url_for_database(
            &self.admin_url,
            name,
        )?)
    }
}

/// Opens one connection and closes it.
async fn connect(url: &str) -> anyhow::Result<()> {
    let pool = projector_engine::db::pool(url, 1)?;
    let client = pool.get().await?;
    demo::ping(&client).await?;
    Ok(())
}

/// A database name the demo accepts: plain lower-case SQL identifiers, so nothing needs
/// quoting beyond double quotes.
pub fn parse_database(s: &str) -> Result<String, String> {
    let ok = s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "expected a lower-case name of letters, digits and _ (such as projector_demo), got {s:?}"
        ))
    }
}
