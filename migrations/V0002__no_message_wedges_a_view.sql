-- No message may wedge a view, and the engine speaks one vocabulary.
--
-- An event that waits for an earlier seq is *waiting*; its account is *parked*. The table of
-- such events was called parked_events, and the offsets' counter of them `parked`.
ALTER TABLE projector.parked_events RENAME TO waiting_events;
ALTER INDEX projector.parked_events_pkey RENAME TO waiting_events_pkey;
ALTER TABLE projector.offsets RENAME COLUMN parked TO waiting;
-- Waiting events counted again when they leave the waiting table, in whatever became of them:
-- applied + ignored + duplicates + dead_lettered + waiting - drained = messages consumed.
ALTER TABLE projector.offsets ADD COLUMN drained bigint NOT NULL DEFAULT 0;
-- Which process committed the partition last (its --instance-id, else host:pid): operators
-- see who holds a partition, and tests see a takeover without reading logs.
ALTER TABLE projector.offsets ADD COLUMN committed_by text;

-- conflict: a second event claims an (account, seq) another event already holds; a bug of
-- the write side, not a duplicate. It is dead-lettered naming both events.
ALTER TABLE projector.dead_letters DROP CONSTRAINT dead_letters_kind_check;
ALTER TABLE projector.dead_letters ADD CONSTRAINT dead_letters_kind_check
    CHECK (kind IN ('poison', 'apply_failed', 'conflict'));
-- A park names the open dead letter that holds its blocking seq; this finds it.
CREATE INDEX dead_letters_account_seq ON projector.dead_letters (consumer, account_id, seq)
    WHERE resolved_at IS NULL;

-- Why an account is parked:
--   gap:         waiting for blocked_seq, which has not arrived
--   dead_letter: blocked_seq arrived but was dead-lettered (dead_letter_id): poison, or the
--                view's statement failed on it; a corrected event for that seq, or an
--                engineer, releases it
-- A park used to be `failed` when a statement failed; that is a dead letter now.
ALTER TABLE projector.parked_accounts DROP CONSTRAINT parked_accounts_reason_check;
UPDATE projector.parked_accounts SET reason = 'dead_letter' WHERE reason = 'failed';
ALTER TABLE projector.parked_accounts ADD CONSTRAINT parked_accounts_reason_check
    CHECK (reason IN ('gap', 'dead_letter'));
ALTER TABLE projector.parked_accounts ADD COLUMN dead_letter_id bigint;
UPDATE projector.parked_accounts k SET dead_letter_id = d.id
FROM projector.dead_letters d
WHERE k.reason = 'dead_letter' AND d.consumer = k.consumer AND d.account_id = k.account_id
  AND d.seq = k.blocked_seq AND d.resolved_at IS NULL;

-- The event that holds last_seq: a later event claiming the same seq is a conflict, and its
-- dead letter names both.
ALTER TABLE projector.account_progress ADD COLUMN last_event_id text;
