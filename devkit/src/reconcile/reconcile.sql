-- Every built-in view, read through its stable name (the live version), against the write
-- side: `portfolio` and `risk` against the authoritative `positions`, `eod` against a fold
-- of the stored events (`writeside.events`, the exact wire JSON) by the rules of
-- docs/views.md. Each statement returns the rows that differ, as
-- (key, write side's row, view's row); a row missing on one side has NULL there.
-- Values are compared by value (numeric equality: 1.10 = 1.1), rows printed as text.

-- name: portfolio
WITH src AS (
    SELECT account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at,
           last_seq AS version
    FROM positions
),
v AS (
    SELECT account_id, symbol, net_qty, avg_price, realized_pnl, last_trade_at, version
    FROM portfolio
)
SELECT coalesce(src.account_id, v.account_id)::text || ' ' || coalesce(src.symbol, v.symbol),
       CASE WHEN src.account_id IS NOT NULL THEN
           row(src.net_qty, src.avg_price, src.realized_pnl, src.last_trade_at, src.version)::text END,
       CASE WHEN v.account_id IS NOT NULL THEN
           row(v.net_qty, v.avg_price, v.realized_pnl, v.last_trade_at, v.version)::text END
FROM src FULL JOIN v ON v.account_id = src.account_id AND v.symbol = src.symbol
WHERE (src.account_id, src.net_qty, src.avg_price, src.realized_pnl, src.last_trade_at, src.version)
      IS DISTINCT FROM (v.account_id, v.net_qty, v.avg_price, v.realized_pnl, v.last_trade_at, v.version)
ORDER BY coalesce(src.account_id, v.account_id), coalesce(src.symbol, v.symbol)

-- name: portfolio_rows
SELECT (SELECT count(*) FROM positions), (SELECT count(*) FROM portfolio)

-- name: risk
-- The account's book is its positions; exposure counts open positions at the last trade
-- price; the largest position breaks ties by the smallest symbol (byte order); version is
-- the seq of the account's last fill or bust.
WITH book AS (
    SELECT account_id, symbol, net_qty, last_price, last_seq FROM positions
),
totals AS (
    SELECT account_id,
           coalesce(sum(abs(net_qty) * last_price) FILTER (WHERE net_qty <> 0), 0) AS gross,
           coalesce(sum(net_qty * last_price) FILTER (WHERE net_qty <> 0), 0) AS net,
           count(*) FILTER (WHERE net_qty <> 0) AS open,
           max(last_seq) AS version
    FROM book
    GROUP BY account_id
),
largest AS (
    SELECT DISTINCT ON (account_id) account_id, symbol, abs(net_qty) * last_price AS notional
    FROM book
    WHERE net_qty <> 0
    ORDER BY account_id, abs(net_qty) * last_price DESC, symbol COLLATE "C"
),
src AS (
    SELECT t.account_id, t.gross, t.net, t.open, l.symbol, coalesce(l.notional, 0) AS notional,
           t.version
    FROM totals t LEFT JOIN largest l USING (account_id)
),
v AS (
    SELECT account_id, gross_exposure AS gross, net_exposure AS net, open_positions AS open,
           largest_position_symbol AS symbol, largest_position_notional AS notional, version
    FROM risk
)
SELECT coalesce(src.account_id, v.account_id)::text,
       CASE WHEN src.account_id IS NOT NULL THEN
           row(src.gross, src.net, src.open, src.symbol, src.notional, src.version)::text END,
       CASE WHEN v.account_id IS NOT NULL THEN
           row(v.gross, v.net, v.open, v.symbol, v.notional, v.version)::text END
FROM src FULL JOIN v ON v.account_id = src.account_id
WHERE (src.account_id, src.gross, src.net, src.open, src.symbol, src.notional, src.version)
      IS DISTINCT FROM (v.account_id, v.gross, v.net, v.open, v.symbol, v.notional, v.version)
ORDER BY coalesce(src.account_id, v.account_id)

-- name: risk_rows
SELECT (SELECT count(DISTINCT account_id) FROM positions), (SELECT count(*) FROM risk)

