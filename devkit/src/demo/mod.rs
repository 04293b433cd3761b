//! What `projector demo` runs in PostgreSQL besides the write side and the reconciliation:
//! its database made afresh on a server (marked with a comment, so that only a database an
//! earlier demo made is ever dropped), and what it reads of the engine's tables while the
//! story runs: each view version's offsets and counters, the dead letters and parked
//! accounts, and what a view shows of an account. The statements are in `demo.sql`, except
//! the three that name the database, which take no parameters.

use std::sync::LazyLock;

use projector_engine::projection::named_sql;
use projector_engine::versions::VersionState;
use tokio_postgres::{Client, Error};

const SQL: &str = include_str!("demo.sql");

/// A statement of `demo.sql`. The names are constants of this module, and a unit test reads
/// every one of them, so a missing name fails the build's tests, not a run.
fn named(name: &str) -> &'static str {
    named_sql(SQL, name).unwrap_or_else(|| panic!("demo.sql has no statement named {name:?}"))
}

macro_rules! statements {
    ($($konst:ident = $name:literal;)*) => {
        $(static $konst: LazyLock<&'static str> = LazyLock::new(|| named($name));)*
        #[cfg(test)]
        const ALL: &[&LazyLock<&'static str>] = &[$(&$konst),*];
    };
}

statements! {
    PING = "ping";
    DATABASE_COMMENT = "database_comment";
    SERVER_VERSION_NUM = "server_version_num";
    VIEW_OFFSETS = "view_offsets";
    DEAD_LETTERS = "dead_letters";
    PARKED_ACCOUNTS = "parked_accounts";
    APPLIED = "applied";
}

/// One round trip to the server, to know that it lets this client in.
pub async fn ping(client: &Client) -> Result<(), Error> {
    client.simple_query(*PING).await?;
    Ok(())
}

/// The comment on database `name` (`""` when it has none); `None` when there is no such
/// database.
pub async fn database_comment(client: &Client, name: &str) -> Result<Option<String>, Error> {
    Ok(client
        .query_opt(*DATABASE_COMMENT, &[&name])
        .await?
        .map(|row| row.get(0)))
}

/// The server's version as a number: 150004 for 15.4.
pub async fn server_version_num(client: &Client) -> Result<i32, Error> {
    Ok(client.query_one(*SERVER_VERSION_NUM, &[]).await?.get(0))
}

/// Drops database `name`; with `force` (PostgreSQL 13 and later), ending the sessions still
/// in it.
pub async fn drop_database(client: &Client, name: &str, force: bool) -> Result<(), Error> {
    let force = if force { " WITH (FORCE)" } else { "" };
    client
        .batch_execute(&format!("DROP DATABASE {}{force}", identifier(name)))
        .await
}

/// Creates database `name` with `comment` on it.
pub async fn create_database(client: &Client, name: &str, comment: &str) -> Result<(), Error> {
    let quoted = identifier(name);
    // Two statements: CREATE DATABASE refuses to run in the implicit transaction of a
    // multi-statement query.
    for sql in [
        format!("CREATE DATABASE {quoted}"),
        format!("COMMENT ON DATABASE {quoted} IS {}", literal(comment)),
    ] {
        client.batch_execute(&sql).await?;
    }
    Ok(())
}

/// `name` as a quoted SQL identifier.
fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as a SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A view version's offsets row of one partition: where it is and what it counted there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionOffsets {
    pub partition: i32,
    /// The next offset the version reads.
    pub next_offset: i64,
    pub applied: i64,
    pub ignored: i64,
    /// Duplicates dropped, and by what: the inbox, the per-account seq, the snapshot's
    /// watermark (rebuild), the version filter.
    pub duplicates: i64,
    pub dup_inbox: i64,
    pub dup_seq: i64,
    pub dup_watermark: i64,
    pub dup_version_filter: i64,
    pub dead_lettered: i64,
    /// Who committed it last (`host:pid`).
    pub committed_by: Option<String>,
}

/// A row of [`view_offsets`]: a view version, with one partition's offsets row when it has
/// committed on the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ViewOffsets {
    pub name: String,
    pub version: i32,
    /// Where the version is in its life.
    pub state: VersionState,
    pub partition: Option<PartitionOffsets>,
}

/// Every view version not dropped, once per partition of `topic` it has an offsets row for
/// (once, without one, before it commits there), in order of name, version and partition.
pub async fn view_offsets(client: &Client, topic: &str) -> Result<Vec<ViewOffsets>, Error> {
    let rows = client.query(*VIEW_OFFSETS, &[&topic]).await?;
    rows.iter()
        .map(|r| {
            let n = |i: usize| r.get::<_, Option<i64>>(i).unwrap_or(0);
            Ok(ViewOffsets {
                name: r.get(0),
                version: r.get(1),
                // Parsed once, here: a state the registry's CHECK does not allow is an error.
                state: r.try_get(2)?,
                partition: r
                    .get::<_, Option<i32>>(3)
                    .map(|partition| PartitionOffsets {
                        partition,
                        next_offset: n(4),
                        applied: n(5),
                        ignored: n(6),
                        duplicates: n(7),
                        dup_inbox: n(8),
                        dup_seq: n(9),
                        dup_watermark: n(10),
                        dup_version_filter: n(11),
                        dead_lettered: n(12),
                        committed_by: r.get(13),
                    }),
            })
        })
        .collect()
}

/// Dead letters, open and resolved.
pub async fn dead_letters(client: &Client) -> Result<i64, Error> {
    Ok(client.query_one(*DEAD_LETTERS, &[]).await?.get(0))
}

/// Parked accounts.
pub async fn parked_accounts(client: &Client) -> Result<i64, Error> {
    Ok(client.query_one(*PARKED_ACCOUNTS, &[]).await?.get(0))
}

/// The last `seq` of `account_id` that the live version of `view` shows (`None` when none):
/// `projector.applied`, which a reader asks before waiting in `projector.wait_applied`.
pub async fn applied(client: &Client, view: &str, account_id: i64) -> Result<Option<i64>, Error> {
    Ok(client
        .query_one(*APPLIED, &[&view, &account_id])
        .await?
        .get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_statement_exists() {
        for statement in ALL {
            assert!(!statement.is_empty());
        }
        assert!(VIEW_OFFSETS.contains("LEFT JOIN projector.offsets"));
        assert!(!PING.contains("database_comment"), "one statement per name");
    }

    #[test]
    fn names_and_texts_are_quoted() {
        assert_eq!(identifier("projector_demo"), "\"projector_demo\"");
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
    }
}
