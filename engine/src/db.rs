//! Connection pools.
//!
//! TLS follows the URL's `sslmode`, with libpq's meaning: `disable` never encrypts; `prefer`
//! (the default) and `require` encrypt without verifying the server's certificate;
//! `verify-ca` verifies the certificate chain and `verify-full` also the host name, against
//! `sslrootcert` when given, else the system's roots.

use std::str::FromStr;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::config::SslMode;
use tokio_postgres::NoTls;

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The URL does not parse. The message never repeats the URL: it may hold a password.
    #[error("the database URL is not valid: {0}")]
    BadUrl(String),
    /// TLS could not be set up.
    #[error("cannot set up TLS for PostgreSQL: {0}")]
    Tls(String),
    /// The pool could not be built.
    #[error("while building the connection pool: {0}")]
    Pool(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    None,
    Chain,
    Full,
}

/// Splits the options tokio-postgres does not know (`sslmode=verify-*`, `sslrootcert`) off
/// the URL.
fn split_tls_options(url: &str) -> (String, Verify, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), Verify::None, None);
    };
    let mut verify = Verify::None;
    let mut root = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", "verify-full")) => {
                verify = Verify::Full;
                kept.push("sslmode=require".to_owned());
            }
            Some(("sslmode", "verify-ca")) => {
                verify = Verify::Chain;
                kept.push("sslmode=require".to_owned());
            }
            Some(("sslrootcert", path)) => root = Some(path.to_owned()),
            _ => kept.push(pair.to_owned()),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, verify, root)
}

/// A pool of at most `max_size` connections to `url`. Connections are verified on
/// recycling: one that was lost, or left in a failed or open transaction, is never handed
/// out again.
pub fn pool(url: &str, max_size: usize) -> Result<Pool, DbError> {
    let (url, verify, root) = split_tls_options(url);
    let mut config =
        tokio_postgres::Config::from_str(&url).map_err(|e| DbError::BadUrl(e.to_string()))?;
    if config.get_application_name().is_none() {
        config.application_name("projector");
    }
    if config.get_options().is_none() {
        // A process frozen inside a batch (SIGSTOP, a VM pause) holds its partition's offset
        // row lock; the next owner waits on it. The server ends such a transaction after a
        // minute, so the wait is bounded; no batch of ours idles that long between statements.
        config.options("-c idle_in_transaction_session_timeout=60000");
    }
    if config.get_connect_timeout().is_none() {
        // An unreachable server must fail with a message, not hang the process.
        config.connect_timeout(std::time::Duration::from_secs(10));
    }
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Verified,
    };
    let manager = if config.get_ssl_mode() == SslMode::Disable {
        Manager::from_config(config, NoTls, manager_config)
    } else {
        let mut tls = native_tls::TlsConnector::builder();
        tls.danger_accept_invalid_certs(verify == Verify::None)
            .danger_accept_invalid_hostnames(verify != Verify::Full);
        if let Some(path) = root {
            let pem = std::fs::read(&path)
                .map_err(|e| DbError::Tls(format!("cannot read sslrootcert {path}: {e}")))?;
            let cert = native_tls::Certificate::from_pem(&pem)
                .map_err(|e| DbError::Tls(format!("sslrootcert {path}: {e}")))?;
            tls.add_root_certificate(cert);
        }
        let connector = tls.build().map_err(|e| DbError::Tls(e.to_string()))?;
        Manager::from_config(
            config,
            postgres_native_tls::MakeTlsConnector::new(connector),
            manager_config,
        )
    };
    Pool::builder(manager)
        .max_size(max_size)
        .build()
        .map_err(|e| DbError::Pool(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_only_options_are_split_off() {
        let (url, verify, root) = split_tls_options(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3",
        );
        assert_eq!(url, "postgres://u@h/db?sslmode=require&connect_timeout=3");
        assert_eq!(verify, Verify::Full);
        assert_eq!(root.as_deref(), Some("/ca.pem"));
        let (url, verify, _) = split_tls_options("postgres://u@h/db");
        assert_eq!((url.as_str(), verify), ("postgres://u@h/db", Verify::None));
    }
}
