//! The `projector` engine: exactly-once effect of at-least-once Kafka events on read models
//! in PostgreSQL.
//!
//! Exactly-once *delivery* is impossible; exactly-once *effect* is a consumer design:
//! at-least-once delivery, plus a dedup record and the source offset written in the same
//! PostgreSQL transaction as the effect.
//!
//! # Layout
//!
//! - [`event`]: the wire format; decoding a message into an [`Event`] or saying why it is poison.
//! - `field` (private): a field a view declares and its value for one event, re-exported by
//!   [`projection`] and [`event`].
//! - [`projection`]: the [`Projection`] trait views implement, and the [`Registry`] of views.
//! - [`view`]: the [`View`] trait a view written in Rust implements (no version: the
//!   registry pairs it with its versions), and its SQL file ([`SqlFile`]).
//! - [`upcast`]: event evolution; the upcasters that bring an event type's older versions to
//!   the one a view reads.
//! - [`fingerprint`]: a version runs only with the code that registered it.
//! - [`sequencer`] (private): per-account `seq` ordering: duplicates, gaps, parked accounts.
//! - [`apply`]: the hot path; one batch of one partition into one view version, one transaction.
//! - [`bell`]: read-your-writes: the notifier that wakes `projector.wait_applied`'s
//!   waiters after each committed batch, and [`wait_applied`] for services in Rust.
//! - [`inbox`]: the inbox's layout, one partition per day of the events' own time: making
//!   days ahead and on demand, late writes, the inbox before that layout.
//! - [`queries`]: the hot path's statements (offsets, progress, parks, waiting events, dead
//!   letters and the inbox, as a batch writes them).
//! - [`versions`]: the version registry `projector.views` and the [`versions::VersionState`]
//!   lifecycle; its statements in `versions.sql`.
//! - [`dead_letters`], [`parked`]: dead letters and parked accounts outside a batch (what
//!   `projector dlq` and `parked` list, read and skip); [`progress`]: offsets, progress and
//!   snapshots outside a batch (a rebuild's, a drop's). Each owner's statements are in the
//!   `.sql` file beside it (docs/architecture.md lists them).
//! - [`db`]: connection pools that never hand out a connection left inside a transaction.
//! - [`kafka`]: the Kafka source; the producer and a dev broker are in `projector-devkit`.
//! - [`processes`]: which process consumes, fails to start or skips which version.
//! - [`schema`]: the engine's migrations and view installation (`projector migrate`).
//! - [`rng`]: the small seeded generator the tests, the bench and the dev write side share.
//! - [`sql_view`]: views written as `.sql` files, loaded at start without compiling.
//! - [`metrics`]: counters and a histogram through the `metrics` facade, recorded by the apply
//!   path. Operations (status, the health rule, gauges, inbox retention, reconciliation) are
//!   the `projector-ops` crate's; the engine does not depend on it.
//! - `testkit` (feature `testkit`): a database per test, and the conformance suite every
//!   projection must pass.

pub mod apply;
pub mod bell;
pub mod db;
pub mod dead_letters;
pub mod event;
mod field;
pub mod fingerprint;
pub mod inbox;
pub mod kafka;
pub mod metrics;
pub mod parked;
pub mod processes;
pub mod progress;
pub mod projection;
pub mod queries;
pub mod rng;
pub mod schema;
mod sequencer;
pub mod sql_view;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod upcast;
pub mod versions;
pub mod view;

pub use apply::{Applier, ApplyError, Batch, BatchOutcome, Counts, Disposition};
pub use bell::{wait_applied, Applied, Bell, WaitError};
pub use event::{account_key, decode, decode_envelope, DecodeError, Event, Message};
pub use projection::{
    ApplySql, DedupMode, Field, Projection, Registry, Rejected, SourceOrdering, SqlFile,
    UnknownVersion, ViewError,
};
pub use schema::{migrate, MigrateReport, SchemaError};
pub use upcast::{Data, Upcaster, Upcasters};
pub use view::{Versioned, View};
