//! Per-account ordering: the `seq` state machine of one account within one batch.
//!
//! Pure logic, no I/O. Given the account's stored progress (last applied `seq`, rebuild
//! watermark, the events already waiting) and the batch's valid events of that account in
//! offset order, it decides what is applied now, in which order, what repeats a `seq` that is
//! already taken, and what waits.
//!
//! An inbox prevents duplicates but not reordering: applying `+300` before `-300` leaves a
//! different average price. So for an order-dependent view an event is applied only when its
//! `seq` is exactly `last_seq + 1`; a later `seq` *waits* (its account is *parked*) until the
//! gap is filled, and a `seq` at or below `last_seq` is taken already. Whether a taken `seq`
//! is a true duplicate or a second event claiming the same `seq` (a conflict) depends on the
//! event ids, which the caller compares.
//!
//! Messages that were dead-lettered never reach the sequencer: a poison event at `seq` n
//! simply never arrives, so the account parks at n when n + 1 comes, and the park's reason
//! names the dead letter. An order-independent view applies every event above the watermark
//! at once, gap or not; the inbox keeps its duplicates out.

use std::collections::{BTreeMap, HashMap};

/// Where an event comes from: this batch, or the table of events already waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Item {
    /// Index into the batch's messages.
    Batch(usize),
    /// Index into the waiting events loaded from `projector.waiting_events`
    /// (`apply::plan::WaitingEvent`).
    Waiting(usize),
}

/// What happens to one incoming event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// In order (or order does not matter): applied, or ignored by type, in this batch.
    Emit,
    /// At or below the rebuild watermark: the snapshot already holds its effect.
    Watermark,
    /// Its `seq` is taken: by the given event of this batch or of the waiting ones, or (when
    /// `None`) by an event applied before this batch.
    Taken(Option<Item>),
    /// Waits for an earlier `seq`.
    Wait,
}

/// Where the sequencer starts an account in a batch: the `seq` its view has applied and the
/// rebuild watermark (of the account's state as loaded, `apply::plan::AccountState`), and the
/// events already waiting for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Start {
    pub last_seq: i64,
    pub watermark: Option<i64>,
    /// Events already waiting, by `seq`.
    pub waiting: BTreeMap<i64, Item>,
}

/// The account's plan for this batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Events to apply now, in `seq` order (in offset order for an order-independent view).
    pub emitted: Vec<(i64, Item)>,
    /// The verdict for each incoming event, in the order given.
    pub verdicts: Vec<Verdict>,
    /// Events left waiting (those that waited before included), by `seq`.
    pub waiting: BTreeMap<i64, Item>,
    /// `last_seq` once everything emitted is applied.
    pub last_seq: i64,
    /// Waiting events whose `seq` another writer applied meanwhile: they leave the waiting
    /// table as duplicates.
    pub stale: Vec<(i64, Item)>,
    /// False for an order-independent view, whose only waiting events are held ones.
    pub ordered: bool,
}

impl Plan {
    /// The `seq` the account waits for, if it is parked: the one after `last_seq` in an
    /// order-dependent view; in an order-independent one, the lowest held event's.
    pub fn blocked_seq(&self) -> Option<i64> {
        if self.ordered {
            (!self.waiting.is_empty()).then_some(self.last_seq + 1)
        } else {
            self.waiting.keys().next().copied()
        }
    }
}

/// [`plan_with`] where no two items are known to be one event.
#[cfg(test)]
pub(crate) fn plan(
    start: Start,
    incoming: &[(i64, Item)],
    ordered: bool,
    held: &dyn Fn(Item) -> bool,
) -> Plan {
    plan_with(start, incoming, ordered, held, &|_, _| false)
}

