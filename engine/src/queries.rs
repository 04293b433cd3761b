//! The hot path's statements: every statement a batch runs against the engine's own tables.
//!
//! Their text, and what each does and why, is in `queries.sql`, under one `-- name:` section
//! each; every constant here is its section, read at compile time without the comments that
//! open it ([`SqlFile::statement`]): the constants cost what a string literal costs, a
//! missing section fails the build, and the why stays in the file, off the wire. All of them
//! are set-based (arrays in, one statement out) so that a batch costs a fixed number of round
//! trips whatever its size. `$1` is always the consumer name.

use crate::projection::SqlFile;

const SQL: SqlFile = SqlFile::new("engine/src/queries.sql", include_str!("queries.sql"));

/// Locks the partition's offset row and reads it, creating it at the batch's start.
pub const LOCK_OFFSET: &str = SQL.statement("lock_offset");

/// Moves the offset past the batch, fenced, and adds the batch's counts.
pub const ADVANCE_OFFSET: &str = SQL.statement("advance_offset");

/// The stored offset of a partition, for seeking on assignment.
pub const READ_OFFSET: &str = SQL.statement("read_offset");

/// Creates the progress rows of accounts an order-dependent view has never seen, so that
/// [`LOCK_ACCOUNTS`] can lock every account of the batch.
pub const ENSURE_PROGRESS: &str = SQL.statement("ensure_progress");

/// Locks the batch's accounts' progress rows until commit, in account order.
pub const LOCK_ACCOUNTS: &str = SQL.statement("lock_accounts");

/// Progress and parked state of the batch's accounts.
pub const READ_ACCOUNTS: &str = SQL.statement("read_accounts");

/// [`READ_ACCOUNTS`] for an order-independent view, with the highest `seq` it has applied per
/// account (`projector.seen_seqs`).
pub const READ_ACCOUNTS_SEEN: &str = SQL.statement("read_accounts_seen");

/// Events waiting for the given accounts, in `seq` order, at most `$3` per account.
pub const LOAD_WAITING: &str = SQL.statement("load_waiting");

/// Waiting events of the given `(account, seq)`s, beyond the [`LOAD_WAITING`] limit.
pub const LOAD_WAITING_AT: &str = SQL.statement("load_waiting_at");

/// The `seq`s of the given accounts that open dead letters hold, oldest first.
pub const LOAD_DEAD_SEQS: &str = SQL.statement("load_dead_seqs");

/// Which of the given events (`$2` ids, `$3` their `occurred_at`) this view version has applied.
pub const IN_INBOX: &str = SQL.statement("in_inbox");

/// Records the last applied `seq` of accounts and the event that holds it.
pub const SAVE_PROGRESS: &str = SQL.statement("save_progress");

/// Records the highest `seq` an order-independent view version has applied per account.
pub const SAVE_SEEN: &str = SQL.statement("save_seen");

/// Dead letters, with the raw bytes, once per message and view version.
pub const INSERT_DEAD_LETTERS: &str = SQL.statement("insert_dead_letters");

/// The resolution note of a dead letter whose retry sent its event to wait for an earlier
/// `seq` (`Applier::retry_dead_letter`): resolved, though its event has yet to be applied.
/// [`INSERT_DEAD_LETTERS`] names it in its text.
pub const RETRIED_WAITING_NOTE: &str = "waiting";

/// Events that must wait, with their raw bytes.
pub const INSERT_WAITING: &str = SQL.statement("insert_waiting");

/// Waiting events that left the table in this batch: applied, ignored or dead-lettered.
pub const DELETE_WAITING: &str = SQL.statement("delete_waiting");

/// Parks accounts, or updates why they are parked.
pub const PARK_ACCOUNTS: &str = SQL.statement("park_accounts");

/// Parks whose blocking `seq` arrived in this batch as poison (the others go through
/// [`PARK_ACCOUNTS`]).
pub const RELABEL_PARKS: &str = SQL.statement("relabel_parks");

/// Resolves as superseded the dead letters whose event an applied event now stands for.
pub const RESOLVE_SUPERSEDED: &str = SQL.statement("resolve_superseded");

/// Parked accounts whose next `seq` already waits, among events read from one partition.
pub const DRAINABLE_ACCOUNTS: &str = SQL.statement("drainable_accounts");

/// Accounts whose wait is over.
pub const UNPARK_ACCOUNTS: &str = SQL.statement("unpark_accounts");

/// Opens the savepoint of a batch's fast path (sequential scans off, constraints immediate).
pub const OPEN_BATCH_SAVEPOINT: &str = SQL.statement("open_batch_savepoint");

/// Ends the fast path's savepoint after every round succeeded.
pub const RELEASE_BATCH_SAVEPOINT: &str = SQL.statement("release_batch_savepoint");

/// Undoes the fast path after a failed round and keeps its savepoint open.
pub const ROLLBACK_BATCH_SAVEPOINT: &str = SQL.statement("rollback_batch_savepoint");

/// Undoes a whole pass over part of a batch and ends its savepoint.
pub const UNDO_BATCH_SAVEPOINT: &str = SQL.statement("undo_batch_savepoint");

/// The envelope's columns of every view statement's `batch`: `$2` to `$7`; the view's fields
/// follow from `$8` (`apply::compose_statement`). `emit` says whether the event may emit
/// notices: this version is live and the event lies past the boundary its cutover set (see
/// [`VIEW_IS_LIVE`]).
pub const BATCH_ENVELOPE: [(&str, &str); 6] = [
    ("event_id", "text[]"),
    ("account_id", "bigint[]"),
    ("seq", "bigint[]"),
    ("type", "text[]"),
    ("occurred_at", "timestamptz[]"),
    ("emit", "boolean[]"),
];

/// Whether this view version is live, for a view that emits notices, held shared until the
/// batch commits (a cutover waits for it).
pub const VIEW_IS_LIVE: &str = SQL.statement("view_is_live");

/// The inbox guard: CTEs `fresh` and `ev` of a view statement, `ev` the events this view
/// version sees for the first time.
pub const INBOX_CTES: &str = SQL.statement("inbox_ctes");

/// [`INBOX_CTES`] for a consumer that still has rows in `projector.inbox_legacy`.
pub const LEGACY_INBOX_CTES: &str = SQL.statement("legacy_inbox_ctes");

/// The inbox guard of the fast path's first try, a plain insert: an event the inbox has fails
/// the statement, which runs again with [`INBOX_CTES`].
pub const FRESH_INBOX_CTES: &str = SQL.statement("fresh_inbox_ctes");

/// For views that dedup by version filter only: `ev` is the whole batch.
pub const NO_INBOX_CTES: &str = SQL.statement("no_inbox_ctes");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_retried_into_waiting_is_opened_again_by_the_note_it_carries() {
        assert!(
            INSERT_DEAD_LETTERS.contains(&format!("resolution_note = '{RETRIED_WAITING_NOTE}'"))
        );
    }
}
