//! An id the inbox already has, met by the plain (fresh) insert of an order-dependent view on
//! an ordered source. The fast path (1180f6c) inserts its inbox rows without `ON CONFLICT`
//! (`queries::FRESH_INBOX_CTES`); an id the inbox has fails the statement, the batch rolls
//! back to `projector_batch` and the careful path replays the rounds with the
//! `ON CONFLICT DO NOTHING` statement.
//!
//! Each test drives one way a reused id can reach the fast statement (a drained waiting
//! event, a retried dead letter, a skip, a drain, a failure with its correction, two
//! concurrent writers, a repeat inside one batch, an id first carried by a type the view
//! ignores) and checks that the outcome is the one the `ON CONFLICT` statement gave before
//! the change: the id applied once, nothing dead-lettered for it, no park left, counters
//! that add up. They pass on 1180f6c and on its parent alike (checked in a worktree of
//! eb4a064 with this file copied in).

use std::sync::Arc;

use crate::support::{
    applier_db, kinds, lock_waiters, offsets, spawn_apply, trail_of, trail_parks, Tally, Trail,
};
use projector_engine::testkit::{cash, fill, EventSpec, Partition};
use projector_engine::{Applier, Batch, BatchOutcome, DedupMode, Disposition};

use Disposition::*;

const AT: &str = "2026-11-29T10:15:00Z";
const TRAIL: &str = "trail_v1";

fn f(account: i64, seq: i64, qty: &str) -> EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

async fn apply(
    applier: &Applier,
    client: &mut deadpool_postgres::Client,
    b: &Batch,
) -> BatchOutcome {
    applier.apply(client, b).await.expect("batch")
}

