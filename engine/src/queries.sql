-- The hot path's statements: every statement a batch (and a repair, through the same path)
-- runs against the engine's own tables. All of them are set-based (arrays in, one statement
-- out) so that a batch costs a fixed number of round trips whatever its size. $1 is always
-- the consumer name. `queries.rs` holds each as a constant, read at compile time without the
-- comments that open its section (`SqlFile::statement`): what a statement does and why is
-- here, and stays off the wire. The same tables' statements outside a batch are their
-- owners' (dead_letters.sql, parked.sql, progress.sql, inbox.sql, versions.sql).

-- name: lock_offset
-- Locks this partition's offset row for the rest of the transaction and reads it, creating
-- it at the batch's start (`$4`) for a partition nobody has committed yet. Every writer of
-- the partition runs this first in its transaction, before it locks any account, so writers
-- of one partition are serial and never hold an account while they wait for the partition.
-- No row comes back only when another writer created the row concurrently (the insert
-- waited for it to commit): this batch is then fenced without waiting again.
WITH locked AS (
    SELECT next_offset FROM projector.offsets
    WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE),
created AS (
    INSERT INTO projector.offsets (consumer, topic, partition, next_offset)
    SELECT $1, $2, $3, $4 WHERE NOT EXISTS (SELECT 1 FROM locked)
    ON CONFLICT DO NOTHING RETURNING next_offset)
SELECT next_offset FROM locked UNION ALL SELECT next_offset FROM created

-- name: advance_offset
-- Moves the offset past the batch and adds the batch's counts, which are therefore exact:
-- they count what committed and survive crashes. The `next_offset = $5` condition is the
-- fence: it holds only for the writer whose batch starts where the last committed batch
-- ended.
UPDATE projector.offsets SET next_offset = $4, updated_at = now(),
applied = applied + $6, ignored = ignored + $7, duplicates = duplicates + $8,
dead_lettered = dead_lettered + $9, waiting = waiting + $10, drained = drained + $11,
committed_by = $12,
dup_seq = dup_seq + $13, dup_watermark = dup_watermark + $14,
dup_inbox = dup_inbox + $15, dup_version_filter = dup_version_filter + $16,
outside_window = outside_window + $17, below_seen = below_seen + $18
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND next_offset = $5

-- name: read_offset
-- The stored offset of a partition, for seeking on assignment.
SELECT next_offset FROM projector.offsets
WHERE consumer = $1 AND topic = $2 AND partition = $3

-- name: ensure_progress
-- Creates the progress rows of accounts an order-dependent view has never seen, so that
-- `lock_accounts` can lock every account of the batch. A concurrent creator of the same
-- row waits on the primary key until this transaction ends. The accounts come sorted, so
-- two writers that share accounts (after a partition-count change) take their locks in the
-- same order and never deadlock.
INSERT INTO projector.account_progress (consumer, account_id, last_seq)
SELECT $1, a, 0 FROM unnest($2::bigint[]) AS a
ON CONFLICT (consumer, account_id) DO NOTHING

-- name: lock_accounts
-- Locks the batch's accounts' progress rows until commit. Two writers that share an
-- account (two producers, a partition-count change) then take turns: without the lock, one
-- could park the account on a `seq` the other is applying at that moment, and the events
-- waiting behind it would wait for ever. Locked in account order (the lock sits above the
-- sort), like `ensure_progress`. The state is read by `read_accounts`, a statement of its
-- own: after a lock wait PostgreSQL re-reads only the locked row, and a park joined in the
-- same statement would still show what it was before the wait.
SELECT p.account_id FROM projector.account_progress p
WHERE p.consumer = $1 AND p.account_id = ANY($2::bigint[])
ORDER BY p.account_id FOR UPDATE

-- name: read_accounts
-- Progress and parked state of the batch's accounts: after `lock_accounts` for an
-- order-dependent view (a fresh snapshot, taken once the locks are held), alone for an
-- order-independent one, which reads only the rebuild watermark and never parks.
SELECT a.account_id, p.last_seq, p.last_event_id, p.watermark_seq, k.blocked_seq, p.emit_after_seq,
       p.last_occurred_at
