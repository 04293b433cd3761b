//! The rebuild phases: a new portfolio version built from the earliest offsets of a full topic
//! by the rebuild crate, exactly as `projector rebuild portfolio --from earliest` does (its
//! log check, its budget of connections, its batch size, its asynchronous commits).
//!
//! The bench keeps the cutover to itself (manual cutover): it watches the version's offsets
//! and stops the rebuild once every partition is consumed, so that no other version of the
//! scratch database is retired (a retired portfolio version would stop emitting notices and
//! change what later phases do). Once its rows are checked, [`drop_version`] cancels the
//! rebuild, which drops what it built: one rebuild of a view at a time.
//!
//! Two times: the whole command, from the call to the last commit (its log check, which reads
//! the whole topic, and its consumer group's start included), and the tail, from the `BEGIN`
//! of its first batch to its last commit, both read on the server's clock: the first batch's
//! inbox rows carry its transaction's start (`applied_at` defaults to `now()`), and the watch
//! reads `clock_timestamp()` when it finds every offset committed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::{Projection as _, Registry};
use projector_rebuild::{Cutover, Outcome, Progress, Source, Status};
use projector_views::Portfolio;
use tokio_util::sync::CancellationToken;

use crate::error::{stop, BenchError, Doing as _};

/// How often the bench looks at the version's offsets for the end of the rebuild.
const POLL: Duration = Duration::from_millis(20);
/// How long a rebuild may take before the bench gives up on it.
const TIMEOUT: Duration = Duration::from_secs(600);

/// How the rebuild runs: `projector rebuild`'s defaults unless the bench's flags say
/// otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// `--max-connections`.
    pub connections: usize,
    /// `--batch-messages`.
    pub batch_messages: usize,
}

/// What a rebuild measured.
pub struct Rebuilt {
    /// When the rebuild was started.
    pub started: Instant,
    /// When its last offset was committed (seen by the watch, at most [`POLL`] late).
    pub finished: Instant,
    /// From the start of its first batch's transaction to its last commit.
    pub tail: Duration,
}

impl Rebuilt {
    /// The whole command.
    pub fn elapsed(&self) -> Duration {
        self.finished.saturating_duration_since(self.started)
    }
}

/// Progress lines on standard error, a few of them.
struct Lines {
    label: String,
    last: std::sync::Mutex<Option<Instant>>,
}

impl Progress for Lines {
    fn message(&self, line: &str) {
        eprintln!("  {}: {line}", self.label);
    }

    fn status(&self, status: &Status) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(5)) {
            return;
        }
        *last = Some(Instant::now());
        eprintln!(
            "  {}: {} events applied, lag {}, {} messages/s",
            self.label,
            status.applied,
            status.lag(),
            status.rate
        );
    }
}

/// Rebuilds portfolio into `version` from the earliest offsets of `kafka.topic`, which
/// holds `ends` (partition -> end offset), and returns when it started and when its last
/// offset was committed.
pub async fn run(
    label: &str,
    pool: &Pool,
    url: &str,
    kafka: KafkaConfig,
    version: i32,
    ends: &BTreeMap<i32, i64>,
    budget: Budget,
) -> Result<Rebuilt, BenchError> {
    // Any registered version gives the code of another one (`at_version`).
    let registry = Registry::new().register(Portfolio::new(version))?;
    let mut options = projector_rebuild::Options::new("portfolio");
    options.to_version = Some(version);
    options.source = Source::Earliest;
    options.cutover = Cutover::Manual;
    options.connections = budget.connections;
    options.batch_messages = budget.batch_messages;
    let consumer = Portfolio::new(version).consumer();
    let shutdown = CancellationToken::new();
    let progress = Lines {
        label: label.to_owned(),
        last: std::sync::Mutex::new(None),
    };

    let started = Instant::now();
    let watch = async {
        let client = pool.get().await.doing("connecting to PostgreSQL")?;
        let deadline = started + TIMEOUT;
        loop {
            let rows = client
                .query(
                    "SELECT partition, next_offset, clock_timestamp()::text FROM projector.offsets WHERE consumer = $1",
                    &[&consumer],
                )
                .await
                .doing("reading the rebuild's offsets")?;
            let at: BTreeMap<i32, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            let now = Instant::now();
            if ends
                .iter()
                .all(|(p, end)| *end == 0 || at.get(p).is_some_and(|o| o >= end))
            {
                shutdown.cancel();
                let server: String = rows.first().map(|r| r.get(2)).unwrap_or_default();
                return Ok((now, server));
            }
            if shutdown.is_cancelled() {
                stop!("{label}: the rebuild stopped before it consumed the topic");
            }
            if now > deadline {
                shutdown.cancel();
                stop!("{label}: the rebuild did not finish within {TIMEOUT:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    };
    let rebuild =
        projector_rebuild::rebuild(&registry, url, kafka, &options, &progress, shutdown.clone());
    let (finished, outcome) = tokio::join!(watch, async {
        let r = rebuild.await;
        // A rebuild that ends early (an error) must not leave the watch waiting.
        shutdown.cancel();
        r
    });
    match outcome.doing_with(|| format!("phase {label}"))? {
        Outcome::Stopped { .. } => {}
        other => stop!("{label}: the rebuild ended with {other:?} instead of being stopped"),
    }
    let (finished, server_finished) = finished?;
    // Whole microseconds from the first batch's BEGIN to the last commit seen; numeric
    // arithmetic on the server, no floating point here.
    let micros: i64 = pool
        .get()
        .await
        .doing("connecting to PostgreSQL")?
        .query_one(
            "SELECT ceil(extract(epoch FROM ($2::text::timestamptz - min(applied_at))) * 1000000)::bigint \
             FROM projector.inbox WHERE consumer = $1",
            &[&consumer, &server_finished],
        )
        .await
        .doing("reading when the rebuild's first batch started")?
        .get::<_, Option<i64>>(0)
        .unwrap_or(0);
    Ok(Rebuilt {
        started,
        finished,
        tail: Duration::from_micros(micros.max(1).unsigned_abs()),
    })
}

/// Cancels the stopped rebuild of portfolio, which drops the version it built: its tables,
/// inbox rows and offsets. Untimed, after its rows were checked.
pub async fn drop_version(pool: &Pool, version: i32) -> Result<(), BenchError> {
    let registry = Registry::new().register(Portfolio::new(version))?;
    let mut client = pool.get().await.doing("connecting to PostgreSQL")?;
    projector_rebuild::cutover::cancel(&mut client, &registry, "portfolio")
        .await
        .doing_with(|| format!("dropping the rebuilt portfolio v{version}"))?;
    Ok(())
}
