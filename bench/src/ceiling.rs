//! The ceiling: the rows the engine's transactions leave behind, written by the best plain
//! SQL this bench knows, with nothing else to do: no Kafka, no JSON, no view logic.
//!
//! Per partition (one connection each, concurrently, like the engine's workers; one connection
//! for all partitions was slower) and per chunk of its events, one transaction:
//! `COPY ... FROM STDIN (FORMAT binary)` of the inbox rows; then, pipelined, the view rows the
//! chunk leaves behind (values from the fold), each key once, upserted by one set-based
//! statement per table, the accounts' progress and the fenced offset updates; commit. Every
//! row version the engine writes is written here too: one inbox row per applied event and
//! view, one view-row upsert per key and chunk (portfolio and risk fold each account's run of
//! a batch, eod aggregates a batch), progress and offsets per chunk.
//!
//! [`Targets`] says which views: portfolio alone (the one-view ceiling), or portfolio, risk
//! and eod (the all-views ceiling). The all-views ceiling writes the three views' rows in one
//! transaction per chunk, one commit where the engine, whose views are independent, makes
//! three: the best plain SQL for those rows, so an upper bound.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Statement;

use super::events::{
    day_name, day_of, position_text, symbol, BenchEvent, Day, Position, RiskWrite,
};
use crate::error::{stop, BenchError, Doing as _};

/// Events per transaction: the fastest size measured on the bench's machine between 500 and
/// 50,000 (about 100,000 events/s against about 60,000 at 10,000 and 50,000); larger
/// transactions were slower, not faster. `docs/benchmarks.md` has the figures.
pub const CHUNK: usize = 2_000;

/// One event of a partition, with the rows it leaves behind (trades only).
pub struct Item<'a> {
    pub event: &'a BenchEvent,
    pub offset: i64,
    /// The portfolio row.
    pub write: Option<(usize, Position)>,
    /// The risk rows, when the targets include risk.
    pub risk: Option<&'a RiskWrite>,
}

/// The view versions a ceiling writes: portfolio always; risk and eod for the all-views
/// ceiling. Each is a version number.
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    pub portfolio: i32,
    pub risk: Option<i32>,
    pub eod: Option<i32>,
}

/// Runs every partition concurrently and returns the elapsed time.
pub async fn run(
    pool: &Pool,
    targets: Targets,
    topic: &str,
    partitions: BTreeMap<i32, Vec<Item<'_>>>,
) -> Result<Duration, BenchError> {
    let started = Instant::now();
    let work = partitions
        .iter()
        .map(|(p, items)| partition(pool, targets, topic, *p, items))
        .collect();
    for r in join_all(work).await {
        r?;
    }
    Ok(started.elapsed())
}

/// The statements of one connection.
struct Prepared {
    portfolio: Statement,
    positions: Option<Statement>,
    risk: Option<Statement>,
    eod: Option<Statement>,
    progress: Statement,
    advance: Statement,
}

