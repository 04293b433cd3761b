//! Dead letters outside a batch (`projector.dead_letters`): listing, reading and skipping
//! them, for `projector dlq` and the repairs. The statements are in `dead_letters.sql`; the
//! hot path writes and resolves dead letters with its own (`crate::queries`).

use deadpool_postgres::GenericClient;

use crate::projection::SqlFile;

const SQL: SqlFile = SqlFile::new(
    "engine/src/dead_letters/dead_letters.sql",
    include_str!("dead_letters.sql"),
);

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// A repair's retry: the dead letter's message and whether it is resolved, locked.
pub(crate) const LOCK_FOR_RETRY: &str = SQL.statement("lock_for_retry");

/// Resolves a retried dead letter, with who and what became of its event.
pub(crate) const RESOLVE_RETRIED: &str = SQL.statement("resolve_retried");

/// A repair's skip: the dead letter's `seq`, kind and whether resolved, locked.
pub(crate) const LOCK_FOR_SKIP: &str = SQL.statement("lock_for_skip");

/// The account a dead letter of a view version names.
pub(crate) const ACCOUNT_IN: &str = SQL.statement("account_in");

/// A dead letter as `projector dlq list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its id.
    pub id: i64,
    /// The view version (its consumer name).
    pub consumer: String,
    /// `poison`, `apply_failed` or `conflict`.
    pub kind: String,
    /// Where its message came from.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// The account, when known.
    pub account: Option<i64>,
    /// The `seq`, when known.
    pub seq: Option<i64>,
    /// Why it failed.
    pub error: String,
    /// When, as text.
    pub created_at: String,
    /// How it was resolved; empty while open.
    pub resolution: String,
}

/// A dead letter in full, as `projector dlq show` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The view version (its consumer name).
    pub consumer: String,
    /// `poison`, `apply_failed` or `conflict`.
    pub kind: String,
    /// Where its message came from.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// The message's key.
    pub key: Option<Vec<u8>>,
    /// The message's bytes.
    pub payload: Vec<u8>,
    /// The event's id, when it could be read.
    pub event_id: Option<String>,
    /// The account, when known.
    pub account: Option<i64>,
    /// The `seq`, when known.
    pub seq: Option<i64>,
    /// Why it failed.
    pub error: String,
    /// When, as text.
    pub created_at: String,
    /// When it was resolved, as text; `None` while open.
    pub resolved_at: Option<String>,
    /// How.
    pub resolution: Option<String>,
    /// By whom.
    pub resolved_by: Option<String>,
    /// Why.
    pub resolution_note: Option<String>,
}

/// Which dead letters [`skip`] gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped<'a> {
    /// The one of this id.
    One(i64),
    /// Every open one of a view version at an account's `seq` (the `seq` is skipped).
    AtSeq {
        /// The view version's consumer name.
        consumer: &'a str,
        /// The account.
        account: i64,
        /// The `seq`.
        seq: i64,
    },
}

/// Dead letters, newest first: open ones only unless `all`, of every version of `view`
/// (`None`: of every view), at most `limit`.
pub async fn list(
    client: &impl GenericClient,
    view: Option<&str>,
    all: bool,
    limit: i64,
) -> Result<Vec<Listed>, tokio_postgres::Error> {
    client
        .query(statement("list"), &[&view, &all, &limit])
        .await?
        .iter()
        .map(|r| {
            Ok(Listed {
                id: r.try_get(0)?,
                consumer: r.try_get(1)?,
                kind: r.try_get(2)?,
                topic: r.try_get(3)?,
                partition: r.try_get(4)?,
                offset: r.try_get(5)?,
                account: r.try_get(6)?,
                seq: r.try_get(7)?,
                error: r.try_get(8)?,
                created_at: r.try_get(9)?,
                resolution: r.try_get(10)?,
            })
        })
        .collect()
}

/// The dead letter `id` in full; `None`: there is none.
pub async fn show(
    client: &impl GenericClient,
    id: i64,
) -> Result<Option<DeadLetter>, tokio_postgres::Error> {
    client
        .query_opt(statement("show"), &[&id])
        .await?
        .map(|r| {
            Ok(DeadLetter {
                consumer: r.try_get(0)?,
                kind: r.try_get(1)?,
                topic: r.try_get(2)?,
                partition: r.try_get(3)?,
                offset: r.try_get(4)?,
                key: r.try_get(5)?,
                payload: r.try_get(6)?,
                event_id: r.try_get(7)?,
                account: r.try_get(8)?,
                seq: r.try_get(9)?,
                error: r.try_get(10)?,
                created_at: r.try_get(11)?,
                resolved_at: r.try_get(12)?,
                resolution: r.try_get(13)?,
                resolved_by: r.try_get(14)?,
                resolution_note: r.try_get(15)?,
            })
        })
        .transpose()
}

/// The consumer name of the view version dead letter `id` belongs to; `None`: no such dead
/// letter.
pub async fn consumer(
    client: &impl GenericClient,
    id: i64,
) -> Result<Option<String>, tokio_postgres::Error> {
    client
        .query_opt(statement("consumer"), &[&id])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// The account dead letter `id` holds, if it names one; an error when there is no such
/// dead letter.
pub async fn account(
    client: &impl GenericClient,
    id: i64,
) -> Result<Option<i64>, tokio_postgres::Error> {
    client
        .query_one(statement("account"), &[&id])
        .await?
        .try_get(0)
}

/// The error of dead letter `id`; an error when there is no such dead letter.
pub async fn error(client: &impl GenericClient, id: i64) -> Result<String, tokio_postgres::Error> {
    client
        .query_one(statement("error"), &[&id])
        .await?
        .try_get(0)
}

/// How many dead letters of a view version are open.
pub async fn count_open(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<i64, tokio_postgres::Error> {
    client
        .query_one(statement("count_open"), &[&consumer])
        .await?
        .try_get(0)
}

/// Gives dead letters up (resolution `skipped`), recorded with who and why; open ones only.
/// Returns how many were resolved.
pub async fn skip(
    client: &impl GenericClient,
    which: Skipped<'_>,
    by: &str,
    reason: &str,
) -> Result<u64, tokio_postgres::Error> {
    let (id, consumer, account, seq) = match which {
        Skipped::One(id) => (Some(id), None, None, None),
        Skipped::AtSeq {
            consumer,
            account,
            seq,
        } => (None, Some(consumer), Some(account), Some(seq)),
    };
    client
        .execute(
            statement("skip"),
            &[&by, &reason, &id, &consumer, &account, &seq],
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "list",
            "show",
            "consumer",
            "account",
            "error",
            "count_open",
            "skip",
        ] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }
}
