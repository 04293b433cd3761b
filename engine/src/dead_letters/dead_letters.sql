-- Statements on projector.dead_letters (V0001, V0005) outside a batch: what an engineer on
-- call lists, reads and skips. A batch writes and resolves dead letters with the hot path's
-- statements (`queries.sql`: insert_dead_letters, resolve_superseded, load_dead_seqs); a
-- repair (`apply/repair.rs`) reads and resolves them under its locks with the last four
-- here, and skips through `skip`.

-- name: list
-- Dead letters, newest first: open ones only unless $2, of every version of view $1 (NULL:
-- every view), at most $3.
SELECT id, consumer, kind, topic, partition, "offset", account_id, seq, error,
       created_at::text, coalesce(resolution, '')
FROM projector.dead_letters
WHERE ($1::text IS NULL OR consumer LIKE $1 || '\_v%') AND ($2 OR resolved_at IS NULL)
ORDER BY id DESC LIMIT $3

-- name: show
-- One dead letter in full.
SELECT consumer, kind, topic, partition, "offset", message_key, payload, event_id,
       account_id, seq, error, created_at::text, resolved_at::text, resolution,
       resolved_by, resolution_note
FROM projector.dead_letters WHERE id = $1

-- name: consumer
-- The view version (its consumer name) a dead letter belongs to.
SELECT consumer FROM projector.dead_letters WHERE id = $1

-- name: account
-- The account a dead letter holds, if it names one.
SELECT account_id FROM projector.dead_letters WHERE id = $1

-- name: error
-- A dead letter's error, the newest when it failed again.
SELECT error FROM projector.dead_letters WHERE id = $1

-- name: count_open
-- Open dead letters of a view version.
SELECT count(*) FROM projector.dead_letters WHERE consumer = $1 AND resolved_at IS NULL

-- name: skip
-- Gives dead letters up, recorded with who ($1) and why ($2): the one of id $3, or every
-- open one of consumer $4 at account $5's seq $6 (a skipped seq). Open ones only: a
-- resolved dead letter keeps its resolution.
UPDATE projector.dead_letters SET resolved_at = now(), resolution = 'skipped',
    resolved_by = $1, resolution_note = $2
WHERE resolved_at IS NULL
  AND (id = $3 OR (consumer = $4 AND account_id = $5 AND seq = $6))

-- name: lock_for_retry
-- A repair's retry: the dead letter of id $1 of view version $2, its message and whether it
-- is resolved, locked until the retry commits.
SELECT topic, partition, "offset", message_key, payload, resolved_at IS NOT NULL
FROM projector.dead_letters WHERE id = $1 AND consumer = $2 FOR UPDATE

-- name: resolve_retried
-- A retry that no longer dead-letters its event resolves the dead letter, with who ($2) and
-- what became of the event ($3: `waiting` opens it again should the event fail when it
-- drains, see the hot path's insert_dead_letters).
UPDATE projector.dead_letters SET resolved_at = now(), resolution = 'retried',
    resolved_by = $2, resolution_note = $3 WHERE id = $1

-- name: lock_for_skip
-- A repair's skip: the seq, kind and whether resolved of the dead letter of id $1, read again
-- (and locked) under its account's lock.
SELECT seq, kind, resolved_at IS NOT NULL FROM projector.dead_letters
WHERE id = $1 FOR UPDATE

-- name: account_in
-- The account a dead letter of id $1 of view version $2 names, for a repair that locks the
-- account before the dead letter.
SELECT account_id FROM projector.dead_letters WHERE id = $1 AND consumer = $2