FROM unnest($2::bigint[]) AS a(account_id)
LEFT JOIN projector.account_progress p ON p.consumer = $1 AND p.account_id = a.account_id
LEFT JOIN projector.parked_accounts k ON k.consumer = $1 AND k.account_id = a.account_id

-- name: read_accounts_seen
-- `read_accounts` for an order-independent view, with the highest `seq` it has applied per
-- account (`projector.seen_seqs`, V0010): an event at or below it that the inbox does not
-- know is counted (`below_seen`, see [`crate::Counts`]).
SELECT a.account_id, p.last_seq, p.last_event_id, p.watermark_seq, k.blocked_seq, p.emit_after_seq,
       p.last_occurred_at, s.seen_seq
FROM unnest($2::bigint[]) AS a(account_id)
LEFT JOIN projector.account_progress p ON p.consumer = $1 AND p.account_id = a.account_id
LEFT JOIN projector.parked_accounts k ON k.consumer = $1 AND k.account_id = a.account_id
LEFT JOIN projector.seen_seqs s ON s.consumer = $1 AND s.account_id = a.account_id

-- name: load_waiting
-- Events waiting for the given accounts, in `seq` order.
--
-- At most `$3` per account, the lowest `seq`s: a batch's work must stay bounded however long
-- an account was parked (a day's events of a busy account behind one lost event). What is
-- not loaded drains in later steps (`BatchOutcome::more_to_drain`).
SELECT w.account_id, w.seq, w.event_id, w.topic, w.partition, w."offset", w.message_key, w.payload
FROM unnest($2::bigint[]) AS a(account_id)
CROSS JOIN LATERAL (SELECT * FROM projector.waiting_events w
                    WHERE w.consumer = $1 AND w.account_id = a.account_id
                    ORDER BY w.seq LIMIT $3) w
ORDER BY w.account_id, w.seq

-- name: load_waiting_at
-- Waiting events of the given `(account, seq)`s: those a batch's events would wait at,
-- beyond the `load_waiting` limit of their account. An event already waiting there holds
-- the `seq`, and the batch's event is its duplicate or a conflict, which only the event
-- ids tell; the waiting table's key would otherwise keep the second out silently.
SELECT w.account_id, w.seq, w.event_id, w.topic, w.partition, w."offset", w.message_key, w.payload
FROM projector.waiting_events w
WHERE w.consumer = $1 AND (w.account_id, w.seq) IN (SELECT * FROM unnest($2::bigint[], $3::bigint[]))
ORDER BY w.account_id, w.seq

-- name: load_dead_seqs
-- The `seq`s of the given accounts that open dead letters hold (poison, a failed statement;
-- a conflict never holds the `seq` it names), with the dead letter's event id where it is
-- known, oldest first. An event arriving for such a `seq` is the dead event's correction
-- when it carries its id, and a second event for the `seq` (a conflict) when it carries
-- another. Read after the accounts are locked (a batch, a repair); a probe of the open dead
-- letters' partial index, nearly always empty.
SELECT account_id, seq, event_id FROM projector.dead_letters
WHERE consumer = $1 AND account_id = ANY($2::bigint[]) AND resolved_at IS NULL
  AND kind IN ('poison', 'apply_failed') AND seq IS NOT NULL
ORDER BY account_id, seq, id

-- name: in_inbox
-- Which of the given events (`$2` ids, `$3` their `occurred_at`) this view version has
-- applied: tells a true duplicate of an older `seq` from a second event claiming it (a
-- conflict). An event's identity in the inbox is its id *and* its time: the same id with
-- another `occurred_at` is another event (a conflict, when it claims a taken `seq`). Rows of
-- the inbox before V0009 (`projector.inbox_legacy`) know the id alone; their time comes back
-- NULL and matches any.
SELECT i.event_id::text, i.occurred_at FROM projector.inbox i
WHERE i.consumer = $1 AND (i.event_id, i.occurred_at) IN
      (SELECT * FROM unnest($2::text[], $3::timestamptz[]))
UNION ALL
SELECT l.event_id::text, NULL FROM projector.inbox_legacy l
WHERE l.consumer = $1 AND l.event_id = ANY($2::text[])

-- name: save_progress
-- Records the last applied `seq` of accounts (their rows exist: `ensure_progress`) and the
-- event that holds it, so a later event claiming the same `seq` is named in its conflict.
-- Progress never goes backwards.
UPDATE projector.account_progress p
SET last_seq = x.s, last_event_id = x.e, last_occurred_at = x.t, updated_at = now()
FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::timestamptz[]) AS x(a, s, e, t)
WHERE p.consumer = $1 AND p.account_id = x.a AND p.last_seq <= x.s

