-- portfolio: one row per (account, symbol): net quantity, average entry price, realized P&L.
-- The rules are in docs/views.md; every statement this view runs is in this file.
--
-- The view is order-dependent and takes each account's events of a batch at once
-- (`many_per_account`; up to 256 of one account per statement, the engine's `RUN_CAP`, the
-- rest in further statements of the batch's transaction, each folding from the row the one
-- before wrote, as across batches): the statement folds each row's run of events in seq
-- order, one event after the other with the same arithmetic and the same rounding as one
-- event alone, and writes the row once. The average is rounded at every step, so a run cannot be summed: the
-- fold is a recursive CTE, one step per event, whose steps also give each event's position
-- before and after (the notices).

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
    SELECT ev.event_id,
           ev.account_id,
           ev.seq,
           ev.occurred_at,
           ev.emit,
           ev.symbol AS symbol,
           CASE WHEN (ev.qty > 0) = (ev.type = 'fill_executed') THEN 1 ELSE -1 END AS s,
           abs(ev.qty) AS x,
           ev.price AS p
    FROM ev
),
-- Each row's run: the stored position (one lookup per row), and the events past its version,
-- numbered i = 1, 2, ... in seq order within the row and n in the order of (row, seq), so
-- that an event's successor in its run is the event n + 1 when that one's i is one more (a
-- NULL symbol is a run of its own too, and fails at the insert as it would alone).
-- The version filter: an event at or below the row's version was already applied (behind
-- the inbox, a second line of defence that costs nothing; valid only because an account's
-- events arrive in seq order, and the engine refuses this view on an unordered source).
pf_run AS (
    SELECT t.*,
           row_number() OVER (PARTITION BY t.account_id, t.symbol COLLATE "C" ORDER BY t.seq) AS i,
           row_number() OVER (ORDER BY t.account_id, t.symbol COLLATE "C", t.seq) AS n,
           pv.version AS stored_version,
           pv.net_qty AS stored_qty,
           pv.avg_price AS stored_avg,
           pv.realized_pnl AS stored_realized
    FROM pf_trade t
    LEFT JOIN portfolio_v{v} pv ON pv.account_id = t.account_id AND pv.symbol = t.symbol
    WHERE pv.version IS NULL OR pv.version < t.seq
),
-- The fold: step 0 is the position before the run, the stored row as it is (so its text is
-- kept), or, for a symbol never traded, a flat one with nothing realized (q = a = r = 0,
-- which the formulas below open exactly as a first fill: 0 + s x keeps x's scale). Step i
-- applies event i to step i - 1: q the net quantity, a the average price, r realized P&L.
-- `ok` says every state before this step was one the table accepts: a run with an event
-- that fails alone must fail whole, or a later event could make the row valid again (a
-- negative price, then a close that resets the average) and fold the event at fault in
-- unnoticed; the last state the table checks itself, so one event alone fails with the
-- same error as ever. The engine then applies the batch one event per account to find it.
pf_step AS (
    WITH RECURSIVE step AS (
        SELECT r.account_id, r.symbol, 0::bigint AS i, r.n - 1 AS n, r.seq AS first_seq,
               r.stored_version, NULL::text AS event_id, NULL::bigint AS seq,
               NULL::timestamptz AS occurred_at, NULL::boolean AS emit,
               coalesce(r.stored_qty, 0) AS q, coalesce(r.stored_avg, 0) AS a,
               coalesce(r.stored_realized, 0) AS r, NULL::numeric AS q_before, true AS ok
        FROM pf_run r
        WHERE r.i = 1
        UNION ALL
        SELECT t.account_id, t.symbol, t.i, t.n, f.first_seq, f.stored_version,
               t.event_id, t.seq, t.occurred_at, t.emit,
               f.q + t.s * t.x,
               CASE
                   -- Opening or adding: the weighted average (|q| a + x p) / (|q| + x),
                   -- rounded to 10 places half away from zero. round(n / d, 10) would
                   -- round twice: numeric division already rounds its quotient to a scale
                   -- of its choosing, and a quotient such as 0.12345678904999...9|5 rounds
                   -- up to ...05 there and again to ...1 at 10 places. div() is exact (a
                   -- truncated integer quotient), so floor((2 n 10^10 + d) / 2d) rounds
                   -- once; n >= 0 (prices and averages are never negative), where half up
                   -- is half away from zero. Multiplying by 1e-10 is exact and gives scale 10.
                   WHEN f.q = 0 OR sign(f.q) = t.s THEN
                       div((abs(f.q) * f.a + t.x * t.p) * 20000000000 + (abs(f.q) + t.x),
                           2 * (abs(f.q) + t.x))
                           * 0.0000000001
                   -- Reducing: what is left was bought at the same average.
                   WHEN t.x < abs(f.q) THEN f.a
                   -- Closed exactly: no position, no average.
                   WHEN t.x = abs(f.q) THEN round(0::numeric, 10)
                   -- Flipped: the new position was opened entirely at this price.
                   ELSE round(t.p, 10)
               END,
               CASE
                   WHEN f.q = 0 OR sign(f.q) = t.s THEN f.r
                   -- The closed part c = min(|q|, x) realizes (p - a) per unit,
                   -- sign-adjusted for shorts. Fees are not part of realized P&L (eod sums
                   -- them).
                   ELSE f.r + least(abs(f.q), t.x) * (t.p - f.a) * sign(f.q)
               END,
               f.q,
               f.ok AND coalesce(f.q IS NOT NULL AND f.a >= 0 AND f.r IS NOT NULL, false)
        FROM step f
        JOIN pf_run t ON t.n = f.n + 1 AND t.i = f.i + 1
    )
    SELECT * FROM step WHERE i > 0
),
-- Each row's state after its run.
pf_last AS (
    SELECT DISTINCT ON (account_id, symbol) *
    FROM pf_step
    ORDER BY account_id, symbol, i DESC
),
-- A position that exists moves in place, once, to the state after its run; the version
-- filter again, in the statement that writes. A run with an event at fault writes NULL,
-- which NOT NULL refuses.
pf_moved AS (
    UPDATE portfolio_v{v} pv SET
        net_qty = CASE WHEN l.ok THEN l.q END,
        avg_price = l.a,
        realized_pnl = l.r,
        last_trade_at = l.occurred_at,
        version = l.seq
    FROM pf_last l
    WHERE pv.account_id = l.account_id AND pv.symbol = l.symbol AND pv.version < l.first_seq
    RETURNING pv.account_id, pv.symbol
),
-- A symbol never traded opens at the state after its run.
pf_opened AS (
    INSERT INTO portfolio_v{v} (account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version)
    SELECT l.account_id, l.symbol, CASE WHEN l.ok THEN l.q END, l.a, l.r, l.occurred_at, l.seq
    FROM pf_last l
    WHERE l.stored_version IS NULL
    ON CONFLICT (account_id, symbol) DO NOTHING
    RETURNING account_id, symbol
),
-- The steps of the rows this statement really wrote: one per event applied.
pf_applied AS (
    SELECT f.*
    FROM pf_step f
    JOIN (SELECT * FROM pf_moved UNION ALL SELECT * FROM pf_opened) w
      ON w.account_id = f.account_id AND w.symbol = f.symbol
)

-- name: write
-- One row per event applied, as one event at a time would write one row per event: that is
-- what lets the engine count the events the version filter dropped as |ev| - |written|.
SELECT account_id, symbol, seq AS version FROM pf_applied

-- name: notices
-- A position closed (back to flat) or flipped (long to short or back) by an event: a notice
-- for a relay to publish (docs/views.md). Only events of rows the write really moved count
-- (a row the version filter kept out has no step), and only events the engine marks `emit`:
-- the live version's, past what the version it replaced had applied. The unique key drops a
-- notice some version already emitted for the same event. The position before an event is
-- the step before it: the stored row as it was for the first event of a run (its text as
-- stored), the state the previous event left otherwise. In seq order, as one event at a
-- time would insert them.
INSERT INTO projector.notices (view_name, consumer, kind, event_id, account_id, seq, payload)
SELECT 'portfolio', $1,
       CASE WHEN f.q = 0 THEN 'position_closed' ELSE 'position_flipped' END,
       f.event_id, f.account_id, f.seq,
       jsonb_build_object('symbol', f.symbol,
                          'net_qty_before', f.q_before::text,
                          'net_qty', f.q::text,
                          'realized_pnl', f.r::text,
                          'occurred_at', f.occurred_at)
FROM pf_applied f
WHERE f.emit
  AND f.q_before <> 0
  AND (f.q = 0 OR sign(f.q) <> sign(f.q_before))
ORDER BY f.account_id, f.seq
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
