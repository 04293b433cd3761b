//! The write side's statements, by name, from `schema.sql` and `writeside.sql`: every
//! statement it runs is in those two files.

use std::sync::LazyLock;

use projector_engine::projection::named_sql;

const SCHEMA_SQL: &str = include_str!("schema.sql");
const WRITESIDE_SQL: &str = include_str!("writeside.sql");

/// A statement of one of the files. The names are constants of this module, and a unit test
/// reads every one of them, so a missing name fails the build's tests, not a run.
fn named(text: &'static str, name: &str) -> &'static str {
    named_sql(text, name).unwrap_or_else(|| panic!("no statement named {name:?}"))
}

macro_rules! statements {
    ($($konst:ident = $file:ident $name:literal;)*) => {
        $(pub(crate) static $konst: LazyLock<&'static str> = LazyLock::new(|| named($file, $name));)*
        #[cfg(test)]
        const ALL: &[&LazyLock<&'static str>] = &[$(&$konst),*];
    };
}

statements! {
    SCHEMA = SCHEMA_SQL "schema";
    POSITIONS_SHAPE = SCHEMA_SQL "positions_shape";
    INSTANCE = WRITESIDE_SQL "instance";
    CLAIM_KEY = WRITESIDE_SQL "claim_key";
    STORED_REPLY = WRITESIDE_SQL "stored_reply";
    STORE_REPLY = WRITESIDE_SQL "store_reply";
    SAVEPOINT_FILL = WRITESIDE_SQL "savepoint_fill";
    ROLLBACK_FILL = WRITESIDE_SQL "rollback_fill";
    NEXT_SEQ = WRITESIDE_SQL "next_seq";
    FIND_FILL = WRITESIDE_SQL "find_fill";
    TRADES_BY_VERSION = WRITESIDE_SQL "trades_by_version";
    CLAIM_BUST = WRITESIDE_SQL "claim_bust";
    RECORD_EVENT = WRITESIDE_SQL "record_event";
    BOOK_TRADE = WRITESIDE_SQL "book_trade";
    NET_QTY = WRITESIDE_SQL "net_qty";
    RELAY_LOCK = WRITESIDE_SQL "relay_lock";
    RELAY_FETCH = WRITESIDE_SQL "relay_fetch";
    RELAY_MARK = WRITESIDE_SQL "relay_mark";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_statement_exists() {
        for statement in ALL {
            assert!(!statement.is_empty());
        }
        assert!(BOOK_TRADE.contains("INSERT INTO public.positions"));
        assert!(SCHEMA.contains("CREATE TABLE IF NOT EXISTS public.account_seq"));
        assert!(
            !SCHEMA.contains("positions_shape"),
            "one statement per name"
        );
    }
}