/// Runs the state machine over `incoming` (`seq` and item, in offset order). `ordered` is
/// false for an order-independent view. `held` tells the events held back for their version
/// (newer than the view reads): such an event holds its `seq` but is never emitted, so it
/// waits, and in an order-dependent view everything after it waits behind it.
///
/// `same` tells two items that are one event (its id and `occurred_at`), whatever their
/// versions: a copy the view can read of an event held for its version (a producer that
/// went back to a version the consumers read, or published the event at both) takes the held
/// one's place, which leaves as its duplicate; and a held copy of an event emitted here is
/// a duplicate of it. Otherwise the held copy would keep its account waiting for a build
/// that reads a version the producer may never publish again.
pub(crate) fn plan_with(
    start: Start,
    incoming: &[(i64, Item)],
    ordered: bool,
    held: &dyn Fn(Item) -> bool,
    same: &dyn Fn(Item, Item) -> bool,
) -> Plan {
    if !ordered {
        return plan_unordered(start, incoming, held, same);
    }
    let Start {
        last_seq,
        watermark,
        mut waiting,
    } = start;
    // A snapshot reflects every event up to its watermark: the next one to apply follows it,
    // whether or not the seeding also moved last_seq.
    let mut last_seq = last_seq.max(watermark.unwrap_or(0));
    let mut emitted = Vec::new();
    let mut stale = Vec::new();
    while let Some(entry) = waiting.first_entry() {
        if *entry.key() > last_seq {
            break;
        }
        stale.push(entry.remove_entry());
    }
    let mut taken_here: HashMap<i64, Item> = HashMap::new();
    // Whatever waits right after last_seq goes first: a park can be stale when another writer
    // moved the account on (two producers, a partition-count change).
    drain(
        &mut waiting,
        &mut last_seq,
        &mut emitted,
        &mut taken_here,
        held,
    );
    let mut verdicts = Vec::with_capacity(incoming.len());

    for (pos, &(seq, item)) in incoming.iter().enumerate() {
        let below = watermark.is_some_and(|w| seq <= w) || seq <= last_seq;
        if !below && !held(item) {
            if let Some(&holder) = waiting.get(&seq) {
                if held(holder) && same(item, holder) {
                    waiting.remove(&seq);
                    replace_held(incoming, pos, holder, item, &mut verdicts, &mut stale);
                }
            }
        }
        let verdict = if watermark.is_some_and(|w| seq <= w) {
            Verdict::Watermark
        } else if seq <= last_seq {
            Verdict::Taken(taken_here.get(&seq).copied())
        } else if let Some(&holder) = waiting.get(&seq) {
            Verdict::Taken(Some(holder))
        } else if seq == last_seq + 1 && !held(item) {
            emitted.push((seq, item));
            taken_here.insert(seq, item);
            last_seq = seq;
            drain(
                &mut waiting,
                &mut last_seq,
                &mut emitted,
                &mut taken_here,
                held,
            );
            Verdict::Emit
        } else {
            waiting.insert(seq, item);
            Verdict::Wait
        };
        verdicts.push(verdict);
    }
    Plan {
        emitted,
        verdicts,
        waiting,
        last_seq,
        stale,
        ordered: true,
    }
}

/// A held event whose readable copy, at `incoming[pos]`, takes its place: a stored one
/// leaves the waiting table as a duplicate (`stale`); one of this batch, earlier in
/// `incoming`, becomes the copy's duplicate.
fn replace_held(
    incoming: &[(i64, Item)],
    pos: usize,
    holder: Item,
    copy: Item,
    verdicts: &mut [Verdict],
    stale: &mut Vec<(i64, Item)>,
) {
    match holder {
        Item::Waiting(_) => stale.push((incoming[pos].0, holder)),
        Item::Batch(_) => {
            if let Some(k) = incoming[..pos].iter().position(|&(_, i)| i == holder) {
                verdicts[k] = Verdict::Taken(Some(copy));
            }
        }
    }
}

