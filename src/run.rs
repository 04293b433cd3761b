//! `projector run`: consume the topic into every selected view until SIGINT or SIGTERM.

use std::sync::Arc;

use anyhow::Context;
use projector_engine::kafka::source::{run_views, NoObserver};
use projector_engine::{Applier, Registry, SourceOrdering};
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
    // Kafka with key = account id delivers each account's events in order through one
    // partition: the source declares per-account ordering.
    let owner = config.kafka.instance_id.clone();
    let appliers = views
        .into_iter()
        .map(|v| {
            let applier = Applier::new(v, SourceOrdering::PerAccount)?;
            Ok(Arc::new(match &owner {
                Some(id) => applier.owned_by(id.clone()),
                None => applier,
            }))
        })
        .collect::<Result<Vec<_>, projector_engine::ViewError>>()?;
    let names: Vec<&str> = appliers.iter().map(|a| a.consumer()).collect();
    tracing::info!(views = ?names, topic = %config.kafka.topic, "starting");
    eprintln!(
        "projector: consuming {} into {}",
        config.kafka.topic,
        names.join(", ")
    );

    let result = run_views(appliers, pool, config.kafka, Arc::new(NoObserver), shutdown).await;
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

async fn wait_for_signal(shutdown: CancellationToken) {
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
