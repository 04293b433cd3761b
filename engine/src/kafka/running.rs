//! Who runs a view version. Every process that consumes for one (the live service for a
//! live version, a rebuild for the version it builds) holds a *shared* advisory lock keyed
//! by the version's consumer name for as long as it runs; dropping a version (its tables,
//! inbox rows, offsets and progress) takes that lock *exclusively* first, so it happens only
//! once no process runs the version.
//!
//! Why: a batch committed after the drop leaves offsets and `seq` progress behind for a
//! version that is gone (a batch of events the view ignores writes nothing else), and a
//! rebuild into the same version number would resume from them and skip what they cover;
//! a batch that can no longer commit is retried for ever, and holds its consumer's shutdown.
//!
//! The locks are session locks on a session of their own ([`Session`]): a process that dies
//! lets go with its connection. The tries never wait, so nothing here can block a running
//! view.

use deadpool_postgres::{ClientWrapper, Object, Pool, PoolError};
use tokio_postgres::{Client, Error};

/// The first key of every lock here ("prjr"); the second is `hashtext(consumer)`. A hash
/// collision between two consumers only makes one drop wait for the other's runners.
const CLASS: i32 = 0x7072_6a72;

const SQL: crate::projection::SqlFile =
    crate::projection::SqlFile::new("engine/src/kafka/running.sql", include_str!("running.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// Takes `consumer`'s lock shared (this session runs it), unless a drop holds it: `false`.
pub async fn try_hold(client: &Client, consumer: &str) -> Result<bool, Error> {
    let row = client
        .query_one(statement("try_hold"), &[&CLASS, &consumer])
        .await?;
    row.try_get(0)
}

/// Takes `consumer`'s lock shared until the transaction `client` is in ends, unless a drop
/// holds it: `false`. A repair (`dlq retry`, `parked skip`, a drain) writes a version's rows
/// outside any running consumer: without the hold, a drop could delete them under it, or
/// it could leave progress behind a drop that a rebuild into the same number resumes from.
pub async fn try_hold_for_transaction(
    client: &impl tokio_postgres::GenericClient,
    consumer: &str,
) -> Result<bool, Error> {
    let row = client
        .query_one(statement("try_hold_for_transaction"), &[&CLASS, &consumer])
        .await?;
    row.try_get(0)
}

/// Gives a shared hold back.
pub async fn let_go(client: &Client, consumer: &str) -> Result<(), Error> {
    client
        .execute(statement("let_go"), &[&CLASS, &consumer])
        .await
        .map(|_| ())
}

/// Takes `consumer`'s lock exclusively (nobody runs it, and nobody can start it until
/// [`give_back`]), unless a process runs it: `false`.
pub async fn try_take(client: &Client, consumer: &str) -> Result<bool, Error> {
    let row = client
        .query_one(statement("try_take"), &[&CLASS, &consumer])
        .await?;
    row.try_get(0)
}

/// Gives an exclusive lock back.
pub async fn give_back(client: &Client, consumer: &str) -> Result<(), Error> {
    client
        .execute(statement("give_back"), &[&CLASS, &consumer])
        .await
        .map(|_| ())
}

/// A connection taken out of its pool to hold locks: it no longer counts against the pool's
/// size (a pool of one still serves the views), and dropping it closes the connection, which
/// lets go of every lock it holds. (Given back to the pool, it would hold them for whoever
/// got it next.)
pub struct Session {
    client: ClientWrapper,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

impl Session {
    /// A session of `pool`'s database.
    pub async fn open(pool: &Pool) -> Result<Self, PoolError> {
        Ok(Self {
            client: Object::take(pool.get().await?),
        })
    }

    /// The session's connection.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Whether the session still answers. One that is closed, fails or does not answer
    /// within five seconds (a killed backend, a cut network) lost its locks with it, or
    /// will lose them with the connection: a holder must hold them again on a new session.
    pub async fn alive(&self) -> bool {
        !self.client.is_closed()
            && matches!(
                tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    self.client.batch_execute(statement("ping"))
                )
                .await,
                Ok(Ok(()))
            )
    }
}
