-- eod: per account and UTC trading day, what the account traded and moved: fills, busts,
-- bought/sold quantity and notional, fees, cash in and out. The rules are in docs/views.md;
-- every statement this view runs is in this file.
--
-- Every column is a sum or a count, and sums commute: the view declares itself
-- order-independent, so the engine hands it a whole batch (several events per account and
-- day) in one statement, and the statement aggregates with GROUP BY before it upserts.
-- numeric addition keeps the larger scale of its operands, so the text of a sum does not
-- depend on how events were grouped into batches either.

-- name: ddl
CREATE TABLE IF NOT EXISTS eod_v{v} (
    account_id      bigint  NOT NULL,
    trading_day     date    NOT NULL,
    fills           bigint  NOT NULL CHECK (fills >= 0),
    busts           bigint  NOT NULL CHECK (busts >= 0),
    -- Net of busts; a bust booked on a later day than its fill makes that day's sums negative.
    bought_qty      numeric NOT NULL,
    sold_qty        numeric NOT NULL,
    bought_notional numeric NOT NULL,
    sold_notional   numeric NOT NULL,
    fees            numeric NOT NULL CHECK (fees >= 0),
    cash_in         numeric NOT NULL CHECK (cash_in >= 0),
    cash_out        numeric NOT NULL CHECK (cash_out >= 0),
    PRIMARY KEY (account_id, trading_day)
)
-- A day's row is updated by every event of the account that day: room on the page keeps
-- the updates HOT.
WITH (fillfactor = 80);

-- name: ctes
eod_leg AS (
    SELECT ev.account_id,
           -- The UTC date, whatever the session's time zone.
           (ev.occurred_at AT TIME ZONE 'UTC')::date AS trading_day,
           ev.type,
           -- Fills and busts are read at version 2 (version 1 is upcast to it,
           -- views/src/upcast.rs): the sign of qty is the side, and a bust repeats its fill's.
           CASE WHEN ev.qty > 0 THEN 'buy' WHEN ev.qty < 0 THEN 'sell' END AS side,
           -- A bust takes back its fill's quantity and notional, on the fill's side. The bust
           -- carries no date of its fill, so it is booked on its own day.
           CASE ev.type WHEN 'fill_busted' THEN -1 ELSE 1 END AS direction,
           abs(ev.qty) AS qty,
           ev.price AS price,
           -- A fill's fee is optional (absent = 0). A bust carries none, and the busted fill's
           -- fee stays: a refund, if any, is a cash movement of its own.
           CASE ev.type WHEN 'fill_executed' THEN coalesce(ev.fee, 0) END AS fee,
           CASE ev.type WHEN 'cash_adjusted' THEN ev.amount END AS amount
    FROM ev
),
eod_day AS (
    SELECT account_id,
           trading_day,
           count(*) FILTER (WHERE type = 'fill_executed') AS fills,
           count(*) FILTER (WHERE type = 'fill_busted') AS busts,
           coalesce(sum(direction * qty) FILTER (WHERE side = 'buy'), 0) AS bought_qty,
           coalesce(sum(direction * qty) FILTER (WHERE side = 'sell'), 0) AS sold_qty,
           coalesce(sum(direction * qty * price) FILTER (WHERE side = 'buy'), 0) AS bought_notional,
           coalesce(sum(direction * qty * price) FILTER (WHERE side = 'sell'), 0) AS sold_notional,
           coalesce(sum(fee), 0) AS fees,
           coalesce(sum(amount) FILTER (WHERE amount > 0), 0) AS cash_in,
           coalesce(sum(-amount) FILTER (WHERE amount < 0), 0) AS cash_out
    FROM eod_leg
    GROUP BY account_id, trading_day
)

-- name: write
-- GROUP BY made (account_id, trading_day) unique, so no row is touched twice.
INSERT INTO eod_v{v} AS d (account_id, trading_day, fills, busts, bought_qty, sold_qty,
                           bought_notional, sold_notional, fees, cash_in, cash_out)
SELECT account_id, trading_day, fills, busts, bought_qty, sold_qty,
       bought_notional, sold_notional, fees, cash_in, cash_out
FROM eod_day
ON CONFLICT (account_id, trading_day) DO UPDATE SET
    fills           = d.fills + EXCLUDED.fills,
    busts           = d.busts + EXCLUDED.busts,
    bought_qty      = d.bought_qty + EXCLUDED.bought_qty,
    sold_qty        = d.sold_qty + EXCLUDED.sold_qty,
    bought_notional = d.bought_notional + EXCLUDED.bought_notional,
    sold_notional   = d.sold_notional + EXCLUDED.sold_notional,
    fees            = d.fees + EXCLUDED.fees,
    cash_in         = d.cash_in + EXCLUDED.cash_in,
    cash_out        = d.cash_out + EXCLUDED.cash_out
RETURNING 1

-- name: read
SELECT account_id, trading_day, fills, busts, bought_qty, sold_qty,
       bought_notional, sold_notional, fees, cash_in, cash_out
FROM eod_v{v}

-- name: reconcile
-- `projector reconcile`'s side of the view: its rows on the time grain of a day, `at` the
-- day's midnight UTC; `{table}` is the stable read name or a version's table.
SELECT (trading_day::timestamp AT TIME ZONE 'UTC') AS at, fills, busts,
       bought_qty, sold_qty, bought_notional, sold_notional, fees, cash_in, cash_out
FROM {table}