-- name: save_seen
-- Records the highest `seq` an order-independent view version has applied (or ignored) per
-- account (`projector.seen_seqs`, V0010), for read-your-writes (`projector.wait_applied`):
-- such a view keeps no `last_seq`. The accounts come sorted and once each; the row never
-- goes backwards. Events held for their version or dead-lettered are not counted.
INSERT INTO projector.seen_seqs AS s (consumer, account_id, seen_seq)
SELECT $1, x.a, x.q FROM unnest($2::bigint[], $3::bigint[]) AS x(a, q)
ON CONFLICT (consumer, account_id) DO UPDATE SET seen_seq = EXCLUDED.seen_seq
WHERE s.seen_seq < EXCLUDED.seen_seq

-- name: insert_dead_letters
-- Dead letters, with the raw bytes. A message is dead-lettered once per view version: when
-- it fails again (a retry, or a waiting event that no longer decodes), its open row takes
-- the newest error. A row resolved by a retry that only sent its event to wait
-- (`RETRIED_WAITING_NOTE`) is opened again: the event failed when it drained, and
-- resolved, the row would hide the one event its account now waits on, which `dlq retry`
-- would refuse to retry.
INSERT INTO projector.dead_letters
(consumer, topic, partition, "offset", kind, message_key, payload, event_id, account_id, seq, error)
SELECT $1, t, p, o, k, mk, pl, e, a, s, err
FROM unnest($2::text[], $3::int[], $4::bigint[], $5::text[], $6::bytea[], $7::bytea[],
            $8::text[], $9::bigint[], $10::bigint[], $11::text[]) AS x(t, p, o, k, mk, pl, e, a, s, err)
ON CONFLICT (consumer, topic, partition, "offset") DO UPDATE
SET kind = EXCLUDED.kind, error = EXCLUDED.error,
    resolved_at = NULL, resolution = NULL, resolved_by = NULL, resolution_note = NULL
WHERE projector.dead_letters.resolved_at IS NULL
   OR (projector.dead_letters.resolution = 'retried'
       AND projector.dead_letters.resolution_note = 'waiting')

-- name: insert_waiting
-- Events that must wait, with their raw bytes.
-- An event held for its version carries its type and version (`$10`, `$11`; NULL for the
-- others), for `drainable_accounts`.
INSERT INTO projector.waiting_events
(consumer, account_id, seq, event_id, topic, partition, "offset", message_key, payload,
 event_type, type_version)
SELECT $1, a, s, e, t, p, o, mk, pl, ht, hv
FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::int[], $7::bigint[],
            $8::bytea[], $9::bytea[], $10::text[], $11::int[])
     AS x(a, s, e, t, p, o, mk, pl, ht, hv)
ON CONFLICT (consumer, account_id, seq) DO NOTHING

-- name: delete_waiting
-- Waiting events that left the table in this batch: applied, ignored or dead-lettered.
DELETE FROM projector.waiting_events
WHERE consumer = $1 AND (account_id, seq) IN (SELECT * FROM unnest($2::bigint[], $3::bigint[]))

