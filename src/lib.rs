//! The `projector` command line as a library: every subcommand, for any set of views.
//!
//! "New views are added as plugins": a team with views of its own writes a binary of a few
//! lines that hands [`main`] its registry, and gets every command (`run`, `migrate`,
//! `views`, `demo`, ...) for those views, with the same flags, output and exit codes as
//! `projector`. `src/main.rs` is that binary for the built-in views;
//! `examples/custom_views.rs` is one for the built-ins plus a view of its own:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     projector::main(projector_views::registry)
//! }
//! ```
//!
//! Each subcommand parses its flags and calls into the library crates (`projector-engine`,
//! `projector-devkit`, `projector-bench`); the work is done there.
//!
//! # Layout
//!
//! - this file: the command line ([`main`]), logging, the runtime, exit codes.
//! - [`run`]: `projector run`, the topic into the views until SIGINT or SIGTERM.
//! - [`config`]: `run`'s flags, environment and TOML file, resolved.
//! - [`migrate`]: `projector migrate`, the engine's schema and every view's tables.
//! - [`views`]: `projector views`, the registered views and their state.
//! - [`demo`]: `projector demo`, the whole story in one command: a write side, the dev
//!   broker, two engine processes (one joins, one is killed), a rebuild while live, and a
//!   reconciliation of every view against the write side.
//! - [`publish`]: `projector publish`, JSON lines to Kafka.
//! - [`dev_broker`]: `projector dev-broker`, a local Kafka broker.
//! - [`bench`]: `projector bench`, the flags and output of the benchmark.
//! - [`dlq`]: `projector dlq` and `projector parked`: dead letters and parked accounts,
//!   listed, shown, retried or skipped.
//! - [`rebuild`]: `projector rebuild`, `verify`, `cutover` and `retire`: a view rebuilt into a
//!   new version while live.
//! - [`simulate`]: `projector simulate`, a write side producing events to Kafka: idempotent
//!   intake, an outbox relay that crashes on purpose, hot accounts.
//! - [`sql_views`]: `--views-dir`, views written as `.sql` files, loaded and checked beside
//!   the compiled ones; `projector views check DIR`.
//! - [`status`]: `projector status`, every view version's state, lag and problems; exits 1
//!   when unhealthy.
//! - [`inbox`]: `projector inbox prune`, inbox retention in batches.
//! - [`reconcile`]: `projector reconcile`, the write side against a view per time window.
//! - [`serve`]: `run`'s endpoint: `/metrics`, `/health`, `/status`.
//! - [`logging`]: text or JSON logs, with every known secret scrubbed.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use projector_engine::{Registry, ViewError};

pub mod bench;
pub mod config;
pub mod demo;
pub mod dev_broker;
pub mod dlq;
pub mod inbox;
pub mod logging;
pub mod migrate;
pub mod publish;
pub mod rebuild;
pub mod reconcile;
pub mod run;
pub mod serve;
pub mod simulate;
pub mod sql_views;
pub mod status;
pub mod views;

/// Exactly-once CQRS projections from Kafka into PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "projector", version, about)]
struct Cli {
    /// PostgreSQL URL, libpq's form; `sslmode` decides TLS. Never logged.
    /// [default: postgres://postgres@127.0.0.1:5432/projector]
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,

    /// Log lines as human-readable text or as JSON objects (stderr; `PROJECTOR_LOG` filters).
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,

    /// A directory of views written as `.sql` files, loaded beside the compiled ones by every
    /// command that loads the views (docs/sql-views.md). `run` also reads `views_dir` from
    /// its --config file.
    #[arg(long, global = true, env = "PROJECTOR_VIEWS_DIR")]
    views_dir: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the engine's schema and every registered view's tables; safe to repeat.
    Migrate,
    /// List the registered views: versions, state, dedup mode, subscribed event types;
    /// `views check DIR` runs a directory of SQL views through the conformance suite.
    Views(views::Args),
    /// The whole story in one command, without Kafka or configuration: a write side, two
    /// engine processes (one joins, one is killed), a rebuild while live, a reconciliation.
    Demo(demo::Args),
    /// Consume a Kafka topic into the views until SIGINT or SIGTERM.
    Run(config::RunArgs),
    /// Publish JSON-lines events to Kafka, keyed and partitioned like the Java client.
    Publish(publish::Args),
    /// Serve librdkafka's mock cluster as a local Kafka broker for development.
    DevBroker(dev_broker::Args),
    /// Measure throughput, catch-up and latency against a naive consumer and a plain-SQL
    /// ceiling, on the dev broker and a scratch database of the --database-url server.
    Bench(bench::Args),
    /// Rebuild a view into a new version while the live stream keeps flowing; resumable.
    Rebuild(rebuild::Args),
    /// Compare two versions of a view row by row; exits 1 when they differ.
    Verify(rebuild::VerifyArgs),
    /// Make a version of a view the live one: the stable read name points at it.
    Cutover(rebuild::CutoverArgs),
    /// Retire a version of a view that is not live, and optionally drop it.
    Retire(rebuild::RetireArgs),
    /// Dead letters: list, show, retry from the stored bytes, skip (recorded).
    #[command(subcommand)]
    Dlq(dlq::Dlq),
    /// Parked accounts: list, retry, skip a lost seq (recorded).
    #[command(subcommand)]
    Parked(dlq::Parked),
    /// Run a write side that produces events to Kafka: clients with idempotency keys, one
    /// transaction per event with an outbox row, a relay that crashes on purpose.
    Simulate(simulate::Args),
    /// Show every view version's state, lag, throughput, duplicates, dead letters, parked
    /// accounts and the inbox; exits 1 when unhealthy.
    Status(status::Args),
    /// Inbox housekeeping.
    #[command(subcommand)]
    Inbox(inbox::Command),
    /// Compare the write side's counts and sums with a view's per time window; exits 1
    /// naming the windows that differ beyond the threshold.
    Reconcile(reconcile::Args),
}

