-- Repairs an engineer makes: who resolved a dead letter, and why; lost seqs skipped on
-- purpose, recorded.
ALTER TABLE projector.dead_letters ADD COLUMN resolved_by text;
-- superseded: a corrected event for the same account and seq was applied after it.
ALTER TABLE projector.dead_letters DROP CONSTRAINT dead_letters_resolution_check;
ALTER TABLE projector.dead_letters ADD CONSTRAINT dead_letters_resolution_check
    CHECK (resolution IN ('retried', 'skipped', 'superseded'));
ALTER TABLE projector.dead_letters ADD COLUMN resolution_note text;

-- A seq an account will never receive (the log lost it, the write side never published it)
-- skipped explicitly: the account resumes after it. One row per skip, never deleted.
CREATE TABLE projector.skips (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer   text        NOT NULL,
    account_id bigint      NOT NULL,
    seq        bigint      NOT NULL,
    skipped_by text        NOT NULL,
    reason     text        NOT NULL,
    skipped_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX skips_account ON projector.skips (consumer, account_id, seq);
