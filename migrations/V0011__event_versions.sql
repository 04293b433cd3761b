-- Event evolution: an event carries the version of its type's shape (`type_version`), and a
-- view reads each type at one version, through upcasters (engine/src/upcast.rs). An event of
-- a version newer than a view reads cannot be read by it, and by default it waits with its
-- raw bytes, its account parked behind it, until a build that reads the version runs.

-- The third reason an account is parked:
--   unknown_version: the event at blocked_seq is of a version of its type that the view
--                    did not read when it came; it waits for a build that reads it
ALTER TABLE projector.parked_accounts DROP CONSTRAINT parked_accounts_reason_check;
ALTER TABLE projector.parked_accounts ADD CONSTRAINT parked_accounts_reason_check
    CHECK (reason IN ('gap', 'dead_letter', 'unknown_version'));

-- For `unknown_version`, the type and version of the held event: a build that reads that
-- version finds the account when it starts and drains it, and a build that does not passes
-- it by instead of draining it in vain again and again (queries::DRAINABLE_ACCOUNTS).
ALTER TABLE projector.parked_accounts ADD COLUMN event_type text;
ALTER TABLE projector.parked_accounts ADD COLUMN type_version integer;
ALTER TABLE projector.parked_accounts ADD CONSTRAINT parked_accounts_held_version
    CHECK ((reason = 'unknown_version') = (event_type IS NOT NULL AND type_version IS NOT NULL));
