//! The ceiling: the rows the engine's transactions leave behind, written by the best plain
//! SQL this bench knows, with nothing else to do: no Kafka, no JSON, no view logic.
//!
//! Per partition (one connection each, concurrently, like the engine's workers; one connection
//! for all partitions was slower) and per chunk of its events, one transaction:
//! `COPY ... FROM STDIN (FORMAT binary)` of the inbox rows; then, pipelined, the view row each
//! event leaves behind (values from the fold), upserted in key-disjoint rounds of one
//! set-based statement each, the accounts' progress and the fenced offset update; commit.
//! Every row version the engine writes is written here too: one inbox row and one view-row
//! upsert per applied event, progress and offsets per chunk.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};

use super::events::{position_text, symbol, BenchEvent, Position};
use crate::error::{stop, BenchError, Doing as _};

/// Events per transaction: the fastest size measured on the bench's machine between 500 and
/// 50,000 (about 100,000 events/s against about 60,000 at 10,000 and 50,000); larger
/// transactions were slower, not faster. `docs/benchmarks.md` has the figures.
pub const CHUNK: usize = 2_000;

/// One event of a partition, with the portfolio row it leaves behind (trades only).
pub struct Item<'a> {
    pub event: &'a BenchEvent,
    pub offset: i64,
    pub write: Option<(usize, Position)>,
}

/// Runs every partition concurrently and returns the elapsed time.
pub async fn run(
    pool: &Pool,
    consumer: &str,
    table: &str,
    topic: &str,
    partitions: BTreeMap<i32, Vec<Item<'_>>>,
) -> Result<Duration, BenchError> {
    let started = Instant::now();
    let work = partitions
        .iter()
        .map(|(p, items)| partition(pool, consumer, table, topic, *p, items))
        .collect();
    for r in join_all(work).await {
        r?;
    }
    Ok(started.elapsed())
}