-- name: park_accounts
-- Parks accounts, or updates why they are parked. The reason is decided here, after this
-- batch's dead letters are written: `unknown_version` when the event at the blocking `seq`
-- waits because it is of a version the view does not read yet (its type, version and why
-- come from the batch: `$5` to `$7`, NULL otherwise), so a build that reads it can find the
-- account (`DRAINABLE_ACCOUNTS`); `dead_letter` when an open dead letter holds the blocking
-- `seq` (poison, a failed statement), naming it, so an operator can tell "blocked by a bad
-- message" from `gap`, "waiting for an event that has not arrived". A conflict at that
-- `seq` does not hold it: the dead letter it conflicts with does, or nothing yet.
INSERT INTO projector.parked_accounts AS k
(consumer, account_id, reason, blocked_seq, dead_letter_id, detail, event_type, type_version)
SELECT $1, x.a,
       CASE WHEN x.ht IS NOT NULL THEN 'unknown_version'
            WHEN d.id IS NULL THEN 'gap' ELSE 'dead_letter' END,
       x.b, CASE WHEN x.ht IS NULL THEN d.id END,
       CASE WHEN x.ht IS NOT NULL
            THEN format('seq %s: %s; %s later event(s) wait', x.b, left(x.hw, 300), x.w - 1)
            WHEN d.id IS NULL
            THEN format('waiting for seq %s; %s later event(s) wait', x.b, x.w)
            ELSE format('seq %s is dead letter %s (%s: %s); %s later event(s) wait',
                        x.b, d.id, d.kind, left(d.error, 300), x.w) END,
       x.ht, x.hv
FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::int[], $7::text[])
     AS x(a, b, w, ht, hv, hw)
LEFT JOIN LATERAL (SELECT id, kind, error FROM projector.dead_letters
                   WHERE consumer = $1 AND account_id = x.a AND seq = x.b AND resolved_at IS NULL
                     AND kind <> 'conflict'
                   ORDER BY id DESC LIMIT 1) d ON true
ON CONFLICT (consumer, account_id) DO UPDATE
SET reason = EXCLUDED.reason, blocked_seq = EXCLUDED.blocked_seq,
    dead_letter_id = EXCLUDED.dead_letter_id, detail = EXCLUDED.detail,
    event_type = EXCLUDED.event_type, type_version = EXCLUDED.type_version,
    parked_at = CASE WHEN k.blocked_seq = EXCLUDED.blocked_seq THEN k.parked_at ELSE now() END

-- name: relabel_parks
-- Parks whose blocking `seq` arrived in this batch as poison, for accounts the batch holds
-- no sound event of (the others go through `park_accounts`): they now wait for a dead
-- letter, not for an event that never came.
UPDATE projector.parked_accounts k
SET reason = 'dead_letter', dead_letter_id = d.id,
    detail = format('seq %s is dead letter %s (%s: %s); %s later event(s) wait',
                    k.blocked_seq, d.id, d.kind, left(d.error, 300),
                    (SELECT count(*) FROM projector.waiting_events w
                     WHERE w.consumer = k.consumer AND w.account_id = k.account_id))
FROM unnest($2::bigint[], $3::bigint[]) AS x(a, s)
CROSS JOIN LATERAL (SELECT id, kind, error FROM projector.dead_letters
                    WHERE consumer = $1 AND account_id = x.a AND seq = x.s AND resolved_at IS NULL
                      AND kind <> 'conflict'
                    ORDER BY id DESC LIMIT 1) d
WHERE k.consumer = $1 AND k.account_id = x.a AND k.blocked_seq = x.s
  AND k.reason <> 'unknown_version'

-- name: resolve_superseded
-- Dead letters whose event an applied event now stands for (the producer republished the
-- event corrected, with its id, at its account and `seq`): resolved as superseded, so the
-- open dead letters are the ones that still need an engineer. Conflicts stay open: they are
-- write-side bugs. A dead letter of another event id at that `seq` stays open too: its
-- event was never applied (in an order-dependent view the applied event was the first to
-- claim the `seq`; an order-independent view applies both). A poison dead letter without
-- an event id (its envelope was unreadable, named none, or an id the wire format refuses,
-- see `event::Salvage`) cannot be told from its correction, and whatever is applied at its
-- `seq` supersedes it: the write side promises one event per `seq`. Sent with every batch:
-- a probe of a partial index that holds only open dead letters, nearly always empty.
UPDATE projector.dead_letters d
SET resolved_at = now(), resolution = 'superseded', resolved_by = 'projector',
    resolution_note = 'a later event for the same seq was applied'
