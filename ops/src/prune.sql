-- The statements of inbox retention (prune.rs), `projector inbox prune`. The inbox's days are
-- the engine's (engine/src/inbox: listing, attaching again, finishing a detach, moving the
-- retained window); these are the prune's own. Three statements name a day's table and are
-- composed in prune.rs: which consumers have rows in a table, the detach and the drop.

-- name: no_statement_timeout
-- A detach waits for every transaction that holds a lock on the inbox: the prune waits too,
-- instead of leaving a day detach-pending at a statement timeout.
SET statement_timeout = 0

-- name: now
-- The server's clock: a day younger than the window on it stays.
SELECT now()

-- name: ddl_lock
-- The inbox's DDL lock ($1: `inbox::DDL_LOCK`), until the transaction ends: no batch
-- attaches a day again while the prune decides on it.
SELECT pg_advisory_xact_lock($1)

-- name: latest_late_write
-- The latest late write into day $1: its rows stay until every consumer is past it.
SELECT max(written_at) FROM projector.inbox_late_writes WHERE day = $1

-- name: forget_late_writes
-- A dropped day's late writes.
DELETE FROM projector.inbox_late_writes WHERE day = $1

-- name: legacy_newest
-- The newest row of the inbox before V0009; NULL: it is empty.
SELECT max(applied_at) FROM projector.inbox_legacy

-- name: legacy_rows
-- The rows of the inbox before V0009, estimated from the catalog.
SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'projector.inbox_legacy'::regclass

-- name: short_lock_timeout
-- Emptying the inbox before V0009 waits at most this long for its lock, then tries again.
SET LOCAL lock_timeout = '200ms'

-- name: empty_legacy
-- Empties the inbox before V0009.
TRUNCATE projector.inbox_legacy
