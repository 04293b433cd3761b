-- Rebuilding a view into a new version while the live stream keeps flowing.

-- A version whose tables, inbox rows and offsets were dropped keeps its registry row, so its
-- number is never reused: metrics, dead letters and notices stay attributable.
ALTER TABLE projector.views ADD COLUMN dropped_at timestamptz;

-- One row per rebuild: everything the command needs to resume after a crash at any moment.
-- Its progress itself lives where every version's does: offsets, inbox, account progress.
CREATE TABLE projector.rebuilds (
    consumer    text        PRIMARY KEY,
    name        text        NOT NULL,
    version     integer     NOT NULL,
    -- snapshot: seeded from the write side's authoritative state, then the Kafka tail from
    --           the offsets of (snapshot time - margin); earliest: the whole retained log.
    source      text        NOT NULL CHECK (source IN ('snapshot', 'earliest')),
    -- seeding: registered, tables created, not seeded yet (seeding is one transaction)
    -- tailing: consuming under its own consumer name
    -- done:    cut over; cancelled: stopped and dropped
    phase       text        NOT NULL CHECK (phase IN ('seeding', 'tailing', 'done', 'cancelled')),
    paused      boolean     NOT NULL DEFAULT false,
    cutover     text        NOT NULL CHECK (cutover IN ('auto', 'manual')),
    snapshot_at timestamptz,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    FOREIGN KEY (name, version) REFERENCES projector.views (name, version) ON DELETE CASCADE
);
-- One rebuild of a view at a time.
CREATE UNIQUE INDEX rebuilds_one_running ON projector.rebuilds (name)
    WHERE phase IN ('seeding', 'tailing');

-- Side effects a view emits from its statement (a position closed, say), for a relay to
-- publish. Only the live version emits, and only for events past the boundary its cutover set
-- (account_progress.emit_after_seq): a rebuild replaying a year of history sends nothing
-- again. The unique key is a second line of defence: one notice per view, kind and event,
-- whichever version emitted it.
CREATE TABLE projector.notices (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    view_name  text        NOT NULL,
    consumer   text        NOT NULL,
    kind       text        NOT NULL,
    event_id   text        NOT NULL,
    account_id bigint      NOT NULL,
    seq        bigint      NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Set by the relay once published.
    sent_at    timestamptz,
    UNIQUE (view_name, kind, event_id)
);
CREATE INDEX notices_unsent ON projector.notices (id) WHERE sent_at IS NULL;

-- The seq up to which the version this one replaced had applied an account's events (and
-- emitted their notices): set at cutover; this version emits only past it.
ALTER TABLE projector.account_progress ADD COLUMN emit_after_seq bigint;
