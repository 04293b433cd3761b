//! The live service: runs the `live` version of every selected view and follows the view
//! registry in PostgreSQL, so that a cutover (a new version live, the old one retired) takes
//! effect in a running process without a restart.
//!
//! - **Nothing is dropped.** A version's task that cannot start (no connection, a statement
//!   that does not prepare, a table another session holds locked past the statement timeout)
//!   or that stops with an error is started again with backoff for as long as the process
//!   runs, at start and at a cutover alike. Each failure is logged when it happens.
//! - **Only its own code.** A version runs only when this binary's code for it is the code
//!   that registered it ([`crate::fingerprint`]); other code, or none, leaves it alone, with
//!   one line naming both fingerprints.
//! - **Nothing in silence.** With every look at the registry the process beats in
//!   [`crate::processes`]: what it does with each version it should serve (starting,
//!   consuming, failing and why, skipped and why). `projector status` and `/health` read it:
//!   a version that should be consuming and is not makes the process unhealthy.
//!
//! `building` versions are not run here: the `projector rebuild` that builds one consumes for
//! it under its own consumer group and budget.
//!
//! While it runs a version, the service holds that version's running lock ([`running`]) on
//! a session of its own, so a `retire --drop` issued right after a cutover waits until this
//! process has stopped the retired version instead of dropping its tables under it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::apply::Applier;
use crate::fingerprint::{self, CodeError, Verdict};
use crate::kafka::running::{self, Session};
use crate::kafka::source::{start_view, KafkaConfig, Observer};
use crate::processes::{self, RunState, ViewReport};
use crate::projection::{Projection, Registry, SourceOrdering};

/// What the live service runs.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// View names to run (empty: every view the registry knows).
    pub names: Vec<String>,
    /// How often the view registry is read for new, live and retired versions, and the
    /// process's heartbeat.
    pub refresh: Duration,
    /// Recorded on every committed offset (`--instance-id`) and names the process in
    /// `projector.processes`; `None`: `<host>:<pid>`.
    pub owner: Option<String>,
    /// The first wait before a failed version is started again; it doubles with every
    /// failure in a row...
    pub restart_first: Duration,
    /// ... up to this. A version that consumed this long before it failed starts again
    /// after `restart_first`.
    pub restart_max: Duration,
}

impl Default for LiveOptions {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            refresh: Duration::from_secs(2),
            owner: None,
            restart_first: Duration::from_secs(1),
            restart_max: Duration::from_secs(60),
        }
    }
}

/// What a version's task is doing, shared between the task and the supervisor.
#[derive(Debug, Clone)]
struct Attempt {
    state: RunState,
    /// Failures in a row.
    failures: i32,
    error: Option<String>,
}

/// A version this process runs: its task keeps it running until `token` is cancelled.
struct Running {
    token: CancellationToken,
    task: JoinHandle<()>,
    attempt: Arc<Mutex<Attempt>>,
}

/// Everything a version's task needs.
struct Start {
    applier: Arc<Applier>,
    pool: Pool,
    config: KafkaConfig,
    observer: Arc<dyn Observer>,
    first: Duration,
    max: Duration,
}

