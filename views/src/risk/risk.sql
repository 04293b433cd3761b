-- risk: per account, gross and net exposure at the last trade price, open positions and the
-- largest position. The rules are in docs/views.md; every statement this view runs is in
-- this file.
--
-- Two tables: risk_positions_v{v} keeps per symbol what the account row is computed from
-- (net quantity and last price), and risk_v{v} is the account row readers see. Writing two
-- tables per event is why this view needs the inbox: a version filter guards one row only.
--
-- How the sections compose (views/src/risk/mod.rs):
--   apply:    WITH <engine prefix>, <ctes>, <totals>, written AS (<write>) SELECT ...
--   snapshot: WITH <snapshot_book>, <totals>, seeded_accounts AS (<write>) <watermarks>
-- Both paths build `book` (account_id, symbol, net_qty, last_price, version) and share
-- `totals` and `write`, so a rebuilt version computes the account row exactly like the live one.

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
-- A bust is booked as the reversing trade: d is the signed change of the position.
rk_trade AS (
    SELECT ev.account_id,
           ev.seq,
           ev.symbol AS symbol,
           CASE WHEN (ev.side = 'buy') = (ev.type = 'fill_executed') THEN 1 ELSE -1 END
               * ev.qty AS d,
           ev.price AS p
    FROM ev
),
-- Rounds give at most one event per account, so each statement moves one symbol per account.
rk_moved AS (
    INSERT INTO risk_positions_v{v} AS rp (account_id, symbol, net_qty, last_price, version)
    SELECT account_id, symbol, d, p, seq FROM rk_trade
    ON CONFLICT (account_id, symbol) DO UPDATE SET
        net_qty    = rp.net_qty + EXCLUDED.net_qty,
        last_price = EXCLUDED.last_price,
        version    = EXCLUDED.version
    RETURNING rp.account_id, rp.symbol, rp.net_qty, rp.last_price, rp.version
),
-- The account's whole book after the event. CTEs of one statement share its snapshot, so the
-- table does not show the row just written: take that one from RETURNING and the account's
-- other symbols as stored.
book AS (
    SELECT account_id, symbol, net_qty, last_price, version FROM rk_moved
    UNION ALL
    SELECT rp.account_id, rp.symbol, rp.net_qty, rp.last_price, rp.version
    FROM risk_positions_v{v} rp
    JOIN rk_trade t ON t.account_id = rp.account_id AND rp.symbol <> t.symbol
)

-- name: totals
-- Only open positions count (q <> 0); sums of nothing are 0.
rk_account AS (
    SELECT account_id,
           coalesce(sum(abs(net_qty) * last_price) FILTER (WHERE net_qty <> 0), 0) AS gross_exposure,
           coalesce(sum(net_qty * last_price) FILTER (WHERE net_qty <> 0), 0) AS net_exposure,
           count(*) FILTER (WHERE net_qty <> 0) AS open_positions,
           max(version) AS version
    FROM book
    GROUP BY account_id
),
-- The greatest exposure; ties go to the smallest symbol. COLLATE "C" compares bytes, so the
-- answer does not depend on the database's locale.
rk_largest AS (
    SELECT DISTINCT ON (account_id) account_id, symbol, abs(net_qty) * last_price AS notional
    FROM book
    WHERE net_qty <> 0
    ORDER BY account_id, abs(net_qty) * last_price DESC, symbol COLLATE "C"
)

-- name: write
INSERT INTO risk_v{v} (account_id, gross_exposure, net_exposure, open_positions,
                       largest_position_symbol, largest_position_notional, version)
SELECT a.account_id, a.gross_exposure, a.net_exposure, a.open_positions,
       l.symbol, coalesce(l.notional, 0), a.version
FROM rk_account a
LEFT JOIN rk_largest l USING (account_id)
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
