//! The phases, one module each, in the order [`crate::run`] runs them, and the topics and view
//! versions they use.
//!
//! - `setup`: before the phases, untimed: the view versions migrated, the dev broker started.
//! - `rounds`: the repeated phases of each round, and the best of the rounds.
//! - `engine`: the engine fed live, one view (with or without the notifier) or all three.
//! - `naive`: the per-event consumer, first round only.
//! - `ceiling`: the same rows by plain SQL, for one view or all three.
//! - `catch_up`: a new version from the earliest offset of the full topic.
//! - `rebuild`: `projector rebuild --from earliest`, alone and under a live feed.
//! - `latency`: publish to visible at a fixed rate.
//! - `ryw`: read your writes, write to readable through `projector.wait_applied`.
//! - `full_inbox`: the engine phase again on a full inbox.
//! - `prune`: a day of the full inbox dropped while a paced feed runs.

pub(crate) mod catch_up;
pub(crate) mod ceiling;
pub(crate) mod engine;
pub(crate) mod full_inbox;
pub(crate) mod latency;
pub(crate) mod naive;
pub(crate) mod prune;
pub(crate) mod rebuild;
pub(crate) mod rounds;
pub(crate) mod ryw;
pub(crate) mod setup;

use std::time::Duration;

/// Topics of the dev broker.
pub(crate) const TOPIC: &str = "bench";
pub(crate) const TOPIC_ALL: &str = "bench_all";
pub(crate) const TOPIC_LATENCY: &str = "bench_latency";
pub(crate) const TOPIC_CEILING_ALL: &str = "bench_ceiling_all";
pub(crate) const TOPIC_REBUILD_LIVE: &str = "bench_rebuild_live";
pub(crate) const TOPIC_FULL_INBOX: &str = "bench_full_inbox";
pub(crate) const TOPIC_PRUNE_LIVE: &str = "bench_prune_live";
pub(crate) const TOPIC_RYW: &str = "bench_ryw";
/// The longest a reader of the read-your-writes phase waits for its write.
pub(crate) const PHASE_WAIT: Duration = Duration::from_secs(60);

// View versions, one per phase and round: every phase starts from empty tables and offsets.
// Rounds add 0, 1, ... to the bases of the repeated phases.

/// Registered first, so that this version is the live one of each view and never runs: every
/// measured version is then `building`, and none writes notices, which the ceilings do not
/// write either (the first version registered of a name goes live).
pub(crate) const V_PLACEHOLDER: i32 = 1;
pub(crate) const V_LATENCY: i32 = 2;
pub(crate) const V_NAIVE: i32 = 3;
pub(crate) const V_FULL_INBOX: i32 = 5;
/// The live version fed while a rebuild runs.
pub(crate) const V_REBUILD_LIVE: i32 = 6;
/// The version that rebuild builds; not registered by the bench's migration: the rebuild
/// registers it as building, as `projector rebuild` does.
pub(crate) const V_REBUILD_LOADED: i32 = 7;
/// The live version fed while a day of the full inbox is pruned.
pub(crate) const V_PRUNE_LIVE: i32 = 8;
/// Read-your-writes: the latency phase's feed, live, with readers in `wait_applied`.
pub(crate) const V_RYW: i32 = 9;
pub(crate) const V_ENGINE: i32 = 10;
/// The engine's rounds again, without the read-your-writes notifier.
pub(crate) const V_NO_NOTIFY: i32 = 70;
pub(crate) const V_CEILING: i32 = 20;
pub(crate) const V_CATCH_UP: i32 = 30;
/// Built by the rebuild crate, which registers them (see [`V_REBUILD_LOADED`]).
pub(crate) const V_REBUILD: i32 = 40;
pub(crate) const V_ALL: i32 = 50;
pub(crate) const V_CEILING_ALL: i32 = 60;
