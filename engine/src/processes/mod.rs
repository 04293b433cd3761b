//! Who runs what. Every `projector run` process records, with a heartbeat, what it does with
//! each view version it should serve: starting, consuming, failing (and retrying), or
//! skipping it because its code is not the code that registered the version
//! ([`crate::fingerprint`]). `projector status` and every process's `/health` read it, so a
//! version nobody consumes is named, with the reason, instead of looking idle.
//!
//! Why in PostgreSQL rather than in each process's memory: the question "is every live
//! version consumed by someone?" spans processes, and `projector status` is a process of its
//! own. A process that dies stops beating; after three missed beats readers count it gone.
//! A process's own `/health` does not depend on its beats arriving: [`Local`] hands its
//! monitor what its supervisor knows, and a heartbeat that cannot be written pages.
//!
//! A process is known by a random id of its run, its name (`--instance-id`, else
//! `<host>:<pid>`) is a label: two processes that share a name do not erase each other's
//! reports. The statements are in `processes.sql`, the one place that writes these tables.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

const SQL: &str = include_str!("processes.sql");

fn statement(name: &str) -> &'static str {
    crate::projection::named_sql(SQL, name)
        .unwrap_or_else(|| panic!("processes.sql has no statement {name:?}"))
}

/// What a process does with a version it should serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Connecting, preparing the view's statements, subscribing, for the first time since it
    /// was wanted (a start again after a failure is still `Failing`).
    Starting,
    /// Consuming the topic into the version.
    Consuming,
    /// It could not start, or stopped with an error, or its code could not be checked:
    /// retried with backoff.
    Failing,
    /// This process never consumes or repairs it: its code differs, or it has none.
    Skipped,
}

impl RunState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Starting => "starting",
            RunState::Consuming => "consuming",
            RunState::Failing => "failing",
            RunState::Skipped => "skipped",
        }
    }

    /// The state of a stored name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            RunState::Starting,
            RunState::Consuming,
            RunState::Failing,
            RunState::Skipped,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// One version as a process reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewReport {
    /// The version's consumer name.
    pub consumer: String,
    /// What the process does with it.
    pub state: RunState,
    /// Failed attempts in a row (0 once it consumes).
    pub attempts: i32,
    /// The last error while failing; why it is skipped.
    pub detail: Option<String>,
}

/// What one version of this process is doing now, shared by whoever changes it (the
/// version's task, the supervisor) and whoever reports it (the heartbeat, the monitor).
#[derive(Debug, Clone)]
pub struct Run(Arc<Mutex<RunNow>>);

#[derive(Debug, Clone)]
struct RunNow {
    state: RunState,
    attempts: i32,
    detail: Option<String>,
    /// When `state` began, on this process's clock.
    since: Instant,
}

