//! Planning a batch: what each message is for this view, per account what is applied now,
//! what repeats a taken `seq` (a duplicate, or a conflict), what waits; and, once the
//! statements ran, settling their failures into the plan.
//!
//! Everything here but the loading is pure, so the rules are unit-tested without a database.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::apply::types::{Batch, Counts, Disposition};
use crate::event::{Event, FieldValue, Message, Salvage};
use crate::sequencer::{self, Item, Verdict};

/// A message as this view version sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// A sound envelope, and sound data when the view subscribes to its type, with the
    /// values of the fields the view declares (empty for a type it does not read).
    Event {
        event: Event,
        values: Vec<FieldValue>,
        /// The view subscribes to its type: it goes to the view's statement. Decided once,
        /// at decode, where the type's text is at hand.
        sent: bool,
    },
    /// A sound envelope of a type the view subscribes to, at a version newer than the one the
    /// view reads (`Projection::upcasters`), under the policy that parks: it holds its `seq`
    /// but is never applied, so it waits, with its raw bytes, and nothing of its account after
    /// it is applied (an order-independent view holds back only the event). Every batch and
    /// drain of the account decodes it again: a build that reads the version applies it.
    Held {
        /// The envelope; `data` as it came.
        event: Event,
        /// Why, for the park's detail.
        why: String,
    },
    /// Poison for this view: dead-lettered with what its envelope still yields.
    Poison {
        /// Why, for the dead-letter row.
        error: String,
        /// The event id, account and `seq`, when the envelope yields them.
        salvage: Salvage,
    },
}

impl Decoded {
    pub(crate) fn values(&self) -> &[FieldValue] {
        match self {
            Decoded::Event { values, .. } => values,
            Decoded::Held { .. } | Decoded::Poison { .. } => &[],
        }
    }

    /// The envelope of a sound event, held or not.
    pub(crate) fn event(&self) -> Option<&Event> {
        match self {
            Decoded::Event { event, .. } | Decoded::Held { event, .. } => Some(event),
            Decoded::Poison { .. } => None,
        }
    }

    /// An event held back for its version: it waits however its `seq` stands.
    pub(crate) fn is_held(&self) -> bool {
        matches!(self, Decoded::Held { .. })
    }

    /// An event of a type the view subscribes to, held or not: only such an event leaves an
    /// inbox row once applied.
    pub(crate) fn is_subscribed(&self) -> bool {
        matches!(
            self,
            Decoded::Event { sent: true, .. } | Decoded::Held { .. }
        )
    }

    /// A sound event of a type the view subscribes to.
    pub(crate) fn is_sent(&self) -> bool {
        matches!(self, Decoded::Event { sent: true, .. })
    }
}

/// Where a message came from, for the dead-letter and waiting rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
}

/// An event that waited in `projector.waiting_events`, loaded because its account is in
/// the batch.
#[derive(Debug, Clone)]
pub(crate) struct WaitingEvent {
    pub account_id: i64,
    pub seq: i64,
    pub topic: String,
    pub partition: i32,
    pub message: Message,
    /// Decoded again: validation may have been tightened since it was stored.
    pub decoded: Decoded,
}

/// An account's state as loaded at the start of the batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AccountState {
    pub last_seq: i64,
    /// The event that holds `last_seq`, when known.
    pub last_event_id: Option<String>,
    /// Its `occurred_at`, when known (rows written since V0009).
    pub last_occurred_at: Option<DateTime<Utc>>,
    pub watermark: Option<i64>,
    /// The highest `seq` an order-independent view has applied for the account
    /// (`projector.seen_seqs`); `None` for an order-dependent view, or before its first.
    pub seen_seq: Option<i64>,
    /// The `seq` the account is parked at, if it is.
    pub blocked: Option<i64>,
    /// The version this one replaced had applied (and emitted for) events up to this `seq`.
    pub emit_after: Option<i64>,
    /// The `seq`s open dead letters of the account hold (order-dependent views), each with
    /// its dead event's id where it is known, oldest first.
    pub dead: Vec<(i64, Option<String>)>,
}

/// One account's work in this batch.
#[derive(Debug, Clone)]
pub(crate) struct AccountWork {
    pub account_id: i64,
    pub initial: AccountState,
    pub plan: sequencer::Plan,
    /// Indexes into `plan.emitted` of events whose statement failed, with the error. In an
    /// order-dependent view there is at most one: nothing after it is applied.
    pub failures: Vec<(usize, String)>,
    /// The account's events in the batch, as indexes into `decoded`, in batch order: the
    /// order of `plan.verdicts`. Kept so that nothing scans the whole batch per account.
    pub incoming: Vec<usize>,
}

impl AccountWork {
    /// The `seq` the account is parked at once the batch commits.
    pub(crate) fn blocked_seq(&self) -> Option<i64> {
        self.plan.blocked_seq()
    }
}

/// A `seq` a dead event claims: an open dead letter, a waiting event that no longer
/// decodes, or a poison message of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    pub seq: i64,
    /// The batch index of a poison message; `None` when it came before the batch.
    pub index: Option<usize>,
    /// The dead event's id, when known (see `event::Salvage::event_id`).
    pub event_id: Option<String>,
}

/// A batch event that claims a `seq` another event holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    /// Index into the batch's messages.
    pub index: usize,
    /// Why, naming both events when the other is known.
    pub error: String,
}

/// Everything known about a batch while it is being applied. Its fields are its own: the
/// steps that load, run and record it read what they need through the methods below, and
/// change it only through the few that say what they do (the waiting events loaded, whether
/// the version is live, a statement's failure, the counts of what ran).
#[derive(Debug)]
pub(crate) struct Work<'b> {
    /// The topic and partition of the batch's messages.
    topic: &'b str,
    partition: i32,
    /// The messages of this pass over the batch (the whole batch, usually), borrowed: a pass
    /// copies none of them.
    messages: &'b [Message],
    /// Each message decoded, index for index.
    decoded: &'b [Decoded],
    /// The waiting events loaded for the pass's accounts, which [`Item::Waiting`] indexes.
    waiting: Vec<WaitingEvent>,
    accounts: Vec<AccountWork>,
    dispositions: Vec<Disposition>,
    conflicts: Vec<Conflict>,
    /// Emitted events whose event id an earlier emitted event of this batch already carries,
    /// each with that first carrier: one statement must not see an event twice, and the
    /// first one applies it.
    repeats: HashMap<Item, Item>,
    counts: Counts,
    /// This version is live and its view emits notices: events past the boundary may emit.
    live: bool,
    /// Accounts to plan although the batch holds none of their events: a repair drains
    /// what waits for them.
    extra_accounts: Vec<i64>,
    /// Accounts with more waiting events than were loaded.
    truncated: HashSet<i64>,
    /// For each truncated account, the highest `seq` of the lowest ones loaded: a stored
    /// event above it was loaded only because a batch event claims its `seq`.
    loaded_to: HashMap<i64, i64>,
}

