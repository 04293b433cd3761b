//! Read-your-writes: waking the readers that wait in `projector.wait_applied` (V0010) when a
//! view's batch commits, and waiting in Rust ([`wait_applied`]).
//!
//! A PL/pgSQL function cannot receive `LISTEN` notifications while it runs, so the wake-up
//! is a lock. Per view name there is a *bell*: an advisory lock (class [`CLASS`], key
//! `hashtext(view)`) that this process's notifier holds exclusively on a session of its own.
//! A waiter queues on it shared (with a `lock_timeout` of its remaining time); after each
//! committed batch of the view, the notifier releases the bell and takes it again, which
//! grants every queued waiter at once: each lets go at once and checks again. So a thousand
//! waiters cost the engine nothing: the apply path only sets a flag in memory after its
//! commit ([`Bell::ring`]); the notifier task does the rest on its own connection, never
//! inside a batch's transaction, and rings each view at most once per turn however many
//! batches committed meanwhile.
//!
//! - **Lost wake-ups.** A batch that commits between a waiter's check and its queueing rings
//!   before the waiter is queued. The next ring hears it: the next batch of the view, or the
//!   notifier's own ring: it looks for waiters queued on the bells it holds twice per
//!   [`PERIOD`], on a clock of its own (it reads `pg_locks` once per look, not per waiter),
//!   and rings a bell with a queued waiter that did not ring since its previous look. A
//!   waiter that missed a ring is seen at the next look and rung at most at the one after.
//!   So a wait ends at most [`PERIOD`] (plus the notifier's turns) after the commit it
//!   waited for, however often other views' commits wake the notifier.
//! - **Several processes.** One bell per view name has one holder: the first notifier that
//!   takes it. Batches other processes commit are heard through that holder's periodic ring
//!   (within [`PERIOD`]). When the holder stops, its session ends, the bell is free, and
//!   another process's notifier takes it at its next turn.
//! - **No notifier.** With no engine running (or `projector run --no-notify`), the bell is
//!   free: a waiter finds it so (a try before it queues) and checks every 50 ms instead.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::kafka::running::Session;

/// The first key of every bell ("prbl", 1886544492); the second is `hashtext(view)`. The
/// same number is written in `migrations/V0010__wait_applied.sql`.
pub const CLASS: i32 = 0x7072_626c;

/// The longest a waiter can miss a commit by (a lost wake-up): two looks.
pub const PERIOD: Duration = Duration::from_millis(100);

/// How often the notifier looks for queued waiters: half of [`PERIOD`], because a waiter that
/// missed a ring is seen at one look and rung at the next (the look must not ring a bell that
/// just rang, or a busy view's waiters would be woken twice as often).
const LOOK: Duration = Duration::from_millis(50);