async fn partition(
    pool: &Pool,
    consumer: &str,
    table: &str,
    topic: &str,
    partition: i32,
    items: &[Item<'_>],
) -> Result<(), BenchError> {
    let mut client = pool.get().await.doing("connecting to PostgreSQL")?;
    let upsert = client
        .prepare(&format!(
            "INSERT INTO {table} (account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version) \
             SELECT a, s, q::numeric, ap::numeric, r::numeric, t::timestamptz, v \
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[]) \
                  AS x(a, s, q, ap, r, t, v) \
             ON CONFLICT (account_id, symbol) DO UPDATE SET \
                 net_qty = EXCLUDED.net_qty, avg_price = EXCLUDED.avg_price, \
                 realized_pnl = EXCLUDED.realized_pnl, last_trade_at = EXCLUDED.last_trade_at, \
                 version = EXCLUDED.version \
             WHERE {table}.version < EXCLUDED.version"
        ))
        .await
        .doing("ceiling: preparing the upsert")?;
    // The engine's progress rows, as one plain upsert (the engine creates and locks them
    // first, which the ceiling need not do: it has no other writer).
    let progress = client
        .prepare(
            "INSERT INTO projector.account_progress (consumer, account_id, last_seq, last_event_id) \
             SELECT $1, a, s, e FROM unnest($2::bigint[], $3::bigint[], $4::text[]) AS x(a, s, e) \
             ON CONFLICT (consumer, account_id) DO UPDATE \
             SET last_seq = EXCLUDED.last_seq, last_event_id = EXCLUDED.last_event_id, updated_at = now()",
        )
        .await
        .doing("ceiling: preparing the progress upsert")?;
    let advance = client
        .prepare(projector_engine::queries::ADVANCE_OFFSET)
        .await
        .doing("ceiling: preparing the offset update")?;
    client
        .execute(
            "INSERT INTO projector.offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, 0)",
            &[&consumer, &topic, &partition],
        )
        .await
        .doing("ceiling: creating the offset row")?;

    let mut start = 0i64;
    for chunk in items.chunks(CHUNK) {
        let Some(last) = chunk.last() else { continue };
        let next = last.offset + 1;
        let tx = client.transaction().await.doing("ceiling: begin")?;
        let sink = tx
            .copy_in("COPY projector.inbox (consumer, event_id) FROM STDIN (FORMAT binary)")
            .await
            .doing("ceiling: COPY")?;
        let mut writer = pin!(BinaryCopyInWriter::new(sink, &[Type::TEXT, Type::TEXT]));
        for item in chunk.iter().filter(|i| i.write.is_some()) {
            writer
                .as_mut()
                .write(&[&consumer, &item.event.event_id])
                .await
                .doing("ceiling: COPY row")?;
        }
        writer.finish().await.doing("ceiling: COPY end")?;

        // Key-disjoint rounds: round r holds the r-th write of each (account, symbol).
        let mut rounds: Vec<Round> = Vec::new();
        let mut depth: HashMap<(i64, usize), usize> = HashMap::new();
        let mut last_seq: BTreeMap<i64, (i64, &str)> = BTreeMap::new();
        let mut applied = 0i64;
        for item in chunk {
            let e = item.event;
            last_seq.insert(e.account_id, (e.seq, e.event_id.as_str()));
            let Some((s, pos)) = &item.write else {
                continue;
            };
            applied += 1;
            let d = depth.entry((e.account_id, *s)).or_insert(0);
            if rounds.len() <= *d {
                rounds.push(Round::default());
            }
            rounds[*d].push(e.account_id, *s, pos);
            *d += 1;
        }
        let ignored = chunk.len() as i64 - applied;
        let accounts: Vec<i64> = last_seq.keys().copied().collect();
        let seqs: Vec<i64> = last_seq.values().map(|(s, _)| *s).collect();
        let ids: Vec<&str> = last_seq.values().map(|(_, e)| *e).collect();
        let zero = 0i64;

        let round_params: Vec<[&(dyn ToSql + Sync); 7]> =
            rounds.iter().map(Round::params).collect();
        let progress_params: [&(dyn ToSql + Sync); 4] = [&consumer, &accounts, &seqs, &ids];
        let owner = "ceiling";
        let advance_params: [&(dyn ToSql + Sync); 16] = [
            &consumer, &topic, &partition, &next, &start, &applied, &ignored, &zero, &zero, &zero,
            &zero, &owner, &zero, &zero, &zero, &zero,
        ];
        type Pending<'s> =
            Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 's>>;
        let mut statements: Vec<Pending<'_>> = Vec::new();
        for params in &round_params {
            statements.push(Box::pin(tx.execute(&upsert, params)));
        }
        statements.push(Box::pin(tx.execute(&progress, &progress_params)));
        statements.push(Box::pin(tx.execute(&advance, &advance_params)));
        let results = join_all(statements).await;
        let mut moved = 0;
        for r in results {
            moved = r.doing("ceiling: a statement")?;
        }
        if moved != 1 {
            stop!("ceiling: the offset row of partition {partition} was not at {start}");
        }
        tx.commit().await.doing("ceiling: commit")?;
        start = next;
    }
    Ok(())
}

/// One set-based upsert's arrays.
#[derive(Default)]
struct Round {
    account: Vec<i64>,
    symbol: Vec<&'static str>,
    net_qty: Vec<String>,
    avg_price: Vec<String>,
    realized_pnl: Vec<String>,
    last_trade_at: Vec<String>,
    version: Vec<i64>,
}

impl Round {
    fn push(&mut self, account: i64, s: usize, p: &Position) {
        let [q, a, r, t, _] = position_text(p);
        self.account.push(account);
        self.symbol.push(symbol(s));
        self.net_qty.push(q);
        self.avg_price.push(a);
        self.realized_pnl.push(r);
        self.last_trade_at.push(t);
        self.version.push(p.version);
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 7] {
        [
            &self.account,
            &self.symbol,
            &self.net_qty,
            &self.avg_price,
            &self.realized_pnl,
            &self.last_trade_at,
            &self.version,
        ]
    }
}

/// Polls every future together, so requests on one connection are pipelined: tokio-postgres
/// sends each as soon as it is first polled and PostgreSQL answers in order.
pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
