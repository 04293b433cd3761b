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
    /// More session settings (`name`, `value`), e.g. a rebuild's `synchronous_commit = off`.
    pub session: Vec<(String, String)>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_size: 16,
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            keepalive_idle: Duration::from_secs(30),
            session: Vec::new(),
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
    let timeouts = [
        ("statement_timeout", settings.statement_timeout),
        (
            "idle_in_transaction_session_timeout",
            settings.idle_in_transaction_timeout,
        ),
    ]
    .map(|(name, value)| (name.to_owned(), value.as_millis().to_string()));
    for (name, value) in timeouts.iter().chain(&settings.session) {
        if !given.contains(name.as_str()) {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("-c {name}={value}"));
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

/// The URL of database `dbname` on the server of `url`, every other option kept (user,
/// password, hosts, port, `sslmode`, `sslrootcert`, timeouts), so that a connection to
/// another database (the maintenance database `postgres`, a scratch or test database) is
/// made as the original would be: same server, same credentials, same TLS.
///
/// Takes both forms libpq does: a URL (`postgres://` or `postgresql://`), whose path is
/// replaced (and any `dbname` in its query string dropped), and a `key=value` connection
/// string, whose `dbname` is replaced or appended. The result is checked as [`pool`] would
/// parse it; like every error here, the message never repeats the URL.
pub fn url_for_database(url: &str, dbname: &str) -> Result<String, DbError> {
    if dbname.is_empty() {
        return Err(DbError::BadUrl("the database name is empty".to_owned()));
    }
    let scheme = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|s| url.starts_with(s));
    let derived = match scheme {
        Some(scheme) => {
            let rest = &url[scheme.len()..];
            let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
            // The authority (user:password@host:port) ends at the first '/': a slash in a
            // socket directory or a password is percent-encoded in a URL.
            let authority = before_query.split('/').next().unwrap_or_default();
            let kept: Vec<&str> = query
                .split('&')
                .filter(|pair| !pair.is_empty() && !pair.starts_with("dbname="))
                .collect();
            let mut out = format!("{scheme}{authority}/{}", percent_encode(dbname));
            if !kept.is_empty() {
                out.push('?');
                out.push_str(&kept.join("&"));
            }
            out
        }
        None => {
            let mut pairs: Vec<String> = key_value_pairs(url)?
                .into_iter()
                .filter(|(key, _)| *key != "dbname")
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            pairs.push(format!("dbname={}", quote_value(dbname)));
            pairs.join(" ")
        }
    };
    let (checked, _, _) = split_tls_options(&derived);
    tokio_postgres::Config::from_str(&checked).map_err(|e| DbError::BadUrl(e.to_string()))?;
    Ok(derived)
}

/// `%XX` for every byte of `text` outside RFC 3986's unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The pairs of a libpq `key=value` connection string, each value as written (quotes and
/// escapes kept), so that they can be written back unchanged.
fn key_value_pairs(text: &str) -> Result<Vec<(&str, &str)>, DbError> {
    let bad = |why: &str| DbError::BadUrl(format!("the connection string is not valid: {why}"));
    let mut pairs = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            return Err(bad("a key without `=`"));
        };
        let key = key.trim_end();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(bad("a key without `=`"));
        }
        let after = after.trim_start();
        let end = if after.starts_with('\'') {
            // A quoted value ends at the first quote that is not escaped by a backslash.
            let mut escaped = false;
            let mut close = None;
            for (i, c) in after.char_indices().skip(1) {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '\'' => {
                        close = Some(i + 1);
                        break;
                    }
                    _ => {}
                }
            }
            close.ok_or_else(|| bad("an unterminated quoted value"))?
        } else {
            after.find(char::is_whitespace).unwrap_or(after.len())
        };
        pairs.push((key, &after[..end]));
        rest = after[end..].trim_start();
    }
    Ok(pairs)
}

/// A value for a `key=value` connection string, quoted when libpq needs it to be.
fn quote_value(value: &str) -> String {
    if !value.is_empty() && !value.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\') {
        return value.to_owned();
    }
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod url_for_database_tests {
    use super::url_for_database;

    #[test]
    fn a_url_keeps_everything_but_its_database() {
        let cases = [
            ("postgres://u@h/db", "postgres://u@h/x"),
            ("postgres://u@h", "postgres://u@h/x"),
            ("postgres://u@h/", "postgres://u@h/x"),
            (
                "postgresql://u:p%2Fw@h:5433/db",
                "postgresql://u:p%2Fw@h:5433/x",
            ),
            (
                "postgres://u@h:5432/projector?sslmode=disable",
                "postgres://u@h:5432/x?sslmode=disable",
            ),
            (
                "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3",
                "postgres://u@h/x?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3",
            ),
            (
                "postgres://u@h?sslmode=require",
                "postgres://u@h/x?sslmode=require",
            ),
            (
                "postgres://u@h/db?dbname=other&sslmode=require",
                "postgres://u@h/x?sslmode=require",
            ),
            (
                "postgresql:///db?host=/run/pg",
                "postgresql:///x?host=/run/pg",
            ),
        ];
        for (url, expected) in cases {
            assert_eq!(
                url_for_database(url, "x").ok().as_deref(),
                Some(expected),
                "{url}"
            );
        }
        assert_eq!(
            url_for_database("postgres://u@h/db", "a b").ok().as_deref(),
            Some("postgres://u@h/a%20b")
        );
    }

    #[test]
    fn a_connection_string_gets_its_dbname_replaced_or_added() {
        let cases = [
            ("host=h user=u", "host=h user=u dbname=x"),
            ("host=h dbname=db user=u", "host=h user=u dbname=x"),
            (
                "host=h  dbname = 'my db'  sslmode=require password='a \\' b'",
                "host=h sslmode=require password='a \\' b' dbname=x",
            ),
        ];
        for (conn, expected) in cases {
            assert_eq!(
                url_for_database(conn, "x").ok().as_deref(),
                Some(expected),
                "{conn}"
            );
        }
        assert_eq!(
            url_for_database("host=h", "it's").ok().as_deref(),
            Some("host=h dbname='it\\'s'")
        );
    }

    #[test]
    fn nonsense_is_refused_without_repeating_the_url() {
        for (url, name) in [
            ("postgres://u@h/db", ""),
            ("host=h password='s3cr3t", "x"),
            ("host", "x"),
            ("postgres://u@h/db?sslmode=s3cr3t", "x"),
        ] {
            let e = url_for_database(url, name).expect_err(url);
            assert!(!e.to_string().contains("s3cr3t"), "{e}");
        }
    }
}
