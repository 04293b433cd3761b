//! The benchmark behind `projector bench`: throughput, catch-up and latency of the engine,
//! measured in one run against baselines run in the same process, on the dev broker and the
//! PostgreSQL server of a URL (in a scratch database it creates and drops).
//!
//! The machine this runs on is shared and noisy, so the figures that matter are ratios:
//! the engine against the naive per-event consumer and against the plain-SQL ceiling, all
//! measured minutes apart on the same server. Every phase's rows are compared with the fold
//! of the events it consumed (computed independently in `events`), and its offset and inbox
//! counters checked, so a figure never comes from skipped work.
//!
//! Phases, in order (each after an untimed vacuum and checkpoint, see `settle`):
//!
//! 1. [`Options::repeat`] rounds of three phases, each round on a fresh topic and fresh view
//!    versions; every figure is the best round:
//!    - `engine`: a portfolio version subscribed to an empty topic; the events are then
//!      published as fast as the producer goes while it applies them (live apply); then
//!      again without the read-your-writes notifier;
//!    - `naive` (first round only): the per-event consumer of `naive` on the same topic,
//!      for [`Options::naive_seconds`];
//!    - `ceiling`: the same rows written by the plain SQL of `ceiling`;
//!    - `catch_up`: a new portfolio version reading the full topic from its earliest offset;
//!    - `rebuild`: a new portfolio version built by the rebuild crate from the earliest
//!      offsets, as `projector rebuild portfolio --from earliest` does.
//! 2. [`Options::repeat`] rounds of `engine, all views`: portfolio, risk and eod on a topic
//!    of their own, fed live; then `ceiling, all views`: the three views' rows by plain SQL,
//!    which that phase is read against; each figure is the best round.
//! 3. `latency`: a portfolio version fed at [`Options::latency_rate`]; publish to visible per
//!    event; then `read your writes`: the same feed with readers waiting for their writes in
//!    `projector.wait_applied`.
//! 4. `live during a rebuild`: the latency phase again, on a version of its own, while a
//!    rebuild of the first round's topic runs: publish to visible of the events published
//!    while the rebuild ran.
//! 5. `full inbox`: the inbox filled with [`Options::inbox_rows`] rows of the measured
//!    version (untimed, `COPY`), then the engine phase again; late, because every later
//!    phase would write into the bigger inbox too.
//! 6. `prune while live`: the latency phase's feed while the full inbox's oldest day is
//!    dropped.
//!
//!
//! # Layout
//!
//! - this file: [`run`], and the phases in order.
//! - [`error`]: [`BenchError`], why a run stopped.
//! - `options`: [`Options`], `projector bench`'s flags.
//! - `scratch` (private): the scratch database, created and dropped.
//! - `bench` (private): what the phases share (the event stream, its fold and placement, the
//!   consumers' settings), the untimed `settle` between phases, and the checks of a
//!   version's rows and counters.
//! - `phase` (private): one module per phase, the topics and view versions they use, the
//!   setup before them and the repeated rounds.
//! - `report`: [`Figures`], with their table and JSON forms and the goals.
//! - `numbers` (private): rates, ratios, milliseconds and percentiles in integer arithmetic.
//! - `events` (private): the generator of the event stream, and its fold in integer
//!   arithmetic, independent of the engine and of the views' SQL.
//! - `engine` (private): view versions consuming a dev-broker topic through `run_views`, as
//!   `projector run` does, fed live, at a fixed rate or from a backlog.
//! - `naive` (private): the per-event consumer most teams write first.
//! - `ceiling` (private): the same rows written by the best plain SQL, the upper bound, for
//!   one view or all three.
//! - `rebuild` (private): the rebuild crate's rebuild from earliest, timed to its last commit.
//! - `inbox` (private): millions of inbox rows loaded with `COPY`, for the full-inbox phase.
//! - `check` (private): exactness; every phase's rows against the fold, and its counters.

mod bench;
mod ceiling;
mod check;
mod engine;
pub mod error;
mod events;
mod inbox;
mod naive;
mod numbers;
mod options;
mod phase;
mod rebuild;
mod report;
mod scratch;

use deadpool_postgres::Pool;
use projector_engine::db::url_for_database;

pub use error::BenchError;
pub use options::Options;
pub use report::Figures;

use bench::Bench;
use scratch::Scratch;

/// Runs every phase on the server of `database_url`, in a scratch database of its own that
/// is dropped at the end (unless [`Options::keep_db`]), and returns the figures. Progress
/// goes to standard error. Ctrl-C stops the phases where they are; the scratch database is
/// still dropped.
pub async fn run(options: &Options, database_url: &str) -> Result<Figures, BenchError> {
    options.check()?;
    let scratch = Scratch::create(database_url).await?;
    eprintln!("bench: scratch database {}", scratch.name);
    let url = url_for_database(database_url, &scratch.name)?;
    let result = tokio::select! {
        r = phases(options, &scratch.pool, &url) => r,
        _ = tokio::signal::ctrl_c() => Err(BenchError::Stopped("interrupted".to_owned())),
    };
    if options.keep_db {
        eprintln!("bench: kept the scratch database {}", scratch.name);
    } else {
        if result.is_err() {
            eprintln!(
                "bench: dropping {}; --keep-db keeps it for a look",
                scratch.name
            );
        }
        if let Err(e) = scratch.drop_database().await {
            eprintln!(
                "bench: could not drop {}: {}",
                scratch.name,
                error::chain(&e)
            );
        }
    }
    result
}

/// The phases in the order of this crate's documentation, on the scratch database `pool`
/// (at `url`).
async fn phases(options: &Options, pool: &Pool, url: &str) -> Result<Figures, BenchError> {
    let mut f = Figures {
        events: options.events,
        accounts: options.accounts,
        partitions: options.partitions,
        latency_rate: options.latency_rate,
        inbox_rows: options.inbox_rows,
        ..Figures::default()
    };
    phase::setup::prepare(pool, i32::from(options.repeat), &mut f).await?;
    let broker = phase::setup::broker(options)?;
    let b = Bench::new(options, pool, url, broker.bootstrap_servers())?;
    let budget = rebuild::Budget {
        connections: options.rebuild_connections,
        batch_messages: options.rebuild_batch_messages,
    };
    phase::rounds::portfolio(options, &b, budget, &mut f).await?;
    phase::rounds::all_views(options, &b, &mut f).await?;
    phase::latency::latency(options, &b, &mut f).await?;
    phase::ryw::read_your_writes(options, &b, &mut f).await?;
    phase::rebuild::live_during_rebuild(options, &b, budget, &mut f).await?;
    phase::full_inbox::full_inbox(options, &b, &mut f).await?;
    phase::prune::prune_while_live(options, &b, &mut f).await?;
    drop(broker);
    Ok(f)
}
