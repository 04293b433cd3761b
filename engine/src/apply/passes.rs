//! The passes over one batch, and what they add up to: which run of the batch each pass reads,
//! when a pass is undone and the batch split, and the batch's dispositions, counts and
//! accounts left to drain once every pass is written.
//!
//! Usually one pass reads the whole batch. A pass stops early only before a correction of an
//! event whose statement failed in it ([`super::plan::Work::split_point`]): the pass is undone
//! (its savepoint rolled back) and runs again up to the correction, and the next pass starts
//! at the correction. When the failed event waited from an earlier batch, its account drains
//! first, in a pass of its own with no messages, then the same run again. All passes share
//! the batch's transaction, and the offset moves once, past the whole batch, with the last.
//!
//! Pure: no database, no async. [`super::Applier::apply_in`] runs each pass's steps and
//! tells this what came of them.

use std::collections::HashSet;
use std::ops::Range;

use crate::apply::types::{Counts, Disposition};
use crate::event::Message;

/// One pass over the batch: what it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pass {
    /// The run of the batch's messages it reads, as indexes; empty for a pass that drains
    /// accounts first.
    pub run: Range<usize>,
    /// Accounts planned although the run holds none of their events: what waits for them
    /// drains ([`super::plan::Work::draining`]). Only a pass without messages has any.
    pub drain: Vec<i64>,
    /// The batch's first pass: it locks the partition's offset row and checks the fence.
    pub first: bool,
}

impl Pass {
    /// A pass that only drains accounts: it never moves the batch on, nor the offset.
    pub(crate) fn is_drain(&self) -> bool {
        !self.drain.is_empty()
    }
}

/// What one written pass leaves for the batch's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Written<'a> {
    /// Its counts, as the bookkeeping wrote them.
    pub counts: Counts,
    /// What became of each message of its run, in order.
    pub dispositions: &'a [Disposition],
    /// What became of events an earlier pass of this batch stored as waiting: by offset
    /// ([`super::plan::Work::waiting_outcomes`]).
    pub earlier: Vec<(i64, Disposition)>,
    /// Accounts it left with more to drain.
    pub more_to_drain: Vec<i64>,
}

/// The passes over a batch of `len` messages, and their sums.
#[derive(Debug)]
pub(crate) struct Passes {
    len: usize,
    /// The run the next pass reads: from the first message no pass has written, up to the
    /// end of the batch or a correction.
    from: usize,
    to: usize,
    /// Accounts the next pass drains first, without messages.
    drain_first: Vec<i64>,
    /// (run start, account) of every drain-first pass asked for: asked again, the run goes
    /// on without the split.
    drained_for: HashSet<(usize, i64)>,
    first: bool,
    /// One per message of the runs written so far.
    dispositions: Vec<Disposition>,
    total: Counts,
    more_to_drain: Vec<i64>,
}

