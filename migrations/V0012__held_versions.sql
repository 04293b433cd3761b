-- The type and version of an event that waits because it is of a version the view did not
-- read when it came (held for its version, reason `unknown_version`); NULL for an event that
-- waits for an earlier `seq`, and for events stored before this migration. An
-- order-independent view holds each such event at its own `seq`, and its park names only
-- the lowest: a build that reads a later one finds it here when it starts
-- (queries::DRAINABLE_ACCOUNTS), instead of when the account's next event comes.
ALTER TABLE projector.waiting_events ADD COLUMN event_type text;
ALTER TABLE projector.waiting_events ADD COLUMN type_version integer;
