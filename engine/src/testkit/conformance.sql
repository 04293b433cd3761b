-- The conformance suite's own statements: the write side it seeds a snapshot from, and the
-- engine's bookkeeping it reads back to check each schedule's outcome. A view's tables are
-- dumped by a statement composed per table, in conformance.rs.

-- name: book_account_seq
-- The write side's last seq per account, for a snapshot statement to read.
INSERT INTO account_seq (account_id, last_seq)
SELECT * FROM unnest($1::bigint[], $2::bigint[])

-- name: record_watermarks
-- A snapshot's watermarks: each account starts at the seq its snapshot includes.
INSERT INTO projector.account_progress (consumer, account_id, last_seq, watermark_seq)
SELECT $1, a, w, w FROM unnest($2::bigint[], $3::bigint[]) AS t(a, w)

-- name: dead_letters
-- A view version's dead letters, by offset.
SELECT "offset", kind, payload, error FROM projector.dead_letters
WHERE consumer = $1 ORDER BY "offset"

-- name: parked
-- A view version's parked accounts, by account.
SELECT account_id, reason, blocked_seq, detail FROM projector.parked_accounts
WHERE consumer = $1 ORDER BY account_id

-- name: waiting
-- How many events of a view version wait.
SELECT count(*) FROM projector.waiting_events WHERE consumer = $1

-- name: offset
-- The offset row and counters of the suite's one partition.
SELECT next_offset, applied, ignored, duplicates, dead_lettered, waiting, drained
FROM projector.offsets WHERE consumer = $1 AND topic = $2 AND partition = 0
