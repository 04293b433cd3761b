-- The running locks (running.rs): advisory locks keyed by ("prjr", hashtext(consumer)),
-- held shared by whoever runs a view version and taken exclusively by a drop. No table.

-- name: try_hold
SELECT pg_try_advisory_lock_shared($1, hashtext($2))

-- name: try_hold_for_transaction
SELECT pg_try_advisory_xact_lock_shared($1, hashtext($2))

-- name: let_go
SELECT pg_advisory_unlock_shared($1, hashtext($2))

-- name: try_take
SELECT pg_try_advisory_lock($1, hashtext($2))

-- name: give_back
SELECT pg_advisory_unlock($1, hashtext($2))

-- name: ping
-- Whether the session still answers.
SELECT 1
