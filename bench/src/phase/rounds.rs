//! The repeated phases: each round on a fresh topic and fresh view versions, interleaved, so
//! that drift over the run touches all of them alike; every figure is the best round.

use super::{
    TOPIC, TOPIC_ALL, V_ALL, V_CATCH_UP, V_CEILING, V_CEILING_ALL, V_ENGINE, V_NO_NOTIFY, V_REBUILD,
};
use crate::bench::Bench;
use crate::error::BenchError;
use crate::numbers::{best, grouped};
use crate::{rebuild, Figures, Options};

/// Engine (with and without the read-your-writes notifier), naive (first round only),
/// ceiling, catch-up and rebuild, [`Options::repeat`] times.
pub(crate) async fn portfolio(
    options: &Options,
    b: &Bench<'_>,
    budget: rebuild::Budget,
    f: &mut Figures,
) -> Result<(), BenchError> {
    let count = b.events.len();
    let repeats = i32::from(options.repeat);
    // Engine, ceiling and catch-up, interleaved, `repeats` times: each round has a fresh
    // topic and fresh view versions, and drift over the run touches all three alike.
    let (mut engine, mut ceiling, mut catch_up) = (Vec::new(), Vec::new(), Vec::new());
    let mut quiet = Vec::new();
    let (mut rebuilt, mut rebuild_whole) = (Vec::new(), Vec::new());
    for r in 0..repeats {
        let topic = format!("{TOPIC}_{r}");
        let round = format!("round {} of {repeats}", r + 1);
        eprintln!("bench: {round}: engine, portfolio, live: the views run while {count} events are published");
        let (rate, fpi) = b.live(V_ENGINE + r, &topic, true).await?;
        if engine.iter().all(|best| rate > *best) {
            f.engine_wal_fpi = fpi;
        }
        engine.push(rate);
        eprintln!(
            "bench: {round}: engine: {} events/s; rows equal the fold",
            grouped(engine[engine.len() - 1])
        );
        eprintln!("bench: {round}: engine without the read-your-writes notifier");
        let (rate, _) = b
            .live(V_NO_NOTIFY + r, &format!("{topic}_quiet"), false)
            .await?;
        quiet.push(rate);
        eprintln!(
            "bench: {round}: engine without the notifier: {} events/s; rows equal the fold",
            grouped(rate)
        );
        if r == 0 {
            super::naive::naive(options, b, &topic, f).await?;
        }
        eprintln!("bench: {round}: ceiling: the same rows by plain SQL");
        ceiling.push(b.ceiling(V_CEILING + r, &topic).await?);
        eprintln!(
            "bench: {round}: ceiling: {} events/s; rows equal the fold",
            grouped(ceiling[ceiling.len() - 1])
        );
        eprintln!(
            "bench: {round}: catch-up: a new version from the earliest offset of {count} events"
        );
        catch_up.push(b.catch_up(V_CATCH_UP + r, &topic).await?);
        eprintln!(
            "bench: {round}: catch-up: {} events/s; rows equal the fold",
            grouped(catch_up[catch_up.len() - 1])
        );
        eprintln!(
            "bench: {round}: rebuild: projector rebuild portfolio --from earliest, {} connections, batches of {}",
            budget.connections, budget.batch_messages
        );
        let (rate, whole) = b.rebuild(V_REBUILD + r, &topic, budget).await?;
        rebuilt.push(rate);
        rebuild_whole.push(whole);
        eprintln!(
            "bench: {round}: rebuild: {} events/s; rows equal the fold",
            grouped(rebuilt[rebuilt.len() - 1])
        );
    }
    f.engine_eps = best(&engine);
    f.engine_no_notify_eps = best(&quiet);
    f.ceiling_eps = best(&ceiling);
    f.catch_up_eps = best(&catch_up);
    f.rebuild_eps = best(&rebuilt);
    f.rebuild_command = rebuild_whole.iter().min().copied().unwrap_or_default();
    f.samples = vec![engine, ceiling, catch_up, rebuilt];
    Ok(())
}

/// All views and their ceiling, [`Options::repeat`] times, as the rounds of [`portfolio`].
pub(crate) async fn all_views(
    options: &Options,
    b: &Bench<'_>,
    f: &mut Figures,
) -> Result<(), BenchError> {
    let repeats = i32::from(options.repeat);
    let (mut all, mut ceiling_all) = (Vec::new(), Vec::new());
    for r in 0..repeats {
        let round = format!("round {} of {repeats}", r + 1);
        all.push(
            super::engine::all_views(b, &round, V_ALL + r, &format!("{TOPIC_ALL}_{r}")).await?,
        );
        eprintln!(
            "bench: {round}: ceiling, all views: the rows of portfolio, risk and eod by plain SQL"
        );
        ceiling_all.push(b.ceiling_all(V_CEILING_ALL + r).await?);
        eprintln!(
            "bench: {round}: ceiling, all views: {} events/s; rows of the three views equal the fold",
            grouped(ceiling_all[ceiling_all.len() - 1])
        );
    }
    f.engine_all_views_eps = best(&all);
    f.ceiling_all_views_eps = best(&ceiling_all);
    f.samples.extend([all, ceiling_all]);
    Ok(())
}
