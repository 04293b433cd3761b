-- Fills, fees and traded notional (|qty| * price) per account and symbol. Fills are read at
-- version 2 (a signed qty): the binary's upcaster brings version 1 fills there.
--
-- view: fees_by_symbol
-- version: 1
-- subscribes: fill_executed v2
-- fields: symbol text, qty decimal, price decimal, fee decimal
-- dedup: inbox
-- order_independent: true

-- name: ddl
CREATE TABLE IF NOT EXISTS fees_by_symbol_v{v} (
    account_id bigint  NOT NULL,
    symbol     text    NOT NULL,
    fills      bigint  NOT NULL,
    fees       numeric NOT NULL,
    notional   numeric NOT NULL,
    PRIMARY KEY (account_id, symbol)
);

-- name: ctes
per_symbol AS (
    SELECT ev.account_id,
           ev.symbol,
           count(*) AS fills,
           coalesce(sum(ev.fee), 0) AS fees,
           sum(abs(ev.qty) * ev.price) AS notional
    FROM ev
    GROUP BY 1, 2
)

-- name: write
INSERT INTO fees_by_symbol_v{v} AS f (account_id, symbol, fills, fees, notional)
SELECT account_id, symbol, fills, fees, notional FROM per_symbol
ON CONFLICT (account_id, symbol) DO UPDATE
SET fills    = f.fills + EXCLUDED.fills,
    fees     = f.fees + EXCLUDED.fees,
    notional = f.notional + EXCLUDED.notional
RETURNING 1;

-- name: read
SELECT account_id, symbol, fills, fees, notional FROM fees_by_symbol_v{v};