async fn prepare(client: &deadpool_postgres::Client, t: Targets) -> Result<Prepared, BenchError> {
    let portfolio = client
        .prepare(&format!(
            "INSERT INTO portfolio_v{v} (account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version) \
             SELECT a, s, q::numeric, ap::numeric, r::numeric, t::timestamptz, v \
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[]) \
                  AS x(a, s, q, ap, r, t, v) \
             ON CONFLICT (account_id, symbol) DO UPDATE SET \
                 net_qty = EXCLUDED.net_qty, avg_price = EXCLUDED.avg_price, \
                 realized_pnl = EXCLUDED.realized_pnl, last_trade_at = EXCLUDED.last_trade_at, \
                 version = EXCLUDED.version \
             WHERE portfolio_v{v}.version < EXCLUDED.version",
            v = t.portfolio
        ))
        .await
        .doing("ceiling: preparing the portfolio upsert")?;
    let (positions, risk) = match t.risk {
        None => (None, None),
        Some(v) => {
            let positions = client
                .prepare(&format!(
                    "INSERT INTO risk_positions_v{v} (account_id, symbol, net_qty, last_price, version) \
                     SELECT a, s, q::numeric, p::numeric, v \
                     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[]) AS x(a, s, q, p, v) \
                     ON CONFLICT (account_id, symbol) DO UPDATE SET \
                         net_qty = EXCLUDED.net_qty, last_price = EXCLUDED.last_price, version = EXCLUDED.version"
                ))
                .await
                .doing("ceiling: preparing the risk book upsert")?;
            let risk = client
                .prepare(&format!(
                    "INSERT INTO risk_v{v} (account_id, gross_exposure, net_exposure, open_positions, \
                                            largest_position_symbol, largest_position_notional, version) \
                     SELECT a, g::numeric, n::numeric, o, s, l::numeric, v \
                     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[]) \
                          AS x(a, g, n, o, s, l, v) \
                     ON CONFLICT (account_id) DO UPDATE SET \
                         gross_exposure = EXCLUDED.gross_exposure, net_exposure = EXCLUDED.net_exposure, \
                         open_positions = EXCLUDED.open_positions, \
                         largest_position_symbol = EXCLUDED.largest_position_symbol, \
                         largest_position_notional = EXCLUDED.largest_position_notional, \
                         version = EXCLUDED.version"
                ))
                .await
                .doing("ceiling: preparing the risk upsert")?;
            (Some(positions), Some(risk))
        }
    };
    let eod = match t.eod {
        None => None,
        Some(v) => Some(
            client
                .prepare(&format!(
                    "INSERT INTO eod_v{v} (account_id, trading_day, fills, busts, bought_qty, sold_qty, \
                                          bought_notional, sold_notional, fees, cash_in, cash_out) \
                     SELECT a, d::date, f, b, bq::numeric, sq::numeric, bn::numeric, sn::numeric, \
                            fe::numeric, ci::numeric, co::numeric \
                     FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], \
                                 $7::text[], $8::text[], $9::text[], $10::text[], $11::text[]) \
                          AS x(a, d, f, b, bq, sq, bn, sn, fe, ci, co) \
                     ON CONFLICT (account_id, trading_day) DO UPDATE SET \
                         fills = EXCLUDED.fills, busts = EXCLUDED.busts, \
                         bought_qty = EXCLUDED.bought_qty, sold_qty = EXCLUDED.sold_qty, \
                         bought_notional = EXCLUDED.bought_notional, sold_notional = EXCLUDED.sold_notional, \
                         fees = EXCLUDED.fees, cash_in = EXCLUDED.cash_in, cash_out = EXCLUDED.cash_out"
                ))
                .await
                .doing("ceiling: preparing the eod upsert")?,
        ),
    };
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
    Ok(Prepared {
        portfolio,
        positions,
        risk,
        eod,
        progress,
        advance,
    })
}

/// One consumer's counts in a chunk, for its offset update.
struct Advance {
    consumer: String,
    applied: i64,
    ignored: i64,
}