impl<'b> Work<'b> {
    /// The work of a whole batch.
    pub(crate) fn new(batch: &'b Batch, decoded: &'b [Decoded]) -> Self {
        Self::pass(&batch.topic, batch.partition, &batch.messages, decoded)
    }

    /// The work of one pass over `messages`, a run of a batch of `topic`/`partition`, and
    /// their decoded forms.
    pub(crate) fn pass(
        topic: &'b str,
        partition: i32,
        messages: &'b [Message],
        decoded: &'b [Decoded],
    ) -> Self {
        let poison = decoded
            .iter()
            .filter(|d| matches!(d, Decoded::Poison { .. }))
            .count() as u64;
        Self {
            topic,
            partition,
            messages,
            dispositions: vec![Disposition::DeadLettered; decoded.len()],
            decoded,
            waiting: Vec::new(),
            accounts: Vec::new(),
            conflicts: Vec::new(),
            repeats: HashMap::new(),
            live: false,
            extra_accounts: Vec::new(),
            truncated: HashSet::new(),
            loaded_to: HashMap::new(),
            counts: Counts {
                poison,
                ..Counts::default()
            },
        }
    }

    /// This work, also planning `accounts` although it holds none of their events: what
    /// waits for them drains (a pass or a repair that drains accounts).
    pub(crate) fn draining(mut self, accounts: Vec<i64>) -> Self {
        self.extra_accounts = accounts;
        self
    }

