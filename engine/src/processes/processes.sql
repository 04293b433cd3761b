-- Every statement on projector.processes and projector.process_views, the tables that say
-- which process does what with each view version it should serve (V0008). A process is
-- known by the random id of its run ($1); its name (`instance`) is a label.

-- name: arrive
-- A process starts: its row, under the id of this run.
INSERT INTO projector.processes (run_id, instance, beat_ms) VALUES ($1, $2, $3)
ON CONFLICT (run_id) DO UPDATE SET seen_at = now(), beat_ms = EXCLUDED.beat_ms;

-- name: beat
-- The heartbeat: the process is alive at the server's clock.
UPDATE projector.processes SET seen_at = now(), beat_ms = $2 WHERE run_id = $1;

-- name: report_views
-- What the process does with each version, one row per version. `since` is the server's
-- time the state began: kept while the state stays, so "failing for 3m" is measured on one
-- clock whatever the process's own says.
INSERT INTO projector.process_views AS p (run_id, consumer, state, since, attempts, detail)
SELECT $1, x.consumer, x.state, now(), x.attempts, x.detail
FROM unnest($2::text[], $3::text[], $4::int[], $5::text[]) AS x(consumer, state, attempts, detail)
ON CONFLICT (run_id, consumer) DO UPDATE
SET state = EXCLUDED.state,
    since = CASE WHEN p.state = EXCLUDED.state THEN p.since ELSE now() END,
    attempts = EXCLUDED.attempts,
    detail = EXCLUDED.detail;

-- name: forget_views
-- Versions the process no longer serves (retired, or no longer live).
DELETE FROM projector.process_views WHERE run_id = $1 AND consumer <> ALL ($2::text[]);

-- name: leave
-- A clean stop: the process and everything it reported go.
DELETE FROM projector.processes WHERE run_id = $1;

-- name: forget_dead
-- Processes not seen for a day (killed, their host gone): nobody reads them any more.
DELETE FROM projector.processes WHERE seen_at < now() - interval '1 day';

-- name: read
-- Every process seen in the last day with what it reports, for status and health. A process
-- is `fresh` while its heartbeat is younger than three beats and ten seconds: past that it is
-- gone (killed, or cut off from PostgreSQL), and what it last said no longer counts.
SELECT p.run_id, p.instance, p.started_at, p.seen_at,
       p.seen_at >= now() - (p.beat_ms * 3 + 10000) * interval '1 millisecond' AS fresh,
       v.consumer, v.state, v.since, v.attempts, v.detail
FROM projector.processes p
LEFT JOIN projector.process_views v ON v.run_id = p.run_id
WHERE p.seen_at >= now() - interval '1 day'
ORDER BY p.run_id, v.consumer;
