//! The `projector` binary: argument parsing and logging only; every subcommand calls into
//! the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod config;
mod demo;
mod dev_broker;
mod migrate;
mod publish;
mod run;
mod views;

/// Exactly-once CQRS projections from Kafka into PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "projector", version, about)]
struct Cli {
    /// PostgreSQL URL, libpq's form; `sslmode` decides TLS. Never logged.
    /// [default: postgres://postgres@127.0.0.1:5432/projector]
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the engine's schema and every registered view's tables; safe to repeat.
    Migrate,
    /// List the registered views: versions, state, dedup mode, subscribed event types.
    Views,
    /// Create a demo database, migrate it and apply the bundled sample events to every view.
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
}

fn main() -> ExitCode {
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PROJECTOR_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

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
        match cli.command {
            Command::Migrate => migrate::run(&url()).await,
            Command::Views => views::run(&url()).await,
            Command::Demo(args) => demo::run(&url(), args).await,
            Command::Run(args) => run::run(args, cli.database_url.clone()).await,
            Command::Publish(args) => publish::run(args).await,
            Command::DevBroker(args) => dev_broker::run(args).await,
            Command::Bench(args) => bench::run(args, &url()).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The registry of compiled-in views.
fn registry() -> anyhow::Result<projector_engine::Registry> {
    Ok(projector_views::registry()?)
}
