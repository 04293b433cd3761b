//! The running process's own view of its health: every `interval` it takes the same
//! [`Status`] snapshot as `projector status`, publishes the gauges (lag per partition in
//! messages and seconds, parked accounts, open dead letters, the inbox) and keeps the last
//! assessment for the `/health` endpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::health::{Problem, ProblemKind, Severity};
use super::status::{collect, Status, StatusOptions};
use crate::kafka::log::LogReader;

/// How the monitor runs.
#[derive(Debug, Clone)]
pub struct MonitorOptions {
    /// What the snapshot covers and the health rule.
    pub status: StatusOptions,
    /// How often a snapshot is taken.
    pub interval: Duration,
    /// The longest one snapshot may take before the check counts as failed.
    pub timeout: Duration,
}

impl Default for MonitorOptions {
    fn default() -> Self {
        Self {
            status: StatusOptions::default(),
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The last assessment.
#[derive(Debug, Clone)]
pub struct Assessment {
    /// When it was made (monotonic), to tell a stale assessment.
    pub at: Instant,
    /// The snapshot; `None` when it could not be taken.
    pub status: Option<Arc<Status>>,
    /// Problems when no snapshot could be taken.
    pub problems: Vec<Problem>,
}

/// What `/health` answers.
#[derive(Debug, Clone, Serialize)]
pub struct HealthBody {
    /// The verdict.
    pub healthy: bool,
    /// When the snapshot it is based on was taken, if one was.
    pub taken_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Every problem, pages first.
    pub problems: Vec<Problem>,
}

impl Assessment {
    /// Nothing assessed yet: unhealthy until the first snapshot.
    pub fn pending() -> Self {
        Self {
            at: Instant::now(),
            status: None,
            problems: vec![Problem::global(
                Severity::Page,
                ProblemKind::CheckFailed,
                "no health check has completed yet".to_owned(),
            )],
        }
    }

    /// The `/health` answer, judged at `now`: an assessment older than `max_age` (the
    /// monitor itself is stuck) is unhealthy whatever it said.
    pub fn body(&self, now: Instant, max_age: Duration) -> HealthBody {
        let mut problems = match &self.status {
            Some(s) => s.problems.clone(),
            None => self.problems.clone(),
        };
        let age = now.saturating_duration_since(self.at);
        if age > max_age {
            problems.insert(
                0,
                Problem::global(
                    Severity::Page,
                    ProblemKind::CheckFailed,
                    format!("the last health check completed {}s ago", age.as_secs()),
                ),
            );
        }
        HealthBody {
            healthy: super::health::healthy(&problems),
            taken_at: self.status.as_ref().map(|s| s.taken_at),
            problems,
        }
    }
}

/// Takes a snapshot every `options.interval` until `shutdown`, publishing gauges and the
/// assessment. Uses its own pool (one connection is plenty), so a busy apply path never
/// delays the health check, and a stuck health check never takes a batch's connection.
pub async fn run_monitor(
    pool: Pool,
    probe: Arc<LogReader>,
    options: MonitorOptions,
    shutdown: CancellationToken,
    out: watch::Sender<Assessment>,
) {
    let mut ticks = tokio::time::interval(options.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let result =
            tokio::time::timeout(options.timeout, collect(&pool, &probe, &options.status)).await;
        let assessment = match result {
            Ok(Ok(status)) => {
                crate::gauges::publish_status(&status);
                Assessment {
                    at: Instant::now(),
                    status: Some(Arc::new(status)),
                    problems: Vec::new(),
                }
            }
            Ok(Err(e)) => failed(format!("the health check failed: {e}")),
            Err(_) => failed(format!(
                "the health check took longer than {}s: PostgreSQL or Kafka is not answering",
                options.timeout.as_secs()
            )),
        };
        if !assessment.status.as_ref().is_some_and(|s| s.healthy) {
            tracing::warn!(problems = ?assessment.body(Instant::now(), Duration::MAX).problems, "unhealthy");
        }
        if assessment.status.is_none() {
            crate::gauges::publish_unhealthy();
        }
        out.send_replace(assessment);
    }
}

fn failed(message: String) -> Assessment {
    Assessment {
        at: Instant::now(),
        status: None,
        problems: vec![Problem::global(
            Severity::Page,
            ProblemKind::CheckFailed,
            message,
        )],
    }
}
