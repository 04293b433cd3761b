-- Every statement on projector.views, the registry of view versions (V0001): each version's
-- lifecycle state (building, live, retired), the fingerprint of the code that registered it,
-- and when `retire --drop` dropped its tables. From `register` on, the statements change a
-- version's state; `VersionState` in mod.rs says which moves they make.

-- name: of_name
-- Every registered version of a view, in order.
SELECT version, state, dropped_at IS NOT NULL FROM projector.views
WHERE name = $1 ORDER BY version

-- name: lock_of_name
-- The same, the rows locked until the transaction ends: a cutover decides under this lock.
SELECT version, state, dropped_at IS NOT NULL FROM projector.views
WHERE name = $1 ORDER BY version FOR UPDATE

-- name: lock_name
-- Locks a view's registry rows, reading nothing: a cancel marks its rebuild under the lock
-- a cutover takes.
SELECT 1 FROM projector.views WHERE name = $1 FOR UPDATE

-- name: all_states
-- Every registered version's state, for `projector views`.
SELECT name, version, state FROM projector.views

-- name: live_version
-- The live version of a view, if any.
SELECT version FROM projector.views WHERE name = $1 AND state = 'live'

-- name: live_everywhere
-- Every live version not dropped, the versions a running service consumes.
SELECT name, version FROM projector.views
WHERE state = 'live' AND dropped_at IS NULL ORDER BY name

-- name: live_fingerprint
-- The live version of a view (not dropped) and the fingerprint it was registered with.
SELECT version, fingerprint FROM projector.views
WHERE name = $1 AND state = 'live' AND dropped_at IS NULL

-- name: recorded
-- The fingerprint a version's row records (NULL: none yet); no row: not registered.
SELECT fingerprint FROM projector.views WHERE name = $1 AND version = $2

-- name: recorded_and_dropped
-- The fingerprint a version's row records, and whether its tables were dropped.
SELECT fingerprint, dropped_at IS NOT NULL FROM projector.views
WHERE name = $1 AND version = $2

-- name: lock_recorded
-- The same, whether dropped first, the row locked for the transaction: `migrate` adopts a
-- version registered before fingerprints existed under it.
SELECT dropped_at IS NOT NULL, fingerprint FROM projector.views
WHERE name = $1 AND version = $2 FOR UPDATE

-- name: lock_fingerprint
-- The fingerprint of a version just registered, the row locked: a rebuild checks that the
-- code that registered it is its own.
SELECT fingerprint FROM projector.views WHERE name = $1 AND version = $2 FOR UPDATE

-- name: highest
-- The highest version ever registered for a view, dropped ones included.
SELECT max(version) FROM projector.views WHERE name = $1

-- name: is_retired
-- A row when the version (its consumer name) is retired.
SELECT 1 FROM projector.views WHERE consumer = $1 AND state = 'retired'

-- name: is_dropped
-- A row when `retire --drop` dropped the version's (its consumer name) tables.
SELECT 1 FROM projector.views WHERE consumer = $1 AND dropped_at IS NOT NULL

-- name: register
-- A version installed by `migrate`: live when the view has no version yet, building
-- otherwise (a rebuild fills it and cuts over). Returns the state given; nothing when the
-- version was registered already.
INSERT INTO projector.views (name, version, state, fingerprint)
SELECT $1, $2, CASE WHEN EXISTS (SELECT 1 FROM projector.views WHERE name = $1)
                    THEN 'building' ELSE 'live' END, $3
ON CONFLICT (name, version) DO NOTHING RETURNING state

-- name: register_building
-- A version a rebuild is about to build; nothing when it is registered already.
INSERT INTO projector.views (name, version, state, fingerprint)
VALUES ($1, $2, 'building', $3) ON CONFLICT (name, version) DO NOTHING

-- name: adopt_fingerprint
-- A version registered before fingerprints existed takes the code's that is registered for
-- exactly that version.
UPDATE projector.views SET fingerprint = $3
WHERE name = $1 AND version = $2 AND fingerprint IS NULL

-- name: make_live
-- Cutover: building -> live (the caller holds `lock_of_name` and has retired the old one).
UPDATE projector.views SET state = 'live', state_changed_at = now()
WHERE name = $1 AND version = $2

-- name: retire_replaced
-- Cutover: the version that was live -> retired.
UPDATE projector.views SET state = 'retired', state_changed_at = now()
WHERE name = $1 AND version = $2

-- name: retire
-- `projector retire`: building or retired -> retired, never the live version. The condition
-- is in the statement, evaluated on the row as it is once locked (a cutover may have made
-- it live since it was read). Retiring again keeps the time it was retired.
UPDATE projector.views SET state = 'retired',
    state_changed_at = CASE WHEN state = 'retired' THEN state_changed_at ELSE now() END
WHERE name = $1 AND version = $2 AND state <> 'live'

-- name: mark_dropped
-- `retire --drop` dropped the version's tables: never recreated empty.
UPDATE projector.views SET dropped_at = now() WHERE name = $1 AND version = $2

-- name: unregister_building
-- A cancelled rebuild's version leaves the registry, its number free again; only while
-- still building.
DELETE FROM projector.views WHERE name = $1 AND version = $2 AND state = 'building'