FROM unnest($2::bigint[], $3::bigint[], $4::text[]) AS x(a, s, e)
WHERE d.consumer = $1 AND d.resolved_at IS NULL AND d.kind IN ('poison', 'apply_failed')
  AND d.account_id = x.a AND d.seq = x.s AND (d.event_id IS NULL OR d.event_id = x.e)

-- name: drainable_accounts
-- Parked accounts whose next `seq` already waits, among events read from one partition
-- (`$2`, `$3`): a drain that stopped short. A batch drains at most a thousand waiting events
-- of an account and leaves it parked at its next `seq` while more wait, so that the next
-- step loads them (`BatchOutcome::more_to_drain`); a drain that a shutdown, a crash or an
-- error cut short leaves exactly this, and so does a park another writer made stale. At
-- most `$4`, by account. A probe of the waiting events' key per parked account.
--
-- An account parked on an event of a version the view did not read (`unknown_version`) is
-- drainable once the build looking reads that version: `$5` and `$6` are the types the
-- view subscribes to and the version it reads each at. A build that still does not read it
-- passes it by, so it never drains the same accounts in vain. In an order-independent view
-- (`$7`) such parks are the only ones, and their held events wait at any `seq`, each for
-- itself: the park names the lowest, and the account is drainable when this build reads any
-- of them (the waiting events' own type and version, V0012; an event stored before has
-- none and is found through the park alone). In an order-dependent view only the event at
-- the blocking `seq` can let the account move.
SELECT k.account_id FROM projector.parked_accounts k
LEFT JOIN projector.account_progress p ON p.consumer = k.consumer AND p.account_id = k.account_id
WHERE k.consumer = $1
  AND (k.reason <> 'unknown_version'
       OR k.type_version <= coalesce((SELECT r.v FROM unnest($5::text[], $6::int[]) AS r(t, v)
                                      WHERE r.t = k.event_type), 1)
       OR ($7 AND EXISTS (SELECT 1 FROM projector.waiting_events h
              WHERE h.consumer = $1 AND h.account_id = k.account_id
                AND h.topic = $2 AND h.partition = $3
                AND h.type_version <= coalesce((SELECT r.v FROM unnest($5::text[], $6::int[]) AS r(t, v)
                                                WHERE r.t = h.event_type), 1))))
  AND EXISTS (SELECT 1 FROM projector.waiting_events w
    WHERE w.consumer = $1 AND w.account_id = k.account_id
      AND (k.reason = 'unknown_version'
           OR w.seq <= greatest(p.last_seq, coalesce(p.watermark_seq, 0)) + 1)
      AND w.topic = $2 AND w.partition = $3)
ORDER BY k.account_id LIMIT $4

-- name: unpark_accounts
-- Accounts whose wait is over.
DELETE FROM projector.parked_accounts WHERE consumer = $1 AND account_id = ANY($2::bigint[])

-- name: open_batch_savepoint
-- Opens the savepoint of a batch's fast path (if one of the pipelined rounds fails, the
-- engine rolls back to it and redoes the rounds one by one to find the event at fault).
--
-- It also turns sequential scans off for the rest of the transaction. A view statement
-- touches one batch's rows, so a sequential scan of a view table is never the plan it
-- wants, but PostgreSQL picks one for a new view version: it caches a generic plan while
-- the table is new and believed small (hash join over a sequential scan), and keeps that
-- plan until autovacuum next analyzes the table, while a rebuild grows the table by
-- millions of rows. The bench measured it at a tenth of the database's time when
-- catching up a new version of 4,000 rows. With the setting off, the planner takes the
-- index; a table without a usable index is still scanned, as the only plan left.
--
-- And it makes deferred constraints immediate: a view's `DEFERRABLE` unique key (a
-- business key, the second line of defence) would otherwise fail at COMMIT, where no
-- savepoint can say which event broke it, and the batch would fail the same way for ever.
SET LOCAL enable_seqscan = off;
SET CONSTRAINTS ALL IMMEDIATE;
SAVEPOINT projector_batch

-- name: release_batch_savepoint
-- Ends the fast path's savepoint after every round succeeded.
RELEASE SAVEPOINT projector_batch

