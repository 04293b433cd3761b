//! Comparing two versions of a view row by row, through their read SQL: what readers of the
//! stable name would see from each.
//!
//! Rows are compared as multisets of the chosen columns (every column both versions show, by
//! default), with PostgreSQL's own equality: `1.10` equals `1.1`. A column whose type differs
//! between the versions is compared as text. Both versions move while the stream flows, so a
//! comparison is meaningful once both have caught up and the stream is quiet (or stopped).

use deadpool_postgres::Client;
use projector_engine::projection::render;
use projector_engine::Registry;

use crate::error::{db, RebuildError};

/// How many differing rows a report shows.
pub const SHOWN: i64 = 10;

/// What a comparison found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// The columns compared.
    pub columns: Vec<String>,
    /// Rows in each version.
    pub rows: (i64, i64),
    /// Rows of the first version with no equal row in the second, and the converse.
    pub only: (i64, i64),
    /// The first differing rows of each side, as text.
    pub first: (Vec<String>, Vec<String>),
}

impl VerifyReport {
    /// True when the versions hold the same rows.
    pub fn matches(&self) -> bool {
        self.only == (0, 0)
    }
}

/// Compares versions `a` and `b` of `name` on `columns` (all common columns when empty).
pub async fn verify(
    client: &Client,
    registry: &Registry,
    name: &str,
    (a, b): (i32, i32),
    columns: &[String],
) -> Result<VerifyReport, RebuildError> {
    // Each version is read through its own read SQL: this binary's code for it must be the
    // code that registered it, or the comparison would be through another reader.
    let read = |v: i32| async move {
        let code = registry.code_for(name, v)?;
        projector_engine::fingerprint::check(client, &*code).await?;
        Ok::<_, RebuildError>(render(&*code, &code.read_sql()))
    };
    let (sql_a, sql_b) = (read(a).await?, read(b).await?);
    let describe = |sql: String| async move {
        // Composed per view: its read statement.
        client
            .prepare(&format!("SELECT * FROM ({sql}) t"))
            .await
            .map(|s| {
                s.columns()
                    .iter()
                    .map(|c| (c.name().to_owned(), c.type_().clone()))
                    .collect::<Vec<_>>()
            })
            .map_err(db("reading a version's columns"))
    };
    let (cols_a, cols_b) = (
        describe(sql_a.clone()).await?,
        describe(sql_b.clone()).await?,
    );
    let chosen: Vec<String> = if columns.is_empty() {
        cols_a
            .iter()
            .filter(|(n, _)| cols_b.iter().any(|(m, _)| m == n))
            .map(|(n, _)| n.clone())
            .collect()
    } else {
        columns.to_vec()
    };
    for c in &chosen {
        for (v, cols) in [(a, &cols_a), (b, &cols_b)] {
            if !cols.iter().any(|(n, _)| n == c) {
                let have: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
                return Err(RebuildError::Refused(format!(
                    "{name} v{v} has no column {c:?}; it has {}",
                    have.join(", ")
                )));
            }
        }
    }
    if chosen.is_empty() {
        return Err(RebuildError::Refused(format!(
            "{name} v{a} and v{b} share no column to compare"
        )));
    }
    let select = |cols: &[(String, tokio_postgres::types::Type)],
                  other: &[(String, tokio_postgres::types::Type)]| {
        chosen
            .iter()
            .map(|c| {
                let mine = cols.iter().find(|(n, _)| n == c).map(|(_, t)| t);
                let theirs = other.iter().find(|(n, _)| n == c).map(|(_, t)| t);
                let quoted = format!("\"{}\"", c.replace('"', "\"\""));
                if mine == theirs {
                    quoted
                } else {
                    format!("{quoted}::text AS {quoted}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sel_a = select(&cols_a, &cols_b);
    let sel_b = select(&cols_b, &cols_a);
    // Composed per pair of versions: their read statements and common columns.
    let query = format!(
        "WITH a AS (SELECT {sel_a} FROM ({sql_a}) t), b AS (SELECT {sel_b} FROM ({sql_b}) t), \
              only_a AS (SELECT * FROM a EXCEPT ALL SELECT * FROM b), \
              only_b AS (SELECT * FROM b EXCEPT ALL SELECT * FROM a) \
         SELECT (SELECT count(*) FROM a), (SELECT count(*) FROM b), \
                (SELECT count(*) FROM only_a), (SELECT count(*) FROM only_b), \
                ARRAY(SELECT x::text FROM only_a x ORDER BY 1 LIMIT {SHOWN}), \
                ARRAY(SELECT x::text FROM only_b x ORDER BY 1 LIMIT {SHOWN})"
    );
    let row = client
        .query_one(&query, &[])
        .await
        .map_err(db("comparing the versions"))?;
    Ok(VerifyReport {
        columns: chosen,
        rows: (row.get(0), row.get(1)),
        only: (row.get(2), row.get(3)),
        first: (row.get(4), row.get(5)),
    })
}