    /// The topic of the batch's messages.
    pub(crate) fn topic(&self) -> &'b str {
        self.topic
    }

    /// The partition of the batch's messages.
    pub(crate) fn partition(&self) -> i32 {
        self.partition
    }

    /// Each message of the pass, decoded.
    pub(crate) fn decoded(&self) -> &'b [Decoded] {
        self.decoded
    }

    /// What became of each message of the pass.
    pub(crate) fn dispositions(&self) -> &[Disposition] {
        &self.dispositions
    }

    /// Each account's work, once sequenced.
    pub(crate) fn accounts(&self) -> &[AccountWork] {
        &self.accounts
    }

    /// The batch events that claim a `seq` another event holds.
    pub(crate) fn conflicts(&self) -> &[Conflict] {
        &self.conflicts
    }

    /// The counts so far.
    pub(crate) fn counts(&self) -> &Counts {
        &self.counts
    }

    /// The counts, for the statements and lookups that count what they did.
    pub(crate) fn counts_mut(&mut self) -> &mut Counts {
        &mut self.counts
    }

    /// Whether this version is live and its view emits notices.
    pub(crate) fn live(&self) -> bool {
        self.live
    }

    /// Says whether this version is live and its view emits notices, as read in the batch's
    /// transaction.
    pub(crate) fn set_live(&mut self, live: bool) {
        self.live = live;
    }

    /// A loaded waiting event, by its index ([`Item::Waiting`]).
    pub(crate) fn waiting_event(&self, i: usize) -> &WaitingEvent {
        &self.waiting[i]
    }

    /// The first carrier of an emitted event's id, when an earlier emitted event of the batch
    /// carries it ([`Work::mark_repeated_ids`]).
    pub(crate) fn repeat_of(&self, item: Item) -> Option<Item> {
        self.repeats.get(&item).copied()
    }

    /// Whether more waiting events of `account` were left than were loaded.
    pub(crate) fn is_truncated(&self, account: i64) -> bool {
        self.truncated.contains(&account)
    }

    /// Records that the statement failed on the `k`-th emitted event of account `a` (an index
    /// into [`Work::accounts`]), with the database's `error`.
    pub(crate) fn fail(&mut self, a: usize, k: usize, error: String) {
        self.accounts[a].failures.push((k, error));
    }

    /// Adds the waiting events of the pass's parked accounts, loaded at most `limit` per
    /// account: an account with `limit` of them loaded has more (it is truncated), and the
    /// highest `seq` of those loaded is remembered ([`Work::beyond_loaded`]).
    pub(crate) fn load_waiting(&mut self, events: Vec<WaitingEvent>, limit: i64) {
        let mut loaded: HashMap<i64, i64> = HashMap::new();
        for e in &events {
            *loaded.entry(e.account_id).or_default() += 1;
        }
        self.truncated = loaded
            .into_iter()
            .filter(|(_, n)| *n >= limit)
            .map(|(a, _)| a)
            .collect();
        for e in &events {
            if self.truncated.contains(&e.account_id) {
                let highest = self.loaded_to.entry(e.account_id).or_insert(e.seq);
                *highest = (*highest).max(e.seq);
            }
        }
        self.waiting.extend(events);
    }

    /// Adds waiting events loaded because a batch event claims their `seq`, past what
    /// [`Work::load_waiting`] loaded of their account.
    pub(crate) fn add_waiting(&mut self, events: Vec<WaitingEvent>) {
        self.waiting.extend(events);
    }

    /// The distinct accounts of the batch's sound events, sorted (the lock order).
    pub(crate) fn account_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .decoded
            .iter()
            .filter_map(|d| d.event().map(|e| e.account_id))
            .chain(self.extra_accounts.iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The declared fields' values of an item's event.
    pub(crate) fn values(&self, item: Item) -> &[FieldValue] {
        match item {
            Item::Batch(i) => self.decoded[i].values(),
            Item::Waiting(i) => self.waiting[i].decoded.values(),
        }
    }

    pub(crate) fn event(&self, item: Item) -> Option<&Event> {
        match item {
            Item::Batch(i) => self.decoded[i].event(),
            Item::Waiting(i) => self.waiting[i].decoded.event(),
        }
    }

    /// Whether an item is held back for its version ([`Decoded::Held`]).
    pub(crate) fn is_held(&self, item: Item) -> bool {
        match item {
            Item::Batch(i) => self.decoded[i].is_held(),
            Item::Waiting(i) => self.waiting[i].decoded.is_held(),
        }
    }

    /// Why the item is held back, with its type and version, when it is.
    pub(crate) fn held(&self, item: Item) -> Option<(&Event, &str)> {
        let decoded = match item {
            Item::Batch(i) => &self.decoded[i],
            Item::Waiting(i) => &self.waiting[i].decoded,
        };
        match decoded {
            Decoded::Held { event, why } => Some((event, why.as_str())),
            _ => None,
        }
    }

    /// Whether an item is a sound event of a type the view subscribes to.
    pub(crate) fn sends(&self, item: Item) -> bool {
        match item {
            Item::Batch(i) => self.decoded[i].is_sent(),
            Item::Waiting(i) => self.waiting[i].decoded.is_sent(),
        }
    }

    pub(crate) fn source(&self, item: Item) -> Source<'_> {
        match item {
            Item::Batch(i) => {
                let m = &self.messages[i];
                Source {
                    topic: self.topic,
                    partition: self.partition,
                    offset: m.offset,
                    key: m.key.as_deref(),
                    payload: &m.payload,
                }
            }
            Item::Waiting(i) => {
                let s = &self.waiting[i];
                Source {
                    topic: &s.topic,
                    partition: s.partition,
                    offset: s.message.offset,
                    key: s.message.key.as_deref(),
                    payload: &s.message.payload,
                }
            }
        }
    }

    /// Waiting events that no longer decode: dead-lettered now, and gone from the waiting
    /// table (never counted as ignored and deleted).
    pub(crate) fn waiting_poison(&self) -> impl Iterator<Item = usize> + '_ {
        self.waiting
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s.decoded, Decoded::Poison { .. }))
            .map(|(i, _)| i)
    }

    /// The (account, seq) of batch events of truncated accounts past what was loaded of
    /// them: an event may already wait at such a `seq`.
    pub(crate) fn beyond_loaded(&self) -> (Vec<i64>, Vec<i64>) {
        let mut pairs: Vec<(i64, i64)> = self
            .decoded
            .iter()
            .filter_map(Decoded::event)
            .filter(|ev| {
                self.loaded_to
                    .get(&ev.account_id)
                    .is_some_and(|&highest| ev.seq > highest)
            })
            .map(|ev| (ev.account_id, ev.seq))
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        pairs.into_iter().unzip()
    }

    /// Runs the sequencer for every account. `states` holds the loaded state of accounts
    /// that have one. `ordered` is false for an order-independent view.
    pub(crate) fn sequence(&mut self, mut states: HashMap<i64, AccountState>, ordered: bool) {
        let mut incoming: BTreeMap<i64, Vec<(i64, Item)>> = BTreeMap::new();
        for (i, d) in self.decoded.iter().enumerate() {
            if let Some(ev) = d.event() {
                incoming
                    .entry(ev.account_id)
                    .or_default()
                    .push((ev.seq, Item::Batch(i)));
            }
        }
        let mut waiting: HashMap<i64, BTreeMap<i64, Item>> = HashMap::new();
        for (i, s) in self.waiting.iter().enumerate() {
            if s.decoded.event().is_some() {
                waiting
                    .entry(s.account_id)
                    .or_default()
                    .insert(s.seq, Item::Waiting(i));
            }
        }
        for &account in &self.extra_accounts {
            incoming.entry(account).or_default();
        }
        let mut claims = if ordered {
            self.dead_claims(&states)
        } else {
            HashMap::new()
        };
        for (account_id, mut events) in incoming {
            let initial = states.remove(&account_id).unwrap_or_default();
            if let Some(claims) = claims.remove(&account_id) {
                let held = waiting.get(&account_id);
                events = self.claimed_by_the_dead(&initial, held, &claims, events);
            }
            let start = sequencer::Start {
                last_seq: initial.last_seq,
                watermark: initial.watermark,
                waiting: waiting.remove(&account_id).unwrap_or_default(),
            };
            // One event is its id and its `occurred_at`, whatever the version it came in.
            let same = |a: Item, b: Item| match (self.event(a), self.event(b)) {
                (Some(x), Some(y)) => x.event_id == y.event_id && x.occurred_at == y.occurred_at,
                _ => false,
            };
            let plan =
                sequencer::plan_with(start, &events, ordered, &|item| self.is_held(item), &same);
            for (&(_, item), verdict) in events.iter().zip(&plan.verdicts) {
                let Item::Batch(i) = item else { continue };
                self.dispositions[i] = match verdict {
                    Verdict::Emit => Disposition::Applied,
                    // Classified by `classify_taken` once the ids are known.
                    Verdict::Taken(_) => Disposition::Duplicate,
                    Verdict::Watermark => {
                        self.counts.dup_watermark += 1;
                        Disposition::BelowWatermark
                    }
                    Verdict::Wait => Disposition::Waiting,
                };
            }
            // An event that came before the `seq` it waits for, in this same batch, leaves
            // with it: it is emitted, not left waiting, whatever its verdict said on arrival.
            for &(_, item) in &plan.emitted {
                if let Item::Batch(i) = item {
                    self.dispositions[i] = Disposition::Applied;
                }
            }
            let incoming = events
                .iter()
                .filter_map(|&(_, item)| match item {
                    Item::Batch(i) => Some(i),
                    Item::Waiting(_) => None,
                })
                .collect();
            self.accounts.push(AccountWork {
                account_id,
                initial,
                plan,
                failures: Vec::new(),
                incoming,
            });
        }
    }

    /// Per account, the `seq`s dead events claim, in the order they claimed them: open
    /// dead letters stored before this batch (loaded with the account), waiting events that
    /// no longer decode, then this batch's poison, each with its batch index (`None` for
    /// the first two, which came before every batch message) and its event id if known.
    fn dead_claims(&self, states: &HashMap<i64, AccountState>) -> HashMap<i64, Vec<Claim>> {
        let mut claims: HashMap<i64, Vec<Claim>> = HashMap::new();
        for (&account, state) in states {
            for (seq, id) in &state.dead {
                claims.entry(account).or_default().push(Claim {
                    seq: *seq,
                    index: None,
                    event_id: id.clone(),
                });
            }
        }
        for s in &self.waiting {
            if let Decoded::Poison { salvage, .. } = &s.decoded {
                claims.entry(s.account_id).or_default().push(Claim {
                    seq: s.seq,
                    index: None,
                    event_id: salvage.event_id.clone(),
                });
            }
        }
        for (i, d) in self.decoded.iter().enumerate() {
            if let Decoded::Poison { salvage, .. } = d {
                if let (Some(account), Some(seq)) = (salvage.account_id, salvage.seq) {
                    claims.entry(account).or_default().push(Claim {
                        seq,
                        index: Some(i),
                        event_id: salvage.event_id.clone(),
                    });
                }
            }
        }
        claims
    }

    /// Takes out of an account's `events` those that claim a `seq` a dead event claimed
    /// first under another id, as conflicts: a dead letter holds its `seq` (the account
    /// parks there) until its event's correction, which carries its id, or an engineer
    /// releases it. Only `seq`s the account has yet to apply, and that no waiting event
    /// holds (the sequencer judges those), are looked at; the first claim whose event id
    /// is known decides, and a seq claimed only by dead events of unknown id is left to
    /// the sequencer: whatever is applied there supersedes them (`RESOLVE_SUPERSEDED`).
    fn claimed_by_the_dead(
        &mut self,
        initial: &AccountState,
        held: Option<&BTreeMap<i64, Item>>,
        claims: &[Claim],
        events: Vec<(i64, Item)>,
    ) -> Vec<(i64, Item)> {
        let applied = initial.last_seq.max(initial.watermark.unwrap_or(0));
        let mut kept = Vec::with_capacity(events.len());
        // The first sound event kept at each seq: a poison message after it in the batch
        // came second, and the sequencer judges what follows against that event.
        let mut first_at: HashMap<i64, usize> = HashMap::new();
        for (seq, item) in events {
            let Item::Batch(i) = item else {
                kept.push((seq, item));
                continue;
            };
            let Some(ev) = self.decoded[i].event() else {
                kept.push((seq, item));
                continue;
            };
            let open = seq > applied && !held.is_some_and(|w| w.contains_key(&seq));
            let before = first_at.get(&seq).copied().unwrap_or(i);
            let holder = claims
                .iter()
                .filter(|c| c.seq == seq && c.index.is_none_or(|p| p < before))
                .find_map(|c| c.event_id.as_deref());
            match holder {
                Some(id) if open && id != ev.event_id => {
                    let error = format!(
                        "conflict: seq {seq} of account {} is held by event {id:?}, dead-lettered (poison, or its statement failed) and not applied; event {:?} claims it too (two events, one seq: a write-side bug); not applied. Republish {id:?} corrected, with its id, or give its dead letter up (`projector dlq skip`)",
                        ev.account_id, ev.event_id
                    );
                    self.conflicts.push(Conflict { index: i, error });
                    self.dispositions[i] = Disposition::DeadLettered;
                    self.counts.conflicts += 1;
                }
                _ => {
                    first_at.entry(seq).or_insert(i);
                    kept.push((seq, item));
                }
            }
        }
        kept
    }

    /// The batch events whose `seq` was taken before this batch and whose identity only the
    /// inbox can vouch for: subscribed events (only those leave an inbox row) of a view with
    /// an inbox, each as its id and `occurred_at`, the inbox's key. The account's last event id
    /// alone cannot tell a copy from the same id stamped with another time, which is another
    /// event; so every such event is looked up, the last one's repeats too.
    pub(crate) fn ids_to_check(&self, uses_inbox: bool) -> Vec<(&str, DateTime<Utc>)> {
        if !uses_inbox {
            return Vec::new();
        }
        let mut ids = Vec::new();
        for acc in &self.accounts {
            for i in taken_before(acc) {
                let Some(ev) = self.decoded[i].event() else {
                    continue;
                };
                // The account's last event is known by its id and, since V0009, its time:
                // judged without the inbox, whose day retention may have dropped. Known by
                // its id alone (a row from before), the inbox tells a copy from the same id
                // stamped with another time; another id is a conflict whatever the time.
                let settled = ev.seq == acc.initial.last_seq
                    && match (&acc.initial.last_event_id, acc.initial.last_occurred_at) {
                        (Some(_), Some(_)) => true,
                        (Some(id), None) => *id != ev.event_id,
                        (None, _) => false,
                    };
                if !settled && self.decoded[i].is_subscribed() {
                    ids.push((ev.event_id.as_str(), ev.occurred_at));
                }
            }
            // An order-independent view does not track `seq`: only the inbox knows whether
            // an event held for its version was applied before, in a copy it could read.
            for i in held_to_wait(acc) {
                if let Some(ev) = self.decoded[i].event() {
                    ids.push((ev.event_id.as_str(), ev.occurred_at));
                }
            }
        }
        ids
    }

    /// The batch's events about to be sent to the statement at or below their account's
    /// `seen_seq` (an order-independent view's highest applied `seq`), each key once: the
    /// events [`super::Applier`] looks up to count `below_seen`.
    pub(crate) fn below_seen(&self) -> Vec<BelowSeen<'_>> {
        let mut keys = HashSet::new();
        let mut below = Vec::new();
        for acc in &self.accounts {
            let Some(seen_seq) = acc.initial.seen_seq else {
                continue;
            };
            for &(seq, item) in &acc.plan.emitted {
                let Item::Batch(i) = item else { continue };
                if seq > seen_seq || self.repeats.contains_key(&item) {
                    continue;
                }
                let (Some(ev), true) = (self.decoded[i].event(), self.decoded[i].is_subscribed())
                else {
                    continue;
                };
                if keys.insert((ev.event_id.as_str(), ev.occurred_at)) {
                    below.push(BelowSeen {
                        event_id: &ev.event_id,
                        occurred_at: ev.occurred_at,
                        account_id: ev.account_id,
                        seq,
                        seen_seq,
                    });
                }
            }
        }
        below
    }

    /// Events of this batch held for their version in an order-independent view whose
    /// identity the inbox has (`known`, among the events [`Work::ids_to_check`] looked up):
    /// the same event applied before, from a copy the view could read. Each is a duplicate,
    /// not a waiting event: it would park its account until a build that reads its version
    /// drained it as that duplicate.
    pub(crate) fn drop_held_copies(&mut self, known: &HashSet<(String, DateTime<Utc>)>) {
        let mut copies = Vec::new();
        for (a, acc) in self.accounts.iter().enumerate() {
            for i in held_to_wait(acc) {
                let Some(ev) = self.decoded[i].event() else {
                    continue;
                };
                if known.contains(&(ev.event_id.clone(), ev.occurred_at)) {
                    copies.push((a, i, ev.seq));
                }
            }
        }
        for (a, i, seq) in copies {
            let waiting = &mut self.accounts[a].plan.waiting;
            if waiting.get(&seq) == Some(&Item::Batch(i)) {
                waiting.remove(&seq);
            }
            self.dispositions[i] = Disposition::Duplicate;
            self.counts.dup_inbox += 1;
        }
    }

    /// Tells true duplicates from conflicts among the events whose `seq` was taken. `known`
    /// holds the checked events the inbox has (see [`Work::ids_to_check`]); `checked` says
    /// whether an event was looked up at all. An event is the same as another when both its
    /// id and its `occurred_at` are (the inbox's key); the account's last event, known by its
    /// id alone, settles what was not looked up (an event of a type the view ignores).
    pub(crate) fn classify_taken(
        &mut self,
        checked: &HashSet<(String, DateTime<Utc>)>,
        known: &HashSet<(String, DateTime<Utc>)>,
    ) {
        let mut conflicts = Vec::new();
        let mut duplicates = 0;
        for acc in &self.accounts {
            for (&i, verdict) in acc.incoming.iter().zip(&acc.plan.verdicts) {
                let Verdict::Taken(holder) = *verdict else {
                    continue;
                };
                let Some(ev) = self.decoded[i].event() else {
                    continue;
                };
                let key = (ev.event_id.clone(), ev.occurred_at);
                let last = (ev.seq == acc.initial.last_seq)
                    .then_some(acc.initial.last_event_id.as_deref())
                    .flatten()
                    .map(|id| (id, acc.initial.last_occurred_at));
                let same = |id: &str, at: Option<DateTime<Utc>>| match at {
                    _ if id != ev.event_id => Holder::Other(id.to_owned()),
                    Some(at) if at != ev.occurred_at => Holder::Restamped(Some(at)),
                    _ => Holder::Same,
                };
                let holder = match holder {
                    Some(h) => match self.event(h) {
                        Some(e) => same(&e.event_id, Some(e.occurred_at)),
                        None => Holder::Nothing,
                    },
                    None if checked.contains(&key) => match (known.contains(&key), last) {
                        (true, _) => Holder::Same,
                        // Not in the inbox, so another event: named when it is the account's
                        // last; under the same id, its time is what differs.
                        (false, Some((id, _))) if id == ev.event_id => Holder::Restamped(None),
                        (false, Some((id, _))) => Holder::Other(id.to_owned()),
                        (false, None) => Holder::Unknown,
                    },
                    None => last.map_or(Holder::Nothing, |(id, at)| same(id, at)),
                };
                let error = match holder {
                    Holder::Other(id) => format!(
                        "conflict: seq {} of account {} is held by event {id:?}; event {:?} claims it too (two events, one seq: a write-side bug); not applied",
                        ev.seq, ev.account_id, ev.event_id
                    ),
                    Holder::Restamped(at) => format!(
                        "conflict: seq {} of account {} is held by event {:?}{}; this copy of it says it occurred at {} (an event's occurred_at is part of its identity, set once by the write side: a write-side bug); not applied",
                        ev.seq,
                        ev.account_id,
                        ev.event_id,
                        at.map_or(" applied with another occurred_at".to_owned(), |at| format!(
                            " that occurred at {}",
                            at.to_rfc3339()
                        )),
                        ev.occurred_at.to_rfc3339()
                    ),
                    Holder::Unknown => format!(
                        "conflict: seq {} of account {} was applied before as another event (the account is at seq {}); event {:?} claims it too and was never applied (two events, one seq: a write-side bug; or the event an operator skipped with `projector parked skip`, arriving after all: see projector.skips)",
                        ev.seq, ev.account_id, acc.plan.last_seq.max(acc.initial.last_seq), ev.event_id
                    ),
                    // The same event, or nothing to compare with (it cannot have an effect
                    // either way): a duplicate.
                    Holder::Same | Holder::Nothing => {
                        duplicates += 1;
                        continue;
                    }
                };
                conflicts.push(Conflict { index: i, error });
            }
        }
        for c in &conflicts {
            self.dispositions[c.index] = Disposition::DeadLettered;
        }
        self.counts.dup_seq += duplicates;
        self.counts.conflicts += conflicts.len() as u64;
        // After the conflicts with dead events the sequencer never saw.
        self.conflicts.extend(conflicts);
    }

    /// Marks emitted events whose id an earlier emitted event of the batch carries (accounts
    /// in order, each account's events in order), with that first carrier. `sent` says
    /// whether an event goes to the view's statement at all.
    pub(crate) fn mark_repeated_ids(&mut self) {
        // By the inbox's key: the same id with another occurred_at is another event.
        let mut first: HashMap<(&str, DateTime<Utc>), Item> =
            HashMap::with_capacity(self.decoded.len());
        let mut repeats = HashMap::new();
        for acc in &self.accounts {
            for &(_, item) in &acc.plan.emitted {
                let Some(ev) = self.event(item) else { continue };
                if self.sends(item) {
                    let carrier = *first
                        .entry((ev.event_id.as_str(), ev.occurred_at))
                        .or_insert(item);
                    if carrier != item {
                        repeats.insert(item, carrier);
                    }
                }
            }
        }
        for &item in repeats.keys() {
            self.counts.dup_inbox += 1;
            if let Item::Batch(i) = item {
                self.dispositions[i] = Disposition::Duplicate;
            }
        }
        self.repeats = repeats;
    }

    /// An emitted event whose id an earlier one of the batch carries: never sent.
    pub(crate) fn is_repeat(&self, item: Item) -> bool {
        self.repeats.contains_key(&item)
    }

    /// Folds statement failures into each account's plan and fills in the dispositions and
    /// counts of what the statements did not count. In an order-dependent view, nothing
    /// after a failed event is applied: it waits, and the account parks at the failed `seq`.
    pub(crate) fn settle(&mut self, ordered: bool) {
        let mut counts = Counts::default();
        let mut uncounted_repeats = 0;
        for a in 0..self.accounts.len() {
            // Waiting events whose seq was applied meanwhile leave as duplicates.
            let stale = self.accounts[a].plan.stale.len() as u64;
            counts.drained += stale;
            counts.dup_seq += stale;
            let acc = &self.accounts[a];
            let failed: HashSet<usize> = acc.failures.iter().map(|(k, _)| *k).collect();
            let cut = match (ordered, acc.failures.iter().map(|(k, _)| *k).min()) {
                (true, Some(k)) => k,
                _ => acc.plan.emitted.len(),
            };
            for (k, &(_, item)) in acc.plan.emitted.iter().enumerate() {
                let is_subscribed = self.sends(item);
                if k > cut {
                    if let Item::Batch(i) = item {
                        self.dispositions[i] = Disposition::Waiting;
                    }
                    if self.is_repeat(item) {
                        // Counted as a duplicate, but it waits: it is judged when it drains.
                        uncounted_repeats += 1;
                    }
                    continue;
                }
                if let Item::Waiting(_) = item {
                    counts.drained += 1;
                }
                if failed.contains(&k) {
                    counts.failed += 1;
                    if let Item::Batch(i) = item {
                        self.dispositions[i] = Disposition::DeadLettered;
                    }
                } else if !is_subscribed {
                    counts.ignored += 1;
                    if let Item::Batch(i) = item {
                        self.dispositions[i] = Disposition::Ignored;
                    }
                }
            }
            if cut >= acc.plan.emitted.len() {
                continue;
            }
            let acc = &mut self.accounts[a];
            let emitted = std::mem::take(&mut acc.plan.emitted);
            acc.plan.last_seq = if cut == 0 {
                acc.initial.last_seq.max(acc.initial.watermark.unwrap_or(0))
            } else {
                emitted[cut - 1].0
            };
            acc.plan.waiting.extend(emitted[cut + 1..].iter().copied());
            acc.plan.emitted = emitted[..=cut].to_vec();
        }
        self.counts.dup_inbox -= uncounted_repeats.min(self.counts.dup_inbox);
        counts.drained += self.waiting_poison().count() as u64;
        counts.poison += self.waiting_poison().count() as u64;
        counts.waiting = self
            .dispositions
            .iter()
            .filter(|d| **d == Disposition::Waiting)
            .count() as u64;
        self.counts += &counts;
    }

    /// Accounts whose loaded waiting events all left, with more waiting than were loaded:
    /// the next ones may be able to follow now. (An event loaded only because a batch event
    /// claimed its `seq`, past the lowest ones loaded, may still wait: the ones between are
    /// next.)
    pub(crate) fn more_to_drain(&self) -> Vec<i64> {
        self.accounts
            .iter()
            .filter(|a| self.truncated.contains(&a.account_id))
            .filter(|a| {
                let highest = self.loaded_to.get(&a.account_id).copied();
                !a.plan.waiting.iter().any(|(seq, i)| {
                    matches!(i, Item::Waiting(_)) && highest.is_none_or(|h| *seq <= h)
                })
            })
            .map(|a| a.account_id)
            .collect()
    }

    /// Where a pass over the batch must stop so that a correction is judged after the event
    /// it corrects: a message with the id of an event whose statement failed, but other
    /// bytes (the producer republished it fixed), that this pass dropped as a duplicate of
    /// it. Returns the message's index and its account. Ending the pass before it lets the
    /// failed event be dead-lettered (its account parks at its seq); the next pass then finds
    /// the correction fresh, and the correction releases the account.
    pub(crate) fn split_point(&self) -> Option<(usize, i64)> {
        let mut best: Option<(usize, i64)> = None;
        for acc in &self.accounts {
            for (k, _) in &acc.failures {
                let holder = acc.plan.emitted[*k].1;
                let Some(held) = self.event(holder) else {
                    continue;
                };
                let held_bytes = self.source(holder).payload;
                for (i, d) in self.decoded.iter().enumerate() {
                    let after = match holder {
                        Item::Batch(h) => i > h,
                        Item::Waiting(_) => true,
                    };
                    let candidate = after
                        && self.dispositions[i] == Disposition::Duplicate
                        && d.event().is_some_and(|e| e.event_id == held.event_id)
                        && self.messages[i].payload.as_slice() != held_bytes;
                    if candidate && best.is_none_or(|(b, _)| i < b) {
                        best = Some((i, acc.account_id));
                    }
                }
            }
        }
        best
    }

    /// What became, in this pass, of waiting events that came from `topic`/`partition`
    /// (waiting events an earlier pass of the same batch stored): by offset.
    pub(crate) fn waiting_outcomes(&self) -> Vec<(i64, Disposition)> {
        let mut out = Vec::new();
        for (i, s) in self.waiting.iter().enumerate() {
            if s.topic != self.topic || s.partition != self.partition {
                continue;
            }
            if matches!(s.decoded, Decoded::Poison { .. }) {
                out.push((s.message.offset, Disposition::DeadLettered));
                continue;
            }
            for acc in &self.accounts {
                let failed: HashSet<usize> = acc.failures.iter().map(|(k, _)| *k).collect();
                if let Some(k) = acc
                    .plan
                    .emitted
                    .iter()
                    .position(|(_, item)| *item == Item::Waiting(i))
                {
                    let d = if failed.contains(&k) {
                        Disposition::DeadLettered
                    } else if self.sends(Item::Waiting(i)) {
                        Disposition::Applied
                    } else {
                        Disposition::Ignored
                    };
                    out.push((s.message.offset, d));
                }
                if acc
                    .plan
                    .stale
                    .iter()
                    .any(|(_, item)| *item == Item::Waiting(i))
                {
                    out.push((s.message.offset, Disposition::Duplicate));
                }
            }
        }
        out
    }

    /// The event that holds `last_seq` once the batch commits, for the progress row: its id
    /// and, when known, its `occurred_at`.
    pub(crate) fn last_event<'s>(
        &'s self,
        acc: &'s AccountWork,
    ) -> Option<(&'s str, Option<DateTime<Utc>>)> {
        // After a failure the emitted list ends with the failed event; the holder of
        // last_seq is the emitted event at that seq, if this batch applied it.
        let failed: HashSet<usize> = acc.failures.iter().map(|(k, _)| *k).collect();
        let here = acc
            .plan
            .emitted
            .iter()
            .enumerate()
            .rev()
            .find(|(k, (seq, _))| *seq == acc.plan.last_seq && !failed.contains(k));
        match here {
            Some((_, &(_, item))) => self
                .event(item)
                .map(|e| (e.event_id.as_str(), Some(e.occurred_at))),
            None if acc.plan.last_seq == acc.initial.last_seq => acc
                .initial
                .last_event_id
                .as_deref()
                .map(|id| (id, acc.initial.last_occurred_at)),
            None => None,
        }
    }
}

