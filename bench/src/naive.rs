//! The baseline most teams write first: one transaction per event, holding the textbook
//! single CTE statement (inbox insert `ON CONFLICT DO NOTHING RETURNING`, then the guarded upsert)
//! and the offset update, one round trip after another.
//!
//! It applies the portfolio view's own SQL, so its rows must equal the engine's; only the
//! shape of the work differs: a statement and a commit (a WAL flush) per event instead of per
//! batch.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use projector_devkit::devbroker::ConsumedMessage;
use projector_engine::projection::render;
use projector_engine::{queries, Field, Message, Projection};
use projector_views::events::decode;
use projector_views::Portfolio;

use crate::error::{stop, BenchError, Doing as _};

/// What the naive consumer did within its time budget.
pub struct Naive {
    /// Events consumed (applied or ignored by type).
    pub events: u64,
    pub elapsed: Duration,
    /// Next offset per partition: where it stopped.
    pub ends: BTreeMap<i32, i64>,
}

/// The textbook statement for one event: `$1` the consumer, `$2..$7` the event.
/// The view's declared fields are read from the `jsonb` in SQL, as a first consumer would.
/// `emit` is false: the naive consumer writes no notices, as the measured versions write none.
fn statement(view: &dyn Projection) -> String {
    let sql = view.apply_sql();
    let fields: String = view
        .fields()
        .into_iter()
        .filter_map(|f| match f {
            Field::Text(n) => Some(format!(", (b.data->>'{n}') AS {n}")),
            Field::Decimal(n) => Some(format!(", (b.data->>'{n}')::numeric AS {n}")),
            Field::Data => None,
        })
        .collect();
    render(
        view,
        &format!(
            "WITH batch AS (SELECT b.*{fields} FROM (SELECT $2::text AS event_id, \
                    $3::bigint AS account_id, $4::bigint AS seq, $5::text AS type, \
                    $6::timestamptz AS occurred_at, false AS emit, \
                    $7::text::jsonb AS data) b),\n\
             {inbox},\n{ctes}\n,\nwritten AS (\n{write}\n)\n\
             SELECT count(*) FROM written",
            inbox = queries::INBOX_CTES,
            ctes = sql.ctes,
            write = sql.write,
        ),
    )
}

const ADVANCE: &str = "UPDATE projector.offsets SET next_offset = $4, updated_at = now(), \
     applied = applied + $5, ignored = ignored + $6 \
     WHERE consumer = $1 AND topic = $2 AND partition = $3 AND next_offset = $7";

/// Consumes `messages` (read from the topic, in offset order per partition) the naive way,
/// taking the partitions in turn as a consumer's polls would, until they are done or
/// `budget` is spent.
pub async fn run(
    pool: &Pool,
    version: i32,
    topic: &str,
    messages: &[ConsumedMessage],
    budget: Duration,
) -> Result<Naive, BenchError> {
    let view = Portfolio::new(version);
    let consumer = view.consumer();
    let subscribes = view.subscribes();
    let mut client = pool.get().await.doing("connecting to PostgreSQL")?;
    let stmt = client
        .prepare(&statement(&view))
        .await
        .doing("preparing the naive statement")?;
    let advance = client
        .prepare(ADVANCE)
        .await
        .doing("preparing the offset update")?;

    let mut by_partition: BTreeMap<i32, Vec<&ConsumedMessage>> = BTreeMap::new();
    for m in messages {
        by_partition.entry(m.partition).or_default().push(m);
    }
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    for &p in by_partition.keys() {
        client
            .execute(
                "INSERT INTO projector.offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, 0)",
                &[&consumer, &topic, &p],
            )
            .await
            .doing("creating the naive consumer's offset rows")?;
        ends.insert(p, 0);
    }

    let started = Instant::now();
    let mut events = 0u64;
    let mut cursor = 0usize;
    let mut last_report = started;
    'outer: loop {
        let mut any = false;
        for (&p, list) in &by_partition {
            let Some(m) = list.get(cursor) else { continue };
            any = true;
            let message = Message::new(m.offset, m.key.clone(), m.payload.clone());
            let event = match decode(&message) {
                Ok(e) => e,
                Err(e) => stop!("naive: partition {p} offset {}: poison: {e}", m.offset),
            };
            let applies = subscribes.contains(&event.event_type.as_str());
            let tx = client.transaction().await.doing("naive: begin")?;
            let applied: i64 = if applies {
                tx.query_one(
                    &stmt,
                    &[
                        &consumer,
                        &event.event_id,
                        &event.account_id,
                        &event.seq,
                        &event.event_type,
                        &event.occurred_at,
                        &event.data,
                    ],
                )
                .await
                .doing("naive: the event's statement")?
                .get(0)
            } else {
                0
            };
            let ignored = i64::from(!applies);
            let moved = tx
                .execute(
                    &advance,
                    &[
                        &consumer,
                        &topic,
                        &p,
                        &(m.offset + 1),
                        &applied,
                        &ignored,
                        &m.offset,
                    ],
                )
                .await
                .doing("naive: the offset update")?;
            if moved != 1 {
                stop!(
                    "naive: the offset row of partition {p} was not at {}",
                    m.offset
                );
            }
            tx.commit().await.doing("naive: commit")?;
            ends.insert(p, m.offset + 1);
            events += 1;
            if started.elapsed() >= budget {
                break 'outer;
            }
        }
        if !any {
            break;
        }
        cursor += 1;
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            eprintln!(
                "  naive: {events} events after {}s",
                started.elapsed().as_secs()
            );
        }
    }
    Ok(Naive {
        events,
        elapsed: started.elapsed(),
        ends,
    })
}
