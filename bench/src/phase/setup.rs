//! Before the phases, untimed: the server's version and settings, every view version of the
//! run registered and migrated, the inbox's days made, and the dev broker with every topic.

use deadpool_postgres::Pool;
use projector_devkit::devbroker::DevBroker;
use projector_engine::Registry;
use projector_views::{Eod, Portfolio, Risk};

use super::{
    TOPIC, TOPIC_ALL, TOPIC_FULL_INBOX, TOPIC_LATENCY, TOPIC_PRUNE_LIVE, TOPIC_REBUILD_LIVE,
    TOPIC_RYW, V_ALL, V_CATCH_UP, V_CEILING, V_CEILING_ALL, V_ENGINE, V_FULL_INBOX, V_LATENCY,
    V_NAIVE, V_NO_NOTIFY, V_PLACEHOLDER, V_PRUNE_LIVE, V_REBUILD_LIVE, V_RYW,
};
use crate::error::{stop, BenchError, Doing as _};
use crate::{events, Figures, Options};

/// The server's version and settings into `f`; every view version of `repeats` rounds
/// registered and migrated; the inbox's days of the bench's events made.
pub(crate) async fn prepare(pool: &Pool, repeats: i32, f: &mut Figures) -> Result<(), BenchError> {
    let mut client = pool.get().await?;
    f.server = client
        .query_one("SHOW server_version", &[])
        .await?
        .get::<_, String>(0);
    f.settings = client
        .query_one(
            "SELECT string_agg(name || ' ' || current_setting(name), ', ' ORDER BY n) \
                 FROM unnest(ARRAY['shared_buffers', 'max_wal_size', 'checkpoint_timeout', \
                 'wal_compression', 'synchronous_commit']) WITH ORDINALITY AS s(name, n)",
            &[],
        )
        .await
        .doing("reading the server's settings")?
        .get::<_, String>(0);
    let mut registry = Registry::new()
        .register(Portfolio::new(V_PLACEHOLDER))?
        .register(Risk::new(V_PLACEHOLDER))?
        .register(Eod::new(V_PLACEHOLDER))?
        .register(Portfolio::new(V_LATENCY))?
        .register(Portfolio::new(V_NAIVE))?
        .register(Portfolio::new(V_FULL_INBOX))?
        .register(Portfolio::new(V_REBUILD_LIVE))?
        .register(Portfolio::new(V_PRUNE_LIVE))?
        .register(Portfolio::new(V_RYW))?;
    for r in 0..repeats {
        for base in [V_ENGINE, V_NO_NOTIFY, V_CATCH_UP, V_CEILING] {
            registry = registry.register(Portfolio::new(base + r))?;
        }
        for base in [V_ALL, V_CEILING_ALL] {
            registry = registry
                .register(Portfolio::new(base + r))?
                .register(Risk::new(base + r))?
                .register(Eod::new(base + r))?;
        }
    }
    projector_engine::migrate(&mut client, &registry).await?;
    // The inbox's days of the bench's events, as a running engine would have made them
    // ahead: no phase pays for making them, and the ceiling (plain SQL) needs them.
    let days = events::DAYS
        .iter()
        .enumerate()
        .map(|(i, _)| {
            projector_engine::inbox::day_of(events::occurred_at(i as u64 * events::DAY_MS).into())
        })
        .collect();
    projector_engine::inbox::Days::new()
        .make(&mut client, &days)
        .await
        .doing("making the inbox's days of the bench's events")?;
    // Only the placeholders are live: a live measured version would write notices the
    // ceilings do not.
    let live: i64 = client
        .query_one(
            "SELECT count(*) FROM projector.views WHERE state = 'live' AND version <> $1",
            &[&V_PLACEHOLDER],
        )
        .await
        .doing("reading which versions are live")?
        .get(0);
    if live != 0 {
        stop!("{live} measured view versions are live; only the placeholders should be");
    }
    Ok(())
}

/// The dev broker, with every topic of the run.
pub(crate) fn broker(options: &Options) -> Result<DevBroker, BenchError> {
    let repeats = i32::from(options.repeat);
    let mut topics: Vec<(String, i32)> = (0..repeats)
        .map(|r| (format!("{TOPIC}_{r}"), options.partitions))
        .collect();
    topics.extend((0..repeats).map(|r| (format!("{TOPIC_ALL}_{r}"), options.partitions)));
    topics.push((TOPIC_LATENCY.to_owned(), options.partitions));
    topics.push((TOPIC_REBUILD_LIVE.to_owned(), options.partitions));
    topics.push((TOPIC_FULL_INBOX.to_owned(), options.partitions));
    topics.push((TOPIC_PRUNE_LIVE.to_owned(), options.partitions));
    topics.push((TOPIC_RYW.to_owned(), options.partitions));
    topics.extend((0..repeats).map(|r| (format!("{TOPIC}_{r}_quiet"), options.partitions)));
    let topic_refs: Vec<(&str, i32)> = topics.iter().map(|(t, p)| (t.as_str(), *p)).collect();
    DevBroker::start(1, &topic_refs).doing("cannot start the dev broker")
}
