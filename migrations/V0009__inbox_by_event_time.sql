-- The inbox keyed by the event's own time, partitioned by day of that time.
--
-- An inbox row is "this view version has applied this event"; seed 001's identity stays one
-- row per (consumer, event_id). With the key (consumer, event_id) every new, producer-chosen
-- id landed on a random leaf of one index as large as a week of events, and after each
-- checkpoint that leaf cost an 8 kB full-page image; retention deleted millions of rows a
-- day, then vacuumed them. Seed 000 says how an inbox may be partitioned without killing
-- dedup: by a time the event itself carries, identical on every redelivery, with that time
-- in the primary key. `occurred_at` is that time: the write side sets it once, when it
-- records the event, and every copy carries it (docs/wire-format.md). Never `now()` or
-- `applied_at`: a redelivery would get a new time, a new key, and be applied again in silence.
--
-- The key is (consumer, occurred_at, event_id), in that order: the events a consumer applies
-- arrive in about the order they occurred, so new keys land at the right edge of their day's
-- index (a few hot pages, no full-page image per event) instead of anywhere in it. A copy is
-- still found exactly: it carries the same event_id and occurred_at. The same event_id with
-- another occurred_at is another key: an order-dependent view's seq check makes it a conflict;
-- docs/operations.md says what an order-independent one does.
--
-- Partitions are one UTC day each, `projector.inbox_pYYYYMMDD`, made by the engine ahead of
-- time and on demand (engine/src/inbox.rs); retention detaches and drops whole days that
-- every consumer's clock has left behind (`projector inbox prune`).

-- The inbox as it was: (consumer, event_id), without the event's time. Its rows still stop
-- redeliveries of the events they record, so the apply statement of a consumer that has rows
-- here also looks them up by id, until `projector inbox prune` empties the table once every
-- such consumer's clock has left its newest row a window behind. Nothing writes here again.
ALTER TABLE projector.inbox RENAME TO inbox_legacy;
ALTER INDEX projector.inbox_pkey RENAME TO inbox_legacy_pkey;
ALTER INDEX projector.inbox_applied_at RENAME TO inbox_legacy_applied_at;
-- NOT VALID: no scan of the existing rows; every new row is refused.
ALTER TABLE projector.inbox_legacy ADD CONSTRAINT inbox_legacy_frozen CHECK (false) NOT VALID;

-- An older binary still running through a rolling upgrade inserts (consumer, event_id) into
-- `projector.inbox`, which now names the table below: the default of occurred_at raises, with
-- a SQLSTATE (55000) the engine retries rather than dead-letters, so that binary stops
-- applying, loudly, instead of writing rows no newer binary would find.
CREATE FUNCTION projector.inbox_occurred_at_required() RETURNS timestamptz
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'projector.inbox is keyed by the event''s occurred_at since migration V0009; this binary predates it: upgrade it'
        USING ERRCODE = '55000';
END
$$;

CREATE TABLE projector.inbox (
    consumer    text        COLLATE "C" NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT projector.inbox_occurred_at_required(),
    -- Byte order: the key is compared on every event; dedup needs equality only.
    event_id    text        COLLATE "C" NOT NULL,
    -- For operators only: retention goes by partition, never by this column.
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, occurred_at, event_id)
) PARTITION BY RANGE (occurred_at);

-- The same binary's deletes went by ctid (`retire --drop`, `inbox prune`), and a ctid names a
-- row only within one table: on the days of the inbox it would take other consumers' rows in
-- other days. A DELETE, UPDATE or TRUNCATE of `projector.inbox` itself is refused (55000 too)
-- unless the session says it knows the layout (`SET projector.inbox_layout = 'days'`); the
-- engine deletes from each day's table, or drops the day.
CREATE FUNCTION projector.inbox_layout_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('projector.inbox_layout', true), '') <> 'days' THEN
        RAISE EXCEPTION 'projector.inbox is partitioned by day since migration V0009: a % of it by ctid would reach other consumers'' rows in other days; this binary predates it: upgrade it', TG_OP
            USING ERRCODE = '55000';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER inbox_layout_guard BEFORE DELETE OR UPDATE OR TRUNCATE ON projector.inbox
    FOR EACH STATEMENT EXECUTE FUNCTION projector.inbox_layout_guard();

-- An older binary's `status` counts the inbox row by row when its parent's reltuples says it
-- was never analyzed: analyzed once here (a partitioned parent is never analyzed by autovacuum),
-- it reads a figure instead of scanning every day.
ANALYZE projector.inbox;

-- Writes into a day that has already ended (a late event, a rebuild replaying old days): one
-- row per day, consumer and Kafka partition (so two workers never wait on one row), written in
-- the batch's transaction. Retention keeps a day until every consumer's clock is a window past
-- both the day's end and its latest write here, so a row written late lives a whole window too.
CREATE TABLE projector.inbox_late_writes (
    day        date        NOT NULL,
    consumer   text        NOT NULL,
    topic      text        NOT NULL,
    partition  integer     NOT NULL,
    written_at timestamptz NOT NULL,
    PRIMARY KEY (day, consumer, topic, partition)
);

-- The time of the event that holds last_seq, beside its id: the account's last event is
-- known by both, as the inbox knows an event, so a copy of it is told from its id stamped with
-- another time without the inbox (whose day retention may have dropped). NULL for rows written
-- before: the inbox is asked then.
ALTER TABLE projector.account_progress ADD COLUMN last_occurred_at timestamptz;

-- The first day of the retained window: set to the day before the first `migrate` made days
-- ahead, and moved forward by `projector inbox prune` past every day it drops. An event on an
-- earlier day is outside the window (counted below): a day made for it later by a batch does
-- not bring it in.
CREATE TABLE projector.inbox_retention (
    one            boolean PRIMARY KEY DEFAULT true CHECK (one),
    retained_from  date    NOT NULL
);

-- Events whose occurred_at lies outside the retained window (older than it, or further ahead
-- of the server's clock than a day), counted per partition with the other exact counters.
ALTER TABLE projector.offsets ADD COLUMN outside_window bigint NOT NULL DEFAULT 0;

-- Events an order-independent view (eod) on a source ordered per account applied at or below
-- the highest seq it had applied for their account (projector.seen_seqs, V0010), which its
-- inbox did not know: the same event_id stamped with another occurred_at (another event to
-- the inbox), a copy whose day was pruned, or a producer publishing an account out of order.
-- Each is likely an event applied twice; counted so that it shows.
ALTER TABLE projector.offsets ADD COLUMN below_seen bigint NOT NULL DEFAULT 0;