async fn partition(
    pool: &Pool,
    targets: Targets,
    topic: &str,
    partition: i32,
    items: &[Item<'_>],
) -> Result<(), BenchError> {
    let mut client = pool.get().await.doing("connecting to PostgreSQL")?;
    let st = prepare(&client, targets).await?;
    let portfolio = format!("portfolio_v{}", targets.portfolio);
    let risk = targets.risk.map(|v| format!("risk_v{v}"));
    let eod = targets.eod.map(|v| format!("eod_v{v}"));
    // Consumers that track accounts' progress (order-dependent views).
    let ordered: Vec<&str> = std::iter::once(portfolio.as_str())
        .chain(risk.as_deref())
        .collect();
    let consumers: Vec<&str> = ordered.iter().copied().chain(eod.as_deref()).collect();
    for consumer in &consumers {
        client
            .execute(
                "INSERT INTO projector.offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, 0)",
                &[consumer, &topic, &partition],
            )
            .await
            .doing("ceiling: creating the offset row")?;
    }
    // The eod rows of this partition as they stand (its accounts are this partition's own).
    let mut days: HashMap<(i64, usize), Day> = HashMap::new();

    let mut start = 0i64;
    for chunk in items.chunks(CHUNK) {
        let Some(last) = chunk.last() else { continue };
        let next = last.offset + 1;
        let tx = client.transaction().await.doing("ceiling: begin")?;
        let sink = tx
            .copy_in(
                "COPY projector.inbox (consumer, occurred_at, event_id) FROM STDIN (FORMAT binary)",
            )
            .await
            .doing("ceiling: COPY")?;
        let mut writer = pin!(BinaryCopyInWriter::new(
            sink,
            &[Type::TEXT, Type::TIMESTAMPTZ, Type::TEXT]
        ));
        for item in chunk {
            let trade = item.write.is_some();
            for (consumer, writes) in [
                (Some(portfolio.as_str()), trade),
                (risk.as_deref(), trade),
                (eod.as_deref(), true),
            ] {
                if let (Some(consumer), true) = (consumer, writes) {
                    let at = crate::events::occurred_at(item.event.at_ms);
                    writer
                        .as_mut()
                        .write(&[&consumer, &at, &item.event.event_id])
                        .await
                        .doing("ceiling: COPY row")?;
                }
            }
        }
        writer.finish().await.doing("ceiling: COPY end")?;

        // What the chunk leaves behind, once per key: the last write of each position (and
        // risk book row) and of each risk account row, in one set-based statement each, as
        // the engine's statements, which fold each account's run of a batch, write them.
        let mut last_write: BTreeMap<(i64, usize), (&Position, Option<&RiskWrite>)> =
            BTreeMap::new();
        let mut last_account: BTreeMap<i64, &RiskWrite> = BTreeMap::new();
        let mut touched: BTreeMap<(i64, usize), ()> = BTreeMap::new();
        let mut last_seq: BTreeMap<i64, (i64, &str)> = BTreeMap::new();
        let mut applied = 0i64;
        for item in chunk {
            let e = item.event;
            last_seq.insert(e.account_id, (e.seq, e.event_id.as_str()));
            if eod.is_some() {
                let key = (e.account_id, day_of(e));
                days.entry(key).or_default().book(&e.kind);
                touched.insert(key, ());
            }
            let Some((s, pos)) = &item.write else {
                continue;
            };
            applied += 1;
            last_write.insert((e.account_id, *s), (pos, item.risk));
            if let (Some(_), Some(w)) = (&risk, item.risk) {
                last_account.insert(e.account_id, w);
            }
        }
        let mut rounds: Vec<Round> = Vec::new();
        let mut book_rounds: Vec<BookRound> = Vec::new();
        let mut account_rounds: Vec<AccountRound> = Vec::new();
        if !last_write.is_empty() {
            let (mut round, mut book) = (Round::default(), BookRound::default());
            for ((account, s), (pos, w)) in &last_write {
                round.push(*account, *s, pos);
                if let (Some(_), Some(w)) = (&risk, w) {
                    book.push(w);
                }
            }
            rounds.push(round);
            book_rounds.push(book);
        }
        if !last_account.is_empty() {
            let mut round = AccountRound::default();
            for w in last_account.values() {
                round.push(w);
            }
            account_rounds.push(round);
        }
        let mut day_rows = DayRows::default();
        for key in touched.keys() {
            if let Some(d) = days.get(key) {
                day_rows.push(*key, d);
            }
        }
        let total = chunk.len() as i64;
        let ignored = total - applied;
        let accounts: Vec<i64> = last_seq.keys().copied().collect();
        let seqs: Vec<i64> = last_seq.values().map(|(s, _)| *s).collect();
        let ids: Vec<&str> = last_seq.values().map(|(_, e)| *e).collect();
        let zero = 0i64;
        let owner = "ceiling";
        let advances: Vec<Advance> = consumers
            .iter()
            .map(|c| Advance {
                consumer: (*c).to_owned(),
                applied: if Some(*c) == eod.as_deref() {
                    total
                } else {
                    applied
                },
                ignored: if Some(*c) == eod.as_deref() {
                    0
                } else {
                    ignored
                },
            })
            .collect();

        let round_params: Vec<[&(dyn ToSql + Sync); 7]> =
            rounds.iter().map(Round::params).collect();
        let book_params: Vec<[&(dyn ToSql + Sync); 5]> = if risk.is_some() {
            book_rounds.iter().map(BookRound::params).collect()
        } else {
            Vec::new()
        };
        let account_params: Vec<[&(dyn ToSql + Sync); 7]> =
            account_rounds.iter().map(AccountRound::params).collect();
        let progress_params: Vec<[&(dyn ToSql + Sync); 4]> = ordered
            .iter()
            .map(|c| -> [&(dyn ToSql + Sync); 4] { [c, &accounts, &seqs, &ids] })
            .collect();
        let advance_params: Vec<[&(dyn ToSql + Sync); 18]> = advances
            .iter()
            .map(|a| -> [&(dyn ToSql + Sync); 18] {
                [
                    &a.consumer,
                    &topic,
                    &partition,
                    &next,
                    &start,
                    &a.applied,
                    &a.ignored,
                    &zero,
                    &zero,
                    &zero,
                    &zero,
                    &owner,
                    &zero,
                    &zero,
                    &zero,
                    &zero,
                    &zero,
                    &zero,
                ]
            })
            .collect();
        let day_params = day_rows.params();
        type Pending<'s> =
            Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 's>>;
        let mut statements: Vec<Pending<'_>> = Vec::new();
        for params in &round_params {
            statements.push(Box::pin(tx.execute(&st.portfolio, params)));
        }
        if let (Some(positions), Some(risk)) = (&st.positions, &st.risk) {
            for params in &book_params {
                statements.push(Box::pin(tx.execute(positions, params)));
            }
            for params in &account_params {
                statements.push(Box::pin(tx.execute(risk, params)));
            }
        }
        if let Some(eod) = &st.eod {
            statements.push(Box::pin(tx.execute(eod, &day_params)));
        }
        for params in &progress_params {
            statements.push(Box::pin(tx.execute(&st.progress, params)));
        }
        let advanced = advance_params.len();
        for params in &advance_params {
            statements.push(Box::pin(tx.execute(&st.advance, params)));
        }
        let results = join_all(statements).await;
        let mut moved = Vec::new();
        for r in results {
            moved.push(r.doing("ceiling: a statement")?);
        }
        if moved.iter().rev().take(advanced).any(|m| *m != 1) {
            stop!("ceiling: an offset row of partition {partition} was not at {start}");
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

/// One set-based upsert of risk book rows.
#[derive(Default)]
struct BookRound {
    account: Vec<i64>,
    symbol: Vec<&'static str>,
    net_qty: Vec<String>,
    last_price: Vec<String>,
    version: Vec<i64>,
}

impl BookRound {
    fn push(&mut self, w: &RiskWrite) {
        let (q, lp, v) = w.position;
        self.account.push(w.account_id);
        self.symbol.push(symbol(w.symbol));
        self.net_qty.push(super::events::fixed(q, 0));
        self.last_price.push(super::events::fixed(lp, 10));
        self.version.push(v);
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.account,
            &self.symbol,
            &self.net_qty,
            &self.last_price,
            &self.version,
        ]
    }
}

/// One set-based upsert of risk account rows.
#[derive(Default)]
struct AccountRound {
    account: Vec<i64>,
    gross: Vec<String>,
    net: Vec<String>,
    open: Vec<i64>,
    largest: Vec<Option<&'static str>>,
    notional: Vec<String>,
    version: Vec<i64>,
}

impl AccountRound {
    fn push(&mut self, w: &RiskWrite) {
        let (gross, net, open, largest, notional, version) = w.account.text();
        self.account.push(w.account_id);
        self.gross.push(gross);
        self.net.push(net);
        self.open.push(open);
        self.largest.push(largest);
        self.notional.push(notional);
        self.version.push(version);
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 7] {
        [
            &self.account,
            &self.gross,
            &self.net,
            &self.open,
            &self.largest,
            &self.notional,
            &self.version,
        ]
    }
}

/// The eod rows a chunk touched, as they stand after it.
#[derive(Default)]
struct DayRows {
    account: Vec<i64>,
    day: Vec<&'static str>,
    fills: Vec<i64>,
    busts: Vec<i64>,
    sums: [Vec<String>; 7],
}

impl DayRows {
    fn push(&mut self, (account, day): (i64, usize), d: &Day) {
        self.account.push(account);
        self.day.push(day_name(day));
        self.fills.push(d.fills);
        self.busts.push(d.busts);
        for (column, value) in self.sums.iter_mut().zip(d.text()) {
            column.push(value);
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 11] {
        let [a, b, c, d, e, f, g] = &self.sums;
        [
            &self.account,
            &self.day,
            &self.fills,
            &self.busts,
            a,
            b,
            c,
            d,
            e,
            f,
            g,
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
