//! Connection pools.

use std::str::FromStr;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The URL does not parse. The message never repeats the URL: it may hold a password.
    #[error("the database URL is not valid: {0}")]
    BadUrl(String),
    /// The pool could not be built.
    #[error("while building the connection pool: {0}")]
    Pool(String),
}

/// A pool over `url`. Connections are verified on recycling: a connection that was left in
/// a failed or open transaction, or lost, is never handed out again.
pub fn pool(url: &str, max_size: usize) -> Result<Pool, DbError> {
    let mut config =
        tokio_postgres::Config::from_str(url).map_err(|e| DbError::BadUrl(e.to_string()))?;
    if config.get_application_name().is_none() {
        config.application_name("projector");
    }
    if config.get_connect_timeout().is_none() {
        // An unreachable server must fail with a message, not hang the process.
        config.connect_timeout(std::time::Duration::from_secs(10));
    }
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Verified,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .build()
        .map_err(|e| DbError::Pool(e.to_string()))
}
