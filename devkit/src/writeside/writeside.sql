-- Every statement the write side runs, by name. The ledger's transaction and the intake's
-- idempotency keys follow seed 000; the position rules are the portfolio view's
-- (docs/views.md), written the same way so that the two agree to the last digit.

-- name: instance
SELECT instance FROM writeside.meta

-- name: claim_key
-- Claims (account, key) for this request. A row comes back only for the first request under
-- the key. A concurrent request under the same key waits here for the first one's
-- transaction: if it commits, this one finds the key taken; if it rolls back, this one claims
-- it. So two clients racing with one key get one fill.
INSERT INTO writeside.idempotency_keys (account_id, key, request_hash)
VALUES ($1, $2, sha256(convert_to($3::text, 'UTF8')))
ON CONFLICT (account_id, key) DO NOTHING
RETURNING 1

-- name: stored_reply
-- The key was taken: is this the same request, and what was the first reply?
SELECT request_hash = sha256(convert_to($3::text, 'UTF8')) AS same_request, reply
FROM writeside.idempotency_keys
WHERE account_id = $1 AND key = $2

-- name: store_reply
UPDATE writeside.idempotency_keys SET reply = $3 WHERE account_id = $1 AND key = $2

-- name: savepoint_fill
-- Set once an order's key is claimed and before its account is locked: a refusal by the quote
-- gate after the lock wait rolls back to here, giving the seq and the lock back, and keeps
-- the key to store the refusal in.
SAVEPOINT fill

-- name: rollback_fill
ROLLBACK TO SAVEPOINT fill

-- name: next_seq
-- Bumps the account's counter row and returns the new seq. The row lock is held until the
-- transaction ends, so the account's events get consecutive seqs in commit order, and a
-- rollback returns the number. clock_timestamp(), read once the lock is held, makes
-- occurred_at follow seq within an account.
INSERT INTO public.account_seq AS s (account_id, last_seq) VALUES ($1, 1)
ON CONFLICT (account_id) DO UPDATE SET last_seq = s.last_seq + 1
RETURNING last_seq, clock_timestamp() AS now

-- name: trades_by_version
-- Fills and busts written, at version 1 (no `type_version`) and at version 2: a write side
-- upgraded in the middle of a run (`WriteSide::set_fill_version`) holds both.
SELECT count(*) FILTER (WHERE payload::jsonb -> 'type_version' IS NULL) AS v1,
       count(*) FILTER (WHERE payload::jsonb ->> 'type_version' = '2') AS v2
FROM writeside.events
WHERE type IN ('fill_executed', 'fill_busted')

-- name: find_fill
-- The fill a bust reverses: it must be a fill of the same account.
SELECT payload::jsonb -> 'data' AS data
FROM writeside.events
WHERE event_id = $1 AND account_id = $2 AND type = 'fill_executed'

-- name: claim_bust
-- Nothing comes back when the fill is already busted (or a concurrent bust of it committed).
INSERT INTO writeside.busts (fill_event_id, event_id) VALUES ($1, $2)
ON CONFLICT (fill_event_id) DO NOTHING
RETURNING 1

-- name: record_event
-- The event as its exact wire JSON, and its outbox row, in the transaction that assigned
-- its seq. $1 is the payload; every column is read from it.
WITH ev AS (
    SELECT $1::text AS payload,
           j->>'event_id' AS event_id,
           j->>'type' AS type,
           (j->>'account_id')::bigint AS account_id,
           (j->>'seq')::bigint AS seq,
           (j->>'occurred_at')::timestamptz AS occurred_at
    FROM (SELECT $1::text::jsonb AS j) AS parsed
),
stored AS (
    INSERT INTO writeside.events (event_id, account_id, seq, type, occurred_at, payload)
    SELECT event_id, account_id, seq, type, occurred_at, payload FROM ev
)
INSERT INTO writeside.outbox (event_id, account_id, seq)
SELECT event_id, account_id, seq FROM ev

