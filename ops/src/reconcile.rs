//! Reconciliation: the write side's counts and sums against a view's, per fixed time window,
//! with a threshold: the seed's "mutabakat panosu", as a command that exits non-zero.
//!
//! The contract: each side is a query returning a column `at` (`timestamptz`, `timestamp`
//! read as UTC, or `date`) and one or more measure columns (integer or `numeric`; never
//! floating point: money stays exact). Both sides are summed per window of `at`; every
//! measure the source returns must exist on the view side under the same name. A count is a
//! measure like any other: `1 AS fills` on a side with a row per event, `fills` on a side
//! that already counts. A window differs when, for some measure,
//! `|view - source| > threshold * |source|` (so a window the source has and the view lacks
//! differs, and so does one only the view has). All arithmetic is PostgreSQL's `numeric`.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use deadpool_postgres::Client;
use projector_engine::SqlFile;
use tokio_postgres::types::Type;

use super::error::{pg, OpsError};

/// The statements of this module (`reconcile.sql`).
const SQL: SqlFile = SqlFile::new("ops/src/reconcile.sql", include_str!("reconcile.sql"));

fn statement(name: &str) -> &'static str {
    SQL.section(name)
}

/// What to compare.
#[derive(Debug, Clone)]
pub struct ReconcileSpec {
    /// The write side's query.
    pub source_sql: String,
    /// The view side's query.
    pub view_sql: String,
    /// The window length.
    pub window: Duration,
    /// Compare windows from here (aligned down to the window)...
    pub since: DateTime<Utc>,
    /// ... to here: only windows that end by then (aligned down to the window).
    pub until: DateTime<Utc>,
    /// The largest relative difference tolerated, as a decimal fraction (`0.001` = 0.1%).
    pub threshold: String,
}

/// One measure of one window that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeasureDiff {
    /// The measure column.
    pub measure: String,
    /// The source's sum, as numeric text.
    pub source: String,
    /// The view's sum, as numeric text.
    pub view: String,
    /// `|view - source| / |source|`, six places; `None` when the source's sum is 0.
    pub relative: Option<String>,
}

/// A window that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowDiff {
    /// Its start (inclusive).
    pub start: DateTime<Utc>,
    /// Its end (exclusive).
    pub end: DateTime<Utc>,
    /// The measures that differ in it.
    pub measures: Vec<MeasureDiff>,
}

/// The outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    /// The first window's start.
    pub from: DateTime<Utc>,
    /// The last window's end.
    pub to: DateTime<Utc>,
    /// Windows compared.
    pub windows: i64,
    /// Windows where either side has rows.
    pub windows_with_data: i64,
    /// The measures compared.
    pub measures: Vec<String>,
    /// The windows that differ, in time order.
    pub differing: Vec<WindowDiff>,
}

/// Windows are aligned to this origin (a Monday, midnight UTC): 5-minute windows start on
/// the 5 minutes, daily ones at midnight UTC.
fn origin() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2000, 1, 3, 0, 0, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// `t` aligned down to a multiple of `window` from the origin.
pub fn align(t: DateTime<Utc>, window: Duration) -> DateTime<Utc> {
    let w = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
    let since = (t - origin()).num_milliseconds();
    t - chrono::Duration::milliseconds(since.rem_euclid(w))
}

/// The measure columns of a side's query, checked against the contract.
async fn columns(client: &Client, side: &str, sql: &str) -> Result<Vec<String>, OpsError> {
    let statement = client.prepare(sql).await.map_err(|e| {
        OpsError::Refused(format!(
            "the {side} query does not prepare: {}",
            db_text(&e)
        ))
    })?;
    let mut at = false;
    let mut measures = Vec::new();
    for c in statement.columns() {
        if c.name() == "at" {
            if ![Type::TIMESTAMPTZ, Type::TIMESTAMP, Type::DATE].contains(c.type_()) {
                return Err(OpsError::Refused(format!(
                    "the {side} query's `at` is {}; it must be timestamptz, timestamp or date",
                    c.type_()
                )));
            }
            at = true;
        } else if [Type::INT2, Type::INT4, Type::INT8, Type::NUMERIC].contains(c.type_()) {
            measures.push(c.name().to_owned());
        } else {
            return Err(OpsError::Refused(format!(
                "the {side} query's column `{}` is {}; measures are integers or numeric \
                 (cast to numeric: money is never compared as floating point)",
                c.name(),
                c.type_()
            )));
        }
    }
    if !at {
        return Err(OpsError::Refused(format!(
            "the {side} query has no column named `at` (the time that puts a row in a window)"
        )));
    }
    if measures.is_empty() {
        return Err(OpsError::Refused(format!(
            "the {side} query has no measure column (an integer or numeric column besides `at`)"
        )));
    }
    Ok(measures)
}

