//! Rebuilding a view into a new version while the live stream keeps flowing.
//!
//! An engineer fixes a view's logic or schema, or finds a view stuck on events the log no
//! longer has, and rebuilds it without stopping anything:
//!
//! 1. **Register** version N as `building` with its own tables, under its own consumer name
//!    (`<view>_vN`): its own inbox rows, offsets and dead letters, so the version being
//!    replaced never shares anything with it.
//! 2. **Seed** from the write side's snapshot ([`seed`]), or start from the earliest
//!    retained offsets after checking that the log still starts at every account's first
//!    event ([`log`]).
//! 3. **Tail** the topic under its own consumer group, within a budget (connections and a
//!    rate), while the live version keeps serving; pausable, resumable, cancellable, and
//!    resumed by running the same command again after a crash at any moment: everything it
//!    did is in PostgreSQL, in the same transactions as its rows.
//! 4. **Cut over** ([`cutover`]) once the lag is under a threshold, or when an engineer says
//!    so: the stable read name points at N, N is `live`, the old version `retired`, in one
//!    transaction; running services follow without a restart.
//!
//! # Layout
//!
//! - this file: [`rebuild`], the command's orchestration, and its [`Options`].
//! - [`state`]: the registry rows a rebuild reads and writes.
//! - [`seed`]: seeding from a snapshot in one transaction.
//! - [`log`]: the Kafka log's partitions, watermarks, offsets by time, and its start.
//! - [`tail`]: the budgeted tail and its progress ([`tail::Status`]).
//! - [`cutover`]: cutover, retirement, dropping and cancelling.
//! - [`verify`]: comparing two versions row by row.
//! - [`error`]: [`RebuildError`], one line each.

pub mod cutover;
pub mod error;
pub mod log;
pub mod seed;
pub mod state;
pub mod tail;
pub mod verify;

use std::sync::Arc;
use std::time::Duration;

use projector_engine::db::{self, Settings};
use projector_engine::fingerprint;
use projector_engine::kafka::running::{self, Session};
use projector_engine::kafka::source::KafkaConfig;
use projector_engine::projection::render;
use projector_engine::versions::{self, VersionState};
use projector_engine::{Projection, Registry};
use tokio_util::sync::CancellationToken;

pub use cutover::CutoverReport;
pub use error::RebuildError;
pub use state::{Cutover, Source};
pub use tail::{Progress, Status};

use error::db as db_err;

/// How a rebuild runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The view to rebuild.
    pub view: String,
    /// The version to build; `None`: the one a rebuild under way is building, else the next
    /// free one.
    pub to_version: Option<i32>,
    /// Where to seed from.
    pub source: Source,
    /// Who cuts over.
    pub cutover: Cutover,
    /// Cut over automatically once the total lag is at most this many messages.
    pub cutover_lag: i64,
    /// The tail starts at the offsets of the snapshot's time minus this.
    pub margin: Duration,
    /// Build from earliest even when the log no longer starts at every account's first event.
    pub allow_gaps: bool,
    /// PostgreSQL connections the rebuild may use.
    pub connections: usize,
    /// At most this many messages a second (`None`: as fast as the budget allows).
    pub max_rate: Option<u32>,
    /// Messages per batch. A rebuild writes tables nobody reads yet and could batch larger,
    /// but measured (`docs/benchmarks.md`) larger batches were not faster: 2,000 (the live
    /// default) beat 10,000 in every run, and 50,000 was slower still; measured again once
    /// portfolio folded a batch in one statement, 10,000 applied no faster than 2,000 and
    /// 30,000 slower ("Rebuild: the bulk path"). Any size is exact.
    pub batch_messages: usize,
    /// How often progress is measured and the registry looked at (pause, cancel, cutover).
    pub tick: Duration,
}

impl Options {
    /// The defaults for a view.
    pub fn new(view: impl Into<String>) -> Self {
        Self {
            view: view.into(),
            to_version: None,
            source: Source::Snapshot,
            cutover: Cutover::Auto,
            cutover_lag: 100,
            margin: Duration::from_secs(300),
            allow_gaps: false,
            connections: 2,
            max_rate: None,
            batch_messages: 2_000,
            tick: Duration::from_secs(1),
        }
    }
}

/// How a rebuild ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Cut over: the new version is live.
    CutOver(CutoverReport),
    /// Stopped before cutover (a signal, or someone else cut over); run the same command
    /// again to resume.
    Stopped {
        /// The version being built.
        version: i32,
    },
    /// Cancelled: what it built was dropped.
    Cancelled {
        /// The version that was being built.
        version: i32,
    },
}

