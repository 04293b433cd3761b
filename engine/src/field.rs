//! A field of an event's `data` that a view declares ([`Field`]), and its value for one event
//! ([`FieldValue`]).
//!
//! Below both the views' declarations (`crate::projection`, which re-exports [`Field`]) and
//! decoding (`crate::event`, which reads the values and re-exports [`FieldValue`]): each of
//! them uses this module, neither uses the other for it.

use rust_decimal::Decimal;

/// A field of an event's `data` that a view reads. The engine decodes it once, in Rust, and
/// hands it to the statement as a typed column of `batch` and `ev`, named after the field:
/// no JSON is parsed in SQL, and a decimal arrives as the exact `numeric` the engine checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// `data.<name>`, a JSON string, as `text` (NULL when absent).
    Text(&'static str),
    /// `data.<name>`, a decimal string or JSON number read exactly, as `numeric` (NULL when
    /// absent).
    Decimal(&'static str),
    /// The whole `data` object as `jsonb`, column `data`: for views that read what they
    /// cannot declare. It costs a JSON parse per event in PostgreSQL.
    Data,
}

impl Field {
    /// The column's name in `batch` and `ev`.
    pub fn column(self) -> &'static str {
        match self {
            Field::Text(n) | Field::Decimal(n) => n,
            Field::Data => "data",
        }
    }

    /// The column's SQL type as its array parameter arrives.
    pub(crate) fn sql_array(self) -> &'static str {
        match self {
            Field::Text(_) | Field::Data => "text[]",
            Field::Decimal(_) => "numeric[]",
        }
    }
}

/// A declared field's value for one event ([`Field`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// A text field: `None` when absent or null.
    Text(Option<String>),
    /// A decimal field: `None` when absent or null.
    Decimal(Option<Decimal>),
    /// The whole `data` object: the event's `data` text.
    Data,
}
