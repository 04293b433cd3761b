//! An inbox that already holds millions of rows, as a view's does after days of traffic
//! (the rows stay for the retention window, 7 days by default): the full-inbox phase
//! measures the engine against it.
//!
//! The rows are the consumer's own, as a real inbox's are, and their ids interleave with the
//! bench's events' ids in the key's byte order, so that the phase's inserts land all over
//! the index, as new events' ids do among old ones, and not in one corner of it:
//! `e-<account>-<n>~` for the bench's accounts, where the bench's own ids are
//! `e-<account>-<seq>`. The `~` makes them distinct from every id the bench publishes.
//!
//! Loaded untimed with `COPY ... (FORMAT binary)`, in the key's order (a B-tree fills
//! fastest in order), in slices of about a million rows, two at a time, each slice a
//! transaction of its own; `applied_at` spread over the last seven days.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::Pool;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;

use crate::ceiling::join_all;
use crate::error::{BenchError, Doing as _};

/// Rows per slice (one `COPY`, one transaction, one progress line).
const SLICE: u64 = 1_000_000;
/// `COPY`s at once.
const STREAMS: usize = 2;
/// The age of the oldest row.
pub(crate) const WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// The ids of one account's rows, in byte order.
fn ids(account: i64, count: u64) -> Vec<String> {
    let mut ids: Vec<String> = (1..=count).map(|n| format!("e-{account}-{n}~")).collect();
    ids.sort_unstable();
    ids
}

/// Adds `rows` inbox rows for `consumer` over `accounts` accounts, none of them an id the
/// bench publishes, and returns how long it took.
pub async fn fill(
    pool: &Pool,
    consumer: &str,
    rows: u64,
    accounts: i64,
) -> Result<Duration, BenchError> {
    let started = Instant::now();
    let accounts = accounts.max(1);
    let n = accounts.unsigned_abs();
    // Accounts in the byte order of their ids' prefix `e-<account>-`: ids of different
    // accounts never share a longer prefix, so this and each account's sorted ids give the
    // key's order.
    let mut order: Vec<i64> = (1..=accounts).collect();
    order.sort_unstable_by_key(|a| format!("e-{a}-"));
    let per = |i: u64| rows / n + u64::from(i < rows % n);
    let mut slices: VecDeque<Vec<(i64, u64)>> = VecDeque::new();
    let mut slice = Vec::new();
    let mut in_slice = 0;
    for (i, &a) in order.iter().enumerate() {
        let count = per(i as u64);
        if count == 0 {
            continue;
        }
        slice.push((a, count));
        in_slice += count;
        if in_slice >= SLICE {
            slices.push_back(std::mem::take(&mut slice));
            in_slice = 0;
        }
    }
    if !slice.is_empty() {
        slices.push_back(slice);
    }
    let queue = Mutex::new(slices);
    let done = Mutex::new(0u64);
    // The week before the bench's first trading day: its rows occurred then, and its days
    // are the inbox's partitions, made first as a running engine makes them ahead.
    let now = crate::events::occurred_at(0);
    let mut client = pool.get().await.doing("connecting to PostgreSQL")?;
    let days = (1..=WINDOW.as_secs() / 86_400)
        .filter_map(|d| now.checked_sub(Duration::from_secs(d * 86_400)))
        .map(|t| projector_engine::inbox::day_of(t.into()))
        .collect();
    projector_engine::inbox::Days::new()
        .make(&mut client, &days)
        .await
        .doing("inbox: making the week's days")?;
    drop(client);
    let streams = (0..STREAMS)
        .map(|_| stream(pool, consumer, rows, now, &queue, &done, started))
        .collect();
    for r in join_all(streams).await {
        r?;
    }
    Ok(started.elapsed())
}

/// One `COPY` after another, taking slices from `queue` until it is empty.
async fn stream(
    pool: &Pool,
    consumer: &str,
    rows: u64,
    now: SystemTime,
    queue: &Mutex<VecDeque<Vec<(i64, u64)>>>,
    done: &Mutex<u64>,
    started: Instant,
) -> Result<(), BenchError> {
    let client = pool.get().await.doing("connecting to PostgreSQL")?;
    loop {
        // A poisoned lock means a stream panicked; the queue itself is still usable.
        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
        let Some(slice) = next else {
            return Ok(());
        };
        let sink = client
            .copy_in(
                "COPY projector.inbox (consumer, occurred_at, event_id) FROM STDIN (FORMAT binary)",
            )
            .await
            .doing("inbox: COPY")?;
        let mut writer = pin!(BinaryCopyInWriter::new(
            sink,
            &[Type::TEXT, Type::TIMESTAMPTZ, Type::TEXT]
        ));
        let base = *done.lock().unwrap_or_else(|p| p.into_inner());
        let mut written = 0u64;
        for (account, count) in slice {
            for id in ids(account, count) {
                // Spread over the window, oldest first in load order; only the index on
                // applied_at cares, and the phase's own rows come after all of them.
                let at = base + written;
                let age = WINDOW.saturating_sub(Duration::from_nanos(
                    u64::try_from(u128::from(at) * WINDOW.as_nanos() / u128::from(rows.max(1)))
                        .unwrap_or(u64::MAX),
                ));
                let occurred_at = now.checked_sub(age).unwrap_or(now);
                writer
                    .as_mut()
                    .write(&[&consumer, &occurred_at, &id])
                    .await
                    .doing("inbox: COPY row")?;
                written += 1;
            }
        }
        writer.finish().await.doing("inbox: COPY end")?;
        let total = {
            let mut d = done.lock().unwrap_or_else(|p| p.into_inner());
            *d += written;
            *d
        };
        eprintln!(
            "  inbox: {} of {} rows after {} s",
            crate::numbers::grouped(total),
            crate::numbers::grouped(rows),
            started.elapsed().as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_ids_never_collide_with_the_bench_ids_and_come_sorted() {
        let ids = ids(17, 300);
        assert_eq!(ids.len(), 300);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        let bench = crate::events::generate("e", 5000, 40, 7);
        let bench: std::collections::HashSet<&str> =
            bench.iter().map(|e| e.event_id.as_str()).collect();
        assert!(bench.contains("e-17-1"));
        assert!(ids.iter().all(|id| !bench.contains(id.as_str())));
        // They interleave with the account's own ids in byte order.
        assert!(ids.iter().any(|id| id.as_str() < "e-17-2"));
        assert!(ids.iter().any(|id| id.as_str() > "e-17-2"));
    }
}