-- name: eod
-- Per account and UTC day of occurred_at: fills and busts counted, a bust taking back its
-- fill's quantity and notional on the fill's side, fees of fills (absent = 0), cash in and
-- out by the amount's sign.
WITH e AS (
    SELECT account_id, p->>'type' AS type, (p->>'occurred_at')::timestamptz AS occurred_at,
           p->'data' AS d
    FROM (SELECT account_id, payload::jsonb AS p FROM writeside.events) stored
),
leg AS (
    SELECT account_id,
           (occurred_at AT TIME ZONE 'UTC')::date AS trading_day,
           type,
           -- Version 1 says `side` with a positive qty, version 2 signs qty instead.
           coalesce(d->>'side', CASE WHEN (d->>'qty')::numeric > 0 THEN 'buy'
                                     WHEN (d->>'qty')::numeric < 0 THEN 'sell' END) AS side,
           CASE type WHEN 'fill_busted' THEN -1 ELSE 1 END AS direction,
           abs((d->>'qty')::numeric) AS qty,
           (d->>'price')::numeric AS price,
           CASE type WHEN 'fill_executed' THEN coalesce((d->>'fee')::numeric, 0) END AS fee,
           CASE type WHEN 'cash_adjusted' THEN (d->>'amount')::numeric END AS amount
    FROM e
    WHERE type IN ('fill_executed', 'fill_busted', 'cash_adjusted')
),
src AS (
    SELECT account_id, trading_day,
           count(*) FILTER (WHERE type = 'fill_executed') AS fills,
           count(*) FILTER (WHERE type = 'fill_busted') AS busts,
           coalesce(sum(direction * qty) FILTER (WHERE side = 'buy'), 0) AS bought_qty,
           coalesce(sum(direction * qty) FILTER (WHERE side = 'sell'), 0) AS sold_qty,
           coalesce(sum(direction * qty * price) FILTER (WHERE side = 'buy'), 0) AS bought_notional,
           coalesce(sum(direction * qty * price) FILTER (WHERE side = 'sell'), 0) AS sold_notional,
           coalesce(sum(fee), 0) AS fees,
           coalesce(sum(amount) FILTER (WHERE amount > 0), 0) AS cash_in,
           coalesce(sum(-amount) FILTER (WHERE amount < 0), 0) AS cash_out
    FROM leg
    GROUP BY account_id, trading_day
),
v AS (
    SELECT account_id, trading_day, fills, busts, bought_qty, sold_qty, bought_notional,
           sold_notional, fees, cash_in, cash_out
    FROM eod
)
SELECT coalesce(src.account_id, v.account_id)::text || ' ' || coalesce(src.trading_day, v.trading_day)::text,
       CASE WHEN src.account_id IS NOT NULL THEN
           row(src.fills, src.busts, src.bought_qty, src.sold_qty, src.bought_notional,
               src.sold_notional, src.fees, src.cash_in, src.cash_out)::text END,
       CASE WHEN v.account_id IS NOT NULL THEN
           row(v.fills, v.busts, v.bought_qty, v.sold_qty, v.bought_notional,
               v.sold_notional, v.fees, v.cash_in, v.cash_out)::text END
FROM src FULL JOIN v ON v.account_id = src.account_id AND v.trading_day = src.trading_day
WHERE (src.account_id, src.fills, src.busts, src.bought_qty, src.sold_qty, src.bought_notional,
       src.sold_notional, src.fees, src.cash_in, src.cash_out)
      IS DISTINCT FROM (v.account_id, v.fills, v.busts, v.bought_qty, v.sold_qty, v.bought_notional,
       v.sold_notional, v.fees, v.cash_in, v.cash_out)
ORDER BY coalesce(src.account_id, v.account_id), coalesce(src.trading_day, v.trading_day)

-- name: eod_rows
SELECT (SELECT count(*) FROM (SELECT DISTINCT account_id, ((payload::jsonb->>'occurred_at')::timestamptz AT TIME ZONE 'UTC')::date
                              FROM writeside.events) days),
       (SELECT count(*) FROM eod)
