//! What the risk tests share: its rows as text (stored, and as the whole book gives them),
//! a trade, and counting the rows a statement writes.

use projector_engine::testkit::EventSpec;

/// The time of every trade these helpers make.
pub const AT: &str = "2026-11-28T10:00:00Z";

/// The book, as text.
pub const BOOK: &str =
    "SELECT account_id::text, symbol, net_qty::text, last_price::text, version::text \
     FROM risk_positions_v{v} ORDER BY account_id, symbol COLLATE \"C\"";

/// The account rows as stored, as text.
pub const STORED: &str = "SELECT account_id::text, gross_exposure::text, net_exposure::text, \
     open_positions::text, coalesce(largest_position_symbol, 'NULL'), \
     largest_position_notional::text, version::text FROM risk_v{v} ORDER BY account_id";

/// The account rows as the whole book gives them (the `totals` rules, exposures trimmed),
/// as text: the truth the incremental rows must equal.
pub const FROM_BOOK: &str = "WITH b AS (SELECT account_id, symbol, net_qty, last_price, version \
       FROM risk_positions_v{v}), \
     t AS (SELECT account_id, \
       trim_scale(coalesce(sum(abs(net_qty) * last_price) FILTER (WHERE net_qty <> 0), 0)) AS g, \
       trim_scale(coalesce(sum(net_qty * last_price) FILTER (WHERE net_qty <> 0), 0)) AS n, \
       count(*) FILTER (WHERE net_qty <> 0) AS o, max(version) AS v FROM b GROUP BY account_id), \
     l AS (SELECT DISTINCT ON (account_id) account_id, symbol, abs(net_qty) * last_price AS x \
       FROM b WHERE net_qty <> 0 \
       ORDER BY account_id, abs(net_qty) * last_price DESC, symbol COLLATE \"C\") \
     SELECT t.account_id::text, t.g::text, t.n::text, t.o::text, coalesce(l.symbol, 'NULL'), \
       trim_scale(coalesce(l.x, 0))::text, t.v::text \
     FROM t LEFT JOIN l USING (account_id) ORDER BY t.account_id";

/// A fill at [`AT`].
pub fn trade(
    account: i64,
    seq: i64,
    symbol: &str,
    side: &str,
    qty: &str,
    price: &str,
) -> EventSpec {
    EventSpec::new(
        "fill_executed",
        account,
        seq,
        AT,
        serde_json::json!({"symbol": symbol, "side": side, "qty": qty, "price": price}),
    )
}

/// Counts every row written into `tables` (a row trigger into `row_writes`), so that a test
/// can tell one statement per batch from one per event.
pub async fn count_writes(client: &deadpool_postgres::Client, tables: &[&str]) {
    client
        .batch_execute(
            "CREATE TABLE row_writes (tbl text NOT NULL); \
             CREATE FUNCTION count_row_write() RETURNS trigger LANGUAGE plpgsql AS \
               $$BEGIN INSERT INTO row_writes VALUES (TG_TABLE_NAME); RETURN NULL; END$$;",
        )
        .await
        .expect("trigger function");
    for table in tables {
        client
            .batch_execute(&format!(
                "CREATE TRIGGER count_writes AFTER INSERT OR UPDATE ON {table} \
                 FOR EACH ROW EXECUTE FUNCTION count_row_write()"
            ))
            .await
            .expect("trigger");
    }
}
