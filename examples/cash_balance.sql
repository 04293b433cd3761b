-- cash_balance: per account, the sum of its `cash_adjusted` amounts, with deposits and
-- withdrawals also kept apart. `{v}` is the version; `ev.amount` is the declared field,
-- an exact numeric decoded once by the engine.

-- name: ddl
CREATE TABLE IF NOT EXISTS cash_balance_v{v} (
    account_id bigint  PRIMARY KEY,
    movements  bigint  NOT NULL,
    deposited  numeric NOT NULL,
    withdrawn  numeric NOT NULL,
    balance    numeric NOT NULL
);

-- name: ctes
-- Order-independent: `ev` may hold many movements of one account, so they are summed per
-- account first. `withdrawn` is kept positive. A batch without deposits (or withdrawals)
-- adds 0, which leaves the stored value and its scale as they were.
moves AS (
    SELECT account_id,
           count(*) AS movements,
           coalesce(sum(amount) FILTER (WHERE amount > 0), 0) AS deposited,
           coalesce(-sum(amount) FILTER (WHERE amount < 0), 0) AS withdrawn,
           sum(amount) AS balance
    FROM ev
    GROUP BY account_id
)

-- name: write
-- One row per account written; RETURNING tells the engine how many.
INSERT INTO cash_balance_v{v} AS c (account_id, movements, deposited, withdrawn, balance)
SELECT account_id, movements, deposited, withdrawn, balance FROM moves
ON CONFLICT (account_id) DO UPDATE
SET movements = c.movements + EXCLUDED.movements,
    deposited = c.deposited + EXCLUDED.deposited,
    withdrawn = c.withdrawn + EXCLUDED.withdrawn,
    balance   = c.balance + EXCLUDED.balance
RETURNING 1;

-- name: read
SELECT account_id, movements, deposited, withdrawn, balance FROM cash_balance_v{v};
