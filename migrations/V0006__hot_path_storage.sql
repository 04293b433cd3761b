-- Storage choices for the hot path, each measured (docs/benchmarks.md).
--
-- The inbox key is compared on every event: byte order (COLLATE "C") compares with memcmp,
-- where the database's linguistic collation calls strcoll. Dedup needs equality only, which
-- byte order gives exactly. This rewrites the table and its index once.
ALTER TABLE projector.inbox
    ALTER COLUMN consumer TYPE text COLLATE "C",
    ALTER COLUMN event_id TYPE text COLLATE "C";