fn db_text(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned())
}

/// A threshold as a decimal fraction: `0.001`, or `0.1%`. Parsed exactly (no floating
/// point), refused when negative or not below 1.
pub fn parse_threshold(text: &str) -> Result<String, OpsError> {
    use std::str::FromStr;
    let t = text.trim();
    let (number, percent) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let refuse = || {
        OpsError::Refused(format!(
            "--threshold: expected a fraction such as 0.001 or a percentage such as 0.1%, got {text:?}"
        ))
    };
    let mut d = rust_decimal::Decimal::from_str(number).map_err(|_| refuse())?;
    if percent {
        d = d
            .checked_div(rust_decimal::Decimal::ONE_HUNDRED)
            .ok_or_else(refuse)?;
    }
    if d.is_sign_negative() || d >= rust_decimal::Decimal::ONE {
        return Err(refuse());
    }
    Ok(d.normalize().to_string())
}

/// A query as a subquery: without the trailing semicolon a shell user types out of habit.
fn clean(sql: &str) -> &str {
    sql.trim().trim_end_matches(';').trim_end()
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Per window, the sums of `measures`, as (window start, measure, numeric text).
async fn sums(
    client: &mut Client,
    sql: &str,
    measures: &[String],
    spec: &ReconcileSpec,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<(Vec<DateTime<Utc>>, Vec<String>, Vec<String>), OpsError> {
    let sums: Vec<String> = measures
        .iter()
        .map(|m| format!("coalesce(sum(s.{}), 0)::text", quote_ident(m)))
        .collect();
    // Inline: it wraps the operator's query and names its measures.
    let query = format!(
        "SELECT date_bin($1::bigint * interval '1 millisecond', s.at::timestamptz, $2::timestamptz), {} \
         FROM ({sql}) s WHERE s.at::timestamptz >= $2 AND s.at::timestamptz < $3 \
         GROUP BY 1 ORDER BY 1",
        sums.join(", ")
    );
    let window_ms = i64::try_from(spec.window.as_millis()).unwrap_or(i64::MAX);
    // Read-only, in UTC: a `date` or `timestamp` column is read as UTC whatever the server's
    // time zone, and a query handed to reconcile cannot change anything.
    let tx = client
        .build_transaction()
        .read_only(true)
        .start()
        .await
        .map_err(pg("starting a read-only transaction"))?;
    tx.batch_execute(statement("utc"))
        .await
        .map_err(pg("setting the time zone"))?;
    let rows = tx
        .query(&query, &[&window_ms, &from, &to])
        .await
        .map_err(|e| OpsError::Refused(format!("a query failed: {}", db_text(&e))))?;
    tx.commit().await.map_err(pg("ending the read"))?;
    let (mut ws, mut ms, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    for r in rows {
        let w: DateTime<Utc> = r.get(0);
        for (i, m) in measures.iter().enumerate() {
            ws.push(w);
            ms.push(m.clone());
            vs.push(r.get::<_, String>(i + 1));
        }
    }
    Ok((ws, ms, vs))
}

/// Compares both sides window by window. `source` and `view` may be connections to the same
/// database or to two.
pub async fn reconcile(
    source: &mut Client,
    view: &mut Client,
    spec: &ReconcileSpec,
) -> Result<ReconcileReport, OpsError> {
    if spec.window.is_zero() {
        return Err(OpsError::Refused(
            "the window must be longer than 0".to_owned(),
        ));
    }
    let source_sql = clean(&spec.source_sql);
    let view_sql = clean(&spec.view_sql);
    let measures = columns(source, "source", source_sql).await?;
    let view_measures = columns(view, "view", view_sql).await?;
    let missing: Vec<&String> = measures
        .iter()
        .filter(|m| !view_measures.contains(m))
        .collect();
    if !missing.is_empty() {
        return Err(OpsError::Refused(format!(
            "the view side has no column {} (it has {})",
            missing
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", "),
            view_measures.join(", ")
        )));
    }
    let from = align(spec.since, spec.window);
    let to = align(spec.until, spec.window);
    if to <= from {
        return Err(OpsError::Refused(format!(
            "no complete window of {}s between {} and {}",
            spec.window.as_secs(),
            spec.since.to_rfc3339(),
            spec.until.to_rfc3339()
        )));
    }
    let window = chrono::Duration::from_std(spec.window)
        .map_err(|_| OpsError::Refused("the window is too long".to_owned()))?;
    let windows = (to - from).num_milliseconds() / window.num_milliseconds().max(1);
    let (sw, sm, sv) = sums(source, source_sql, &measures, spec, from, to).await?;
    let (vw, vm, vv) = sums(view, view_sql, &measures, spec, from, to).await?;
    let with_data = {
        let mut all: Vec<DateTime<Utc>> = sw.iter().chain(vw.iter()).copied().collect();
        all.sort_unstable();
        all.dedup();
        i64::try_from(all.len()).unwrap_or(i64::MAX)
    };
    // The comparison itself is numeric arithmetic in PostgreSQL: exact at any scale.
    let rows = view
        .query(
            statement("compare"),
            &[&sw, &sm, &sv, &vw, &vm, &vv, &spec.threshold],
        )
        .await
        .map_err(|e| OpsError::Refused(format!("comparing the sums: {}", db_text(&e))))?;
    let mut differing: Vec<WindowDiff> = Vec::new();
    for r in rows {
        let start: DateTime<Utc> = r.get(0);
        let diff = MeasureDiff {
            measure: r.get(1),
            source: r.get(2),
            view: r.get(3),
            relative: r.get(4),
        };
        match differing.last_mut() {
            Some(last) if last.start == start => last.measures.push(diff),
            _ => differing.push(WindowDiff {
                start,
                end: start + window,
                measures: vec![diff],
            }),
        }
    }
    Ok(ReconcileReport {
        from,
        to,
        windows,
        windows_with_data: with_data,
        measures,
        differing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_in_the_file() {
        for name in ["utc", "compare"] {
            assert!(!statement(name).is_empty(), "{name}");
        }
    }

    #[test]
    fn windows_align_to_their_length() {
        let t = Utc
            .with_ymd_and_hms(2026, 11, 29, 10, 17, 42)
            .single()
            .expect("time");
        let five = Duration::from_secs(300);
        let day = Duration::from_secs(86_400);
        assert_eq!(
            align(t, five),
            Utc.with_ymd_and_hms(2026, 11, 29, 10, 15, 0)
                .single()
                .expect("time")
        );
        assert_eq!(
            align(t, day),
            Utc.with_ymd_and_hms(2026, 11, 29, 0, 0, 0)
                .single()
                .expect("time")
        );
        let aligned = align(t, five);
        assert_eq!(align(aligned, five), aligned);
    }

    #[test]
    fn thresholds_are_fractions_or_percentages() {
        assert_eq!(parse_threshold("0.001").expect("fraction"), "0.001");
        assert_eq!(parse_threshold("0.1%").expect("percent"), "0.001");
        assert_eq!(parse_threshold("0").expect("zero"), "0");
        assert!(parse_threshold("-0.1").is_err());
        assert!(parse_threshold("150%").is_err());
        assert!(parse_threshold("a tenth").is_err());
        assert!(parse_threshold("").is_err());
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("qty"), "\"qty\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
