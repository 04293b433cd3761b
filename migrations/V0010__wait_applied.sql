-- Read-your-writes (issue 27): a client that wrote an event (account, seq) can wait until a
-- view's live version shows it, from SQL alone: projector.wait_applied. docs/consistency.md
-- says what each answer means.

-- The highest seq an order-independent view version (eod) has applied or ignored per
-- account. An order-dependent view keeps its applied seq in account_progress.last_seq
-- (contiguous: every seq up to it is applied, or skipped by an engineer); an
-- order-independent view applies every event at once, gap or not, and kept no seq. Written
-- in the batch's transaction, one row per account of the batch (queries::SAVE_SEEN). Events
-- held for their version (unknown_version) or dead-lettered do not count.
--
-- For such a view "applied" therefore means "this seq or a later one of the account has been
-- applied": an account's events come from one partition in seq order, so when a later seq
-- is applied every earlier one was already delivered and has its disposition (applied,
-- dead-lettered, or held, and then the account is parked and the wait says 'parked').
-- Only a producer that publishes an account's seq 5 before its seq 4 makes the answer
-- come early.
CREATE TABLE projector.seen_seqs (
    consumer   text   NOT NULL,
    account_id bigint NOT NULL,
    seen_seq   bigint NOT NULL CHECK (seen_seq >= 0),
    PRIMARY KEY (consumer, account_id)
) WITH (fillfactor = 80);

-- The seq of `account_id` that the view version `consumer` shows: every seq up to it for an
-- order-dependent view; a rebuild's snapshot watermark counts (its state reflects it).
CREATE FUNCTION projector.applied_seq(consumer text, account_id bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT greatest(
        (SELECT greatest(p.last_seq, coalesce(p.watermark_seq, 0)) FROM projector.account_progress p
          WHERE p.consumer = applied_seq.consumer AND p.account_id = applied_seq.account_id),
        (SELECT s.seen_seq FROM projector.seen_seqs s
          WHERE s.consumer = applied_seq.consumer AND s.account_id = applied_seq.account_id),
        0)
$$;

-- The seq of `account_id` that the live version of `view` (its stable name) shows; NULL for
-- a view with no live version.
CREATE FUNCTION projector.applied(view text, account_id bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT projector.applied_seq(v.consumer, applied.account_id)
    FROM projector.views v WHERE v.name = applied.view AND v.state = 'live'
$$;

-- Waits until the live version of `view` has applied `account_id`'s event `seq` (or a later
-- one), for at most `timeout`. Answers:
--   'applied'      the live version shows seq (for an order-independent view: seq or a later
--                  one of the account is applied, see projector.seen_seqs)
--   'parked'       the account is parked in the live version at or below seq: it will not
--                  show seq until an engineer repairs it (answered at once, no wait)
--   'timeout'      neither within the timeout
--   'unknown view' no view of that name exists
-- The live version is looked up again at every check, so a cutover is followed.
--
-- How it waits without polling: the engine's notifier (engine/src/bell.rs) holds a "bell"
-- per view name, an exclusive advisory lock (class 1886544492 "prbl", key hashtext(view)),
-- and after each committed batch of that view releases and takes it again. A waiter queues
-- on it shared; the release grants every queued waiter at once and each checks again. The
-- lock is taken as a transaction lock inside a subtransaction that is rolled back at once,
-- which releases it: a waiter cancelled mid-wait cannot leave it held. A commit between a
-- waiter's check and its queueing is heard at the next ring: the notifier also rings every
-- 100 ms while some waiter queues and nothing rang (the lost wakeup is bounded by that).
-- When no notifier holds the bell (no engine running, `run --no-notify`), the waiter finds
-- it free (a try, before it queues) and checks every 50 ms instead.
--
-- Must run in a READ COMMITTED transaction (each check takes a new snapshot): it raises in a
-- REPEATABLE READ or SERIALIZABLE one, which would never see the engine's commits. The
-- caller's statement_timeout still applies.
CREATE FUNCTION projector.wait_applied(view text, account_id bigint, seq bigint, timeout interval)
RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    deadline  timestamptz := clock_timestamp() + greatest(timeout, interval '0');
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
