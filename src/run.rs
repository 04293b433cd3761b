//! `projector run`: consume the topic into the live version of every selected view until
//! SIGINT or SIGTERM, following cutovers without a restart.

use std::sync::Arc;

use anyhow::Context;
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::{resolve, RunArgs};

/// Consumes the topic into the views of `registry` that the configuration selects, until
/// SIGINT or SIGTERM.
pub async fn run(
    args: RunArgs,
    database_url: Option<String>,
    registry: &Registry,
) -> anyhow::Result<()> {
    // Signals are caught from the start: a SIGTERM during start-up still stops cleanly.
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(wait_for_signal(shutdown.clone()));
    let no_migrate = args.no_migrate;
    let config = resolve(args, database_url)?;
    let views = registry.select(&config.views)?;
    let pool = projector_engine::db::pool(&config.database_url, config.pool_size)?;
    if !no_migrate {
        let mut client = pool
            .get()
            .await
            .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
        projector_engine::migrate(&mut client, registry).await?;
    }
    // The selected names must exist; which of their versions run is the registry's to say.
    let names: Vec<String> = views
        .iter()
        .map(|v| v.name().to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    tracing::info!(views = ?names, topic = %config.kafka.topic, "starting");
    let options = LiveOptions {
        names,
        owner: config.kafka.instance_id.clone(),
        ..LiveOptions::default()
    };
    // Kafka with key = account id delivers each account's events in order through one
    // partition: the live service reads with per-account ordering.
    let result = run_live(
        registry.clone(),
        pool,
        config.kafka,
        Arc::new(NoObserver),
        shutdown,
        options,
    )
    .await;
    signals.abort();
    match result {
        Ok(()) => {
            eprintln!("projector: stopped; in-flight batches committed or rolled back");
            Ok(())
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            anyhow::bail!("{} view(s) stopped with errors", errors.len())
        }
    }
}

/// Cancels `shutdown` at the first SIGINT or SIGTERM.
pub async fn wait_for_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("signal received; finishing in-flight batches");
    shutdown.cancel();
}