-- name: rollback_batch_savepoint
-- Undoes the fast path after a failed round and keeps its savepoint open: the careful path
-- runs inside it, so that the whole pass can still be undone (a split, see
-- `Applier::apply_in`); the bookkeeping releases it.
ROLLBACK TO SAVEPOINT projector_batch

-- name: undo_batch_savepoint
-- Undoes a whole pass over part of a batch and ends its savepoint.
ROLLBACK TO SAVEPOINT projector_batch;
RELEASE SAVEPOINT projector_batch

-- name: view_is_live
-- Whether this view version is live, for a view that emits notices, held shared until the
-- batch commits: a cutover locks the row for update, so it waits for every batch in flight
-- and every later batch sees its outcome. That makes the hand-over of notices exact: the
-- old version emitted for exactly the events it applied before the cutover, and the new one
-- emits only past them (`account_progress.emit_after_seq`).
SELECT state = 'live' FROM projector.views
WHERE name = $1 AND version = $2 FOR KEY SHARE

-- name: inbox_ctes
-- The inbox guard: only rows this statement inserts come back, so `ev` holds exactly the
-- events this view version sees for the first time. The key is (consumer, occurred_at,
-- event_id) (`migrations/V0009__inbox_by_event_time.sql`): a copy of an event repeats both.
fresh AS (INSERT INTO projector.inbox (consumer, occurred_at, event_id)
          SELECT $1::text, occurred_at, event_id FROM batch
          ON CONFLICT DO NOTHING RETURNING event_id, occurred_at),
ev AS (SELECT batch.* FROM batch JOIN fresh USING (event_id, occurred_at)
       WHERE EXISTS (SELECT 1 FROM fresh))

-- name: legacy_inbox_ctes
-- `inbox_ctes` for a consumer that still has rows in the inbox before V0009
-- (`projector.inbox_legacy`, keyed by id alone): an event found there was applied before the
-- move and is skipped like one the inbox has. Used only while the consumer has such rows
-- (`inbox::has_legacy_rows`); the table takes no new ones.
fresh AS (INSERT INTO projector.inbox (consumer, occurred_at, event_id)
          SELECT $1::text, b.occurred_at, b.event_id FROM batch b
          WHERE NOT EXISTS (SELECT 1 FROM projector.inbox_legacy l
                            WHERE l.consumer = $1::text AND l.event_id = b.event_id)
          ON CONFLICT DO NOTHING RETURNING event_id, occurred_at),
ev AS (SELECT batch.* FROM batch JOIN fresh USING (event_id, occurred_at)
       WHERE EXISTS (SELECT 1 FROM fresh))

-- name: fresh_inbox_ctes
-- The inbox guard of the fast path's first try, for events expected to be new (an
-- order-dependent view on an ordered source sends only events past each account's locked
-- `last_seq`; other views' batches are new unless redelivered): a plain insert, which the
-- unique key still guards. An event the inbox has fails
-- the statement (23505) instead of being skipped: nothing of it is applied, the engine rolls
-- back to the batch's savepoint and runs the rounds again with `inbox_ctes`, which skips
-- it. The same dedup in the statement, without the speculative insertion of
-- `ON CONFLICT`, which costs about as much per event as the insert itself (docs/benchmarks.md).
-- Never for a consumer with rows in `projector.inbox_legacy`, which a plain insert cannot see.
--
-- `ev` waits for the whole insert (`count(*)` reads every row of `fresh`, once, before `ev`
-- yields a row): every inbox row is written, and its key locked, before the view's CTEs
-- touch a view row, the lock order of `inbox_ctes`. With `EXISTS`, which reads one row,
-- PostgreSQL finished the insert after the view's writes, and two writers sharing an id and
-- a view row could deadlock.
fresh AS (INSERT INTO projector.inbox (consumer, occurred_at, event_id)
          SELECT $1::text, occurred_at, event_id FROM batch RETURNING event_id),
ev AS (SELECT batch.* FROM batch WHERE (SELECT count(*) FROM fresh) > 0)

-- name: no_inbox_ctes
-- For views that dedup by version filter only: `ev` is the whole batch. `$1` is still
-- referenced so every statement has the same parameter list.
ev AS (SELECT batch.* FROM batch WHERE $1::text IS NOT NULL)
