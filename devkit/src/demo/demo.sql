-- What `projector demo` runs in PostgreSQL besides the write side (writeside/*.sql) and the
-- reconciliation (reconcile/reconcile.sql), by name. The demo's database itself is made by
-- statements with its name in them (`CREATE DATABASE`, `DROP DATABASE`, `COMMENT ON`), which
-- take no parameters: they are in demo/mod.rs.

-- name: ping
SELECT 1

-- name: database_comment
-- The comment on database $1, '' when it has none; no row when there is no such database.
SELECT coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database
WHERE datname = $1

-- name: server_version_num
SELECT current_setting('server_version_num')::int

-- name: view_offsets
-- Every view version not dropped, with its offsets row of each partition of topic $1 (none
-- before the version commits on the topic), in order of name, version and partition.
SELECT v.name, v.version, v.state, o.partition, o.next_offset, o.applied, o.ignored,
       o.duplicates, o.dup_inbox, o.dup_seq, o.dup_watermark, o.dup_version_filter,
       o.dead_lettered, o.committed_by
FROM projector.views v
LEFT JOIN projector.offsets o ON o.consumer = v.consumer AND o.topic = $1
WHERE v.dropped_at IS NULL
ORDER BY v.name, v.version, o.partition

-- name: dead_letters
SELECT count(*) FROM projector.dead_letters

-- name: parked_accounts
SELECT count(*) FROM projector.parked_accounts

-- name: applied
-- The last seq view $1 (its live version) shows of account $2, NULL when none
-- (`projector.applied`, the engine's migration V0010).
SELECT projector.applied($1, $2)
