-- portfolio: one row per (account, symbol): net quantity, average entry price, realized P&L.
-- The rules are in docs/views.md; every statement this view runs is in this file.
--
-- The view is order-dependent: the engine runs `ctes` + `write` once per round, and a round's
-- `ev` holds at most one event per account. So one statement moves each row by at most one
-- event, and the row's state before that event is simply the stored row: the UPDATE reads it
-- where it writes it.

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
-- Fills and busts are read at version 2 (version 1 is upcast to it, views/src/upcast.rs):
-- qty is signed, positive buys, negative sells, and a bust repeats its fill's. A bust is
-- booked as the reversing trade: the opposite direction, the original's quantity and price,
-- no fee. s is the trade's direction as +1/-1, x > 0 the quantity (abs keeps its scale, so a
-- sell's row is what it was when version 1 said `side`), p the price.
pf_trade AS (
    SELECT ev.account_id,
           ev.seq,
           ev.occurred_at,
           ev.symbol AS symbol,
           CASE WHEN (ev.qty > 0) = (ev.type = 'fill_executed') THEN 1 ELSE -1 END AS s,
           abs(ev.qty) AS x,
           ev.price AS p
    FROM ev
),
-- A position that exists moves in place: the UPDATE finds its row once, and its SET reads
-- the position before the event, q = pv.net_qty, a = pv.avg_price, r = pv.realized_pnl (an
-- upsert would find it twice: once to read it, once as the conflict). The version filter is
-- the condition pv.version < t.seq.
pf_moved AS (
    UPDATE portfolio_v{v} pv SET
        net_qty = pv.net_qty + t.s * t.x,
        avg_price = CASE
            -- Opening or adding: the weighted average (|q| a + x p) / (|q| + x), rounded to
            -- 10 places half away from zero. round(n / d, 10) would round twice: numeric
            -- division already rounds its quotient to a scale of its choosing, and a quotient
            -- such as 0.12345678904999...9|5 rounds up to ...05 there and again to ...1 at 10
            -- places. div() is exact (a truncated integer quotient), so
            -- floor((2 n 10^10 + d) / 2d) rounds once; n >= 0 (prices and averages are never
            -- negative), where half up is half away from zero. Multiplying by 1e-10 is exact
            -- and gives scale 10.
            WHEN pv.net_qty = 0 OR sign(pv.net_qty) = t.s THEN
                div((abs(pv.net_qty) * pv.avg_price + t.x * t.p) * 20000000000
                        + (abs(pv.net_qty) + t.x),
                    2 * (abs(pv.net_qty) + t.x))
                    * 0.0000000001
            -- Reducing: what is left was bought at the same average.
            WHEN t.x < abs(pv.net_qty) THEN pv.avg_price
            -- Closed exactly: no position, no average.
            WHEN t.x = abs(pv.net_qty) THEN round(0::numeric, 10)
            -- Flipped: the new position was opened entirely at this price.
            ELSE round(t.p, 10)
        END,
        realized_pnl = CASE
            WHEN pv.net_qty = 0 OR sign(pv.net_qty) = t.s THEN pv.realized_pnl
            -- The closed part c = min(|q|, x) realizes (p - a) per unit, sign-adjusted for
            -- shorts. Fees are not part of realized P&L (eod sums them).
            ELSE pv.realized_pnl + least(abs(pv.net_qty), t.x) * (t.p - pv.avg_price) * sign(pv.net_qty)
        END,
        last_trade_at = t.occurred_at,
        version = t.seq
    FROM pf_trade t
    -- The version filter: behind the inbox, a second line of defence that costs nothing. It
    -- is valid only because an account's events arrive in seq order (the engine refuses this
    -- view on an unordered source); an event at or below the row's version was already
    -- applied.
    WHERE pv.account_id = t.account_id AND pv.symbol = t.symbol AND pv.version < t.seq
    -- RETURNING shows the row after the event; the position before it is net_qty - s x.
    RETURNING pv.account_id, pv.symbol, pv.version, pv.net_qty, pv.realized_pnl,
              pv.net_qty - t.s * t.x AS net_qty_before, t.occurred_at
),
-- A symbol never traded opens, as a flat position with nothing realized would move (the
-- same formula, q = a = r = 0). An event the UPDATE filtered out finds its row here and
-- writes nothing: DO NOTHING.
pf_opened AS (
    INSERT INTO portfolio_v{v} (account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version)
    SELECT t.account_id, t.symbol, t.s * t.x,
           div(t.x * t.p * 20000000000 + t.x, 2 * t.x) * 0.0000000001,
           0, t.occurred_at, t.seq
    FROM pf_trade t
    WHERE NOT EXISTS (SELECT 1 FROM pf_moved m
                      WHERE m.account_id = t.account_id AND m.symbol = t.symbol)
    ON CONFLICT (account_id, symbol) DO NOTHING
    RETURNING account_id, symbol, version
)

-- name: write
-- One event writes exactly one row, which is what lets the engine count the events the
-- version filter dropped as |ev| - |written|. It returns the row's key and version, so the
-- notices below come only from rows this statement really wrote.
SELECT account_id, symbol, version FROM pf_moved
UNION ALL
SELECT account_id, symbol, version FROM pf_opened

-- name: notices
-- A position closed (back to flat) or flipped (long to short or back) by an event: a notice
-- for a relay to publish (docs/views.md). Only rows the write really moved count (an opened
-- position was flat before, and a row the version filter kept out is in neither), and only
-- events the engine marks `emit`: the live version's, past what the version it replaced had
-- applied. The unique key drops a notice some version already emitted for the same event.
-- The position before the event is read as stored (CTEs share the statement's snapshot, so
-- `before` is the row as it was), which keeps its text as it was stored; only the few rows
-- that closed or flipped are looked up.
INSERT INTO projector.notices (view_name, consumer, kind, event_id, account_id, seq, payload)
SELECT 'portfolio', $1,
       CASE WHEN m.net_qty = 0 THEN 'position_closed' ELSE 'position_flipped' END,
       ev.event_id, m.account_id, m.version,
       jsonb_build_object('symbol', m.symbol,
                          'net_qty_before', before.net_qty::text,
                          'net_qty', m.net_qty::text,
                          'realized_pnl', m.realized_pnl::text,
                          'occurred_at', m.occurred_at)
FROM pf_moved m
JOIN ev ON ev.account_id = m.account_id AND ev.seq = m.version
JOIN portfolio_v{v} before ON before.account_id = m.account_id AND before.symbol = m.symbol
WHERE ev.emit
  AND m.net_qty_before <> 0
  AND (m.net_qty = 0 OR sign(m.net_qty) <> sign(m.net_qty_before))
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