/// Runs the command line of the process's arguments with the views `registry` builds, and
/// returns the exit code: 0 on success, 1 when the command failed (the error is on standard
/// error, one line), 2 when the arguments are wrong.
///
/// `registry` is called once, by the commands that use views (not by `publish`,
/// `dev-broker`, `bench` or `simulate`, nor for `--help`); a registry that refuses a view is an error of
/// those commands.
pub fn main(registry: impl FnOnce() -> Result<Registry, ViewError>) -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line that says what to fix; --help has the rest.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("{first} (see `projector --help`)");
            return ExitCode::from(2);
        }
    };
    if let Some(url) = &cli.database_url {
        logging::redact_url(url);
    }
    logging::init(cli.log_format);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let url = || {
            cli.database_url
                .clone()
                .unwrap_or_else(|| config::DEFAULT_DATABASE_URL.to_owned())
        };
        let dir = cli.views_dir.clone();
        // The compiled views, with the SQL views of --views-dir beside them, checked against
        // the database before the command does anything.
        match cli.command {
            Command::Migrate => {
                migrate::run(
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                )
                .await
            }
            Command::Views(args) => match args.command {
                Some(views::Check::Check(check)) => {
                    if sql_views::check_dir(&registry()?, check, &url()).await? {
                        Ok(())
                    } else {
                        Err(anyhow::anyhow!(
                            "a SQL view failed the conformance suite (see above)"
                        ))
                    }
                }
                None => {
                    views::run(
                        &url(),
                        &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                    )
                    .await
                }
            },
            Command::Demo(args) => {
                if let Some(dir) = &dir {
                    anyhow::bail!(
                        "demo runs the views compiled into this binary against its own write side; drop --views-dir {} (or PROJECTOR_VIEWS_DIR) for it",
                        dir.display()
                    );
                }
                demo::run(cli.database_url.clone(), &registry()?, args).await
            }
            Command::Run(args) => {
                // `views_dir` and `database_url` may come from the config file.
                let file = config::File::load_opt(args.config.as_deref())?;
                let dir = dir.or(file.views_dir.clone());
                let run_url = cli
                    .database_url
                    .clone()
                    .or(file.database_url.clone())
                    .unwrap_or_else(|| config::DEFAULT_DATABASE_URL.to_owned());
                let registry = sql_views::registry(registry()?, dir.as_deref(), &run_url).await?;
                run::run(args, cli.database_url.clone(), &registry).await
            }
            Command::Publish(args) => publish::run(args).await,
            Command::DevBroker(args) => dev_broker::run(args).await,
            Command::Bench(args) => bench::run(args, &url()).await,
            Command::Rebuild(args) => {
                rebuild::run(
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                    args,
                )
                .await
            }
            Command::Verify(args) => {
                if rebuild::run_verify(
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                    args,
                )
                .await?
                {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("the versions differ"))
                }
            }
            Command::Cutover(args) => {
                rebuild::run_cutover(
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                    args,
                )
                .await
            }
            Command::Retire(args) => {
                rebuild::run_retire(
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                    args,
                )
                .await
            }
            Command::Dlq(command) => {
                dlq::run_dlq(
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                    command,
                )
                .await
            }
            Command::Parked(command) => {
                dlq::run_parked(
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                    command,
                )
                .await
            }
            Command::Simulate(args) => simulate::run(args, &url()).await,
            Command::Status(args) => {
                if status::run(args, cli.database_url.clone()).await? {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("unhealthy: a problem pages (see above)"))
                }
            }
            Command::Inbox(command) => inbox::run(command, cli.database_url.clone()).await,
            Command::Reconcile(args) => {
                if reconcile::run(
                    args,
                    &url(),
                    &sql_views::registry(registry()?, dir.as_deref(), &url()).await?,
                )
                .await?
                {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("the view differs from the source"))
                }
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", logging::scrub(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