impl Passes {
    /// The passes over a batch of `len` messages: the first reads them all.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            len,
            from: 0,
            to: len,
            drain_first: Vec::new(),
            drained_for: HashSet::new(),
            first: true,
            dispositions: Vec::with_capacity(len),
            total: Counts::default(),
            more_to_drain: Vec::new(),
        }
    }

    /// The next pass, or `None` once every message of the batch is written.
    pub(crate) fn next_pass(&mut self) -> Option<Pass> {
        if self.from >= self.len {
            return None;
        }
        let drain = std::mem::take(&mut self.drain_first);
        let run = if drain.is_empty() {
            self.from..self.to
        } else {
            0..0
        };
        let first = std::mem::replace(&mut self.first, false);
        Some(Pass { run, drain, first })
    }

    /// Decides whether `pass`, planned and run, is undone to stop before a correction:
    /// `release` says its statements ran (the savepoint is open), and `split_point` gives
    /// where the correction is in its run and its account, when there is one. Returns true
    /// when the pass is undone: the caller rolls its savepoint back and asks for the next.
    ///
    /// A drain of an account first that did not move it (its failed event waits on
    /// something outside that pass) would be asked for again, forever: the second time for
    /// the same run and account, the run goes on without the split, the correction dropped
    /// as a duplicate, as a pass without a split point judges it.
    pub(crate) fn undo(
        &mut self,
        pass: &Pass,
        release: bool,
        split_point: impl FnOnce() -> Option<(usize, i64)>,
    ) -> bool {
        if !release || pass.is_drain() {
            return false;
        }
        let from = self.from;
        let split = split_point()
            .filter(|&(cut, account)| !(cut == 0 && self.drained_for.contains(&(from, account))));
        let Some((cut, account)) = split else {
            return false;
        };
        if cut == 0 {
            // The failed event waited from an earlier batch and drains first, on its own;
            // then this run again with its correction.
            self.drain_first.push(account);
            self.drained_for.insert((from, account));
        } else {
            self.to = from + cut;
        }
        true
    }

    /// Whether `pass` ends the batch: its bookkeeping moves the offset.
    pub(crate) fn is_last(&self, pass: &Pass) -> bool {
        self.to == self.len && !pass.is_drain()
    }

    /// The counts of the passes written so far, which the offset update adds to its own.
    pub(crate) fn total(&self) -> &Counts {
        &self.total
    }

    /// Records a written pass; `messages` are the batch's.
    pub(crate) fn written(&mut self, pass: &Pass, messages: &[Message], written: Written<'_>) {
        // Events an earlier pass of this batch stored as waiting may have left now.
        for (offset, d) in written.earlier {
            if let Some(i) = messages[..self.from]
                .iter()
                .position(|m| m.offset == offset)
            {
                self.dispositions[i] = d;
            }
        }
        self.total += &written.counts;
        self.more_to_drain.extend(written.more_to_drain);
        if pass.is_drain() {
            return;
        }
        self.dispositions.extend_from_slice(written.dispositions);
        self.from = self.to;
        self.to = self.len;
    }

    /// The batch's counts, each message's disposition by offset, and the accounts left to
    /// drain (sorted, once each); `messages` are the batch's.
    pub(crate) fn finish(
        self,
        messages: &[Message],
    ) -> (Counts, Vec<(i64, Disposition)>, Vec<i64>) {
        let dispositions = messages
            .iter()
            .zip(&self.dispositions)
            .map(|(m, d)| (m.offset, *d))
            .collect();
        let mut more_to_drain = self.more_to_drain;
        more_to_drain.sort_unstable();
        more_to_drain.dedup();
        (self.total, dispositions, more_to_drain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(offsets: &[i64]) -> Vec<Message> {
        offsets
            .iter()
            .map(|&o| Message::new(o, None, b"{}".to_vec()))
            .collect()
    }

    fn applied(n: u64) -> Counts {
        Counts {
            applied: n,
            ..Counts::default()
        }
    }

    #[test]
    fn one_pass_reads_the_whole_batch_and_moves_the_offset() {
        let batch = messages(&[10, 11, 12]);
        let mut passes = Passes::new(3);
        let pass = passes.next_pass().expect("a pass");
        assert_eq!(
            pass,
            Pass {
                run: 0..3,
                drain: Vec::new(),
                first: true
            }
        );
        assert!(!passes.undo(&pass, true, || None));
        assert!(passes.is_last(&pass));
        let d = [Disposition::Applied; 3];
        passes.written(
            &pass,
            &batch,
            Written {
                counts: applied(3),
                dispositions: &d,
                more_to_drain: vec![7, 3, 7],
                ..Written::default()
            },
        );
        assert_eq!(passes.next_pass(), None);
        let (counts, dispositions, more) = passes.finish(&batch);
        assert_eq!(counts, applied(3));
        assert_eq!(
            dispositions,
            [
                (10, Disposition::Applied),
                (11, Disposition::Applied),
                (12, Disposition::Applied)
            ]
        );
        assert_eq!(more, [3, 7], "sorted, once each");
    }

    #[test]
    fn an_empty_batch_has_no_pass() {
        let mut passes = Passes::new(0);
        assert_eq!(passes.next_pass(), None);
        let (counts, dispositions, more) = passes.finish(&[]);
        assert_eq!(counts, Counts::default());
        assert!(dispositions.is_empty() && more.is_empty());
    }

    #[test]
    fn a_correction_splits_the_batch_and_the_offset_moves_with_the_last_pass() {
        let batch = messages(&[0, 1, 2, 3]);
        let mut passes = Passes::new(4);
        let pass = passes.next_pass().expect("a pass");
        // The correction is message 2 of account 9: the pass is undone.
        assert!(passes.undo(&pass, true, || Some((2, 9))));
        let pass = passes.next_pass().expect("the run up to the correction");
        assert_eq!(pass.run, 0..2);
        assert!(!pass.first, "the fence is checked once");
        assert!(!passes.undo(&pass, true, || None));
        assert!(
            !passes.is_last(&pass),
            "the offset moves with the last pass"
        );
        assert_eq!(passes.total(), &Counts::default());
        let d = [Disposition::Applied, Disposition::DeadLettered];
        passes.written(
            &pass,
            &batch,
            Written {
                counts: applied(1),
                dispositions: &d,
                ..Written::default()
            },
        );
        assert_eq!(
            passes.total(),
            &applied(1),
            "the next pass's update adds it"
        );
        let pass = passes.next_pass().expect("the rest, from the correction");
        assert_eq!(pass.run, 2..4);
        // Split points are indexes into the pass's own run: none here.
        assert!(!passes.undo(&pass, true, || None));
        assert!(passes.is_last(&pass));
        let d = [Disposition::Applied; 2];
        passes.written(
            &pass,
            &batch,
            Written {
                counts: applied(2),
                dispositions: &d,
                ..Written::default()
            },
        );
        assert_eq!(passes.next_pass(), None);
        let (counts, dispositions, _) = passes.finish(&batch);
        assert_eq!(counts, applied(3));
        assert_eq!(dispositions[1], (1, Disposition::DeadLettered));
        assert_eq!(dispositions[3], (3, Disposition::Applied));
    }

    #[test]
    fn a_split_point_counts_only_when_the_statements_ran_in_a_pass_with_messages() {
        let mut passes = Passes::new(2);
        let pass = passes.next_pass().expect("a pass");
        let asked = std::cell::Cell::new(false);
        assert!(!passes.undo(&pass, false, || {
            asked.set(true);
            Some((1, 9))
        }));
        assert!(
            !asked.get(),
            "no statement ran: the split point is not asked"
        );
        let drain = Pass {
            run: 0..0,
            drain: vec![9],
            first: false,
        };
        assert!(!passes.undo(&drain, true, || Some((1, 9))));
        assert!(!passes.is_last(&drain), "a drain never moves the offset");
    }

    #[test]
    fn a_failed_event_that_waited_drains_first_once() {
        let batch = messages(&[5, 6]);
        let mut passes = Passes::new(2);
        let pass = passes.next_pass().expect("a pass");
        // The correction is the run's first message: its failed event waited from an
        // earlier batch; account 4 drains first, alone.
        assert!(passes.undo(&pass, true, || Some((0, 4))));
        let drain = passes.next_pass().expect("the drain");
        assert_eq!(
            drain,
            Pass {
                run: 0..0,
                drain: vec![4],
                first: false
            }
        );
        assert!(!passes.undo(&drain, true, || Some((0, 4))));
        assert!(!passes.is_last(&drain));
        passes.written(
            &drain,
            &batch,
            Written {
                counts: Counts {
                    drained: 1,
                    failed: 1,
                    ..Counts::default()
                },
                more_to_drain: vec![4],
                ..Written::default()
            },
        );
        let again = passes.next_pass().expect("the same run again");
        assert_eq!(again.run, 0..2);
        assert!(again.drain.is_empty());
        // The drain did not move the account: asked again for the same run and account,
        // the run goes on without the split.
        assert!(!passes.undo(&again, true, || Some((0, 4))));
        assert!(passes.is_last(&again));
        let d = [Disposition::Duplicate, Disposition::Applied];
        passes.written(
            &again,
            &batch,
            Written {
                counts: applied(1),
                dispositions: &d,
                ..Written::default()
            },
        );
        assert_eq!(passes.next_pass(), None);
        let (counts, dispositions, more) = passes.finish(&batch);
        assert_eq!(counts.applied, 1);
        assert_eq!(counts.drained, 1);
        assert_eq!(
            dispositions,
            [(5, Disposition::Duplicate), (6, Disposition::Applied)]
        );
        assert_eq!(more, [4]);
    }

    #[test]
    fn a_split_point_in_a_later_run_is_counted_from_that_run_start() {
        // As the loop in `apply_in` before `Passes` had it: `to = from + cut`.
        let batch = messages(&[0, 1, 2, 3, 4, 5]);
        let mut passes = Passes::new(6);
        let pass = passes.next_pass().expect("a pass");
        assert!(passes.undo(&pass, true, || Some((2, 1))));
        let pass = passes.next_pass().expect("up to the first correction");
        assert_eq!(pass.run, 0..2);
        assert!(!passes.undo(&pass, true, || None));
        let d = [Disposition::Applied; 2];
        passes.written(
            &pass,
            &batch,
            Written {
                counts: applied(2),
                dispositions: &d,
                ..Written::default()
            },
        );
        let pass = passes.next_pass().expect("the rest");
        assert_eq!(pass.run, 2..6);
        // A second correction, the run's fourth message: message 5 of the batch.
        assert!(passes.undo(&pass, true, || Some((3, 2))));
        let pass = passes.next_pass().expect("up to the second correction");
        assert_eq!(pass.run, 2..5);
        assert!(!passes.undo(&pass, true, || None));
        assert!(!passes.is_last(&pass));
        let d = [Disposition::Applied; 3];
        passes.written(
            &pass,
            &batch,
            Written {
                counts: applied(3),
                dispositions: &d,
                ..Written::default()
            },
        );
        assert_eq!(passes.total(), &applied(5));
        let pass = passes.next_pass().expect("the last message");
        assert_eq!(pass.run, 5..6);
        assert!(!passes.undo(&pass, true, || None));
        assert!(passes.is_last(&pass));
        let d = [Disposition::Applied];
        passes.written(
            &pass,
            &batch,
            Written {
                counts: applied(1),
                dispositions: &d,
                ..Written::default()
            },
        );
        assert_eq!(passes.next_pass(), None);
        let (counts, dispositions, _) = passes.finish(&batch);
        assert_eq!(counts, applied(6), "each pass counted once");
        assert_eq!(dispositions.len(), 6, "each message once");
        assert_eq!(dispositions[5], (5, Disposition::Applied));
    }

    #[test]
    fn an_account_drained_first_for_one_run_drains_first_again_for_another() {
        // `drained_for` is keyed by the run's start, as before: a drain asked for a later run
        // is a new one, not the repeat that lets the run go on without the split.
        let batch = messages(&[0, 1, 2]);
        let mut passes = Passes::new(3);
        let pass = passes.next_pass().expect("a pass");
        assert!(passes.undo(&pass, true, || Some((0, 4))));
        let drain = passes.next_pass().expect("the drain");
        assert_eq!(drain.drain, [4]);
        passes.written(&drain, &batch, Written::default());
        let again = passes.next_pass().expect("the run again");
        assert_eq!(again.run, 0..3);
        // Now split at message 1 (another account); the run 0..1 is written.
        assert!(passes.undo(&again, true, || Some((1, 7))));
        let pass = passes.next_pass().expect("up to the correction");
        assert_eq!(pass.run, 0..1);
        assert!(!passes.undo(&pass, true, || None));
        let d = [Disposition::Applied];
        passes.written(
            &pass,
            &batch,
            Written {
                dispositions: &d,
                ..Written::default()
            },
        );
        let pass = passes.next_pass().expect("from the correction");
        assert_eq!(pass.run, 1..3);
        // Account 4's failed event again at the run's start: a new run, so it drains first.
        assert!(passes.undo(&pass, true, || Some((0, 4))));
        let drain = passes.next_pass().expect("a drain for this run");
        assert_eq!(drain.drain, [4]);
        assert!(!passes.is_last(&drain));
        passes.written(&drain, &batch, Written::default());
        let pass = passes.next_pass().expect("the run again");
        assert_eq!(pass.run, 1..3);
        // Asked a second time for this run: it goes on without the split.
        assert!(!passes.undo(&pass, true, || Some((0, 4))));
        assert!(passes.is_last(&pass));
    }

    #[test]
    fn events_an_earlier_pass_left_waiting_take_what_became_of_them() {
        let batch = messages(&[20, 21, 22]);
        let mut passes = Passes::new(3);
        let pass = passes.next_pass().expect("a pass");
        assert!(passes.undo(&pass, true, || Some((2, 1))));
        let pass = passes.next_pass().expect("up to the correction");
        let d = [Disposition::Applied, Disposition::Waiting];
        passes.written(
            &pass,
            &batch,
            Written {
                dispositions: &d,
                ..Written::default()
            },
        );
        let pass = passes.next_pass().expect("the rest");
        let d = [Disposition::Applied];
        passes.written(
            &pass,
            &batch,
            Written {
                dispositions: &d,
                // Offset 21 waited and left in this pass; offset 99 is no message of an
                // earlier pass (another partition's, say): nothing to update.
                earlier: vec![(21, Disposition::Applied), (99, Disposition::Duplicate)],
                ..Written::default()
            },
        );
        let (_, dispositions, _) = passes.finish(&batch);
        assert_eq!(
            dispositions,
            [
                (20, Disposition::Applied),
                (21, Disposition::Applied),
                (22, Disposition::Applied)
            ]
        );
    }
}
