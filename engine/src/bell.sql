-- The bells (bell.rs): advisory locks keyed by (CLASS, hashtext(view)) that the notifier
-- holds and releases to wake `projector.wait_applied`'s waiters, and the call services in
-- Rust make to that function (V0010). No table.

-- name: retake_timeout
-- How long the notifier waits to take a bell back after a ring: the woken waiters let go at
-- once; longer means another process took it meanwhile.
SET lock_timeout = '1s'

-- name: try_take
SELECT pg_try_advisory_lock($1, hashtext($2))

-- name: queued
-- The held bells ($1) with a waiter queued on them.
SELECT v FROM unnest($1::text[]) AS v WHERE EXISTS (
  SELECT 1 FROM pg_catalog.pg_locks l
  WHERE l.locktype = 'advisory' AND l.classid = $2::int::oid
    AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname = current_database())
    AND l.objsubid = 2 AND NOT l.granted
    AND l.objid = (hashtext(v)::bigint & 4294967295)::oid)

-- name: release
SELECT pg_advisory_unlock($1, hashtext($2))

-- name: take
SELECT pg_advisory_lock($1, hashtext($2))

-- name: wait_applied
SELECT projector.wait_applied($1, $2, $3, $4::bigint * interval '1 microsecond')
