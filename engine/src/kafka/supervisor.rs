//! The live service: runs the `live` version of every selected view and follows the view
//! registry in PostgreSQL, so that a cutover (a new version live, the old one retired) takes
//! effect in a running process without a restart.
//!
//! `building` versions are not run here: the `projector rebuild` that builds one consumes for
//! it under its own consumer group and budget. A version whose code this binary does not
//! have (a newer binary registered it) is reported once and left alone.
//!
//! While it runs a version, the service holds that version's running lock ([`running`]) on
//! a session of its own, so a `retire --drop` issued right after a cutover waits until this
//! process has stopped the retired version instead of dropping its tables under it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::apply::Applier;
use crate::kafka::running::{self, Session};
use crate::kafka::source::{run_view, KafkaConfig, Observer, SourceError};
use crate::projection::{Registry, SourceOrdering};

/// What the live service runs.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// View names to run (empty: every view the registry knows).
    pub names: Vec<String>,
    /// How often the view registry is read for new, live and retired versions.
    pub refresh: Duration,
    /// Recorded on every committed offset (`--instance-id`); `None`: `<host>:<pid>`.
    pub owner: Option<String>,
}

impl Default for LiveOptions {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            refresh: Duration::from_secs(2),
            owner: None,
        }
    }
}

struct Running {
    token: CancellationToken,
    task: JoinHandle<Result<(), SourceError>>,
}

