//! Exactness: after every phase, the rows must equal the fold and the counters must add up.
//! A figure is reported only for work that was checked; any difference stops the bench.

use std::collections::BTreeMap;

use deadpool_postgres::Client;

use super::events::Expected;
use crate::error::{mismatch, BenchError, Doing as _};

/// Compares a table with the expected rows, value by value (numerically for `numeric`, so
/// `1.50` equals `1.5`), and fails with up to five differing rows.
pub async fn table(client: &Client, expected: &Expected) -> Result<(), BenchError> {
    let n = expected.columns.len();
    let params: Vec<String> = (1..=n).map(|i| format!("${i}::text[]")).collect();
    let names: Vec<&str> = expected.columns.iter().map(|(c, _)| *c).collect();
    let cast: Vec<String> = expected
        .columns
        .iter()
        .map(|(c, t)| format!("{c}::{t} AS {c}"))
        .collect();
    let on: Vec<String> = names[..expected.keys]
        .iter()
        .map(|c| format!("v.{c} = e.{c}"))
        .collect();
    let differs: Vec<String> = names[expected.keys..]
        .iter()
        .map(|c| format!("v.{c} IS DISTINCT FROM e.{c}"))
        .collect();
    let key = names[0];
    let sql = format!(
        "WITH raw AS (SELECT * FROM unnest({params}) AS r({names})), \
              e AS (SELECT {cast} FROM raw) \
         SELECT CASE WHEN e.{key} IS NULL THEN 'no row' ELSE e::text END, \
                CASE WHEN v.{key} IS NULL THEN 'no row' ELSE v::text END \
         FROM e FULL JOIN {table} v ON {on} \
         WHERE e.{key} IS NULL OR v.{key} IS NULL OR {differs} \
         LIMIT 5",
        params = params.join(", "),
        names = names.join(", "),
        cast = cast.join(", "),
        table = expected.table,
        on = on.join(" AND "),
        differs = if differs.is_empty() {
            "false".to_owned()
        } else {
            differs.join(" OR ")
        },
    );
    let values: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = expected
        .values
        .iter()
        .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let rows = client
        .query(&sql, &values)
        .await
        .doing_with(|| format!("comparing {} with the fold", expected.table))?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    for r in &rows {
        let (e, v): (String, String) = (r.get(0), r.get(1));
        text.push_str(&format!("\n  expected {e}\n  found    {v}"));
    }
    mismatch!(
        "{} differs from the fold of the events it consumed (first differences):{text}",
        expected.table
    )
}

/// What a view version's offset rows must say after consuming everything exactly once.
#[derive(Debug, Clone)]
pub struct Counters {
    /// Events applied (subscribed types).
    pub applied: u64,
    /// Events of other types.
    pub ignored: u64,
    /// Next offset per partition.
    pub ends: BTreeMap<i32, i64>,
}

/// Checks `projector.offsets` of a consumer: every offset consumed, every event applied or
/// ignored once, no duplicate, dead letter or waiting event; and, with `inbox` the number of
/// rows the inbox held before (views that use the inbox), one more inbox row per applied
/// event.
pub async fn counters(
    client: &Client,
    consumer: &str,
    topic: &str,
    expected: &Counters,
    inbox: Option<u64>,
) -> Result<(), BenchError> {
    let rows = client
        .query(
            "SELECT partition, next_offset, applied, ignored, duplicates, dead_lettered, waiting \
             FROM projector.offsets WHERE consumer = $1 AND topic = $2 ORDER BY partition",
            &[&consumer, &topic],
        )
        .await
        .doing("reading projector.offsets")?;
    let mut ends = BTreeMap::new();
    let (mut applied, mut ignored, mut other) = (0i64, 0i64, 0i64);
    for r in &rows {
        ends.insert(r.get::<_, i32>(0), r.get::<_, i64>(1));
        applied += r.get::<_, i64>(2);
        ignored += r.get::<_, i64>(3);
        other += r.get::<_, i64>(4) + r.get::<_, i64>(5) + r.get::<_, i64>(6);
    }
    // A partition that received nothing has no row; compare only partitions with events.
    let wanted: BTreeMap<i32, i64> = expected
        .ends
        .iter()
        .filter(|(_, e)| **e > 0)
        .map(|(p, e)| (*p, *e))
        .collect();
    ends.retain(|_, e| *e > 0);
    let want = (
        i64::try_from(expected.applied)?,
        i64::try_from(expected.ignored)?,
    );
    if ends != wanted || (applied, ignored) != want || other != 0 {
        mismatch!(
            "{consumer}: projector.offsets says next offsets {ends:?}, applied {applied}, ignored {ignored}, \
             duplicates + dead letters + waiting {other}; expected {wanted:?}, applied {}, ignored {}, 0",
            want.0,
            want.1
        );
    }
    if let Some(before) = inbox {
        let before = i64::try_from(before)?;
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM projector.inbox WHERE consumer = $1",
                &[&consumer],
            )
            .await
            .doing("counting inbox rows")?
            .get::<_, i64>(0)
            - before;
        if n != want.0 {
            mismatch!(
                "{consumer}: {n} inbox rows (beyond the {before} it held before) for {} applied events",
                want.0
            );
        }
    }
    Ok(())
}
