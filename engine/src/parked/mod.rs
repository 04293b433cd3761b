//! Parked accounts and the events waiting behind them outside a batch
//! (`projector.parked_accounts`, `projector.waiting_events`): what `projector parked` lists
//! and reads. The statements are in `parked.sql`; the hot path parks, drains and unparks
//! with its own (`crate::queries`).

use deadpool_postgres::GenericClient;

use crate::projection::SqlFile;

const SQL: SqlFile = SqlFile::new("engine/src/parked/parked.sql", include_str!("parked.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// Whether an event of an account waits at a `seq` (a repair's skip refuses it).
pub(crate) const WAITS_AT: &str = SQL.statement("waits_at");

/// A parked account as `projector parked list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The view version (its consumer name).
    pub consumer: String,
    /// The account.
    pub account: i64,
    /// `gap`, `dead_letter` or `unknown_version`.
    pub reason: String,
    /// The `seq` it waits for.
    pub blocked_seq: i64,
    /// The dead letter that holds that `seq`, if one does.
    pub dead_letter: Option<i64>,
    /// Events waiting behind it.
    pub waiting: i64,
    /// Since when, as text.
    pub parked_at: String,
    /// Why, in words.
    pub detail: String,
}

/// Parked accounts, longest parked first, of every version of `view` (`None`: of every
/// view), at most `limit`.
pub async fn list(
    client: &impl GenericClient,
    view: Option<&str>,
    limit: i64,
) -> Result<Vec<Listed>, tokio_postgres::Error> {
    client
        .query(statement("list"), &[&view, &limit])
        .await?
        .iter()
        .map(|r| {
            Ok(Listed {
                consumer: r.try_get(0)?,
                account: r.try_get(1)?,
                reason: r.try_get(2)?,
                blocked_seq: r.try_get(3)?,
                dead_letter: r.try_get(4)?,
                waiting: r.try_get(5)?,
                parked_at: r.try_get(6)?,
                detail: r.try_get(7)?,
            })
        })
        .collect()
}

/// The dead letter `account` of a view version is parked on, if it is parked on one.
pub async fn dead_letter(
    client: &impl GenericClient,
    consumer: &str,
    account: i64,
) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(client
        .query_opt(statement("dead_letter"), &[&consumer, &account])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?
        .flatten())
}

/// The `seq` `account` of a view version waits for; `None`: it is not parked.
pub async fn blocked_seq(
    client: &impl GenericClient,
    consumer: &str,
    account: i64,
) -> Result<Option<i64>, tokio_postgres::Error> {
    client
        .query_opt(statement("blocked_seq"), &[&consumer, &account])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// How many accounts of a view version are parked.
pub async fn count(
    client: &impl GenericClient,
    consumer: &str,
) -> Result<i64, tokio_postgres::Error> {
    client
        .query_one(statement("count"), &[&consumer])
        .await?
        .try_get(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in ["list", "dead_letter", "blocked_seq", "count"] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }
}