/// Runs the live versions of the selected views until `shutdown` is cancelled, starting and
/// stopping versions as the registry changes. A version that fails is started again with
/// backoff; it never stops the others.
pub async fn run_live(
    registry: Registry,
    pool: Pool,
    config: KafkaConfig,
    observer: Arc<dyn Observer>,
    shutdown: CancellationToken,
    options: LiveOptions,
) {
    let instance = options
        .owner
        .clone()
        .unwrap_or_else(crate::apply::default_owner);
    let beat_ms = i32::try_from(options.refresh.as_millis())
        .unwrap_or(i32::MAX)
        .max(1);
    let mut running: HashMap<String, Running> = HashMap::new();
    // Versions this process leaves alone, with the one-line reason (said once).
    let mut skipped: BTreeMap<String, String> = BTreeMap::new();
    let mut registry_down = false;
    let mut beat_down = false;
    let mut arrived = false;
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
                stop(r).await;
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
                        stop(r).await;
                        holds.let_go(&consumer).await;
                    }
                }
                skipped.retain(|c, _| wanted_consumers.contains(c));
                for (name, version) in wanted {
                    let consumer = format!("{name}_v{version}");
                    if running.contains_key(&consumer) || skipped.contains_key(&consumer) {
                        continue;
                    }
                    let code = match runnable(&registry, &pool, &name, version).await {
                        Ok(code) => code,
                        Err(Refusal::Skip(reason)) => {
                            tracing::error!(%consumer, %reason, "live, but this process leaves it alone");
                            eprintln!("projector: {consumer} is live, but this process leaves it alone: {reason}");
                            skipped.insert(consumer, reason);
                            continue;
                        }
                        Err(Refusal::NotNow(reason)) => {
                            tracing::warn!(%consumer, %reason, "cannot check its code now; trying again at the next look");
                            continue;
                        }
                    };
                    let applier = match Applier::new(code, SourceOrdering::PerAccount) {
                        Ok(a) => a,
                        Err(e) => {
                            let reason = e.to_string();
                            eprintln!("projector: {consumer}: {reason}");
                            skipped.insert(consumer, reason);
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
                    let attempt = Arc::new(Mutex::new(Attempt {
                        state: RunState::Starting,
                        failures: 0,
                        error: None,
                    }));
                    let task = tokio::spawn(keep_running(
                        Start {
                            applier: Arc::new(applier),
                            pool: pool.clone(),
                            config: config.clone(),
                            observer: observer.clone(),
                            first: options.restart_first,
                            max: options.restart_max,
                        },
                        token.clone(),
                        attempt.clone(),
                    ));
                    running.insert(
                        consumer,
                        Running {
                            token,
                            task,
                            attempt,
                        },
                    );
                }
            }
            Err(e) => {
                if !registry_down {
                    tracing::warn!(error = %e, "cannot read the view registry; keeping what runs");
                    registry_down = true;
                }
            }
        }
        // A task that ended while it should run panicked (it returns only when cancelled):
        // said, and started again at the next look, like any failure.
        let ended: Vec<String> = running
            .iter()
            .filter(|(_, r)| r.task.is_finished() && !r.token.is_cancelled())
            .map(|(c, _)| c.clone())
            .collect();
        for consumer in ended {
            if let Some(r) = running.remove(&consumer) {
                tracing::error!(%consumer, "its task ended unexpectedly; starting it again");
                stop(r).await;
                holds.let_go(&consumer).await;
            }
        }
        let reports = report(&running, &skipped);
        match heartbeat(&pool, &instance, beat_ms, &reports, &mut arrived).await {
            Ok(()) if beat_down => {
                tracing::warn!("the heartbeat is written again");
                beat_down = false;
            }
            Ok(()) => {}
            Err(e) if !beat_down => {
                tracing::warn!(error = %e, "cannot write the heartbeat; status and health elsewhere will count this process gone");
                beat_down = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(options.refresh) => {}
        }
    }
    for (_, r) in running.drain() {
        stop(r).await;
    }
    // Closing the session lets go of every lock it holds.
    drop(holds);
    if let Ok(client) = pool.get().await {
        if let Err(e) = processes::leave(&client, &instance).await {
            tracing::debug!(error = %e, "could not remove this process's row; it ages out");
        }
    }
}

/// Why a live version is not started now.
enum Refusal {
    /// For as long as this process runs: no code for it, or other code.
    Skip(String),
    /// Its code could not be checked (PostgreSQL); the next look tries again.
    NotNow(String),
}

/// This binary's code for a version, if it is the code that registered it.
async fn runnable(
    registry: &Registry,
    pool: &Pool,
    name: &str,
    version: i32,
) -> Result<Arc<dyn Projection>, Refusal> {
    let code = registry
        .code_for(name, version)
        .map_err(|e| Refusal::Skip(e.to_string()))?;
    let client = pool
        .get()
        .await
        .map_err(|e| Refusal::NotNow(e.to_string()))?;
    match fingerprint::check(&client, &*code).await {
        Ok(Verdict::Same | Verdict::Replaces { .. } | Verdict::Adopted) => Ok(code),
        Ok(Verdict::Unregistered) => Err(Refusal::NotNow(format!(
            "{} is not registered",
            code.consumer()
        ))),
        Err(e @ CodeError::Differs { .. }) => Err(Refusal::Skip(e.to_string())),
        Err(e) => Err(Refusal::NotNow(e.to_string())),
    }
}

