-- The write side's schema: what `WriteSide::new` creates, every statement idempotent, run in
-- one transaction under an advisory lock so that two processes starting at once take turns.
--
-- Two places:
--   public.positions, public.account_seq  the snapshot contract of docs/views.md. A rebuild
--       reads them by their bare names through search_path; public is on the default
--       search_path, so `projector rebuild --from snapshot` against this database finds them
--       with no setting at all.
--   writeside.*  the write side's own tables, out of the way of the views' tables.

-- name: schema
CREATE SCHEMA IF NOT EXISTS writeside;

-- One row per (account, symbol) the account ever traded, flat positions included (they carry
-- realized P&L). Written in the transaction that assigns the event's seq, by the same rules as
-- the portfolio view (writeside.sql, book_trade).
CREATE TABLE IF NOT EXISTS public.positions (
    account_id    bigint      NOT NULL,
    symbol        text        NOT NULL,
    net_qty       numeric     NOT NULL,
    avg_price     numeric     NOT NULL CHECK (avg_price >= 0),
    realized_pnl  numeric     NOT NULL,
    last_price    numeric     NOT NULL CHECK (last_price >= 0),
    last_trade_at timestamptz NOT NULL,
    last_seq      bigint      NOT NULL CHECK (last_seq > 0),
    PRIMARY KEY (account_id, symbol)
);

-- The per-account sequence counter and the snapshot's watermark in one row: the seq of the
-- account's last event of any type. A counter row and not a bigserial: a sequence hands out
-- numbers at insert, not at commit, so 101 can commit before 100 and a reader that saw 101
-- skips 100 for ever; and a rolled-back insert burns its number, leaving a gap that parks the
-- account in every order-dependent view. The row is updated in the event's transaction: its
-- lock orders the account's writers, and a rollback gives the number back.
CREATE TABLE IF NOT EXISTS public.account_seq (
    account_id bigint PRIMARY KEY,
    last_seq   bigint NOT NULL CHECK (last_seq > 0)
);

-- This database's tag, part of every event id. A write side whose database was recreated
-- starts its seqs again at 1; with the same ids its events would be dropped as duplicates by
-- every view inbox that saw the old ones.
CREATE TABLE IF NOT EXISTS writeside.meta (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    instance   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO writeside.meta (instance)
VALUES (substr(md5(random()::text || clock_timestamp()::text), 1, 8))
ON CONFLICT (singleton) DO NOTHING;

-- Client idempotency keys (seed 000): unique per account, not globally, or two accounts that
-- pick the same key would see each other's replies. The hash of the request and its first
-- reply are kept with the key: a retry gets that reply, a different request under the key is
-- refused. The reply is written in the transaction that claimed the key, so a committed row
-- always has one: the event written, or, for an order the quote gate refused,
-- {"refused": {...}} with its reason, committed with no event so that a retry gets the same
-- refusal however the quote has changed since.
CREATE TABLE IF NOT EXISTS writeside.idempotency_keys (
    account_id   bigint      NOT NULL,
    key          text        NOT NULL,
    request_hash bytea       NOT NULL,
    reply        jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, key)
);
-- Retention deletes in batches by age; without this index each batch scans the table.
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at ON writeside.idempotency_keys (created_at);

-- Every event, as the exact wire JSON that is published (payload), with the columns the write
-- side queries. The unique (account_id, seq) is the second line of defence behind the counter
-- row: two events can never claim one seq.
CREATE TABLE IF NOT EXISTS writeside.events (
    event_id    text        PRIMARY KEY,
    account_id  bigint      NOT NULL,
    seq         bigint      NOT NULL CHECK (seq > 0),
    type        text        NOT NULL,
    occurred_at timestamptz NOT NULL,
    payload     text        NOT NULL,
    UNIQUE (account_id, seq)
);

-- A fill is busted at most once: the rule is this primary key, not a check in the code.
CREATE TABLE IF NOT EXISTS writeside.busts (
    fill_event_id text PRIMARY KEY REFERENCES writeside.events (event_id),
    event_id      text NOT NULL UNIQUE
);

-- The transactional outbox: a row per event, added in the event's transaction, marked sent by
-- the relay after the broker acknowledged it. The relay never keeps a cursor on id: ids are
-- handed out at insert and can commit out of order across accounts; it reads every unsent row
-- instead. Within one account ids follow seq, because the counter row lock makes each event's
-- transaction wait for the previous one's commit.
CREATE TABLE IF NOT EXISTS writeside.outbox (
    id              bigserial   PRIMARY KEY,
    event_id        text        NOT NULL UNIQUE REFERENCES writeside.events (event_id),
    account_id      bigint      NOT NULL,
    seq             bigint      NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- Where the delivery that was marked landed; earlier deliveries (a relay that crashed
    -- before marking) are in the topic but not here.
    sent_at         timestamptz,
    kafka_partition integer,
    kafka_offset    bigint
);
CREATE INDEX IF NOT EXISTS outbox_unsent ON writeside.outbox (id) WHERE sent_at IS NULL;

-- name: positions_shape
-- The columns of public.positions and public.account_seq, to refuse tables of another shape
-- that were there before.
SELECT table_name::text, column_name::text, data_type::text
FROM information_schema.columns
WHERE table_schema = 'public' AND table_name IN ('positions', 'account_seq')
ORDER BY table_name, ordinal_position
