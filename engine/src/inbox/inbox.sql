-- The statements on projector.inbox's days (V0009: one partition per day of the events' own
-- time), projector.inbox_retention, projector.inbox_late_writes and projector.inbox_legacy
-- outside a batch. A batch's inbox guard is the hot path's (`queries.sql`: inbox_ctes...).
-- The DDL on a day's table (create, attach, detach) and the sliced delete name the day's
-- table and are composed in mod.rs.

-- name: partitions
-- Every table of ours named like a day partition, attached or not, by day.
SELECT c.relname::text,
       CASE WHEN i.inhrelid IS NULL THEN 'detached'
            WHEN i.inhdetachpending THEN 'pending' ELSE 'attached' END,
       greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'projector'
LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
     AND i.inhparent = 'projector.inbox'::regclass
WHERE c.relkind = 'r' AND c.relname ~ '^inbox_p[0-9]{8}$'
ORDER BY c.relname

-- name: partition_state
-- One day's table: no row when it does not exist; NULL when detached; whether its detach
-- is pending when attached.
SELECT i.inhdetachpending FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'projector'
LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
WHERE c.relname = $1 AND c.relkind = 'r'

-- name: short_lock_timeout
-- Making a day waits at most this long for a lock (a prune's detach may hold the table).
SET LOCAL lock_timeout = '5s'

-- name: ddl_lock
-- The inbox's DDL lock (`DDL_LOCK`), until the transaction ends.
SELECT pg_advisory_xact_lock($1)

-- name: table_exists
-- Whether projector.<$1> exists: a prune may have dropped a day since it was listed.
SELECT to_regclass('projector.' || $1) IS NOT NULL

-- name: retained_from
-- The first day of the retained window; no row before any day was made.
SELECT retained_from FROM projector.inbox_retention

-- name: retain_from_first
-- The window starts at the first day ever made ahead; never moved by this after that.
INSERT INTO projector.inbox_retention (retained_from) VALUES ($1)
ON CONFLICT (one) DO NOTHING

-- name: retain_from_after
-- Moves the window's first day forward (past a day a prune dropped), never back.
INSERT INTO projector.inbox_retention (retained_from) VALUES ($1)
ON CONFLICT (one) DO UPDATE
SET retained_from = greatest(projector.inbox_retention.retained_from, EXCLUDED.retained_from)

-- name: mark_late
-- A consumer wrote into days that have ended, reading a topic's partition.
INSERT INTO projector.inbox_late_writes (day, consumer, topic, partition, written_at)
SELECT d, $2, $3, $4, now() FROM unnest($1::date[]) AS d
ON CONFLICT (day, consumer, topic, partition) DO UPDATE SET written_at = now()

-- name: has_legacy_rows
-- Whether a consumer has rows in the inbox before V0009.
SELECT EXISTS (SELECT 1 FROM projector.inbox_legacy WHERE consumer = $1)
