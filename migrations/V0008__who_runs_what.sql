-- Nothing is left out in silence, and a version runs only with the code that made it.

-- The fingerprint of the code that registered a version (its DDL, statements, subscribed
-- types, fields, dedup mode and ordering; `projector_engine::fingerprint`): a process whose
-- code for the version has another fingerprint never consumes or repairs it, so an older
-- binary left running in a rolling upgrade cannot apply v1's SQL to `portfolio_v2`. It is
-- written once, when the version is registered, and never changed: a code change that keeps
-- a version's results declares the fingerprints it replaces (`Projection::replaces`), one
-- that changes them is a new version. Versions registered before this column existed get the
-- fingerprint of the first binary that installs or runs them.
ALTER TABLE projector.views ADD COLUMN fingerprint text;

-- Every process that runs views (`projector run`), with a heartbeat: `projector status` and
-- every process's `/health` read which process consumes, fails to start or skips which
-- version. A process that died keeps its row until its heartbeat is old; readers ignore it
-- then, and the next process to start deletes rows not seen for a day.
--
-- Keyed by a random id of each run, not by the process's name (`--instance-id`, else
-- host:pid): two processes may share a name (one config file for deployments that split
-- --views; pid 1 in containers on the host's network), and neither may erase the other's
-- reports.
CREATE TABLE projector.processes (
    run_id     text        PRIMARY KEY,
    instance   text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    -- How often the process beats: a reader counts it gone after a few missed beats.
    beat_ms    integer     NOT NULL CHECK (beat_ms > 0)
);

-- What a process does with each version it should serve:
--   starting:  its task is starting (connecting, preparing statements, joining the group)
--   consuming: it consumes the topic into the version
--   failing:   it could not start, or stopped with an error; retried with backoff
--   skipped:   this process's code for the version is not the code that registered it, or
--              it has none; it never consumes or repairs the version
CREATE TABLE projector.process_views (
    run_id   text        NOT NULL REFERENCES projector.processes ON DELETE CASCADE,
    consumer text        NOT NULL,
    state    text        NOT NULL CHECK (state IN ('starting', 'consuming', 'failing', 'skipped')),
    since    timestamptz NOT NULL,
    attempts integer     NOT NULL DEFAULT 0,
    detail   text,
    PRIMARY KEY (run_id, consumer)
);
