-- Statements on projector.parked_accounts and projector.waiting_events (V0001, V0002)
-- outside a batch: what an engineer on call lists and reads, and what a repair's skip checks.
-- A batch parks, unparks and drains with the hot path's statements (`queries.sql`:
-- park_accounts, load_waiting, drainable_accounts...).

-- name: list
-- Parked accounts, longest parked first, of every version of view $1 (NULL: every view),
-- at most $2, each with how many events wait behind it.
SELECT k.consumer, k.account_id, k.reason, k.blocked_seq, k.dead_letter_id,
       (SELECT count(*) FROM projector.waiting_events w
        WHERE w.consumer = k.consumer AND w.account_id = k.account_id),
       k.parked_at::text, k.detail
FROM projector.parked_accounts k
WHERE $1::text IS NULL OR k.consumer LIKE $1 || '\_v%'
ORDER BY k.parked_at LIMIT $2

-- name: dead_letter
-- The dead letter an account of a view version is parked on, if it is parked on one.
SELECT dead_letter_id FROM projector.parked_accounts WHERE consumer = $1 AND account_id = $2

-- name: blocked_seq
-- The seq a parked account of a view version waits for; no row: not parked.
SELECT blocked_seq FROM projector.parked_accounts WHERE consumer = $1 AND account_id = $2

-- name: count
-- Parked accounts of a view version.
SELECT count(*) FROM projector.parked_accounts WHERE consumer = $1

-- name: waits_at
-- Whether an event of account $2 of a view version waits at seq $3: a skip of that seq is
-- refused, the event can be applied.
SELECT 1 FROM projector.waiting_events WHERE consumer = $1 AND account_id = $2 AND seq = $3 LIMIT 1