const SQL: crate::projection::SqlFile =
    crate::projection::SqlFile::new("engine/src/bell.sql", include_str!("bell.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// The apply path's side of the bells: which views committed since the notifier last rang.
/// Cloned into every applier of a process; [`Bell::silent`] rings nothing.
#[derive(Clone, Default)]
pub struct Bell {
    inner: Option<Arc<Inner>>,
}

#[derive(Default)]
struct Inner {
    dirty: Mutex<BTreeSet<String>>,
    wake: Notify,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell")
            .field("rings", &self.inner.is_some())
            .finish()
    }
}

impl Bell {
    /// A bell a notifier ([`run_notifier`]) rings.
    pub fn new() -> Self {
        Self {
            inner: Some(Arc::new(Inner::default())),
        }
    }

    /// A bell that rings nothing (`projector run --no-notify`, tools, tests): waiters then
    /// check every 50 ms.
    pub fn silent() -> Self {
        Self { inner: None }
    }

    /// Says that a batch of `view` (its stable name) committed: a flag in memory and a wake-up
    /// of the notifier task, nothing more. Call it after the commit, never inside it.
    pub fn ring(&self, view: &str) {
        let Some(inner) = &self.inner else { return };
        if let Ok(mut dirty) = inner.dirty.lock() {
            if !dirty.contains(view) {
                dirty.insert(view.to_owned());
            }
        }
        inner.wake.notify_one();
    }

    fn take(&self) -> BTreeSet<String> {
        self.inner
            .as_ref()
            .and_then(|i| i.dirty.lock().ok().map(|mut d| std::mem::take(&mut *d)))
            .unwrap_or_default()
    }
}

/// The notifier: holds the bells of the views this process commits batches of, and rings
/// them after their commits (and every [`PERIOD`] while waiters queue), until `stop`. Its
/// session is its own, out of `pool`'s count; when it is lost, its bells are free until a
/// new session takes them again. Returns at once for a [`Bell::silent`].
pub async fn run_notifier(bell: Bell, pool: Pool, stop: CancellationToken) {
    let Some(inner) = bell.inner.clone() else {
        return;
    };
    let mut session: Option<Session> = None;
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut held: BTreeSet<String> = BTreeSet::new();
    let mut last_rung: HashMap<String, Instant> = HashMap::new();
    let mut last_look = Instant::now();
    let mut previous_look = last_look;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = inner.wake.notified() => {}
            // The look is due on a clock of its own, not at the first turn after it is due:
            // other views' commits would otherwise push it back (the bound is two looks).
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(last_look + LOOK)) => {}
        }
        let dirty = bell.take();
        known.extend(dirty.iter().cloned());
        if known.is_empty() {
            continue;
        }
        let turn = async {
            if session.is_none() {
                let s = Session::open(&pool).await.map_err(|e| e.to_string())?;
                s.client()
                    .batch_execute(statement("retake_timeout"))
                    .await
                    .map_err(|e| e.to_string())?;
                session = Some(s);
                held.clear();
            }
            let Some(s) = &session else {
                return Ok(());
            };
            let client = s.client();
            for view in known.difference(&held.clone()) {
                let row = client
                    .query_one(statement("try_take"), &[&CLASS, view])
                    .await
                    .map_err(|e| e.to_string())?;
                if row.get::<_, bool>(0) {
                    held.insert(view.clone());
                }
            }
            let mut ring: BTreeSet<String> = dirty.intersection(&held).cloned().collect();
            if last_look.elapsed() >= LOOK && !held.is_empty() {
                previous_look = last_look;
                last_look = Instant::now();
                let views: Vec<&String> = held.iter().collect();
                let queued = client
                    .query(statement("queued"), &[&views, &CLASS])
                    .await
                    .map_err(|e| e.to_string())?;
                for row in queued {
                    let view: String = row.get(0);
                    // A waiter queued now queued after the bell's last ring (a ring grants
                    // the whole queue). If that ring came after the previous look, the waiter
                    // may have missed it by a hair, and the next look (LOOK later) rings: it
                    // hears its commit within two looks, PERIOD. If no ring came since the
                    // previous look, ring now.
                    if last_rung.get(&view).is_none_or(|t| *t < previous_look) {
                        ring.insert(view);
                    }
                }
            }
            for view in ring {
                // Released, then asked for again: the release grants every queued waiter;
                // the request waits until they have let go (at once), and new waiters queue
                // behind it.
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&CLASS, &view];
                let (_, retaken) = futures::join!(
                    client.query_one(statement("release"), &params),
                    client.query_one(statement("take"), &params)
                );
                match retaken {
                    Ok(_) => {
                        last_rung.insert(view, Instant::now());
                    }
                    // Another process's notifier took it meanwhile: it rings now.
                    Err(e)
                        if e.code()
                            == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
                    {
                        held.remove(&view);
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok::<(), String>(())
        };
        match tokio::time::timeout(Duration::from_secs(10), turn).await {
            Ok(Ok(())) => {
                if failing {
                    tracing::info!("the read-your-writes notifier rings again");
                    failing = false;
                }
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!(error = %e, "the read-your-writes notifier lost its session; waiters check every 50 ms until it is back");
                    failing = true;
                }
                session = None;
            }
            Err(_) => {
                if !failing {
                    tracing::warn!(
                        "the read-your-writes notifier's session does not answer; opening another"
                    );
                    failing = true;
                }
                session = None;
            }
        }
    }
    // Dropping the session closes it, which lets go of every bell.
    drop(session);
}

/// What [`wait_applied`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The live version shows the event (for an order-independent view: it or a later event
    /// of the account is applied).
    Applied,
    /// Not within the timeout.
    Timeout,
    /// The account is parked at or below the event's `seq` in the live version: it will not
    /// show until an engineer repairs the account.
    Parked,
    /// No view of that name exists.
    UnknownView,
}

/// Why [`wait_applied`] could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The database failed, or the call was cancelled (a statement timeout).
    #[error("while waiting for {view} to apply account {account_id} seq {seq}: {source}")]
    Database {
        /// The view.
        view: String,
        /// The account.
        account_id: i64,
        /// The `seq` waited for.
        seq: i64,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The function answered something this code does not know (a newer schema).
    #[error("projector.wait_applied answered {0:?}, which this code does not know")]
    Unexpected(String),
}

/// Waits until the live version of `view` has applied `account_id`'s event `seq` (or a later
/// one), for at most `timeout`: `projector.wait_applied` (docs/consistency.md). The client
/// must not be inside a REPEATABLE READ or SERIALIZABLE transaction, and its statement
/// timeout must exceed `timeout`.
pub async fn wait_applied(
    client: &impl tokio_postgres::GenericClient,
    view: &str,
    account_id: i64,
    seq: i64,
    timeout: Duration,
) -> Result<Applied, WaitError> {
    // At most a century (as the function caps it): `Duration::MAX`, a caller's "forever", in
    // microseconds is out of an interval's range.
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let micros = i64::try_from(timeout.min(CENTURY).as_micros()).unwrap_or(i64::MAX);
    let row = client
        .query_one(
            statement("wait_applied"),
            &[&view, &account_id, &seq, &micros],
        )
        .await
        .map_err(|source| WaitError::Database {
            view: view.to_owned(),
            account_id,
            seq,
            source,
        })?;
    let answer: String = row.get(0);
    match answer.as_str() {
        "applied" => Ok(Applied::Applied),
        "timeout" => Ok(Applied::Timeout),
        "parked" => Ok(Applied::Parked),
        "unknown view" => Ok(Applied::UnknownView),
        _ => Err(WaitError::Unexpected(answer)),
    }
}