/// Keeps one version running until `token` is cancelled: started, and started again with
/// backoff whenever it ends with an error or cannot start.
async fn keep_running(start: Start, token: CancellationToken, attempt: Arc<Mutex<Attempt>>) {
    let consumer = start.applier.consumer().to_owned();
    let mut delay = start.first;
    loop {
        set(&attempt, |a| a.state = RunState::Starting);
        // A fatal error cancels its own attempt's token, never the version's.
        let this_try = token.child_token();
        let started = start_view(
            start.applier.clone(),
            start.pool.clone(),
            start.config.clone(),
            start.observer.clone(),
            this_try.clone(),
        )
        .await;
        let error = match started {
            Ok(view) => {
                let recovered = set(&attempt, |a| {
                    let failures = a.failures;
                    a.state = RunState::Consuming;
                    a.failures = 0;
                    a.error = None;
                    failures
                });
                if recovered > 0 {
                    tracing::warn!(%consumer, failed_attempts = recovered, "consuming again");
                    eprintln!("projector: {consumer} is consuming again after {recovered} failed attempt(s)");
                }
                let since = tokio::time::Instant::now();
                let result = view.finish().await;
                if token.is_cancelled() {
                    return;
                }
                if since.elapsed() >= start.max {
                    delay = start.first;
                }
                match result {
                    Err(e) => e.to_string(),
                    // Cancelled from inside without an error cannot happen; treated as one.
                    Ok(()) => "the view stopped without an error".to_owned(),
                }
            }
            Err(e) => e.to_string(),
        };
        if token.is_cancelled() {
            return;
        }
        let failures = set(&attempt, |a| {
            a.state = RunState::Failing;
            a.failures = a.failures.saturating_add(1);
            a.error = Some(error.clone());
            a.failures
        });
        tracing::error!(%consumer, attempt = failures, retry_in = ?delay, %error, "not consuming; starting it again after the backoff");
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(start.max);
    }
}

/// Updates the shared attempt and returns what `f` returns.
fn set<T>(attempt: &Mutex<Attempt>, f: impl FnOnce(&mut Attempt) -> T) -> T {
    match attempt.lock() {
        Ok(mut a) => f(&mut a),
        Err(poisoned) => f(&mut poisoned.into_inner()),
    }
}

/// Stops a version's task: its in-flight batches commit or roll back first.
async fn stop(r: Running) {
    r.token.cancel();
    if let Err(e) = r.task.await {
        tracing::error!(error = %e, "a view task panicked");
    }
}

/// What this process does with every version it should serve now.
fn report(
    running: &HashMap<String, Running>,
    skipped: &BTreeMap<String, String>,
) -> Vec<ViewReport> {
    let mut out: Vec<ViewReport> = running
        .iter()
        .map(|(consumer, r)| {
            let a = set(&r.attempt, |a| a.clone());
            ViewReport {
                consumer: consumer.clone(),
                state: a.state,
                attempts: a.failures,
                detail: a.error,
            }
        })
        .collect();
    out.extend(skipped.iter().map(|(consumer, reason)| ViewReport {
        consumer: consumer.clone(),
        state: RunState::Skipped,
        attempts: 0,
        detail: Some(reason.clone()),
    }));
    out.sort_by(|a, b| a.consumer.cmp(&b.consumer));
    out
}

async fn heartbeat(
    pool: &Pool,
    instance: &str,
    beat_ms: i32,
    reports: &[ViewReport],
    arrived: &mut bool,
) -> Result<(), String> {
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    if !*arrived {
        processes::arrive(&client, instance, beat_ms)
            .await
            .map_err(|e| e.to_string())?;
        *arrived = true;
    }
    processes::beat(&mut client, instance, beat_ms, reports)
        .await
        .map_err(|e| e.to_string())
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
