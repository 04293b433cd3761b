//! A carrier of a reused id held back to wait, and a drain the batch's split asks for: the
//! repeat's outcome whatever the batching, and a batch that never loops on a drain that
//! cannot move. Written by a review of c1a0f98 (a repeat of an id earlier in the batch holds
//! its `(account, seq)`, and so supersedes the open dead letters there, unless its first
//! carrier failed; a carrier held back to wait counts as applied). Each test applies the same
//! events in one batch and split over two, and compares the dead letters, the parks, the
//! progress and the view's trails.
//!
//! It found two gaps older than all these reviews (`#[ignore]`d): a repeat of a carrier that
//! waits and then fails when it drains is dropped, and a batch whose split asks to drain an
//! account first that the drain cannot move looped forever (now fixed: the second time the
//! part goes on without the split; `a_drain_that_cannot_move_does_not_make_the_batch_loop`).

use crate::support::one_batch_vs_split;
use projector_engine::testkit::{fill, EventSpec};

const AT: &str = "2026-12-01T10:15:00Z";

fn f(account: i64, seq: i64, qty: &str) -> EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known gap, older than these reviews: a repeat of a carrier that waits and then fails is dropped"]
async fn a_held_back_carrier_that_fails_when_it_drains_whatever_the_batching() {
    let feed = [
        f(2, 1, "1000000").with_id("d"), // 0: fails (dead letter at account 2, seq 1)
        f(1, 1, "1000000").with_id("p"), // 1: fails: account 1 holds back what follows
        f(1, 2, "1000000").with_id("x"), // 2: held back behind 1; fails when it drains
        f(2, 1, "2").with_id("x"),       // 3: x again, at account 2's seq 1
        f(1, 1, "1").with_id("p"),       // 4: p corrected: account 1 drains, x fails
    ];
    // One event a batch: x at account 2 is applied (and supersedes d), x at account 1 is
    // then the inbox's duplicate. In one batch x at account 2 is dropped as the repeat of a
    // carrier that waits, supersedes d all the same, and the carrier then fails.
    let [one, each] = one_batch_vs_split(&feed, 1, &[2, 3, 4]).await;
    assert_eq!(
        one, each,
        "one batch vs one event a batch: (dead letters, parks, progress, trails)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known gap, older than these reviews: the outcome depends on the batching (the batch now ends: see the test below)"]
async fn a_repeat_before_the_correction_of_its_failing_waiting_carrier_ends() {
    let feed = [
        f(1, 1, "1000000").with_id("p"), // 0: fails: account 1 holds back what follows
        f(1, 2, "1000000").with_id("x"), // 1: waits behind 0; fails when it drains
        f(2, 1, "2").with_id("x"),       // 2: x again, another account
        f(1, 1, "1").with_id("p"),       // 3: p corrected: account 1 drains, x fails
    ];
    // The second batch: x (stored, account 1) is the first carrier in account order and
    // fails; its repeat is at the batch's index 0, so `split_point` asks to drain account 1
    // first, which cannot go (the correction is not in that pass), and the part runs again.
    let [one, two] = one_batch_vs_split(&feed, 0, &[2]).await;
    assert_eq!(
        one, two,
        "one batch vs two: (dead letters, parks, progress, trails)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_cannot_move_does_not_make_the_batch_loop() {
    // The second batch of the test above: `split_point` asks to drain account 1 first (its
    // failed first carrier of x waited from the first batch), the drain cannot move it (the
    // correction is not in that pass), and the part used to run again and ask again,
    // forever, inside the transaction: the view stopped for good. The second time the part
    // now goes on without the split, and the batch ends (`one_batch_vs_split` gives each
    // batch ten seconds).
    let feed = [
        f(1, 1, "1000000").with_id("p"),
        f(1, 2, "1000000").with_id("x"),
        f(2, 1, "2").with_id("x"),
        f(1, 1, "1").with_id("p"),
    ];
    let [_, split] = one_batch_vs_split(&feed, 0, &[2]).await;
    let (dead, _, _, trails) = split;
    assert_eq!(trails[0].as_deref(), Some("1"), "p's correction applied");
    assert!(!dead.is_empty(), "x's failure is dead-lettered: {dead:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_drains_that_cannot_move_do_not_make_the_batch_loop() {
    // The case above twice in one batch, for two accounts: each reused id's first carrier
    // waited from the first batch and fails when it drains, and the repeats open the second
    // batch. The batch ends (without the guard it does not), both corrections apply and both
    // failures are dead-lettered. Only account 1's drain is asked for: `split_point` names
    // the first repeat's carrier, and a drain that moves nothing leaves it the same answer,
    // so two accounts never take turns (a guard remembering only the last drain passes too).
    let feed = [
        f(1, 1, "1000000").with_id("p"),
        f(1, 2, "1000000").with_id("x"),
        f(3, 1, "1000000").with_id("q"),
        f(3, 2, "1000000").with_id("y"),
        f(2, 1, "2").with_id("x"),
        f(2, 2, "3").with_id("y"),
        f(1, 1, "1").with_id("p"),
        f(3, 1, "1").with_id("q"),
    ];
    let [_, split] = one_batch_vs_split(&feed, 0, &[4]).await;
    let (dead, _, _, trails) = split;
    assert_eq!(trails[0].as_deref(), Some("1"), "p's correction applied");
    assert_eq!(trails[2].as_deref(), Some("1"), "q's correction applied");
    assert!(
        dead.len() >= 2,
        "x's and y's failures are dead-lettered: {dead:?}"
    );
}