impl Run {
    /// A version in `state`.
    pub fn new(state: RunState, detail: Option<String>) -> Self {
        Self(Arc::new(Mutex::new(RunNow {
            state,
            attempts: 0,
            detail,
            since: Instant::now(),
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut RunNow) -> T) -> T {
        match self.0.lock() {
            Ok(mut r) => f(&mut r),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// The version now consumes; returns the failed attempts it took.
    pub fn consuming(&self) -> i32 {
        self.with(|r| {
            let failures = r.attempts;
            r.set(RunState::Consuming);
            r.attempts = 0;
            r.detail = None;
            failures
        })
    }

    /// It failed (to start, or while it ran, or to be checked): `error`; returns the
    /// failures in a row, this one included.
    pub fn failed(&self, error: String) -> i32 {
        self.with(|r| {
            r.set(RunState::Failing);
            r.attempts = r.attempts.saturating_add(1);
            r.detail = Some(error);
            r.attempts
        })
    }

    /// What it does now, and for how long.
    pub fn now(&self) -> (ViewReport, Duration) {
        self.with(|r| {
            (
                ViewReport {
                    consumer: String::new(),
                    state: r.state,
                    attempts: r.attempts,
                    detail: r.detail.clone(),
                },
                r.since.elapsed(),
            )
        })
    }
}

impl RunNow {
    fn set(&mut self, state: RunState) {
        if self.state != state {
            self.state = state;
            self.since = Instant::now();
        }
    }
}

/// What this process itself runs, shared between its supervisor, its heartbeat and its
/// monitor.
#[derive(Debug, Clone)]
pub struct Local(Arc<Mutex<LocalNow>>);

#[derive(Debug)]
struct LocalNow {
    run_id: String,
    instance: String,
    views: BTreeMap<String, Run>,
    /// Why the last heartbeat could not be written, if it could not.
    beat_error: Option<String>,
}

impl Local {
    /// A process named `instance`, with a random id for this run.
    pub fn new(instance: impl Into<String>) -> Self {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Self(Arc::new(Mutex::new(LocalNow {
            run_id: format!("{:016x}", hasher.finish()),
            instance: instance.into(),
            views: BTreeMap::new(),
            beat_error: None,
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut LocalNow) -> T) -> T {
        match self.0.lock() {
            Ok(mut l) => f(&mut l),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// The id of this run.
    pub fn run_id(&self) -> String {
        self.with(|l| l.run_id.clone())
    }

    /// The process's name.
    pub fn instance(&self) -> String {
        self.with(|l| l.instance.clone())
    }

    /// Reports `consumer` as `run` says from now on.
    pub fn track(&self, consumer: &str, run: Run) {
        self.with(|l| l.views.insert(consumer.to_owned(), run));
    }

    /// What `consumer` is reported as, if it is.
    pub fn run_of(&self, consumer: &str) -> Option<Run> {
        self.with(|l| l.views.get(consumer).cloned())
    }

    /// Stops reporting `consumer`.
    pub fn forget(&self, consumer: &str) {
        self.with(|l| l.views.remove(consumer));
    }

    /// Every version this process serves now, and how long it has been in its state.
    pub fn reports(&self) -> Vec<(ViewReport, Duration)> {
        let runs: Vec<(String, Run)> = self.with(|l| {
            l.views
                .iter()
                .map(|(c, r)| (c.clone(), r.clone()))
                .collect()
        });
        runs.into_iter()
            .map(|(consumer, run)| {
                let (mut report, age) = run.now();
                report.consumer = consumer;
                (report, age)
            })
            .collect()
    }

    /// Records how the last heartbeat went.
    pub fn beat_went(&self, result: Result<(), String>) {
        self.with(|l| l.beat_error = result.err());
    }

    /// Why the last heartbeat could not be written, if it could not.
    pub fn beat_error(&self) -> Option<String> {
        self.with(|l| l.beat_error.clone())
    }
}

/// The name of a process without `--instance-id`: `<host>:<pid>`, as it commits offsets.
pub fn default_instance() -> String {
    crate::apply::default_owner()
}

/// A process starts: its row under this run's id; rows of processes not seen for a day go.
pub async fn arrive(
    client: &impl GenericClient,
    run_id: &str,
    instance: &str,
    beat_ms: i32,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("forget_dead"), &[])
        .await
        .map(drop)?;
    client
        .execute(statement("arrive"), &[&run_id, &instance, &beat_ms])
        .await
        .map(drop)
}

/// The heartbeat, with what the process does with each version it serves now: one
/// transaction, so a reader never sees half of it.
pub async fn beat(
    client: &mut deadpool_postgres::Client,
    run_id: &str,
    instance: &str,
    beat_ms: i32,
    views: &[ViewReport],
) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let updated = tx.execute(statement("beat"), &[&run_id, &beat_ms]).await?;
    if updated == 0 {
        // Deleted meanwhile (by `forget_dead` of another process after a day cut off, or by
        // hand): arrive again.
        tx.execute(statement("arrive"), &[&run_id, &instance, &beat_ms])
            .await?;
    }
    let consumers: Vec<&str> = views.iter().map(|v| v.consumer.as_str()).collect();
    let states: Vec<&str> = views.iter().map(|v| v.state.as_str()).collect();
    let attempts: Vec<i32> = views.iter().map(|v| v.attempts).collect();
    let details: Vec<Option<&str>> = views.iter().map(|v| v.detail.as_deref()).collect();
    tx.execute(statement("forget_views"), &[&run_id, &consumers])
        .await?;
    if !views.is_empty() {
        tx.execute(
            statement("report_views"),
            &[&run_id, &consumers, &states, &attempts, &details],
        )
        .await?;
    }
    tx.commit().await
}

/// A clean stop: the process's rows go.
pub async fn leave(client: &impl GenericClient, run_id: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("leave"), &[&run_id])
        .await
        .map(drop)
}

/// A process as readers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// The id of its run.
    pub run_id: String,
    /// `--instance-id`, else `<host>:<pid>`.
    pub instance: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub seen_at: DateTime<Utc>,
    /// Its heartbeat is recent: what it reports counts.
    pub fresh: bool,
    /// What it does with each version it serves.
    pub views: Vec<ProcessView>,
}

/// A version as one process reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessView {
    /// The version's consumer name.
    pub consumer: String,
    /// What the process does with it.
    pub state: RunState,
    /// Since when (the server's clock).
    pub since: DateTime<Utc>,
    /// Failed attempts in a row.
    pub attempts: i32,
    /// The last error, or why it is skipped.
    pub detail: Option<String>,
}

/// Every process seen in the last day and what it reports.
pub async fn read(client: &impl GenericClient) -> Result<Vec<Process>, tokio_postgres::Error> {
    let rows = client.query(statement("read"), &[]).await?;
    let mut out: Vec<Process> = Vec::new();
    for r in rows {
        let run_id: String = r.get(0);
        if out.last().is_none_or(|p| p.run_id != run_id) {
            out.push(Process {
                run_id,
                instance: r.get(1),
                started_at: r.get(2),
                seen_at: r.get(3),
                fresh: r.get(4),
                views: Vec::new(),
            });
        }
        let consumer: Option<String> = r.get(5);
        let state: Option<String> = r.get(6);
        if let (Some(consumer), Some(state), Some(process)) = (
            consumer,
            state.as_deref().and_then(RunState::parse),
            out.last_mut(),
        ) {
            process.views.push(ProcessView {
                consumer,
                state,
                since: r.get(7),
                attempts: r.get(8),
                detail: r.get(9),
            });
        }
    }
    Ok(out)
}

/// `processes` with this process's own reports in place of what PostgreSQL holds of it: its
/// monitor judges what its supervisor knows now, whether or not its beats arrive. `now` is
/// the snapshot's time (the server's clock); local ages are measured back from it.
pub fn overlay(processes: &mut Vec<Process>, local: &Local, now: DateTime<Utc>) {
    let run_id = local.run_id();
    let stored = processes.iter().position(|p| p.run_id == run_id);
    let (started_at, seen_at) = stored.map_or((now, now), |i| {
        (processes[i].started_at, processes[i].seen_at)
    });
    let views = local
        .reports()
        .into_iter()
        .map(|(report, age)| ProcessView {
            consumer: report.consumer,
            state: report.state,
            since: now - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::zero()),
            attempts: report.attempts,
            detail: report.detail,
        })
        .collect();
    let mine = Process {
        run_id,
        instance: local.instance(),
        started_at,
        seen_at,
        fresh: true,
        views,
    };
    match stored {
        Some(i) => processes[i] = mine,
        None => processes.push(mine),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in [
            "arrive",
            "beat",
            "report_views",
            "forget_views",
            "leave",
            "forget_dead",
            "read",
        ] {
            assert!(
                crate::projection::named_sql(SQL, name).is_some(),
                "{name} is missing"
            );
        }
    }

    #[test]
    fn states_read_back_as_written() {
        for s in [
            RunState::Starting,
            RunState::Consuming,
            RunState::Failing,
            RunState::Skipped,
        ] {
            assert_eq!(RunState::parse(s.as_str()), Some(s));
        }
        assert_eq!(RunState::parse("live"), None);
    }

    #[test]
    fn a_failing_version_stays_failing_from_its_first_failure_until_it_consumes() {
        let run = Run::new(RunState::Starting, None);
        assert_eq!(run.failed("locked".to_owned()), 1);
        let (_, first) = run.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(run.failed("locked again".to_owned()), 2);
        let (report, since) = run.now();
        assert_eq!(report.state, RunState::Failing);
        assert_eq!(report.detail.as_deref(), Some("locked again"));
        assert!(
            since > first,
            "the age counts from the first failure in a row"
        );
        assert_eq!(run.consuming(), 2);
        assert_eq!(run.now().0.state, RunState::Consuming);
    }

    #[test]
    fn two_runs_have_two_ids() {
        assert_ne!(Local::new("a").run_id(), Local::new("a").run_id());
    }

    #[test]
    fn the_overlay_puts_this_process_in_as_its_supervisor_sees_it() {
        let local = Local::new("here");
        local.track("portfolio_v1", Run::new(RunState::Starting, None));
        let now = Utc::now();
        let mut processes = vec![Process {
            run_id: "other".to_owned(),
            instance: "here".to_owned(),
            started_at: now,
            seen_at: now,
            fresh: true,
            views: Vec::new(),
        }];
        overlay(&mut processes, &local, now);
        assert_eq!(processes.len(), 2, "a namesake is another process");
        let mine = &processes[1];
        assert!(mine.fresh);
        assert_eq!(mine.views[0].consumer, "portfolio_v1");
        assert_eq!(mine.views[0].state, RunState::Starting);
    }
}
