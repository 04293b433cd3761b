//! `projector dev-broker`: librdkafka's mock cluster as a local Kafka broker for development
//! and demos. The bootstrap address is the first line of standard output, so scripts can
//! read it (`BROKERS=$(projector dev-broker | head -1)` style, or a test harness); the
//! broker then serves until SIGINT or SIGTERM. Nothing is persisted. Standard error says how
//! to consume from it: the mock cluster needs a shorter fetch wait than a real broker.

use std::io::Write as _;

use anyhow::Context as _;
use projector_devkit::devbroker::{consumer_flags, DevBroker};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Partitions of the topic.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..))]
    partitions: i32,
    /// The topic to create.
    #[arg(long, default_value = "events")]
    topic: String,
    /// Brokers in the cluster.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=9999))]
    brokers_count: i32,
}

/// Serves the mock cluster until SIGINT or SIGTERM; its address is the first line of
/// standard output.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let broker = DevBroker::start(args.brokers_count, &[(&args.topic, args.partitions)])
        .context("cannot start the dev broker")?;
    // Listen before announcing: a harness that reads the address may signal at once.
    let stop = shutdown_signal()?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", broker.bootstrap_servers())
            .and_then(|()| stdout.flush())
            .context("cannot write the bootstrap address to standard output")?;
    }
    eprintln!(
        "dev broker: topic {:?} with {} partitions on {} ({} broker{}); stop with Ctrl-C",
        args.topic,
        args.partitions,
        broker.bootstrap_servers(),
        args.brokers_count,
        if args.brokers_count == 1 { "" } else { "s" },
    );
    // The engine's defaults are a real broker's; this one holds an empty fetch for the whole
    // wait, so a consumer without the flag sees every event a quarter of a second late.
    eprintln!(
        "dev broker: consume with projector run --brokers {} --topic {} {}",
        broker.bootstrap_servers(),
        args.topic,
        consumer_flags()
    );
    stop.await?;
    drop(broker);
    Ok(())
}

/// Resolves at the first SIGINT or SIGTERM. The handlers are installed when this returns,
/// not when the future is first polled.
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        Ok(())
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    Ok(async {
        tokio::signal::ctrl_c()
            .await
            .context("cannot listen for Ctrl-C")
    })
}
