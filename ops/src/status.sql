-- The reads of `projector status` (status.rs): one read-only snapshot of the engine's tables,
-- in a repeatable-read transaction, and the counters sampled twice for throughput. They read
-- tables the engine owns (its modules write them); these reads are the status's own, shaped
-- for one pass over every version at once. The count of a day of the inbox names the day's
-- table and is composed in status.rs.

-- name: now
-- PostgreSQL's time: every age in the snapshot is measured from it.
SELECT now()

-- name: versions
-- The registered versions of the views named in $1 (none: every view), by name and version.
SELECT name, version, consumer, state, state_changed_at, dropped_at IS NOT NULL
FROM projector.views WHERE cardinality($1::text[]) = 0 OR name = ANY($1)
ORDER BY name, version

-- name: rebuilds
-- The rebuilds under way.
SELECT consumer, phase, paused, source, started_at FROM projector.rebuilds
WHERE phase IN ('seeding', 'tailing')

-- name: offsets
-- Every version's position and counters on topic $1, per partition.
SELECT consumer, partition, next_offset, applied, ignored, duplicates, dup_seq,
       dup_watermark, dup_inbox, dup_version_filter, dead_lettered, waiting,
       drained, committed_by, updated_at
FROM projector.offsets WHERE topic = $1 ORDER BY consumer, partition

-- name: dead_letters
-- Dead letters per version and kind: open, and in all.
SELECT consumer, kind, count(*) FILTER (WHERE resolved_at IS NULL), count(*)
FROM projector.dead_letters GROUP BY consumer, kind

-- name: parked
-- Parked accounts per version and reason.
SELECT consumer, reason, count(*) FROM projector.parked_accounts
GROUP BY consumer, reason

-- name: oldest_parked
-- The longest parked accounts of each version, at most $1 per version.
SELECT v.consumer, k.account_id, k.reason, k.blocked_seq, k.dead_letter_id,
       k.parked_at, k.detail
FROM projector.views v CROSS JOIN LATERAL (
    SELECT * FROM projector.parked_accounts k
    WHERE k.consumer = v.consumer ORDER BY parked_at, account_id LIMIT $1) k
ORDER BY v.consumer, k.parked_at, k.account_id

-- name: waiting
-- Events waiting for an earlier seq, per version.
SELECT consumer, count(*) FROM projector.waiting_events GROUP BY consumer

-- name: legacy_inbox
-- The inbox before V0009 from the catalog: its rows (estimated; counted when it is small and
-- never analyzed), its bytes on disk, and its oldest row.
SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint
            WHEN pg_relation_size(c.oid) < 10485760
            THEN (SELECT count(*) FROM projector.inbox_legacy) ELSE 0 END,
       pg_total_relation_size(c.oid),
       (SELECT min(applied_at) FROM projector.inbox_legacy)
FROM pg_class c WHERE c.oid = 'projector.inbox_legacy'::regclass

-- name: sample_counters
-- PostgreSQL's clock and, per version on topic $1, the messages consumed and events applied.
SELECT clock_timestamp(), consumer,
       sum(applied + ignored + duplicates + dead_lettered + waiting - drained)::bigint,
       sum(applied)::bigint
FROM projector.offsets WHERE topic = $1 GROUP BY consumer

-- name: clock
-- PostgreSQL's clock, when no version has counters to sample.
SELECT clock_timestamp()