/// Runs (or resumes) the rebuild of `options.view` until it cuts over, is cancelled, or
/// `shutdown` is cancelled. `url` is the database; `kafka` says where the topic is.
pub async fn rebuild(
    registry: &Registry,
    url: &str,
    kafka: KafkaConfig,
    options: &Options,
    progress: &dyn Progress,
    shutdown: CancellationToken,
) -> Result<Outcome, RebuildError> {
    let name = options.view.as_str();
    // A rebuild writes tables nobody reads yet: a commit need not wait for its WAL to reach
    // disk. A crash of PostgreSQL may lose the last few commits, rows, inbox and offsets
    // together, and the tail resumes from what survived: the result is still exact.
    let settings = Settings {
        max_size: options.connections.max(1) + 1,
        session: vec![("synchronous_commit".to_owned(), "off".to_owned())],
        ..Settings::default()
    };
    let pool = db::pool_with(url, &settings).map_err(|e| RebuildError::Connect(e.to_string()))?;
    let mut client = pool
        .get()
        .await
        .map_err(|e| RebuildError::Connect(e.to_string()))?;

    let (version, source) = target(&client, registry, options).await?;
    let code = registry.code_for(name, version)?;
    // Resuming a version another binary registered: its code must be this one's.
    fingerprint::check(&client, &*code).await?;
    // Held until the rebuild returns: a cancel (or any drop of this version) waits for it,
    // so nothing this rebuild commits outlives the drop.
    let mut holding = Some(hold(&pool, &code).await?);
    let snapshot_sql = match source {
        Source::Snapshot => Some(
            code.snapshot_sql()
                .ok_or_else(|| RebuildError::NoSnapshot(name.to_owned()))?,
        ),
        Source::Earliest => None,
    };
    register(&mut client, &code, source, options.cutover).await?;
    progress.message(&format!(
        "rebuilding {name} into v{version} from {}",
        source.as_str()
    ));

    if state::of_version(&client, name, version)
        .await?
        .is_some_and(|r| r.phase == "seeding")
    {
        match &snapshot_sql {
            Some(sql) => {
                progress.message("taking the snapshot");
                let seeded = match seed::from_snapshot(
                    &mut client,
                    &code,
                    sql,
                    &kafka,
                    options.margin,
                )
                .await
                {
                    Ok(seeded) => seeded,
                    Err(e) => {
                        // Seeding is one transaction: nothing was built. A snapshot that
                        // cannot be taken (the write side's tables are not reachable, a
                        // statement of the wrong shape) leaves no half-registered version
                        // behind. A transient failure does not cancel: a lost connection
                        // (08), a server shutting down (57P), a serialization failure or
                        // deadlock (40: a `--pause` or `--cancel` updated the rebuild's row
                        // while the snapshot ran; a cancel then stays a cancel). The same
                        // command resumes it.
                        let transient = |c: &str| {
                            c.starts_with("08") || c.starts_with("40") || c.starts_with("57P")
                        };
                        let for_good = match &e {
                            RebuildError::Database { error, .. } => {
                                error.code().is_some_and(|c| !transient(c.code()))
                            }
                            RebuildError::SnapshotColumns(_) => true,
                            _ => false,
                        };
                        if for_good {
                            drop(holding.take());
                            cutover::cancel(&mut client, registry, name).await?;
                        }
                        return Err(e);
                    }
                };
                progress.message(&format!(
                    "snapshot taken at {}: {} account(s) seeded; tail from {}",
                    seeded.taken_at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
                    seeded.accounts,
                    seeded
                        .offsets
                        .iter()
                        .map(|(p, o)| format!("{p}@{o}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                ));
            }
            None => {
                if !options.allow_gaps {
                    progress.message("checking that the log starts at every account's first event");
                    let config = kafka.clone();
                    let start = tokio::task::spawn_blocking(move || {
                        log::check_start(&log::connect(&config)?)
                    })
                    .await
                    .map_err(|e| RebuildError::Tail(e.to_string()))??;
                    if !start.is_complete() {
                        let partitions = start
                            .trimmed
                            .iter()
                            .map(|e| format!("{} (from offset {})", e.partition, e.low))
                            .collect::<Vec<_>>();
                        let mut detail = Vec::new();
                        if !partitions.is_empty() {
                            detail.push(format!(
                                "retention trimmed partition(s) {}",
                                partitions.join(", ")
                            ));
                        }
                        detail.push(format!(
                            "{} account(s) start past seq 1",
                            start.accounts_past_first
                        ));
                        // Nothing is kept of a rebuild that must not start.
                        drop(holding.take());
                        cutover::cancel(&mut client, registry, name).await?;
                        return Err(RebuildError::LogTrimmed {
                            detail: detail.join("; "),
                        });
                    }
                }
                // Only from `seeding`: a cancel that came meanwhile stays a cancel.
                state::tailing(&client, name, version)
                    .await
                    .map_err(db_err("starting the tail"))?;
            }
        }
    }
    drop(client);
    let outcome = match holding.as_mut() {
        Some(session) => {
            let held = tail::Held {
                code: &code,
                session,
            };
            tail::run(registry, &pool, kafka, options, held, progress, shutdown).await
        }
        None => Ok(Outcome::Cancelled { version }),
    };
    // Every batch of the tail has committed or rolled back: a drop may go ahead.
    drop(holding);
    outcome
}

/// Holds the version's running lock ([`running`]) on a session of its own; refused while
/// the version is being dropped.
async fn hold(
    pool: &deadpool_postgres::Pool,
    code: &Arc<dyn Projection>,
) -> Result<Session, RebuildError> {
    let session = Session::open(pool)
        .await
        .map_err(|e| RebuildError::Connect(e.to_string()))?;
    if running::try_hold(session.client(), &code.consumer())
        .await
        .map_err(db_err("taking the running lock"))?
    {
        Ok(session)
    } else {
        Err(RebuildError::Refused(format!(
            "{} v{} is being dropped (a cancel or a retire --drop is under way); run this again once it has finished",
            code.name(),
            code.version()
        )))
    }
}

/// The version to build and where from: the rebuild under way, else the next free version.
async fn target(
    client: &deadpool_postgres::Client,
    registry: &Registry,
    options: &Options,
) -> Result<(i32, Source), RebuildError> {
    let name = options.view.as_str();
    // Fails early, in one line, for a name the binary does not know.
    registry.select(&[name.to_owned()])?;
    if let Some(r) = state::unfinished(client, name).await? {
        if options.to_version.is_some_and(|v| v != r.version) {
            return Err(RebuildError::Refused(format!(
                "a rebuild of {name} into v{} is under way; resume it (without --to-version, or with --to-version {}) or cancel it with `projector rebuild {name} --cancel`",
                r.version, r.version
            )));
        }
        if r.source != options.source {
            return Err(RebuildError::Refused(format!(
                "the rebuild of {name} into v{} under way seeds from {}; resume it --from {} or cancel it",
                r.version,
                r.source.as_str(),
                r.source.as_str()
            )));
        }
        return Ok((r.version, r.source));
    }
    let versions = state::versions(client, name).await?;
    let version = match options.to_version {
        Some(v) => {
            if v < 1 {
                return Err(RebuildError::Refused(format!(
                    "--to-version must be 1 or more, got {v}"
                )));
            }
            if let Some(row) = versions.iter().find(|r| r.version == v) {
                if row.state != VersionState::Building || row.dropped {
                    return Err(RebuildError::Refused(format!(
                        "{name} v{v} is {}; rebuild into a new version (the next free one is v{})",
                        row.state,
                        versions.iter().map(|r| r.version).max().unwrap_or(0) + 1
                    )));
                }
            }
            v
        }
        // A version registered as building (both versions compiled in, `migrate` installed
        // the new one) is the one to build; else the next free number.
        None => versions
            .iter()
            .filter(|r| r.state == VersionState::Building && !r.dropped)
            .map(|r| r.version)
            .max()
            .unwrap_or_else(|| versions.iter().map(|r| r.version).max().unwrap_or(0) + 1),
    };
    Ok((version, options.source))
}

/// Registers the version as `building` with its tables, and its rebuild row; both idempotent.
async fn register(
    client: &mut deadpool_postgres::Client,
    code: &Arc<dyn Projection>,
    source: Source,
    cutover: Cutover,
) -> Result<(), RebuildError> {
    let tx = client
        .transaction()
        .await
        .map_err(db_err("registering the version"))?;
    tx.batch_execute(&render(&**code, &code.ddl()))
        .await
        .map_err(db_err("creating the version's tables"))?;
    versions::register_building(&tx, code.name(), code.version(), &fingerprint::of(&**code))
        .await
        .map_err(db_err("registering the version"))?;
    // Registered by another binary a moment ago (the check before was not under this lock):
    // its code must be this one's.
    let recorded = versions::lock_fingerprint(&tx, code.name(), code.version())
        .await
        .map_err(db_err("registering the version"))?;
    match recorded {
        Some(recorded) => {
            fingerprint::judge(&**code, Some(&recorded))?;
        }
        None => {
            return Err(fingerprint::CodeError::Unrecorded {
                name: code.name().to_owned(),
                version: code.version(),
            }
            .into())
        }
    }
    state::start(&tx, &**code, source, cutover)
        .await
        .map_err(db_err("recording the rebuild"))?;
    tx.commit().await.map_err(db_err("registering the version"))
}
