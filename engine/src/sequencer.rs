//! Per-account ordering: the `seq` state machine of one account within one batch.
//!
//! Pure logic, no I/O. Given the account's stored progress (last applied `seq`, rebuild
//! watermark, parked state, the events already waiting) and the batch's events of that
//! account in offset order, it decides what is applied now, in which order, what is a
//! duplicate and what waits.
//!
//! An inbox prevents duplicates but not reordering: applying `+300` before `-300` leaves a
//! different average price. So an event is applied only when its `seq` is exactly
//! `last_seq + 1`; a later `seq` waits (the account is *parked*) until the gap is filled, and
//! a `seq` at or below `last_seq` is a duplicate.

use std::collections::BTreeMap;

/// Where an event comes from: this batch, or the table of events already waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Item {
    /// Index into the batch's messages.
    Batch(usize),
    /// Index into the waiting events loaded from `projector.parked_events`.
    Stored(usize),
}

/// Why an account is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Park {
    /// Waiting for `seq == blocked_seq` to arrive.
    Gap { blocked_seq: i64 },
    /// The event at `blocked_seq` failed to apply and was dead-lettered; an engineer retries
    /// or skips it.
    Failed { blocked_seq: i64 },
}

impl Park {
    pub(crate) fn blocked_seq(self) -> i64 {
        match self {
            Park::Gap { blocked_seq } | Park::Failed { blocked_seq } => blocked_seq,
        }
    }

    pub(crate) fn reason(self) -> &'static str {
        match self {
            Park::Gap { .. } => "gap",
            Park::Failed { .. } => "failed",
        }
    }
}

/// What happens to one incoming event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// In order: applied (or ignored by type) in this batch.
    Emit,
    /// At or below the rebuild watermark: the snapshot already holds its effect.
    Watermark,
    /// At or below the last applied `seq`, or already waiting.
    Duplicate,
    /// Waits for an earlier `seq`.
    Wait,
}

/// An account's stored state at the start of a batch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stored {
    pub last_seq: i64,
    pub watermark: Option<i64>,
    pub park: Option<Park>,
    /// Events already waiting, by `seq`.
    pub waiting: BTreeMap<i64, Item>,
}

/// The account's plan for this batch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    /// Events to apply now, in `seq` order.
    pub emitted: Vec<(i64, Item)>,
    /// The verdict for each incoming event, in the order given.
    pub verdicts: Vec<Verdict>,
    /// Events left waiting (stored ones included), by `seq`.
    pub waiting: BTreeMap<i64, Item>,
    /// `last_seq` once everything emitted is applied.
    pub last_seq: i64,
    /// The parked state once everything emitted is applied.
    pub park: Option<Park>,
}

/// Runs the state machine over `incoming` (`seq` and item, in offset order).
pub(crate) fn plan(stored: Stored, incoming: &[(i64, Item)]) -> Plan {
    let Stored {
        mut last_seq,
        watermark,
        park,
        mut waiting,
    } = stored;
    // A snapshot reflects every event up to its watermark: the next one to apply follows it,
    // whether or not the seeding also moved last_seq.
    last_seq = last_seq.max(watermark.unwrap_or(0));
    let failed = matches!(park, Some(Park::Failed { .. }));
    let mut emitted = Vec::new();
    let mut verdicts = Vec::with_capacity(incoming.len());

    for &(seq, item) in incoming {
        let verdict = if watermark.is_some_and(|w| seq <= w) {
            Verdict::Watermark
        } else if seq <= last_seq || waiting.contains_key(&seq) {
            Verdict::Duplicate
        } else if failed || seq != last_seq + 1 {
            waiting.insert(seq, item);
            Verdict::Wait
        } else {
            emitted.push((seq, item));
            last_seq = seq;
            while let Some(next) = waiting.remove(&(last_seq + 1)) {
                last_seq += 1;
                emitted.push((last_seq, next));
            }
            Verdict::Emit
        };
        verdicts.push(verdict);
    }

    let park = if failed {
        park
    } else if waiting.is_empty() {
        None
    } else {
        Some(Park::Gap {
            blocked_seq: last_seq + 1,
        })
    };
    Plan {
        emitted,
        verdicts,
        waiting,
        last_seq,
        park,
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

    fn seqs(plan: &Plan) -> Vec<i64> {
        plan.emitted.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn in_order_events_are_emitted() {
        let p = plan(Stored::default(), &incoming(&[1, 2, 3]));
        assert_eq!(seqs(&p), [1, 2, 3]);
        assert_eq!(p.last_seq, 3);
        assert_eq!(p.park, None);
    }

    #[test]
    fn duplicates_at_or_below_last_seq_are_dropped() {
        let stored = Stored {
            last_seq: 2,
            ..Stored::default()
        };
        let p = plan(stored, &incoming(&[1, 2, 3, 3]));
        assert_eq!(seqs(&p), [3]);
        assert_eq!(
            p.verdicts,
            [
                Verdict::Duplicate,
                Verdict::Duplicate,
                Verdict::Emit,
                Verdict::Duplicate
            ]
        );
    }

    #[test]
    fn a_gap_parks_and_the_missing_event_drains_in_order() {
        let p = plan(Stored::default(), &incoming(&[1, 3, 4]));
        assert_eq!(seqs(&p), [1]);
        assert_eq!(p.park, Some(Park::Gap { blocked_seq: 2 }));
        assert_eq!(p.waiting.keys().copied().collect::<Vec<_>>(), [3, 4]);

        let stored = Stored {
            last_seq: 1,
            park: p.park,
            waiting: [(3, Item::Stored(0)), (4, Item::Stored(1))].into(),
            ..Stored::default()
        };
        let p = plan(stored, &incoming(&[5, 2]));
        assert_eq!(seqs(&p), [2, 3, 4, 5]);
        assert_eq!(p.verdicts, [Verdict::Wait, Verdict::Emit]);
        assert_eq!(p.park, None);
        assert!(p.waiting.is_empty());
    }

    #[test]
    fn a_failed_account_waits_whatever_arrives() {
        let stored = Stored {
            last_seq: 4,
            park: Some(Park::Failed { blocked_seq: 5 }),
            ..Stored::default()
        };
        let p = plan(stored, &incoming(&[4, 6, 7]));
        assert!(p.emitted.is_empty());
        assert_eq!(
            p.verdicts,
            [Verdict::Duplicate, Verdict::Wait, Verdict::Wait]
        );
        assert_eq!(p.park, Some(Park::Failed { blocked_seq: 5 }));
    }

    #[test]
    fn the_event_after_the_watermark_is_next_even_if_last_seq_was_not_seeded() {
        let stored = Stored {
            last_seq: 0,
            watermark: Some(7),
            ..Stored::default()
        };
        let p = plan(stored, &incoming(&[7, 8]));
        assert_eq!(seqs(&p), [8]);
        assert_eq!(p.park, None);
    }

    #[test]
    fn the_watermark_skips_what_the_snapshot_holds() {
        let stored = Stored {
            last_seq: 10,
            watermark: Some(10),
            ..Stored::default()
        };
        let p = plan(stored, &incoming(&[9, 10, 11]));
        assert_eq!(seqs(&p), [11]);
        assert_eq!(
            p.verdicts,
            [Verdict::Watermark, Verdict::Watermark, Verdict::Emit]
        );
    }
}
