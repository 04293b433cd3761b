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
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::apply::describe_db_error;
use crate::apply::Applier;
use crate::bell::Bell;
use crate::fingerprint::{self, CodeError, Verdict};
use crate::kafka::running::{self, Session};
use crate::kafka::source::{start_view, KafkaConfig, Observer};
use crate::processes::{self, Local, Run, RunState};
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
    /// Where the service says what it runs, for the process's own monitor to judge
    /// (`projector_ops::StatusOptions::local`) whether or not its heartbeat reaches PostgreSQL;
    /// `None`: a handle of its own.
    pub local: Option<Local>,
    /// Whether the process rings the read-your-writes bells after each committed batch
    /// ([`crate::bell`]); without it, readers in `projector.wait_applied` check every 50 ms
    /// (`projector run --no-notify`, and the bench's comparison).
    pub notify: bool,
}

impl Default for LiveOptions {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            refresh: Duration::from_secs(2),
            owner: None,
            restart_first: Duration::from_secs(1),
            restart_max: Duration::from_secs(60),
            local: None,
            notify: true,
        }
    }
}

/// A version this process runs: its task keeps it running until `token` is cancelled.
struct Running {
    token: CancellationToken,
    task: JoinHandle<()>,
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
    let local = options.local.clone().unwrap_or_else(|| {
        Local::new(
            options
                .owner
                .clone()
                .unwrap_or_else(crate::apply::default_owner),
        )
    });
    // The heartbeat has a task of its own: a look at the registry that waits (a version
    // stopping, PostgreSQL slow) must not make the process look gone.
    let beats = shutdown.child_token();
    let heartbeat = tokio::spawn(heartbeat(
        pool.clone(),
        local.clone(),
        options.refresh,
        beats.clone(),
    ));
    // The inbox's days ahead: made by every running process, so no cron is needed.
    let maintenance = tokio::spawn(maintain_inbox(pool.clone(), beats.clone()));
    // The read-your-writes notifier: rings after commits, on a session of its own.
    let bell = if options.notify {
        Bell::new()
    } else {
        Bell::silent()
    };
    let notifier = tokio::spawn(crate::bell::run_notifier(
        bell.clone(),
        pool.clone(),
        beats.clone(),
    ));
    let mut running: HashMap<String, Running> = HashMap::new();
    // Versions this process leaves alone for as long as it runs, with the one-line reason.
    let mut skipped: BTreeMap<String, String> = BTreeMap::new();
    // What was said of which version, so that a refusal asked again at every look is said once.
    let mut said: BTreeSet<(String, String)> = BTreeSet::new();
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
                local.forget(&consumer);
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
                        local.forget(&consumer);
                        stop(r).await;
                        holds.let_go(&consumer).await;
                    }
                }
                skipped.retain(|c, _| wanted_consumers.contains(c));
                said.retain(|(c, _)| wanted_consumers.contains(c));
                for (consumer, _) in local.reports() {
                    if !wanted_consumers.contains(&consumer.consumer) {
                        local.forget(&consumer.consumer);
                    }
                }
                for (name, version) in wanted {
                    let consumer = format!("{name}_v{version}");
                    if running.contains_key(&consumer) || skipped.contains_key(&consumer) {
                        continue;
                    }
                    let code = match runnable(&registry, &pool, &name, version).await {
                        Ok(code) => code,
                        Err(Refusal::Skip { reason, for_good }) => {
                            if said.insert((consumer.clone(), reason.clone())) {
                                tracing::error!(%consumer, %reason, "live, but this process leaves it alone");
                                eprintln!("projector: {consumer} is live, but this process leaves it alone: {reason}");
                            }
                            local.track(
                                &consumer,
                                Run::new(RunState::Skipped, Some(reason.clone())),
                            );
                            if for_good {
                                skipped.insert(consumer, reason);
                            }
                            continue;
                        }
                        Err(Refusal::NotNow(reason)) => {
                            not_started(
                                &local,
                                &consumer,
                                format!("cannot check its code: {reason}"),
                            );
                            continue;
                        }
                    };
                    let applier = match Applier::new(code, SourceOrdering::PerAccount) {
                        Ok(a) => a,
                        Err(e) => {
                            let reason = e.to_string();
                            eprintln!("projector: {consumer}: {reason}");
                            local.track(
                                &consumer,
                                Run::new(RunState::Skipped, Some(reason.clone())),
                            );
                            skipped.insert(consumer, reason);
                            continue;
                        }
                    };
                    let applier = match &options.owner {
                        Some(owner) => applier.owned_by(owner.clone()),
                        None => applier,
                    }
                    .with_bell(bell.clone());
                    match holds.hold(&pool, &consumer).await {
                        Ok(true) => {}
                        // Being dropped (it was live a moment ago): not started.
                        Ok(false) => {
                            local.forget(&consumer);
                            continue;
                        }
                        Err(e) => {
                            not_started(
                                &local,
                                &consumer,
                                format!("cannot take its running lock: {e}"),
                            );
                            continue;
                        }
                    }
                    tracing::info!(%consumer, topic = %config.topic, "starting");
                    eprintln!("projector: consuming {} into {consumer}", config.topic);
                    // A version that could not be started at earlier looks keeps its count.
                    let run = local
                        .run_of(&consumer)
                        .unwrap_or_else(|| Run::new(RunState::Starting, None));
                    local.track(&consumer, run.clone());
                    let token = shutdown.child_token();
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
                        run,
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
                if let Some(run) = local.run_of(&consumer) {
                    run.failed("its task ended unexpectedly".to_owned());
                }
                stop(r).await;
                holds.let_go(&consumer).await;
            }
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
    beats.cancel();
    if let Err(e) = heartbeat.await {
        tracing::error!(error = %e, "the heartbeat task panicked");
    }
    if let Err(e) = notifier.await {
        tracing::error!(error = %e, "the read-your-writes notifier panicked");
    }
    if let Err(e) = maintenance.await {
        tracing::error!(error = %e, "the inbox maintenance task panicked");
    }
}