-- name: book_trade
-- Moves the position of a fill or a bust ($1, the event's wire JSON), by the portfolio rules
-- of docs/views.md. The CTEs are views/src/portfolio/portfolio.sql's, reading the same JSON
-- text, so positions and portfolio_vN compute each value, and its scale, identically; the
-- writeside integration test reconciles the two row for row. The caller holds the account's
-- counter row lock, so the position read here cannot change before the write.
WITH ev AS (
    SELECT (j->>'account_id')::bigint AS account_id,
           (j->>'seq')::bigint AS seq,
           (j->>'occurred_at')::timestamptz AS occurred_at,
           j->>'type' AS type,
           j->'data' AS data
    FROM (SELECT $1::text::jsonb AS j) AS parsed
),
-- A bust is booked as the reversing trade: the opposite side, the original's quantity and
-- price, no fee. s is the side as +1/-1, x > 0 the quantity, p the price. An event is at
-- version 1 (`side`, a positive qty) or 2 (no side, the qty signed): the side is `side` when
-- there is one, else the sign of qty.
pf_trade AS (
    SELECT ev.account_id,
           ev.seq,
           ev.occurred_at,
           ev.data->>'symbol' AS symbol,
           CASE WHEN coalesce(ev.data->>'side' = 'buy', (ev.data->>'qty')::numeric > 0)
                     = (ev.type = 'fill_executed') THEN 1 ELSE -1 END AS s,
           abs((ev.data->>'qty')::numeric) AS x,
           (ev.data->>'price')::numeric AS p
    FROM ev
),
pf_before AS (
    SELECT t.*,
           coalesce(pos.net_qty, 0) AS q,
           coalesce(pos.avg_price, 0) AS a,
           coalesce(pos.realized_pnl, 0) AS r
    FROM pf_trade t
    LEFT JOIN public.positions pos ON pos.account_id = t.account_id AND pos.symbol = t.symbol
),
pf_after AS (
    SELECT account_id, symbol, seq, occurred_at, p,
           q + s * x AS net_qty,
           CASE
               -- Opening or adding: (|q| a + x p) / (|q| + x), rounded once to 10 places half
               -- away from zero with the exact div() (round(n / d, 10) would round twice).
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
               -- The closed part min(|q|, x) realizes (p - a) per unit, sign-adjusted.
               ELSE r + least(abs(q), x) * (p - a) * sign(q)
           END AS realized_pnl
    FROM pf_before
)
INSERT INTO public.positions AS pos
    (account_id, symbol, net_qty, avg_price, realized_pnl, last_price, last_trade_at, last_seq)
SELECT account_id, symbol, net_qty, avg_price, realized_pnl, p, occurred_at, seq
FROM pf_after
ON CONFLICT (account_id, symbol) DO UPDATE SET
    net_qty       = EXCLUDED.net_qty,
    avg_price     = EXCLUDED.avg_price,
    realized_pnl  = EXCLUDED.realized_pnl,
    last_price    = EXCLUDED.last_price,
    last_trade_at = EXCLUDED.last_trade_at,
    last_seq      = EXCLUDED.last_seq
RETURNING net_qty

-- name: net_qty
-- What a client reads before it closes a position exactly.
SELECT net_qty FROM public.positions WHERE account_id = $1 AND symbol = $2

-- name: relay_lock
-- One relay at a time per database: two relays reading the same unsent rows would publish an
-- account's events in two interleaved streams. Session-level, on the relay's own connection,
-- so a relay that dies releases it with its connection.
SELECT pg_try_advisory_lock(hashtext('projector.writeside.relay'))

-- name: relay_fetch
-- The oldest unsent rows. No cursor: see writeside.outbox in schema.sql.
SELECT o.id, o.account_id, e.payload
FROM writeside.outbox o
JOIN writeside.events e USING (event_id)
WHERE o.sent_at IS NULL
ORDER BY o.id
LIMIT $1

-- name: relay_mark
-- After the broker acknowledged every row of the batch.
UPDATE writeside.outbox AS o
SET sent_at = now(), kafka_partition = d.partition, kafka_offset = d.kafka_offset
FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS d(id, partition, kafka_offset)
WHERE o.id = d.id AND o.sent_at IS NULL
