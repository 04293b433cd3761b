//! Connection pools.
//!
//! Every wait is bounded, so that a hung server or network cannot hold a rebalance (which
//! waits for in-flight batches) or a shutdown for ever: engine sessions carry a statement
//! timeout and an idle-in-transaction timeout, TCP keepalives and a TCP user timeout notice a
//! peer that went silent, and the pool bounds its waits for a connection. [`Settings`] holds
//! the defaults (documented in `docs/operations.md`); the URL's own `options`,
//! `keepalives_*` and `connect_timeout` take precedence.
//!
//! TLS follows the URL's `sslmode`, with libpq's meaning: `disable` never encrypts; `prefer`
//! (the default) and `require` encrypt without verifying the server's certificate;
//! `verify-ca` verifies the certificate chain and `verify-full` also the host name, against
//! `sslrootcert` when given, else the system's roots.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
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

/// Bounds on every wait of an engine session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Connections in the pool.
    pub max_size: usize,
    /// `statement_timeout`: the longest one statement may run, lock waits included. A batch's
    /// statements take milliseconds; a statement held up this long is stuck behind a lock or
    /// a frozen server, and failing it lets the batch be retried (or the partition handed on).
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: a process frozen inside a batch (SIGSTOP, a VM
    /// pause) holds its partition's offset row lock; the server ends such a transaction after
    /// this long, so the next owner's wait is bounded. No batch of ours idles that long
    /// between statements.
    pub idle_in_transaction_timeout: Duration,
    /// How long to wait for a connection to open, and for a free one from the pool.
    pub connect_timeout: Duration,
    /// TCP keepalive idle time; a dead peer is noticed about this long plus three probes
    /// ten seconds apart after it went silent.
    pub keepalive_idle: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_size: 16,
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            keepalive_idle: Duration::from_secs(30),
        }
    }
}

impl Settings {
    /// The longest one batch's attempt can take before the engine gives its connection up:
    /// past this, a statement's answer is not coming (the server or the network hung), and
    /// the caller drops the connection instead of waiting on it.
    pub fn attempt_timeout(&self) -> Duration {
        self.statement_timeout * 2 + self.connect_timeout
    }
}

/// The session options the engine adds to the URL's own `options`, for every setting the
/// URL does not set itself.
fn session_options(url_options: Option<&str>, settings: &Settings) -> String {
    let given = url_options.unwrap_or_default();
    let mut out = given.to_owned();
    for (name, value) in [
        ("statement_timeout", settings.statement_timeout),
        (
            "idle_in_transaction_session_timeout",
            settings.idle_in_transaction_timeout,
        ),
    ] {
        if !given.contains(name) {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("-c {name}={}", value.as_millis()));
        }
    }
    out
}

/// A pool of at most `max_size` connections to `url`, with the default [`Settings`].
pub fn pool(url: &str, max_size: usize) -> Result<Pool, DbError> {
    pool_with(
        url,
        &Settings {
            max_size,
            ..Settings::default()
        },
    )
}

/// A pool of connections to `url`. Connections are verified on recycling: one that was
/// lost, or left in a failed or open transaction, is never handed out again.
pub fn pool_with(url: &str, settings: &Settings) -> Result<Pool, DbError> {
    let (url, verify, root) = split_tls_options(url);
    let mut config =
        tokio_postgres::Config::from_str(&url).map_err(|e| DbError::BadUrl(e.to_string()))?;
    if config.get_application_name().is_none() {
        config.application_name("projector");
    }
    let options = session_options(config.get_options(), settings);
    config.options(&options);
    if config.get_connect_timeout().is_none() {
        // An unreachable server must fail with a message, not hang the process.
        config.connect_timeout(settings.connect_timeout);
    }
    let defaults = tokio_postgres::Config::new();
    if config.get_keepalives_idle() == defaults.get_keepalives_idle() {
        config.keepalives(true);
        config.keepalives_idle(settings.keepalive_idle);
        config.keepalives_interval(Duration::from_secs(10));
        config.keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        // Data sent to a peer that no longer answers fails after this, instead of the
        // kernel's default of about fifteen minutes of retransmissions.
        config.tcp_user_timeout(settings.keepalive_idle + Duration::from_secs(30));
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
        .max_size(settings.max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(settings.connect_timeout))
        .create_timeout(Some(settings.connect_timeout))
        .recycle_timeout(Some(settings.connect_timeout))
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

    #[test]
    fn session_options_add_only_what_the_url_leaves_out() {
        let s = Settings::default();
        assert_eq!(
            session_options(None, &s),
            "-c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000"
        );
        assert_eq!(
            session_options(Some("-c statement_timeout=5s"), &s),
            "-c statement_timeout=5s -c idle_in_transaction_session_timeout=60000"
        );
    }
}
