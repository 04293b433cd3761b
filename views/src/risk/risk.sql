-- risk: per account, gross and net exposure at the last trade price, open positions and the
-- largest position. The rules are in docs/views.md; every statement this view runs is in
-- this file.
--
-- Two tables: risk_positions_v{v} keeps per symbol what the account row is computed from
-- (net quantity and last price), and risk_v{v} is the account row readers see. Writing two
-- tables per event is why this view needs the inbox: a version filter guards one row only.
--
-- How the sections compose (views/src/risk/mod.rs):
--   apply:    WITH <engine prefix>, <ctes>, written AS (<write>) SELECT ...
--   snapshot: WITH <snapshot_book>, <totals>, seeded_accounts AS (<seed>) <watermarks>
-- The apply path is incremental and takes each account's events of a batch at once (up to
-- 256 of one account per statement, the engine's `RUN_CAP`, the rest in further statements
-- of the batch's transaction, each from the rows the one before wrote): a symbol moves by the sum of its events, so the account row moves by its moved symbols'
-- exposures before and after, and only when the largest position shrinks is the account's
-- book read again. The snapshot computes the row from the whole book (`totals`).
-- numeric keeps the larger scale of a sum's terms, so a running total would carry the scale
-- of positions long closed, and a total computed from the book would not: both paths write
-- the exposures with trim_scale(), whose text depends on the value alone, so a rebuilt
-- version equals the live one in text too.

-- name: ddl
CREATE TABLE IF NOT EXISTS risk_positions_v{v} (
    account_id bigint  NOT NULL,
    symbol     text    COLLATE "C" NOT NULL,
    -- Signed; flat positions keep their row (net_qty = 0) and count for nothing.
    net_qty    numeric NOT NULL,
    -- The price of the account's latest fill or bust in this symbol.
    last_price numeric NOT NULL CHECK (last_price >= 0),
    -- The seq of the last event applied to this symbol.
    version    bigint  NOT NULL CHECK (version > 0),
    PRIMARY KEY (account_id, symbol)
)
-- Rows updated over and over: room on the page keeps the updates HOT.
WITH (fillfactor = 80);
CREATE TABLE IF NOT EXISTS risk_v{v} (
    account_id                bigint  PRIMARY KEY,
    gross_exposure            numeric NOT NULL CHECK (gross_exposure >= 0),
    net_exposure              numeric NOT NULL,
    open_positions            bigint  NOT NULL CHECK (open_positions >= 0),
    -- NULL (and a notional of 0) when the account is flat: there is no largest position.
    largest_position_symbol   text,
    largest_position_notional numeric NOT NULL CHECK (largest_position_notional >= 0),
    -- The seq of the last fill or bust of the account.
    version                   bigint  NOT NULL CHECK (version > 0),
    CHECK ((largest_position_symbol IS NULL) = (open_positions = 0))
)
WITH (fillfactor = 80);

-- name: ctes
-- A statement takes each account's events of a batch at once (`many_per_account`), and folds
-- them: a symbol's position moves by the sum of its events' changes and keeps the price of
-- the last one by seq, and the account row moves once, by what its moved symbols' exposures
-- were before the statement and are after it. Every value is exact (numeric sums and
-- products), so the rows equal those of the same events applied one at a time.
--
-- Fills and busts are read at version 2 (version 1 is upcast to it, views/src/upcast.rs):
-- qty is signed, and a bust repeats its fill's. A bust is booked as the reversing trade: d is
-- the signed change of the position.
rk_event AS (
    SELECT ev.account_id,
           ev.seq,
           ev.symbol AS symbol,
           CASE WHEN ev.type = 'fill_executed' THEN 1 ELSE -1 END * ev.qty AS d,
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

-- name: write
INSERT INTO risk_v{v} (account_id, gross_exposure, net_exposure, open_positions,
                       largest_position_symbol, largest_position_notional, version)
SELECT account_id, gross_exposure, net_exposure, open_positions,
       largest_position_symbol, largest_position_notional, version
FROM rk_account
ON CONFLICT (account_id) DO UPDATE SET
    gross_exposure            = EXCLUDED.gross_exposure,
    net_exposure              = EXCLUDED.net_exposure,
    open_positions            = EXCLUDED.open_positions,
    largest_position_symbol   = EXCLUDED.largest_position_symbol,
    largest_position_notional = EXCLUDED.largest_position_notional,
    version                   = EXCLUDED.version
RETURNING 1

-- name: read
SELECT account_id, gross_exposure, net_exposure, open_positions,
       largest_position_symbol, largest_position_notional, version
FROM risk_v{v}

-- name: totals
-- The account row from a whole book (the snapshot's): only open positions count (q <> 0);
-- sums of nothing are 0.
rk_totals AS (
    SELECT account_id,
           trim_scale(coalesce(sum(abs(net_qty) * last_price) FILTER (WHERE net_qty <> 0), 0)) AS gross_exposure,
           trim_scale(coalesce(sum(net_qty * last_price) FILTER (WHERE net_qty <> 0), 0)) AS net_exposure,
           count(*) FILTER (WHERE net_qty <> 0) AS open_positions,
           max(version) AS version
    FROM book
    GROUP BY account_id
),
-- The greatest exposure; ties go to the smallest symbol. COLLATE "C" compares bytes, so the
-- answer does not depend on the database's locale.
rk_biggest AS (
    SELECT DISTINCT ON (account_id) account_id, symbol, abs(net_qty) * last_price AS notional
    FROM book
    WHERE net_qty <> 0
    ORDER BY account_id, abs(net_qty) * last_price DESC, symbol COLLATE "C"
)

-- name: seed
INSERT INTO risk_v{v} (account_id, gross_exposure, net_exposure, open_positions,
                       largest_position_symbol, largest_position_notional, version)
SELECT a.account_id, a.gross_exposure, a.net_exposure, a.open_positions,
       l.symbol, trim_scale(coalesce(l.notional, 0)), a.version
FROM rk_totals a
LEFT JOIN rk_biggest l USING (account_id)
RETURNING 1

-- name: snapshot_book
-- The write side's authoritative positions (docs/views.md) are the book; they seed the
-- per-symbol table as they are.
book AS (
    SELECT account_id, symbol, net_qty, last_price, last_seq AS version FROM positions
),
seeded_positions AS (
    INSERT INTO risk_positions_v{v} (account_id, symbol, net_qty, last_price, version)
    SELECT account_id, symbol, net_qty, last_price, version FROM book
    RETURNING 1
)

-- name: watermarks
-- The seq each account's state reflects: the tail skips events at or below it.
SELECT account_id, last_seq AS watermark_seq FROM account_seq