/// Makes the inbox's days ahead (`crate::inbox::ensure_ahead`) at start and then every
/// [`crate::inbox::MAINTAIN_EVERY`], until `stop`; a failure is logged and tried again within
/// a minute. Falling behind never stops a batch (a batch makes the day it needs), but
/// `projector status` and the gauge `projector_inbox_partitions_ahead_seconds` show it.
async fn maintain_inbox(pool: Pool, stop: CancellationToken) {
    let mut failing = false;
    loop {
        let made = async {
            let mut client = pool.get().await.map_err(|e| e.to_string())?;
            crate::inbox::ensure_ahead(&mut client, chrono::Utc::now())
                .await
                .map_err(|e| describe_db_error(&e))
        };
        let wait = match tokio::time::timeout(Duration::from_secs(60), made).await {
            Ok(Ok(horizon)) => {
                if failing || horizon.made > 0 {
                    tracing::info!(made = horizon.made, until = ?horizon.until, "inbox partitions made ahead");
                }
                failing = false;
                crate::inbox::MAINTAIN_EVERY
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot make the inbox's partitions ahead; trying again in a minute");
                failing = true;
                Duration::from_secs(60)
            }
            Err(_) => {
                tracing::warn!("making the inbox's partitions ahead took over a minute; trying again in a minute");
                failing = true;
                Duration::from_secs(60)
            }
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// A live version this look could not start: reported as failing (it should be consuming),
/// and tried again at the next look.
fn not_started(local: &Local, consumer: &str, reason: String) {
    let run = local
        .run_of(consumer)
        .unwrap_or_else(|| Run::new(RunState::Starting, None));
    local.track(consumer, run.clone());
    let failures = run.failed(reason.clone());
    // Once at the start, then now and then: a look comes every refresh.
    if failures == 1 || failures % 30 == 0 {
        tracing::warn!(%consumer, attempt = failures, %reason, "not started; trying again at the next look");
    }
}

/// Why a live version is not started now.
enum Refusal {
    /// Left alone: no code for it, or other code (`for_good`: for as long as this process
    /// runs), or no code recorded yet (asked again at every look: a migrate records it).
    Skip { reason: String, for_good: bool },
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
        .map_err(|e| Refusal::Skip {
            reason: e.to_string(),
            for_good: true,
        })?;
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
        Err(e @ CodeError::Differs { .. }) => Err(Refusal::Skip {
            reason: e.to_string(),
            for_good: true,
        }),
        Err(e @ CodeError::Unrecorded { .. }) => Err(Refusal::Skip {
            reason: e.to_string(),
            for_good: false,
        }),
        Err(CodeError::Database { source, .. }) => Err(Refusal::NotNow(describe_db_error(&source))),
    }
}

/// Keeps one version running until `token` is cancelled: started, and started again with
/// backoff whenever it ends with an error or cannot start. From its first failure until it
/// consumes again it is reported failing, also while a new attempt starts.
async fn keep_running(start: Start, token: CancellationToken, run: Run) {
    let consumer = start.applier.consumer().to_owned();
    let mut delay = start.first;
    loop {
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
            Ok(Some(view)) => {
                let recovered = run.consuming();
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
            // Cancelled before it started.
            Ok(None) => return,
            Err(e) => e.to_string(),
        };
        if token.is_cancelled() {
            return;
        }
        let failures = run.failed(error.clone());
        tracing::error!(%consumer, attempt = failures, retry_in = ?delay, %error, "not consuming; starting it again after the backoff");
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(start.max);
    }
}

/// Stops a version's task: its in-flight batches commit or roll back first, and a start that
/// waits on a lock gives up at once.
async fn stop(r: Running) {
    r.token.cancel();
    if let Err(e) = r.task.await {
        tracing::error!(error = %e, "a view task panicked");
    }
}

/// Beats every `every` with what `local` says, until `stop`; then the process's rows go.
async fn heartbeat(pool: Pool, local: Local, every: Duration, stop: CancellationToken) {
    let beat_ms = i32::try_from(every.as_millis()).unwrap_or(i32::MAX).max(1);
    let (run_id, instance) = (local.run_id(), local.instance());
    let mut arrived = false;
    loop {
        let views: Vec<processes::ViewReport> =
            local.reports().into_iter().map(|(r, _)| r).collect();
        let beat = async {
            let mut client = pool.get().await.map_err(|e| e.to_string())?;
            if !arrived {
                processes::arrive(&client, &run_id, &instance, beat_ms)
                    .await
                    .map_err(|e| describe_db_error(&e))?;
            }
            processes::beat(&mut client, &run_id, &instance, beat_ms, &views)
                .await
                .map_err(|e| describe_db_error(&e))
        };
        let result = tokio::time::timeout(every.max(Duration::from_secs(5)), beat)
            .await
            .unwrap_or_else(|_| Err("no answer from PostgreSQL in time".to_owned()));
        match (&result, local.beat_error()) {
            (Ok(()), Some(_)) => tracing::warn!("the heartbeat is written again"),
            (Err(e), None) => {
                tracing::warn!(error = %e, "cannot write the heartbeat; other processes and `projector status` will count this process gone")
            }
            _ => {}
        }
        if result.is_ok() {
            arrived = true;
        }
        local.beat_went(result);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    if let Ok(client) = pool.get().await {
        if let Err(e) = processes::leave(&client, &run_id).await {
            tracing::debug!(error = %describe_db_error(&e), "could not remove this process's row; it ages out");
        }
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

async fn live_versions(pool: &Pool) -> Result<Vec<(String, i32)>, String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    crate::versions::live_everywhere(&client)
        .await
        .map_err(|e| e.to_string())
}
