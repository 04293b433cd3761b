-- The statements of `migrate` (schema.rs) that are not the migrations themselves
-- (migrations/) nor the version registry's (versions/versions.sql): the database's encoding,
-- the migration lock, the schema, and the read names.

-- name: encoding
-- The database's name and encoding: the engine runs only in UTF8.
SELECT current_database()::text, pg_encoding_to_char(encoding)::text
FROM pg_database WHERE datname = current_database()

-- name: lock
-- One `migrate` at a time, across processes.
SELECT pg_advisory_lock($1)

-- name: unlock
SELECT pg_advisory_unlock($1)

-- name: create_schema
-- The engine's schema, before its migrations (the history table lives in it); quiet when it
-- exists. Two statements: run with batch_execute.
SET client_min_messages = warning; CREATE SCHEMA IF NOT EXISTS projector

-- name: has_schema
-- Whether the engine's migrations have run here (the inbox is one of their tables).
SELECT to_regclass('projector.inbox') IS NOT NULL

-- name: name_taken
-- Whether a relation named $1 exists in the current schema: a view's stable read name is
-- created only where nothing holds the name.
SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relname = $1