/// Emits what waits right after `last_seq`, in order, up to the first held event.
fn drain(
    waiting: &mut BTreeMap<i64, Item>,
    last_seq: &mut i64,
    emitted: &mut Vec<(i64, Item)>,
    taken_here: &mut HashMap<i64, Item>,
    held: &dyn Fn(Item) -> bool,
) {
    while let Some(&next) = waiting.get(&(*last_seq + 1)) {
        if held(next) {
            break;
        }
        waiting.remove(&(*last_seq + 1));
        *last_seq += 1;
        emitted.push((*last_seq, next));
        taken_here.insert(*last_seq, next);
    }
}

/// Order-independent views: everything above the watermark is applied now, events that
/// waited (held for their version, or under an older engine) included, but for held events:
/// they wait, alone, each at its `seq` (a second event at a held `seq` is judged by its id);
/// `last_seq` is not tracked.
fn plan_unordered(
    start: Start,
    incoming: &[(i64, Item)],
    held: &dyn Fn(Item) -> bool,
    same: &dyn Fn(Item, Item) -> bool,
) -> Plan {
    let Start {
        last_seq,
        watermark,
        waiting: already,
    } = start;
    let mut waiting = BTreeMap::new();
    let mut emitted = Vec::new();
    let mut stale = Vec::new();
    for (seq, item) in already {
        if held(item) {
            waiting.insert(seq, item);
        } else {
            emitted.push((seq, item));
        }
    }
    let mut verdicts = Vec::with_capacity(incoming.len());
    for (pos, &(seq, item)) in incoming.iter().enumerate() {
        let verdict = if watermark.is_some_and(|w| seq <= w) {
            Verdict::Watermark
        } else if !held(item) {
            if let Some(&holder) = waiting.get(&seq) {
                if same(item, holder) {
                    waiting.remove(&seq);
                    replace_held(incoming, pos, holder, item, &mut verdicts, &mut stale);
                }
            }
            emitted.push((seq, item));
            Verdict::Emit
        } else if let Some(&(_, copy)) = emitted.iter().find(|&&(s, e)| s == seq && same(item, e)) {
            Verdict::Taken(Some(copy))
        } else if let Some(&holder) = waiting.get(&seq) {
            Verdict::Taken(Some(holder))
        } else {
            waiting.insert(seq, item);
            Verdict::Wait
        };
        verdicts.push(verdict);
    }
    Plan {
        emitted,
        verdicts,
        waiting,
        last_seq,
        stale,
        ordered: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incoming(seqs: &[i64]) -> Vec<(i64, Item)> {
        seqs.iter()
            .enumerate()
            .map(|(i, &s)| (s, Item::Batch(i)))
            .collect()
    }

    fn none(_: Item) -> bool {
        false
    }

    fn seqs(plan: &Plan) -> Vec<i64> {
        plan.emitted.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn in_order_events_are_emitted() {
        let p = plan(Start::default(), &incoming(&[1, 2, 3]), true, &none);
        assert_eq!(seqs(&p), [1, 2, 3]);
        assert_eq!(p.last_seq, 3);
        assert_eq!(p.blocked_seq(), None);
    }

    #[test]
    fn a_taken_seq_names_what_took_it() {
        let start = Start {
            last_seq: 2,
            ..Start::default()
        };
        let p = plan(start, &incoming(&[1, 2, 3, 3]), true, &none);
        assert_eq!(seqs(&p), [3]);
        assert_eq!(
            p.verdicts,
            [
                Verdict::Taken(None),
                Verdict::Taken(None),
                Verdict::Emit,
                Verdict::Taken(Some(Item::Batch(2)))
            ]
        );
    }

    #[test]
    fn a_gap_parks_and_the_missing_event_drains_in_order() {
        let p = plan(Start::default(), &incoming(&[1, 3, 4, 4]), true, &none);
        assert_eq!(seqs(&p), [1]);
        assert_eq!(p.blocked_seq(), Some(2));
        assert_eq!(p.waiting.keys().copied().collect::<Vec<_>>(), [3, 4]);
        assert_eq!(p.verdicts[3], Verdict::Taken(Some(Item::Batch(2))));

        let start = Start {
            last_seq: 1,
            waiting: [(3, Item::Waiting(0)), (4, Item::Waiting(1))].into(),
            ..Start::default()
        };
        let p = plan(start, &incoming(&[5, 2]), true, &none);
        assert_eq!(seqs(&p), [2, 3, 4, 5]);
        assert_eq!(p.verdicts, [Verdict::Wait, Verdict::Emit]);
        assert_eq!(p.blocked_seq(), None);
        assert!(p.waiting.is_empty());
    }

    #[test]
    fn a_stale_park_drains_without_its_blocking_event() {
        // Another writer applied 5 and 6 while this one parked at 5 with 6 and 7 waiting.
        let start = Start {
            last_seq: 6,
            waiting: [(6, Item::Waiting(0)), (7, Item::Waiting(1))].into(),
            ..Start::default()
        };
        let p = plan(start, &incoming(&[9]), true, &none);
        assert_eq!(seqs(&p), [7]);
        assert_eq!(p.stale, [(6, Item::Waiting(0))]);
        assert_eq!(p.blocked_seq(), Some(8));
        assert_eq!(p.verdicts, [Verdict::Wait]);
    }

    #[test]
    fn the_event_after_the_watermark_is_next_even_if_last_seq_was_not_seeded() {
        let start = Start {
            last_seq: 0,
            watermark: Some(7),
            ..Start::default()
        };
        let p = plan(start, &incoming(&[7, 8]), true, &none);
        assert_eq!(seqs(&p), [8]);
        assert_eq!(p.blocked_seq(), None);
    }

    #[test]
    fn the_watermark_skips_what_the_snapshot_holds() {
        let start = Start {
            last_seq: 10,
            watermark: Some(10),
            ..Start::default()
        };
        let p = plan(start, &incoming(&[9, 10, 11]), true, &none);
        assert_eq!(seqs(&p), [11]);
        assert_eq!(
            p.verdicts,
            [Verdict::Watermark, Verdict::Watermark, Verdict::Emit]
        );
    }

    #[test]
    fn order_independent_views_apply_every_event_gap_or_not() {
        let start = Start {
            last_seq: 0,
            watermark: Some(2),
            waiting: [(9, Item::Waiting(0))].into(),
        };
        let p = plan(start, &incoming(&[2, 5, 3, 5]), false, &none);
        assert_eq!(seqs(&p), [9, 5, 3, 5]);
        assert_eq!(
            p.verdicts,
            [
                Verdict::Watermark,
                Verdict::Emit,
                Verdict::Emit,
                Verdict::Emit
            ]
        );
        assert_eq!(p.blocked_seq(), None);
    }

    #[test]
    fn a_held_event_holds_its_seq_and_everything_after_it_waits() {
        // Batch items 1 and 3 (seqs 2 and 4) are of a version the view cannot read yet.
        let held = |item: Item| matches!(item, Item::Batch(1) | Item::Batch(3));
        let p = plan(Start::default(), &incoming(&[1, 2, 3, 4]), true, &held);
        assert_eq!(seqs(&p), [1]);
        assert_eq!(p.blocked_seq(), Some(2), "parked at the held event");
        assert_eq!(p.waiting.keys().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(
            p.verdicts,
            [Verdict::Emit, Verdict::Wait, Verdict::Wait, Verdict::Wait]
        );

        // Stored, it is read again by the next batch: still held, the drain stops at it.
        let start = Start {
            last_seq: 1,
            waiting: [(2, Item::Waiting(0)), (3, Item::Waiting(1))].into(),
            ..Start::default()
        };
        let still = |item: Item| item == Item::Waiting(0);
        let p = plan(start.clone(), &incoming(&[2, 5]), true, &still);
        assert!(seqs(&p).is_empty());
        assert_eq!(
            p.verdicts,
            [Verdict::Taken(Some(Item::Waiting(0))), Verdict::Wait]
        );
        assert_eq!(p.blocked_seq(), Some(2));

        // A build that reads its version drains it and what waited behind it.
        let p = plan(start, &incoming(&[4]), true, &none);
        assert_eq!(seqs(&p), [2, 3, 4]);
        assert_eq!(p.blocked_seq(), None);
    }

    #[test]
    fn a_readable_copy_of_a_held_event_takes_its_place() {
        // Seq 2 waits held (start); the batch brings a copy of it the view reads (item 0),
        // then seq 3.
        let start = Start {
            last_seq: 1,
            waiting: [(2, Item::Waiting(0))].into(),
            ..Start::default()
        };
        let held = |item: Item| item == Item::Waiting(0);
        let same = |a: Item, b: Item| {
            matches!(
                (a, b),
                (Item::Batch(0), Item::Waiting(0)) | (Item::Waiting(0), Item::Batch(0))
            )
        };
        let p = plan_with(start.clone(), &incoming(&[2, 3]), true, &held, &same);
        assert_eq!(seqs(&p), [2, 3]);
        assert_eq!(p.stale, [(2, Item::Waiting(0))], "the held one leaves");
        assert_eq!(p.blocked_seq(), None);
        // Another event at the held seq is judged by its id as before.
        let p = plan_with(start, &incoming(&[2, 3]), true, &held, &|_, _| false);
        assert_eq!(p.verdicts[0], Verdict::Taken(Some(Item::Waiting(0))));
        assert_eq!(p.blocked_seq(), Some(2));

        // Both in one batch: the held copy first (item 1), then the readable one (item 2).
        let held = |item: Item| item == Item::Batch(1);
        let same = |a: Item, b: Item| {
            matches!(
                (a, b),
                (Item::Batch(1), Item::Batch(2)) | (Item::Batch(2), Item::Batch(1))
            )
        };
        for ordered in [true, false] {
            let p = plan_with(
                Start::default(),
                &incoming(&[1, 2, 2]),
                ordered,
                &held,
                &same,
            );
            assert_eq!(seqs(&p), [1, 2], "ordered: {ordered}");
            assert_eq!(
                p.verdicts,
                [
                    Verdict::Emit,
                    Verdict::Taken(Some(Item::Batch(2))),
                    Verdict::Emit
                ],
                "ordered: {ordered}"
            );
            assert!(p.waiting.is_empty(), "ordered: {ordered}");
        }
        // The readable copy first: the held one is its duplicate.
        let held = |item: Item| item == Item::Batch(2);
        for ordered in [true, false] {
            let p = plan_with(
                Start::default(),
                &incoming(&[1, 2, 2]),
                ordered,
                &held,
                &same,
            );
            assert_eq!(seqs(&p), [1, 2], "ordered: {ordered}");
            assert_eq!(p.verdicts[2], Verdict::Taken(Some(Item::Batch(1))));
            assert!(p.waiting.is_empty(), "ordered: {ordered}");
        }
    }

    #[test]
    fn an_order_independent_view_holds_back_only_the_held_event() {
        let held = |item: Item| matches!(item, Item::Batch(1) | Item::Batch(3) | Item::Waiting(0));
        let start = Start {
            waiting: [(7, Item::Waiting(0)), (8, Item::Waiting(1))].into(),
            ..Start::default()
        };
        let p = plan(start, &incoming(&[1, 2, 3, 2]), false, &held);
        assert_eq!(seqs(&p), [8, 1, 3]);
        assert_eq!(
            p.verdicts,
            [
                Verdict::Emit,
                Verdict::Wait,
                Verdict::Emit,
                Verdict::Taken(Some(Item::Batch(1)))
            ]
        );
        assert_eq!(p.waiting.keys().copied().collect::<Vec<_>>(), [2, 7]);
        assert_eq!(p.blocked_seq(), Some(2), "its lowest held event");
    }
}
