//! Who runs what. Every `projector run` process records, with a heartbeat, what it does with
//! each view version it should serve: starting, consuming, failing (and retrying), or
//! skipping it because its code is not the code that registered the version
//! ([`crate::fingerprint`]). `projector status` and every process's `/health` read it, so a
//! version nobody consumes is named, with the reason, instead of looking idle.
//!
//! Why in PostgreSQL rather than in each process's memory: the question "is every live
//! version consumed by someone?" spans processes, and `projector status` is a process of its
//! own. A process that dies stops beating; after three missed beats readers count it gone.
//!
//! The statements are in `processes.sql`, the one place that writes these tables.

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
    /// Connecting, preparing the view's statements, subscribing.
    Starting,
    /// Consuming the topic into the version.
    Consuming,
    /// It could not start, or stopped with an error: retried with backoff.
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

/// A process starts: its row afresh, nothing of what it reported before; rows of processes
/// not seen for a day go.
pub async fn arrive(
    client: &impl GenericClient,
    instance: &str,
    beat_ms: i32,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("forget_dead"), &[])
        .await
        .map(drop)?;
    client
        .execute(statement("arrive"), &[&instance, &beat_ms])
        .await
        .map(drop)
}

/// The heartbeat, with what the process does with each version it serves now: one
/// transaction, so a reader never sees half of it.
pub async fn beat(
    client: &mut deadpool_postgres::Client,
    instance: &str,
    beat_ms: i32,
    views: &[ViewReport],
) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let updated = tx
        .execute(statement("beat"), &[&instance, &beat_ms])
        .await?;
    if updated == 0 {
        // Deleted meanwhile (by `forget_dead` of another process after a day cut off, or by
        // hand): arrive again.
        tx.execute(statement("arrive"), &[&instance, &beat_ms])
            .await?;
    }
    let consumers: Vec<&str> = views.iter().map(|v| v.consumer.as_str()).collect();
    let states: Vec<&str> = views.iter().map(|v| v.state.as_str()).collect();
    let attempts: Vec<i32> = views.iter().map(|v| v.attempts).collect();
    let details: Vec<Option<&str>> = views.iter().map(|v| v.detail.as_deref()).collect();
    tx.execute(statement("forget_views"), &[&instance, &consumers])
        .await?;
    if !views.is_empty() {
        tx.execute(
            statement("report_views"),
            &[&instance, &consumers, &states, &attempts, &details],
        )
        .await?;
    }
    tx.commit().await
}

/// A clean stop: the process's rows go.
pub async fn leave(
    client: &impl GenericClient,
    instance: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(statement("leave"), &[&instance])
        .await
        .map(drop)
}

/// A process as readers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
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

/// Every process and what it reports.
pub async fn read(client: &impl GenericClient) -> Result<Vec<Process>, tokio_postgres::Error> {
    let rows = client.query(statement("read"), &[]).await?;
    let mut out: Vec<Process> = Vec::new();
    for r in rows {
        let instance: String = r.get(0);
        if out.last().is_none_or(|p| p.instance != instance) {
            out.push(Process {
                instance,
                started_at: r.get(1),
                seen_at: r.get(2),
                fresh: r.get(3),
                views: Vec::new(),
            });
        }
        let consumer: Option<String> = r.get(4);
        let state: Option<String> = r.get(5);
        if let (Some(consumer), Some(state), Some(process)) = (
            consumer,
            state.as_deref().and_then(RunState::parse),
            out.last_mut(),
        ) {
            process.views.push(ProcessView {
                consumer,
                state,
                since: r.get(6),
                attempts: r.get(7),
                detail: r.get(8),
            });
        }
    }
    Ok(out)
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
}
