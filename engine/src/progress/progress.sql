-- Statements on a view version's position and progress outside a batch: projector.offsets,
-- projector.account_progress and projector.snapshots as a rebuild places, compares, reads
-- and hands them over, and the deletion of everything the engine keeps under a consumer
-- name when its version is dropped; and a repair's skipped seq (projector.skips). A batch
-- moves them with the hot path's statements (`queries.sql`: lock_offset, advance_offset,
-- save_progress...).

-- name: seed_watermarks
-- A snapshot's watermarks: each account starts at the seq the write side's state includes.
INSERT INTO projector.account_progress (consumer, account_id, last_seq, watermark_seq)
SELECT $1, a, w, w FROM unnest($2::bigint[], $3::bigint[]) AS x(a, w)
ON CONFLICT (consumer, account_id) DO UPDATE
SET last_seq = EXCLUDED.last_seq, watermark_seq = EXCLUDED.watermark_seq, updated_at = now()

-- name: place_offsets
-- Where the tail starts after a snapshot, per partition, whatever was there.
INSERT INTO projector.offsets (consumer, topic, partition, next_offset)
SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS x(p, o)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset

-- name: place_missing_offsets
-- The log's start for every partition that has no offset yet.
INSERT INTO projector.offsets (consumer, topic, partition, next_offset)
SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS x(p, o)
ON CONFLICT (consumer, topic, partition) DO NOTHING

-- name: record_snapshot
-- When the snapshot a version was seeded from was taken, and how many accounts it held.
INSERT INTO projector.snapshots (consumer, taken_at, accounts) VALUES ($1, $2, $3)
ON CONFLICT (consumer) DO UPDATE
SET taken_at = EXCLUDED.taken_at, accounts = EXCLUDED.accounts, recorded_at = now()

-- name: offsets
-- A version's offsets and counters per partition: next offset, applied, consumed (every
-- message with a disposition, less the waiting ones drained since), dead-lettered.
SELECT partition, next_offset, applied,
       applied + ignored + duplicates + dead_lettered + waiting - drained, dead_lettered
FROM projector.offsets WHERE consumer = $1

-- name: behind
-- Where version $1 trails version $2: per topic and partition, by how many messages.
SELECT o.topic, o.partition, o.next_offset - coalesce(n.next_offset, 0)
FROM projector.offsets o LEFT JOIN projector.offsets n
  ON n.consumer = $1 AND n.topic = o.topic AND n.partition = o.partition
WHERE o.consumer = $2 AND o.next_offset > coalesce(n.next_offset, 0)
ORDER BY 1, 2

-- name: accounts_ahead
-- Accounts version $1 has applied further than version $2.
SELECT count(*) FROM projector.account_progress n
JOIN projector.account_progress o ON o.consumer = $2 AND o.account_id = n.account_id
WHERE n.consumer = $1 AND n.last_seq > o.last_seq

-- name: hand_over_notices
-- A cutover: version $1 emits notices only past what version $2 had applied. An old version
-- that still trails the boundary its own cutover gave it has not announced up to it, but the
-- version before it has: the larger of the two goes on.
INSERT INTO projector.account_progress (consumer, account_id, last_seq, emit_after_seq)
SELECT $1, account_id, 0, GREATEST(last_seq, coalesce(emit_after_seq, 0))
FROM projector.account_progress WHERE consumer = $2
ON CONFLICT (consumer, account_id) DO UPDATE SET emit_after_seq = EXCLUDED.emit_after_seq

-- name: forget
-- A dropped version: its offsets, progress, waiting events, parks, snapshot, late writes,
-- seen seqs and dead letters (its inbox rows go in slices, `inbox::delete_consumer`).
WITH o AS (DELETE FROM projector.offsets WHERE consumer = $1),
     p AS (DELETE FROM projector.account_progress WHERE consumer = $1),
     w AS (DELETE FROM projector.waiting_events WHERE consumer = $1),
     k AS (DELETE FROM projector.parked_accounts WHERE consumer = $1),
     s AS (DELETE FROM projector.snapshots WHERE consumer = $1),
     l AS (DELETE FROM projector.inbox_late_writes WHERE consumer = $1),
     e AS (DELETE FROM projector.seen_seqs WHERE consumer = $1)
DELETE FROM projector.dead_letters WHERE consumer = $1

-- name: skip_to
-- A skipped seq $3: account $2's progress moves to it, and no event holds it.
UPDATE projector.account_progress
SET last_seq = $3, last_event_id = NULL, last_occurred_at = NULL, updated_at = now()
WHERE consumer = $1 AND account_id = $2

-- name: record_skip
-- The record of a skipped seq (projector.skips), with who ($4) and why ($5). A dropped
-- version's skips are kept (`forget` leaves them).
INSERT INTO projector.skips (consumer, account_id, seq, skipped_by, reason)
VALUES ($1, $2, $3, $4, $5)
