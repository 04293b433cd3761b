-- Every statement on projector.rebuilds (V0003), the table of rebuilds: each rebuild's
-- version, source, phase (seeding -> tailing -> done, or cancelled), pause and who cuts
-- over. Its owner is state.rs; the view versions' own registry is the engine's
-- (engine/src/versions/versions.sql).

-- name: unfinished
-- The rebuild of a view under way (seeding or tailing), if any.
SELECT version, source, phase, paused, cutover FROM projector.rebuilds
WHERE name = $1 AND phase IN ('seeding', 'tailing')

-- name: cancellable
-- The rebuild a cancel acts on: the one under way, else one whose cancel did not finish.
SELECT version, source, phase, paused, cutover FROM projector.rebuilds
WHERE name = $1 AND phase IN ('seeding', 'tailing', 'cancelled')
ORDER BY phase = 'cancelled', version DESC LIMIT 1

-- name: of_version
-- The rebuild of a view into a version, whatever its phase.
SELECT version, source, phase, paused, cutover FROM projector.rebuilds
WHERE name = $1 AND version = $2

-- name: phase
-- The phase of the rebuild of a view into a version.
SELECT phase FROM projector.rebuilds WHERE name = $1 AND version = $2

-- name: set_paused
-- Pauses or resumes the rebuild under way; returns its version.
UPDATE projector.rebuilds SET paused = $2, updated_at = now()
WHERE name = $1 AND phase IN ('seeding', 'tailing') RETURNING version

-- name: start
-- A rebuild begins seeding; nothing when it is recorded already.
INSERT INTO projector.rebuilds (consumer, name, version, source, phase, cutover)
VALUES ($1, $2, $3, $4, 'seeding', $5) ON CONFLICT (consumer) DO NOTHING

-- name: seeded
-- seeding -> tailing after the snapshot, with the snapshot's time.
UPDATE projector.rebuilds SET phase = 'tailing', snapshot_at = $2, updated_at = now()
WHERE consumer = $1

-- name: tailing
-- seeding -> tailing without a snapshot (from the earliest offsets). Only from seeding: a
-- cancel that came meanwhile stays a cancel.
UPDATE projector.rebuilds SET phase = 'tailing', updated_at = now()
WHERE name = $1 AND version = $2 AND phase = 'seeding'

-- name: done
-- The cutover closes the rebuild of its version.
UPDATE projector.rebuilds SET phase = 'done', finished_at = now(), updated_at = now()
WHERE consumer = $1 AND phase IN ('seeding', 'tailing')

-- name: cancel
-- A cancel marks the rebuild, while its version is still building (under the registry's
-- lock, which a cutover takes too).
UPDATE projector.rebuilds SET phase = 'cancelled', finished_at = now(), updated_at = now()
WHERE name = $1 AND version = $2 AND phase IN ('seeding', 'tailing', 'cancelled')
  AND EXISTS (SELECT 1 FROM projector.views
              WHERE name = $1 AND version = $2 AND state = 'building')
