-- Read-your-writes review (issue 27): an event an order-independent view (eod) dead-lettered
-- was answered 'applied' once a later event of its account was applied, because such a view
-- does not park for a dead letter and its seen_seq moves past it. wait_applied now answers
-- 'parked' for a seq that has an open dead letter (poison or apply_failed; a 'conflict' is a
-- second event claiming an applied seq, not this one) in the live version: the view will not
-- show it until an engineer retries it (`projector dlq`). The lookup uses
-- dead_letters_account_seq (V0002). A timeout past a century (a caller's "forever") is a
-- century, not a timestamp out of range. The rest of the function is V0010's.

CREATE OR REPLACE FUNCTION projector.wait_applied(view text, account_id bigint, seq bigint, timeout interval)
RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    -- At most a century: a caller meaning "as long as it takes" passes a huge interval, and
    -- clock_timestamp() plus that is out of range.
    deadline  timestamptz := clock_timestamp() + least(greatest(timeout, interval '0'), interval '100 years');
    bell      integer := hashtext(view);
    live      text;
    remaining interval;
    free      boolean;
    saved     text := current_setting('lock_timeout');
    answer    text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'projector.wait_applied needs a READ COMMITTED transaction (this one is %): it would never see the engine''s commits',
            current_setting('transaction_isolation') USING ERRCODE = '25001';
    END IF;
    LOOP
        SELECT v.consumer INTO live FROM projector.views v
         WHERE v.name = wait_applied.view AND v.state = 'live';
        IF live IS NULL AND NOT EXISTS (SELECT 1 FROM projector.views v WHERE v.name = wait_applied.view) THEN
            answer := 'unknown view';
        ELSIF live IS NOT NULL AND EXISTS (
            SELECT 1 FROM projector.parked_accounts k
             WHERE k.consumer = live AND k.account_id = wait_applied.account_id
               AND k.blocked_seq <= wait_applied.seq
               -- a park an order-dependent view has already moved past is stale
               AND k.blocked_seq > coalesce((SELECT p.last_seq FROM projector.account_progress p
                                              WHERE p.consumer = live
                                                AND p.account_id = wait_applied.account_id), 0)) THEN
            answer := 'parked';
        ELSIF live IS NOT NULL AND EXISTS (
            -- An open dead letter of this very event: an order-independent view applies the
            -- account's later events around it (it does not park), so its seen_seq passes
            -- seq though the view does not show this one.
            SELECT 1 FROM projector.dead_letters d
             WHERE d.consumer = live AND d.account_id = wait_applied.account_id
               AND d.seq = wait_applied.seq AND d.resolved_at IS NULL
               AND d.kind IN ('poison', 'apply_failed')) THEN
            answer := 'parked';
        ELSIF live IS NOT NULL AND projector.applied_seq(live, wait_applied.account_id) >= wait_applied.seq THEN
            answer := 'applied';
        ELSE
            remaining := deadline - clock_timestamp();
            IF remaining <= interval '0' THEN
                answer := 'timeout';
            END IF;
        END IF;
        EXIT WHEN answer IS NOT NULL;
        PERFORM set_config('lock_timeout',
                           least(2147483647, greatest(1, ceil(extract(epoch FROM remaining) * 1000)))::bigint || 'ms', true);
        free := false;
        BEGIN
            IF pg_try_advisory_xact_lock_shared(1886544492, bell) THEN
                -- Nobody holds the bell: no notifier runs (or it is between a release and
                -- its next hold, a few microseconds).
                free := true;
            ELSE
                PERFORM pg_advisory_xact_lock_shared(1886544492, bell);
            END IF;
            -- Rang (or free): roll the subtransaction back, which lets go of the lock.
            RAISE SQLSTATE 'PRB01';
        EXCEPTION
            WHEN SQLSTATE 'PRB01' THEN NULL;
            WHEN lock_not_available THEN NULL;
        END;
        -- With no notifier, check again after a short sleep rather than spin.
        IF free THEN
            PERFORM pg_sleep(least(0.05, greatest(0, extract(epoch FROM deadline - clock_timestamp()))));
        END IF;
    END LOOP;
    PERFORM set_config('lock_timeout', saved, true);
    RETURN answer;
END
$$;
