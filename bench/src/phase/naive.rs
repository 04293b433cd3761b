//! Naive: the per-event consumer of `crate::naive` on the first round's topic.

use std::collections::BTreeMap;
use std::time::Duration;

use projector_devkit::devbroker::read_topic;

use super::V_NAIVE;
use crate::bench::{check_portfolio, settle, Bench};
use crate::error::{mismatch, stop, BenchError};
use crate::events;
use crate::numbers::{eps, grouped};
use crate::{naive, Figures, Options};

/// The naive consumer on the topic of the first round, for `--naive-seconds`.
pub(crate) async fn naive(
    options: &Options,
    b: &Bench<'_>,
    topic: &str,
    f: &mut Figures,
) -> Result<(), BenchError> {
    eprintln!(
        "bench: naive: one transaction per event, for up to {} s",
        options.naive_seconds
    );
    settle(b.pool).await?;
    let messages = {
        let (brokers, topic) = (b.brokers.clone(), topic.to_owned());
        tokio::task::spawn_blocking(move || read_topic(&brokers, &topic, Duration::from_secs(120)))
            .await??
    };
    if messages.len() < b.events.len() {
        stop!(
            "the dev broker holds {} of the {} events: its mock partitions keep at most 5 MiB \
             each and drop the oldest beyond that; use fewer --events or more --partitions",
            messages.len(),
            b.events.len()
        );
    }
    let at: BTreeMap<(i32, i64), usize> = b
        .placement
        .iter()
        .enumerate()
        .map(|(i, &(p, o))| ((p, o), i))
        .collect();
    if messages.len() != b.events.len()
        || messages.iter().any(|m| {
            at.get(&(m.partition, m.offset))
                .is_none_or(|&i| m.payload != b.stream[i].as_bytes())
        })
    {
        mismatch!("the topic does not hold the events where the bench placed them");
    }
    let naive = naive::run(
        b.pool,
        V_NAIVE,
        topic,
        &messages,
        Duration::from_secs(options.naive_seconds),
    )
    .await?;
    drop(messages);
    f.naive_events = naive.events;
    f.naive_eps = eps(naive.events, naive.elapsed);
    let prefix = events::fold(
        b.events
            .iter()
            .zip(&b.placement)
            .filter(|(_, (p, o))| naive.ends.get(p).is_some_and(|end| o < end))
            .map(|(e, _)| e),
        false,
    );
    check_portfolio(b.pool, V_NAIVE, topic, &prefix, &naive.ends).await?;
    eprintln!(
        "bench: naive: {} events/s over {} events; rows equal the fold of that prefix",
        grouped(f.naive_eps),
        grouped(f.naive_events)
    );
    Ok(())
}
