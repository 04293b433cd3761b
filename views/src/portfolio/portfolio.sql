-- portfolio: one row per (account, symbol): net quantity, average entry price, realized P&L.
-- The rules are in docs/views.md; every statement this view runs is in this file.
--
-- The view is order-dependent: the engine runs `ctes` + `write` once per round, and a round's
-- `ev` holds at most one event per account. So one statement moves each row by at most one
-- event, and the row's state before that event is simply the stored row.

-- name: ddl
CREATE TABLE IF NOT EXISTS portfolio_v{v} (
    account_id    bigint      NOT NULL,
    -- Byte order: a key compared on every upsert needs no locale.
    symbol        text        COLLATE "C" NOT NULL,
    -- Signed: long > 0, short < 0. A flat position keeps its row: it carries realized P&L.
    net_qty       numeric     NOT NULL,
    -- Always exactly 10 decimal places, so its text is the same whatever path set it.
    avg_price     numeric     NOT NULL CHECK (avg_price >= 0),
    realized_pnl  numeric     NOT NULL,
    last_trade_at timestamptz NOT NULL,
    -- The seq of the last event applied to this row; the version filter compares it.
    version       bigint      NOT NULL CHECK (version > 0),
    PRIMARY KEY (account_id, symbol)
)
-- A position is updated over and over: room on its page keeps each update HOT (no new
-- index entry, no index bloat).
WITH (fillfactor = 80);

-- name: ctes
-- A bust is booked as the reversing trade: the opposite side, the original's quantity and
-- price, no fee. s is the side as +1/-1, x > 0 the quantity, p the price.
pf_trade AS (
    SELECT ev.account_id,
           ev.seq,
           ev.occurred_at,
           ev.symbol AS symbol,
           CASE WHEN (ev.side = 'buy') = (ev.type = 'fill_executed') THEN 1 ELSE -1 END AS s,
           ev.qty AS x,
           ev.price AS p
    FROM ev
),
-- The position before the event: q, a, r. A symbol never traded is flat with nothing realized.
pf_before AS (
    SELECT t.*,
           coalesce(pv.net_qty, 0) AS q,
           coalesce(pv.avg_price, 0) AS a,
           coalesce(pv.realized_pnl, 0) AS r
    FROM pf_trade t
    LEFT JOIN portfolio_v{v} pv ON pv.account_id = t.account_id AND pv.symbol = t.symbol
),
pf_after AS (
    SELECT account_id, symbol, seq, occurred_at,
           q AS net_qty_before,
           q + s * x AS net_qty,
           CASE
               -- Opening or adding: the weighted average (|q| a + x p) / (|q| + x), rounded
               -- to 10 places half away from zero. round(n / d, 10) would round twice:
               -- numeric division already rounds its quotient to a scale of its choosing,
               -- and a quotient such as 0.12345678904999...9|5 rounds up to ...05 there and
               -- again to ...1 at 10 places. div() is exact (a truncated integer quotient),
               -- so floor((2 n 10^10 + d) / 2d) rounds once; n >= 0 (prices and averages
               -- are never negative), where half up is half away from zero. Multiplying by
               -- 1e-10 is exact and gives scale 10.
               WHEN q = 0 OR sign(q) = s THEN
                   div((abs(q) * a + x * p) * 20000000000 + (abs(q) + x), 2 * (abs(q) + x))
                       * 0.0000000001
               -- Reducing: what is left was bought at the same average.
               WHEN x < abs(q) THEN a
               -- Closed exactly: no position, no average.
               WHEN x = abs(q) THEN round(0::numeric, 10)
               -- Flipped: the new position was opened entirely at this price.
               ELSE round(p, 10)
           END AS avg_price,
           CASE
               WHEN q = 0 OR sign(q) = s THEN r
               -- The closed part c = min(|q|, x) realizes (p - a) per unit, sign-adjusted for
               -- shorts. Fees are not part of realized P&L (eod sums them).
               ELSE r + least(abs(q), x) * (p - a) * sign(q)
           END AS realized_pnl
    FROM pf_before
)

-- name: write
-- One event writes exactly one row, which is what lets the engine count the events the
-- version filter dropped as |ev| - |written|. It returns the row's key and version, so the
-- notices below come only from rows this statement really wrote.
INSERT INTO portfolio_v{v} (account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version)
SELECT account_id, symbol, net_qty, avg_price, realized_pnl, occurred_at, seq
FROM pf_after
ON CONFLICT (account_id, symbol) DO UPDATE SET
    net_qty       = EXCLUDED.net_qty,
    avg_price     = EXCLUDED.avg_price,
    realized_pnl  = EXCLUDED.realized_pnl,
    last_trade_at = EXCLUDED.last_trade_at,
    version       = EXCLUDED.version
-- The version filter: behind the inbox, a second line of defence that costs nothing. It is
-- valid only because an account's events arrive in seq order (the engine refuses this view
-- on an unordered source); an event at or below the row's version was already applied.
WHERE portfolio_v{v}.version < EXCLUDED.version
RETURNING account_id, symbol, version

-- name: notices
-- A position closed (back to flat) or flipped (long to short or back) by an event: a notice
-- for a relay to publish (docs/views.md). Only rows the write really created count (a row
-- the version filter kept out is not in `written`), and only events the engine marks `emit`:
-- the live version's, past what the version it replaced had applied. The unique key drops
-- a notice some version already emitted for the same event.
INSERT INTO projector.notices (view_name, consumer, kind, event_id, account_id, seq, payload)
SELECT 'portfolio', $1,
       CASE WHEN a.net_qty = 0 THEN 'position_closed' ELSE 'position_flipped' END,
       ev.event_id, a.account_id, a.seq,
       jsonb_build_object('symbol', a.symbol,
                          'net_qty_before', a.net_qty_before::text,
                          'net_qty', a.net_qty::text,
                          'realized_pnl', a.realized_pnl::text,
                          'occurred_at', a.occurred_at)
FROM written w
JOIN pf_after a ON a.account_id = w.account_id AND a.symbol = w.symbol AND a.seq = w.version
JOIN ev ON ev.account_id = a.account_id AND ev.seq = a.seq
WHERE ev.emit
  AND a.net_qty_before <> 0
  AND (a.net_qty = 0 OR sign(a.net_qty) <> sign(a.net_qty_before))
ON CONFLICT (view_name, kind, event_id) DO NOTHING
RETURNING 1

-- name: read
SELECT account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version
FROM portfolio_v{v}

-- name: snapshot
-- Seeds this version from the write side's authoritative positions (shape and contract in
-- docs/views.md), then returns the seq each account's state reflects: the watermark below
-- which the tail skips events. A data-modifying CTE runs even though nothing reads it.
WITH seeded AS (
    INSERT INTO portfolio_v{v} (account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version)
    SELECT account_id, symbol, net_qty, round(avg_price, 10), realized_pnl, last_trade_at, last_seq
    FROM positions
    RETURNING 1
)
SELECT account_id, last_seq AS watermark_seq FROM account_seq
