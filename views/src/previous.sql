-- The statements of earlier releases of the built-in views that the current ones replace:
-- the same results from the same events, so a version registered by that code goes on
-- running with this one (`Projection::replaces`). Only what changed is kept here; the rest
-- is the current view's. Nothing runs these: their fingerprints are computed from them
-- (views/src/previous.rs), and tests run them to show the results are kept.

-- name: portfolio_ctes_before_event_versions
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

-- name: risk_ctes_before_event_versions
-- A statement takes each account's events of a batch at once (`many_per_account`), and folds
-- them: a symbol's position moves by the sum of its events' changes and keeps the price of
-- the last one by seq, and the account row moves once, by what its moved symbols' exposures
-- were before the statement and are after it. Every value is exact (numeric sums and
-- products), so the rows equal those of the same events applied one at a time.
--
-- A bust is booked as the reversing trade: d is the signed change of the position.
rk_event AS (
    SELECT ev.account_id,
           ev.seq,
           ev.symbol AS symbol,
           CASE WHEN (ev.side = 'buy') = (ev.type = 'fill_executed') THEN 1 ELSE -1 END
               * ev.qty AS d,
           ev.price AS p
    FROM ev
),
-- Per account and symbol: the changes' sum, the last event's price and seq. One event alone
-- fails where it would have failed applied by itself (a missing quantity or price, a
-- negative price). Several that would fail one at a time must fail together too, or an
-- event at fault would be folded in unnoticed: a group with such an event gets no change
-- (NULL), which the book's NOT NULL refuses, and the engine then applies the batch one
-- event per account to find the event at fault.
rk_trade AS (
    SELECT account_id,
           symbol,
           CASE WHEN count(*) = 1
                  OR (count(d) = count(*) AND count(p) = count(*) AND min(p) >= 0)
                THEN sum(d) END AS d,
           (array_agg(p ORDER BY seq DESC))[1] AS p,
           max(seq) AS seq
    FROM rk_event
    GROUP BY account_id, symbol
),
-- A symbol the account holds moves in place; `before` is the same row as the statement's
-- snapshot shows it (found by its tuple id, no second index lookup), so RETURNING gives the
-- position before and after the statement.
rk_moved AS (
    UPDATE risk_positions_v{v} rp SET
        net_qty    = rp.net_qty + t.d,
        last_price = t.p,
        version    = t.seq
    FROM rk_trade t, risk_positions_v{v} before
    WHERE rp.account_id = t.account_id AND rp.symbol = t.symbol AND before.ctid = rp.ctid
    RETURNING rp.account_id, rp.symbol, rp.net_qty, rp.last_price, rp.version,
              before.net_qty AS net_qty_before, before.last_price AS last_price_before
),
-- A symbol never traded opens; there was no position before (NULLs). The account is locked
-- by the engine for the batch, so nothing else opens it meanwhile; DO UPDATE keeps the table
-- right even if something did.
rk_opened AS (
    INSERT INTO risk_positions_v{v} AS rp (account_id, symbol, net_qty, last_price, version)
    SELECT t.account_id, t.symbol, t.d, t.p, t.seq
    FROM rk_trade t
    WHERE NOT EXISTS (SELECT 1 FROM rk_moved m
                      WHERE m.account_id = t.account_id AND m.symbol = t.symbol)
    ON CONFLICT (account_id, symbol) DO UPDATE SET
        net_qty    = rp.net_qty + EXCLUDED.net_qty,
        last_price = EXCLUDED.last_price,
        version    = EXCLUDED.version
    RETURNING rp.account_id, rp.symbol, rp.net_qty, rp.last_price, rp.version,
              NULL::numeric AS net_qty_before, NULL::numeric AS last_price_before
),
-- Each moved symbol's exposure before (0 when it was flat or new) and after. Only open
-- positions count, and a flat one's exposure is 0, so adding and taking away exposures needs
-- no filter.
rk_move AS (
    SELECT m.account_id,
           m.symbol,
           m.version,
           m.net_qty <> 0 AS open_after,
           m.net_qty_before IS NOT NULL AS existed,
           coalesce(m.net_qty_before, 0) <> 0 AS open_before,
           abs(m.net_qty) * m.last_price AS exposure,
           coalesce(abs(m.net_qty_before) * m.last_price_before, 0) AS exposure_before,
           m.net_qty * m.last_price AS net,
           coalesce(m.net_qty_before * m.last_price_before, 0) AS net_before
    FROM (SELECT * FROM rk_moved UNION ALL SELECT * FROM rk_opened) m
),
-- Per account: the row before (NULLs for a new account), what its moved symbols change, and
-- the largest of them that is open after.
rk_step AS (
    SELECT m.account_id,
           greatest(a.version, max(m.version)) AS version,
           coalesce(a.gross_exposure, 0) - sum(m.exposure_before) + sum(m.exposure) AS gross_exposure,
           coalesce(a.net_exposure, 0) - sum(m.net_before) + sum(m.net) AS net_exposure,
           coalesce(a.open_positions, 0)
               - count(*) FILTER (WHERE m.open_before)
               + count(*) FILTER (WHERE m.open_after) AS open_positions,
           (array_agg(m.symbol ORDER BY m.exposure DESC, m.symbol COLLATE "C")
                FILTER (WHERE m.open_after))[1] AS best_symbol,
           max(m.exposure) FILTER (WHERE m.open_after) AS best_exposure,
           array_agg(m.symbol) AS moved,
           a.largest_position_symbol AS largest_before,
           a.largest_position_notional AS notional_before,
           coalesce(bool_or(m.symbol = a.largest_position_symbol), false) AS largest_moved,
           coalesce(bool_or(m.symbol = a.largest_position_symbol AND m.open_after
                            AND m.exposure >= a.largest_position_notional), false) AS largest_held,
           -- The statement writes a symbol's book row and its account row together, and the
           -- snapshot seeds both, so an account row is missing beside book rows only if it
           -- was deleted by hand. Moving it from nothing would write a wrong row (and, folded,
           -- could pass where one event at a time fails): refused, see rk_account.
           a.account_id IS NULL AND bool_or(m.existed) AS orphaned
    FROM rk_move m
    LEFT JOIN risk_v{v} a ON a.account_id = m.account_id
    GROUP BY m.account_id, a.account_id
),
-- The largest position after the statement. The book before had the largest before, so a
-- symbol that did not move cannot beat it; hence the candidates are the moved symbols open
-- after, and:
-- - the largest before, if it did not move;
-- - if it moved and did not keep (or grow) its exposure, the account's other open positions
--   read again (the `rescan`, the only read of the book), since one of them may now lead.
-- Ties go to the smallest symbol in byte order, as in `totals`.
rk_account AS (
    SELECT s.account_id,
           trim_scale(s.gross_exposure) AS gross_exposure,
           trim_scale(s.net_exposure) AS net_exposure,
           -- SQL has no RAISE: a cast that cannot succeed fails the statement with this text
           -- (SQLSTATE 22P02, an event's error: dead-lettered, the account parked).
           CASE WHEN s.orphaned
                THEN ('risk_v{v}: account ' || s.account_id
                      || ' has book rows but no account row (deleted by hand?); rebuild the view')::bigint
                ELSE s.open_positions END AS open_positions,
           c.symbol AS largest_position_symbol,
           trim_scale(coalesce(c.notional, 0)) AS largest_position_notional,
           s.version
    FROM rk_step s
    LEFT JOIN LATERAL (
        SELECT x.symbol, x.notional
        FROM (SELECT s.best_symbol AS symbol, s.best_exposure AS notional
              WHERE s.best_symbol IS NOT NULL
              UNION ALL
              SELECT s.largest_before, s.notional_before
              WHERE s.largest_before IS NOT NULL AND NOT s.largest_moved
              UNION ALL
              SELECT rp.symbol, abs(rp.net_qty) * rp.last_price
              FROM risk_positions_v{v} rp
              WHERE s.largest_moved AND NOT s.largest_held
                AND rp.account_id = s.account_id AND rp.net_qty <> 0
                AND rp.symbol <> ALL (s.moved)) x
        ORDER BY x.notional DESC, x.symbol COLLATE "C"
        LIMIT 1
    ) c ON true
)

-- name: eod_ctes_before_event_versions
eod_leg AS (
    SELECT ev.account_id,
           -- The UTC date, whatever the session's time zone.
           (ev.occurred_at AT TIME ZONE 'UTC')::date AS trading_day,
           ev.type,
           ev.side AS side,
           -- A bust takes back its fill's quantity and notional, on the fill's side. The bust
           -- carries no date of its fill, so it is booked on its own day.
           CASE ev.type WHEN 'fill_busted' THEN -1 ELSE 1 END AS direction,
           ev.qty AS qty,
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

-- name: portfolio_in_rounds
-- Portfolio before it folded each account's run of a batch (`many_per_account`): the engine
-- ran `ctes` + `write` once per round, a round's `ev` holding at most one event per account,
-- so one statement moved each row by at most one event and the row's state before that event
-- was simply the stored row: the UPDATE read it where it wrote it. Its DDL, read and snapshot
-- statements are the current ones; its statements follow.

-- name: portfolio_ctes_in_rounds
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

-- name: portfolio_write_in_rounds
-- One event writes exactly one row, which is what lets the engine count the events the
-- version filter dropped as |ev| - |written|. It returns the row's key and version, so the
-- notices below come only from rows this statement really wrote.
SELECT account_id, symbol, version FROM pf_moved
UNION ALL
SELECT account_id, symbol, version FROM pf_opened

-- name: portfolio_notices_in_rounds
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