async fn one(client: &deadpool_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

async fn open_dead_letters(
    client: &deadpool_postgres::Client,
) -> Vec<(Option<i64>, Option<i64>, String)> {
    client
        .query(
            "SELECT account_id, seq, error FROM projector.dead_letters \
             WHERE consumer = 'trail_v1' AND resolved_at IS NULL ORDER BY id",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

async fn last_seq(client: &deadpool_postgres::Client, account: i64) -> i64 {
    client
        .query_one(
            "SELECT last_seq FROM projector.account_progress WHERE consumer = 'trail_v1' AND account_id = $1",
            &[&account],
        )
        .await
        .expect("progress")
        .get(0)
}

/// Every message counted once in `projector.offsets`, waiting ones twice.
async fn assert_offsets_add_up(client: &deadpool_postgres::Client, consumer: &str, messages: i64) {
    let o = offsets(client, consumer).await;
    assert_eq!(o.accounted(), messages, "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_a_drained_waiting_event_with_a_reused_id_is_skipped_and_unparks() {
    // The waiting event was stored before its id reached the inbox; it drains past
    // last_seq, so the fast statement gets it, fails, and the careful path skips it.
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(2, 2, "1").with_id("shared")); // 0: waits for account 2's seq 1
    log.push_event(&f(2, 3, "1")); // 1: waits too
    let first = apply(&applier, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&first), [Waiting, Waiting]);
    assert_eq!(trail_parks(&client).await, [(2, 1)]);

    log.push_event(&f(1, 1, "1").with_id("shared")); // 2: the id reaches the inbox
    log.push_event(&f(2, 1, "1")); // 3: releases account 2: 2 (shared) and 3 drain
    let second = apply(&applier, &mut client, &log.batch(2, 10)).await;
    assert_eq!(kinds(&second), [Applied, Applied]);
    assert_eq!(second.counts.dup_inbox, 1, "{:?}", second.counts);
    assert_eq!(second.counts.drained, 2, "{:?}", second.counts);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1"));
    assert_eq!(trail_of(&client, 2).await.as_deref(), Some("1,3"));
    assert!(trail_parks(&client).await.is_empty());
    assert!(open_dead_letters(&client).await.is_empty());
    assert_eq!(last_seq(&client, 2).await, 3);
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.waiting_events").await,
        0
    );
    assert_offsets_add_up(&client, TRAIL, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_retrying_a_dead_letter_whose_id_the_inbox_has_resolves_it() {
    // A repair goes through `execute` too: its 23505 must fall back, not fail the repair
    // or leave the dead letter open with a "duplicate key" error.
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1000000").with_id("x")); // 0: CHECK fails: dead-lettered
    log.push_event(&f(1, 2, "1")); // 1: waits behind it
    let first = apply(&applier, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&first), [DeadLettered, Waiting]);
    log.push_event(&f(2, 1, "1").with_id("x")); // 2: another account reuses the id
    apply(&applier, &mut client, &log.batch(2, 10)).await;

    let id: i64 = one(&client, "SELECT id FROM projector.dead_letters").await;
    let (disposition, counts) = applier
        .retry_dead_letter(&mut client, id, "review")
        .await
        .expect("retry");
    // The statement skips it as an inbox duplicate (its content never reaches the view),
    // exactly as the ON CONFLICT statement did; what waited behind it drains.
    assert_eq!(disposition, Applied);
    assert_eq!((counts.dup_inbox, counts.drained), (1, 1), "{counts:?}");
    assert!(open_dead_letters(&client).await.is_empty());
    assert!(trail_parks(&client).await.is_empty());
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("2"));
    assert_eq!(trail_of(&client, 2).await.as_deref(), Some("1"));
    assert_eq!(last_seq(&client, 1).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_skip_and_drain_apply_around_a_reused_id() {
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("shared")); // 0
    log.push_event(&f(2, 2, "1").with_id("shared")); // 1: waits, seq 1 is lost
    log.push_event(&f(2, 3, "1")); // 2: waits
    log.push_event(&f(3, 2, "1").with_id("shared")); // 3: waits, seq 1 comes late
    log.push_event(&f(3, 3, "1")); // 4
    let first = apply(&applier, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&first), [Applied, Waiting, Waiting, Waiting, Waiting]);

    // skip_seq drains account 2 through the fast statement.
    let counts = applier
        .skip_seq(&mut client, 2, 1, "review", "lost")
        .await
        .expect("skip");
    assert_eq!(
        (counts.dup_inbox, counts.applied, counts.drained),
        (1, 1, 2),
        "{counts:?}"
    );
    assert_eq!(trail_of(&client, 2).await.as_deref(), Some("3"));

    // drain_account on a park made stale by hand (seq 1 applied by someone else).
    client
        .execute(
            "UPDATE projector.account_progress SET last_seq = 1, last_event_id = 'elsewhere' \
             WHERE consumer = 'trail_v1' AND account_id = 3",
            &[],
        )
        .await
        .expect("stale park");
    let (counts, more) = applier.drain_account(&mut client, 3).await.expect("drain");
    assert!(!more);
    assert_eq!(
        (counts.dup_inbox, counts.applied, counts.drained),
        (1, 1, 2),
        "{counts:?}"
    );
    assert_eq!(trail_of(&client, 3).await.as_deref(), Some("3"));
    assert!(trail_parks(&client).await.is_empty());
    assert!(open_dead_letters(&client).await.is_empty());
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.waiting_events").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_a_reused_id_beside_a_failure_and_its_correction_splits_as_before() {
    // Fast path fails (reused id, or the content error: either), careful path dead-letters
    // the bad event and skips the reused id, the correction makes a split, the passes after
    // it run the fast statement again.
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("shared")); // 0
    apply(&applier, &mut client, &log.batch(0, 10)).await;

    log.push_event(&f(2, 1, "1000000").with_id("bad")); // 1: fails its CHECK
    log.push_event(&f(3, 1, "1").with_id("shared")); // 2: reused id
    log.push_event(&f(2, 1, "2").with_id("bad")); // 3: the correction, other bytes
    log.push_event(&f(2, 2, "1")); // 4
    log.push_event(&f(3, 2, "1")); // 5
    let out = apply(&applier, &mut client, &log.batch(1, 10)).await;
    assert_eq!(
        kinds(&out),
        [DeadLettered, Applied, Applied, Applied, Applied]
    );
    assert_eq!(
        (out.counts.failed, out.counts.dup_inbox),
        (1, 1),
        "{:?}",
        out.counts
    );
    assert_eq!(trail_of(&client, 2).await.as_deref(), Some("1,2"));
    assert_eq!(trail_of(&client, 3).await.as_deref(), Some("2"));
    assert!(trail_parks(&client).await.is_empty());
    assert_offsets_add_up(&client, TRAIL, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_concurrent_writers_reusing_an_id_apply_it_once() {
    // Two partitions, two accounts, one id, writer A uncommitted when writer B's plain
    // insert meets its row: B waits (as ON CONFLICT waits), then falls back and skips it;
    // if A rolls back instead, B applies it.
    for a_commits in [true, false] {
        let (db, applier) = applier_db(Trail::new(1)).await;
        let applier = Arc::new(applier);
        let mut a = db.client().await;
        let mut p0 = Partition::new("fills", 0);
        p0.push_event(&f(1, 1, "1").with_id("shared"));
        let mut p1 = Partition::new("fills", 1);
        p1.push_event(&f(2, 1, "1"));
        p1.push_event(&f(2, 2, "1").with_id("shared"));
        p1.push_event(&f(2, 3, "1"));

        applier
            .make_days_for(&mut a, &p0.batch(0, 10))
            .await
            .expect("the inbox's days");
        let mut tx = a.transaction().await.expect("begin");
        let held = applier
            .apply_in(&mut tx, &p0.batch(0, 10))
            .await
            .expect("A");
        assert_eq!(kinds(&held), [Applied]);
        let b_task = spawn_apply(&applier, &db, p1.batch(0, 10));
        let observer = db.client().await;
        lock_waiters(&observer, 1).await;
        if a_commits {
            tx.commit().await.expect("commit A");
        } else {
            tx.rollback().await.expect("rollback A");
        }
        let b = b_task.await.expect("B");
        assert_eq!(kinds(&b), [Applied, Applied, Applied]);
        assert_eq!(b.counts.dup_inbox, u64::from(a_commits), "{:?}", b.counts);
        assert_eq!(
            trail_of(&observer, 2).await.as_deref(),
            Some(if a_commits { "1,3" } else { "1,2,3" })
        );
        assert!(open_dead_letters(&observer).await.is_empty());
        assert_eq!(
            one(
                &observer,
                "SELECT count(*) FROM projector.inbox WHERE event_id = 'shared'"
            )
            .await,
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_an_id_twice_in_one_batch_never_reaches_the_fresh_statement_twice() {
    // Same id at two seqs of one account (two rounds) and in another account's round 1:
    // `mark_repeated_ids` keeps the repeats out, so the fast statement does not fail.
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("twice"));
    log.push_event(&f(1, 2, "1").with_id("twice"));
    log.push_event(&f(2, 1, "1").with_id("twice"));
    log.push_event(&f(1, 3, "1"));
    let out = apply(&applier, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&out), [Applied, Duplicate, Duplicate, Applied]);
    assert_eq!(
        (out.counts.applied, out.counts.dup_inbox),
        (2, 2),
        "{:?}",
        out.counts
    );
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,3"));
    assert_eq!(trail_of(&client, 2).await, None);
    assert_eq!(last_seq(&client, 2).await, 1);
    assert_offsets_add_up(&client, TRAIL, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_an_id_first_carried_by_an_ignored_type_is_applied() {
    // An event of a type the view does not read leaves no inbox row: the fill that reuses
    // its id is new to the inbox and goes through the fast statement.
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&cash(1, 1, AT, "5", "deposit").with_id("u"));
    log.push_event(&f(1, 2, "1").with_id("u"));
    log.push_event(&f(2, 1, "1").with_id("u"));
    let out = apply(&applier, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&out), [Ignored, Applied, Duplicate]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("2"));
    assert_offsets_add_up(&client, TRAIL, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_views_without_the_fresh_statement_are_unchanged() {
    // Version filter only: no inbox, a reused id at a new seq is a new event.
    let view = Trail {
        version: 1,
        dedup: DedupMode::VersionFilter,
    };
    let (db, applier) = applier_db(view).await;
    assert!(!applier.statement().contains("projector.inbox"));
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("shared"));
    log.push_event(&f(1, 2, "1").with_id("shared"));
    let out = apply(&applier, &mut client, &log.batch(0, 10)).await;
    assert_eq!(kinds(&out), [Applied, Duplicate]);
    log.push_event(&f(1, 3, "1").with_id("shared"));
    let out = apply(&applier, &mut client, &log.batch(2, 10)).await;
    assert_eq!(kinds(&out), [Applied]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,3"));

    // Order-independent (eod-like): the ON CONFLICT statement stays the fallback of its
    // plain insert; a reused id skipped.
    let (db, applier) = applier_db(Tally::new(1)).await;
    assert!(applier
        .statement()
        .contains("ON CONFLICT DO NOTHING RETURNING event_id"));
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(1, 1, "1").with_id("shared"));
    apply(&applier, &mut client, &log.batch(0, 10)).await;
    log.push_event(&f(2, 1, "1").with_id("shared"));
    log.push_event(&f(2, 2, "1"));
    let out = apply(&applier, &mut client, &log.batch(1, 10)).await;
    assert_eq!(
        (out.counts.applied, out.counts.dup_inbox),
        (1, 1),
        "{:?}",
        out.counts
    );
    assert_eq!(
        one(&client, "SELECT fills FROM tally_v1 WHERE account_id = 2").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_one_reused_id_behind_a_thousand_rounds_is_skipped_and_the_rest_applied() {
    // A reused id fails the known-new statement; the same rounds run again pipelined with
    // the ON CONFLICT statement (not round by round under savepoints, whose cost grows with
    // the rounds: here a round per event of one busy account). The outcome is what counts.
    let (db, applier) = applier_db(Trail::new(1)).await;
    let mut client = db.client().await;
    let n = 1000;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f(2, 1, "1").with_id("shared"));
    apply(&applier, &mut client, &log.batch(0, 1)).await;
    for seq in 1..=n {
        let e = f(1, seq, "1");
        log.push_event(&if seq == n { e.with_id("shared") } else { e });
    }
    let out = apply(&applier, &mut client, &log.batch(1, n as usize)).await;
    assert_eq!(
        (out.counts.applied, out.counts.dup_inbox),
        (n as u64 - 1, 1)
    );
    let trail = trail_of(&client, 1).await.expect("account 1");
    assert_eq!(trail.split(',').count(), n as usize - 1);
}

// The plain insert for order-independent views (eod, `Tally` here): their batches are not
// known new by `seq`, so an event published again at a new offset (not filtered by `seq` as
// an order-dependent view's is) fails the first try and the rounds run again with
// `ON CONFLICT`. The outcome must be the `ON CONFLICT` statement's.

async fn tally_rows(client: &deadpool_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT format('(%s,%s,%s,%s)', account_id, fills, qty, memos) \
             FROM tally_v1 ORDER BY account_id",
            &[],
        )
        .await
        .expect("tally rows")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_an_order_independent_view_applies_republished_and_reused_ids_once() {
    let (db, applier) = applier_db(Tally::new(1)).await;
    let mut client = db.client().await;
    let events = crate::support::fills(3, 4);
    let mut log = Partition::new("fills", 0);
    for e in &events {
        log.push_event(e);
    }
    let out = apply(&applier, &mut client, &log.batch(0, 12)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (12, 0));

    // The same twelve events published again (an outbox relay that resent them after a
    // crash): new offsets, ids the inbox has. Nothing is applied twice.
    for e in &events {
        log.push_event(e);
    }
    let out = apply(&applier, &mut client, &log.batch(12, 12)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (0, 12));

    // Republished events first, then new ones: only the new ones count.
    let mut all = events.clone();
    for e in &events[9..] {
        log.push_event(e);
    }
    for seq in 5..=6 {
        for account in 1..=3 {
            let e = f(account, seq, &format!("{account}.{seq}"));
            log.push_event(&e);
            all.push(e);
        }
    }
    let out = apply(&applier, &mut client, &log.batch(24, 9)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (6, 3));

    // New events first and a reused id last: the plain insert has written the new rows
    // when the reused one fails it; the retry must not keep them twice.
    let tail = [
        f(1, 7, "100"),
        f(2, 7, "200"),
        f(3, 7, "300").with_id(&events[0].event_id),
    ];
    for e in &tail {
        log.push_event(e);
        all.push(e.clone());
    }
    let out = apply(&applier, &mut client, &log.batch(33, 3)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (2, 1));
    assert_eq!(tally_rows(&client).await, crate::support::tally_fold(&all));
    assert_eq!(
        one(
            &client,
            "SELECT count(*) FROM projector.inbox WHERE consumer = 'tally_v1'"
        )
        .await,
        20
    );
    assert_offsets_add_up(&client, "tally_v1", 36).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_an_order_independent_view_waits_on_a_concurrent_writer_of_the_same_id() {
    // Writer A holds an uncommitted inbox row; writer B's plain insert of the same id
    // waits for it, then skips it (A committed) or applies it (A rolled back).
    for a_commits in [true, false] {
        let (db, applier) = applier_db(Tally::new(1)).await;
        let applier = Arc::new(applier);
        let mut a = db.client().await;
        let mut p0 = Partition::new("fills", 0);
        p0.push_event(&f(1, 1, "1").with_id("shared"));
        let mut p1 = Partition::new("fills", 1);
        p1.push_event(&f(2, 1, "2"));
        p1.push_event(&f(2, 2, "4").with_id("shared"));

        applier
            .make_days_for(&mut a, &p0.batch(0, 10))
            .await
            .expect("the inbox's days");
        let mut tx = a.transaction().await.expect("begin");
        let held = applier
            .apply_in(&mut tx, &p0.batch(0, 10))
            .await
            .expect("A");
        assert_eq!(kinds(&held), [Applied]);
        let b_task = spawn_apply(&applier, &db, p1.batch(0, 10));
        let observer = db.client().await;
        lock_waiters(&observer, 1).await;
        if a_commits {
            tx.commit().await.expect("commit A");
        } else {
            tx.rollback().await.expect("rollback A");
        }
        let b = b_task.await.expect("B");
        // One statement for the whole round: dispositions say sent, the counters say what
        // the inbox skipped (as with `ON CONFLICT` alone).
        assert_eq!(kinds(&b), [Applied, Applied]);
        assert_eq!(
            (b.counts.applied, b.counts.dup_inbox),
            if a_commits { (1, 1) } else { (2, 0) },
            "{:?}",
            b.counts
        );
        let rows = tally_rows(&observer).await;
        if a_commits {
            assert_eq!(rows, ["(1,1,1,0)", "(2,1,2,0)"]);
        } else {
            assert_eq!(rows, ["(2,2,6,0)"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_inbox_after_a_batch_meets_the_inbox_the_next_go_straight_to_on_conflict() {
    // A run of republished events (a relay resending after a crash) would make every batch
    // pay a failed plain insert and a second pass; after one such batch the applier goes
    // straight to `ON CONFLICT`, and back to the plain insert after a batch that met none.
    use projector_engine::apply::InboxGuard::{Fail, Skip};
    let (db, applier) = applier_db(Tally::new(1)).await;
    let mut client = db.client().await;
    assert_eq!(applier.first_try(), Some(Fail));
    let mut log = Partition::new("fills", 0);
    let mut all = Vec::new();
    let mut push = |log: &mut Partition, e: EventSpec| {
        log.push_event(&e);
        all.push(e);
    };
    for account in 1..=3 {
        push(&mut log, f(account, 1, "1"));
    }
    let out = apply(&applier, &mut client, &log.batch(0, 3)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (3, 0));
    assert_eq!(applier.first_try(), Some(Fail));

    // Republished: the first try fails, the retry skips it, and the hint is set.
    push(&mut log, f(1, 1, "1"));
    push(&mut log, f(4, 1, "4"));
    let out = apply(&applier, &mut client, &log.batch(3, 2)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (1, 1));
    assert_eq!(applier.first_try(), Some(Skip));

    // More of the run: straight to ON CONFLICT, the hint stays.
    push(&mut log, f(2, 1, "1"));
    push(&mut log, f(5, 1, "5"));
    let out = apply(&applier, &mut client, &log.batch(5, 2)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (1, 1));
    assert_eq!(applier.first_try(), Some(Skip));

    // A batch that meets no id the inbox has clears it.
    push(&mut log, f(6, 1, "6"));
    let out = apply(&applier, &mut client, &log.batch(7, 1)).await;
    assert_eq!((out.counts.applied, out.counts.dup_inbox), (1, 0));
    assert_eq!(applier.first_try(), Some(Fail));
    assert_eq!(
        crate::support::rows(&client, "tally_v1").await,
        crate::support::tally_fold(&all)
    );

    // A view without an inbox has no first try to choose.
    let (_db, filtered) = applier_db(Trail {
        version: 1,
        dedup: DedupMode::VersionFilter,
    })
    .await;
    assert_eq!(filtered.first_try(), None);
}
