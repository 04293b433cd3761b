-- projector's own schema. Everything a view version owns is keyed by its consumer name
-- `<view>_v<version>`, so two versions of one view never see each other's progress.
--
-- The schema `projector` itself is created by the migration runner before this file runs,
-- because refinery keeps its history table inside it.

-- The view registry: which versions exist and which one readers see.
CREATE TABLE projector.views (
    name             text        NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]*$'),
    version          integer     NOT NULL CHECK (version > 0),
    consumer         text        GENERATED ALWAYS AS (name || '_v' || version) STORED,
    state            text        NOT NULL CHECK (state IN ('building', 'live', 'retired')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    state_changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version),
    UNIQUE (consumer)
);
-- Readers query a stable name that points at exactly one live version.
CREATE UNIQUE INDEX views_one_live ON projector.views (name) WHERE state = 'live';

-- "This view version has applied this event." The consumer is part of the key: with
-- event_id alone, v2 of a view would find every event already processed and stay empty.
CREATE TABLE projector.inbox (
    consumer   text        NOT NULL,
    event_id   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
-- Retention deletes old rows in small batches ordered by this column. The table is
-- deliberately not partitioned by applied_at: dropping a partition by now() would drop
-- dedup records of events that can still be redelivered, and dedup would silently stop.
CREATE INDEX inbox_applied_at ON projector.inbox (applied_at);

-- Kafka offsets live here, written in the same transaction as the view rows. The update
-- is conditional on next_offset being where the writer started (fencing), with the row
-- locked, so a consumer that lost its partition cannot commit.
--
-- The counters are updated by the same statement, so they are exact: they count what
-- committed, survive crashes, and never count a redelivered batch twice.
CREATE TABLE projector.offsets (
    consumer      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL CHECK (partition >= 0),
    next_offset   bigint      NOT NULL CHECK (next_offset >= 0),
    applied       bigint      NOT NULL DEFAULT 0,
    ignored       bigint      NOT NULL DEFAULT 0,
    duplicates    bigint      NOT NULL DEFAULT 0,
    dead_lettered bigint      NOT NULL DEFAULT 0,
    parked        bigint      NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

-- Per-account progress. seq is assigned by the write side per account (1, 2, 3, ... with no
-- gaps), not a bigserial: a serial id is reserved at insert and not at commit, so 101 can
-- become visible before 100 and a reader would skip 100 for ever.
--
-- watermark_seq is set when a rebuild seeds this view version from a snapshot: the snapshot
-- already reflects every event up to it, so the tail skips them.
CREATE TABLE projector.account_progress (
    consumer      text        NOT NULL,
    account_id    bigint      NOT NULL,
    last_seq      bigint      NOT NULL CHECK (last_seq >= 0),
    watermark_seq bigint      CHECK (watermark_seq >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, account_id)
);

-- Snapshots taken for rebuilds: when, and how many accounts they reflect.
CREATE TABLE projector.snapshots (
    consumer    text        NOT NULL PRIMARY KEY,
    taken_at    timestamptz NOT NULL,
    accounts    bigint      NOT NULL CHECK (accounts >= 0),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- Messages a view version could not apply, with everything needed to replay them.
--   poison:       not valid UTF-8/JSON, a missing field or a field of the wrong type
--   apply_failed: the view's statement raised an error for this event; its account is parked
CREATE TABLE projector.dead_letters (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('poison', 'apply_failed')),
    message_key bytea,
    payload     bytea       NOT NULL,
    event_id    text,
    account_id  bigint,
    seq         bigint,
    error       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    resolution  text        CHECK (resolution IN ('retried', 'skipped')),
    -- A message is dead-lettered at most once per view version: the insert happens in the
    -- transaction that moves the offset past it.
    UNIQUE (consumer, topic, partition, "offset")
);
CREATE INDEX dead_letters_open ON projector.dead_letters (consumer, created_at) WHERE resolved_at IS NULL;

-- An account whose events cannot be applied in order right now.
--   gap:    an event arrived with seq > last_seq + 1; waiting for last_seq + 1
--   failed: the event at blocked_seq failed to apply (see dead_letters); waiting for an engineer
CREATE TABLE projector.parked_accounts (
    consumer    text        NOT NULL,
    account_id  bigint      NOT NULL,
    reason      text        NOT NULL CHECK (reason IN ('gap', 'failed')),
    blocked_seq bigint      NOT NULL,
    detail      text        NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, account_id)
);

-- Events of parked accounts, waiting in seq order with their raw bytes.
CREATE TABLE projector.parked_events (
    consumer    text        NOT NULL,
    account_id  bigint      NOT NULL,
    seq         bigint      NOT NULL,
    event_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    message_key bytea,
    payload     bytea       NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, account_id, seq)
);