/// Runs the live versions of the selected views until `shutdown` is cancelled, starting and
/// stopping versions as the registry changes. A view that stops with an error does not stop
/// the others; every error is returned at the end.
pub async fn run_live(
    registry: Registry,
    pool: Pool,
    config: KafkaConfig,
    observer: Arc<dyn Observer>,
    shutdown: CancellationToken,
    options: LiveOptions,
) -> Result<(), Vec<SourceError>> {
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut errors = Vec::new();
    let mut failed: BTreeSet<String> = BTreeSet::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let mut registry_down = false;
    let mut holds = Holds::default();
    loop {
        // A lost lock session lost its locks: hold them again for what still runs. A version
        // whose lock a drop took meanwhile is stopped: it is being dropped under it.
        holds.check().await;
        let mut taken = Vec::new();
        for consumer in running.keys() {
            if let Ok(false) = holds.hold(&pool, consumer).await {
                taken.push(consumer.clone());
            }
        }
        for consumer in taken {
            if let Some(r) = running.remove(&consumer) {
                tracing::warn!(%consumer, "its running lock was lost and a drop took it; stopping it");
                r.token.cancel();
                collect(&consumer, r.task.await, &mut errors);
            }
        }
        match live_versions(&pool).await {
            Ok(live) => {
                if registry_down {
                    tracing::warn!("the view registry is readable again");
                    registry_down = false;
                }
                let wanted: Vec<(String, i32)> = live
                    .into_iter()
                    .filter(|(name, _)| options.names.is_empty() || options.names.contains(name))
                    .collect();
                let wanted_consumers: BTreeSet<String> =
                    wanted.iter().map(|(n, v)| format!("{n}_v{v}")).collect();
                // Stop what is no longer live (retired by a cutover, or dropped).
                let stale: Vec<String> = running
                    .keys()
                    .filter(|c| !wanted_consumers.contains(*c))
                    .cloned()
                    .collect();
                for consumer in stale {
                    if let Some(r) = running.remove(&consumer) {
                        tracing::info!(%consumer, "no longer live; stopping it");
                        eprintln!("projector: {consumer} is no longer live; stopped");
                        r.token.cancel();
                        collect(&consumer, r.task.await, &mut errors);
                        holds.let_go(&consumer).await;
                    }
                }
                for (name, version) in wanted {
                    let consumer = format!("{name}_v{version}");
                    if running.contains_key(&consumer) || failed.contains(&consumer) {
                        continue;
                    }
                    let code = match registry.code_for(&name, version) {
                        Ok(code) => code,
                        Err(e) => {
                            if reported.insert(consumer.clone()) {
                                tracing::error!(%consumer, error = %e, "live, but this binary cannot run it");
                                eprintln!("projector: {consumer} is live, but this binary cannot run it: {e}");
                            }
                            continue;
                        }
                    };
                    let applier = match Applier::new(code, SourceOrdering::PerAccount) {
                        Ok(a) => a,
                        Err(e) => {
                            if reported.insert(consumer.clone()) {
                                eprintln!("projector: {consumer}: {e}");
                            }
                            continue;
                        }
                    };
                    let applier = match &options.owner {
                        Some(owner) => applier.owned_by(owner.clone()),
                        None => applier,
                    };
                    match holds.hold(&pool, &consumer).await {
                        Ok(true) => {}
                        // Being dropped (it was live a moment ago): not started.
                        Ok(false) => continue,
                        Err(e) => {
                            tracing::warn!(%consumer, error = %e, "cannot take the running lock; starting it at the next look");
                            continue;
                        }
                    }
                    tracing::info!(%consumer, topic = %config.topic, "starting");
                    eprintln!("projector: consuming {} into {consumer}", config.topic);
                    let token = shutdown.child_token();
                    let task = tokio::spawn(run_view(
                        Arc::new(applier),
                        pool.clone(),
                        config.clone(),
                        observer.clone(),
                        token.clone(),
                    ));
                    running.insert(consumer, Running { token, task });
                }
            }
            Err(e) => {
                if !registry_down {
                    tracing::warn!(error = %e, "cannot read the view registry; keeping what runs");
                    registry_down = true;
                }
            }
        }
        // A view that stopped on its own (a fatal error) is not restarted by this process.
        let finished: Vec<String> = running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(c, _)| c.clone())
            .collect();
        for consumer in finished {
            if let Some(r) = running.remove(&consumer) {
                collect(&consumer, r.task.await, &mut errors);
                holds.let_go(&consumer).await;
                failed.insert(consumer);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(options.refresh) => {}
        }
    }
    for (consumer, r) in running {
        r.token.cancel();
        collect(&consumer, r.task.await, &mut errors);
    }
    // Closing the session lets go of every lock it holds.
    drop(holds);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// The running locks of what this service runs, on one session of their own.
#[derive(Debug, Default)]
struct Holds {
    session: Option<Session>,
    held: BTreeSet<String>,
}

impl Holds {
    /// Holds `consumer`'s running lock: `Ok(false)` when a drop of it is under way.
    async fn hold(&mut self, pool: &Pool, consumer: &str) -> Result<bool, String> {
        if self.held.contains(consumer) {
            return Ok(true);
        }
        let session = match &self.session {
            Some(session) => session,
            None => {
                self.held.clear();
                self.session
                    .insert(Session::open(pool).await.map_err(|e| e.to_string())?)
            }
        };
        match running::try_hold(session.client(), consumer).await {
            Ok(held) => {
                if held {
                    self.held.insert(consumer.to_owned());
                }
                Ok(held)
            }
            Err(e) => {
                self.session = None;
                Err(e.to_string())
            }
        }
    }

    /// Finds out whether the session still holds what it holds ([`Session::alive`]): one
    /// that lost its locks is let go, and the next [`Holds::hold`] takes them again on a
    /// new one. Without the look, `held` would
    /// say they are held for as long as the process runs, and a drop would not wait.
    async fn check(&mut self) {
        let Some(session) = &self.session else {
            return;
        };
        let alive = session.alive().await;
        if !alive {
            tracing::warn!("the session holding the running locks was lost; holding them again");
            self.session = None;
            self.held.clear();
        }
    }

    /// Gives `consumer`'s lock back once it stopped.
    async fn let_go(&mut self, consumer: &str) {
        if !self.held.remove(consumer) {
            return;
        }
        if let Some(session) = &self.session {
            if running::let_go(session.client(), consumer).await.is_err() {
                // The session is broken; closing it lets go of everything it held.
                self.session = None;
                self.held.clear();
            }
        }
    }
}

fn collect(
    consumer: &str,
    result: Result<Result<(), SourceError>, tokio::task::JoinError>,
    errors: &mut Vec<SourceError>,
) {
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => errors.push(e),
        Err(e) => errors.push(SourceError::Thread {
            consumer: consumer.to_owned(),
            message: e.to_string(),
        }),
    }
}

async fn live_versions(pool: &Pool) -> Result<Vec<(String, i32)>, String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    let rows = client
        .query(
            "SELECT name, version FROM projector.views \
             WHERE state = 'live' AND dropped_at IS NULL ORDER BY name",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