/// An event an order-independent view is about to apply at or below the highest `seq` it
/// has applied for its account ([`Work::below_seen`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BelowSeen<'a> {
    pub event_id: &'a str,
    pub occurred_at: DateTime<Utc>,
    pub account_id: i64,
    pub seq: i64,
    pub seen_seq: i64,
}

/// What holds a taken `seq`, for an event that claims it again ([`Work::classify_taken`]).
enum Holder {
    /// The same event: a duplicate.
    Same,
    /// Nothing to compare with: a duplicate too, it cannot have an effect either way.
    Nothing,
    /// Another event, by its id.
    Other(String),
    /// The same id with another `occurred_at` (when known): another event.
    Restamped(Option<DateTime<Utc>>),
    /// Another event the inbox does not know, whose id is not at hand.
    Unknown,
}

/// Batch messages of `acc` whose verdict is "taken before this batch".
/// The batch events an order-independent view's plan leaves waiting: held for their version.
fn held_to_wait(acc: &AccountWork) -> impl Iterator<Item = usize> + '_ {
    acc.incoming
        .iter()
        .zip(&acc.plan.verdicts)
        .filter(move |(_, v)| !acc.plan.ordered && **v == Verdict::Wait)
        .map(|(&i, _)| i)
}

fn taken_before(acc: &AccountWork) -> impl Iterator<Item = usize> + '_ {
    acc.incoming
        .iter()
        .zip(&acc.plan.verdicts)
        .filter(|(_, v)| **v == Verdict::Taken(None))
        .map(|(&i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{decode, Salvage};

    /// A fill of one unit, as `(event_id, account, seq)`.
    #[derive(Clone)]
    struct Spec(String, i64, i64);

    impl Spec {
        fn with_id(mut self, id: &str) -> Self {
            self.0 = id.to_owned();
            self
        }
    }

    fn batch(events: &[Spec]) -> Batch {
        Batch {
            topic: "t".to_owned(),
            partition: 0,
            start_offset: 0,
            messages: events
                .iter()
                .enumerate()
                .map(|(i, Spec(id, account, seq))| {
                    let payload = serde_json::json!({
                        "event_id": id, "type": "fill_executed", "account_id": account,
                        "seq": seq, "occurred_at": "2026-11-29T10:15:00Z",
                        "data": {"symbol": "X", "side": "buy", "qty": "1", "price": "1"},
                    });
                    Message::new(
                        i as i64,
                        Some(account.to_string().into_bytes()),
                        payload.to_string(),
                    )
                })
                .collect(),
        }
    }

    fn decoded(b: &Batch) -> Vec<Decoded> {
        b.messages
            .iter()
            .map(|m| Decoded::Event {
                event: decode(m).expect("valid"),
                values: Vec::new(),
                sent: true,
            })
            .collect()
    }

    fn f(account: i64, seq: i64) -> Spec {
        Spec(format!("fill_executed-{account}-{seq}"), account, seq)
    }

    #[test]
    fn a_repeated_id_is_applied_once_whatever_its_seq_or_account() {
        let b = batch(&[f(1, 1), f(2, 1).with_id("fill_executed-1-1"), f(1, 2)]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(HashMap::new(), true);
        w.mark_repeated_ids();
        assert_eq!(
            w.repeats.keys().copied().collect::<Vec<_>>(),
            [Item::Batch(1)]
        );
        assert_eq!(w.counts.dup_inbox, 1);
        assert_eq!(w.dispositions[1], Disposition::Duplicate);
    }

    #[test]
    fn an_account_with_as_many_waiting_as_loaded_has_more_to_drain() {
        // Account 1 waits at seqs 3 and 4 (two loaded, the limit: more wait); account 2 at 5
        // (one loaded: all of them).
        let waiting_batch = batch(&[f(1, 3), f(1, 4), f(2, 5)]);
        let waiting: Vec<WaitingEvent> = waiting_batch
            .messages
            .iter()
            .zip(decoded(&waiting_batch))
            .map(|(m, d)| {
                let ev = d.event().expect("sound").clone();
                WaitingEvent {
                    account_id: ev.account_id,
                    seq: ev.seq,
                    topic: "t".to_owned(),
                    partition: 0,
                    message: m.clone(),
                    decoded: d,
                }
            })
            .collect();
        // The batch brings account 1's seq 2 and 9, account 2's seq 4.
        let b = batch(&[f(1, 2), f(1, 9), f(2, 4)]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.load_waiting(waiting, 2);
        assert!(w.is_truncated(1) && !w.is_truncated(2));
        assert_eq!(
            w.beyond_loaded(),
            (vec![1], vec![9]),
            "an event may already wait at seq 9 of account 1; account 2 is loaded whole"
        );
        let states = [
            (
                1,
                AccountState {
                    last_seq: 1,
                    blocked: Some(2),
                    ..AccountState::default()
                },
            ),
            (
                2,
                AccountState {
                    last_seq: 3,
                    blocked: Some(4),
                    ..AccountState::default()
                },
            ),
        ];
        w.sequence(states.into(), true);
        w.settle(true);
        assert_eq!(w.more_to_drain(), [1], "every loaded one of account 1 left");
        assert_eq!(w.counts().drained, 3);
        assert_eq!(w.waiting_event(2).seq, 5);
    }

    #[test]
    fn a_gap_filled_within_the_batch_leaves_nothing_waiting() {
        let b = batch(&[f(1, 2), f(1, 3), f(1, 1)]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(HashMap::new(), true);
        w.settle(true);
        assert_eq!(w.dispositions, [Disposition::Applied; 3]);
        assert_eq!((w.counts.waiting, w.counts.drained), (0, 0));
        assert_eq!(w.accounts[0].blocked_seq(), None);
    }

    #[test]
    fn a_second_event_for_a_taken_seq_is_a_conflict_naming_both() {
        let b = batch(&[f(1, 1), f(1, 1).with_id("other"), f(1, 1)]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(HashMap::new(), true);
        w.classify_taken(&HashSet::new(), &HashSet::new());
        assert_eq!(w.counts.dup_seq, 1, "the exact repeat is a duplicate");
        assert_eq!(w.conflicts.len(), 1);
        assert_eq!(w.conflicts[0].index, 1);
        assert!(
            w.conflicts[0].error.contains("\"fill_executed-1-1\"")
                && w.conflicts[0].error.contains("\"other\""),
            "{}",
            w.conflicts[0].error
        );
        assert_eq!(w.dispositions[1], Disposition::DeadLettered);
    }

    #[test]
    fn an_older_seq_is_judged_by_the_last_event_or_the_inbox() {
        let b = batch(&[f(1, 3), f(1, 2), f(1, 2).with_id("stranger"), f(1, 1)]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        let state = AccountState {
            last_seq: 3,
            last_event_id: Some("fill_executed-1-3".to_owned()),
            ..AccountState::default()
        };
        w.sequence([(1, state)].into(), true);
        let keys: Vec<(String, DateTime<Utc>)> = w
            .ids_to_check(true)
            .into_iter()
            .map(|(id, at)| (id.to_owned(), at))
            .collect();
        let ids: Vec<&str> = keys.iter().map(|(id, _)| id.as_str()).collect();
        // The last event's repeat is looked up too: its id alone cannot tell it from the
        // same id stamped with another time.
        assert_eq!(
            ids,
            [
                "fill_executed-1-3",
                "fill_executed-1-2",
                "stranger",
                "fill_executed-1-1"
            ]
        );
        let checked: HashSet<(String, DateTime<Utc>)> = keys.iter().cloned().collect();
        let known: HashSet<(String, DateTime<Utc>)> = keys
            .iter()
            .filter(|(id, _)| id.ends_with("-3") || id.ends_with("-2"))
            .cloned()
            .collect();
        w.classify_taken(&checked, &known);
        // 3 repeats the last event, 2 is in the inbox, 1 is not: a conflict.
        assert_eq!(w.counts.dup_seq, 2);
        let indexes: Vec<usize> = w.conflicts.iter().map(|c| c.index).collect();
        assert_eq!(indexes, [2, 3]);
    }

    fn poison(id: Option<&str>, account: i64, seq: i64) -> Decoded {
        Decoded::Poison {
            error: "bad".to_owned(),
            salvage: Salvage {
                event_id: id.map(str::to_owned),
                account_id: Some(account),
                seq: Some(seq),
            },
        }
    }

    /// Account 1 at seq 1, its seq 2 held by an open dead letter of event `dead`.
    fn held_by(dead: Option<&str>) -> HashMap<i64, AccountState> {
        let state = AccountState {
            last_seq: 1,
            dead: vec![(2, dead.map(str::to_owned))],
            ..AccountState::default()
        };
        [(1, state)].into()
    }

    #[test]
    fn another_id_for_a_seq_a_dead_letter_holds_is_a_conflict_and_its_own_id_is_not() {
        let b = batch(&[f(1, 2).with_id("other"), f(1, 3), f(1, 2).with_id("dead")]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(held_by(Some("dead")), true);
        w.classify_taken(&HashSet::new(), &HashSet::new());
        assert_eq!(w.conflicts.len(), 1);
        assert_eq!(w.conflicts[0].index, 0);
        assert!(
            w.conflicts[0].error.contains("\"dead\"") && w.conflicts[0].error.contains("\"other\""),
            "{}",
            w.conflicts[0].error
        );
        assert_eq!(w.counts.conflicts, 1);
        assert_eq!(w.dispositions[0], Disposition::DeadLettered);
        // The correction (the dead letter's own id) goes, and seq 3 after it.
        let emitted: Vec<i64> = w.accounts[0].plan.emitted.iter().map(|(s, _)| *s).collect();
        assert_eq!(emitted, [2, 3]);
    }

    #[test]
    fn a_dead_letter_of_unknown_id_leaves_its_seq_to_whatever_comes() {
        let b = batch(&[f(1, 2).with_id("other")]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(held_by(None), true);
        assert!(w.conflicts.is_empty());
        assert_eq!(w.accounts[0].plan.emitted.len(), 1);
    }

    #[test]
    fn a_dead_letter_binds_only_seqs_not_yet_applied_nor_waiting_and_only_in_order() {
        // Applied already: the sequencer judges it (a duplicate or a conflict by the inbox).
        let b = batch(&[f(1, 1).with_id("other")]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        let mut states = held_by(Some("dead"));
        if let Some(s) = states.get_mut(&1) {
            s.dead = vec![(1, Some("dead".to_owned()))];
        }
        w.sequence(states, true);
        assert!(w.conflicts.is_empty());
        assert_eq!(w.accounts[0].plan.verdicts, [Verdict::Taken(None)]);

        // An order-independent view applies both events.
        let b = batch(&[f(1, 2).with_id("other")]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(held_by(Some("dead")), false);
        assert!(w.conflicts.is_empty());
    }

    #[test]
    fn a_poison_message_claims_its_seq_for_the_events_after_it_in_the_batch() {
        let b = batch(&[f(1, 2).with_id("before"), f(1, 2), f(1, 2).with_id("after")]);
        let mut d = decoded(&b);
        d[1] = poison(Some("p"), 1, 2);
        let mut w = Work::new(&b, &d);
        let state = AccountState {
            last_seq: 1,
            ..AccountState::default()
        };
        w.sequence([(1, state)].into(), true);
        w.classify_taken(&HashSet::new(), &HashSet::new());
        // "before" holds seq 2, and "after" conflicts with it: the poison came second.
        assert_eq!(w.dispositions[0], Disposition::Applied);
        let indexes: Vec<usize> = w.conflicts.iter().map(|c| c.index).collect();
        assert_eq!(indexes, [2]);
        assert!(
            w.conflicts[0].error.contains("\"before\""),
            "{}",
            w.conflicts[0].error
        );

        // The poison first: the event after it conflicts with the poison.
        let b = batch(&[f(1, 2), f(1, 2).with_id("after")]);
        let mut d = decoded(&b);
        d[0] = poison(Some("p"), 1, 2);
        let mut w = Work::new(&b, &d);
        let state = AccountState {
            last_seq: 1,
            ..AccountState::default()
        };
        w.sequence([(1, state)].into(), true);
        assert_eq!(w.conflicts.len(), 1);
        assert!(
            w.conflicts[0].error.contains("\"p\""),
            "{}",
            w.conflicts[0].error
        );
        assert!(w.accounts[0].plan.emitted.is_empty());
    }

    #[test]
    fn an_event_that_waits_for_a_seq_later_in_the_batch_leaves_with_it() {
        let b = batch(&[f(1, 2), f(1, 4), f(1, 1), f(1, 3), f(1, 6)]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(HashMap::new(), true);
        w.settle(true);
        use Disposition::*;
        assert_eq!(
            w.dispositions,
            [Applied, Applied, Applied, Applied, Waiting],
            "2 and 4 arrived early but left in this batch; 6 waits for 5"
        );
        // Every message counted once: 4 applied by the statement, 1 waiting.
        assert_eq!((w.counts.waiting, w.counts.drained), (1, 0));
        assert_eq!(w.accounts[0].blocked_seq(), Some(5));
    }

    #[test]
    fn settling_a_failure_parks_the_account_at_the_failed_seq() {
        let b = batch(&[f(1, 1), f(1, 2), f(1, 3), f(2, 1)]);
        let d = decoded(&b);
        let mut w = Work::new(&b, &d);
        w.sequence(HashMap::new(), true);
        w.accounts[0].failures.push((1, "boom".to_owned()));
        w.settle(true);
        let acc = &w.accounts[0];
        assert_eq!(acc.plan.last_seq, 1);
        assert_eq!(acc.blocked_seq(), Some(2));
        assert_eq!(acc.plan.waiting.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(
            w.dispositions,
            [
                Disposition::Applied,
                Disposition::DeadLettered,
                Disposition::Waiting,
                Disposition::Applied
            ]
        );
        assert_eq!((w.counts.failed, w.counts.waiting), (1, 1));
    }

    #[test]
    fn settling_an_order_independent_failure_cuts_nothing() {
        let b = batch(&[f(1, 1), f(1, 2), f(1, 3)]);
        // The view does not subscribe to the third event's type.
        let mut d = decoded(&b);
        if let Decoded::Event { sent, .. } = &mut d[2] {
            *sent = false;
        }
        let mut w = Work::new(&b, &d);
        w.sequence(HashMap::new(), false);
        w.accounts[0].failures.push((0, "boom".to_owned()));
        w.settle(false);
        assert_eq!(
            w.dispositions,
            [
                Disposition::DeadLettered,
                Disposition::Applied,
                Disposition::Ignored
            ]
        );
        assert_eq!(w.accounts[0].blocked_seq(), None);
        assert_eq!((w.counts.failed, w.counts.ignored), (1, 1));
    }
}
