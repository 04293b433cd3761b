//! `projector run`: consume the topic into the live version of every selected view until
//! SIGINT or SIGTERM, following cutovers without a restart.

use std::sync::Arc;

use anyhow::Context;
use projector_engine::kafka::source::NoObserver;
use projector_engine::kafka::supervisor::{run_live, LiveOptions};
use projector_engine::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::{resolve, MetricsAddr, RunArgs};

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
    let notify = !args.no_notify;
    let config = resolve(args, database_url)?;
    let views = registry.select(&config.views)?;
    // Before any view starts: the engine's counters register with the recorder installed
    // here, and a port already taken stops the process before it consumes anything.
    let endpoint = match config.metrics_addr {
        MetricsAddr::At(addr) => {
            let listener = crate::serve::bind(addr).await?;
            let ttl = (config.monitor_interval * 3).max(std::time::Duration::from_secs(60));
            let handle = crate::serve::install_recorder(ttl)?;
            Some((listener, handle))
        }
        MetricsAddr::Off => None,
    };
    let pool = projector_engine::db::pool(&config.database_url, config.pool_size)?;
    {
        let mut client = pool
            .get()
            .await
            .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
        if no_migrate {
            // Migrating checks it first; without it, a database that cannot hold an event's
            // text must still be refused before a view consumes and retries it for ever.
            projector_engine::schema::check_encoding(&client).await?;
        } else {
            projector_engine::migrate(&mut client, registry).await?;
        }
    }
    // The selected names must exist; which of their versions run is the registry's to say.
    let names: Vec<String> = views
        .iter()
        .map(|v| v.name().to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    tracing::info!(views = ?names, topic = %config.kafka.topic, "starting");
    // What the supervisor runs, handed to the monitor too: this process's health judges what
    // it knows now, whether or not its heartbeat reaches PostgreSQL.
    let local = projector_engine::processes::Local::new(
        config
            .kafka
            .instance_id
            .clone()
            .unwrap_or_else(projector_engine::processes::default_instance),
    );
    let monitoring = match endpoint {
        Some((listener, handle)) => Some(
            start_monitoring(
                listener,
                handle,
                &config,
                &names,
                local.clone(),
                shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let options = LiveOptions {
        names,
        owner: config.kafka.instance_id.clone(),
        local: Some(local),
        notify,
        ..LiveOptions::default()
    };
    // Kafka with key = account id delivers each account's events in order through one
    // partition: the live service reads with per-account ordering.
    run_live(
        registry.clone(),
        pool,
        config.kafka,
        Arc::new(NoObserver),
        shutdown,
        options,
    )
    .await;
    signals.abort();
    if let Some(tasks) = monitoring {
        // run_live returned: its views stopped, so the endpoint goes too.
        tasks.stop.cancel();
        for t in tasks.handles {
            let _ = t.await;
        }
    }
    eprintln!("projector: stopped; in-flight batches committed or rolled back");
    Ok(())
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

/// The monitor and the endpoint of a running process.
struct Monitoring {
    stop: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts the periodic status snapshot (gauges, health) and serves `/metrics`, `/health`
/// and `/status`.
async fn start_monitoring(
    listener: tokio::net::TcpListener,
    handle: metrics_exporter_prometheus::PrometheusHandle,
    config: &crate::config::Resolved,
    names: &[String],
    local: projector_engine::processes::Local,
    shutdown: CancellationToken,
) -> anyhow::Result<Monitoring> {
    use projector_engine::kafka::log::{LogReader, Reading};
    use projector_ops::monitor::{run_monitor, Assessment, MonitorOptions};
    use projector_ops::{HealthRule, StatusOptions};
    let stop = shutdown.child_token();
    let addr = listener
        .local_addr()
        .context("the metrics endpoint's address")?;
    // Its own pool: a busy apply path never delays the health check.
    let pool = projector_engine::db::pool(&config.database_url, 2)?;
    let probe = Arc::new(LogReader::connect(
        &config.kafka,
        std::time::Duration::from_secs(5),
        Reading::Samples,
    )?);
    let options = MonitorOptions {
        status: StatusOptions {
            names: names.to_vec(),
            rule: HealthRule {
                stall_after: config.stall_after,
                ..HealthRule::default()
            },
            parked_limit: 10,
            sample: None,
            local: Some(local),
        },
        interval: config.monitor_interval,
        timeout: std::time::Duration::from_secs(30).max(config.monitor_interval),
    };
    let max_age = options.interval * 3 + options.timeout;
    let (tx, rx) = tokio::sync::watch::channel(Assessment::pending());
    let monitor = tokio::spawn(run_monitor(pool, probe, options, stop.clone(), tx));
    let server = tokio::spawn(crate::serve::serve(
        listener,
        crate::serve::Endpoint {
            metrics: handle,
            health: rx,
            max_age,
        },
        stop.clone(),
    ));
    tracing::info!(%addr, "serving /metrics, /health and /status");
    eprintln!("projector: metrics on http://{addr}/metrics, health on http://{addr}/health");
    Ok(Monitoring {
        stop,
        handles: vec![monitor, server],
    })
}
