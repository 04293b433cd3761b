-- Cash movements per account, UTC day and reason: how many, and their sum.
--
-- view: cash_by_day
-- version: 1
-- subscribes: cash_adjusted
-- fields: amount decimal, reason text
-- dedup: inbox
-- order_independent: true

-- name: ddl
CREATE TABLE IF NOT EXISTS cash_by_day_v{v} (
    account_id bigint  NOT NULL,
    day        date    NOT NULL,
    reason     text    NOT NULL,
    movements  bigint  NOT NULL,
    amount     numeric NOT NULL,
    PRIMARY KEY (account_id, day, reason)
);

-- name: ctes
-- Order-independent: ev holds a whole batch, so sum per row first. The day is taken in
-- UTC, whatever the session's time zone.
moves AS (
    SELECT ev.account_id,
           (ev.occurred_at AT TIME ZONE 'UTC')::date AS day,
           coalesce(ev.reason, '') AS reason,
           count(*) AS movements,
           sum(ev.amount) AS amount
    FROM ev
    GROUP BY 1, 2, 3
)

-- name: write
INSERT INTO cash_by_day_v{v} AS c (account_id, day, reason, movements, amount)
SELECT account_id, day, reason, movements, amount FROM moves
ON CONFLICT (account_id, day, reason) DO UPDATE
SET movements = c.movements + EXCLUDED.movements,
    amount    = c.amount + EXCLUDED.amount
RETURNING 1;

-- name: read
SELECT account_id, day, reason, movements, amount FROM cash_by_day_v{v};
